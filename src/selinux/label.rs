//! Which label a pod's volume is mounted with (the kubelet's
//! `GetMountSELinuxLabel` and its conflict rules; docs/selinux.md), pure.
//!
//! [`volume_label`] is the whole decision for one (pod, volume): it returns
//! the effective label (what `-o context=` gets), the [`LabelCheck`] the DSW
//! compares between pods, and a [`Problem`] when the pod's own containers
//! disagree or a label cannot be built. The DSW then applies the
//! volume-level rule (a new pod whose label differs from the volume's).

use crate::model::{AccessMode, PluginName, SeLinuxContext, VolumeSpec};
use crate::state::LabelCheck;

use super::Policy;
use super::gates::FeatureGates;
use super::host::FileDefaults;

/// `seLinuxOptions` as written in a pod or container `securityContext`
/// (empty strings already read as unset).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SeLinuxOptions {
    /// `user`
    pub user: Option<String>,
    /// `role`
    pub role: Option<String>,
    /// `type`
    pub type_: Option<String>,
    /// `level`
    pub level: Option<String>,
}

impl From<k8s_openapi::api::core::v1::SELinuxOptions> for SeLinuxOptions {
    fn from(o: k8s_openapi::api::core::v1::SELinuxOptions) -> Self {
        let set = |s: Option<String>| s.filter(|s| !s.is_empty());
        Self {
            user: set(o.user),
            role: set(o.role),
            type_: set(o.type_),
            level: set(o.level),
        }
    }
}

impl std::fmt::Display for SeLinuxOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |o: &Option<String>| o.clone().unwrap_or_default();
        write!(
            f,
            "user:{:?} role:{:?} type:{:?} level:{:?}",
            s(&self.user),
            s(&self.role),
            s(&self.type_),
            s(&self.level)
        )
    }
}

/// Which list a container is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ContainerKind {
    /// `spec.initContainers`
    Init,
    /// `spec.containers`
    Regular,
    /// `spec.ephemeralContainers`
    Ephemeral,
}

/// One container's SELinux inputs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerSeLinux {
    /// the container's name
    pub name: String,
    /// which list it is in
    pub kind: ContainerKind,
    /// its own `securityContext.seLinuxOptions`, if set
    pub options: Option<SeLinuxOptions>,
    /// the pod volumes it mounts (`volumeMounts[].name`)
    pub volumes: Vec<String>,
}

/// The SELinux inputs of a pod.
// Serialize: the static source's parsed-manifest cache keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodSeLinux {
    /// `spec.securityContext.seLinuxOptions`
    pub pod: Option<SeLinuxOptions>,
    /// `spec.securityContext.seLinuxChangePolicy` (`MountOption` / `Recursive`)
    pub change_policy: Option<String>,
    /// every container that mounts a volume, in spec order
    pub containers: Vec<ContainerSeLinux>,
}

impl PodSeLinux {
    /// The effective options of each container that mounts `volume`: a
    /// container's own `seLinuxOptions` replace the pod's as a whole, as
    /// `DetermineEffectiveSecurityContext` does.
    pub fn options_for<'a>(
        &'a self,
        volume: &'a str,
    ) -> impl Iterator<Item = (&'a ContainerSeLinux, Option<&'a SeLinuxOptions>)> + 'a {
        self.containers
            .iter()
            .filter(move |c| c.volumes.iter().any(|v| v == volume))
            .map(|c| (c, c.options.as_ref().or(self.pod.as_ref())))
    }

    /// Whether the pod opted out of mount labels (`Recursive`).
    pub fn is_recursive(&self) -> bool {
        self.change_policy.as_deref() == Some("Recursive")
    }
}

/// The file label a container's options translate to, as go-selinux's
/// `InitLabels` builds the mount label: the options' `user` and `level`,
/// the defaults' role and type (a pod's `role` and `type` name its
/// *process*, not its files), blanks in `user` from the host's defaults.
///
/// `None` without a `level` (KEP-1710: the kubelet knows a pod's context only
/// when "at least `SELinuxOptions.Level` is set"). The kubelet gives no label
/// for unset options too; for options without a level it would allocate a
/// random MCS pair that the container runtime does not know, so the pod
/// could not read its own volume: volumed mounts such volumes without
/// `context=` instead.
pub fn file_label(
    options: Option<&SeLinuxOptions>,
    defaults: &FileDefaults,
) -> Result<Option<SeLinuxContext>, String> {
    let Some(o) = options else {
        return Ok(None);
    };
    let Some(level) = o.level.as_deref() else {
        return Ok(None);
    };
    let label = format!(
        "{}:{}:{}:{level}",
        o.user.as_deref().unwrap_or(&defaults.user),
        defaults.role,
        defaults.type_,
    );
    SeLinuxContext::parse(&label).map(Some).map_err(|_| {
        format!(
            "failed to construct SELinux label from context {o}: {label:?} is not a valid label"
        )
    })
}

/// Whether the plugin can mount this volume with `-o context` at all
/// (`pluginSupportsSELinuxContextMount`): CSI drivers whose CSIDriver says
/// `seLinuxMount: true`, and — beyond the kubelet, whose in-tree plugins all
/// say no — local PVs on a block device, a filesystem of their own that
/// KEP-1710 calls always safe. emptyDir, hostPath and directory local PVs
/// share a filesystem with the host: never.
pub fn plugin_supports_context_mount(spec: &VolumeSpec) -> bool {
    match spec {
        VolumeSpec::Local { is_block, .. } => *is_block,
        VolumeSpec::Csi(c) => c.selinux_mount,
        // (the kubelet relabels a payload's files rather than mount with a context)
        VolumeSpec::EmptyDir { .. } | VolumeSpec::HostPath { .. } | VolumeSpec::Payload(_) => false,
    }
}

/// `VolumeSupportsSELinuxMount`: whether a label conflict is an error and
/// the label is really used. Only PVs; every access mode with `SELinuxMount`,
/// otherwise exactly `[ReadWriteOncePod]`.
pub fn volume_supports_selinux_mount(gates: &FeatureGates, spec: &VolumeSpec) -> bool {
    if !gates.rwop || !is_pv(spec) {
        return false;
    }
    gates.mount || spec.access_modes() == [AccessMode::ReadWriteOncePod]
}

fn is_pv(spec: &VolumeSpec) -> bool {
    matches!(spec, VolumeSpec::Local { .. } | VolumeSpec::Csi(_))
}

/// The kubelet's `access_mode` metric label: the "highest" of the PV's
/// modes (`RWX` > `ROX` > `RWO` > `RWOP`), `inline` for non-PV volumes.
pub fn access_mode_label(spec: &VolumeSpec) -> &'static str {
    if !is_pv(spec) {
        return "inline";
    }
    let m = spec.access_modes();
    [
        (AccessMode::ReadWriteMany, "RWX"),
        (AccessMode::ReadOnlyMany, "ROX"),
        (AccessMode::ReadWriteOnce, "RWO"),
        (AccessMode::ReadWriteOncePod, "RWOP"),
    ]
    .into_iter()
    .find(|(mode, _)| m.contains(mode))
    .map_or("", |(_, label)| label)
}

/// The kubelet's `volume_plugin` metric label (CSI: `kubernetes.io/csi/<driver>`).
pub fn volume_plugin_label(spec: &VolumeSpec) -> String {
    match spec {
        VolumeSpec::Csi(c) => format!("{}/{}", PluginName::Csi.as_str(), c.driver),
        _ => spec.plugin().as_str().to_owned(),
    }
}

/// What went wrong computing one pod's label for one volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// A container's options do not make a label
    /// (`volume_manager_selinux_container_*`).
    Translation,
    /// The pod's containers want different labels
    /// (`volume_manager_selinux_pod_context_mismatch_*`).
    PodContextMismatch,
}

/// A label problem: an error refuses the pod's use of the volume, a
/// warning only reports it (the volume is then used without a label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// which rule
    pub kind: ProblemKind,
    /// error (the volume supports SELinux mounts) or warning
    pub fatal: bool,
    /// the message, naming the labels or options
    pub message: String,
}

/// The decision for one pod's use of one volume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeLabel {
    /// the label to mount with (`-o context=`), if any
    pub effective: Option<SeLinuxContext>,
    /// what the DSW compares with the volume's other pods
    pub check: LabelCheck,
    /// a problem to report; when fatal the pod must not get the volume
    pub problem: Option<Problem>,
}

/// One pod's label for one of its volumes (`outer_name` is the pod's volume
/// name, which its containers' `volumeMounts` use), as the kubelet's
/// `GetMountSELinuxLabel`:
///
/// 1. no gate or no SELinux on the host → no label;
/// 2. every container that mounts the volume gives one label; a label that
///    cannot be built, or two different ones, is a problem — fatal when
///    the volume supports SELinux mounts, else a warning and no label;
/// 3. a plugin that cannot mount with a context → no label, and no
///    comparison with the volume's other pods;
/// 4. `SELinuxChangePolicy` on and the pod `Recursive` → no label (but a
///    conflict with labelled pods is still checked);
/// 5. the label is the one compared between pods (`original`); it is used
///    for mounting only when the volume supports SELinux mounts.
pub fn volume_label(
    policy: &Policy,
    pod: &PodSeLinux,
    outer_name: &str,
    spec: &VolumeSpec,
) -> VolumeLabel {
    let Some(defaults) = policy.host.as_ref().filter(|_| policy.labels_volumes()) else {
        return VolumeLabel::default();
    };
    let supported = volume_supports_selinux_mount(&policy.gates, spec);
    let plugin = plugin_supports_context_mount(spec);
    // A problem's severity depends on the volume, not on the plugin; only
    // a plugin that can mount with a context takes part in the comparison
    // between pods.
    let none = VolumeLabel {
        check: LabelCheck {
            original: None,
            strict: supported && plugin,
        },
        ..VolumeLabel::default()
    };
    // `None` until a container that mounts the volume is seen; then that
    // container's label, itself `None` when its options set no level.
    let mut label: Option<Option<SeLinuxContext>> = None;
    for (container, options) in pod.options_for(outer_name) {
        let this = match file_label(options, defaults) {
            Ok(l) => l,
            Err(e) => {
                return with_problem(
                    none,
                    ProblemKind::Translation,
                    supported,
                    format!("volume {outer_name:?}, container {:?}: {e}", container.name),
                );
            }
        };
        match &label {
            None => label = Some(this),
            Some(first) if *first != this => {
                // as the kubelet: a container without a label and one with
                // a label are two labels ("" and L)
                let show = |l: &Option<SeLinuxContext>| {
                    l.as_ref().map_or("", SeLinuxContext::as_str).to_owned()
                };
                return with_problem(
                    none,
                    ProblemKind::PodContextMismatch,
                    supported,
                    format!(
                        "volume {outer_name:?}: multiple SELinux labels found: {},{}",
                        show(first),
                        show(&this)
                    ),
                );
            }
            Some(_) => {}
        }
    }
    let label = label.flatten();
    if !plugin {
        return VolumeLabel::default();
    }
    if policy.gates.change_policy && pod.is_recursive() {
        return none;
    }
    VolumeLabel {
        effective: label.clone().filter(|_| supported),
        check: LabelCheck {
            original: label,
            strict: supported,
        },
        problem: None,
    }
}

fn with_problem(
    mut v: VolumeLabel,
    kind: ProblemKind,
    fatal: bool,
    message: String,
) -> VolumeLabel {
    v.problem = Some(Problem {
        kind,
        fatal,
        message,
    });
    v
}
