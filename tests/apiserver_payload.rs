//! Payload volumes of pods from the API server, end to end: the real
//! `volumed` binary with `--kubeconfig`, real HTTP to the API-server fake
//! in `tests/support/apiserver/` (its module doc, and `token.rs` beside it,
//! list what a real API server does that the fake does not — the token is
//! no signed JWT, which volumed never reads anyway), real tmpfs mounts.
//!
//! - an API pod's configMap, secret and projected volume (a service
//!   account token, the `kube-root-ca.crt` ConfigMap, a downwardAPI item)
//!   get every file with its content and mode, the secret and the projected
//!   volume on a tmpfs; an optional ConfigMap that does not exist adds
//!   nothing; the token was requested for the pod's service
//!   account, bound to the pod; only the objects named are watched, each by
//!   name; the journal records the token's expiry as its version, and the
//!   token is in no journal file and not in the log;
//! - a change to the ConfigMap through the API reaches the file within the
//!   sync period;
//! - the pod deleted, the watches of its objects end;
//! - a token is renewed at 80% of its lifetime and not before (the token
//!   keeper against the fake, real HTTP, a clock the test moves), and the
//!   daemon's renewed token reaches the file before the old one expires;
//! - a standalone node's token volume is an error naming the volume;
//! - a restart (graceful, then after SIGKILL) keeps the token in place:
//!   no second TokenRequest, the token file and `..data` keep their inodes
//!   and mtimes; a token whose renewal is due at the restart is renewed.
//!
//! The daemon tests run as root in their own private mount namespace.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use support::api_env::api_env;
use support::apiserver::FakeApiServer;
use support::daemon::{Daemon, Env, NODE, all_mounted, real};
use volumed::apiserver::token::{Clock, Polled, TokenKeeper};
use volumed::model::TokenRef;

const POD: &str = "a9e1c0de-5a1d-4c0f-9e7e-0000000000a1";
const NS: &str = "apps";
const SA: &str = "app-sa";
/// Distinctive enough that finding it anywhere is no accident.
const PASSWORD: &str = "pw-4d1f9a7b3c-api-never-journaled";
const CA: &str = "-----BEGIN CERTIFICATE-----\nfake-root-ca\n-----END CERTIFICATE-----\n";

/// The service account, the objects, and the pod that names them.
fn seed(api: &FakeApiServer) {
    api.put(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SA, "namespace": NS}}));
    api.put(config_map("v=1"));
    api.put(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": NS},
        "stringData": {"password": PASSWORD}}));
    api.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kube-root-ca.crt", "namespace": NS},
        "data": {"ca.crt": CA}}));
    // objects nobody names: never watched
    api.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "unrelated", "namespace": NS}, "data": {"x": "y"}}));
    api.put(pod());
}

fn config_map(conf: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app-config", "namespace": NS},
        "data": {"app.conf": conf}})
}

/// The default `kube-api-access` volume as the admission plugin writes it,
/// with an audience, beside a configMap and a secret volume.
fn pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": NS, "uid": POD},
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": SA,
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [
                {"name": "config", "configMap": {"name": "app-config", "defaultMode": 0o640}},
                {"name": "creds", "secret": {"secretName": "db",
                    "items": [{"key": "password", "path": "pw", "mode": 0o400}]}},
                {"name": "kube-api-access", "projected": {"defaultMode": 0o644, "sources": [
                    {"serviceAccountToken": {"path": "token", "audience": "vault",
                        "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    // optional and absent: adds nothing, fails nothing
                    {"configMap": {"name": "absent", "optional": true}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ]}},
            ],
        },
        "status": {"phase": "Running"},
    })
}

struct Volumes {
    config: PathBuf,
    creds: PathBuf,
    projected: PathBuf,
}

fn volumes(env: &Env) -> Volumes {
    Volumes {
        config: env.pod_volume(POD, "kubernetes.io~configmap", "config"),
        creds: env.pod_volume(POD, "kubernetes.io~secret", "creds"),
        projected: env.pod_volume(POD, "kubernetes.io~projected", "kube-api-access"),
    }
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().mode() & 0o777
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The TokenRequests the fake answered.
fn token_requests(api: &FakeApiServer) -> Vec<Value> {
    api.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/token"))
        .map(|r| {
            assert_eq!(
                r.path,
                format!("/api/v1/namespaces/{NS}/serviceaccounts/{SA}/token")
            );
            assert_eq!(r.status, 201, "{}", r.body);
            serde_json::from_str(&r.body).unwrap()
        })
        .collect()
}

#[test]
fn an_api_pods_payload_volumes_get_their_files_and_a_config_map_change() {
    real("mounts an API pod's payload volumes", || {
        let (mut env, api) = api_env("volumed-api-payload-");
        env.extra_args
            .extend(["--sync-frequency".to_owned(), "1s".to_owned()]);
        seed(&api);
        let v = volumes(&env);
        let daemon = env.start();
        let want = [v.config.clone(), v.creds.clone(), v.projected.clone()];
        daemon.wait_until("the three payload volumes set up", || {
            all_mounted(&daemon.state(), &want)
        });

        // contents and modes
        assert_eq!(
            fs::read_to_string(v.config.join("app.conf")).unwrap(),
            "v=1"
        );
        assert_eq!(mode(&v.config.join("app.conf")), 0o640);
        assert_eq!(fs::read_to_string(v.creds.join("pw")).unwrap(), PASSWORD);
        assert_eq!(mode(&v.creds.join("pw")), 0o400);
        let token = fs::read_to_string(v.projected.join("token")).unwrap();
        assert!(
            token.starts_with(&format!("fake-token.{NS}.{SA}.")),
            "the token the fake issued: {} bytes",
            token.len()
        );
        assert_eq!(fs::read_to_string(v.projected.join("ca.crt")).unwrap(), CA);
        assert_eq!(
            fs::read_to_string(v.projected.join("namespace")).unwrap(),
            NS
        );
        for f in ["token", "ca.crt", "namespace"] {
            assert_eq!(mode(&v.projected.join(f)), 0o644, "{f}");
        }
        let mut names: Vec<String> = fs::read_dir(&v.projected)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with(".."))
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["ca.crt", "namespace", "token"],
            "nothing from the absent one"
        );
        let mounts = env.mounts_below_root();
        let tmpfs = |p: &PathBuf| {
            mounts
                .iter()
                .any(|m| &m.mount_point == p && m.fs_type == "tmpfs")
        };
        assert!(tmpfs(&v.creds), "the secret is on a tmpfs");
        assert!(tmpfs(&v.projected), "the token is on a tmpfs");
        assert!(!tmpfs(&v.config), "a configMap is on disk");

        // the TokenRequest: the pod's service account, bound to the pod
        let reqs = token_requests(&api);
        assert_eq!(reqs.len(), 1, "one token, requested once");
        let spec = &reqs[0]["spec"];
        assert_eq!(spec["audiences"], json!(["vault"]));
        assert_eq!(spec["expirationSeconds"], json!(3607));
        assert_eq!(spec["boundObjectRef"]["kind"], "Pod");
        assert_eq!(spec["boundObjectRef"]["name"], "web");
        assert_eq!(spec["boundObjectRef"]["uid"], POD);

        // watched: exactly the named objects, each by name
        let mut named: Vec<(String, String)> = api
            .requests()
            .into_iter()
            .filter(|r| r.path.contains("/configmaps") || r.path.contains("/secrets"))
            .map(|r| {
                let sel = r.param("fieldSelector").unwrap_or_default();
                assert!(sel.starts_with("metadata.name="), "{} {}", r.path, r.query);
                (r.path, sel)
            })
            .collect();
        named.sort();
        named.dedup();
        assert_eq!(
            named,
            [
                (
                    format!("/api/v1/namespaces/{NS}/configmaps"),
                    "metadata.name=absent".to_owned()
                ),
                (
                    format!("/api/v1/namespaces/{NS}/configmaps"),
                    "metadata.name=app-config".to_owned()
                ),
                (
                    format!("/api/v1/namespaces/{NS}/configmaps"),
                    "metadata.name=kube-root-ca.crt".to_owned()
                ),
                (
                    format!("/api/v1/namespaces/{NS}/secrets"),
                    "metadata.name=db".to_owned()
                ),
            ]
        );

        // a change through the API: written within the sync period (1 s;
        // the slack covers the watch and one reconciler pass)
        let changed = Instant::now();
        api.put(config_map("v=2"));
        daemon.wait_until("the new ConfigMap written", || {
            fs::read_to_string(v.config.join("app.conf")).is_ok_and(|c| c == "v=2")
        });
        let took = changed.elapsed();
        eprintln!("ConfigMap change to file: {took:?} (sync period 1 s)");
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert_eq!(
            fs::read_to_string(v.projected.join("token")).unwrap(),
            token,
            "the token is not renewed by a ConfigMap change"
        );

        // the journal's version of the token is its expiry
        let dumped = daemon.get("/debug/journal");
        assert!(dumped.contains("ServiceAccountToken"), "{dumped}");
        assert!(dumped.contains("exp:"), "{dumped}");
        assert!(!dumped.contains(&token), "dump shows the token");
        let log = daemon.log();
        daemon.stop();
        // the pod waited for its objects' watches and its token: its first
        // resolution found them all (no passing "not found")
        for transient in ["not found", "not requested yet"] {
            assert!(!log.contains(transient), "{transient}:\n{log}");
        }
        for (what, secret) in [("token", token.as_str()), ("secret", PASSWORD)] {
            assert!(!log.contains(secret), "the log holds the {what}");
            for rel in support::daemon::tree(&env.journal) {
                let p = env.journal.join(rel);
                if fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
                    let bytes = fs::read(&p).unwrap();
                    assert!(
                        !contains(&bytes, secret.as_bytes()),
                        "{} holds the {what}",
                        p.display()
                    );
                }
            }
        }
    });
}

/// The static objects dir's copy of an object wins over the API server's
/// for an API pod too, and a change of that file reaches the pod's
/// payload within the sync period (the API source hears of it from the
/// dir's store; before, only a change at the API server did).
#[test]
fn an_api_pods_config_map_from_the_static_dir_follows_the_file() {
    real("mounts an API pod's payload volumes", || {
        let (mut env, api) = api_env("volumed-api-payload-static-");
        env.extra_args
            .extend(["--sync-frequency".to_owned(), "1s".to_owned()]);
        let objects = env.objects.clone();
        let write = |conf: &str| {
            let tmp = objects.join(".cm.yaml.tmp");
            let doc = format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: app-config, namespace: {NS}}}\ndata: {{app.conf: {conf}}}\n"
            );
            fs::write(&tmp, doc).unwrap();
            fs::rename(&tmp, objects.join("cm.yaml")).unwrap();
        };
        write("static-1");
        seed(&api);
        let v = volumes(&env);
        let daemon = env.start();
        let conf = v.config.join("app.conf");
        daemon.wait_until("the dir's copy written", || {
            fs::read_to_string(&conf).is_ok_and(|c| c == "static-1")
        });
        write("static-2");
        daemon.wait_until("the file's change written", || {
            fs::read_to_string(&conf).is_ok_and(|c| c == "static-2")
        });
        daemon.stop();
    });
}

#[test]
fn a_deleted_pods_object_watches_end() {
    real("mounts an API pod's payload volumes", || {
        let (mut env, api) = api_env("volumed-api-payload-gone-");
        seed(&api);
        let v = volumes(&env);
        let daemon = env.start();
        let want = [v.config.clone(), v.creds.clone(), v.projected.clone()];
        daemon.wait_until("the three payload volumes set up", || {
            all_mounted(&daemon.state(), &want)
        });
        assert_eq!(
            api.open_watches_of("configmaps"),
            3,
            "app-config, kube-root-ca.crt, absent"
        );
        assert_eq!(api.open_watches_of("secrets"), 1, "db");

        api.delete("v1", "Pod", Some(NS), "web");
        daemon.wait_until("the pod's volumes torn down", || {
            want.iter().all(|p| !p.exists())
        });
        daemon.wait_until("the object watches ended", || {
            api.open_watches_of("configmaps") + api.open_watches_of("secrets") == 0
        });
        // and none opened again
        api.clear_requests();
        std::thread::sleep(Duration::from_secs(2));
        let again: Vec<String> = api
            .requests()
            .into_iter()
            .filter(|r| {
                r.path.contains("/configmaps")
                    || r.path.contains("/secrets")
                    || r.path.ends_with("/token")
            })
            .map(|r| format!("{} {}?{}", r.method, r.path, r.query))
            .collect();
        assert!(again.is_empty(), "{again:#?}");
        assert_eq!(api.open_watches_of("pods"), 1, "the pod watch goes on");
        daemon.stop();
    });
}

#[test]
fn a_standalone_nodes_token_volume_is_an_error_naming_it() {
    real("mounts a static pod's projected token", || {
        let mut env = Env::new("volumed-payload-token-standalone");
        env.write_pod(
            "p.yaml",
            &format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: default, uid: {POD}}}
spec:
  containers: [{{name: app, image: busybox}}]
  volumes:
  - name: kube-api-access
    projected:
      sources:
      - serviceAccountToken: {{path: token}}
"
            ),
        );
        let daemon = env.start();
        daemon.wait_until_showing(
            "the token volume's error",
            || {
                let log = daemon.log();
                log.contains("kube-api-access")
                    && log.contains("a service account token needs the API server (--kubeconfig)")
            },
            || daemon.log_tail(),
        );
        let projected = env.pod_volume(POD, "kubernetes.io~projected", "kube-api-access");
        assert!(!projected.exists(), "nothing set up");
        daemon.stop();
    });
}

/// An API pod mounted with `--sync-frequency 1s` while the fake issues
/// 30 s tokens for its service account (a real server may answer another
/// lifetime than asked): the env, the fake, the daemon and the token file,
/// once the first token is written.
fn with_short_tokens(prefix: &str) -> (Env, FakeApiServer, Daemon, PathBuf) {
    let (mut env, api) = api_env(prefix);
    env.extra_args
        .extend(["--sync-frequency".to_owned(), "1s".to_owned()]);
    seed(&api);
    let lifetime = support::apiserver::token::LIFETIME_ANNOTATION;
    api.put(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SA, "namespace": NS, "annotations": {lifetime: "30"}}}));
    let v = volumes(&env);
    let daemon = env.start();
    let file = v.projected.join("token");
    daemon.wait_until("the first token written", || file.exists());
    (env, api, daemon, file)
}

/// The daemon's own keeper, end to end: the fake issues 30 s tokens for
/// this service account (as a real server may answer another lifetime than
/// asked), so the renewal is due at 24 s less up to 10 s of jitter.
#[test]
fn an_api_pods_token_is_renewed_after_80_percent_and_rewritten_before_it_expires() {
    real("mounts an API pod's projected token", || {
        let (_env, api, daemon, file) = with_short_tokens("volumed-api-payload-renew-");
        let first = fs::read_to_string(&file).unwrap();
        let written = Instant::now();
        daemon.wait_until("a renewed token written", || {
            fs::read_to_string(&file).is_ok_and(|t| t != first)
        });
        let took = written.elapsed();
        eprintln!("token renewed and rewritten {took:?} after the first (30 s tokens)");
        // 80% of 30 s is 24 s, brought forward by at most 10 s of jitter;
        // written (one sync period later) before the first one expired
        assert!(
            took >= Duration::from_secs(13),
            "renewed too early: {took:?}"
        );
        assert!(took < Duration::from_secs(30), "renewed too late: {took:?}");
        assert_eq!(token_requests(&api).len(), 2, "one renewal");
        daemon.stop();
    });
}

/// The projected volume's entries a rewrite would change: the token file
/// in the payload dir, `..data`, and the visible link.
fn token_entries(projected: &Path) -> Vec<PathBuf> {
    ["..data/token", "..data", "token", "..data/ca.crt"]
        .into_iter()
        .map(|n| projected.join(n))
        .collect()
}

/// The journal keeps a token's expiry, never its bytes; the token is still
/// in the pod's volume after a restart. A graceful restart, then a SIGKILL
/// and a restart, each past one sync period (whose pass runs a SetUp of
/// every payload volume once after a restart): the fake answers no second
/// TokenRequest, and the token file, `..data` and the visible link keep
/// their inodes and mtimes.
#[test]
fn a_restart_keeps_the_token_in_place_without_a_token_request() {
    real("mounts an API pod's projected token", || {
        let (mut env, api) = api_env("volumed-api-payload-restart-");
        env.extra_args
            .extend(["--sync-frequency".to_owned(), "1s".to_owned()]);
        seed(&api);
        let v = volumes(&env);
        let want = [v.config.clone(), v.creds.clone(), v.projected.clone()];
        let daemon = env.start();
        daemon.wait_until("the three payload volumes set up", || {
            all_mounted(&daemon.state(), &want)
        });
        let token = fs::read_to_string(v.projected.join("token")).unwrap();
        let watched = token_entries(&v.projected);
        let before = support::stamps(&watched);
        assert_eq!(token_requests(&api).len(), 1);
        daemon.stop();

        for how in ["graceful", "SIGKILL"] {
            let daemon = env.start();
            daemon.wait_until("the three payload volumes set up again", || {
                all_mounted(&daemon.state(), &want)
            });
            // past the first sync period after the restart
            std::thread::sleep(Duration::from_secs(3));
            assert_eq!(
                token_requests(&api).len(),
                1,
                "{how}: no TokenRequest after the restart\n{}",
                daemon.log_tail()
            );
            assert_eq!(
                support::stamps(&watched),
                before,
                "{how}: nothing rewritten"
            );
            assert_eq!(
                fs::read_to_string(v.projected.join("token")).unwrap(),
                token
            );
            let log = daemon.log();
            assert!(
                log.contains("token in place from before the restart"),
                "{log}"
            );
            assert!(!log.contains(&token), "the log holds the token");
            match how {
                "graceful" => daemon.stop(),
                _ => daemon.kill(),
            }
        }
    });
}

/// A token whose renewal is already due at the restart is renewed then,
/// and the payload rewritten. The fake issues 30 s tokens for this service
/// account while the source asks for 3607 s: reckoned from what is asked
/// (the journal keeps only the expiry), more than 80% of the lifetime has
/// passed, so the token in place is not kept.
#[test]
fn a_token_due_for_renewal_at_a_restart_is_renewed_and_rewritten() {
    real("mounts an API pod's projected token", || {
        let (mut env, api, daemon, file) = with_short_tokens("volumed-api-payload-restart-due-");
        let first = fs::read_to_string(&file).unwrap();
        daemon.stop();
        assert_eq!(
            token_requests(&api).len(),
            1,
            "no renewal before the restart"
        );

        let daemon = env.start();
        daemon.wait_until("a renewed token written", || {
            fs::read_to_string(&file).is_ok_and(|t| t != first)
        });
        assert_eq!(
            token_requests(&api).len(),
            2,
            "renewed once, at the restart"
        );
        assert!(
            daemon.log().contains("kept=false"),
            "the token in place was read back and judged due:\n{}",
            daemon.log_tail()
        );
        daemon.stop();
    });
}

/// A clock the test moves.
#[derive(Debug)]
struct TestClock(Mutex<SystemTime>);

impl Clock for TestClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

impl TestClock {
    fn set(&self, t: SystemTime) {
        *self.0.lock().unwrap() = t;
    }
}

#[test]
fn a_token_is_renewed_at_80_percent_of_its_lifetime_and_not_before() {
    let api = FakeApiServer::start();
    api.put(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SA, "namespace": NS}}));
    api.put(pod());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(api.client());
    let r = TokenRef {
        namespace: NS.into(),
        service_account: SA.into(),
        audience: None,
        expiration_seconds: 600,
        pod_name: "web".into(),
        pod_uid: POD.into(),
    };
    let clock = Arc::new(TestClock(Mutex::new(SystemTime::now())));
    let mut keeper = TokenKeeper::new(r, clock.clone(), Duration::ZERO);
    let Polled::Fresh(first) = rt.block_on(keeper.poll(&client)) else {
        panic!("no first token")
    };
    assert_eq!(token_requests(&api).len(), 1);
    // the fake's expiry is its own now + 600 s; the keeper reckons the
    // issue time from it
    let issued = first.issued();
    let at = |secs: u64| issued + Duration::from_secs(secs);
    for secs in [1, 300, 479, 480] {
        clock.set(at(secs));
        assert_eq!(
            rt.block_on(keeper.poll(&client)),
            Polled::Kept(None),
            "at {secs} s of 600 nothing is asked"
        );
    }
    assert_eq!(token_requests(&api).len(), 1, "no request before 80%");
    clock.set(at(481));
    let Polled::Fresh(second) = rt.block_on(keeper.poll(&client)) else {
        panic!("not renewed past 80%")
    };
    assert_ne!(second.token, first.token, "a new token");
    let reqs = token_requests(&api);
    assert_eq!(reqs.len(), 2, "renewed once");
    assert_eq!(reqs[1]["spec"]["boundObjectRef"]["uid"], POD);

    // a failed renewal keeps the valid token; an expired one is an error
    api.delete("v1", "ServiceAccount", Some(NS), SA);
    let issued = second.issued();
    clock.set(issued + Duration::from_secs(500));
    let kept = rt.block_on(keeper.poll(&client));
    assert!(matches!(kept, Polled::Kept(Some(_))), "{kept:?}");
    assert_eq!(keeper.current(), Some(&second));
    clock.set(issued + Duration::from_secs(601));
    let failed = rt.block_on(keeper.poll(&client));
    assert!(
        matches!(&failed, Polled::Failed(e) if e.to_string().contains("expired")),
        "{failed:?}"
    );
}
