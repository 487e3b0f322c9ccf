//! One container as the runtime API needs it: its `volumeMounts` and
//! `volumeDevices`, the env
//! a `subPathExpr` expands from, and whether it is privileged; and the pure
//! rules the kubelet applies to them before it starts the container
//! (`makeMounts`): the `$(VAR)` expansion, the subPath checks, the mount
//! propagation.

use serde::{Deserialize, Serialize};

/// Where a volumeMount's subpath comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubPath {
    /// the whole volume
    None,
    /// `subPath`, as written
    Path(String),
    /// `subPathExpr`, expanded from the container's env when asked
    Expr(String),
}

/// One `volumeMounts[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMountSpec {
    /// `name`: the pod volume it mounts
    pub name: String,
    /// `mountPath`
    pub mount_path: String,
    /// `readOnly`
    pub read_only: bool,
    /// `subPath` / `subPathExpr`
    pub sub_path: SubPath,
    /// `mountPropagation` as written (`None` when unset)
    pub propagation: Option<String>,
}

/// One `volumeDevices[]` entry: a raw block volume mapped into the
/// container as a device file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDeviceSpec {
    /// `name`: the pod volume it maps (a claim in `Block` mode)
    pub name: String,
    /// `devicePath`: the device file's path in the container
    pub device_path: String,
}

/// One `env[]` entry, its value resolved when volumed can (a literal value
/// or a `fieldRef` to the pod's name, namespace, UID, node or service
/// account); `None` for one it cannot (a `configMapKeyRef`, a
/// `secretKeyRef`, a `resourceFieldRef`, a status field).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    /// `name`
    pub name: String,
    /// the value, when known
    pub value: Option<String>,
}

/// One container (init, regular or ephemeral) of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// `name`
    pub name: String,
    /// `securityContext.privileged`
    pub privileged: bool,
    /// `volumeMounts`, in spec order (the index names the subpath dir)
    pub mounts: Vec<VolumeMountSpec>,
    /// `volumeDevices`, in spec order
    #[serde(default)]
    pub devices: Vec<VolumeDeviceSpec>,
    /// `env`, resolved in order; kept only when some mount has a
    /// `subPathExpr` (nothing else reads it)
    pub env: Vec<EnvVar>,
}

/// How a pod's containers use one volume: as a filesystem
/// (`volumeMounts`), as a raw device (`volumeDevices`), or both (an error).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeUse {
    /// some container lists it in `volumeMounts`
    pub mounted: bool,
    /// some container lists it in `volumeDevices`
    pub mapped: bool,
}

impl VolumeUse {
    /// How `containers` use the pod volume `name`.
    pub fn of(containers: &[ContainerSpec], name: &str) -> VolumeUse {
        VolumeUse {
            mounted: containers
                .iter()
                .any(|c| c.mounts.iter().any(|m| m.name == name)),
            mapped: containers
                .iter()
                .any(|c| c.devices.iter().any(|d| d.name == name)),
        }
    }

    /// The kubelet's check of a volume's mode against its use (the DSW
    /// populator's `createVolumeSpec`): a `Block` volume must not be in
    /// `volumeMounts`, a `Filesystem` one not in `volumeDevices`. Its
    /// message, the kubelet's words.
    pub fn check(self, volume: &str, mode: super::VolumeMode) -> Result<(), String> {
        use super::VolumeMode;
        let field = match mode {
            VolumeMode::Block if self.mounted => "volumeMounts",
            VolumeMode::Filesystem if self.mapped => "volumeDevices",
            _ => return Ok(()),
        };
        Err(format!(
            "volume {volume} has volumeMode {}, but is specified in {field}",
            mode.as_str()
        ))
    }
}

/// The pod-wide checks of `volumeDevices` the API server's validation
/// makes (the kubelet validates static pods the same way), one message
/// each, naming the container and the entry: the name must be one of the
/// pod's volumes, and a container must not list one volume both as a
/// mount and as a device, nor two devices at one `devicePath`.
pub fn check_devices(
    containers: &[ContainerSpec],
    mut is_volume: impl FnMut(&str) -> bool,
) -> Vec<String> {
    let mut errors = Vec::new();
    for c in containers {
        let mut seen_paths = std::collections::BTreeSet::new();
        for (i, d) in c.devices.iter().enumerate() {
            let at = format!("container {:?}: volumeDevices[{i}]", c.name);
            if !is_volume(&d.name) {
                errors.push(format!(
                    "{at}: name {:?} is not a volume of the pod",
                    d.name
                ));
            } else if c.mounts.iter().any(|m| m.name == d.name) {
                errors.push(format!(
                    "{at}: volume {:?} is also in the container's volumeMounts",
                    d.name
                ));
            }
            if !seen_paths.insert(d.device_path.as_str()) {
                errors.push(format!(
                    "{at}: devicePath {:?} is used by another device",
                    d.device_path
                ));
            }
        }
    }
    errors
}

/// CRI's mount propagation, as the answer spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Propagation {
    /// `None` or unset: `private`
    #[serde(rename = "private")]
    Private,
    /// `HostToContainer`: `rslave`
    #[serde(rename = "rslave")]
    HostToContainer,
    /// `Bidirectional`: `rshared`
    #[serde(rename = "rshared")]
    Bidirectional,
}

/// The CRI propagation of `mountPropagation` as the kubelet translates it
/// (unset and `None` are private). `Bidirectional` is refused for a
/// container that is not privileged, as the API server's validation
/// refuses it (the kubelet validates static pods the same way).
pub fn propagation(raw: Option<&str>, privileged: bool) -> Result<Propagation, String> {
    match raw {
        None | Some("None") => Ok(Propagation::Private),
        Some("HostToContainer") => Ok(Propagation::HostToContainer),
        Some("Bidirectional") if privileged => Ok(Propagation::Bidirectional),
        Some("Bidirectional") => Err(
            "mountPropagation Bidirectional is allowed only in a privileged container".to_owned(),
        ),
        Some(other) => Err(format!("invalid mountPropagation {other:?}")),
    }
}

/// Expands `$(NAME)` references in `input` with `lookup`, with the
/// kubelet's syntax: `$$` is a literal `$`, a `$(` without its `)` and a
/// `$` before anything else stay as written. `lookup` decides what an
/// unknown name becomes.
pub fn expand(input: &str, mut lookup: impl FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if after.is_empty() {
            // a trailing `$` stays
            out.push('$');
            rest = after;
            break;
        }
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(close) => {
                    out.push_str(&lookup(&inner[..close]));
                    rest = &inner[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The env values in order, each `$(NAME)` in a literal value expanded
/// from the variables before it; an unknown name stays literal, as the
/// kubelet expands env values. `(name, literal value or None)` in; a value
/// volumed cannot know stays `None`.
pub fn resolve_env(vars: Vec<(String, Option<String>)>) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = Vec::with_capacity(vars.len());
    for (name, value) in vars {
        let value = value.map(|v| {
            expand(&v, |key| {
                // the last definition before this one wins, as in a map
                match out.iter().rev().find(|e| e.name == key) {
                    Some(EnvVar { value: Some(v), .. }) => v.clone(),
                    _ => format!("$({key})"),
                }
            })
        });
        out.push(EnvVar { name, value });
    }
    out
}

/// A `subPathExpr` expanded from `env` as the kubelet does for a
/// volumeMount: every referenced variable must have a non-empty value,
/// else the error lists the missing ones (sorted) and nothing is mounted.
pub fn expand_sub_path_expr(expr: &str, env: &[EnvVar]) -> Result<String, String> {
    let mut missing = std::collections::BTreeSet::new();
    let out = expand(expr, |key| match env.iter().rev().find(|e| e.name == key) {
        Some(EnvVar { value: Some(v), .. }) if !v.is_empty() => v.clone(),
        _ => {
            missing.insert(key.to_owned());
            String::new()
        }
    });
    if missing.is_empty() {
        Ok(out)
    } else {
        let names: Vec<String> = missing.into_iter().collect();
        Err(format!("missing value for {}", names.join(", ")))
    }
}

/// The kubelet's checks on a subpath before anything is made: not
/// absolute, no `..` component. (What it resolves to is checked where it
/// is opened: beneath the volume, following no symlink.)
pub fn check_sub_path(path: &str) -> Result<(), String> {
    if path.starts_with('/') {
        return Err(format!("subPath {path:?} must not be an absolute path"));
    }
    if path.split('/').any(|c| c == "..") {
        return Err(format!("subPath {path:?} must not contain '..'"));
    }
    if path.contains('\0') {
        return Err(format!("subPath {path:?} must not contain NUL"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, Option<&str>)]) -> Vec<EnvVar> {
        pairs
            .iter()
            .map(|(n, v)| EnvVar {
                name: (*n).to_owned(),
                value: v.map(str::to_owned),
            })
            .collect()
    }

    fn with_uses(name: &str, mounts: &[&str], devices: &[(&str, &str)]) -> ContainerSpec {
        ContainerSpec {
            name: name.into(),
            privileged: false,
            mounts: mounts
                .iter()
                .map(|m| VolumeMountSpec {
                    name: (*m).into(),
                    mount_path: format!("/mnt/{m}"),
                    read_only: false,
                    sub_path: SubPath::None,
                    propagation: None,
                })
                .collect(),
            devices: devices
                .iter()
                .map(|(n, p)| VolumeDeviceSpec {
                    name: (*n).into(),
                    device_path: (*p).into(),
                })
                .collect(),
            env: Vec::new(),
        }
    }

    #[test]
    fn a_volume_s_mode_must_match_its_use_with_the_kubelet_s_message() {
        use crate::model::VolumeMode::{Block, Filesystem};
        let containers = [
            with_uses("a", &["fs", "both"], &[("raw", "/dev/xvda")]),
            with_uses("b", &[], &[("both", "/dev/xvdb")]),
        ];
        let cases = [
            ("fs", Filesystem, Ok(())),
            (
                "fs",
                Block,
                Err("volume fs has volumeMode Block, but is specified in volumeMounts"),
            ),
            ("raw", Block, Ok(())),
            (
                "raw",
                Filesystem,
                Err("volume raw has volumeMode Filesystem, but is specified in volumeDevices"),
            ),
            (
                "both",
                Filesystem,
                Err("volume both has volumeMode Filesystem, but is specified in volumeDevices"),
            ),
            (
                "both",
                Block,
                Err("volume both has volumeMode Block, but is specified in volumeMounts"),
            ),
            ("unused", Filesystem, Ok(())),
            ("unused", Block, Ok(())),
        ];
        for (volume, mode, want) in cases {
            let got = VolumeUse::of(&containers, volume).check(volume, mode);
            assert_eq!(
                got.as_ref().map_err(String::as_str),
                want.as_ref().map_err(|e| *e),
                "{volume} {mode:?}"
            );
        }
    }

    #[test]
    fn volume_devices_name_pod_volumes_once_per_container_and_path() {
        let volumes = ["raw", "raw2", "fs"];
        let is_volume = |n: &str| volumes.contains(&n);
        let cases: [(ContainerSpec, &[&str]); 5] = [
            (
                with_uses("ok", &["fs"], &[("raw", "/dev/a"), ("raw2", "/dev/b")]),
                &[],
            ),
            (
                with_uses("app", &[], &[("nope", "/dev/a")]),
                &["container \"app\": volumeDevices[0]: name \"nope\" is not a volume of the pod"],
            ),
            (
                with_uses("app", &["raw"], &[("raw", "/dev/a")]),
                &[
                    "container \"app\": volumeDevices[0]: volume \"raw\" is also in the container's volumeMounts",
                ],
            ),
            (
                with_uses("app", &[], &[("raw", "/dev/a"), ("raw2", "/dev/a")]),
                &[
                    "container \"app\": volumeDevices[1]: devicePath \"/dev/a\" is used by another device",
                ],
            ),
            // another container may map the same volume at the same path
            (with_uses("c2", &[], &[("raw", "/dev/a")]), &[]),
        ];
        for (c, want) in cases {
            let name = c.name.clone();
            assert_eq!(check_devices(&[c], is_volume), want, "{name}");
        }
    }

    #[test]
    fn expand_follows_the_kubelet_syntax() {
        let lookup = |k: &str| match k {
            "A" => "x".to_owned(),
            other => format!("<{other}>"),
        };
        let cases = [
            ("", ""),
            ("plain", "plain"),
            ("$(A)", "x"),
            ("a/$(A)/b", "a/x/b"),
            ("$$(A)", "$(A)"),
            ("$$", "$"),
            ("$", "$"),
            ("a$", "a$"),
            ("$(A", "$(A"),
            ("$A", "$A"),
            ("$()", "<>"),
            ("$(A)$(B)", "x<B>"),
            ("$$$(A)", "$x"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, lookup), want, "{input:?}");
        }
    }

    #[test]
    fn env_values_expand_from_earlier_variables_and_unknown_ones_stay_literal() {
        let got = resolve_env(vec![
            ("A".into(), Some("a".into())),
            ("B".into(), Some("$(A)-$(C)".into())),
            ("C".into(), Some("c".into())),
            ("D".into(), None),
            ("E".into(), Some("$(D)$(B)".into())),
        ]);
        let values: Vec<Option<&str>> = got.iter().map(|e| e.value.as_deref()).collect();
        assert_eq!(
            values,
            [
                Some("a"),
                Some("a-$(C)"),
                Some("c"),
                None,
                Some("$(D)a-$(C)")
            ]
        );
    }

    #[test]
    fn a_sub_path_expr_needs_every_variable_it_names() {
        let e = env(&[
            ("POD", Some("web-0")),
            ("EMPTY", Some("")),
            ("SECRET", None),
            ("POD", Some("web-1")),
        ]);
        let cases: [(&str, Result<&str, &str>); 6] = [
            ("logs/$(POD)", Ok("logs/web-1")),
            ("plain", Ok("plain")),
            ("$$(POD)", Ok("$(POD)")),
            ("$(NOPE)/x", Err("missing value for NOPE")),
            ("$(EMPTY)", Err("missing value for EMPTY")),
            (
                "$(SECRET)$(NOPE)$(POD)",
                Err("missing value for NOPE, SECRET"),
            ),
        ];
        for (expr, want) in cases {
            let got = expand_sub_path_expr(expr, &e);
            assert_eq!(got.as_deref().map_err(String::as_str), want, "{expr:?}");
        }
    }

    #[test]
    fn a_sub_path_is_relative_without_backsteps() {
        let ok = ["a", "a/b", "a/b/", "./a", "a..b", "..a", "a/...", ""];
        for p in ok {
            assert_eq!(check_sub_path(p), Ok(()), "{p:?}");
        }
        let bad = [
            ("/etc", "must not be an absolute path"),
            ("..", "must not contain '..'"),
            ("a/../b", "must not contain '..'"),
            ("a/..", "must not contain '..'"),
            ("a\0b", "must not contain NUL"),
        ];
        for (p, why) in bad {
            let e = check_sub_path(p).unwrap_err();
            assert!(
                e.contains(why) && e.contains(&format!("{p:?}")),
                "{p:?}: {e}"
            );
        }
    }

    #[test]
    fn propagation_is_the_kubelet_s_and_bidirectional_needs_privilege() {
        use Propagation::*;
        let cases: [(Option<&str>, bool, Result<Propagation, &str>); 7] = [
            (None, false, Ok(Private)),
            (Some("None"), false, Ok(Private)),
            (Some("HostToContainer"), false, Ok(HostToContainer)),
            (Some("Bidirectional"), true, Ok(Bidirectional)),
            (Some("Bidirectional"), false, Err("privileged")),
            (
                Some("Shared"),
                true,
                Err("invalid mountPropagation \"Shared\""),
            ),
            (Some(""), true, Err("invalid mountPropagation")),
        ];
        for (raw, privileged, want) in cases {
            let got = propagation(raw, privileged);
            match want {
                Ok(p) => assert_eq!(got, Ok(p), "{raw:?}"),
                Err(part) => assert!(got.unwrap_err().contains(part), "{raw:?}"),
            }
        }
        let json: Vec<String> = [Private, HostToContainer, Bidirectional]
            .iter()
            .map(|p| serde_json::to_string(p).unwrap())
            .collect();
        assert_eq!(json, ["\"private\"", "\"rslave\"", "\"rshared\""]);
    }
}
