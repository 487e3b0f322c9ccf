//! Keeps the tree honest: every source file has a `//!` doc,
//! ARCHITECTURE.md's code map and the `pub mod`s of `src/lib.rs` name the
//! same modules, mount syscalls and raw libc stay inside the `host` seam,
//! kubelet path names are spelt only in the layout module, no test hides
//! behind an ignore or should-panic attribute, host reads go through the
//! `Sys` seam (no `std::fs` outside the modules that read files of their
//! own), and the two dependency pins the journal relies on stay exact;
//! every fuzz target has its seeds.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn files(dirs: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in dirs {
        rust_files(&root().join(d), &mut out);
    }
    out.sort();
    out
}

#[test]
fn every_source_file_starts_with_a_module_doc() {
    let missing: Vec<_> = files(&[
        "src",
        "migrations",
        "benches",
        "tests",
        "testdriver",
        "slowfs",
        "fuzz/fuzz_targets",
    ])
    .into_iter()
    .filter(|p| {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        !text.trim_start().starts_with("//!")
    })
    .collect();
    assert!(
        missing.is_empty(),
        "files without a leading //! doc: {missing:?}"
    );
}

/// Every fuzz target has committed seeds, and every seed dir a target:
/// `fuzz/run-all.sh` (CI's fuzz step) runs each target `cargo fuzz list`
/// names from `fuzz/seeds/<target>/`, so a target without seeds would start
/// from nothing and a seed dir without a target would be dead weight.
#[test]
fn every_fuzz_target_has_seeds_and_a_doc() {
    let manifest = std::fs::read_to_string(root().join("fuzz/Cargo.toml")).unwrap();
    let mut targets: Vec<String> = manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|b| {
            let line = b.lines().find(|l| l.trim_start().starts_with("name"))?;
            Some(line.split('"').nth(1)?.to_owned())
        })
        .collect();
    targets.sort();
    let mut seeds: Vec<String> = std::fs::read_dir(root().join("fuzz/seeds"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    seeds.sort();
    assert!(!targets.is_empty(), "no [[bin]] in fuzz/Cargo.toml");
    assert_eq!(targets, seeds, "fuzz targets and fuzz/seeds/ dirs differ");
    for t in &targets {
        let dir = root().join("fuzz/seeds").join(t);
        let n = std::fs::read_dir(&dir).unwrap().count();
        assert!(n > 0, "{} is empty", dir.display());
        let src = root().join("fuzz/fuzz_targets").join(format!("{t}.rs"));
        assert!(src.is_file(), "{} is missing", src.display());
    }
}

/// The module names of ARCHITECTURE.md's code map: its `### \`name\``
/// headings, from `## Code map` to the next `## ` heading. A `### ` heading
/// of another shape there is an error, so a typo cannot hide a module.
fn code_map_modules() -> Vec<String> {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let (_, map) = arch
        .split_once("\n## Code map\n")
        .expect("ARCHITECTURE.md has a `## Code map` section");
    let map = map.split("\n## ").next().unwrap_or(map);
    map.lines()
        .filter(|l| l.starts_with("### "))
        .map(|l| {
            l.strip_prefix("### `")
                .and_then(|l| l.strip_suffix('`'))
                .unwrap_or_else(|| panic!("code map heading `{l}` is not \"### `module`\""))
                .to_owned()
        })
        .collect()
}

/// The `pub mod name;` lines of `src/lib.rs`.
fn lib_modules() -> Vec<String> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_code_map_and_lib_rs_name_the_same_modules() {
    let map = code_map_modules();
    let lib = lib_modules();
    assert!(lib.len() >= 6, "src/lib.rs declares modules: {lib:?}");
    for name in &map {
        assert!(
            lib.contains(name),
            "ARCHITECTURE.md's code map has `{name}`, which is not a `pub mod` of src/lib.rs"
        );
        assert_eq!(
            map.iter().filter(|m| *m == name).count(),
            1,
            "ARCHITECTURE.md's code map has `{name}` twice"
        );
    }
    for name in &lib {
        assert!(
            map.contains(name),
            "src/lib.rs declares `pub mod {name};`, which has no \"### `{name}`\" section in ARCHITECTURE.md's code map"
        );
        let file = root().join("src").join(format!("{name}.rs"));
        let dir = root().join("src").join(name).join("mod.rs");
        assert!(
            file.exists() || dir.exists(),
            "src/lib.rs declares `{name}`, but neither {} nor {} exists",
            file.display(),
            dir.display()
        );
    }
}

#[test]
fn mount_syscalls_and_raw_libc_stay_in_the_host_seam() {
    // `testdriver/` (the test CSI driver binary) is outside `src/` and
    // mounts with nix and libc's raw new-mount-API syscalls on purpose: it
    // stands in for a third-party driver, so it must not share volumed's
    // seam; `slowfs/` (the soak's slow disk, FUSE) likewise stands in for
    // the disk under the journal
    let forbidden = ["nix::mount", "libc::"];
    for p in files(&["src", "migrations"]) {
        if p.starts_with(root().join("src/host")) {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        for word in forbidden {
            assert!(
                !text.contains(word),
                "{} uses {word}: mounts and raw syscalls belong in src/host",
                p.display()
            );
        }
    }
}

#[test]
fn api_server_requests_stay_in_the_apiserver_module() {
    // ARCHITECTURE.md: every request to the API server is made in
    // src/apiserver (kube's Api handles and watcher are built nowhere else)
    let forbidden = [
        "kube::Api",
        "kube::api",
        "kube::runtime",
        "Api::<",
        "watcher(",
    ];
    for p in files(&["src"]) {
        if p.starts_with(root().join("src/apiserver")) {
            continue;
        }
        let text = production_code(&p);
        for word in forbidden {
            assert!(
                !text.contains(word),
                "{} uses {word}: API requests belong in src/apiserver",
                p.display()
            );
        }
    }
}

#[test]
fn no_test_is_ignored_or_expects_a_panic() {
    let ignore = ["#[", "ignore]"].concat();
    let should_panic = ["#[", "should_panic"].concat();
    for p in files(&["src", "tests", "migrations"]) {
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            !text.contains(&ignore),
            "{} has an ignored test",
            p.display()
        );
        assert!(
            !text.contains(&should_panic),
            "{} uses should_panic",
            p.display()
        );
    }
}

#[test]
fn journal_dependencies_are_pinned_exactly() {
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains("sled = \"=0.34.7\""),
        "sled must stay pinned to =0.34.7 (the on-disk format)"
    );
    assert!(
        cargo.contains("bincode = \"=1.3.3\""),
        "bincode must stay pinned to =1.3.3 (3.0.0 does not compile)"
    );
    assert!(!cargo.contains("serde_yaml"), "serde_yaml is deprecated");
}

/// The lines of `text` (numbered from 1) that are neither comments nor
/// inside an item under `#[cfg(test)]` (a `mod x;` line, or a block up to
/// its closing brace).
fn non_test_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t != "#[cfg(test)]" {
            out.push((i + 1, line));
            continue;
        }
        let mut depth = 0usize;
        for (_, l) in lines.by_ref() {
            depth = (depth + l.matches('{').count()).saturating_sub(l.matches('}').count());
            let t = l.trim();
            if depth == 0 && !t.starts_with("#[") && (t.ends_with(';') || t.ends_with('}')) {
                break;
            }
        }
    }
    out
}

#[test]
fn kubelet_paths_are_spelt_only_in_the_layout_module() {
    // names only the kubelet layout has; `model/layout/` builds and parses
    // every path with them (CSI's `mount` is also a syscall and a target
    // kind, so it is not among them)
    let names = [
        "kubernetes.io~",
        "\"kubernetes.io\"",
        "globalmount",
        "vol_data.json",
        "\"pods\"",
        "\"volumes\"",
        "\"plugins\"",
        "\"mounts\"",
        "\"ready\"",
    ];
    // test data spells the layout on purpose, as a node shows it
    let exempt = ["src/model/layout/mod.rs", "src/host/testgen.rs"];
    let mut found = Vec::new();
    for p in files(&["src"]) {
        let rel = p.strip_prefix(root()).unwrap_or(&p);
        let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if exempt.iter().any(|e| rel == Path::new(e)) || name.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        for (i, line) in non_test_lines(&text) {
            for n in names.iter().filter(|n| line.contains(*n)) {
                found.push(format!("{}:{i}: {n}", rel.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "kubelet path names outside src/model/layout/mod.rs (build or parse the path there):\n{}",
        found.join("\n")
    );
}

/// A file's code without its tests or comments: nothing of a `*tests.rs`
/// file, else its [`non_test_lines`].
fn production_code(p: &Path) -> String {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if name.ends_with("tests.rs") {
        return String::new();
    }
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = non_test_lines(&text).into_iter().map(|(_, l)| l).collect();
    lines.join("\n")
}

#[test]
fn the_daemon_writes_the_journal_only_through_its_typed_api() {
    // the raw appends (`append_record`, `append_record_lazy`,
    // `append_records`) are for tests, tools and the journal itself
    for p in files(&["src"]) {
        if p.starts_with(root().join("src/journal")) {
            continue;
        }
        assert!(
            !production_code(&p).contains("append_record"),
            "{} appends raw journal records: use journal::ops (begin, finish, forget, …)",
            p.display()
        );
    }
}

/// The loop's decisions: every file of `src/reconciler` but the executor
/// (which runs one job: journal, plugins) and test files.
fn decision_files() -> Vec<PathBuf> {
    let executor = root().join("src/reconciler/executor");
    files(&["src/reconciler"])
        .into_iter()
        .filter(|p| !p.starts_with(&executor))
        .filter(|p| !p.to_string_lossy().ends_with("tests.rs"))
        .collect()
}

#[test]
fn the_loops_decisions_read_no_clock_and_take_no_lock() {
    // ARCHITECTURE's invariant: the step is given `now` and the World
    let decisions = decision_files();
    assert!(
        decisions.iter().any(|p| p.ends_with("reconciler/core.rs")),
        "the core is not where this check looks: {decisions:?}"
    );
    for p in decisions {
        let code = production_code(&p);
        for call in [
            "Instant::now",
            "SystemTime::now",
            ".lock()",
            "metrics::",
            "Metrics",
        ] {
            assert!(!code.contains(call), "{} uses {call}", p.display());
        }
    }
}

#[test]
fn every_file_that_implements_the_core_is_a_decision_file() {
    // an `impl Core` outside `decision_files` would escape the check above
    let decisions = decision_files();
    for p in files(&["src"]) {
        if production_code(&p).contains("impl Core {") {
            assert!(
                decisions.contains(&p),
                "{} implements the loop's core outside src/reconciler",
                p.display()
            );
        }
    }
}

/// The library's layers, bottom-up: a module uses only modules of its own
/// layer or below (ARCHITECTURE.md's "Bird's eye"). Within a layer the
/// modules stand side by side. The binary (`src/cli/`) sits on top.
const LAYERS: &[&[&str]] = &[
    &["model", "util", "failpoint"],
    &["state", "journal", "host"],
    &[
        "plugins",
        "csi",
        "selinux",
        "sources",
        "reconstruct",
        "metrics",
        "dump",
        "runtime",
    ],
    &["reconciler"],
    &["health", "apiserver", "server"],
    &["daemon"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

#[test]
fn no_module_reaches_up_a_layer() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .filter_map(|l| l.strip_suffix(';'))
        .collect();
    for m in &modules {
        assert!(
            layer_of(m).is_some(),
            "lib.rs's `{m}` has no layer in LAYERS"
        );
    }
    let mut up = Vec::new();
    for m in &modules {
        let here = layer_of(m).unwrap_or(0);
        let dir = root().join("src").join(m);
        let paths = if dir.is_dir() {
            files(&[&format!("src/{m}")])
        } else {
            vec![root().join("src").join(format!("{m}.rs"))]
        };
        for p in paths {
            for line in production_code(&p).lines() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                if line.contains("crate::{") {
                    up.push(format!(
                        "{}: a grouped `crate::{{…}}` import hides its modules from this check",
                        p.display()
                    ));
                }
                for (at, _) in line.match_indices("crate::") {
                    let used: String = line[at + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if let Some(there) = layer_of(&used)
                        && there > here
                    {
                        up.push(format!("{} uses crate::{used}", p.display()));
                    }
                }
            }
        }
    }
    assert!(up.is_empty(), "arrows up a layer:\n{}", up.join("\n"));
}

#[test]
fn waiting_for_a_held_journal_lives_only_in_the_journal() {
    // one wait policy (`journal/held.rs`): nobody else retries sled's lock
    for p in files(&["src"]) {
        if p.starts_with(root().join("src/journal")) {
            continue;
        }
        let code = production_code(&p);
        for word in ["could not acquire lock", "Category::Busy"] {
            assert!(
                !code.contains(word),
                "{} waits for a held journal ({word}): use Journal::open_or_ask or the config's lock_wait",
                p.display()
            );
        }
    }
}

#[test]
fn unsafe_code_lives_only_in_the_syscall_seam() {
    let word = ["un", "safe "].concat();
    let block = ["un", "safe {"].concat();
    let attribute = ["#[un", "safe("].concat();
    // The one exception: jemalloc reads its options from a symbol the
    // binary exports (a library's export would reach the benches too).
    let conf_export = format!("{attribute}export_name = \"_rjem_malloc_conf\")]");
    for p in files(&["src", "migrations"]) {
        if p.starts_with(root().join("src/host/sys")) {
            continue;
        }
        let mut code = production_code(&p);
        if p == root().join("src/cli/main.rs") {
            assert_eq!(code.matches(&conf_export).count(), 1, "{conf_export}");
            code = code.replace(&conf_export, "");
        }
        assert!(
            !code.contains(&block)
                && !code.contains(&format!("{word}fn"))
                && !code.contains(&format!("{word}impl"))
                && !code.contains(&attribute),
            "{} has unsafe code: it belongs in src/host/sys/",
            p.display()
        );
    }
}

#[test]
fn only_the_executor_runs_a_plugin_without_a_durable_intent() {
    // A plugin call needs a `Permit`; the one made without a journal
    // intent is for `--journal off`, decided in the executor.
    let off = ["Permit::", "JournalOff"].concat();
    for p in files(&["src"]) {
        if p == root().join("src/reconciler/executor/mod.rs")
            || p == root().join("src/journal/ops.rs")
        {
            continue;
        }
        let code = production_code(&p);
        assert!(
            !code.contains(&off),
            "{} makes a plugin permit without a durable intent",
            p.display()
        );
    }
}

/// Whether a line of code names `std::fs` (a path or an import), not
/// counting the `std::os::unix::fs` extension traits.
fn names_std_fs(line: &str) -> bool {
    if line.contains("std::fs") {
        return true;
    }
    let imports = line.trim_start().starts_with("use std::{");
    line.match_indices("fs::").any(|(i, _)| {
        let before = &line[..i];
        let ident = before
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident && !before.ends_with("unix::") && !before.ends_with("::")
    }) || (imports
        && line
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .any(|w| w == "fs"))
}

#[test]
fn host_state_is_read_only_through_the_seam() {
    // Who may use std::fs, and why: `host` is the seam (and reads captured
    // mount tables and the boot id); `journal` owns its files; `sources`
    // read the manifest folders, `server/daemon_file.rs` the daemon file,
    // `server/api_socket.rs` places the runtime API's socket, and
    // `selinux/host.rs` `/etc/selinux`: inputs and configuration, not host
    // mount state; `reconstruct/inspect.rs` copies a journal for the dry
    // run; `cli/` is the binary's edge; `failpoint.rs` writes the
    // hold's marker for the test (only with `--features failpoints`).
    let allowed = [
        "src/host/",
        "src/journal/",
        "src/sources/",
        "src/server/daemon_file.rs",
        "src/server/api_socket.rs",
        "src/selinux/host.rs",
        "src/reconstruct/inspect.rs",
        "src/cli/",
        "src/failpoint.rs",
    ];
    let mut found = Vec::new();
    for p in files(&["src"]) {
        let rel = p.strip_prefix(root()).unwrap_or(&p);
        if allowed.iter().any(|a| rel.to_string_lossy().starts_with(a)) {
            continue;
        }
        for line in production_code(&p).lines() {
            if names_std_fs(line) {
                found.push(format!("{}: {}", rel.display(), line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "std::fs outside the modules allowed it (read the host through host::sys::Sys):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_std_fs_check_sees_paths_and_imports() {
    for hit in [
        "let x = std::fs::read(p);",
        "use std::fs;",
        "fs::canonicalize(p)",
        "use std::{fs, io};",
    ] {
        assert!(names_std_fs(hit), "{hit}");
    }
    for miss in [
        "use std::os::unix::fs::MetadataExt;",
        "selinuxfs::x",
        "// fs::read",
    ] {
        assert!(!names_std_fs(miss) || miss.starts_with("//"), "{miss}");
    }
}

/// A field named `source` is the error's source to thiserror, and `{:#}`
/// (anyhow at the binary's edge) prints every source after the message: a
/// message that also writes `{source}` prints its cause twice. Leaf causes
/// are named `cause` and printed inline; a `source` is left to the chain.
#[test]
fn no_error_message_prints_its_source_inline() {
    let mut twice = Vec::new();
    for p in files(&["src"]) {
        for (n, line) in non_test_lines(&std::fs::read_to_string(&p).unwrap()) {
            if line.trim_start().starts_with("#[error(") && line.contains("{source}") {
                twice.push(format!("{}:{n}", p.display()));
            }
        }
    }
    assert!(
        twice.is_empty(),
        "messages print their source inline: {twice:?}"
    );
}
