//! One subPath bind as the journal and `dump` know it: which container's
//! volumeMount of which pod volume it serves, the volume it comes from,
//! and the subpath bound (`host::subpath` makes and removes it, at
//! `pods/<uid>/volume-subpaths/<name>/<container>/<index>`, the kubelet's
//! layout).

use serde::{Deserialize, Serialize};

use super::{ModelError, PodUid, UniqueVolumeName, check_component};

/// Which bind: one per (pod, pod volume, container, volumeMount index),
/// as its path names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SubpathKey {
    /// the pod
    pub pod: PodUid,
    /// the pod volume (`volumeMounts[index].name`)
    pub name: String,
    /// the container
    pub container: String,
    /// the mount's index in the container's `volumeMounts`
    pub index: u32,
}

impl SubpathKey {
    /// A key whose names are each one path component (they become one in
    /// the bind's path); the error names the field.
    pub fn new(pod: PodUid, name: &str, container: &str, index: u32) -> Result<Self, ModelError> {
        check_component("pod volume name", name)?;
        check_component("container name", container)?;
        Ok(Self {
            pod,
            name: name.to_owned(),
            container: container.to_owned(),
            index,
        })
    }
}

/// A bind and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubpathBind {
    /// which bind
    pub key: SubpathKey,
    /// the volume whose pod target it is bound from
    pub volume: UniqueVolumeName,
    /// the subpath, relative to the volume, as checked (empty for a bind
    /// found on the host that no record names, such as a kubelet's)
    pub sub_path: String,
}
