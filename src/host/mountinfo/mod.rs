//! Our own byte parser of `/proc/<pid>/mountinfo` and the [`MountTable`]
//! built from it.
//!
//! Line format (proc(5), kernel `show_mountinfo`): mount id, parent id,
//! `major:minor`, root within the filesystem, mount point, per-mount options,
//! zero or more optional fields (`shared:N`, `master:N`, `propagate_from:N`,
//! `unbindable`), a lone `-`, fs type, source, super-block options. The
//! optional fields make lines variable-length, so everything after field 6 is
//! found relative to the `-` separator, never by position.
//!
//! The kernel escapes space, tab, newline and backslash as three-digit octal
//! (`\040`, `\011`, `\012`, `\134`) in the root, mount point, fs type and
//! source; we undo any `\ooo`. Paths are built from bytes, so a mount point
//! that is not UTF-8 reads fine. Super options are split on commas outside
//! double quotes: SELinux prints `context="…,…"` quoted when the label holds a
//! comma (MCS categories) and unquoted otherwise.
//!
//! A malformed line becomes a [`LineError`] in [`MountTable::errors`] and the
//! other lines still parse: whatever a pod manages to mount must not blind
//! us to the rest of the table.
//!
//! Reading: [`read_mountinfo`] reads the file to end-of-file into one buffer.
//! The kernel serves mountinfo through `seq_file`, which hands out at most
//! one buffer (a page, 4 KiB) per `read()` call however large the caller's
//! buffer is (measured here: a 12.9 KB table came back in reads of 4073,
//! 4052, 4060 and 696 bytes, each asking for 1 MiB). So one `read()` is consistent only for a
//! table that fits in a page; larger tables take several reads, which since
//! Linux 5.8 (mount cursors) skip no entry but are not one atomic snapshot.
//! Detecting a change during the read (poll for `POLLPRI` on the same fd, the
//! mechanism kubernetes PR #61776 proposed) belongs to the syscall seam.
//! [`MountTable::read_overlapped`] makes the same reads on a second thread
//! and parses each line as it arrives, with the same line parser.

mod escape;
mod parse;
mod query;
mod read;

use std::ffi::OsString;
use std::path::PathBuf;

use crate::host::super_options::SuperOptions;
use crate::model::{DevId, MountIdentity, SharedPath, SharedStr};

pub use escape::{escape, unescape};
pub use query::MountStack;
pub use read::read_mountinfo;
pub(crate) use read::read_pieces;

/// Refuse to hold a mount table larger than this (about 4 million mounts).
pub const MAX_MOUNTINFO_BYTES: usize = 512 << 20;

/// Propagation state from the optional fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Propagation {
    /// `shared:N`: member of peer group N
    pub shared: Option<u32>,
    /// `master:N`: slave of peer group N
    pub master: Option<u32>,
    /// `propagate_from:N`: receives from group N (dominating group not reachable)
    pub propagate_from: Option<u32>,
    /// `unbindable`
    pub unbindable: bool,
    /// optional fields this parser does not know, kept verbatim
    pub other: Vec<String>,
}

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// the mount's id (may be reused after unmount)
    pub mount_id: u32,
    /// the parent mount's id
    pub parent_id: u32,
    /// `major:minor` of the filesystem
    pub dev: DevId,
    /// the root of the mount within its filesystem (`/` unless a bind of a sub-directory)
    pub root: PathBuf,
    /// the mount point, relative to the reader's root
    pub mount_point: PathBuf,
    /// per-mount options (`ro`, `nosuid`, `relatime`, …), in order
    pub mount_options: Vec<String>,
    /// the optional (propagation) fields
    pub propagation: Propagation,
    /// the filesystem type, `type[.subtype]` (lossily decoded)
    pub fs_type: String,
    /// the mount source (device path, `tmpfs`, …), unescaped
    pub source: OsString,
    /// the super-block options exactly as the kernel wrote them
    pub super_options_raw: OsString,
    /// the super-block options parsed
    pub super_options: SuperOptions,
}

impl MountInfo {
    /// Whether the mount itself (not the super block) is read-only.
    pub fn is_read_only(&self) -> bool {
        self.mount_options.iter().any(|o| o == "ro")
    }

    /// The identity reconstruction compares (docs/merge-table.md):
    /// device, root, fs type, the per-mount `ro` flag and the super block's
    /// `context=` label.
    pub fn identity(&self) -> MountIdentity {
        MountIdentity {
            dev: self.dev,
            root: SharedPath::fs_root(&self.root),
            fs_type: SharedStr::fs_type(&self.fs_type),
            read_only: self.is_read_only(),
            selinux: self.super_options.selinux.context.clone(),
        }
    }
}

/// Why a line could not be parsed (or, for warnings, what part was ignored).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineErrorKind {
    /// the line ends before this field
    #[error("missing {0}")]
    MissingField(&'static str),
    /// a field that must be a decimal number is not
    #[error("{0} is not a decimal number")]
    BadNumber(&'static str),
    /// the device field is not `major:minor`
    #[error("device is not major:minor")]
    BadDevice,
    /// a backslash not followed by three octal digits of a byte
    #[error("bad octal escape in {0}")]
    BadEscape(&'static str),
    /// a known optional field with a bad value
    #[error("malformed optional field {0:?}")]
    BadOptionalField(String),
    /// no lone `-` after the optional fields
    #[error("no '-' separator")]
    MissingSeparator,
    /// an empty line before the end of the file
    #[error("empty line")]
    EmptyLine,
    /// a NUL byte, which no path can hold
    #[error("contains a NUL byte")]
    NulByte,
    /// warning: an SELinux label option that is not a valid context (entry kept)
    #[error("invalid selinux label {0:?} ignored")]
    InvalidSeLinuxContext(String),
}

/// A problem with one line of the table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mountinfo line {line}: {kind}")]
pub struct LineError {
    /// 1-based line number
    pub line: usize,
    /// what was wrong
    pub kind: LineErrorKind,
}

/// Every entry of one read of a mount table, with lookups by path.
#[derive(Debug, Clone, Default)]
pub struct MountTable {
    entries: Vec<MountInfo>,
    /// indices into `entries`, sorted by mount-point bytes, table order kept for ties
    by_path: Vec<usize>,
    errors: Vec<LineError>,
    warnings: Vec<LineError>,
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::Path;

    use super::read::TableBuilder;
    use super::*;
    use crate::host::HostError;
    use crate::host::testgen::{XorShift, kubelet_table};

    fn fixture(name: &str) -> MountTable {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/mountinfo")
            .join(name);
        let table = MountTable::read(&path).unwrap();
        assert!(table.errors().is_empty(), "{name}: {:?}", table.errors());
        table
    }

    fn one(line: &str) -> MountInfo {
        let t = MountTable::parse(line.as_bytes());
        assert!(t.errors().is_empty(), "{line}: {:?}", t.errors());
        assert_eq!(t.len(), 1);
        t.entries()[0].clone()
    }

    fn error_of(line: &[u8]) -> LineErrorKind {
        let t = MountTable::parse(line);
        assert_eq!(t.len(), 0, "{:?} parsed", String::from_utf8_lossy(line));
        assert_eq!(t.errors().len(), 1);
        t.errors()[0].kind.clone()
    }

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    /// What a table holds, for comparing two.
    fn parts(t: &MountTable) -> (Vec<MountInfo>, Vec<LineError>, Vec<LineError>, Vec<PathBuf>) {
        let sorted = t.by_path.iter().map(|&i| t.entries[i].mount_point.clone());
        (
            t.entries().to_vec(),
            t.errors().to_vec(),
            t.warnings().to_vec(),
            sorted.collect(),
        )
    }

    /// A table fed in pieces cut anywhere (mid-line, mid-escape, at a
    /// newline) is the table parsed in one piece: lines, line numbers of
    /// errors and warnings, and the path order.
    #[test]
    fn a_table_fed_in_pieces_is_the_table_parsed_whole() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mountinfo");
        let mut inputs: Vec<Vec<u8>> = [
            "kubelet-node.txt",
            "escaped-paths.txt",
            "selinux-kubelet-node.txt",
        ]
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect();
        inputs.push(kubelet_table(300, 7));
        for edge in [
            "",
            "\n",
            "\n\n",
            "garbage\n\nmore garbage",
            "no newline at the end",
        ] {
            inputs.push(edge.as_bytes().to_vec());
        }
        let mut with_errors = inputs[0].clone();
        with_errors.extend_from_slice(b"bad line\n\n");
        with_errors.extend_from_slice(&inputs[1]);
        inputs.push(with_errors);
        for input in &inputs {
            let whole = parts(&MountTable::parse(input));
            for size in [1, 2, 3, 7, 64, 4096, input.len().max(1)] {
                let mut b = TableBuilder::default();
                for piece in input.chunks(size) {
                    b.feed(piece);
                }
                assert_eq!(
                    parts(&b.finish()),
                    whole,
                    "pieces of {size} of {:?}",
                    String::from_utf8_lossy(&input[..input.len().min(40)])
                );
            }
        }
        assert_eq!(MountTable::parse(b"\n").len(), 0);
        assert!(
            MountTable::parse(b"\n").errors().is_empty(),
            "a lone newline is empty"
        );
    }

    /// The overlapped read of the live table gives what the plain read
    /// gives, and runs `meanwhile`.
    #[test]
    fn an_overlapped_read_is_the_plain_read() {
        let path = Path::new("/proc/self/mountinfo");
        let (table, ran) = MountTable::read_overlapped(|f| read_pieces(path, f), || 42);
        assert_eq!(ran, 42);
        let table = table.unwrap();
        let plain = MountTable::read(path).unwrap();
        assert!(!table.is_empty());
        // the table may change between two reads (other tests mount in
        // their own namespaces, not this one): compare what both hold
        assert_eq!(parts(&table), parts(&plain));
        let (missing, _) = MountTable::read_overlapped(
            |f| read_pieces(Path::new("/nonexistent/mountinfo"), f),
            || (),
        );
        assert!(
            matches!(missing, Err(HostError::ReadMountInfo { .. })),
            "{missing:?}"
        );
    }

    #[test]
    fn each_escape_is_undone() {
        for (esc, raw) in [
            (r"/a\040b", "/a b"),
            (r"/a\011b", "/a\tb"),
            (r"/a\012b", "/a\nb"),
            (r"/a\134b", "/a\\b"),
            (r"/a\042b", "/a\"b"),
            (r"/\101\102", "/AB"),
        ] {
            let m = one(&format!("1 0 0:1 {esc} {esc} rw - tmpfs {esc} rw"));
            assert_eq!(m.mount_point, p(raw));
            assert_eq!(m.root, p(raw));
            assert_eq!(m.source, raw);
        }
        let m = one(r"1 0 0:1 / /x rw - fuse.a\040b src rw");
        assert_eq!(m.fs_type, "fuse.a b");
        assert_eq!(unescape(br"\377").unwrap(), vec![0xff]);
        for bad in [&br"\400"[..], br"\8", br"\01", br"\", br"a\0x1"] {
            assert_eq!(unescape(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn optional_field_mixes() {
        let prop = |opt: &str| one(&format!("1 0 0:1 / /x rw{opt} - tmpfs t rw")).propagation;
        assert_eq!(prop(""), Propagation::default());
        assert_eq!(prop(" shared:7").shared, Some(7));
        let m = prop(" master:3");
        assert_eq!((m.shared, m.master), (None, Some(3)));
        let m = prop(" shared:12 master:3");
        assert_eq!((m.shared, m.master), (Some(12), Some(3)));
        let m = prop(" master:3 propagate_from:1");
        assert_eq!((m.master, m.propagate_from), (Some(3), Some(1)));
        let m = prop(" unbindable");
        assert!(m.unbindable && m.shared.is_none());
        let m = prop(" shared:1 future_tag:9 bare");
        assert_eq!(m.other, vec!["future_tag:9".to_owned(), "bare".to_owned()]);
        assert_eq!(m.shared, Some(1));
        assert_eq!(
            error_of(b"1 0 0:1 / /x rw shared:x - tmpfs t rw"),
            LineErrorKind::BadOptionalField("shared:x".into())
        );
    }

    #[test]
    fn quoted_and_unquoted_context() {
        let m = one(
            r#"1 0 0:1 / /x rw - tmpfs tmpfs rw,context="system_u:object_r:container_file_t:s0:c1,c2",size=4k"#,
        );
        let ctx = m.super_options.selinux.context.clone().unwrap();
        assert_eq!(ctx.as_str(), "system_u:object_r:container_file_t:s0:c1,c2");
        assert_eq!(
            m.super_options.get("size"),
            Some(Some(&OsString::from("4k")))
        );
        assert_eq!(
            m.super_options.options.len(),
            3,
            "the quoted comma does not split"
        );
        assert_eq!(m.identity().selinux, Some(ctx));

        let m =
            one("1 0 0:1 / /x rw - tmpfs tmpfs rw,context=system_u:object_r:container_file_t:s0");
        assert_eq!(
            m.identity().selinux.unwrap().as_str(),
            "system_u:object_r:container_file_t:s0"
        );
        let m = one("1 0 0:1 / /x rw - ext4 /dev/sda rw,seclabel,defcontext=u:r:t:s0");
        assert!(m.super_options.selinux.seclabel);
        assert_eq!(
            m.super_options
                .selinux
                .defcontext
                .as_ref()
                .unwrap()
                .as_str(),
            "u:r:t:s0"
        );
        assert_eq!(
            m.identity().selinux,
            None,
            "only context= is the mount label"
        );
    }

    #[test]
    fn invalid_label_keeps_the_entry_with_a_warning() {
        let t = MountTable::parse(b"1 0 0:1 / /x rw - tmpfs tmpfs rw,context=\"not a label\"\n");
        assert_eq!(t.len(), 1);
        assert!(t.errors().is_empty());
        assert_eq!(t.warnings().len(), 1);
        assert_eq!(t.warnings()[0].line, 1);
        let sel = &t.entries()[0].super_options.selinux;
        assert_eq!(sel.context, None);
        assert_eq!(sel.invalid, vec![r#"context="not a label""#.to_owned()]);
    }

    #[test]
    fn bind_of_a_subdirectory_keeps_its_root() {
        let t = fixture("bind-subdir.txt");
        let app = t.top_at(p("/srv/app")).unwrap();
        assert_eq!(app.root, p("/data/app"));
        assert_eq!(app.dev, DevId { major: 7, minor: 3 });
        let ro = t.top_at(p("/srv/app-ro")).unwrap();
        assert!(ro.is_read_only());
        assert_eq!(ro.super_options_raw, "rw", "the super block stays rw");
        assert_eq!(t.by_dev(DevId { major: 7, minor: 3 }).count(), 5);
        let whole = t.top_at(p("/mnt/disks/vol3")).unwrap().identity();
        assert_ne!(whole, app.identity(), "same device, different root");

        let stack: Vec<u32> = t.at(p("/srv/stack")).map(|m| m.mount_id).collect();
        assert_eq!(stack, vec![74, 75]);
        assert_eq!(t.top_at(p("/srv/stack/")).unwrap().mount_id, 75);
        assert_eq!(t.top_at(p("/srv/stack")).unwrap().source, "upper");
        let slave = &t.top_at(p("/srv/slave")).unwrap().propagation;
        assert_eq!((slave.master, slave.propagate_from), (Some(50), Some(1)));
        assert!(
            t.top_at(p("/srv/unbindable"))
                .unwrap()
                .propagation
                .unbindable
        );
    }

    #[test]
    fn lookups_by_path_and_prefix() {
        let t = fixture("bind-subdir.txt");
        assert!(t.is_mount_point(p("/srv/app")));
        assert!(!t.is_mount_point(p("/srv")));
        assert!(!t.is_mount_point(p("/srv/ap")));
        let under: Vec<_> = t.under(p("/srv/app")).collect();
        assert!(under.is_empty(), "/srv/app-ro is not under /srv/app");
        let under: Vec<u32> = t.under(p("/srv")).map(|m| m.mount_id).collect();
        assert_eq!(under, vec![71, 72, 76, 74, 75, 77]);
        assert_eq!(t.under(p("/")).count(), t.len() - 1);
        assert_eq!(t.by_id(70).unwrap().mount_point, p("/mnt/disks/vol3"));
    }

    #[test]
    fn escaped_paths_fixture() {
        let t = fixture("escaped-paths.txt");
        assert_eq!(t.len(), 7);
        assert!(t.is_mount_point(p("/tmp/esc/a b\tc\\d")));
        assert!(t.is_mount_point(p("/tmp/esc/line\nbreak")));
        assert!(t.is_mount_point(p("/tmp/esc/quote\"d")));
        let raw = OsString::from_vec(b"/tmp/esc/raw-\xff\xfe-bytes".to_vec());
        assert_eq!(t.top_at(Path::new(&raw)).unwrap().mount_id, 52);
        assert_eq!(t.by_id(51).unwrap().source, "my source");
        assert_eq!(t.by_id(53).unwrap().root, p("/srv/with space"));
        assert_eq!(t.by_id(54).unwrap().fs_type, "fuse.my fs");
        assert_eq!(t.by_id(55).unwrap().source, "");
        assert_eq!(t.by_id(55).unwrap().super_options_raw, "rw");
    }

    #[test]
    fn selinux_fixture() {
        let t = fixture("selinux-host.txt");
        assert!(t.warnings().is_empty(), "{:?}", t.warnings());
        let label = |id| {
            t.by_id(id)
                .unwrap()
                .identity()
                .selinux
                .map(|c| c.to_string())
        };
        let two = "system_u:object_r:container_file_t:s0:c1,c2";
        assert_eq!(label(60).as_deref(), Some(two));
        let norm = "system_u:object_r:container_file_t:s0:c5,c10";
        assert_eq!(label(61).as_deref(), Some(norm), "categories normalised");
        assert_eq!(label(62), label(61), "a bind shows the super block's label");
        assert_eq!(
            label(63).as_deref(),
            Some("system_u:object_r:container_file_t:s0")
        );
        assert!(t.by_id(21).unwrap().super_options.selinux.seclabel);
        assert!(!t.by_id(60).unwrap().super_options.selinux.seclabel);
        let nfs = &t.by_id(64).unwrap().super_options;
        assert_eq!(
            nfs.selinux.fscontext.as_ref().unwrap().as_str(),
            "system_u:object_r:nfs_t:s0"
        );
        assert_eq!(nfs.selinux.context, None);
        assert_eq!(nfs.get("hard"), Some(None));
    }

    #[test]
    fn kubelet_fixture_entries() {
        let t = fixture("kubelet-node.txt");
        assert_eq!(t.len(), 16);
        let k = p("/var/lib/kubelet");
        assert_eq!(t.top_at(k).unwrap().root, k);
        assert_eq!(t.top_at(k).unwrap().propagation.shared, Some(20));
        let pv = t
            .top_at(p(
                "/var/lib/kubelet/plugins/kubernetes.io/local-volume/mounts/pv-local-1",
            ))
            .unwrap();
        assert_eq!(pv.dev, DevId { major: 7, minor: 0 });
        assert_eq!(pv.source, "/dev/loop0");
        let binds: Vec<&MountInfo> = t
            .by_dev(pv.dev)
            .filter(|m| m.root == p("/") && m.mount_id != pv.mount_id)
            .collect();
        assert_eq!(binds.len(), 2);
        assert!(binds.iter().all(|b| b.propagation.shared == Some(210)));
        let csi = t.by_id(421).unwrap();
        assert_eq!(
            (csi.propagation.shared, csi.propagation.master),
            (Some(221), Some(220))
        );
        assert!(t.under(p("/var/lib/kubelet/pods")).count() >= 6);
    }

    #[test]
    fn malformed_lines_are_collected_and_others_parse() {
        let input = b"1 0 0:1 / / rw - ext4 /dev/a rw\n\
            x 0 0:1 / /b rw - ext4 /dev/a rw\n\
            3 0 01 / /c rw - ext4 /dev/a rw\n\
            4 0 0:1 / /d rw shared:1 ext4 /dev/a rw\n\
            5 0 0:1 / /e\\9 rw - ext4 /dev/a rw\n\
            \n\
            7 0 0:1 / /f rw - ext4\n\
            8 0 0:1 / /g\0 rw - ext4 /dev/a rw\n\
            9 0 0:1\n\
            10 0 0:1 / /h rw - ext4 /dev/a rw\n";
        let t = MountTable::parse(input);
        let ids: Vec<u32> = t.entries().iter().map(|m| m.mount_id).collect();
        assert_eq!(ids, vec![1, 10]);
        let errs: Vec<(usize, LineErrorKind)> = t
            .errors()
            .iter()
            .map(|e| (e.line, e.kind.clone()))
            .collect();
        assert_eq!(
            errs,
            vec![
                (2, LineErrorKind::BadNumber("mount id")),
                (3, LineErrorKind::BadDevice),
                (4, LineErrorKind::MissingSeparator),
                (5, LineErrorKind::BadEscape("mount point")),
                (6, LineErrorKind::EmptyLine),
                (7, LineErrorKind::MissingField("source")),
                (8, LineErrorKind::NulByte),
                (9, LineErrorKind::MissingField("root")),
            ]
        );
        assert_eq!(
            t.errors()[0].to_string(),
            "mountinfo line 2: mount id is not a decimal number"
        );
        assert_eq!(
            error_of(b"99999999999 0 0:1 / / rw - a b c"),
            LineErrorKind::BadNumber("mount id")
        );
        assert_eq!(
            error_of(b"+1 0 0:1 / / rw - a b c"),
            LineErrorKind::BadNumber("mount id")
        );
        assert_eq!(
            error_of(b"1 0 0:1 / / rw - a b"),
            LineErrorKind::MissingField("super options")
        );
        assert_eq!(
            error_of(b"1 0 0:1 / / rw -  b c"),
            LineErrorKind::MissingField("fs type")
        );
        assert!(MountTable::parse(b"").is_empty());
        assert!(MountTable::parse(b"\n").errors().is_empty());
    }

    /// Found by the `mountinfo` fuzz target: an escaped NUL (`\000`) in a
    /// path field passed the raw-line NUL check and made a path holding a
    /// NUL. It is refused like a raw one, in every unescaped field.
    #[test]
    fn an_escaped_nul_is_refused_like_a_raw_one() {
        for line in [
            &br"1 0 0:1 / /a\000b rw - tmpfs t rw"[..],
            br"1 0 0:1 /\000 /a rw - tmpfs t rw",
            br"1 0 0:1 / /a rw - tmp\000fs t rw",
            br"1 0 0:1 / /a rw - tmpfs t\000 rw",
        ] {
            assert_eq!(error_of(line), LineErrorKind::NulByte, "{line:?}");
        }
    }

    /// procfs splits on single spaces and leaves escapes in place, so compare
    /// our fields after escaping them the kernel's way.
    #[test]
    fn agrees_with_procfs_on_this_machine() {
        let ours = MountTable::read_self().unwrap();
        let theirs = procfs::process::Process::myself()
            .unwrap()
            .mountinfo()
            .unwrap();
        assert!(ours.errors().is_empty(), "{:?}", ours.errors());
        assert_eq!(
            ours.len(),
            theirs.0.len(),
            "mount table changed between reads?"
        );
        for (o, t) in ours.entries().iter().zip(theirs.iter()) {
            assert_eq!(o.mount_id, u32::try_from(t.mnt_id).unwrap());
            assert_eq!(o.parent_id, u32::try_from(t.pid).unwrap());
            assert_eq!(o.dev.to_string(), t.majmin);
            assert_eq!(o.fs_type, t.fs_type);
            let esc_root = escape(o.root.as_os_str().as_bytes());
            assert_eq!(esc_root, t.root.as_bytes());
            let esc_mp = escape(o.mount_point.as_os_str().as_bytes());
            assert_eq!(esc_mp, t.mount_point.as_os_str().as_bytes());
            for opt in &o.mount_options {
                let name = opt.split('=').next().unwrap_or(opt);
                assert!(t.mount_options.contains_key(name), "{opt}");
            }
            assert_eq!(o.is_read_only(), t.mount_options.contains_key("ro"));
            let tp = |f: fn(&procfs::process::MountOptFields) -> Option<u32>| {
                t.opt_fields.iter().find_map(f)
            };
            use procfs::process::MountOptFields as F;
            assert_eq!(
                o.propagation.shared,
                tp(|f| match f {
                    F::Shared(n) => Some(*n),
                    _ => None,
                })
            );
            assert_eq!(
                o.propagation.master,
                tp(|f| match f {
                    F::Master(n) => Some(*n),
                    _ => None,
                })
            );
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut rng = XorShift::new(7);
        for _ in 0..2000 {
            let len = usize::try_from(rng.below(300)).unwrap();
            let mut bytes = rng.bytes(len);
            // make the interesting bytes common
            for b in bytes.iter_mut() {
                match rng.below(6) {
                    0 => *b = b' ',
                    1 => *b = b'\\',
                    2 => *b = b"-:,\"\n0"[usize::try_from(rng.below(6)).unwrap()],
                    _ => {}
                }
            }
            let t = MountTable::parse(&bytes);
            for m in t.entries() {
                let _ = m.identity();
                let _ = t.top_at(&m.mount_point);
            }
        }
    }

    #[test]
    fn mutated_real_lines_never_panic() {
        let mut base = std::fs::read("/proc/self/mountinfo").unwrap();
        base.extend(kubelet_table(200, 3));
        let mut rng = XorShift::new(11);
        for _ in 0..500 {
            let mut bytes = base.clone();
            for _ in 0..1 + rng.below(20) {
                let i = usize::try_from(rng.below(bytes.len() as u64)).unwrap();
                match rng.below(4) {
                    0 => bytes[i] = rng.byte(),
                    1 => {
                        bytes.remove(i);
                    }
                    2 => bytes.insert(i, b"\\ -:\",\n"[usize::try_from(rng.below(7)).unwrap()]),
                    _ => bytes.truncate(i),
                }
                if bytes.is_empty() {
                    break;
                }
            }
            let t = MountTable::parse(&bytes);
            assert!(t.len() + t.errors().len() > 0 || bytes.is_empty() || bytes == b"\n");
            let _ = t.under(Path::new("/var/lib/kubelet")).count();
        }
    }

    #[test]
    fn escape_round_trips_random_paths() {
        let mut rng = XorShift::new(42);
        for _ in 0..2000 {
            let len = 1 + usize::try_from(rng.below(40)).unwrap();
            let mut path = vec![b'/'];
            path.extend(rng.bytes(len).into_iter().map(|b| match b {
                0 => b'\\',
                1..=8 => b' ',
                9..=16 => b'\n',
                b => b,
            }));
            let esc = escape(&path);
            assert!(!esc.iter().any(|b| matches!(b, b' ' | b'\t' | b'\n')));
            let mut line = b"1 0 0:1 ".to_vec();
            line.extend(&esc);
            line.push(b' ');
            line.extend(&esc);
            line.extend(b" rw - tmpfs ");
            line.extend(&esc);
            line.extend(b" rw\n");
            let m = one_bytes(&line);
            assert_eq!(m.mount_point.as_os_str().as_bytes(), &path[..]);
            assert_eq!(m.root.as_os_str().as_bytes(), &path[..]);
            assert_eq!(m.source.as_bytes(), &path[..]);
        }
    }

    fn one_bytes(line: &[u8]) -> MountInfo {
        let t = MountTable::parse(line);
        assert!(t.errors().is_empty(), "{:?}", t.errors());
        t.entries()[0].clone()
    }

    #[test]
    fn parses_a_generated_10k_line_table() {
        let bytes = kubelet_table(10_000, 1);
        let t = MountTable::parse(&bytes);
        assert!(t.errors().is_empty(), "{:?}", &t.errors()[..1]);
        assert_eq!(t.len(), 10_000);
        let m = t.by_id(5000 + 100).unwrap();
        assert_eq!(m.mount_id, 5100);
        let sample = t.entries()[9_995].clone();
        assert_eq!(sample.mount_id, 10_095);
        assert_eq!(t.top_at(&sample.mount_point), Some(&sample));
        assert!(sample.identity().selinux.is_some());
        assert_eq!(t.under(Path::new("/var/lib/kubelet/plugins")).count(), 3331);
    }
}
