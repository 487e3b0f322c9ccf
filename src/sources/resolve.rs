//! Resolving a parsed pod against one source's objects: its claims to
//! PVs, its CSI volumes to their driver's rules, its payload volumes to the
//! version their objects make now.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::DesiredPod;
use super::static_objects::StaticObjects;
use super::static_pods::{ParsedPod, ParsedVolume};
use crate::host::sys::{FileKind, Sys};
use crate::model::{
    CsiFsGroupPolicy, CsiPodInfo, FsGroup, PodVolume, VolumeSpec, VolumeUse, ownership_applies,
};

/// Resolves a parsed pod's claims and CSI volumes against one source's
/// objects: the static objects dir, or what the API server sent.
pub(crate) struct Resolver<'a> {
    /// the PVs, claims and CSIDrivers
    pub(crate) objects: &'a StaticObjects,
    /// the ConfigMaps, Secrets and tokens payload volumes read
    pub(crate) payload: &'a dyn crate::plugins::payload::ObjectStore,
    /// how a local PV's path is looked at
    pub(crate) sys: &'a dyn Sys,
    /// the node (a claim's PV must allow it)
    pub(crate) node_name: &'a str,
}

impl Resolver<'_> {
    /// A CSI volume as this pod publishes it: an inline volume takes its
    /// CSIDriver's `seLinuxMount`; the pod adds the `csi.storage.k8s.io/`
    /// keys when the CSIDriver has `podInfoOnMount` (as the kubelet's
    /// `getPodInfoAttrs`), and its fsGroup unless `fsGroupPolicy` is `None`.
    fn csi_for_pod(
        &self,
        p: &ParsedPod,
        mut spec: Arc<VolumeSpec>,
    ) -> (Arc<VolumeSpec>, Option<Arc<CsiPodInfo>>) {
        let VolumeSpec::Csi(c) = &*spec else {
            return (spec, None);
        };
        let driver = self.objects.csi_drivers.get(&c.driver);
        let ephemeral = c.ephemeral;
        let selinux_mount = ephemeral && driver.is_some_and(|d| d.se_linux_mount);
        // (a claim's spec got it when the claim was resolved)
        let republish = ephemeral && driver.is_some_and(|d| d.requires_republish);
        if (selinux_mount || republish)
            && let VolumeSpec::Csi(c) = Arc::make_mut(&mut spec)
        {
            c.selinux_mount |= selinux_mount;
            c.republish |= republish;
        }
        let mut info = CsiPodInfo::default();
        if driver.is_some_and(|d| d.pod_info_on_mount) {
            let key = |k: &str| format!("csi.storage.k8s.io/{k}");
            info.volume_context = [
                (key("pod.name"), p.name.clone()),
                (key("pod.namespace"), p.namespace.clone()),
                (key("pod.uid"), p.uid.as_str().to_owned()),
                (key("serviceAccount.name"), p.service_account.clone()),
                (key("ephemeral"), ephemeral.to_string()),
            ]
            .into();
        }
        if driver.is_none_or(|d| d.fs_group_policy != "None") {
            info.mount_group = p.fs_group.map(|g| g.to_string());
        }
        let info = (info != CsiPodInfo::default()).then(|| Arc::new(info));
        (spec, info)
    }

    /// The group the node gives `spec`'s files for pod `p`: the pod's
    /// fsGroup when the volume gets the walk (`ownership_applies`, with a
    /// CSI volume's driver policy), else none. A bad fsGroup or policy is
    /// an error only for a volume that would get it.
    fn fs_group_for(
        &self,
        p: &ParsedPod,
        spec: &VolumeSpec,
        pod_read_only: bool,
    ) -> Result<Option<FsGroup>, String> {
        if p.fs_group.is_none() {
            return Ok(None);
        }
        let policy = match spec {
            VolumeSpec::Csi(c) => self
                .objects
                .csi_drivers
                .get(&c.driver)
                .and_then(|d| CsiFsGroupPolicy::parse(&d.fs_group_policy)),
            _ => None,
        };
        if !ownership_applies(spec, pod_read_only || spec_read_only(spec), policy) {
            return Ok(None);
        }
        p.fs_group()
    }

    /// A payload volume's spec with the version of the payload its
    /// objects make now (the intent will record it); other specs as they
    /// are. A missing object or key, or a hostile path, is the volume's
    /// error.
    fn payload_version(
        &self,
        mut spec: Arc<VolumeSpec>,
    ) -> Result<Arc<VolumeSpec>, crate::plugins::payload::PayloadError> {
        if let VolumeSpec::Payload(p) = &*spec {
            let built = crate::plugins::payload::build::build(p, self.payload)?;
            if let VolumeSpec::Payload(p) = Arc::make_mut(&mut spec) {
                p.version = Some(Arc::new(built.version));
                p.immutable = built.immutable;
            }
        }
        Ok(spec)
    }

    /// The pod with its claims resolved (or their errors).
    pub(crate) fn resolve(&self, mut p: ParsedPod) -> DesiredPod {
        let mut errors = std::mem::take(&mut p.errors);
        let mut unresolved = std::mem::take(&mut p.failed_volumes);
        // exactly as many as the pod has: a pushed-to Vec reserves four
        let mut volumes = Vec::with_capacity(p.volumes.len());
        let mut claims = BTreeMap::new();
        // the kubelet's extra supplemental groups: a claim's PV group the
        // pod does not list already
        let mut supplemental = BTreeMap::new();
        for v in std::mem::take(&mut p.volumes) {
            let (outer, spec_name, spec, read_only) = match v {
                ParsedVolume::Inline { name, spec } => (name.clone(), name, Arc::new(spec), false),
                ParsedVolume::Claim {
                    name,
                    claim_name,
                    read_only,
                    ephemeral,
                } => {
                    let owner = (p.uid.as_str(), p.name.as_str());
                    let resolved = match ephemeral {
                        true => self.objects.check_owner(
                            &p.file,
                            &name,
                            &p.namespace,
                            &claim_name,
                            owner,
                        ),
                        false => Ok(()),
                    }
                    .and_then(|()| {
                        self.objects.resolve_claim(
                            &p.file,
                            &name,
                            &p.namespace,
                            &claim_name,
                            self.node_name,
                        )
                    });
                    match resolved {
                        Ok((pv, mut spec)) => {
                            mark_block_device(self.sys, &mut spec);
                            claims.insert(name.clone(), claim_name);
                            let gid = self.objects.pvs.get(&pv).and_then(|i| i.gid);
                            supplemental.insert(name.clone(), gid);
                            (name, pv, spec, read_only)
                        }
                        Err(e) => {
                            errors.push(e.to_string());
                            unresolved.insert(name);
                            continue;
                        }
                    }
                }
            };
            // the kubelet refuses a volume whose mode its containers' use
            // contradicts; the pod's other volumes go on
            if let Err(reason) =
                VolumeUse::of(&p.containers, &outer).check(&outer, spec.volume_mode())
            {
                let e = super::SourceError::InvalidContainer {
                    file: p.file.clone(),
                    pod: format!("{}/{}", p.namespace, p.name),
                    reason,
                };
                errors.push(e.to_string());
                unresolved.insert(outer);
                continue;
            }
            let spec = match self.payload_version(spec) {
                Ok(spec) => spec,
                Err(e) => {
                    errors.push(format!("volume {outer:?}: {e}"));
                    unresolved.insert(outer);
                    continue;
                }
            };
            if let VolumeSpec::Csi(c) = &*spec
                && let Err(e) = super::csi_objects::check_lifecycle(
                    &c.driver,
                    self.objects.csi_drivers.get(&c.driver),
                    c.ephemeral,
                )
            {
                errors.push(format!("volume {outer:?}: {e}"));
                unresolved.insert(outer);
                continue;
            }
            let fs_group = match self.fs_group_for(&p, &spec, read_only) {
                Ok(g) => g,
                Err(e) => {
                    errors.push(format!(
                        "pod {}/{}: volume {outer:?}: {e}",
                        p.namespace, p.name
                    ));
                    unresolved.insert(outer);
                    continue;
                }
            };
            let (spec, csi_pod) = self.csi_for_pod(&p, spec);
            let supplemental_gid = supplemental
                .get(&outer)
                .copied()
                .flatten()
                .filter(|g| !p.supplemental_groups.contains(&i64::from(*g)));
            volumes.push(PodVolume {
                volume: PodVolume::unique_name(&spec, &p.uid, &spec_name),
                spec_name,
                outer_name: outer,
                spec,
                selinux: None,
                csi_pod,
                read_only,
                fs_group,
                supplemental_gid,
            });
        }
        DesiredPod {
            uid: p.uid,
            namespace: p.namespace,
            name: p.name,
            file: p.file,
            volumes,
            unresolved,
            errors,
            selinux: p.selinux,
            claims,
            containers: p.containers,
        }
    }
}

/// Whether the volume is mounted read-only for every pod, as far as its
/// spec says: a CSI PV's `readOnly`, or a `ro` mount option.
fn spec_read_only(spec: &VolumeSpec) -> bool {
    match spec {
        VolumeSpec::Local { mount_options, .. } => mount_options.iter().any(|o| o == "ro"),
        VolumeSpec::Csi(c) => c.read_only || c.mount_options.iter().any(|o| o == "ro"),
        _ => false,
    }
}

/// Decides `is_block` of a local PV by `stat` (through symlinks, so
/// `/dev/disk/by-id/…` counts) when its claim is resolved: a block device
/// gets a device target (format, MountDevice, bind), anything else is bound
/// as a directory. Decided again whenever the pod's manifest or the objects
/// change; a device that appears later is seen on the next such change.
/// The spec stays the PV's own (shared) unless this changes it.
fn mark_block_device(sys: &dyn Sys, spec: &mut Arc<crate::model::VolumeSpec>) {
    use crate::model::VolumeSpec;
    if let VolumeSpec::Local { path, is_block, .. } = &**spec {
        let block = sys
            .stat(path, true)
            .is_ok_and(|st| st.kind == FileKind::BlockDevice);
        if block != *is_block
            && let VolumeSpec::Local { is_block, .. } = Arc::make_mut(spec)
        {
            *is_block = block;
        }
    }
}
