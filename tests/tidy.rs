//! Keeps the tree honest: every source file has a `//!` doc, every module
//! ARCHITECTURE.md names exists, mount syscalls and raw libc stay inside the
//! `host` seam, no test hides behind an ignore or should-panic attribute, and the
//! two dependency pins the journal relies on stay exact.
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
    let missing: Vec<_> = files(&["src", "migrations", "benches", "tests"])
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

#[test]
fn every_module_architecture_md_names_exists() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let map = arch
        .split("## Code map")
        .nth(1)
        .and_then(|s| s.split("### Coming").next())
        .expect("ARCHITECTURE.md has a code map");
    let names: Vec<&str> = map
        .lines()
        .filter_map(|l| l.strip_prefix("### `"))
        .filter_map(|l| l.strip_suffix('`'))
        .collect();
    assert!(names.len() >= 6, "code map lists modules: {names:?}");
    for name in names {
        let file = root().join("src").join(format!("{name}.rs"));
        let dir = root().join("src").join(name).join("mod.rs");
        assert!(
            file.exists() || dir.exists(),
            "ARCHITECTURE.md names module `{name}`, which does not exist"
        );
        let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
        assert!(
            lib.contains(&format!("pub mod {name};")),
            "`{name}` is not declared in lib.rs"
        );
    }
}

#[test]
fn mount_syscalls_and_raw_libc_stay_in_the_host_seam() {
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

/// A file's code without its tests: nothing of a `*tests.rs` file, and the
/// rest of a file from its first `#[cfg(test)]` on.
fn production_code(p: &Path) -> String {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if name.ends_with("tests.rs") {
        return String::new();
    }
    let text = std::fs::read_to_string(p).unwrap_or_default();
    match text.find("#[cfg(test)]") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
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

#[test]
fn unsafe_code_lives_only_in_the_syscall_seam() {
    let word = ["un", "safe "].concat();
    let block = ["un", "safe {"].concat();
    for p in files(&["src", "migrations"]) {
        if p == root().join("src/host/sys.rs") {
            continue;
        }
        let code: String = production_code(&p)
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        assert!(
            !code.contains(&block)
                && !code.contains(&format!("{word}fn"))
                && !code.contains(&format!("{word}impl")),
            "{} has unsafe code: it belongs in src/host/sys.rs",
            p.display()
        );
    }
}

#[test]
fn only_the_executor_runs_a_plugin_without_a_durable_intent() {
    // A plugin call needs a `Permit`; the one made without a journal
    // intent is for `--journal off`, decided in the executor.
    let off = ["Permit::", "JournalOff"].concat();
    let off_fn = ["journal", "_off()"].concat();
    for p in files(&["src"]) {
        if p == root().join("src/reconciler/executor.rs") || p == root().join("src/journal/ops.rs")
        {
            continue;
        }
        let code = production_code(&p);
        assert!(
            !code.contains(&off) && !code.contains(&off_fn),
            "{} makes a plugin permit without a durable intent",
            p.display()
        );
    }
}
