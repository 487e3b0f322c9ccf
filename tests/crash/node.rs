//! One node for the crash suites, inside the caller's private mount
//! namespace: a scratch kubelet root, static pod and object dirs, a boot id
//! file, an ext4 image on a loop device (the local PV `pv-blk`), with
//! `csi` the test CSI driver (`volumed-testdriver`, the CSI PV `pv-csi`;
//! started before the daemon and kept running across its restarts), and the
//! real `volumed` binary started, SIGKILLed and restarted against them.
//! The checks every suite shares live here too: convergence (mount table ×
//! `/debug/state` × `dump` × the desired pods), the dry run's uncertain
//! targets, metrics, and the files written to the persistent volume.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use volumed::host::mountinfo::MountTable;

use crate::fixture::{Kind, Ref};
use crate::support::csi_driver::{DriverOpts, TestDriver, read_calls};
use crate::support::{LoopDevice, Scratch, mkdirs, mkfs_ext4, mount_tmpfs};

/// The binary under test, built with `--features failpoints`.
pub const BIN: &str = env!("CARGO_BIN_EXE_volumed");
/// The PV every `pv` volume uses.
pub const PV: &str = "pv-blk";
/// The test CSI driver's name.
pub const CSI_DRIVER: &str = "crash.csi.volumed.dev";
/// The raw block PV every `raw` volume uses (`volumeMode: Block`).
pub const RAW_PV: &str = "pv-raw";
/// What the raw block PV's device starts with: it must still, at the end
/// (a raw device is never formatted nor written by volumed).
pub const RAW_MAGIC: &[u8] = b"volumed crash: raw block, never formatted";
/// The CSI PV every `csi` volume uses.
pub const CSI_PV: &str = "pv-csi";
/// The CSI raw block PV every `csiraw` volume uses (`volumeMode: Block`,
/// handle `vol-csiraw`, on the test driver).
pub const CSI_RAW_PV: &str = "pv-csiraw";
/// What the runner writes at the start of the CSI raw block device once
/// the driver staged it: it must still be there, read through each
/// mapping pod's symlink, after the restart (volumed never writes it).
pub const CSI_RAW_MAGIC: &[u8] = b"volumed crash: csi raw block, never written by volumed";
/// Its volume handle.
pub const CSI_HANDLE: &str = "vol-csi";
/// `sha256sum` of [`CSI_HANDLE`] (computed outside the project): the
/// staging dir's name.
const CSI_HANDLE_SHA256: &str = "03f997d2a60cc8b9bb19d04e9fa6d0a0972b484ac0f5ec332d7daef532d88156";
/// How long a daemon may take to converge.
/// `--node-name`
pub const NODE_NAME: &str = "crash-node";
pub const CONVERGE: Duration = Duration::from_secs(30);

/// The UID of fixture pod `name`.
pub fn uid(pod: &str) -> String {
    format!("crash-uid-{pod}")
}

/// A running daemon.
pub struct Daemon {
    child: Child,
    /// `host:port` from `daemon.json`
    pub addr: String,
    /// its log file
    pub log: PathBuf,
}

/// The node.
pub struct Node {
    /// the test CSI driver, with `csi` (dropped, i.e. killed, before the
    /// scratch dir goes)
    pub driver: Option<TestDriver>,
    /// scratch dir (unmounts everything below it on drop)
    pub scratch: Scratch,
    /// `--root-dir`
    pub root: PathBuf,
    /// `--journal-dir`
    pub jdir: PathBuf,
    pods_dir: PathBuf,
    objects_dir: PathBuf,
    boot_file: PathBuf,
    boots: u32,
    runs: u32,
    /// the loop device carrying the PV
    pub dev: LoopDevice,
    /// the loop device of the raw block PV, when a `raw` pod is in the
    /// scenario ([`Node::use_raw`])
    pub raw: Option<LoopDevice>,
    /// the CSI raw block PV and its claim are written ([`Node::use_csi_raw`])
    pub csi_raw: bool,
    /// [`CSI_RAW_MAGIC`] was written on the CSI raw block device
    pub csi_raw_written: bool,
    /// `--checkpoint-every`
    pub checkpoint_every: Option<u64>,
    /// `securityContext.fsGroup` of every pod (`option fs_group=<gid>`)
    pub fs_group: Option<u32>,
    /// the CSI PV says 8 MiB, its claim's status 4 MiB, the driver makes
    /// a 4 MiB tmpfs and can expand it (`option expand`)
    pub expand: bool,
    /// `--journal off`
    pub journal_off: bool,
    /// more environment for the daemons started from now on
    pub env: Vec<(String, String)>,
    /// the pods whose manifests are in place
    pub desired: BTreeMap<String, Vec<Kind>>,
    /// the daemon, while it runs
    pub daemon: Option<Daemon>,
    /// files written to the PV (relative to its root) with their contents
    pub files: BTreeMap<String, String>,
    /// the last daemon's log
    last_log: Option<PathBuf>,
    /// pods and objects come from this API server fake instead of the
    /// static folders ([`Node::use_api`])
    pub api: Option<crate::support::apiserver::FakeApiServer>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.child.kill();
            let _ = d.child.wait();
        }
        // a raw block pod still mapped keeps its hold (a loop device over
        // the pod's file, not autoclear): released as a node going away
        // would, so the binds under the scratch dir can go
        for dev in self.holds_under(&self.root) {
            let _ = Command::new("losetup").args(["-d", &dev]).status();
        }
    }
}

/// One mount under the root.
#[derive(Debug, Clone)]
pub struct Seen {
    /// mountinfo's mount id
    pub id: u32,
    /// fs type
    pub fs_type: String,
}

impl Node {
    /// A fresh node; `blank` leaves the PV's device without a filesystem;
    /// `csi` starts the test CSI driver and writes the CSI PV, its claim and
    /// the CSIDriver object.
    pub fn new(blank: bool, csi: bool) -> Node {
        // The suite's per-run prefix, so parallel runs do not see each other's
        // devices as leftovers.
        let prefix = std::env::var(crate::SCRATCH_ENV).unwrap_or_else(|_| "volumed-crash-".into());
        let scratch = Scratch::new(&prefix);
        let base = scratch.path().to_owned();
        let image = base.join("pv.img");
        if blank {
            fs::File::create(&image)
                .and_then(|f| f.set_len(64 << 20))
                .expect("create blank image");
        } else {
            mkfs_ext4(&image, 64);
        }
        let dev = LoopDevice::attach(&image);
        let driver =
            csi.then(|| TestDriver::spawn(DriverOpts::in_dir(CSI_DRIVER, &base.join("driver"))));
        let node = Node {
            driver,
            root: base.join("root"),
            jdir: base.join("journal"),
            pods_dir: base.join("pods"),
            objects_dir: base.join("objects"),
            boot_file: base.join("boot_id"),
            boots: 0,
            runs: 0,
            dev,
            raw: None,
            csi_raw: false,
            csi_raw_written: false,
            checkpoint_every: None,
            fs_group: None,
            expand: false,
            journal_off: false,
            env: Vec::new(),
            desired: BTreeMap::new(),
            daemon: None,
            files: BTreeMap::new(),
            last_log: None,
            api: None,
            scratch,
        };
        mkdirs(&node.pods_dir);
        mkdirs(&node.objects_dir);
        mkdirs(&base.join("logs"));
        node.write_boot_id(0);
        node.write_objects();
        node
    }

    /// A `raw` pod in the scenario: a blank 8 MiB loop device starting
    /// with [`RAW_MAGIC`], the raw block PV `pv-raw` on it and its claim.
    pub fn use_raw(&mut self) {
        let image = self.scratch.path().join("raw.img");
        let mut bytes = RAW_MAGIC.to_vec();
        bytes.resize(8 << 20, 0);
        fs::write(&image, bytes).expect("write the raw image");
        self.raw = Some(LoopDevice::attach(&image));
        self.write_objects();
    }

    /// The raw block PV's device still starts with [`RAW_MAGIC`].
    pub fn check_raw_bytes(&self) -> Result<(), String> {
        let Some(raw) = &self.raw else {
            return Ok(());
        };
        let mut head = vec![0; RAW_MAGIC.len()];
        fs::File::open(raw.path())
            .and_then(|mut f| f.read_exact(&mut head))
            .map_err(|e| format!("read the raw device: {e}"))?;
        match head == RAW_MAGIC {
            true => Ok(()),
            false => Err(format!(
                "the raw device's bytes changed: {:?}",
                String::from_utf8_lossy(&head)
            )),
        }
    }

    /// A `csiraw` pod in the scenario: the CSI raw block PV `pv-csiraw`
    /// (the test driver's) and its claim.
    pub fn use_csi_raw(&mut self) {
        self.csi_raw = true;
        self.write_objects();
    }

    /// The test driver's loop device of the staged CSI raw block volume
    /// (backed by a file in its staging dir), if it is staged.
    fn csi_raw_device(&self) -> Option<String> {
        self.holds_under(&self.path(&Ref::CsiRawDev))
            .into_iter()
            .next()
    }

    /// Writes [`CSI_RAW_MAGIC`] at the start of the CSI raw block device,
    /// when the driver has it staged (the daemon may be down or settled).
    pub fn write_csi_raw_magic(&mut self) -> Result<(), String> {
        let Some(dev) = self.csi_raw_device() else {
            return Ok(());
        };
        fs::OpenOptions::new()
            .write(true)
            .open(&dev)
            .and_then(|mut f| f.write_all(CSI_RAW_MAGIC).and_then(|()| f.sync_all()))
            .map_err(|e| format!("write the CSI raw device {dev}: {e}"))?;
        self.csi_raw_written = true;
        Ok(())
    }

    /// The CSI raw block device still starts with [`CSI_RAW_MAGIC`]
    /// once written: read through each desired pod's symlink (so its map
    /// names that device) and, still staged, through the driver's device.
    pub fn check_csi_raw_bytes(&self) -> Result<(), String> {
        if !self.csi_raw_written {
            return Ok(());
        }
        let mut at: Vec<PathBuf> = self
            .desired
            .iter()
            .filter(|(_, k)| k.contains(&Kind::CsiRaw))
            .map(|(p, _)| self.path(&Ref::Pod(p.clone(), Kind::CsiRaw)))
            .collect();
        at.extend(self.csi_raw_device().map(PathBuf::from));
        for path in at {
            let mut head = vec![0; CSI_RAW_MAGIC.len()];
            fs::File::open(&path)
                .and_then(|mut f| f.read_exact(&mut head))
                .map_err(|e| format!("read the CSI raw device at {}: {e}", path.display()))?;
            if head != CSI_RAW_MAGIC {
                return Err(format!(
                    "the CSI raw device's bytes at {} changed: {:?}",
                    path.display(),
                    String::from_utf8_lossy(&head)
                ));
            }
        }
        Ok(())
    }

    /// The loop devices (`/dev/loopN`) backed by a file at or below `dir`,
    /// as sysfs names their backing files: a raw block map's holds.
    pub fn holds_under(&self, dir: &Path) -> Vec<String> {
        let Ok(dir) = fs::canonicalize(dir) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for e in fs::read_dir("/sys/block").into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let backing = fs::read_to_string(e.path().join("loop/backing_file"));
            if backing.is_ok_and(|b| Path::new(b.trim_end_matches('\n')).starts_with(&dir)) {
                found.push(format!("/dev/{name}"));
            }
        }
        found
    }

    /// `option expand`: the driver restarted able to expand, the CSI
    /// objects rewritten with a pending expansion.
    pub fn set_expand(&mut self) {
        self.expand = true;
        if let Some(mut d) = self.driver.take() {
            d.kill();
            let mut opts = d.opts().clone();
            opts.caps = Some("GET_VOLUME_STATS,VOLUME_CONDITION,EXPAND_VOLUME".into());
            self.driver = Some(TestDriver::spawn(opts));
        }
        self.write_objects();
    }

    /// `option expand`: every CSI pod target shows the PV's 8 MiB, and
    /// every CSI raw block pod's device, through its symlink, the PV's 32
    /// MiB.
    pub fn check_expanded(&self) -> Result<(), String> {
        for (p, kinds) in &self.desired {
            if kinds.contains(&Kind::CsiRaw) {
                let link = self.path(&Ref::Pod(p.clone(), Kind::CsiRaw));
                let rdev = fs::metadata(&link)
                    .map_err(|e| format!("stat {}: {e}", link.display()))?
                    .rdev();
                let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
                let size = format!("/sys/dev/block/{major}:{minor}/size");
                let sectors: u64 = fs::read_to_string(&size)
                    .map_err(|e| format!("read {size}: {e}"))?
                    .trim()
                    .parse()
                    .map_err(|e| format!("{size}: {e}"))?;
                if sectors * 512 != 32 << 20 {
                    return Err(format!(
                        "the device through {} is {} bytes, not the PV's 32 MiB",
                        link.display(),
                        sectors * 512
                    ));
                }
            }
            if !kinds.contains(&Kind::Csi) {
                continue;
            }
            let path = self.path(&Ref::Pod(p.clone(), Kind::Csi));
            let vfs = nix::sys::statvfs::statvfs(&path)
                .map_err(|e| format!("statvfs {}: {e}", path.display()))?;
            let bytes = vfs.blocks() * vfs.fragment_size();
            if bytes != 8 << 20 {
                return Err(format!(
                    "{} is {bytes} bytes, not the PV's 8 MiB",
                    path.display()
                ));
            }
        }
        Ok(())
    }

    fn write_boot_id(&self, n: u32) {
        fs::write(
            &self.boot_file,
            format!("c0ffee00-0000-4000-8000-{n:012}\n"),
        )
        .expect("write boot id");
    }

    /// Presents a new boot id (a reboot).
    pub fn new_boot(&mut self) {
        self.boots += 1;
        self.write_boot_id(self.boots);
    }

    /// From now on pods, PVs, claims and the CSIDriver come from an API
    /// server fake (the daemon is started with `--kubeconfig`), not the
    /// static folders, which are emptied.
    pub fn use_api(&mut self) {
        let api = crate::support::apiserver::FakeApiServer::start();
        api.put(serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_NAME}}));
        api.write_kubeconfig(&self.scratch.path().join("kubeconfig"));
        for e in fs::read_dir(&self.objects_dir)
            .expect("objects dir")
            .flatten()
        {
            fs::remove_file(e.path()).expect("remove a static object file");
        }
        self.api = Some(api);
        self.write_objects();
    }

    /// Writes the PV and its claim.
    pub fn write_objects(&self) {
        let dev = self.dev.path().display();
        let text = format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {PV}}}\nspec:\n  capacity: {{storage: 64Mi}}\n  accessModes: [ReadWriteOnce]\n  mountOptions: [noatime]\n  claimRef: {{namespace: default, name: claim-blk}}\n  local: {{path: {dev}, fsType: ext4}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-blk, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeName: {PV}\n  resources:\n    requests: {{storage: 64Mi}}\n"
        );
        self.write_object_file("pv.yaml", &text);
        let secret = format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: crash-secret, namespace: default, uid: 5ec2e700-0000-4000-8000-000000000001}}\nstringData: {{token: {SECRET_TOKEN}, ca.crt: {SECRET_TOKEN}-ca}}\n"
        );
        self.write_object_file("secret.yaml", &secret);
        let config = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: crash-config, namespace: default, uid: c0f19000-0000-4000-8000-000000000001}}\ndata: {{app.conf: {CONFIG_VALUE}}}\n"
        );
        self.write_object_file("config.yaml", &config);
        if let Some(raw) = &self.raw {
            let dev = raw.path().display();
            let text = format!(
                "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {RAW_PV}}}\nspec:\n  capacity: {{storage: 8Mi}}\n  volumeMode: Block\n  accessModes: [ReadWriteOnce]\n  claimRef: {{namespace: default, name: claim-raw}}\n  local: {{path: {dev}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-raw, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeMode: Block\n  volumeName: {RAW_PV}\n  resources:\n    requests: {{storage: 8Mi}}\n"
            );
            self.write_object_file("raw.yaml", &text);
        }
        if self.driver.is_some() && self.csi_raw && self.expand {
            // as the CSI PV below, for a block claim: the PV grown to 32
            // MiB, the claim's status still 16 MiB, the driver's device 16
            // MiB until NodeExpandVolume (no filesystem: the device grows)
            let text = format!(
                "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {CSI_RAW_PV}}}\nspec:\n  capacity: {{storage: 32Mi}}\n  volumeMode: Block\n  accessModes: [ReadWriteOnce]\n  claimRef: {{namespace: default, name: claim-csiraw}}\n  csi: {{driver: {CSI_DRIVER}, volumeHandle: vol-csiraw}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-csiraw, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeMode: Block\n  volumeName: {CSI_RAW_PV}\n  resources:\n    requests: {{storage: 32Mi}}\nstatus:\n  phase: Bound\n  capacity: {{storage: 16Mi}}\n"
            );
            self.write_object_file("csiraw.yaml", &text);
        } else if self.driver.is_some() && self.csi_raw {
            let text = format!(
                "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {CSI_RAW_PV}}}\nspec:\n  capacity: {{storage: 16Mi}}\n  volumeMode: Block\n  accessModes: [ReadWriteOnce]\n  claimRef: {{namespace: default, name: claim-csiraw}}\n  csi: {{driver: {CSI_DRIVER}, volumeHandle: vol-csiraw}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-csiraw, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeMode: Block\n  volumeName: {CSI_RAW_PV}\n  resources:\n    requests: {{storage: 16Mi}}\n"
            );
            self.write_object_file("csiraw.yaml", &text);
        }
        if self.driver.is_some() && self.expand {
            // a claim the resize controller grew: its PV is 8 MiB, its
            // status still 4 MiB (an older resizer's: no recovery fields),
            // the driver's tmpfs 4 MiB until NodeExpandVolume
            let text = format!(
                "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {CSI_PV}}}\nspec:\n  capacity: {{storage: 8Mi}}\n  accessModes: [ReadWriteMany]\n  mountOptions: [size=4m]\n  claimRef: {{namespace: default, name: claim-csi}}\n  csi: {{driver: {CSI_DRIVER}, volumeHandle: {CSI_HANDLE}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-csi, namespace: default}}\nspec:\n  accessModes: [ReadWriteMany]\n  volumeName: {CSI_PV}\n  resources:\n    requests: {{storage: 8Mi}}\nstatus:\n  phase: Bound\n  capacity: {{storage: 4Mi}}\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {CSI_DRIVER}}}\nspec: {{attachRequired: false}}\n"
            );
            self.write_object_file("csi.yaml", &text);
        } else if self.driver.is_some() {
            let text = format!(
                "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {CSI_PV}}}\nspec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteMany]\n  claimRef: {{namespace: default, name: claim-csi}}\n  csi: {{driver: {CSI_DRIVER}, volumeHandle: {CSI_HANDLE}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-csi, namespace: default}}\nspec:\n  accessModes: [ReadWriteMany]\n  volumeName: {CSI_PV}\n  resources:\n    requests: {{storage: 1Gi}}\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {CSI_DRIVER}}}\nspec: {{attachRequired: false}}\n"
            );
            self.write_object_file("csi.yaml", &text);
        }
    }

    /// An objects file, or its documents put in the API server.
    fn write_object_file(&self, name: &str, text: &str) {
        match &self.api {
            None => write_atomic(&self.objects_dir.join(name), text),
            Some(api) => {
                for doc in text.split("\n---\n") {
                    let v: Value = serde_saphyr::from_str(doc).expect("an object document");
                    api.put(v);
                }
            }
        }
    }

    /// Removes the local PV and its claim (no API server knows them any
    /// more); the CSI objects stay.
    pub fn drop_objects(&self) {
        match &self.api {
            None => fs::remove_file(self.objects_dir.join("pv.yaml")).expect("remove objects"),
            Some(api) => {
                api.delete("v1", "PersistentVolume", None, PV);
                api.delete("v1", "PersistentVolumeClaim", Some("default"), "claim-blk");
            }
        }
    }

    /// Adds (or replaces) a pod manifest.
    pub fn add_pod(&mut self, pod: &str, kinds: &[Kind]) {
        let mut vols = String::new();
        for k in kinds {
            vols.push_str(match k {
                Kind::Tmp => "  - {name: tmp, emptyDir: {medium: Memory, sizeLimit: 1Mi}}\n",
                Kind::Disk => "  - {name: disk, emptyDir: {}}\n",
                Kind::Pv => "  - {name: pv, persistentVolumeClaim: {claimName: claim-blk}}\n",
                Kind::Csi => "  - {name: csi, persistentVolumeClaim: {claimName: claim-csi}}\n",
                Kind::Secret => "  - {name: secret, secret: {secretName: crash-secret}}\n",
                Kind::ConfigMap => "  - {name: config, configMap: {name: crash-config}}\n",
                Kind::Raw => "  - {name: raw, persistentVolumeClaim: {claimName: claim-raw}}\n",
                Kind::CsiRaw => {
                    "  - {name: csiraw, persistentVolumeClaim: {claimName: claim-csiraw}}\n"
                }
            });
        }
        // a disk emptyDir is also mounted by subPath: `mounts <pod>` binds it
        let mut mounts = match kinds.contains(&Kind::Disk) {
            true => ", volumeMounts: [{name: disk, mountPath: /sub, subPath: sub}]",
            false => "",
        }
        .to_owned();
        // a raw block volume is a device of the container
        let devices: Vec<&str> = [
            (Kind::Raw, "{name: raw, devicePath: /dev/xvda}"),
            (Kind::CsiRaw, "{name: csiraw, devicePath: /dev/xvdb}"),
        ]
        .into_iter()
        .filter(|(k, _)| kinds.contains(k))
        .map(|(_, d)| d)
        .collect();
        if !devices.is_empty() {
            mounts.push_str(&format!(", volumeDevices: [{}]", devices.join(", ")));
        }
        let security = match self.fs_group {
            Some(g) => format!("  securityContext: {{fsGroup: {g}}}\n"),
            None => String::new(),
        };
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: default, uid: {}}}\nspec:\n  nodeName: {NODE_NAME}\n{security}  containers: [{{name: c, image: busybox{mounts}}}]\n  volumes:\n{vols}",
            uid(pod)
        );
        match &self.api {
            None => write_atomic(&self.pods_dir.join(format!("{pod}.yaml")), &text),
            Some(api) => {
                let v: Value = serde_saphyr::from_str(&text).expect("a pod document");
                api.put(v);
            }
        }
        self.desired.insert(pod.to_owned(), kinds.to_vec());
    }

    /// Asks the runtime API for the mounts of `pod`'s container `c`, which
    /// binds its subpaths; the daemon may die at a crash point meanwhile,
    /// so the answer is not required.
    pub fn ask_mounts(&self, pod: &str) {
        let path = format!("/v1/pods/{}/containers/c/mounts", uid(pod));
        let _ = self.get(&path);
    }

    /// Checks that the target `r` is owned as an fsGroup walk leaves it:
    /// every entry below it (none in another mount) with group `gid`,
    /// directories with setgid and `rwxrwx`, others with `rw-rw-`
    /// (symlinks: the group only).
    pub fn check_owned(&self, r: &Ref, gid: u32) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        let top = self.path(r);
        let top_dev = fs::metadata(&top).map_err(|e| format!("{r}: {e}"))?.dev();
        let mut todo = vec![top.clone()];
        let mut bad = Vec::new();
        let mut seen = 0;
        while let Some(p) = todo.pop() {
            let m = fs::symlink_metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            if m.dev() != top_dev {
                continue;
            }
            seen += 1;
            let bits = match (m.is_dir(), m.file_type().is_symlink()) {
                (true, _) => 0o2770,
                (_, true) => 0,
                _ => 0o660,
            };
            if m.gid() != gid || m.mode() & bits != bits {
                bad.push(format!(
                    "{} {:o} gid {}",
                    p.display(),
                    m.mode() & 0o7777,
                    m.gid()
                ));
            }
            if m.is_dir() {
                for e in fs::read_dir(&p).map_err(|e| format!("{}: {e}", p.display()))? {
                    todo.push(e.map_err(|e| e.to_string())?.path());
                }
            }
        }
        match bad.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "{r}: {} of {seen} entries not owned by group {gid}: {bad:?}",
                bad.len()
            )),
        }
    }

    /// Removes a pod manifest.
    pub fn delete_pod(&mut self, pod: &str) {
        match &self.api {
            None => drop(fs::remove_file(self.pods_dir.join(format!("{pod}.yaml")))),
            Some(api) => drop(api.delete("v1", "Pod", Some("default"), pod)),
        }
        self.desired.remove(pod);
    }

    /// The path of a target.
    pub fn path(&self, r: &Ref) -> PathBuf {
        match r {
            Ref::Dev => self
                .root
                .join("plugins/kubernetes.io/local-volume/mounts")
                .join(PV),
            Ref::CsiDev => self
                .root
                .join("plugins/kubernetes.io/csi")
                .join(CSI_DRIVER)
                .join(CSI_HANDLE_SHA256)
                .join("globalmount"),
            Ref::RawDev => self
                .root
                .join("plugins/kubernetes.io~local-volume/volumeDevices")
                .join(RAW_PV),
            Ref::CsiRawDev => self.csi_block_dir().join("staging").join(CSI_RAW_PV),
            Ref::CsiRawPublish(p) => self
                .csi_block_dir()
                .join("publish")
                .join(CSI_RAW_PV)
                .join(uid(p)),
            // the pod's symlink to its publish file
            Ref::Pod(p, Kind::CsiRaw) => self
                .root
                .join("pods")
                .join(uid(p))
                .join("volumeDevices/kubernetes.io~csi")
                .join(CSI_RAW_PV),
            // the pod's symlink to the device
            Ref::Pod(p, Kind::Raw) => self
                .root
                .join("pods")
                .join(uid(p))
                .join("volumeDevices/kubernetes.io~local-volume")
                .join(RAW_PV),
            Ref::Pod(p, k) => {
                let v = self.root.join("pods").join(uid(p)).join("volumes");
                match k {
                    Kind::Tmp => v.join("kubernetes.io~empty-dir/tmp"),
                    Kind::Disk => v.join("kubernetes.io~empty-dir/disk"),
                    Kind::Pv => v.join("kubernetes.io~local-volume").join(PV),
                    Kind::Csi => v.join("kubernetes.io~csi").join(CSI_PV).join("mount"),
                    Kind::Secret => v.join("kubernetes.io~secret/secret"),
                    Kind::ConfigMap => v.join("kubernetes.io~configmap/config"),
                    Kind::Raw | Kind::CsiRaw => unreachable!("matched above"),
                }
            }
        }
    }

    /// `<root>/plugins/kubernetes.io/csi/volumeDevices`: the CSI raw
    /// block paths.
    fn csi_block_dir(&self) -> PathBuf {
        self.root.join("plugins/kubernetes.io/csi/volumeDevices")
    }

    /// `volumeDevices/<pv-csiraw>/dev`: the CSI raw block volume's global
    /// map path, each mapping pod's file in it.
    fn csi_raw_map_dir(&self) -> PathBuf {
        self.csi_block_dir().join(CSI_RAW_PV).join("dev")
    }

    /// Where a target's mount is: its path, but for a raw block pod
    /// target the pod's file in the global map dir, with the device bound
    /// on it.
    pub fn mount_path(&self, r: &Ref) -> PathBuf {
        match r {
            Ref::Pod(p, Kind::Raw) => self.path(&Ref::RawDev).join(uid(p)),
            Ref::Pod(p, Kind::CsiRaw) => self.csi_raw_map_dir().join(uid(p)),
            _ => self.path(r),
        }
    }

    /// The target a path names, for any pod that was ever desired or is on disk.
    pub fn ref_of(&self, path: &Path) -> Option<Ref> {
        for r in [Ref::Dev, Ref::CsiDev, Ref::RawDev, Ref::CsiRawDev] {
            if path == self.path(&r) {
                return Some(r);
            }
        }
        // a CSI raw block pod's binds: ours on its file in the global map
        // path, the driver's on its publish file
        let pod_of = |p: &Path| {
            let name = p.file_name()?.to_str()?;
            Some(name.strip_prefix("crash-uid-")?.to_owned())
        };
        if path.parent() == Some(self.csi_raw_map_dir().as_path()) {
            return Some(Ref::Pod(pod_of(path)?, Kind::CsiRaw));
        }
        if path.parent()
            == Some(
                self.csi_block_dir()
                    .join("publish")
                    .join(CSI_RAW_PV)
                    .as_path(),
            )
        {
            return Some(Ref::CsiRawPublish(pod_of(path)?));
        }
        // a raw block pod's bind, on its file in the global map dir
        if path.parent() == Some(self.path(&Ref::RawDev).as_path()) {
            let name = path.file_name()?.to_str()?;
            return Some(Ref::Pod(
                name.strip_prefix("crash-uid-")?.to_owned(),
                Kind::Raw,
            ));
        }
        let rel = path.strip_prefix(self.root.join("pods")).ok()?;
        let mut c = rel.components();
        let u = c.next()?.as_os_str().to_str()?;
        let pod = u.strip_prefix("crash-uid-")?;
        [
            Kind::Tmp,
            Kind::Disk,
            Kind::Pv,
            Kind::Csi,
            Kind::Secret,
            Kind::ConfigMap,
            Kind::Raw,
            Kind::CsiRaw,
        ]
        .into_iter()
        .map(|k| Ref::Pod(pod.to_owned(), k))
        .find(|r| self.path(r) == path)
    }

    /// The mount targets the desired pods need, with their fs types.
    pub fn expected_mounts(&self) -> BTreeMap<Ref, &'static str> {
        let mut m = BTreeMap::new();
        for (pod, kinds) in &self.desired {
            for k in kinds {
                match k {
                    Kind::Tmp | Kind::Secret => {
                        m.insert(Ref::Pod(pod.clone(), *k), "tmpfs");
                    }
                    Kind::Pv => {
                        m.insert(Ref::Pod(pod.clone(), *k), "ext4");
                        m.insert(Ref::Dev, "ext4");
                    }
                    // the driver's tmpfs, and a bind of it
                    Kind::Csi => {
                        m.insert(Ref::Pod(pod.clone(), *k), "tmpfs");
                        m.insert(Ref::CsiDev, "tmpfs");
                    }
                    // the device bound on the pod's file: its node's fs,
                    // whatever `/dev` is (`""`: any type)
                    Kind::Raw => {
                        m.insert(Ref::Pod(pod.clone(), *k), "");
                    }
                    // ours on the pod's file and the driver's on its
                    // publish file, both of the driver's loop device
                    Kind::CsiRaw => {
                        m.insert(Ref::Pod(pod.clone(), *k), "");
                        m.insert(Ref::CsiRawPublish(pod.clone()), "");
                    }
                    Kind::Disk | Kind::ConfigMap => {}
                }
            }
        }
        m
    }

    /// Every mount below the root (the root's own bind excluded), by path.
    pub fn mounts(&self) -> BTreeMap<PathBuf, Vec<Seen>> {
        let table = MountTable::read_self().expect("read mountinfo");
        let mut m: BTreeMap<PathBuf, Vec<Seen>> = BTreeMap::new();
        for e in table.entries() {
            if e.mount_point.starts_with(&self.root) && e.mount_point != self.root {
                m.entry(e.mount_point.clone()).or_default().push(Seen {
                    id: e.mount_id,
                    fs_type: e.fs_type.clone(),
                });
            }
        }
        m
    }

    /// Starts the daemon (`crash_at`: `VOLUMED_CRASH_AT`) and waits for its
    /// `daemon.json`.
    pub fn start(&mut self, crash_at: Option<&str>) -> Result<(), String> {
        match self.start_or_exit(crash_at)? {
            None => Ok(()),
            // died before serving: fine for an early crash point, the caller decides
            Some(st) if st.signal() == Some(9) => Ok(()),
            Some(st) => Err(format!(
                "volumed exited at start: {st}\n{}",
                self.log_tail()
            )),
        }
    }

    /// [`Node::start`], but an exit before `daemon.json` is an answer:
    /// `Some(status)` (the exited daemon is kept, for its log).
    pub fn start_or_exit(
        &mut self,
        crash_at: Option<&str>,
    ) -> Result<Option<std::process::ExitStatus>, String> {
        assert!(self.daemon.is_none(), "a daemon already runs");
        self.runs += 1;
        let log = self
            .scratch
            .path()
            .join("logs")
            .join(format!("run-{}.log", self.runs));
        let mut cmd = Command::new(BIN);
        cmd.arg("run")
            .arg("--root-dir")
            .arg(&self.root)
            .arg("--journal-dir")
            .arg(&self.jdir)
            .args(["--node-name", NODE_NAME, "--listen", "127.0.0.1:0"])
            .arg("--static-pods")
            .arg(&self.pods_dir)
            .arg("--static-objects")
            .arg(&self.objects_dir)
            .arg("--boot-id-file")
            .arg(&self.boot_file)
            .args(["--poll-ms", "100"])
            .env("VOLUMED_LOG", "info")
            .env_remove("VOLUMED_CRASH_AT")
            .stdin(Stdio::null())
            .stdout(fs::File::create(log.with_extension("out")).expect("log file"))
            .stderr(fs::File::create(&log).expect("log file"));
        if let Some(n) = self.checkpoint_every {
            cmd.arg("--checkpoint-every").arg(n.to_string());
        }
        if self.api.is_some() {
            cmd.arg("--kubeconfig")
                .arg(self.scratch.path().join("kubeconfig"))
                .args(["--node-status-update-frequency", "500ms"]);
        }
        if let Some(d) = &self.driver {
            cmd.arg("--csi-driver")
                .arg(format!("{CSI_DRIVER}={}", d.endpoint().display()));
        }
        if self.journal_off {
            cmd.args(["--journal", "off"]);
        }
        if let Some(p) = crash_at {
            cmd.env("VOLUMED_CRASH_AT", p);
        }
        cmd.env_remove("VOLUMED_HOLD_AT");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        // SAFETY: between fork and exec only one raw prctl syscall runs (no
        // allocation, no locks): the daemon dies with the test thread that
        // started it, so a failing test never leaves it holding the
        // namespace's mounts and the loop device.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                Ok(())
            });
        }
        self.last_log = Some(log.clone());
        let child = cmd.spawn().map_err(|e| format!("spawn volumed: {e}"))?;
        let pid = child.id();
        let mut d = Daemon {
            child,
            addr: String::new(),
            log,
        };
        let info = self.jdir.join("daemon.json");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(v) = fs::read(&info)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()))
                && v["pid"] == pid
            {
                d.addr = v["listen"].as_str().unwrap_or_default().to_owned();
                break;
            }
            if let Ok(Some(st)) = d.child.try_wait() {
                self.daemon = Some(d);
                return Ok(Some(st));
            }
            if Instant::now() > deadline {
                self.daemon = Some(d);
                return Err(format!("no daemon.json after 20 s\n{}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.daemon = Some(d);
        Ok(None)
    }

    /// The last lines of the current (or last) daemon's log.
    pub fn log_tail(&self) -> String {
        let Some(log) = &self.last_log else {
            return String::new();
        };
        let text = fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(40);
        format!(
            "--- {} (last 40 lines) ---\n{}",
            log.display(),
            lines[from..].join("\n")
        )
    }

    /// SIGKILLs the daemon and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.child.kill();
            let _ = d.child.wait();
        }
    }

    /// Waits for the armed daemon to die at its crash point; the death must
    /// be a SIGKILL and its log must name the point.
    pub fn wait_crashed(&mut self, point: &str, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let d = self.daemon.as_mut().ok_or("no daemon")?;
        let status = loop {
            if let Some(s) = d.child.try_wait().map_err(|e| e.to_string())? {
                break s;
            }
            if Instant::now() > deadline {
                let tail = self.log_tail();
                self.kill();
                return Err(format!(
                    "crash point {point} never fired within {limit:?} (the daemon did not die by SIGKILL)\n{tail}"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let log = fs::read_to_string(&d.log).unwrap_or_default();
        let tail = self.log_tail();
        self.daemon = None;
        if status.signal() != Some(9) {
            return Err(format!(
                "the daemon exited with {status}, not by SIGKILL at {point}\n{tail}"
            ));
        }
        if !log.contains(&format!("crash point {point} reached")) {
            return Err(format!(
                "the daemon was SIGKILLed but not at {point}\n{tail}"
            ));
        }
        Ok(())
    }

    /// SIGTERMs the daemon and requires exit 0.
    pub fn stop(&mut self) -> Result<(), String> {
        let Some(mut d) = self.daemon.take() else {
            return Ok(());
        };
        let pid = Pid::from_raw(i32::try_from(d.child.id()).expect("pid"));
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = d.child.try_wait().map_err(|e| e.to_string())? {
                return if s.success() {
                    Ok(())
                } else {
                    Err(format!("SIGTERM: the daemon exited with {s}"))
                };
            }
            if Instant::now() > deadline {
                let _ = d.child.kill();
                let _ = d.child.wait();
                return Err("SIGTERM: the daemon did not exit within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the daemon still runs.
    pub fn alive(&mut self) -> bool {
        self.daemon
            .as_mut()
            .is_some_and(|d| matches!(d.child.try_wait(), Ok(None)))
    }

    /// `GET path` on the daemon: (status, body). Asked on its unix
    /// socket, which serves every endpoint (the TCP listener serves only
    /// the probes and `/metrics`).
    pub fn get(&self, path: &str) -> Result<(u16, String), String> {
        self.daemon.as_ref().ok_or("no daemon")?;
        let socket = self.jdir.join("api.sock");
        let mut s = std::os::unix::net::UnixStream::connect(&socket)
            .map_err(|e| format!("connect {}: {e}", socket.display()))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: volumed\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).map_err(|e| e.to_string())?;
        let status = buf
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("bad HTTP answer: {buf:?}"))?;
        let body = buf
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    }

    /// The metrics text.
    pub fn metrics(&self) -> Result<String, String> {
        match self.get("/metrics")? {
            (200, b) => Ok(b),
            (s, b) => Err(format!("/metrics {s}: {b}")),
        }
    }

    /// `volumed dump --format json` (asks the running daemon).
    pub fn dump(&self) -> Result<Value, String> {
        let out = Command::new(BIN)
            .arg("dump")
            .arg("--journal-dir")
            .arg(&self.jdir)
            .arg("--boot-id-file")
            .arg(&self.boot_file)
            .args(["--format", "json"])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "dump: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("dump json: {e}"))
    }

    /// `volumed reconstruct --dry-run` while the daemon is down: the targets
    /// a restart would decide uncertain (`journal_on` false: `--journal off`).
    pub fn dry_run_uncertain(&self, journal_on: bool) -> Result<Vec<PathBuf>, String> {
        let out = Command::new(BIN)
            .args(["reconstruct", "--dry-run", "--format", "json"])
            .arg("--root-dir")
            .arg(&self.root)
            .arg("--journal-dir")
            .arg(&self.jdir)
            .arg("--boot-id-file")
            .arg(&self.boot_file)
            .args(["--journal", if journal_on { "on" } else { "off" }])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "reconstruct --dry-run: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        Ok(v["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["decision"] == "uncertain")
            .filter_map(|t| t["path"].as_str().map(PathBuf::from))
            .collect())
    }

    /// Restarts the test CSI driver (a reboot's): whatever it held (the
    /// loop devices of the block volumes it staged) is gone, its files
    /// and call log stay.
    pub fn restart_driver(&mut self) {
        if let Some(mut d) = self.driver.take() {
            d.kill();
            self.driver = Some(TestDriver::spawn(d.opts().clone()));
        }
    }

    /// Detaches volumed's holds (the loop devices over raw block pods'
    /// files), as a reboot drops every loop device; the CSI driver's own,
    /// held open by the driver that keeps running here, stay.
    pub fn drop_holds(&self) {
        for dir in [self.path(&Ref::RawDev), self.csi_raw_map_dir()] {
            for dev in self.holds_under(&dir) {
                let _ = Command::new("losetup").args(["-d", &dev]).status();
            }
        }
    }

    /// Unmounts everything below the root, deepest first (a reboot).
    pub fn unmount_all(&self) {
        for _ in 0..50 {
            let table = MountTable::read_self().expect("read mountinfo");
            let left: Vec<PathBuf> = table
                .entries()
                .iter()
                .filter(|e| e.mount_point.starts_with(&self.root))
                .map(|e| e.mount_point.clone())
                .collect();
            if left.is_empty() {
                return;
            }
            for m in left.iter().rev() {
                let _ = umount2(m.as_path(), MntFlags::UMOUNT_NOFOLLOW);
            }
            // a loop device backed by a file below the root (a driver's,
            // released when it died) lets go of it asynchronously
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not unmount everything below {}", self.root.display());
    }

    /// Unmounts a target behind volumed's back.
    pub fn unmount(&self, r: &Ref) {
        let p = self.path(r);
        umount2(&p, MntFlags::UMOUNT_NOFOLLOW)
            .unwrap_or_else(|e| panic!("umount {}: {e}", p.display()));
    }

    /// Replaces whatever is at a target with a foreign tmpfs.
    pub fn foreign(&self, r: &Ref) {
        let p = self.path(r);
        let _ = umount2(&p, MntFlags::UMOUNT_NOFOLLOW);
        mkdirs(&p);
        mount_tmpfs(&p, "size=1m");
        fs::write(p.join("foreign"), "not volumed's").expect("write foreign file");
    }

    /// Writes `n` files of mode 0600 into a new dir `many/` of `pod`'s PV
    /// target (not remembered as PV files: they are for a walk).
    pub fn write_many(&self, pod: &str, n: usize) {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.path(&Ref::Pod(pod.to_owned(), Kind::Pv)).join("many");
        fs::create_dir(&dir).expect("make many/");
        for i in 0..n {
            let f = dir.join(format!("f{i}"));
            fs::write(&f, b"x").expect("write a file");
            fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).expect("chmod");
        }
    }

    /// Writes a file (fsynced) on the PV through a pod target that is mounted.
    pub fn write_pv_file(&mut self, pod: &str, tag: &str) -> Result<(), String> {
        let dir = self.path(&Ref::Pod(pod.to_owned(), Kind::Pv));
        let name = format!("file-{pod}-{tag}");
        let body = format!("written through {pod} at {tag}\n");
        let mut f = fs::File::create(dir.join(&name)).map_err(|e| format!("{name}: {e}"))?;
        f.write_all(body.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("{name}: {e}"))?;
        self.files.insert(name, body);
        Ok(())
    }

    /// Writes a file tagged `tag` on the PV through every desired pod that
    /// has one (data to be found after the fault).
    pub fn write_pv_files(&mut self, tag: &str) -> Result<(), String> {
        let pv_pods: Vec<String> = self
            .desired
            .iter()
            .filter(|(_, k)| k.contains(&Kind::Pv))
            .map(|(p, _)| p.clone())
            .collect();
        for p in pv_pods {
            self.write_pv_file(&p, tag)?;
        }
        Ok(())
    }

    /// Checks every file written to the PV: mounts the device read-only at a
    /// scratch dir (the daemon's mounts may or may not be there).
    pub fn check_pv_files(&self) -> Result<(), String> {
        if self.files.is_empty() {
            return Ok(());
        }
        let at = self.scratch.path().join("check");
        mkdirs(&at);
        mount(
            Some(self.dev.path()),
            &at,
            Some("ext4"),
            // the flags of a mount the daemon may still hold (another ro flag: EBUSY)
            MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| format!("mount the PV to check its files: {e}"))?;
        let mut lost = Vec::new();
        for (name, body) in &self.files {
            if fs::read_to_string(at.join(name)).ok().as_deref() != Some(body.as_str()) {
                lost.push(name.clone());
            }
        }
        umount2(&at, MntFlags::UMOUNT_NOFOLLOW).map_err(|e| format!("umount check: {e}"))?;
        if lost.is_empty() {
            Ok(())
        } else {
            Err(format!("files lost on the PV: {lost:?}"))
        }
    }

    /// The `(path, state)` of every target in a `state` document that is
    /// not `not_mounted` (the journal keeps a target it settled as not
    /// mounted until the volume is forgotten; the ASW may never have held
    /// it: both mean "not mounted").
    fn targets(state: &Value) -> BTreeMap<PathBuf, String> {
        let mut m = BTreeMap::new();
        for v in state["volumes"].as_array().into_iter().flatten() {
            if let Some(d) = v["device"].as_object() {
                m.insert(
                    PathBuf::from(d["mount_path"].as_str().unwrap_or_default()),
                    d["state"].as_str().unwrap_or_default().to_owned(),
                );
            }
            for p in v["pods"].as_array().into_iter().flatten() {
                m.insert(
                    PathBuf::from(p["mount_path"].as_str().unwrap_or_default()),
                    p["state"].as_str().unwrap_or_default().to_owned(),
                );
            }
        }
        m.retain(|_, s| s != "not_mounted");
        m
    }

    /// One look at whether the node has converged to the desired pods:
    /// ready; every needed mount there exactly once with the right fs type
    /// and nothing else mounted below the root; every desired disk
    /// emptyDir present; `/debug/state` agreeing (nothing uncertain, the
    /// needed targets mounted, nothing else mounted).
    pub fn converged_once(&self) -> Result<(), String> {
        match self.get("/readyz")? {
            (200, _) => {}
            (s, b) => return Err(format!("/readyz {s}: {b}")),
        }
        let want = self.expected_mounts();
        let seen = self.mounts();
        let mut problems = Vec::new();
        for (r, fs_type) in &want {
            let p = self.mount_path(r);
            match seen.get(&p).map(Vec::as_slice) {
                None | Some([]) => problems.push(format!("missing mount {r}")),
                Some([one]) if one.fs_type == *fs_type || fs_type.is_empty() => {}
                Some([one]) => problems.push(format!(
                    "{r} is a {} mount, not {fs_type} (adopted?)",
                    one.fs_type
                )),
                Some(many) => problems.push(format!("double mount at {r}: {many:?}")),
            }
        }
        let mount_paths: BTreeSet<PathBuf> = want.keys().map(|r| self.mount_path(r)).collect();
        // the targets' paths (a driver's publish bind is no target)
        let want_paths: BTreeSet<PathBuf> = want
            .keys()
            .filter(|r| !matches!(r, Ref::CsiRawPublish(_)))
            .map(|r| self.path(r))
            .collect();
        for p in seen.keys() {
            if !mount_paths.contains(p) {
                problems.push(format!(
                    "leaked mount {}",
                    self.ref_of(p)
                        .map_or_else(|| p.display().to_string(), |r| r.to_string())
                ));
            }
        }
        let mut dirs = BTreeSet::new();
        for (pod, kinds) in &self.desired {
            if kinds.contains(&Kind::Secret) {
                let r = Ref::Pod(pod.clone(), Kind::Secret);
                if let Err(e) = whole_payload(&self.path(&r), &secret_files()) {
                    problems.push(format!("{r}: {e}"));
                }
            }
            if kinds.contains(&Kind::ConfigMap) {
                let r = Ref::Pod(pod.clone(), Kind::ConfigMap);
                let files = [("app.conf", CONFIG_VALUE.to_owned())];
                if let Err(e) = whole_payload(&self.path(&r), &files) {
                    problems.push(format!("{r}: {e}"));
                }
                dirs.insert(self.path(&r));
            }
            if kinds.contains(&Kind::Disk) {
                let r = Ref::Pod(pod.clone(), Kind::Disk);
                if !self.path(&r).is_dir() {
                    problems.push(format!("missing dir {r}"));
                }
                dirs.insert(self.path(&r));
            }
            // a raw block map: the pod's symlink to the device, exactly one
            // hold over the pod's file, the global map dir
            if kinds.contains(&Kind::Raw) {
                let r = Ref::Pod(pod.clone(), Kind::Raw);
                let device = self.raw.as_ref().map(|d| d.path().to_owned());
                if fs::read_link(self.path(&r)).ok() != device {
                    problems.push(format!("{r}: no symlink to the raw device"));
                }
                let holds = self.holds_under(&self.mount_path(&r));
                if holds.len() != 1 {
                    problems.push(format!("{r}: held by {holds:?}, not one loop device"));
                }
                dirs.insert(self.path(&r));
                dirs.insert(self.path(&Ref::RawDev));
            }
        }
        // a CSI raw block map: the pod's symlink to its publish file,
        // exactly one hold over the pod's file, the staging dir
        for (pod, kinds) in &self.desired {
            if kinds.contains(&Kind::CsiRaw) {
                let r = Ref::Pod(pod.clone(), Kind::CsiRaw);
                let publish = self.path(&Ref::CsiRawPublish(pod.clone()));
                if fs::read_link(self.path(&r)).ok() != Some(publish) {
                    problems.push(format!("{r}: no symlink to its publish file"));
                }
                let holds = self.holds_under(&self.mount_path(&r));
                if holds.len() != 1 {
                    problems.push(format!("{r}: held by {holds:?}, not one loop device"));
                }
                dirs.insert(self.path(&r));
                dirs.insert(self.path(&Ref::CsiRawDev));
            }
        }
        // no hold of a pod that maps nothing any more
        for (kind, dir) in [
            (Kind::Raw, self.path(&Ref::RawDev)),
            (Kind::CsiRaw, self.csi_raw_map_dir()),
        ] {
            for dev in self.holds_under(&dir) {
                let held_by_desired =
                    self.desired
                        .iter()
                        .filter(|(_, k)| k.contains(&kind))
                        .any(|(p, _)| {
                            self.holds_under(&self.mount_path(&Ref::Pod(p.clone(), kind)))
                                .contains(&dev)
                        });
                if !held_by_desired {
                    problems.push(format!("leaked hold {dev}"));
                }
            }
        }
        let (code, body) = self.get("/debug/state")?;
        if code != 200 {
            return Err(format!("/debug/state {code}: {body}"));
        }
        let state: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let asw = Self::targets(&state);
        for (p, s) in &asw {
            let name = self
                .ref_of(p)
                .map_or_else(|| p.display().to_string(), |r| r.to_string());
            let needed = want_paths.contains(p) || dirs.contains(p);
            match s.as_str() {
                "uncertain" => problems.push(format!("{name} still uncertain")),
                "mounted" if !needed => problems.push(format!("ASW: {name} mounted, not needed")),
                "not_mounted" if needed => problems.push(format!("ASW: {name} not mounted")),
                _ => {}
            }
        }
        for p in want_paths.iter().chain(&dirs) {
            if !asw.contains_key(p) {
                problems.push(format!("ASW lacks {}", p.display()));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// Waits (up to [`CONVERGE`]) until [`Node::converged_once`] and `extra`
    /// hold and `dump` agrees with `/debug/state`. The last is waited for
    /// too: the two are read at different instants, and a step still in
    /// flight when `extra` is met (the driver logs a call before the daemon
    /// journals its outcome) shows as pending in one and not the other.
    /// Only a disagreement that outlasts the wait fails.
    pub fn converge(&mut self, extra: &dyn Fn(&Node) -> Result<(), String>) -> Result<(), String> {
        let deadline = Instant::now() + CONVERGE;
        let dump = loop {
            if !self.alive() {
                return Err(format!("the daemon died\n{}", self.log_tail()));
            }
            let r = self
                .converged_once()
                .and_then(|()| extra(self))
                .and_then(|()| self.dump_agrees());
            match r {
                Ok(dump) => break dump,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "not converged after {CONVERGE:?}: {e}\n{}",
                        self.log_tail()
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        // the journal's subPath binds are the host's: each one it lists is
        // a mount (and the check above leaves no other mount)
        let seen = self.mounts();
        for b in dump["subpaths"].as_array().into_iter().flatten() {
            let path = self
                .root
                .join("pods")
                .join(b["pod_uid"].as_str().unwrap_or_default())
                .join("volume-subpaths")
                .join(b["name"].as_str().unwrap_or_default())
                .join(b["container"].as_str().unwrap_or_default())
                .join(b["index"].to_string());
            if b["state"] != "mounted" || !seen.contains_key(&path) {
                return Err(format!(
                    "the journal keeps a subPath bind the host does not have: {b}"
                ));
            }
        }
        Ok(())
    }

    /// The journal's `dump` when its targets are `/debug/state`'s.
    fn dump_agrees(&self) -> Result<Value, String> {
        let dump = self.dump()?;
        let (_, body) = self.get("/debug/state")?;
        let state: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let (a, b) = (Self::targets(&dump["state"]), Self::targets(&state));
        if a != b {
            return Err(format!(
                "dump and /debug/state disagree:\ndump  {a:?}\nstate {b:?}"
            ));
        }
        Ok(dump)
    }

    /// `volumed_plugin_operations_total` summed over plugins, per operation.
    pub fn plugin_ops(&self) -> Result<BTreeMap<String, u64>, String> {
        let text = self.metrics()?;
        let mut m = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("volumed_plugin_operations_total{") else {
                continue;
            };
            let (labels, value) = rest.split_once("} ").ok_or("bad metric line")?;
            let op = labels
                .split(',')
                .find_map(|l| l.strip_prefix("operation=\""))
                .map(|o| o.trim_end_matches('"').to_owned())
                .ok_or("no operation label")?;
            // an IntCounter: a whole number
            let n: u64 = value.trim().parse().map_err(|_| "bad metric value")?;
            *m.entry(op).or_insert(0) += n;
        }
        Ok(m)
    }

    /// How many calls the test CSI driver has logged so far (0 without
    /// one): the mark [`Node::rpcs_since`] counts from.
    pub fn rpc_mark(&self) -> usize {
        self.driver
            .as_ref()
            .map_or(0, |d| read_calls(&d.opts().state).len())
    }

    /// The driver's calls logged after `mark`, per method.
    pub fn rpcs_since(&self, mark: usize) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        if let Some(d) = &self.driver {
            for c in read_calls(&d.opts().state).iter().skip(mark) {
                if let Some(method) = c["method"].as_str() {
                    *m.entry(method.to_owned()).or_insert(0) += 1;
                }
            }
        }
        m
    }

    /// An unlabelled metric's value.
    pub fn metric(&self, name: &str) -> Result<u64, String> {
        let text = self.metrics()?;
        for line in text.lines() {
            if let Some(v) = line.strip_prefix(name).and_then(|r| r.strip_prefix(' ')) {
                return v
                    .trim()
                    .parse()
                    .map_err(|_| format!("{name}: not a whole number: {v}"));
            }
        }
        Err(format!("no metric {name} on /metrics"))
    }

    /// Any `.deleting~N` dir left under a pod's volumes.
    pub fn pending_deletions(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let pods = self.root.join("pods");
        for pod in fs::read_dir(&pods).into_iter().flatten().flatten() {
            for plugin in fs::read_dir(pod.path().join("volumes"))
                .into_iter()
                .flatten()
                .flatten()
            {
                for v in fs::read_dir(plugin.path()).into_iter().flatten().flatten() {
                    if v.file_name().to_string_lossy().contains(".deleting~") {
                        out.push(v.path());
                    }
                }
            }
        }
        out
    }
}

fn write_atomic(path: &Path, text: &str) {
    // A dotfile is skipped by the sources, so the rename is the one change seen.
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("x")
    ));
    fs::write(&tmp, text).expect("write manifest");
    fs::rename(&tmp, path).expect("rename manifest");
}

/// The crash fixtures' Secret value (`token`; `ca.crt` is it plus `-ca`).
const SECRET_TOKEN: &str = "crash-token-3f9a";

/// The crash fixtures' ConfigMap value (`app.conf`).
const CONFIG_VALUE: &str = "crash-config-8c2d";

/// The secret volume's files: (name, content).
fn secret_files() -> [(&'static str, String); 2] {
    [
        ("token", SECRET_TOKEN.to_owned()),
        ("ca.crt", format!("{SECRET_TOKEN}-ca")),
    ]
}

/// Whether the payload volume at `dir` holds one whole payload: `..data`
/// pointing at the only payload dir, `files` through it with their
/// values, nothing half-written beside it.
fn whole_payload(dir: &Path, files: &[(&str, String)]) -> Result<(), String> {
    let data = fs::read_link(dir.join("..data")).map_err(|e| format!("..data: {e}"))?;
    let mut private: Vec<String> = fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".."))
        .collect();
    private.sort();
    let want = vec![data.to_string_lossy().into_owned(), "..data".to_owned()];
    if private != want {
        return Err(format!("private entries {private:?}, want {want:?}"));
    }
    for (name, value) in files {
        let got = fs::read_to_string(dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
        if got != *value {
            return Err(format!("{name} holds {got:?}"));
        }
    }
    Ok(())
}
