//! Does this host do SELinux, and what are its default container file
//! label parts?
//!
//! Support is detected as util-linux's `/bin/mount` (libselinux's
//! `is_selinux_enabled`) does: `/sys/fs/selinux` is a `selinuxfs` mount and
//! `/etc/selinux/config` exists. On a host without it, libmount silently
//! drops `context=` options while a raw `mount(2)` fails with EINVAL; volumed then computes no labels at
//! all, so none can reach the kernel. `--selinux` overrides the detection:
//! `disabled` always, `enabled` only where the host can (otherwise startup
//! fails rather than every labelled mount).
//!
//! The decisions are pure ([`decide`], [`parse_config_type`],
//! [`parse_container_contexts`]); [`HostFacts::read`] and
//! [`FileDefaults::read`] are the I/O edge.

use std::path::{Path, PathBuf};

use crate::host::mountinfo::MountTable;

/// Where SELinux-enabled hosts mount selinuxfs.
pub const SELINUXFS: &str = "/sys/fs/selinux";
/// The SELinux configuration directory.
pub const ETC_SELINUX: &str = "/etc/selinux";

/// `--selinux`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeLinuxMode {
    /// detect, as `/bin/mount` does
    Auto,
    /// require it (a startup error where the host cannot)
    Enabled,
    /// never mount with a context
    Disabled,
}

/// A mode the host cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeLinuxHostError {
    /// `--selinux enabled` on a host without SELinux.
    #[error(
        "--selinux enabled: this host does not support SELinux mounts ({why}); use --selinux auto or disabled"
    )]
    NotSupported {
        /// what is missing
        why: String,
    },
}

/// What the host shows of SELinux.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// `/sys/fs/selinux` is mounted with fs type `selinuxfs`
    pub selinuxfs_mounted: bool,
    /// `/etc/selinux/config` exists
    pub config_exists: bool,
}

/// `SELINUX_MAGIC`, selinuxfs's `f_type`.
const SELINUX_MAGIC: i64 = 0xf97c_ff8c;

impl HostFacts {
    /// Reads the facts of this host: one `statfs` of [`SELINUXFS`] (as
    /// libselinux checks it), not a read of the whole mount table, which
    /// startup reads once already for reconstruction.
    pub fn probe(etc_selinux: &Path) -> Self {
        let selinuxfs_mounted = nix::sys::statfs::statfs(SELINUXFS)
            .is_ok_and(|s| s.filesystem_type().0 == SELINUX_MAGIC);
        Self {
            selinuxfs_mounted,
            config_exists: etc_selinux.join("config").is_file(),
        }
    }

    /// Reads the facts from a mount table and an `/etc/selinux`-like dir.
    pub fn read(table: &MountTable, etc_selinux: &Path) -> Self {
        let selinuxfs_mounted = table
            .top_at(Path::new(SELINUXFS))
            .is_some_and(|m| m.fs_type == "selinuxfs");
        Self {
            selinuxfs_mounted,
            config_exists: etc_selinux.join("config").is_file(),
        }
    }

    /// Why the host does not support SELinux mounts, or `None` when it does.
    pub fn missing(&self) -> Option<String> {
        match (self.selinuxfs_mounted, self.config_exists) {
            (true, true) => None,
            (false, true) => Some(format!("{SELINUXFS} is not a selinuxfs mount")),
            (true, false) => Some(format!("{ETC_SELINUX}/config does not exist")),
            (false, false) => Some(format!(
                "{SELINUXFS} is not a selinuxfs mount and {ETC_SELINUX}/config does not exist"
            )),
        }
    }
}

/// Whether labels are computed and mounts get `-o context=`.
pub fn decide(mode: SeLinuxMode, facts: &HostFacts) -> Result<bool, SeLinuxHostError> {
    match (mode, facts.missing()) {
        (SeLinuxMode::Disabled, _) => Ok(false),
        (SeLinuxMode::Auto, missing) => Ok(missing.is_none()),
        (SeLinuxMode::Enabled, None) => Ok(true),
        (SeLinuxMode::Enabled, Some(why)) => Err(SeLinuxHostError::NotSupported { why }),
    }
}

/// The parts a container file label takes when a pod leaves them blank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDefaults {
    /// SELinux user
    pub user: String,
    /// role
    pub role: String,
    /// type
    pub type_: String,
    /// MLS/MCS level
    pub level: String,
    /// where they came from (a contexts file, or built in)
    pub source: String,
}

impl Default for FileDefaults {
    /// `system_u:object_r:container_file_t:s0`, what container-selinux ships.
    fn default() -> Self {
        Self {
            user: "system_u".into(),
            role: "object_r".into(),
            type_: "container_file_t".into(),
            level: "s0".into(),
            source: "built-in".into(),
        }
    }
}

impl FileDefaults {
    /// The defaults of the host's policy: the `file` entry of
    /// `<etc>/<SELINUXTYPE>/contexts/lxc_contexts` (where container-selinux
    /// and go-selinux keep them), else the built-in ones.
    pub fn read(etc_selinux: &Path) -> Self {
        let Some(file) = contexts_file(etc_selinux) else {
            return Self::default();
        };
        match std::fs::read_to_string(&file) {
            Ok(text) => parse_container_contexts(&text)
                .map(|mut d| {
                    d.source = file.display().to_string();
                    d
                })
                .unwrap_or_default(),
            Err(_) => Self::default(),
        }
    }
}

fn contexts_file(etc_selinux: &Path) -> Option<PathBuf> {
    let config = std::fs::read_to_string(etc_selinux.join("config")).ok()?;
    let policy = parse_config_type(&config)?;
    Some(
        etc_selinux
            .join(policy)
            .join("contexts")
            .join("lxc_contexts"),
    )
}

/// `SELINUXTYPE=` of `/etc/selinux/config`, when it is one plain name.
pub fn parse_config_type(config: &str) -> Option<String> {
    config.lines().find_map(|l| {
        let v = l
            .trim()
            .strip_prefix("SELINUXTYPE=")?
            .trim()
            .trim_matches('"');
        let plain = !v.is_empty()
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
        (plain && v != "." && v != "..").then(|| v.to_owned())
    })
}

/// The `file = "user:role:type:level"` entry of an `lxc_contexts` file.
pub fn parse_container_contexts(text: &str) -> Option<FileDefaults> {
    let value = text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "file").then(|| v.trim().trim_matches('"').to_owned())
    })?;
    let mut parts = value.splitn(4, ':');
    let (user, role, type_, level) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let d = FileDefaults {
        user: user.into(),
        role: role.into(),
        type_: type_.into(),
        level: level.into(),
        source: String::new(),
    };
    // only a label that parses as a context is taken
    crate::model::SeLinuxContext::parse(&value).ok().map(|_| d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(fs: bool, config: bool) -> HostFacts {
        HostFacts {
            selinuxfs_mounted: fs,
            config_exists: config,
        }
    }

    #[test]
    fn selinux_is_used_only_where_the_host_has_both_selinuxfs_and_a_config() {
        use SeLinuxMode::*;
        let rows = [
            (Auto, facts(true, true), Ok(true)),
            (Auto, facts(true, false), Ok(false)),
            (Auto, facts(false, true), Ok(false)),
            (Auto, facts(false, false), Ok(false)),
            (Disabled, facts(true, true), Ok(false)),
            (Disabled, facts(false, false), Ok(false)),
            (Enabled, facts(true, true), Ok(true)),
        ];
        for (mode, f, want) in rows {
            assert_eq!(decide(mode, &f), want, "{mode:?} {f:?}");
        }
        for f in [facts(true, false), facts(false, true), facts(false, false)] {
            let e = decide(Enabled, &f).unwrap_err().to_string();
            assert!(
                e.contains("--selinux enabled") && e.contains("does not"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_statfs_probe_agrees_with_the_mount_table_on_this_host() {
        let table = MountTable::read_self().unwrap();
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            HostFacts::probe(dir.path()),
            HostFacts::read(&table, dir.path()),
            "statfs and the mount table disagree about {SELINUXFS}"
        );
    }

    #[test]
    fn selinuxfs_is_found_in_the_mount_table_by_its_fs_type() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config"), "SELINUX=enforcing\n").unwrap();
        let on = MountTable::parse(
            b"20 1 0:5 / /sys rw - sysfs sysfs rw\n21 20 0:20 / /sys/fs/selinux rw - selinuxfs selinuxfs rw\n",
        );
        assert_eq!(HostFacts::read(&on, dir.path()), facts(true, true));
        let tmpfs_there = MountTable::parse(b"21 20 0:20 / /sys/fs/selinux rw - tmpfs tmpfs rw\n");
        assert_eq!(
            HostFacts::read(&tmpfs_there, dir.path()),
            facts(false, true)
        );
        let none = MountTable::parse(b"20 1 0:5 / /sys rw - sysfs sysfs rw\n");
        assert_eq!(
            HostFacts::read(&none, &dir.path().join("absent")),
            facts(false, false)
        );
    }

    #[test]
    fn defaults_come_from_the_policys_container_contexts_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(FileDefaults::read(dir.path()), FileDefaults::default());
        std::fs::write(
            dir.path().join("config"),
            "# comment\nSELINUX=permissive\nSELINUXTYPE=targeted\n",
        )
        .unwrap();
        assert_eq!(FileDefaults::read(dir.path()), FileDefaults::default());
        let contexts = dir.path().join("targeted/contexts");
        std::fs::create_dir_all(&contexts).unwrap();
        std::fs::write(
            contexts.join("lxc_contexts"),
            "process = \"system_u:system_r:container_t:s0\"\nfile = \"staff_u:object_r:svirt_sandbox_file_t:s0\"\n",
        )
        .unwrap();
        let d = FileDefaults::read(dir.path());
        assert_eq!(
            (
                d.user.as_str(),
                d.role.as_str(),
                d.type_.as_str(),
                d.level.as_str()
            ),
            ("staff_u", "object_r", "svirt_sandbox_file_t", "s0")
        );
        assert!(
            d.source.ends_with("targeted/contexts/lxc_contexts"),
            "{}",
            d.source
        );
        // a hostile policy name never leaves /etc/selinux
        assert_eq!(parse_config_type("SELINUXTYPE=../../tmp\n"), None);
        assert_eq!(parse_config_type("SELINUXTYPE=..\n"), None);
        // a broken file entry falls back to the built-in defaults
        assert_eq!(parse_container_contexts("file = \"not a label\"\n"), None);
    }
}
