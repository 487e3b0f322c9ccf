//! The TokenRequest subresource (`POST /api/v1/namespaces/{ns}/
//! serviceaccounts/{sa}/token`), as the real server answers it: the
//! service account must exist; `expirationSeconds` defaults to 3600 and
//! may not be under 600; a `boundObjectRef` to a Pod must name a pod that
//! exists, with its uid. The answer echoes the spec and carries a token
//! distinct per request (`fake-token.<ns>.<sa>.<n>`, no JWT) and
//! `status.expirationTimestamp` = now + `expirationSeconds`.
//!
//! A real server may issue a token for another lifetime than asked (it
//! extends a 3607 s request to a year, or caps it at its own maximum) and
//! says so in the answer's spec. Here a service account annotated
//! [`LIFETIME_ANNOTATION`] gets tokens of that many seconds whatever was
//! asked, so a test can watch a renewal without waiting 8 minutes.
//!
//! Not reproduced: no signing (the token is not a JWT and nothing can
//! review it), no defaulting of `audiences` to the server's own, no
//! extension of a 3607 s request to a year, no secret- or node-bound
//! tokens, no owner checks of the bound pod's node.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::objects::{Reply, key, status};
use super::resources::by_kind;
use super::store::{State, now_rfc3339};

/// A service account's annotation: the lifetime, in seconds, of every
/// token issued for it (see the module doc).
pub const LIFETIME_ANNOTATION: &str = "fake.volumed.test/token-seconds";

/// Tokens issued so far, in this process: makes each one distinct.
static ISSUED: AtomicU64 = AtomicU64::new(0);

/// Answers a TokenRequest for `namespace/sa`.
pub fn create(st: &State, namespace: &str, sa: &str, body: &[u8]) -> Reply {
    let Ok(req) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "the body is not a JSON object");
    };
    if req["kind"] != "TokenRequest" {
        return status(
            400,
            "BadRequest",
            format!("a TokenRequest is expected, not {}", req["kind"]),
        );
    }
    let Some(sa_res) = by_kind("v1", "ServiceAccount") else {
        return status(500, "InternalError", "no serviceaccounts resource");
    };
    let Some(account) = st.get(&key(sa_res, Some(namespace), sa)) else {
        return status(
            404,
            "NotFound",
            format!("serviceaccounts \"{sa}\" not found"),
        );
    };
    let lifetime = account["metadata"]["annotations"][LIFETIME_ANNOTATION]
        .as_str()
        .and_then(|s| s.parse::<i64>().ok());
    let mut spec = req.get("spec").cloned().unwrap_or_else(|| json!({}));
    let asked = spec["expirationSeconds"].as_i64().unwrap_or(3600);
    if asked < 600 {
        return status(
            422,
            "Invalid",
            "spec.expirationSeconds: Invalid value: may not specify a duration less than 10 minutes",
        );
    }
    let secs = lifetime.unwrap_or(asked);
    spec["expirationSeconds"] = json!(secs);
    if let Some(bound) = spec.get("boundObjectRef").filter(|b| !b.is_null()) {
        if bound["kind"] != "Pod" {
            return status(
                400,
                "BadRequest",
                format!("the fake binds tokens to pods only, not {}", bound["kind"]),
            );
        }
        let name = bound["name"].as_str().unwrap_or_default();
        let Some(pod_res) = by_kind("v1", "Pod") else {
            return status(500, "InternalError", "no pods resource");
        };
        let Some(pod) = st.get(&key(pod_res, Some(namespace), name)) else {
            return status(404, "NotFound", format!("pods \"{name}\" not found"));
        };
        let uid = bound["uid"].as_str().unwrap_or_default();
        if !uid.is_empty() && pod["metadata"]["uid"].as_str() != Some(uid) {
            return status(
                409,
                "Conflict",
                format!(
                    "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            );
        }
    }
    let n = ISSUED.fetch_add(1, Ordering::Relaxed) + 1;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let expires = i64::try_from(now).unwrap_or_default() + secs;
    let expires = k8s_openapi::jiff::Timestamp::from_second(expires)
        .map(|t| t.to_string())
        .unwrap_or_default();
    (
        201,
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "metadata": {"name": sa, "namespace": namespace, "creationTimestamp": now_rfc3339()},
            "spec": spec,
            "status": {"token": format!("fake-token.{namespace}.{sa}.{n}"), "expirationTimestamp": expires},
        }),
    )
}
