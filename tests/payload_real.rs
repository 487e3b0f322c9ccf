//! The payload plugins (configMap, secret, projected) against a real kernel, each
//! test in its own private mount namespace: a secret's files on a tmpfs
//! with its modes and fsGroup, a configMap's on disk with nested items,
//! optional and missing objects, a hostile key refused naming the volume,
//! a second SetUp (as after a restart) that rewrites nothing, a teardown
//! that leaves nothing, and a projected volume merging a ConfigMap, a
//! Secret and a pod field on a tmpfs (a token source refused).
//!
//! Needs root (tmpfs, chgrp); as another user each test prints what it
//! skipped and passes.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};

use support::{Scratch, in_private_mount_ns, mkdirs, require_root};
use volumed::host::mountinfo::MountTable;
use volumed::host::sys::LinuxSys;
use volumed::journal::Permit;
use volumed::model::{
    FieldItem, KeyToPath, Layout, ObjectVersion, PayloadKind, PayloadSource, PayloadSpec,
    PluginName, PodUid, SharedStr, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
    VolumeSpec,
};
use volumed::plugins::payload::{KubeObject, ObjectStore, PayloadPlugin};
use volumed::plugins::{Action, PluginError, VolumePlugin};

const POD: &str = "5f1e2d3c-4b5a-4968-8776-655443322110";

/// Objects by (kind, name), changeable while a plugin holds the store.
#[derive(Debug, Default)]
struct Objects(Mutex<BTreeMap<(String, String), Arc<KubeObject>>>);

impl Objects {
    fn put(&self, kind: &str, name: &str, rv: &str, data: &[(&str, &[u8])]) {
        let obj = KubeObject {
            version: ObjectVersion {
                kind: kind.into(),
                namespace: "ns".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
                resource_version: rv.into(),
            },
            data: data
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
            immutable: false,
        };
        let key = (kind.to_owned(), name.to_owned());
        self.0.lock().unwrap().insert(key, Arc::new(obj));
    }
    fn get(&self, kind: &str, name: &str) -> Option<Arc<KubeObject>> {
        self.0
            .lock()
            .unwrap()
            .get(&(kind.to_owned(), name.to_owned()))
            .cloned()
    }
}

impl ObjectStore for Objects {
    fn config_map(&self, _: &str, name: &str) -> Option<Arc<KubeObject>> {
        self.get("ConfigMap", name)
    }
    fn secret(&self, _: &str, name: &str) -> Option<Arc<KubeObject>> {
        self.get("Secret", name)
    }
}

fn spec(kind: PayloadKind, source: PayloadSource, mode: u32, fs_group: Option<u32>) -> VolumeSpec {
    VolumeSpec::Payload(Box::new(PayloadSpec {
        kind,
        namespace: "ns".into(),
        default_mode: mode,
        sources: vec![source],
        fs_group,
        pod_fields: BTreeMap::new(),
        version: None,
        immutable: false,
    }))
}

fn params(layout: &Layout, plugin: PluginName, name: &str, kind: TargetKind) -> TargetParams {
    let pod = PodUid::new(POD).unwrap();
    let path = layout.pod_target_path(&pod, plugin, name);
    TargetParams::at(
        UniqueVolumeName::per_pod(plugin, &pod, name),
        plugin,
        name.into(),
        TargetRef::Pod(pod),
        kind,
        Some(path.as_path().into()),
    )
    .with_fs_type((kind == TargetKind::Mount).then(SharedStr::tmpfs))
}

struct Node {
    _scratch: Scratch,
    layout: Layout,
    objects: Arc<Objects>,
}

fn node() -> Node {
    let scratch = Scratch::new("volumed-payload-");
    let layout = Layout::new(scratch.path().join("kubelet"));
    mkdirs(layout.root());
    Node {
        _scratch: scratch,
        layout,
        objects: Arc::new(Objects::default()),
    }
}

impl Node {
    fn plugin(&self, kind: PayloadKind) -> PayloadPlugin {
        PayloadPlugin::new(kind, &self.layout, self.objects.clone())
    }
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn is_mount_point(p: &Path) -> bool {
    MountTable::read_self().unwrap().top_at(p).is_some()
}

#[test]
fn a_secret_lands_on_a_tmpfs_with_its_modes_and_group() {
    if !require_root("mounts tmpfs, chgrp") {
        return;
    }
    in_private_mount_ns(|| {
        let n = node();
        n.objects.put(
            "Secret",
            "db",
            "1",
            &[("user", b"admin"), ("pass", b"hunter2")],
        );
        let items = vec![
            KeyToPath {
                key: "user".into(),
                path: "user".into(),
                mode: None,
            },
            KeyToPath {
                key: "pass".into(),
                path: "creds/pass".into(),
                mode: Some(0o400),
            },
        ];
        let source = PayloadSource::Secret {
            name: "db".into(),
            items: Some(items),
            optional: false,
        };
        let s = spec(PayloadKind::Secret, source, 0o440, Some(2000));
        let p = params(&n.layout, PluginName::Secret, "db", TargetKind::Mount);
        let dir = p.pod_mount_path.clone().unwrap();
        let plugin = n.plugin(PayloadKind::Secret);

        let out = plugin
            .setup(&Permit::JournalOff, &s, &p, &LinuxSys)
            .unwrap();
        assert_eq!(out.action, Action::Performed);
        let m = MountTable::read_self()
            .unwrap()
            .top_at(&dir)
            .cloned()
            .expect("a tmpfs");
        assert_eq!(m.fs_type, "tmpfs");
        assert_eq!(fs::read(dir.join("user")).unwrap(), b"admin");
        assert_eq!(fs::read(dir.join("creds/pass")).unwrap(), b"hunter2");
        assert_eq!(
            fs::read_link(dir.join("creds")).unwrap(),
            Path::new("..data/creds")
        );
        // fsGroup: the group, and the read bits the kubelet adds
        assert_eq!(mode(&dir.join("user")), 0o440);
        assert_eq!(mode(&dir.join("creds/pass")), 0o440);
        assert_eq!(fs::metadata(dir.join("creds/pass")).unwrap().gid(), 2000);
        assert_eq!(fs::metadata(dir.join("creds")).unwrap().gid(), 2000);
        assert_eq!(fs::metadata(&dir).unwrap().gid(), 2000);
        assert_eq!(mode(&dir.join("creds")) & 0o2000, 0o2000, "setgid dirs");

        // what a restart's SetUp would do: nothing
        let ino = |p: &Path| {
            let m = fs::symlink_metadata(p).unwrap();
            (m.ino(), m.mtime(), m.mtime_nsec())
        };
        let before = [ino(&dir.join("creds/pass")), ino(&dir.join("..data"))];
        let again = plugin
            .setup(&Permit::JournalOff, &s, &p, &LinuxSys)
            .unwrap();
        assert_eq!(again.action, Action::AlreadyInPlace);
        assert_eq!(
            before,
            [ino(&dir.join("creds/pass")), ino(&dir.join("..data"))]
        );

        // a changed Secret: rewritten whole
        n.objects.put(
            "Secret",
            "db",
            "2",
            &[("user", b"root"), ("pass", b"swordfish")],
        );
        let out = plugin
            .setup(&Permit::JournalOff, &s, &p, &LinuxSys)
            .unwrap();
        assert_eq!(out.action, Action::Performed);
        assert_eq!(fs::read(dir.join("creds/pass")).unwrap(), b"swordfish");
        let private: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".."))
            .collect();
        assert_eq!(private.len(), 2, "..data and one payload dir: {private:?}");

        plugin.teardown(&Permit::JournalOff, &p, &LinuxSys).unwrap();
        assert!(!is_mount_point(&dir));
        assert!(!dir.exists());
    });
}

#[test]
fn a_config_map_lands_on_disk_and_optional_ones_may_be_missing() {
    if !require_root("writes below a private root") {
        return;
    }
    in_private_mount_ns(|| {
        let n = node();
        n.objects.put(
            "ConfigMap",
            "app",
            "1",
            &[("app.yaml", b"a: 1"), ("bin", &[0, 255])],
        );
        let source = PayloadSource::ConfigMap {
            name: "app".into(),
            items: None,
            optional: false,
        };
        let s = spec(PayloadKind::ConfigMap, source, 0o644, None);
        let p = params(&n.layout, PluginName::ConfigMap, "app", TargetKind::Dir);
        let dir = p.pod_mount_path.clone().unwrap();
        let plugin = n.plugin(PayloadKind::ConfigMap);
        plugin
            .setup(&Permit::JournalOff, &s, &p, &LinuxSys)
            .unwrap();
        assert!(!is_mount_point(&dir), "on disk");
        assert_eq!(fs::read(dir.join("app.yaml")).unwrap(), b"a: 1");
        assert_eq!(fs::read(dir.join("bin")).unwrap(), [0, 255]);
        assert_eq!(mode(&dir.join("app.yaml")), 0o644);
        plugin.teardown(&Permit::JournalOff, &p, &LinuxSys).unwrap();
        assert!(!dir.exists());

        // optional and missing: an empty volume
        let gone = PayloadSource::ConfigMap {
            name: "gone".into(),
            items: None,
            optional: true,
        };
        let s = spec(PayloadKind::ConfigMap, gone, 0o644, None);
        let p = params(&n.layout, PluginName::ConfigMap, "opt", TargetKind::Dir);
        plugin
            .setup(&Permit::JournalOff, &s, &p, &LinuxSys)
            .unwrap();
        let dir = p.pod_mount_path.clone().unwrap();
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "only ..data and its dir: {names:?}");

        // missing and not optional: an error naming the volume, nothing made
        let gone = PayloadSource::ConfigMap {
            name: "gone".into(),
            items: None,
            optional: false,
        };
        let s = spec(PayloadKind::ConfigMap, gone, 0o644, None);
        let p = params(&n.layout, PluginName::ConfigMap, "req", TargetKind::Dir);
        let e = plugin
            .setup(&Permit::JournalOff, &s, &p, &LinuxSys)
            .unwrap_err();
        assert!(matches!(e, PluginError::Payload { .. }), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("kubernetes.io/configmap/{POD}-req")),
            "{e}"
        );
        assert!(!p.pod_mount_path.clone().unwrap().exists());
    });
}

#[test]
fn a_hostile_key_is_refused_naming_the_volume_and_writes_nothing() {
    if !require_root("writes below a private root") {
        return;
    }
    in_private_mount_ns(|| {
        let n = node();
        n.objects
            .put("ConfigMap", "evil", "1", &[("../../escape", b"x")]);
        let source = PayloadSource::ConfigMap {
            name: "evil".into(),
            items: None,
            optional: false,
        };
        let s = spec(PayloadKind::ConfigMap, source, 0o644, None);
        let p = params(&n.layout, PluginName::ConfigMap, "evil", TargetKind::Dir);
        let e = n
            .plugin(PayloadKind::ConfigMap)
            .setup(&Permit::JournalOff, &s, &p, &LinuxSys)
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&format!("kubernetes.io/configmap/{POD}-evil")),
            "{text}"
        );
        assert!(text.contains("\"../../escape\""), "{text}");
        let pod_dir = n.layout.pod_dir(&PodUid::new(POD).unwrap());
        assert!(!pod_dir.exists(), "nothing was made");
    });
}

#[test]
fn a_projected_volume_merges_its_sources_on_a_tmpfs_and_refuses_tokens() {
    if !require_root("mounts tmpfs") {
        return;
    }
    in_private_mount_ns(|| {
        let n = node();
        n.objects
            .put("ConfigMap", "app", "1", &[("app.conf", b"a=1")]);
        n.objects.put("Secret", "db", "1", &[("pass", b"pw")]);
        let dapi = PayloadSource::DownwardApi {
            items: vec![FieldItem {
                path: "meta/name".into(),
                field_path: "metadata.name".into(),
                mode: Some(0o400),
            }],
        };
        let sources = vec![
            PayloadSource::ConfigMap {
                name: "app".into(),
                items: None,
                optional: false,
            },
            PayloadSource::Secret {
                name: "db".into(),
                items: None,
                optional: false,
            },
            dapi,
        ];
        let mut s = spec(PayloadKind::Projected, sources[0].clone(), 0o644, None);
        if let VolumeSpec::Payload(p) = &mut s {
            p.sources = sources;
            p.pod_fields = BTreeMap::from([("metadata.name".into(), "web".into())]);
        }
        let p = params(&n.layout, PluginName::Projected, "all", TargetKind::Mount);
        let dir = p.pod_mount_path.clone().unwrap();
        let plugin = n.plugin(PayloadKind::Projected);
        plugin
            .setup(&Permit::JournalOff, &s, &p, &LinuxSys)
            .unwrap();
        assert!(is_mount_point(&dir), "a tmpfs");
        assert_eq!(fs::read(dir.join("app.conf")).unwrap(), b"a=1");
        assert_eq!(fs::read(dir.join("pass")).unwrap(), b"pw");
        assert_eq!(fs::read(dir.join("meta/name")).unwrap(), b"web");
        assert_eq!(mode(&dir.join("meta/name")), 0o400);
        plugin.teardown(&Permit::JournalOff, &p, &LinuxSys).unwrap();
        assert!(!dir.exists());

        let token = PayloadSource::ServiceAccountToken {
            path: "token".into(),
            audience: None,
            expiration_seconds: 3600,
        };
        let s = spec(PayloadKind::Projected, token, 0o644, None);
        let p = params(
            &n.layout,
            PluginName::Projected,
            "kube-api-access",
            TargetKind::Mount,
        );
        let e = plugin
            .setup(&Permit::JournalOff, &s, &p, &LinuxSys)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("a service account token needs the API server (--kubeconfig)"),
            "{e}"
        );
        assert!(
            !p.pod_mount_path.clone().unwrap().exists(),
            "nothing mounted"
        );
    });
}
