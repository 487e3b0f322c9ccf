//! Plain data shared by every module: unique volume names, pod UIDs, volume
//! specs, target kinds, mount identity, SELinux contexts and mount states.
//!
//! Nothing here does I/O. Names that end up in paths (pod UIDs, volume and PV
//! names, plugin names) are validated when they are constructed, so a hostile
//! manifest cannot smuggle `..` or `/` into a path built from them.
//!
//! *Invariant:* model types are not the journal's on-disk types; the journal
//! converts to and from them explicitly (`journal::record`).

mod container;
mod csi;
mod expand;
pub(crate) mod intern;
mod layout;
mod mount;
mod names;
mod ownership;
mod params;
mod payload;
mod shared;
mod spec;
mod subpath;
mod target;

pub use container::{
    ContainerSpec, EnvVar, Propagation, SubPath, VolumeDeviceSpec, VolumeMountSpec, VolumeUse,
    check_devices, check_sub_path, expand, expand_sub_path_expr, propagation, resolve_env,
};
pub use csi::{CsiLifecycle, CsiParams, CsiPodInfo, SecretRef};
pub use expand::{
    ClaimCondition, ClaimResize, ClaimSize, ClaimState, ClaimUpdate, ExpandCase, ExpandDecision,
    ExpandError, RESIZE_CONDITIONS, ResizeStatus, ResizeStep, check_answer,
    decide as decide_expansion,
};
pub use layout::{
    Area, KubeletPath, Layout, LayoutError, PAYLOAD_DATA_LINK, PAYLOAD_DATA_TMP,
    PAYLOAD_PRIVATE_PREFIX, PodName, READY_MARKER, VOL_DATA_FILE, sha256_hex,
};
pub use mount::{DevId, MountIdentity, SeLinuxContext, TMPFS};
pub use names::{
    ModelError, PluginName, PodUid, UniqueVolumeName, check_component, check_dns1123_label,
};
pub use ownership::{
    CsiFsGroupPolicy, EXEC_BITS, FsGroup, FsGroupChangePolicy, RO_BITS, RW_BITS, SETGID_BIT,
    owned_mode, ownership_applies, root_matches,
};
pub use params::{MountOptions, SharedParams, TargetParams};
pub use payload::{
    DEFAULT_PAYLOAD_MODE, DEFAULT_TOKEN_SECONDS, FieldItem, IssuedToken, KeyToPath,
    MAX_TOKEN_SECONDS, MIN_TOKEN_SECONDS, ObjectVersion, PayloadKind, PayloadSource, PayloadSpec,
    PayloadVersion, TOKEN_OBJECT_KIND, TokenRef,
};
pub use shared::{SharedPath, SharedStr};
pub use spec::{
    AccessMode, CsiSpec, HostPathType, PodVolume, StorageMedium, VolumeMode, VolumeSpec,
};
pub use subpath::{SubpathBind, SubpathKey};
pub use target::{MountState, Operation, Steps, TargetKind, TargetRef};
