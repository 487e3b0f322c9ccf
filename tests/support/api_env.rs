//! A test world whose daemon watches the API-server fake: shared by the
//! API-source end-to-end tests (`apiserver_e2e.rs`, `apiserver_payload.rs`).

use serde_json::json;

use super::apiserver::FakeApiServer;
use super::daemon::{Env, NODE};

/// A fake with this test's Node, and an env whose daemon watches it.
pub fn api_env(prefix: &str) -> (Env, FakeApiServer) {
    let api = FakeApiServer::start();
    api.put(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"keep": "me"}},
        "status": {"nodeInfo": {"kubeletVersion": "v1.37.0"}, "capacity": {"pods": "110"}},
    }));
    let mut env = Env::new(prefix);
    let kubeconfig = env.scratch.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    env.extra_args.extend([
        "--kubeconfig".to_owned(),
        kubeconfig.display().to_string(),
        // the kubelet's 10 s would make every wait below that long
        "--node-status-update-frequency".to_owned(),
        "300ms".to_owned(),
    ]);
    (env, api)
}
