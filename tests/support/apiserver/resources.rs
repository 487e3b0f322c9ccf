//! The resource table the fake serves (plural, group/version, kind, scope,
//! status subresource, field-selector labels) and the parsing of request
//! paths into routes against it.

/// One served resource type.
pub struct Resource {
    /// API group; empty for the core group (`/api/v1`).
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Whether it has a `/status` subresource (so a write to the object
    /// leaves `status` alone and a write to `/status` changes only it).
    pub status: bool,
    /// Field-selector labels beyond `metadata.name` and `metadata.namespace`,
    /// as the real server's field-label conversion accepts them.
    pub fields: &'static [&'static str],
}

impl Resource {
    /// `v1` or `group/version`, as in an object's `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether `label` may be used in a field selector on this resource.
    pub fn has_field(&self, label: &str) -> bool {
        label == "metadata.name" || label == "metadata.namespace" || self.fields.contains(&label)
    }
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// Everything the fake serves.
pub static RESOURCES: &[Resource] = &[
    res("", "pods", "Pod", true, true, POD_FIELDS),
    res("", "nodes", "Node", false, true, &["spec.unschedulable"]),
    res(
        "",
        "persistentvolumes",
        "PersistentVolume",
        false,
        true,
        &[],
    ),
    res(
        "",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        true,
        &[],
    ),
    res("", "secrets", "Secret", true, false, &["type"]),
    res("", "configmaps", "ConfigMap", true, false, &[]),
    res("", "events", "Event", true, false, EVENT_FIELDS),
    res("", "serviceaccounts", "ServiceAccount", true, false, &[]),
    res(
        "storage.k8s.io",
        "csidrivers",
        "CSIDriver",
        false,
        false,
        &[],
    ),
    res("storage.k8s.io", "csinodes", "CSINode", false, false, &[]),
    res(
        "storage.k8s.io",
        "volumeattachments",
        "VolumeAttachment",
        false,
        true,
        &[],
    ),
    res("events.k8s.io", "events", "Event", true, false, &[]),
];

const fn res(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    status: bool,
    fields: &'static [&'static str],
) -> Resource {
    Resource {
        group,
        version: "v1",
        plural,
        kind,
        namespaced,
        status,
        fields,
    }
}

/// The index of the resource with this `apiVersion` and `kind`.
pub fn by_kind(api_version: &str, kind: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.api_version() == api_version && r.kind == kind)
}

/// What a request path names.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// `/version`
    Version,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/api/v1` or `/apis/<group>/<version>`: the resource list.
    ResourceList { group: String, version: String },
    /// A collection or an object of a served resource.
    Object {
        res: usize,
        namespace: Option<String>,
        name: Option<String>,
        /// `status` for `/status`; any other subresource is refused.
        sub: Option<String>,
    },
    /// A path that names nothing served here.
    Unknown,
}

/// Parses a request path (without the query).
pub fn route(path: &str) -> Route {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["version"] => return Route::Version,
        ["api"] => return Route::CoreVersions,
        ["apis"] => return Route::Groups,
        ["api", v] => return list_route("", v),
        ["apis", g, v] => return list_route(g, v),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::Unknown,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, more @ ..] if !ns.is_empty() => (Some(*ns), {
            let mut v = vec![*plural];
            v.extend_from_slice(more);
            v
        }),
        _ => (None, rest.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(*n), None),
        [p, n, s] => (*p, Some(*n), Some(*s)),
        _ => return Route::Unknown,
    };
    let Some(res) = RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
    else {
        return Route::Unknown;
    };
    if namespace.is_some() && !RESOURCES[res].namespaced || name.is_some_and(str::is_empty) {
        return Route::Unknown;
    }
    Route::Object {
        res,
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
        sub: sub.map(str::to_owned),
    }
}

fn list_route(group: &str, version: &str) -> Route {
    if RESOURCES
        .iter()
        .any(|r| r.group == group && r.version == version)
    {
        Route::ResourceList {
            group: group.to_owned(),
            version: version.to_owned(),
        }
    } else {
        Route::Unknown
    }
}
