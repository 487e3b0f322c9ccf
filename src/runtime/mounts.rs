//! One container's mounts in CRI's shape (`GET
//! /v1/pods/<uid>/containers/<name>/mounts`, docs/http.md), as a pure
//! plan from the pod's answer ([`PodVolumes`]) and the container's spec:
//! what the kubelet's `makeMounts` decides before a container starts.
//!
//! - A volumeMount of a mounted volume without a subpath is the volume's
//!   `host_path`.
//! - One with `subPath` or `subPathExpr` (expanded from the container's
//!   env; every variable it names must have a value, as the kubelet
//!   requires) is checked (relative, no `..`) and becomes a
//!   [`SubpathRequest`]: the caller binds it at
//!   `pods/<uid>/volume-subpaths/<volume>/<container>/<index>`
//!   (`host::subpath`), opened beneath the volume without following a
//!   symlink, and that bind is the mount's `host_path`.
//! - `read_only` is the volume's OR the volumeMount's; `propagation` is
//!   `model::propagation`'s.
//!
//! - A `volumeDevices` entry of a mapped raw block volume is a device:
//!   the pod's symlink to it as `host_path`, `devicePath` in the
//!   container, permissions `mrw`, or `r` when the volume is read-only
//!   for the pod (the kubelet's `makeBlockVolumes`). A relative
//!   `devicePath`, or a name that is no mapped volume of the pod, is the
//!   kubelet's error.
//!
//! A bad mount or device is an error naming the container, the entry and
//! the path; the others are still answered.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::PodVolumes;
use crate::model::{
    ContainerSpec, Propagation, SubPath, check_sub_path, expand_sub_path_expr, propagation,
};

/// One mount of the container, as CRI's `Mount` carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerMount {
    /// the volumeMount's `name` (the pod volume)
    pub name: String,
    /// `mountPath`: where the container sees it
    pub container_path: String,
    /// what to bind: the volume's path, or its subpath bind
    pub host_path: String,
    /// the volume's `read_only` OR the volumeMount's `readOnly`
    pub read_only: bool,
    /// the volume's `selinux_relabel` ([`super::PodVolume`])
    pub selinux_relabel: bool,
    /// `private`, `rslave` or `rshared`
    pub propagation: Propagation,
}

/// One raw block device of the container, as CRI's `Device` carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerDevice {
    /// the volumeDevice's `name` (the pod volume)
    pub name: String,
    /// `devicePath`: where the container sees the device
    pub container_path: String,
    /// the pod's symlink to the device
    /// (`pods/<uid>/volumeDevices/<plugin>/<name>`)
    pub host_path: String,
    /// cgroup permissions: `mrw`, or `r` for a read-only volume
    pub permissions: String,
}

/// `GET /v1/pods/<uid>/containers/<name>/mounts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerMounts {
    /// the pod UID asked about
    pub pod_uid: String,
    /// the container asked about
    pub container: String,
    /// the pod's volumes are ready and every mount of the container is
    /// answered (no error)
    pub ready: bool,
    /// the container's mounts, in `volumeMounts` order
    pub mounts: Vec<ContainerMount>,
    /// the container's raw block devices, in `volumeDevices` order
    pub devices: Vec<ContainerDevice>,
    /// the pod's supplemental groups, as the pod's answer gives them
    pub supplemental_groups: Vec<u32>,
    /// empty when ready; else the pod's errors, then each refused mount's
    /// and device's
    pub errors: Vec<String>,
}

/// A subpath bind to make before the mount can be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubpathRequest {
    /// the pod volume (`volumeMounts[i].name`)
    pub volume: String,
    /// the container
    pub container: String,
    /// the mount's index in the container's `volumeMounts`
    pub index: usize,
    /// where the volume is on the host (its pod target, or a hostPath)
    pub volume_path: PathBuf,
    /// the subpath, relative to the volume, checked
    pub sub_path: String,
}

/// One planned mount: answered as it is, or once its subpath is bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// the mount; a subpath's `host_path` is filled by the caller
    pub mount: ContainerMount,
    /// the bind to make first, if any
    pub subpath: Option<SubpathRequest>,
}

/// The plan for `container` of the pod `pod` answers for: its mounts in
/// spec order, and the errors of those that cannot be made. Nothing is
/// planned while the pod is not ready (its volumes are not all mounted):
/// the answer then carries the pod's errors.
pub fn plan(pod: &PodVolumes, container: &ContainerSpec) -> (Vec<Planned>, Vec<String>) {
    let mut planned = Vec::with_capacity(container.mounts.len());
    let mut errors = Vec::new();
    if !pod.ready {
        return (planned, pod.errors.clone());
    }
    let c = &container.name;
    for (index, m) in container.mounts.iter().enumerate() {
        let refuse = |why: String| {
            format!(
                "container {c:?}: volumeMount {:?} at {:?}: {why}",
                m.name, m.mount_path
            )
        };
        let Some(volume) = pod.volumes.iter().find(|v| v.name == m.name) else {
            errors.push(refuse("no volume of the pod has this name".to_owned()));
            continue;
        };
        let propagation = match propagation(m.propagation.as_deref(), container.privileged) {
            Ok(p) => p,
            Err(why) => {
                errors.push(refuse(why));
                continue;
            }
        };
        let sub_path = match &m.sub_path {
            SubPath::None => None,
            SubPath::Path(p) => Some(p.clone()),
            SubPath::Expr(e) => match expand_sub_path_expr(e, &container.env) {
                Ok(p) => Some(p),
                Err(why) => {
                    errors.push(refuse(format!("subPathExpr {e:?}: {why}")));
                    continue;
                }
            },
        };
        // an expression that expands to nothing is the whole volume
        let sub_path = sub_path.filter(|p| !p.is_empty());
        if let Some(p) = &sub_path
            && let Err(why) = check_sub_path(p)
        {
            errors.push(refuse(why));
            continue;
        }
        let mount = ContainerMount {
            name: m.name.clone(),
            container_path: m.mount_path.clone(),
            host_path: volume.host_path.clone(),
            read_only: volume.read_only || m.read_only,
            selinux_relabel: volume.selinux_relabel,
            propagation,
        };
        let subpath = sub_path.map(|sub_path| SubpathRequest {
            volume: m.name.clone(),
            container: c.clone(),
            index,
            volume_path: PathBuf::from(&volume.host_path),
            sub_path,
        });
        planned.push(Planned { mount, subpath });
    }
    (planned, errors)
}

/// The devices of `container` (none while the pod is not ready), and the
/// errors of those that cannot be given, in the kubelet's words.
pub fn devices(pod: &PodVolumes, container: &ContainerSpec) -> (Vec<ContainerDevice>, Vec<String>) {
    let mut out = Vec::with_capacity(container.devices.len());
    let mut errors = Vec::new();
    if !pod.ready {
        return (out, errors);
    }
    let c = &container.name;
    for d in &container.devices {
        if !d.device_path.starts_with('/') {
            errors.push(format!(
                "container {c:?}: volumeDevice {:?}: devicePath {:?} must be an absolute path",
                d.name, d.device_path
            ));
            continue;
        }
        let Some(volume) = pod.volumes.iter().find(|v| v.name == d.name) else {
            errors.push(format!(
                "cannot find volume {:?} to pass into container {c:?}",
                d.name
            ));
            continue;
        };
        out.push(ContainerDevice {
            name: d.name.clone(),
            container_path: d.device_path.clone(),
            host_path: volume.host_path.clone(),
            permissions: if volume.read_only { "r" } else { "mrw" }.to_owned(),
        });
    }
    (out, errors)
}

/// The answer once the subpaths are bound: `bound` holds, for each planned
/// mount with a subpath, its bind's path or why it could not be made.
pub fn answer(
    pod: &PodVolumes,
    spec: &ContainerSpec,
    planned: Vec<Planned>,
    mut errors: Vec<String>,
    mut bound: impl FnMut(&SubpathRequest) -> Result<PathBuf, String>,
) -> ContainerMounts {
    let container = spec.name.as_str();
    let mut mounts = Vec::with_capacity(planned.len());
    for Planned { mut mount, subpath } in planned {
        if let Some(req) = subpath {
            match bound(&req) {
                Ok(path) => mount.host_path = path.to_string_lossy().into_owned(),
                Err(why) => {
                    errors.push(format!(
                        "container {container:?}: volumeMount {:?} at {:?}: subPath {:?}: {why}",
                        mount.name, mount.container_path, req.sub_path
                    ));
                    continue;
                }
            }
        }
        mounts.push(mount);
    }
    let (devices, refused) = devices(pod, spec);
    errors.extend(refused);
    ContainerMounts {
        pod_uid: pod.pod_uid.clone(),
        container: container.to_owned(),
        ready: pod.ready && errors.is_empty(),
        mounts,
        devices,
        // the pod answer's groups: its mounted PVs' gid annotations
        supplemental_groups: pod.supplemental_groups.clone(),
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EnvVar, VolumeMountSpec};
    use crate::runtime::PodVolume;

    fn pod(ready: bool) -> PodVolumes {
        let v = |name: &str, read_only| PodVolume {
            name: name.into(),
            host_path: format!("/k/pods/u/volumes/x/{name}"),
            read_only,
            selinux_context: None,
            selinux_relabel: true,
        };
        PodVolumes {
            pod_uid: "u".into(),
            ready,
            volumes: vec![v("cfg", true), v("data", false)],
            errors: if ready {
                vec![]
            } else {
                vec!["unmounted volumes=[data]".into()]
            },
            supplemental_groups: vec![2500],
        }
    }

    fn mount(name: &str, sub: SubPath, ro: bool, prop: Option<&str>) -> VolumeMountSpec {
        VolumeMountSpec {
            name: name.into(),
            mount_path: format!("/mnt/{name}"),
            read_only: ro,
            sub_path: sub,
            propagation: prop.map(str::to_owned),
        }
    }

    fn container(privileged: bool, mounts: Vec<VolumeMountSpec>) -> ContainerSpec {
        ContainerSpec {
            name: "app".into(),
            privileged,
            mounts,
            devices: Vec::new(),
            env: vec![EnvVar {
                name: "POD".into(),
                value: Some("web-0".into()),
            }],
        }
    }

    #[test]
    fn read_only_is_the_volume_s_or_the_mount_s_and_propagation_is_translated() {
        let c = container(
            true,
            vec![
                mount("cfg", SubPath::None, false, None),
                mount("data", SubPath::None, false, Some("HostToContainer")),
                mount("data", SubPath::None, true, Some("Bidirectional")),
            ],
        );
        let (planned, errors) = plan(&pod(true), &c);
        assert!(errors.is_empty(), "{errors:?}");
        let got: Vec<(bool, Propagation, bool)> = planned
            .iter()
            .map(|p| (p.mount.read_only, p.mount.propagation, p.subpath.is_some()))
            .collect();
        assert_eq!(
            got,
            [
                (true, Propagation::Private, false),
                (false, Propagation::HostToContainer, false),
                (true, Propagation::Bidirectional, false),
            ]
        );
        let doc = answer(&pod(true), &c, planned, errors, |_| unreachable!());
        assert!(doc.ready);
        assert_eq!(doc.mounts[0].host_path, "/k/pods/u/volumes/x/cfg");
        assert_eq!(doc.mounts[1].container_path, "/mnt/data");
    }

    #[test]
    fn a_subpath_becomes_a_request_indexed_by_its_place_in_volume_mounts() {
        let c = container(
            false,
            vec![
                mount("data", SubPath::None, false, None),
                mount("data", SubPath::Expr("logs/$(POD)".into()), false, None),
                mount("cfg", SubPath::Path("app.conf".into()), false, None),
                // expands to nothing: the whole volume
                mount("data", SubPath::Path(String::new()), false, None),
            ],
        );
        let (planned, errors) = plan(&pod(true), &c);
        assert!(errors.is_empty(), "{errors:?}");
        let reqs: Vec<(usize, &str, &str)> = planned
            .iter()
            .filter_map(|p| p.subpath.as_ref())
            .map(|r| (r.index, r.volume.as_str(), r.sub_path.as_str()))
            .collect();
        assert_eq!(reqs, [(1, "data", "logs/web-0"), (2, "cfg", "app.conf")]);
        let doc = answer(&pod(true), &c, planned, errors, |r| {
            Ok(PathBuf::from(format!("/sub/{}/{}", r.volume, r.index)))
        });
        let paths: Vec<&str> = doc.mounts.iter().map(|m| m.host_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/k/pods/u/volumes/x/data",
                "/sub/data/1",
                "/sub/cfg/2",
                "/k/pods/u/volumes/x/data"
            ]
        );
        assert!(doc.ready);
    }

    #[test]
    fn a_bad_mount_is_an_error_naming_container_mount_and_path_and_the_rest_is_answered() {
        let c = container(
            false,
            vec![
                mount("data", SubPath::Path("/etc".into()), false, None),
                mount("data", SubPath::Path("a/../../b".into()), false, None),
                mount("data", SubPath::Expr("$(NOPE)".into()), false, None),
                mount("data", SubPath::Expr("$(POD)/..".into()), false, None),
                mount("data", SubPath::None, false, Some("Bidirectional")),
                mount("gone", SubPath::None, false, None),
                mount("cfg", SubPath::None, false, None),
                mount("data", SubPath::Path("link".into()), false, None),
            ],
        );
        let (planned, errors) = plan(&pod(true), &c);
        assert_eq!(planned.len(), 2);
        let doc = answer(&pod(true), &c, planned, errors, |_| {
            Err("openat2 /k/…/link: ELOOP".into())
        });
        assert!(!doc.ready);
        assert_eq!(doc.mounts.len(), 1);
        assert_eq!(doc.mounts[0].name, "cfg");
        let want = [
            "subPath \"/etc\" must not be an absolute path",
            "subPath \"a/../../b\" must not contain '..'",
            "subPathExpr \"$(NOPE)\": missing value for NOPE",
            "subPath \"web-0/..\" must not contain '..'",
            "Bidirectional is allowed only in a privileged container",
            "no volume of the pod has this name",
            "subPath \"link\": openat2 /k/…/link: ELOOP",
        ];
        assert_eq!(doc.errors.len(), want.len(), "{:?}", doc.errors);
        for (e, w) in doc.errors.iter().zip(want) {
            assert!(e.starts_with("container \"app\": volumeMount "), "{e}");
            assert!(e.contains(w), "{e} lacks {w}");
        }
        assert!(doc.errors[0].contains("at \"/mnt/data\""));
    }

    #[test]
    fn a_pod_not_ready_plans_nothing_and_carries_its_errors() {
        let c = container(
            false,
            vec![mount("data", SubPath::Path("x".into()), false, None)],
        );
        let (planned, errors) = plan(&pod(false), &c);
        assert!(planned.is_empty());
        let doc = answer(&pod(false), &c, planned, errors, |_| unreachable!());
        assert!(!doc.ready);
        assert_eq!(doc.errors, ["unmounted volumes=[data]"]);
        assert_eq!(doc.supplemental_groups, [2500], "the pod answer's groups");
        let json = serde_json::to_value(&doc).unwrap();
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        // the issue's shape exactly (serde_json sorts an object's keys)
        let mut want = [
            "pod_uid",
            "container",
            "ready",
            "mounts",
            "devices",
            "supplemental_groups",
            "errors",
        ];
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!(json["devices"], serde_json::json!([]));
    }
}

#[cfg(test)]
mod device_tests {
    use super::*;
    use crate::model::VolumeDeviceSpec;
    use crate::runtime::PodVolume;

    fn pod(ready: bool) -> PodVolumes {
        let v = |name: &str, read_only| PodVolume {
            name: name.into(),
            host_path: format!("/k/pods/u/volumeDevices/kubernetes.io~local-volume/{name}"),
            read_only,
            selinux_context: None,
            selinux_relabel: false,
        };
        PodVolumes {
            pod_uid: "u".into(),
            ready,
            volumes: vec![v("raw", false), v("raw-ro", true)],
            errors: Vec::new(),
            supplemental_groups: Vec::new(),
        }
    }

    fn container(devices: &[(&str, &str)]) -> ContainerSpec {
        ContainerSpec {
            name: "app".into(),
            privileged: false,
            mounts: Vec::new(),
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

    /// The kubelet's `makeBlockVolumes`: the pod's symlink, `mrw` or `r`
    /// for a read-only claim; a relative path or an unknown volume is an
    /// error and the others are still given.
    #[test]
    fn devices_are_the_pod_s_links_with_the_kubelet_s_permissions() {
        let c = container(&[
            ("raw", "/dev/xvda"),
            ("raw-ro", "/dev/xvdb"),
            ("raw", "dev/xvdc"),
            ("gone", "/dev/xvdd"),
        ]);
        let doc = answer(&pod(true), &c, Vec::new(), Vec::new(), |_| unreachable!());
        let got: Vec<(&str, &str, &str)> = doc
            .devices
            .iter()
            .map(|d| {
                (
                    d.container_path.as_str(),
                    d.host_path.as_str(),
                    d.permissions.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "/dev/xvda",
                    "/k/pods/u/volumeDevices/kubernetes.io~local-volume/raw",
                    "mrw"
                ),
                (
                    "/dev/xvdb",
                    "/k/pods/u/volumeDevices/kubernetes.io~local-volume/raw-ro",
                    "r"
                ),
            ]
        );
        assert_eq!(
            doc.errors,
            [
                "container \"app\": volumeDevice \"raw\": devicePath \"dev/xvdc\" must be an absolute path",
                "cannot find volume \"gone\" to pass into container \"app\"",
            ]
        );
        assert!(!doc.ready);
        let json = serde_json::to_value(&doc.devices[0]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "name": "raw",
                "container_path": "/dev/xvda",
                "host_path": "/k/pods/u/volumeDevices/kubernetes.io~local-volume/raw",
                "permissions": "mrw",
            })
        );
        let doc = answer(&pod(false), &c, Vec::new(), Vec::new(), |_| unreachable!());
        assert!(doc.devices.is_empty(), "nothing while the pod is not ready");
    }
}
