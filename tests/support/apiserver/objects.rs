//! The verbs on objects (get, list, create, replace, patch, delete) as pure
//! functions of the state and the request, answering a status code and a
//! JSON body: the object, a list, or a `Status` error as the real server
//! words it.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::patch;
use super::resources::{RESOURCES, Resource};
use super::select::Filter;
use super::store::{Key, State, new_uid, now_rfc3339};

/// A status code and the JSON body to send with it.
pub type Reply = (u16, Value);

/// A `Status` failure (`kind: Status`), the body of every error.
pub fn status(code: u16, reason: &str, message: impl Into<String>) -> Reply {
    let message = message.into();
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

/// A failure naming one object in `details`, as NotFound, AlreadyExists and
/// Conflict carry it.
fn about(code: u16, reason: &str, r: &Resource, name: &str, message: String) -> Reply {
    let (code, mut body) = status(code, reason, message);
    body["details"] = json!({"name": name, "group": r.group, "kind": r.plural});
    (code, body)
}

fn not_found(r: &Resource, name: &str) -> Reply {
    let what = qualified(r);
    about(
        404,
        "NotFound",
        r,
        name,
        format!("{what} \"{name}\" not found"),
    )
}

fn conflict(r: &Resource, name: &str) -> Reply {
    let what = qualified(r);
    about(
        409,
        "Conflict",
        r,
        name,
        format!(
            "Operation cannot be fulfilled on {what} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
        ),
    )
}

/// `pods`, or `csinodes.storage.k8s.io`, as messages name a resource.
fn qualified(r: &Resource) -> String {
    if r.group.is_empty() {
        r.plural.to_owned()
    } else {
        format!("{}.{}", r.plural, r.group)
    }
}

pub fn key(res: usize, namespace: Option<&str>, name: &str) -> Key {
    (
        res,
        namespace.unwrap_or_default().to_owned(),
        name.to_owned(),
    )
}

pub fn get(st: &State, k: &Key) -> Reply {
    match st.get(k) {
        Some(o) => (200, o.clone()),
        None => not_found(&RESOURCES[k.0], &k.2),
    }
}

/// `GET` on a collection without `watch`.
pub fn list(
    st: &State,
    res: usize,
    namespace: Option<String>,
    q: &HashMap<String, String>,
) -> Reply {
    let r = &RESOURCES[res];
    let filter = match Filter::parse(
        r,
        namespace,
        q.get("fieldSelector").map(String::as_str),
        q.get("labelSelector").map(String::as_str),
    ) {
        Ok(f) => f,
        Err(m) => return status(400, "BadRequest", m),
    };
    let rv = q
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    let rv_match = q
        .get("resourceVersionMatch")
        .map(String::as_str)
        .unwrap_or_default();
    let cont = q.get("continue").map(String::as_str).unwrap_or_default();
    if q.get("sendInitialEvents").is_some() {
        return status(400, "BadRequest", "sendInitialEvents is forbidden for list");
    }
    let limit = match q.get("limit").map(|l| l.parse::<i64>()) {
        None => 0,
        Some(Ok(n)) => usize::try_from(n.max(0)).unwrap_or(usize::MAX),
        Some(Err(_)) => return status(400, "BadRequest", "limit must be an integer"),
    };
    let (at, start) = if cont.is_empty() {
        let n = match parse_rv(rv) {
            Ok(n) => n,
            Err(e) => return e,
        };
        // Legacy: a non-zero version without a match, on a paginated list,
        // is read exactly (as the real server still does).
        let rv_match = match (rv_match, n) {
            ("", Some(n)) if n != 0 && limit > 0 => "Exact",
            _ => rv_match,
        };
        let at = match (rv_match, n) {
            (m, None) if !m.is_empty() => {
                return status(
                    400,
                    "BadRequest",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                );
            }
            ("Exact", Some(0)) => {
                return status(
                    400,
                    "BadRequest",
                    "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
                );
            }
            ("Exact", Some(n)) if n < st.compacted => {
                return status(
                    410,
                    "Expired",
                    "The resourceVersion for the provided list is too old.",
                );
            }
            ("Exact" | "NotOlderThan" | "", Some(n)) if n > st.rv => {
                return status(
                    504,
                    "Timeout",
                    format!("Too large resource version: {n}, current: {}", st.rv),
                );
            }
            ("Exact", Some(n)) => n,
            ("NotOlderThan" | "", _) => st.rv,
            (m, _) => {
                return status(
                    400,
                    "BadRequest",
                    format!("unsupported resourceVersionMatch {m:?}"),
                );
            }
        };
        (at, None)
    } else {
        if !rv.is_empty() && rv != "0" {
            return status(
                400,
                "BadRequest",
                "specifying resource version is not allowed when using continue",
            );
        }
        if !rv_match.is_empty() {
            return status(
                400,
                "BadRequest",
                "resourceVersionMatch is forbidden when continue is provided",
            );
        }
        match decode_continue(cont) {
            Some((at, ns, name)) if at >= st.compacted => (at, Some((ns, name))),
            Some(_) => {
                return status(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                );
            }
            None => return status(400, "BadRequest", "continue key is not valid"),
        }
    };
    let Ok(objs) = st.snapshot(res, Some(at)) else {
        return status(
            410,
            "Expired",
            "The resourceVersion for the provided list is too old.",
        );
    };
    let mut matching = objs
        .into_iter()
        .filter(|(k, _)| {
            start
                .as_ref()
                .is_none_or(|(ns, name)| (&k.1, &k.2) > (ns, name))
        })
        .filter(|(_, o)| filter.matches(o));
    let take = if limit == 0 { usize::MAX } else { limit };
    let mut items = Vec::new();
    let mut last = None;
    for (k, o) in matching.by_ref().take(take) {
        last = Some(k);
        items.push(o);
    }
    let rest = matching.count();
    let mut meta = json!({"resourceVersion": at.to_string()});
    if rest > 0
        && let Some(k) = last
    {
        meta["continue"] = json!(encode_continue(at, &k.1, &k.2));
        if !filter.selective {
            meta["remainingItemCount"] = json!(rest);
        }
    }
    (
        200,
        json!({"kind": format!("{}List", r.kind), "apiVersion": r.api_version(), "metadata": meta, "items": items}),
    )
}

/// A resourceVersion parameter: `None` for empty, `Err` (400) when not a
/// number.
pub fn parse_rv(rv: &str) -> Result<Option<u64>, Reply> {
    if rv.is_empty() {
        return Ok(None);
    }
    rv.parse().map(Some).map_err(|_| {
        status(
            400,
            "BadRequest",
            format!("invalid resource version {rv:?}"),
        )
    })
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    format!("{rv}/{ns}/{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| {
            token
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let mut parts = text.splitn(3, '/');
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.to_owned(),
        parts.next()?.to_owned(),
    ))
}

/// Parses a request body as a JSON object.
fn body_object(body: &[u8]) -> Result<Value, Reply> {
    match serde_json::from_slice::<Value>(body) {
        Ok(mut v @ Value::Object(_)) => {
            well_formed(&mut v)?;
            Ok(v)
        }
        Ok(_) => Err(status(400, "BadRequest", "the body must be a JSON object")),
        Err(e) => Err(status(
            400,
            "BadRequest",
            format!("the body is not JSON: {e}"),
        )),
    }
}

/// Gives `obj` an object `metadata` (refusing any other kind of value), so
/// that indexing into it cannot panic.
fn well_formed(obj: &mut Value) -> Result<(), Reply> {
    if !obj.is_object() {
        return Err(status(422, "Invalid", "the object must be a JSON object"));
    }
    match &obj["metadata"] {
        Value::Null => obj["metadata"] = json!({}),
        Value::Object(_) => {}
        _ => return Err(status(422, "Invalid", "metadata must be an object")),
    }
    Ok(())
}

/// Checks (or fills in) apiVersion, kind and namespace of a body against
/// the URL.
fn check_type(r: &Resource, obj: &mut Value, namespace: Option<&str>) -> Result<(), Reply> {
    for (field, want) in [("apiVersion", r.api_version()), ("kind", r.kind.to_owned())] {
        match obj[field].as_str() {
            None | Some("") => obj[field] = json!(want),
            Some(got) if got != want => {
                return Err(status(
                    400,
                    "BadRequest",
                    format!(
                        "the {field} in the data ({got}) does not match the expected {field} ({want})"
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(ns) = namespace {
        match obj["metadata"]["namespace"].as_str() {
            None | Some("") => obj["metadata"]["namespace"] = json!(ns),
            Some(got) if got != ns => {
                return Err(status(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            Some(_) => {}
        }
    } else if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    Ok(())
}

/// `POST` on a collection.
pub fn create(st: &mut State, res: usize, namespace: Option<&str>, body: &[u8]) -> Reply {
    let r = &RESOURCES[res];
    if r.namespaced && namespace.is_none() {
        return status(
            405,
            "MethodNotAllowed",
            "create needs a namespace in the path",
        );
    }
    let mut obj = match body_object(body) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if let Err(e) = check_type(r, &mut obj, namespace) {
        return e;
    }
    let meta = &mut obj["metadata"];
    if meta["resourceVersion"]
        .as_str()
        .is_some_and(|v| !v.is_empty())
    {
        return status(
            500,
            "InternalError",
            "resourceVersion should not be set on objects to be created",
        );
    }
    let mut name = meta["name"].as_str().unwrap_or_default().to_owned();
    if name.is_empty() {
        let Some(prefix) = meta["generateName"].as_str().filter(|g| !g.is_empty()) else {
            return status(
                422,
                "Invalid",
                format!(
                    "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                    r.kind
                ),
            );
        };
        name = format!("{prefix}{}", &new_uid().replace('-', "")[..5]);
        meta["name"] = json!(name);
    }
    let k = key(res, namespace, &name);
    if st.get(&k).is_some() {
        let what = qualified(r);
        return about(
            409,
            "AlreadyExists",
            r,
            &name,
            format!("{what} \"{name}\" already exists"),
        );
    }
    meta["uid"] = json!(new_uid());
    meta["creationTimestamp"] = json!(now_rfc3339());
    (201, st.commit(k, Some(obj)))
}

/// Whether `new` differs from `old` in anything but resourceVersion.
fn changed(old: &Value, new: &Value) -> bool {
    let mut a = old.clone();
    let mut b = new.clone();
    a["metadata"]["resourceVersion"] = Value::Null;
    b["metadata"]["resourceVersion"] = Value::Null;
    a != b
}

/// Finishes an update of `old` into `next`: keeps what a write may not
/// change (identity, `status` or all but `status`, by subresource), checks
/// the resourceVersion precondition, and commits unless nothing changed
/// (a no-op write does not bump the resourceVersion, as in the real server).
fn update(st: &mut State, k: Key, old: Value, mut next: Value, to_status: bool) -> Reply {
    let r = &RESOURCES[k.0];
    if let Err(e) = well_formed(&mut next) {
        return e;
    }
    let want_rv = next["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if !want_rv.is_empty() && Some(want_rv.as_str()) != old["metadata"]["resourceVersion"].as_str()
    {
        return conflict(r, &k.2);
    }
    if to_status {
        let st_new = next.get("status").cloned();
        next = old.clone();
        match st_new {
            Some(s) => next["status"] = s,
            None => {
                if let Some(m) = next.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    } else if r.status {
        match old.get("status") {
            Some(s) => next["status"] = s.clone(),
            None => {
                if let Some(m) = next.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    for f in ["uid", "creationTimestamp", "name", "namespace"] {
        match old["metadata"].get(f) {
            Some(v) => next["metadata"][f] = v.clone(),
            None => {
                if let Some(m) = next["metadata"].as_object_mut() {
                    m.remove(f);
                }
            }
        }
    }
    next["apiVersion"] = old["apiVersion"].clone();
    next["kind"] = old["kind"].clone();
    next["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    if !changed(&old, &next) {
        return (200, old);
    }
    (200, st.commit(k, Some(next)))
}

/// `PUT` on an object or its `/status`.
pub fn replace(st: &mut State, k: Key, to_status: bool, body: &[u8]) -> Reply {
    let r = &RESOURCES[k.0];
    let mut obj = match body_object(body) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let ns = (!k.1.is_empty()).then_some(k.1.as_str());
    if let Err(e) = check_type(r, &mut obj, ns) {
        return e;
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    if name != k.2 {
        return status(
            400,
            "BadRequest",
            format!(
                "the name of the object ({name}) does not match the name on the URL ({})",
                k.2
            ),
        );
    }
    let Some(old) = st.get(&k).cloned() else {
        return not_found(r, &k.2);
    };
    update(st, k, old, obj, to_status)
}

/// `PATCH` on an object or its `/status`, by content type.
pub fn patch(
    st: &mut State,
    k: Key,
    to_status: bool,
    content_type: &str,
    q: &HashMap<String, String>,
    body: &[u8],
) -> Reply {
    let r = &RESOURCES[k.0];
    let ct = content_type.split(';').next().unwrap_or_default().trim();
    let doc: Value = match ct {
        "application/apply-patch+yaml"
        | "application/merge-patch+json"
        | "application/strategic-merge-patch+json" => match body_object(body) {
            Ok(d) => d,
            Err(e) => return e,
        },
        "application/json-patch+json" => match serde_json::from_slice(body) {
            Ok(d) => d,
            Err(e) => return status(400, "BadRequest", format!("the body is not JSON: {e}")),
        },
        other => {
            return status(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
                ),
            );
        }
    };
    let apply = ct == "application/apply-patch+yaml";
    if apply && q.get("fieldManager").is_none_or(String::is_empty) {
        return status(
            400,
            "BadRequest",
            "PATCH request of type apply must have a fieldManager",
        );
    }
    let Some(old) = st.get(&k).cloned() else {
        if apply && !to_status {
            let ns = (!k.1.is_empty()).then_some(k.1.as_str());
            let mut obj = doc;
            obj["metadata"]["name"] = json!(k.2);
            return create(st, k.0, ns, obj.to_string().as_bytes());
        }
        return not_found(r, &k.2);
    };
    let next = if ct == "application/json-patch+json" {
        match patch::json_patch(&old, &doc) {
            Ok(n) => n,
            Err(m) => return status(422, "Invalid", m),
        }
    } else {
        let mut n = old.clone();
        patch::merge(&mut n, &doc);
        n
    };
    update(st, k, old, next, to_status)
}

/// `DELETE` on an object: immediate (no grace period, no finalizers).
pub fn delete(st: &mut State, k: Key, body: &[u8]) -> Reply {
    let r = &RESOURCES[k.0];
    let Some(old) = st.get(&k).cloned() else {
        return not_found(r, &k.2);
    };
    let opts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let pre = &opts["preconditions"];
    let uid = &old["metadata"]["uid"];
    let rv = &old["metadata"]["resourceVersion"];
    if pre["uid"].is_string() && pre["uid"] != *uid
        || pre["resourceVersion"].is_string() && pre["resourceVersion"] != *rv
    {
        return conflict(r, &k.2);
    }
    st.commit(k.clone(), None);
    (
        200,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                 "details": {"name": k.2, "group": r.group, "kind": r.plural, "uid": uid}}),
    )
}
