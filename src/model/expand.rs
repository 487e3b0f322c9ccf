//! Node-side volume expansion (NodeExpandVolume): whether a claim's volume
//! waits for this node to grow its filesystem, to what size, and how the
//! claim's status reads afterwards. Pure; the RPC is `csi::client`, the
//! claim's status patch `apiserver`.
//!
//! The kubelet's rules followed here (docs/kubelet.md, "Volume
//! expansion"): a node expansion is pending when the PV's
//! `spec.capacity.storage` is above the claim's `status.capacity.storage`;
//! a read-only volume is never expanded (a `FileSystemResizeFailed`
//! warning instead); with the resize controller's recovery fields in the
//! claim's status (`allocatedResources`, `allocatedResourceStatuses`) the
//! node expands only while `allocatedResourceStatuses["storage"]` is
//! `NodeResizePending` or `NodeResizeInProgress`; without them (an older
//! resizer) it expands whenever the sizes differ.

use serde::{Deserialize, Serialize};

/// The claim's `status.allocatedResourceStatuses["storage"]`: where a
/// resize stands.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResizeStatus {
    /// `ControllerResizeInProgress`
    ControllerResizeInProgress,
    /// `ControllerResizeInfeasible`
    ControllerResizeInfeasible,
    /// `NodeResizePending`: the controller is done, the node's turn
    NodeResizePending,
    /// `NodeResizeInProgress`: a node started (a restart finds this)
    NodeResizeInProgress,
    /// `NodeResizeInfeasible`: a node failed for good; never retried
    NodeResizeInfeasible,
    /// a value this build does not know: the node waits
    Other(String),
}

impl ResizeStatus {
    /// The API's spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Self::ControllerResizeInProgress => "ControllerResizeInProgress",
            Self::ControllerResizeInfeasible => "ControllerResizeInfeasible",
            Self::NodeResizePending => "NodeResizePending",
            Self::NodeResizeInProgress => "NodeResizeInProgress",
            Self::NodeResizeInfeasible => "NodeResizeInfeasible",
            Self::Other(s) => s,
        }
    }

    /// The status of the API's spelling.
    pub fn parse(s: &str) -> Self {
        match s {
            "ControllerResizeInProgress" => Self::ControllerResizeInProgress,
            "ControllerResizeInfeasible" => Self::ControllerResizeInfeasible,
            "NodeResizePending" => Self::NodeResizePending,
            "NodeResizeInProgress" => Self::NodeResizeInProgress,
            "NodeResizeInfeasible" => Self::NodeResizeInfeasible,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// What a claim's object says about its size, as the kubelet reads it
/// before a node expansion (bytes; a quantity rounded up to a byte).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimSize {
    /// `status.capacity.storage`: the size the claim reports
    pub status_capacity: Option<u64>,
    /// `status.allocatedResources` has `storage`: a resizer that keeps the
    /// recovery fields
    pub allocated: bool,
    /// `status.allocatedResourceStatuses["storage"]`
    pub resize_status: Option<ResizeStatus>,
}

/// One of a claim's `status.conditions`, kept as read so a status
/// update can write back the ones it does not own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimCondition {
    /// `type`
    pub kind: String,
    /// `status`
    pub status: String,
    /// `reason`
    pub reason: Option<String>,
    /// `message`
    pub message: Option<String>,
    /// `lastProbeTime`
    pub last_probe_time: Option<String>,
    /// `lastTransitionTime`
    pub last_transition_time: Option<String>,
}

/// The condition types a resize owns, which the kubelet removes once a
/// node expansion finished (`knownResizeConditions`).
pub const RESIZE_CONDITIONS: [&str; 4] = [
    "FileSystemResizePending",
    "Resizing",
    "ControllerResizeError",
    "NodeResizeError",
];

/// A bound claim's size as its PV and its object tell it, carried with
/// the PV's spec (a PV is bound to one claim) so a change of either
/// reaches the volume: what the expansion decision and the claim's status
/// update need.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimState {
    /// the claim's namespace
    pub namespace: String,
    /// the claim's name
    pub name: String,
    /// the claim's `metadata.resourceVersion`, sent with a status update
    /// so one made on a stale read is refused
    pub resource_version: Option<String>,
    /// the PV's `spec.capacity.storage`
    pub pv_capacity: Option<u64>,
    /// the same as the PV spells it (the claim's new capacity is written
    /// so)
    pub pv_capacity_text: Option<String>,
    /// the claim's sizes and resize status
    pub size: ClaimSize,
    /// the claim's `status.conditions`
    pub conditions: Vec<ClaimCondition>,
}

/// Where a node expansion of a claim stands, for its status to say so
/// (the API server's side writes it: `apiserver::claim_status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResizeStep {
    /// the call is about to be made
    Started,
    /// the volume was grown to this many bytes
    Finished(u64),
    /// the call failed for good with this error; `infeasible`: the
    /// driver says the size can never be reached
    Failed {
        /// the error
        error: String,
        /// no node may retry
        infeasible: bool,
    },
}

/// One claim status update a node expansion asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimResize {
    /// the claim as read when the expansion was decided
    pub claim: std::sync::Arc<ClaimState>,
    /// how its resizer writes the status
    pub update: ClaimUpdate,
    /// what happened
    pub step: ResizeStep,
}

/// One mounted (or being staged) claim's volume, as the expansion
/// decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandCase<'a> {
    /// the pod (for errors)
    pub pod: &'a str,
    /// the pod's volume name (for errors)
    pub volume: &'a str,
    /// the claim, `namespace/name` (for errors)
    pub claim: &'a str,
    /// the PV's name (for errors)
    pub pv: &'a str,
    /// the PV's `spec.capacity.storage`
    pub pv_capacity: Option<u64>,
    /// what the claim's object says
    pub size: &'a ClaimSize,
    /// the pod mounts the volume read-only (its claim's `readOnly`, the
    /// PV's `readOnly` or an `ro` mount option)
    pub read_only: bool,
    /// a raw block volume (`volumeMode: Block`)
    pub block: bool,
    /// the driver offers the node `EXPAND_VOLUME` capability
    pub driver_expands: bool,
}

/// How the claim's status is written once the filesystem grew.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClaimUpdate {
    /// an older resizer: the capacity set, the resize conditions removed
    Legacy,
    /// the recovery fields: `NodeResizeInProgress` before the call; the
    /// capacity set, `allocatedResourceStatuses["storage"]` and the resize
    /// conditions removed after it
    Recovery,
}

/// What the node does about one volume's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpandDecision {
    /// nothing: no expansion pending, or not this node's turn
    Nothing,
    /// pending, but the volume is read-only: a `FileSystemResizeFailed`
    /// warning ("requested read-only file system"), no call
    ReadOnly,
    /// pending, but the driver has no node `EXPAND_VOLUME`: nothing to call
    NotSupported,
    /// NodeExpandVolume to `to` bytes, the claim's status written as said
    Expand {
        /// `capacity_range.required_bytes`: the PV's capacity
        to: u64,
        /// the claim's `status.capacity.storage` before
        from: u64,
        /// a block volume: the request's capability is `block`
        block: bool,
        /// how the claim's status is written
        update: ClaimUpdate,
    },
}

/// A claim's size that cannot be acted on, or a driver's answer that
/// cannot be believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpandError {
    /// the PV is smaller than the claim already is: a volume is never
    /// shrunk
    #[error(
        "pod {pod}: volume {volume}: PersistentVolume {pv} spec.capacity.storage \
         ({pv_bytes} bytes) is below claim {claim} status.capacity.storage \
         ({claim_bytes} bytes): a volume is never shrunk"
    )]
    Shrink {
        /// the pod
        pod: String,
        /// the pod's volume name
        volume: String,
        /// the claim, `namespace/name`
        claim: String,
        /// the PV
        pv: String,
        /// the PV's capacity
        pv_bytes: u64,
        /// the claim's status capacity
        claim_bytes: u64,
    },
    /// the PV's `nodeExpandSecretRef` cannot be read: no call is made
    /// (retried later; the claim says why)
    #[error(
        "pod {pod}: volume {volume}: spec.csi.nodeExpandSecretRef names Secret \
         {namespace}/{name}, which cannot be read: {why}"
    )]
    Secret {
        /// the pod
        pod: String,
        /// the pod's volume name
        volume: String,
        /// the Secret's namespace
        namespace: String,
        /// the Secret's name
        name: String,
        /// why (never the Secret's data)
        why: String,
    },
    /// the driver says the volume is smaller than asked for
    #[error(
        "pod {pod}: volume {volume}: NodeExpandVolume answered capacity_bytes \
         {answered} below the required_bytes {required} it was asked for"
    )]
    ShortAnswer {
        /// the pod
        pod: String,
        /// the pod's volume name
        volume: String,
        /// `capacity_range.required_bytes`
        required: u64,
        /// the answer's `capacity_bytes`
        answered: u64,
    },
}

/// Whether `case`'s volume waits for a node expansion, and how.
pub fn decide(case: &ExpandCase<'_>) -> Result<ExpandDecision, ExpandError> {
    // a claim without a status capacity is not bound as far as this node
    // can tell: nothing to compare (the kubelet reads a missing one as 0)
    let (Some(pv_bytes), Some(claim_bytes)) = (case.pv_capacity, case.size.status_capacity) else {
        return Ok(ExpandDecision::Nothing);
    };
    if pv_bytes < claim_bytes {
        return Err(ExpandError::Shrink {
            pod: case.pod.to_owned(),
            volume: case.volume.to_owned(),
            claim: case.claim.to_owned(),
            pv: case.pv.to_owned(),
            pv_bytes,
            claim_bytes,
        });
    }
    if pv_bytes == claim_bytes {
        return Ok(ExpandDecision::Nothing);
    }
    if case.read_only {
        return Ok(ExpandDecision::ReadOnly);
    }
    let update = match (&case.size.resize_status, case.size.allocated) {
        // an older resizer (the kubelet's legacy path)
        (None, false) => ClaimUpdate::Legacy,
        (Some(ResizeStatus::NodeResizePending | ResizeStatus::NodeResizeInProgress), _) => {
            ClaimUpdate::Recovery
        }
        // the controller's turn, a node that failed for good, or a status
        // this build does not know: the node waits
        _ => return Ok(ExpandDecision::Nothing),
    };
    if !case.driver_expands {
        return Ok(ExpandDecision::NotSupported);
    }
    Ok(ExpandDecision::Expand {
        to: pv_bytes,
        from: claim_bytes,
        block: case.block,
        update,
    })
}

/// Checks a NodeExpandVolume answer: `capacity_bytes` 0 means the driver
/// did not say (the field is optional); any other value below the
/// request is refused.
pub fn check_answer(
    pod: &str,
    volume: &str,
    required: u64,
    answered: u64,
) -> Result<(), ExpandError> {
    if answered != 0 && answered < required {
        return Err(ExpandError::ShortAnswer {
            pod: pod.to_owned(),
            volume: volume.to_owned(),
            required,
            answered,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn size(status: Option<u64>, allocated: bool, rs: Option<ResizeStatus>) -> ClaimSize {
        ClaimSize {
            status_capacity: status,
            allocated,
            resize_status: rs,
        }
    }

    fn case<'a>(pv: Option<u64>, size: &'a ClaimSize) -> ExpandCase<'a> {
        ExpandCase {
            pod: "ns/web-0",
            volume: "data",
            claim: "ns/data-web-0",
            pv: "pv-1",
            pv_capacity: pv,
            size,
            read_only: false,
            block: false,
            driver_expands: true,
        }
    }

    #[test]
    fn a_node_expansion_is_pending_only_as_the_kubelet_reads_the_claim() {
        use ExpandDecision::*;
        use ResizeStatus::*;
        let expand = |update| Expand {
            to: 2 * GI,
            from: GI,
            block: false,
            update,
        };
        #[rustfmt::skip]
        let table: &[(&str, Option<u64>, ClaimSize, ExpandDecision)] = &[
            ("same size", Some(GI), size(Some(GI), true, None), Nothing),
            ("no PV capacity", None, size(Some(GI), false, None), Nothing),
            ("no claim capacity (unbound)", Some(2 * GI), size(None, false, None), Nothing),
            ("older resizer: legacy", Some(2 * GI), size(Some(GI), false, None), expand(ClaimUpdate::Legacy)),
            ("node's turn", Some(2 * GI), size(Some(GI), true, Some(NodeResizePending)), expand(ClaimUpdate::Recovery)),
            ("restart mid-resize", Some(2 * GI), size(Some(GI), true, Some(NodeResizeInProgress)), expand(ClaimUpdate::Recovery)),
            ("status set, no allocated", Some(2 * GI), size(Some(GI), false, Some(NodeResizePending)), expand(ClaimUpdate::Recovery)),
            ("recovery fields, no status", Some(2 * GI), size(Some(GI), true, None), Nothing),
            ("controller's turn", Some(2 * GI), size(Some(GI), true, Some(ControllerResizeInProgress)), Nothing),
            ("controller failed", Some(2 * GI), size(Some(GI), true, Some(ControllerResizeInfeasible)), Nothing),
            ("node failed for good", Some(2 * GI), size(Some(GI), true, Some(NodeResizeInfeasible)), Nothing),
            ("unknown status", Some(2 * GI), size(Some(GI), true, Some(Other("Later".into()))), Nothing),
        ];
        for (what, pv, size, want) in table {
            assert_eq!(decide(&case(*pv, size)), Ok(*want), "{what}");
        }
    }

    #[test]
    fn a_read_only_volume_is_never_expanded() {
        let s = size(Some(GI), true, Some(ResizeStatus::NodeResizePending));
        let c = ExpandCase {
            read_only: true,
            ..case(Some(2 * GI), &s)
        };
        assert_eq!(decide(&c), Ok(ExpandDecision::ReadOnly));
        // nor is one with nothing pending reported
        let same = size(Some(2 * GI), true, None);
        let c = ExpandCase {
            read_only: true,
            ..case(Some(2 * GI), &same)
        };
        assert_eq!(decide(&c), Ok(ExpandDecision::Nothing));
    }

    #[test]
    fn a_block_volume_is_expanded_with_the_block_flag() {
        let s = size(Some(GI), false, None);
        let c = ExpandCase {
            block: true,
            ..case(Some(3 * GI), &s)
        };
        assert_eq!(
            decide(&c),
            Ok(ExpandDecision::Expand {
                to: 3 * GI,
                from: GI,
                block: true,
                update: ClaimUpdate::Legacy
            })
        );
    }

    #[test]
    fn a_driver_without_expand_volume_is_not_called() {
        let s = size(Some(GI), false, None);
        let c = ExpandCase {
            driver_expands: false,
            ..case(Some(2 * GI), &s)
        };
        assert_eq!(decide(&c), Ok(ExpandDecision::NotSupported));
    }

    #[test]
    fn a_pv_smaller_than_the_claim_is_an_error_naming_pod_volume_and_fields() {
        let s = size(Some(2 * GI), false, None);
        let err = decide(&case(Some(GI), &s)).unwrap_err();
        let msg = err.to_string();
        for part in [
            "pod ns/web-0",
            "volume data",
            "PersistentVolume pv-1 spec.capacity.storage",
            "claim ns/data-web-0 status.capacity.storage",
            "never shrunk",
        ] {
            assert!(msg.contains(part), "{part:?} in {msg}");
        }
    }

    #[test]
    fn an_answer_below_the_request_is_refused_and_an_unset_one_accepted() {
        assert_eq!(check_answer("p", "v", 2 * GI, 0), Ok(()), "unset");
        assert_eq!(check_answer("p", "v", 2 * GI, 2 * GI), Ok(()));
        assert_eq!(check_answer("p", "v", 2 * GI, 3 * GI), Ok(()));
        let err = check_answer("ns/web-0", "data", 2 * GI, GI).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("pod ns/web-0: volume data")
                && msg.contains("capacity_bytes 1073741824")
                && msg.contains("required_bytes 2147483648"),
            "{msg}"
        );
    }

    #[test]
    fn a_missing_expand_secret_names_pod_volume_field_and_secret() {
        let err = ExpandError::Secret {
            pod: "ns/web-0".into(),
            volume: "data".into(),
            namespace: "ns".into(),
            name: "creds".into(),
            why: "not found".into(),
        };
        assert_eq!(
            err.to_string(),
            "pod ns/web-0: volume data: spec.csi.nodeExpandSecretRef names Secret ns/creds, \
             which cannot be read: not found"
        );
    }

    #[test]
    fn resize_statuses_round_trip_their_api_spelling() {
        for s in [
            "ControllerResizeInProgress",
            "ControllerResizeInfeasible",
            "NodeResizePending",
            "NodeResizeInProgress",
            "NodeResizeInfeasible",
            "SomethingNew",
        ] {
            assert_eq!(ResizeStatus::parse(s).as_str(), s);
        }
    }
}
