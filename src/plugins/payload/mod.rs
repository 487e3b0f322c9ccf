//! `kubernetes.io/configmap`, `kubernetes.io/secret`,
//! `kubernetes.io/downward-api` and `kubernetes.io/projected`: volumes
//! whose content volumed writes (a payload) rather than mounts.
//!
//! `build` turns a spec and the objects it names into files; `atomic`
//! writes them so a reader never sees a mix of two payloads.

pub(crate) mod atomic;
pub(crate) mod build;

pub use build::{KubeObject, ObjectStore, ObjectStores, Payload, PayloadError, PayloadFile};

use std::sync::Arc;
use std::time::SystemTime;

use crate::host::sys::Sys;
use crate::journal::Permit;
use crate::model::{
    Layout, Operation, PayloadKind, PluginName, StorageMedium, TargetParams, VolumeSpec,
};
use crate::plugins::{
    Action, EmptyDirPlugin, Op, Outcome, PluginError, PluginResult, VolumePlugin,
};

/// One of the four payload volume types. Its target is the kubelet's
/// wrapped emptyDir (a tmpfs for all but a configMap, with the emptyDir
/// `ready` marker), set up and torn down by [`EmptyDirPlugin`]; SetUp
/// then writes the payload (`atomic`). TearDown needs only the journal's
/// parameters: the target kind says tmpfs or dir.
#[derive(Debug)]
pub struct PayloadPlugin {
    kind: PayloadKind,
    layout: Layout,
    objects: Arc<dyn ObjectStore>,
    wrapped: EmptyDirPlugin,
}

impl PayloadPlugin {
    /// A plugin of `kind` reading objects from `objects`.
    pub fn new(kind: PayloadKind, layout: &Layout, objects: Arc<dyn ObjectStore>) -> Self {
        Self {
            kind,
            layout: layout.clone(),
            objects,
            wrapped: EmptyDirPlugin::new(layout.clone()),
        }
    }

    /// The four, sharing `objects`.
    pub fn all(layout: &Layout, objects: &Arc<dyn ObjectStore>) -> Vec<Box<dyn VolumePlugin>> {
        [
            PayloadKind::ConfigMap,
            PayloadKind::Secret,
            PayloadKind::DownwardApi,
            PayloadKind::Projected,
        ]
        .into_iter()
        .map(|k| Box::new(Self::new(k, layout, objects.clone())) as Box<dyn VolumePlugin>)
        .collect()
    }
}

impl VolumePlugin for PayloadPlugin {
    fn name(&self) -> PluginName {
        self.kind.plugin()
    }

    fn setup(
        &self,
        permit: &Permit,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::SetUp, params);
        let p = match spec {
            VolumeSpec::Payload(p) if p.kind == self.kind => p,
            _ => return Err(op.bad_spec(self.name(), "not a volume of this type")),
        };
        let payload = build::build(p, &*self.objects).map_err(|source| PluginError::Payload {
            op: Operation::SetUp,
            volume: params.volume.clone(),
            cause: source,
        })?;
        // the journal's intent names the payload it was for; write no other
        let journaled = params.payload().or(p.version.as_ref());
        if journaled.is_some_and(|v| v.hash != payload.version.hash) {
            return Err(PluginError::PayloadChanged {
                op: Operation::SetUp,
                volume: params.volume.clone(),
            });
        }
        let medium = match self.kind.in_memory() {
            true => StorageMedium::Memory,
            false => StorageMedium::Disk,
        };
        let wrapped = VolumeSpec::EmptyDir {
            medium,
            size_limit: None,
        };
        let (base, vol) = self.wrapped.set_up(permit, &wrapped, params, sys)?;
        op.changed = base.action != Action::AlreadyInPlace;
        let dir = params
            .pod_mount_path
            .as_deref()
            .ok_or_else(|| op.missing("pod mount path"))?;
        let t = atomic::Target {
            root: self.layout.root(),
            dir,
            fs_group: p.fs_group,
            fresh: vol.fresh,
            vol: vol.handle.as_ref(),
        };
        if op.changed && p.fs_group.is_some() {
            // the volume root too, as the kubelet's ownership walk does
            atomic::group(&mut op, &t, dir, Some(0o777 | atomic::GROUP_DIR_BITS))?;
        }
        let wrote = atomic::write(&mut op, &t, &payload, SystemTime::now())?;
        let action = match (base.action, wrote) {
            (Action::AlreadyInPlace, a) => a,
            (a, _) => a,
        };
        Ok(Outcome::seen(action, base.seen))
    }

    fn teardown(&self, permit: &Permit, params: &TargetParams, sys: &dyn Sys) -> PluginResult {
        self.wrapped.teardown(permit, params, sys)
    }
}
