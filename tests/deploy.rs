//! What `deploy/` claims, checked against the binary and the library with
//! no cluster, no systemd and no Grafana:
//!
//! - `deploy/systemd/volumed.service`: `Type=notify`, a watchdog,
//!   `Restart=on-failure`, a `KillMode`, and an `ExecStart` whose every flag
//!   `volumed run --help` lists;
//! - `deploy/kubernetes/daemonset.yaml`, parsed into k8s-openapi types: a
//!   privileged container, `Bidirectional` propagation on the root dir's
//!   mount (the same path on the host; `plugins_registry/` inside it),
//!   `/dev` from the host, probes on the daemon's real endpoints and default
//!   address, every `args` flag one the binary accepts, and RBAC granting
//!   what a kubelet-like volume manager asks the API server for; and every
//!   document survives its typed round trip (no misspelt field ignored);
//! - `deploy/grafana/volumed.json`: every metric name in a panel's
//!   expression (and the node variable's query) is one the daemon
//!   registers (`Metrics::names`, which holds families with no series
//!   yet), and every group the dashboard promises has a panel.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_volumed");

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The long flags `volumed run --help` lists.
fn run_flags() -> BTreeSet<String> {
    let out = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_alphanumeric())
                .to_owned()
        })
        .collect()
}

/// The flag names in `args` (`--name` or `--name=value`), `run` first.
fn flags_in(args: &[String]) -> Vec<String> {
    args.iter()
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap_or_default().to_owned())
        .collect()
}

/// The value of `--name` in `args` (`--name=v` or `--name v`).
fn flag_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&format!("{name}=")) {
            Some(v)
        } else if a == name {
            args.get(i + 1).map(String::as_str)
        } else {
            None
        }
    })
}

// ---- systemd ------------------------------------------------------------

/// `Key=value` settings of a unit file, continuation lines joined.
fn unit_settings(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with(['#', ';', '['])) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        if let Some((k, v)) = pending.split_once('=') {
            out.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        pending.clear();
    }
    out
}

#[test]
fn the_systemd_unit_is_notify_with_a_watchdog_and_runs_real_flags() {
    let text = read("deploy/systemd/volumed.service");
    let settings = unit_settings(&text);
    let get = |k: &str| {
        settings
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("the unit sets no {k}"))
    };
    assert_eq!(get("Type"), "notify");
    assert_eq!(get("Restart"), "on-failure");
    assert!(
        ["mixed", "control-group"].contains(&get("KillMode")),
        "{}",
        get("KillMode")
    );
    let watchdog = get("WatchdogSec");
    assert!(
        watchdog.ends_with('s') && watchdog.trim_end_matches('s').parse::<u64>().unwrap() >= 10,
        "a watchdog of some seconds: {watchdog}"
    );
    let stop = get("TimeoutStopSec");
    assert!(
        stop.trim_end_matches('s').parse::<u64>().unwrap() >= 120,
        "a stop may wait for a CSI call's 120 s timeout: {stop}"
    );
    let exec: Vec<String> = get("ExecStart")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert!(exec[0].ends_with("/volumed"), "{exec:?}");
    assert_eq!(exec[1], "run", "{exec:?}");
    let known = run_flags();
    for f in flags_in(&exec) {
        assert!(
            known.contains(&f),
            "ExecStart uses {f}, which `volumed run` does not accept"
        );
    }
    // no sandboxing that would give the unit its own mount namespace
    for k in [
        "PrivateTmp",
        "PrivateMounts",
        "ProtectSystem",
        "ProtectHome",
    ] {
        assert!(
            !settings
                .iter()
                .any(|(key, v)| key == k && v != "no" && v != "false"),
            "{k} would hide volumed's mounts from the host"
        );
    }
}

// ---- DaemonSet ----------------------------------------------------------

/// The manifest's documents, by kind.
fn manifests() -> Vec<Value> {
    let text = read("deploy/kubernetes/daemonset.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("daemonset.yaml is YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn one<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> T {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind}");
    serde_json::from_value(found[0].clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec.template.spec.as_ref().expect("a pod template")
}

fn volumed_container(spec: &PodSpec) -> &Container {
    spec.containers
        .iter()
        .find(|c| c.name == "volumed")
        .expect("a container named volumed")
}

/// The host path behind the container path `at`: the mount whose path is
/// the longest prefix of it, with its propagation.
fn host_path_of(spec: &PodSpec, c: &Container, at: &Path) -> Option<(PathBuf, Option<String>)> {
    let mounts = c.volume_mounts.as_deref().unwrap_or_default();
    let m = mounts
        .iter()
        .filter(|m| at.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())?;
    let v = spec
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|v| v.name == m.name)?;
    let host = PathBuf::from(&v.host_path.as_ref()?.path);
    let rest = at.strip_prefix(&m.mount_path).ok()?;
    Some((host.join(rest), m.mount_propagation.clone()))
}

/// The daemon's default `--listen`, as (host, port).
fn default_listen() -> (String, i32) {
    let (host, port) = volumed::server::DEFAULT_LISTEN
        .rsplit_once(':')
        .expect("host:port");
    (host.to_owned(), port.parse().unwrap())
}

fn check_probe(what: &str, probe: Option<&HTTPGetAction>, path: &str, listen: &(String, i32)) {
    let g = probe.unwrap_or_else(|| panic!("{what}: an httpGet probe"));
    assert_eq!(g.path.as_deref(), Some(path), "{what}");
    assert_eq!(
        g.port,
        IntOrString::Int(listen.1),
        "{what}: the port volumed listens on"
    );
    assert_eq!(
        g.host.as_deref(),
        Some(listen.0.as_str()),
        "{what}: volumed listens on loopback, so the probe must go there"
    );
}

/// `doc` read as `T` and written back: what the typed object kept.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> Value {
    let typed: T = serde_json::from_value(doc.clone()).unwrap();
    serde_json::to_value(typed).unwrap()
}

/// k8s-openapi skips fields it does not know, so a misspelt one
/// (`mountPropogation`) would pass every check above by being absent:
/// every document must survive its typed round trip unchanged.
#[test]
fn every_field_of_the_manifest_is_one_kubernetes_knows() {
    use k8s_openapi::api::core::v1::Namespace;
    for doc in manifests() {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        let back = match kind.as_str() {
            "Namespace" => round_trip::<Namespace>(&doc),
            "ServiceAccount" => round_trip::<ServiceAccount>(&doc),
            "ClusterRole" => round_trip::<ClusterRole>(&doc),
            "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(&doc),
            "DaemonSet" => round_trip::<DaemonSet>(&doc),
            other => panic!("a document of an unexpected kind: {other:?}"),
        };
        assert_eq!(
            back, doc,
            "{kind}: a field was dropped or changed by its type"
        );
    }
}

#[test]
fn the_daemonset_mounts_the_root_bidirectionally_and_probes_real_endpoints() {
    let docs = manifests();
    let ds: DaemonSet = one(&docs, "DaemonSet");
    let spec = pod_spec(&ds);
    let c = volumed_container(spec);
    assert_eq!(
        c.security_context.as_ref().and_then(|s| s.privileged),
        Some(true),
        "privileged: mount(2) and mkfs need it"
    );
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("run"), "{args:?}");
    let known = run_flags();
    for f in flags_in(&args) {
        assert!(
            known.contains(&f),
            "args use {f}, which `volumed run` does not accept"
        );
    }
    // $(VAR) references resolve to the container's env
    let env: BTreeSet<&str> = c
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    for a in &args {
        if let Some((_, rest)) = a.split_once("$(") {
            let var = rest.split(')').next().unwrap_or_default();
            assert!(
                env.contains(var),
                "{a} names ${var}, which env does not set"
            );
        }
    }

    // the root dir: Bidirectional, and the same path on the host
    let root = PathBuf::from(flag_value(&args, "--root-dir").unwrap_or("/var/lib/kubelet"));
    let (host, propagation) = host_path_of(spec, c, &root).expect("the root dir is mounted");
    assert_eq!(host, root, "the root dir is the host's, at the same path");
    assert_eq!(propagation.as_deref(), Some("Bidirectional"));
    let mounts = c.volume_mounts.as_deref().unwrap_or_default();
    let root_mount = mounts
        .iter()
        .find(|m| Path::new(&m.mount_path) == root)
        .expect("a mount exactly at the root dir");
    assert_eq!(
        root_mount.mount_propagation.as_deref(),
        Some("Bidirectional")
    );
    // plugins_registry (CSI registration sockets) and the journal come
    // from the host through it
    let registry = root.join("plugins_registry");
    let (host, propagation) = host_path_of(spec, c, &registry).expect("plugins_registry");
    assert_eq!(host, registry);
    assert_eq!(propagation.as_deref(), Some("Bidirectional"));
    // block devices
    let (host, _) = host_path_of(spec, c, Path::new("/dev")).expect("/dev is mounted");
    assert_eq!(host, PathBuf::from("/dev"));

    // probes: the server's endpoints on the default address
    assert!(
        flag_value(&args, "--listen").is_none(),
        "the probes below assume the default --listen"
    );
    let listen = default_listen();
    assert_eq!(
        spec.host_network,
        Some(true),
        "a loopback listener is reachable by the kubelet's probes only on the host network"
    );
    let get =
        |p: &Option<k8s_openapi::api::core::v1::Probe>| p.as_ref().and_then(|p| p.http_get.clone());
    check_probe(
        "livenessProbe",
        get(&c.liveness_probe).as_ref(),
        volumed::server::HEALTHZ,
        &listen,
    );
    check_probe(
        "readinessProbe",
        get(&c.readiness_probe).as_ref(),
        volumed::server::READYZ,
        &listen,
    );
    if c.startup_probe.is_some() {
        check_probe(
            "startupProbe",
            get(&c.startup_probe).as_ref(),
            volumed::server::HEALTHZ,
            &listen,
        );
    }
    let ports: Vec<i32> = c
        .ports
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|p| p.container_port)
        .collect();
    assert!(
        ports.contains(&listen.1),
        "the metrics and health port is declared: {ports:?}"
    );
    assert_ne!(
        spec.host_pid,
        Some(true),
        "volumed reads only its own /proc/self and signals no other process"
    );
    assert!(
        spec.termination_grace_period_seconds.unwrap_or(30) >= 120,
        "SIGTERM waits for in-flight operations (a CSI call: 120 s)"
    );
}

/// Whether `role` grants `verb` on `resource` in `group`.
fn grants(role: &ClusterRole, group: &str, resource: &str, verb: &str) -> bool {
    role.rules.as_deref().unwrap_or_default().iter().any(|r| {
        let has = |list: &Option<Vec<String>>, want: &str| {
            list.as_deref()
                .unwrap_or_default()
                .iter()
                .any(|x| x == want || x == "*")
        };
        has(&r.api_groups, group)
            && r.resources.iter().flatten().any(|x| x == resource)
            && r.verbs.iter().any(|v| v == verb)
    })
}

#[test]
fn the_service_account_may_do_what_a_kubelet_volume_manager_does() {
    let docs = manifests();
    let ds: DaemonSet = one(&docs, "DaemonSet");
    let sa: ServiceAccount = one(&docs, "ServiceAccount");
    let role: ClusterRole = one(&docs, "ClusterRole");
    let binding: ClusterRoleBinding = one(&docs, "ClusterRoleBinding");
    let spec = pod_spec(&ds);
    assert_eq!(
        spec.service_account_name.as_deref(),
        sa.metadata.name.as_deref()
    );
    assert_eq!(sa.metadata.namespace, ds.metadata.namespace);
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    assert!(
        binding
            .subjects
            .iter()
            .flatten()
            .any(|s| s.kind == "ServiceAccount"
                && Some(&s.name) == sa.metadata.name.as_ref()
                && s.namespace == sa.metadata.namespace),
        "the binding names the DaemonSet's service account"
    );
    let mut missing = Vec::new();
    let read = ["get", "list", "watch"];
    let wants: Vec<(&str, &str, &[&str])> = vec![
        ("", "pods", &read),
        ("", "persistentvolumes", &read),
        ("", "persistentvolumeclaims", &read),
        ("", "secrets", &read),
        ("", "configmaps", &read),
        ("storage.k8s.io", "csidrivers", &read),
        ("storage.k8s.io", "volumeattachments", &read),
        ("storage.k8s.io", "csinodes", &["create", "update"]),
        ("", "nodes/status", &["patch"]),
        ("", "events", &["create", "patch"]),
        ("", "serviceaccounts/token", &["create"]),
    ];
    for (group, resource, verbs) in wants {
        for verb in verbs {
            if !grants(&role, group, resource, verb) {
                missing.push(format!("{verb} {resource} ({group:?})"));
            }
        }
    }
    assert!(missing.is_empty(), "the ClusterRole lacks: {missing:?}");
}

// ---- Grafana ------------------------------------------------------------

/// PromQL words that are not metric names: keywords, and the aggregation
/// operators (which may be followed by `by (…)` rather than `(`).
const PROMQL_WORDS: [&str; 24] = [
    "and",
    "or",
    "unless",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "by",
    "without",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
];

/// The metric names an expression reads: identifiers left once label
/// matchers `{…}`, ranges `[…]`, strings and `by`/`without (…)` lists are
/// dropped, that are neither a function call nor a PromQL word.
fn metric_names(expr: &str) -> Vec<String> {
    let mut flat = String::new();
    let mut skip_to: Option<char> = None;
    for c in expr.chars() {
        match skip_to {
            Some(end) if c == end => skip_to = None,
            Some(_) => {}
            None => match c {
                '{' => skip_to = Some('}'),
                '[' => skip_to = Some(']'),
                '"' => skip_to = Some('"'),
                _ => flat.push(c),
            },
        }
    }
    let chars: Vec<char> = flat.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = Vec::new();
    let mut i = 0;
    let mut skip_list = false;
    while i < chars.len() {
        let c = chars[i];
        if !(c.is_ascii_alphabetic() || c == '_' || c == ':') || (i > 0 && ident(chars[i - 1])) {
            if skip_list && c == '(' {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                skip_list = false;
            }
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && ident(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let next = chars[i..].iter().find(|c| !c.is_whitespace());
        let lists = [
            "by",
            "without",
            "on",
            "ignoring",
            "group_left",
            "group_right",
        ];
        if lists.contains(&word.as_str()) {
            // their label list, when one follows
            skip_list = next == Some(&'(');
        } else if next == Some(&'(') || PROMQL_WORDS.contains(&word.to_lowercase().as_str()) {
            // a function or aggregation, or a keyword
        } else {
            out.push(word);
        }
    }
    out
}

#[test]
fn the_metric_name_reader_sees_through_promql() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le, op) (rate(a_seconds_bucket{x="y{z}"}[$__rate_interval])))"#
        ),
        ["a_seconds_bucket"]
    );
    assert_eq!(
        metric_names(r#"b_used / on (pvc) b_cap > 0 and c_total == 1"#),
        ["b_used", "b_cap", "c_total"]
    );
}

/// Every panel, rows' nested panels included.
fn all_panels(panels: &Value, out: &mut Vec<Value>) {
    for p in panels.as_array().into_iter().flatten() {
        out.push(p.clone());
        all_panels(&p["panels"], out);
    }
}

#[test]
fn every_metric_the_dashboard_reads_is_one_volumed_exports() {
    let dash: Value = serde_json::from_str(&read("deploy/grafana/volumed.json"))
        .expect("deploy/grafana/volumed.json is JSON");
    let metrics = volumed::metrics::Metrics::new().unwrap();
    let registered: BTreeSet<&str> = metrics.names().iter().map(String::as_str).collect();
    let exported = |name: &str| {
        registered.contains(name)
            || ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name.strip_suffix(s).is_some_and(|b| registered.contains(b)))
    };
    let mut panels = Vec::new();
    all_panels(&dash["panels"], &mut panels);
    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    for p in &panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("every target has an expr");
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{}: reads no metric: {expr}", p["title"]);
            for n in names {
                if !exported(&n) {
                    unknown.push(format!("{}: {n}", p["title"]));
                }
                used.insert(n);
            }
        }
        if p["type"] != "row" && p["type"] != "text" {
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{}: the dashboard's data source variable",
                p["title"]
            );
        }
    }
    // the node picker's query
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = v["definition"].as_str() {
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.split(',').next())
                .unwrap_or(q);
            for n in metric_names(inner) {
                if !exported(&n) {
                    unknown.push(format!("variable {}: {n}", v["name"]));
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "the dashboard reads metrics volumed does not export: {unknown:?}"
    );
    // what the dashboard promises to show
    let families = |prefix: &str| used.iter().any(|u| u.starts_with(prefix));
    for want in [
        "volumed_plugin_operations_total",
        "storage_operation_duration_seconds_bucket",
        "volumed_reconstruct_decisions_total",
        "volumed_reconstruct_seconds",
        "csi_operations_seconds_count",
        "volume_manager_selinux_",
        "kubelet_volume_stats_",
        "kubelet_volume_stats_health_status_abnormal",
        "volume_manager_total_volumes",
        "volumed_journal_durable_seq",
        "volumed_journal_flushes_total",
    ] {
        assert!(families(want), "no panel reads {want}");
    }
}
