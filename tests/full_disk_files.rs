//! The files volumed writes under its root beside the journal, on a full
//! disk (issue 39, item 5): the parsed-manifest cache, `daemon.json`, the
//! runtime API's socket, a CSI volume's `vol_data.json` and a configMap
//! volume's payload files.
//!
//! Each test runs in its own private mount namespace, with a 256 KiB tmpfs
//! as the dir the files go to, filled to the last block by a file of zeros
//! written until `ENOSPC` (or, for what needs no block, to the last inode).
//! For each kind of file it shows: the failing write's error names the file
//! and the cause; nothing half-written is read back after it (the old
//! content whole, or no file) and no temp file is left; once the filler is
//! removed, the next write works. One more test remounts the dir read-only,
//! as a failing disk's `errors=remount-ro` does, and back.
//!
//! Needs root (mounts); as another user each test prints what it skipped
//! and passes.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::csi_driver::{DriverOpts, TestDriver};
use support::{Scratch, in_private_mount_ns, mkdirs, mount_tmpfs, require_root};
use volumed::csi::registry::Drivers;
use volumed::host::scan::{VolData, read_vol_data};
use volumed::host::sys::{Beneath, LinuxSys, MsFlags, Sys};
use volumed::journal::Permit;
use volumed::model::{
    AccessMode, CsiLifecycle, CsiParams, Layout, ObjectVersion, PayloadKind, PayloadSource,
    PayloadSpec, PluginName, PodUid, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
    VolumeSpec,
};
use volumed::plugins::payload::{KubeObject, ObjectStore, PayloadPlugin};
use volumed::plugins::{Action, CsiPlugin, VolumePlugin};
use volumed::server::api_socket;
use volumed::server::daemon_file::{self, DaemonFile};
use volumed::sources::manifest_cache::{self, SETTLED};
use volumed::sources::{SourceErrorCategory, Sources, SourcesConfig};

const POD: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";
const OTHER_POD: &str = "0b1c2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e";
/// What a failed write's message must carry besides the file.
const NO_SPACE: &str = "No space left on device";

/// A 256 KiB tmpfs at `<scratch>/root`, its path.
fn small_fs(scratch: &Scratch, extra: &str) -> PathBuf {
    let dir = scratch.path().join("root");
    mkdirs(&dir);
    mount_tmpfs(&dir, &format!("size=256k,mode=0755{extra}"));
    dir
}

/// Uses up the inodes of the filesystem of `dir`: empty files in
/// `<dir>/inodes/` made until `ENOSPC`. Returns that dir; removing one of
/// its files gives an inode back.
fn use_up_inodes(dir: &Path) -> PathBuf {
    let at = dir.join("inodes");
    fs::create_dir(&at).unwrap();
    for i in 0.. {
        match File::create(at.join(i.to_string())) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::StorageFull => break,
            Err(e) => panic!("make a file in {}: {e}", at.display()),
        }
    }
    at
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// Asserts that `err` names `file` (a path or its start) and says the disk
/// is full.
#[track_caller]
fn assert_names(err: &str, file: &Path) {
    assert_names_cause(err, file, NO_SPACE);
}

/// Asserts that `err` names `file` (a path or its start) and `cause`.
#[track_caller]
fn assert_names_cause(err: &str, file: &Path, cause: &str) {
    let file = file.display().to_string();
    assert!(err.contains(&file), "the error names {file}: {err}");
    assert!(err.contains(cause), "the error gives the cause: {err}");
}

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: []\n  volumes:\n  - name: cache\n    emptyDir: {{medium: Memory}}\n"
    )
}

#[test]
fn a_manifest_cache_write_on_a_full_disk_names_the_file_and_the_old_cache_is_read() {
    if !require_root("mounts a tmpfs") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-full-cache-");
        let root = small_fs(&scratch, "");
        let pods = scratch.path().join("pods");
        mkdirs(&pods);
        let cache = root.join(manifest_cache::FILE_NAME);
        let sources = |cached: bool| {
            let mut c = SourcesConfig::new("node1");
            c.pods_dir = Some(pods.clone());
            c.manifest_cache = cached.then(|| cache.clone());
            Sources::new(c)
        };
        for p in ["a", "b"] {
            fs::write(pods.join(format!("{p}.yaml")), manifest(p)).unwrap();
        }
        // an entry is stored once its file's ctime is SETTLED old
        let settle = || std::thread::sleep(SETTLED + Duration::from_millis(50));
        let mut running = sources(true);
        running.list();
        settle();
        running.try_write_cache().unwrap();
        let stored = fs::read(&cache).unwrap();

        // c appears; its entry's write finds the disk full
        fs::write(pods.join("c.yaml"), manifest("c")).unwrap();
        running.poll_changes().expect("c is seen");
        settle();
        let filler = support::fill_fs(&root);
        let err = running.try_write_cache().unwrap_err();
        assert_eq!(err.category(), SourceErrorCategory::Io);
        assert_names(&err.to_string(), &cache);
        assert_eq!(fs::read(&cache).unwrap(), stored, "the old cache, whole");
        assert_eq!(
            names(&root),
            ["filler", manifest_cache::FILE_NAME],
            "no temp file left"
        );

        // a restart now reads the old cache: a and b from it, c parsed
        let mut restarted = sources(true);
        let listed = restarted.list();
        assert_eq!(restarted.cache_hits(), 2);
        assert_eq!(listed.pods, sources(false).list().pods);

        // space back: the next write stores what the failed one could not
        fs::remove_file(filler).unwrap();
        running.try_write_cache().unwrap();
        let mut later = sources(true);
        assert_eq!(later.list().pods, listed.pods);
        assert_eq!(later.cache_hits(), 3, "c's entry was kept for it");
    });
}

#[test]
fn daemon_json_on_a_full_disk_names_the_file_and_the_old_one_is_read() {
    if !require_root("mounts a tmpfs") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-full-daemon-json-");
        let root = small_fs(&scratch, "");
        let old = DaemonFile::for_this_process("127.0.0.1:10264", "boot-1");
        old.write(&root).unwrap();
        let filler = support::fill_fs(&root);

        let new = DaemonFile::for_this_process("127.0.0.1:10265", "boot-1");
        let err = new.write(&root).unwrap_err().to_string();
        // the temp file beside it: `.daemon.json.<random>.tmp`
        assert_names(&err, &root.join(".daemon.json."));
        assert_eq!(DaemonFile::read(&root).unwrap(), Some(old));
        assert_eq!(
            names(&root),
            [daemon_file::FILE_NAME, "filler"],
            "no temp file left"
        );

        fs::remove_file(filler).unwrap();
        new.write(&root).unwrap();
        assert_eq!(DaemonFile::read(&root).unwrap(), Some(new));
    });
}

#[test]
fn without_an_inode_daemon_json_and_the_api_socket_name_their_file() {
    if !require_root("mounts a tmpfs") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-no-inode-");
        let root = small_fs(&scratch, ",nr_inodes=32");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // on a disk full to the last block the socket still binds: it
        // holds no data
        let filler = support::fill_fs(&root);
        let socket = rt.block_on(async { api_socket::bind(&root) }).unwrap();
        rt.block_on(async {
            let client = tokio::net::UnixStream::connect(api_socket::path(&root));
            let (c, a) = tokio::join!(client, socket.listener.accept());
            c.unwrap();
            a.unwrap();
        });
        drop(socket);
        fs::remove_file(filler).unwrap();
        // one left behind by a daemon that died: nobody listens
        drop(std::os::unix::net::UnixListener::bind(api_socket::path(&root)).unwrap());
        let old = DaemonFile::for_this_process("127.0.0.1:10264", "boot-1");
        old.write(&root).unwrap();

        let inodes = use_up_inodes(&root);
        let err = rt
            .block_on(async { api_socket::bind(&root) })
            .unwrap_err()
            .to_string();
        // bound under `.api.sock.<pid>` first
        assert_names(&err, &root.join(format!(".{}", api_socket::API_SOCKET)));
        let new = DaemonFile::for_this_process("127.0.0.1:10265", "boot-1");
        let err = new.write(&root).unwrap_err().to_string();
        assert_names(&err, &daemon_file::path(&root));
        assert_eq!(DaemonFile::read(&root).unwrap(), Some(old));
        assert_eq!(
            names(&root),
            [api_socket::API_SOCKET, daemon_file::FILE_NAME, "inodes"],
            "no temp file left, the stale socket as it was"
        );

        // two inodes back (the socket's temp name, daemon.json's temp file)
        fs::remove_file(inodes.join("0")).unwrap();
        fs::remove_file(inodes.join("1")).unwrap();
        new.write(&root).unwrap();
        assert_eq!(DaemonFile::read(&root).unwrap(), Some(new));
        let socket = rt.block_on(async { api_socket::bind(&root) }).unwrap();
        rt.block_on(async {
            let client = tokio::net::UnixStream::connect(api_socket::path(&root));
            let (c, a) = tokio::join!(client, socket.listener.accept());
            c.unwrap();
            a.unwrap();
        });
    });
}

/// A persistent CSI volume's pod target for `pod`, with `attachment` as
/// its `attachmentID`.
fn csi_target(layout: &Layout, driver: &str, pod: &str, attachment: &str) -> TargetParams {
    let pod = PodUid::new(pod).unwrap();
    let path = layout.pod_target_path(&pod, PluginName::Csi, "pv-1");
    let csi = CsiParams {
        driver: driver.to_owned(),
        volume_handle: "vol-1".to_owned(),
        lifecycle: CsiLifecycle::Persistent,
        access_modes: vec![AccessMode::ReadWriteOnce],
        read_only: false,
        publish_context: BTreeMap::new(),
        volume_context: BTreeMap::new(),
        stage_secret: None,
        publish_secret: None,
        mount_group: None,
        attachment_id: Some(attachment.to_owned()),
    };
    TargetParams::at(
        UniqueVolumeName::shared(PluginName::Csi, &format!("{driver}^vol-1")),
        PluginName::Csi,
        "pv-1".into(),
        TargetRef::Pod(pod),
        TargetKind::Mount,
        Some(path.as_path().into()),
    )
    .with_csi(Some(Arc::new(csi)))
}

#[test]
fn vol_data_json_on_a_full_disk_names_the_file_and_no_publish_goes_without_it() {
    if !require_root("mounts a tmpfs, runs the test CSI driver") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-full-vol-data-");
        let root = small_fs(&scratch, "");
        let layout = Layout::new(root.clone());
        let name = "full.example.com";
        let driver_dir = scratch.path().join("driver");
        mkdirs(&driver_dir);
        let mut opts = DriverOpts::in_dir(name, &driver_dir);
        opts.no_stage = true;
        let driver = TestDriver::spawn(opts);
        let flag = format!("{name}={}", driver.endpoint().display());
        let drivers = Drivers::from_flags(&[flag], Duration::from_secs(10), None).unwrap();
        let plugin = CsiPlugin::new(layout.clone(), "node1", Arc::new(drivers), None);
        let spec = VolumeSpec::Csi(Box::default());
        let setup = |p: &TargetParams| plugin.setup(&Permit::JournalOff, &spec, p, &LinuxSys);
        let vol_data = |pod: &str| layout.csi_pod_vol_data(&PodUid::new(pod).unwrap(), "pv-1");
        let read = |pod: &str| read_vol_data(&LinuxSys, &vol_data(pod)).unwrap();
        let attachment = |v: Option<VolData>| v.and_then(|v| v.attachment_id);

        setup(&csi_target(&layout, name, POD, "va-1")).unwrap();
        assert_eq!(attachment(read(POD)).as_deref(), Some("va-1"));
        let publishes = driver.count("NodePublishVolume");
        assert_eq!(publishes, 1, "the first SetUp published");
        let filler = support::fill_fs(&root);

        // a SetUp again (as after a restart) rewrites the file: it fails,
        // the old file is read whole
        let err = setup(&csi_target(&layout, name, POD, "va-2"))
            .unwrap_err()
            .to_string();
        assert_names(&err, &vol_data(POD));
        assert_eq!(attachment(read(POD)).as_deref(), Some("va-1"));
        let dir = vol_data(POD).parent().unwrap().to_owned();
        assert_eq!(names(&dir), ["mount", "vol_data.json"], "no temp file");
        // a new target's first SetUp: no file, and no publish without it
        let err = setup(&csi_target(&layout, name, OTHER_POD, "va-1"))
            .unwrap_err()
            .to_string();
        assert_names(&err, &vol_data(OTHER_POD));
        assert_eq!(read(OTHER_POD), None, "no vol_data.json, not a part");
        let other_dir = vol_data(OTHER_POD).parent().unwrap().to_owned();
        assert_eq!(names(&other_dir), Vec::<String>::new(), "no temp file");
        assert_eq!(driver.count("NodePublishVolume"), publishes);

        fs::remove_file(filler).unwrap();
        setup(&csi_target(&layout, name, POD, "va-2")).unwrap();
        assert_eq!(attachment(read(POD)).as_deref(), Some("va-2"));
        setup(&csi_target(&layout, name, OTHER_POD, "va-1")).unwrap();
        assert_eq!(attachment(read(OTHER_POD)).as_deref(), Some("va-1"));
    });
}

/// ConfigMaps by name, changeable while the plugin holds the store.
#[derive(Debug, Default)]
struct ConfigMaps(Mutex<BTreeMap<String, Arc<KubeObject>>>);

impl ConfigMaps {
    fn put(&self, name: &str, rv: &str, data: &[(&str, &[u8])]) {
        let obj = KubeObject {
            version: ObjectVersion {
                kind: "ConfigMap".into(),
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
        self.0
            .lock()
            .unwrap()
            .insert(name.to_owned(), Arc::new(obj));
    }
}

impl ObjectStore for ConfigMaps {
    fn config_map(&self, _: &str, name: &str) -> Option<Arc<KubeObject>> {
        self.0.lock().unwrap().get(name).cloned()
    }
    fn secret(&self, _: &str, _: &str) -> Option<Arc<KubeObject>> {
        None
    }
}

/// A configMap volume of the ConfigMap `name`, every key as its file.
fn config_map_volume(layout: &Layout, pod: &str, name: &str) -> (VolumeSpec, TargetParams) {
    let spec = VolumeSpec::Payload(Box::new(PayloadSpec {
        kind: PayloadKind::ConfigMap,
        namespace: "ns".into(),
        default_mode: 0o644,
        sources: vec![PayloadSource::ConfigMap {
            name: name.into(),
            items: None,
            optional: false,
        }],
        fs_group: None,
        pod_fields: BTreeMap::new(),
        version: None,
        immutable: false,
    }));
    let pod = PodUid::new(pod).unwrap();
    let path = layout.pod_target_path(&pod, PluginName::ConfigMap, name);
    let params = TargetParams::at(
        UniqueVolumeName::per_pod(PluginName::ConfigMap, &pod, name),
        PluginName::ConfigMap,
        name.into(),
        TargetRef::Pod(pod),
        TargetKind::Dir,
        Some(path.as_path().into()),
    );
    (spec, params)
}

#[test]
fn a_config_map_payload_on_a_full_disk_names_the_file_and_the_old_payload_stays() {
    if !require_root("mounts a tmpfs") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-full-payload-");
        let root = small_fs(&scratch, "");
        let layout = Layout::new(root.clone());
        let objects = Arc::new(ConfigMaps::default());
        let plugin = PayloadPlugin::new(PayloadKind::ConfigMap, &layout, objects.clone());
        let setup = |(spec, p): &(VolumeSpec, TargetParams)| {
            plugin.setup(&Permit::JournalOff, spec, p, &LinuxSys)
        };
        let private = |dir: &Path| -> Vec<String> {
            let all = names(dir);
            all.into_iter().filter(|n| n.starts_with("..")).collect()
        };
        objects.put("app", "1", &[("app.yaml", b"v: 1")]);
        let app = config_map_volume(&layout, POD, "app");
        let dir = app.1.pod_mount_path.clone().unwrap().to_path_buf();
        setup(&app).unwrap();
        let before = private(&dir);
        assert_eq!(before.len(), 2, "..data and its dir: {before:?}");
        let filler = support::fill_fs(&root);

        // a changed ConfigMap: its new payload dir cannot be written
        let big = vec![b'x'; 16 << 10];
        objects.put("app", "2", &[("app.yaml", &big)]);
        let err = setup(&app).unwrap_err().to_string();
        assert_names(&err, &dir.join(".."));
        assert!(err.contains("app.yaml"), "the file: {err}");
        assert_eq!(fs::read(dir.join("app.yaml")).unwrap(), b"v: 1");
        assert_eq!(private(&dir), before, "the half-written dir is gone");
        // a new volume's first payload: nothing to read, not a part
        objects.put("web", "1", &[("index.html", b"<p>hi</p>")]);
        let web = config_map_volume(&layout, OTHER_POD, "web");
        let web_dir = web.1.pod_mount_path.clone().unwrap().to_path_buf();
        let err = setup(&web).unwrap_err().to_string();
        assert_names(&err, &web_dir.join(".."));
        assert!(!web_dir.join("index.html").exists());
        assert_eq!(private(&web_dir), Vec::<String>::new());

        fs::remove_file(filler).unwrap();
        assert_eq!(setup(&app).unwrap().action, Action::Performed);
        assert_eq!(fs::read(dir.join("app.yaml")).unwrap(), big);
        assert_eq!(private(&dir).len(), 2, "the old payload dir removed");
        setup(&web).unwrap();
        assert_eq!(fs::read(web_dir.join("index.html")).unwrap(), b"<p>hi</p>");
    });
}

/// Remounts the tmpfs at `dir` read-only, or read-write again.
fn remount(dir: &Path, read_only: bool) {
    let flags = match read_only {
        true => MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        false => MsFlags::MS_REMOUNT,
    };
    nix::mount::mount(None::<&str>, dir, None::<&str>, flags, None::<&str>)
        .unwrap_or_else(|e| panic!("remount {} (ro: {read_only}): {e}", dir.display()));
}

#[test]
fn on_a_read_only_root_each_write_names_its_file_and_the_old_one_is_read() {
    if !require_root("mounts a tmpfs") {
        return;
    }
    in_private_mount_ns(|| {
        const READ_ONLY: &str = "Read-only file system";
        let scratch = Scratch::new("volumed-ro-root-");
        let root = small_fs(&scratch, "");
        let layout = Layout::new(root.clone());
        // daemon.json
        let old = DaemonFile::for_this_process("127.0.0.1:10264", "boot-1");
        old.write(&root).unwrap();
        // the manifest cache: a and b stored, c waiting for the next write
        let pods = scratch.path().join("pods");
        mkdirs(&pods);
        let cache = root.join(manifest_cache::FILE_NAME);
        let sources = || {
            let mut c = SourcesConfig::new("node1");
            c.pods_dir = Some(pods.clone());
            c.manifest_cache = Some(cache.clone());
            Sources::new(c)
        };
        let settle = || std::thread::sleep(SETTLED + Duration::from_millis(50));
        for p in ["a", "b"] {
            fs::write(pods.join(format!("{p}.yaml")), manifest(p)).unwrap();
        }
        let mut running = sources();
        running.list();
        settle();
        running.try_write_cache().unwrap();
        fs::write(pods.join("c.yaml"), manifest("c")).unwrap();
        running.poll_changes().expect("c is seen");
        settle();
        // a CSI target's vol_data.json, through the calls the plugin uses
        // (unsynced with the journal on, synced with it off)
        let vol_data = layout.csi_pod_vol_data(&PodUid::new(POD).unwrap(), "pv-1");
        let rel = vol_data.strip_prefix(&root).unwrap();
        mkdirs(vol_data.parent().unwrap());
        let write_vol_data_as = |attachment: &str, synced: bool| {
            let json =
                format!(r#"{{"driverName":"d","volumeHandle":"h","attachmentID":"{attachment}"}}"#);
            let at = Beneath { base: &root, rel };
            if synced {
                LinuxSys.write_file_beneath(at, json.as_bytes(), 0o640)
            } else {
                LinuxSys.write_file_beneath_unsynced(at, json.as_bytes(), 0o640)
            }
        };
        let write_vol_data = |attachment: &str| write_vol_data_as(attachment, false);
        let attachment = || {
            let v = read_vol_data(&LinuxSys, &vol_data).unwrap();
            v.and_then(|v| v.attachment_id)
        };
        write_vol_data("va-1").unwrap();
        // a configMap volume
        let objects = Arc::new(ConfigMaps::default());
        let plugin = PayloadPlugin::new(PayloadKind::ConfigMap, &layout, objects.clone());
        objects.put("app", "1", &[("app.yaml", b"v: 1")]);
        let (spec, params) = config_map_volume(&layout, OTHER_POD, "app");
        let dir = params.pod_mount_path.clone().unwrap().to_path_buf();
        let setup = || plugin.setup(&Permit::JournalOff, &spec, &params, &LinuxSys);
        setup().unwrap();

        remount(&root, true);
        let new = DaemonFile::for_this_process("127.0.0.1:10265", "boot-1");
        let err = new.write(&root).unwrap_err().to_string();
        assert_names_cause(&err, &daemon_file::path(&root), READ_ONLY);
        assert_eq!(DaemonFile::read(&root).unwrap(), Some(old));
        let err = running.try_write_cache().unwrap_err().to_string();
        assert_names_cause(&err, &cache, READ_ONLY);
        let mut restarted = sources();
        restarted.list();
        assert_eq!(restarted.cache_hits(), 2, "the old cache is read");
        for synced in [false, true] {
            let err = write_vol_data_as("va-2", synced).unwrap_err().to_string();
            assert_names_cause(&err, &vol_data, READ_ONLY);
            assert_eq!(attachment().as_deref(), Some("va-1"));
        }
        objects.put("app", "2", &[("app.yaml", b"v: 2")]);
        let err = setup().unwrap_err().to_string();
        assert_names_cause(&err, &dir, READ_ONLY);
        assert_eq!(fs::read(dir.join("app.yaml")).unwrap(), b"v: 1");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt
            .block_on(async { api_socket::bind(&root) })
            .unwrap_err()
            .to_string();
        let socket = root.join(format!(".{}", api_socket::API_SOCKET));
        assert_names_cause(&err, &socket, READ_ONLY);

        remount(&root, false);
        new.write(&root).unwrap();
        assert_eq!(DaemonFile::read(&root).unwrap(), Some(new));
        running.try_write_cache().unwrap();
        let mut later = sources();
        later.list();
        assert_eq!(later.cache_hits(), 3);
        write_vol_data("va-2").unwrap();
        assert_eq!(attachment().as_deref(), Some("va-2"));
        assert_eq!(setup().unwrap().action, Action::Performed);
        assert_eq!(fs::read(dir.join("app.yaml")).unwrap(), b"v: 2");
        drop(rt.block_on(async { api_socket::bind(&root) }).unwrap());
    });
}
