//! A pod's memory limit as the kubelet computes it for its cgroup
//! (`ResourceConfigForPod`), which also sizes a memory emptyDir without a
//! smaller `sizeLimit` (docs/kubelet.md, "emptyDir").
//!
//! - A pod-level `spec.resources.limits.memory` is the limit.
//! - Else only when **every** container and init container sets a memory
//!   limit: the regular containers' sum plus the restartable init
//!   containers' (sidecars, `restartPolicy: Always`), or, when larger, the
//!   largest a plain init container needs while it runs (its own limit plus
//!   the sidecars started before it); then the pod's `overhead.memory` is
//!   added. Ephemeral containers do not count.
//! - Otherwise the pod has no memory limit (`None`).
//!
//! Pure: a `PodSpec` in, bytes out; a malformed quantity is an error
//! naming the container and the field.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity::parse_bytes;

const MEMORY: &str = "memory";

/// The memory limit of one `resources` block, if it sets one.
fn limit_of(
    resources: Option<&ResourceRequirements>,
    field: impl Fn() -> String,
) -> Result<Option<u64>, String> {
    let q: Option<&Quantity> = resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l: &BTreeMap<String, Quantity>| l.get(MEMORY));
    q.map(|q| parse_bytes(&q.0).map_err(|e| format!("{}: {e}", field())))
        .transpose()
}

fn container_limit(c: &Container, kind: &str) -> Result<Option<u64>, String> {
    limit_of(c.resources.as_ref(), || {
        format!("{kind} {:?} resources.limits.memory", c.name)
    })
}

/// The pod's memory limit in bytes; `None` when it has none (see the
/// module doc). Sums saturate: a limit past `u64::MAX` is no cap anyway.
pub(crate) fn pod_memory_limit(spec: &PodSpec) -> Result<Option<u64>, String> {
    let overhead = limit_of_overhead(spec)?;
    let pod_level = limit_of(spec.resources.as_ref(), || {
        "spec.resources.limits.memory".to_owned()
    })?;
    if let Some(limit) = pod_level {
        return Ok(Some(limit.saturating_add(overhead)));
    }
    let mut regular: u64 = 0;
    for c in &spec.containers {
        let Some(l) = container_limit(c, "container")? else {
            return Ok(None);
        };
        regular = regular.saturating_add(l);
    }
    let (mut sidecars, mut init_peak) = (0u64, 0u64);
    for c in spec.init_containers.iter().flatten() {
        let Some(l) = container_limit(c, "init container")? else {
            return Ok(None);
        };
        let restartable = c.restart_policy.as_deref() == Some("Always");
        let while_running = if restartable {
            sidecars = sidecars.saturating_add(l);
            sidecars
        } else {
            l.saturating_add(sidecars)
        };
        init_peak = init_peak.max(while_running);
    }
    let limit = regular.saturating_add(sidecars).max(init_peak);
    Ok(Some(limit.saturating_add(overhead)))
}

/// `spec.overhead.memory` in bytes (0 when unset).
fn limit_of_overhead(spec: &PodSpec) -> Result<u64, String> {
    spec.overhead
        .as_ref()
        .and_then(|o| o.get(MEMORY))
        .map(|q| parse_bytes(&q.0).map_err(|e| format!("spec.overhead.memory: {e}")))
        .transpose()
        .map(Option::unwrap_or_default)
}

/// A memory emptyDir's size before the node's cap: the smallest of the
/// pod's memory limit and the volume's `sizeLimit`, each counted only when
/// above zero (the kubelet's `calculateEmptyDirMemorySize`; the node's
/// allocatable memory caps it in the plugin, where it is known).
pub(crate) fn memory_empty_dir_size(
    pod_limit: Option<u64>,
    size_limit: Option<u64>,
) -> Option<u64> {
    [pod_limit, size_limit]
        .into_iter()
        .flatten()
        .filter(|&n| n > 0)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str, memory: Option<&str>, always: bool) -> Container {
        let resources = memory.map(|m| ResourceRequirements {
            limits: Some([(MEMORY.to_owned(), Quantity(m.to_owned()))].into()),
            ..Default::default()
        });
        Container {
            name: name.to_owned(),
            resources,
            restart_policy: always.then(|| "Always".to_owned()),
            ..Default::default()
        }
    }

    const MI: u64 = 1 << 20;

    #[test]
    fn the_pod_limit_follows_the_kubelet_s_rules() {
        type Case = (
            &'static str,
            Vec<Container>,
            Vec<Container>,
            Option<&'static str>,
            Option<&'static str>,
            Option<u64>,
        );
        // (what, containers, init containers, pod-level, overhead) -> limit
        let cases: Vec<Case> = vec![
            (
                "no container limit",
                vec![container("a", None, false)],
                vec![],
                None,
                None,
                None,
            ),
            (
                "one container without a limit: none",
                vec![
                    container("a", Some("64Mi"), false),
                    container("b", None, false),
                ],
                vec![],
                None,
                None,
                None,
            ),
            (
                "regular containers are summed",
                vec![
                    container("a", Some("64Mi"), false),
                    container("b", Some("32Mi"), false),
                ],
                vec![],
                None,
                None,
                Some(96 * MI),
            ),
            (
                "an init container without a limit: none",
                vec![container("a", Some("64Mi"), false)],
                vec![container("i", None, false)],
                None,
                None,
                None,
            ),
            (
                "a larger plain init container wins",
                vec![container("a", Some("64Mi"), false)],
                vec![container("i", Some("256Mi"), false)],
                None,
                None,
                Some(256 * MI),
            ),
            (
                "a smaller plain init container does not count",
                vec![container("a", Some("64Mi"), false)],
                vec![container("i", Some("16Mi"), false)],
                None,
                None,
                Some(64 * MI),
            ),
            (
                "sidecars add to the containers and to later init containers",
                vec![container("a", Some("64Mi"), false)],
                vec![
                    container("s", Some("32Mi"), true),
                    container("i", Some("80Mi"), false),
                ],
                None,
                None,
                Some(112 * MI),
            ),
            (
                "overhead is added",
                vec![container("a", Some("64Mi"), false)],
                vec![],
                None,
                Some("8Mi"),
                Some(72 * MI),
            ),
            (
                "a pod-level limit wins, even with containers unlimited",
                vec![container("a", None, false)],
                vec![],
                Some("1Gi"),
                None,
                Some(1024 * MI),
            ),
        ];
        for (what, containers, init, pod_level, overhead, want) in cases {
            let spec = PodSpec {
                containers,
                init_containers: (!init.is_empty()).then_some(init),
                resources: pod_level.map(|m| ResourceRequirements {
                    limits: Some([(MEMORY.to_owned(), Quantity(m.to_owned()))].into()),
                    ..Default::default()
                }),
                overhead: overhead.map(|m| [(MEMORY.to_owned(), Quantity(m.to_owned()))].into()),
                ..Default::default()
            };
            assert_eq!(pod_memory_limit(&spec), Ok(want), "{what}");
        }
    }

    #[test]
    fn a_malformed_limit_names_the_container_and_field() {
        let spec = PodSpec {
            containers: vec![container("app", Some("lots"), false)],
            ..Default::default()
        };
        let e = pod_memory_limit(&spec).unwrap_err();
        assert!(
            e.contains("container \"app\" resources.limits.memory") && e.contains("lots"),
            "{e}"
        );
    }

    #[test]
    fn the_size_is_the_smallest_limit_above_zero() {
        let cases = [
            ((None, None), None),
            ((Some(100), None), Some(100)),
            ((None, Some(50)), Some(50)),
            ((Some(100), Some(50)), Some(50)),
            ((Some(50), Some(100)), Some(50)),
            ((Some(0), Some(100)), Some(100)),
        ];
        for ((pod, volume), want) in cases {
            assert_eq!(
                memory_empty_dir_size(pod, volume),
                want,
                "{pod:?} {volume:?}"
            );
        }
    }
}
