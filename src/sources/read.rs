//! Reading a manifest directory: which entries count, how a file is read,
//! how its bytes become JSON values. Shared by both static sources.
//!
//! - **Which entries.** Like the kubelet's `staticPodPath` (`pkg/kubelet/config/file.go`):
//!   names starting with `.` are skipped; no recursion (directories are
//!   skipped); symlinks are followed (the kubelet uses `stat`), so a symlink
//!   to a regular file counts and a symlink to a directory is skipped like a
//!   directory. Anything else (FIFO, socket, device, dangling symlink) is
//!   reported. We only ever *read* through a symlink.
//! - **Manifest names.** As the kubelet does, every other name is a
//!   manifest, whatever its ending (docs/cli.md, `--static-pods`: one per
//!   regular file, dotfiles skipped). A README or an editor's backup beside the manifests
//!   is read too: one that is not a pod is an error naming the file, one
//!   that is (`pod.yaml~`) is a pod of its own. Skipping names by their
//!   ending would hide a pod a kubelet ran (`pod.conf`) and have its
//!   volumes torn down.
//! - **Content decides the syntax**, not the extension: a file whose first
//!   non-blank byte is `{` is JSON, anything else is YAML (1.2 core schema
//!   plus YAML 1.1 booleans `yes`/`no`, as the kubelet's go-yaml reads them;
//!   duplicate keys are an error).
//! - **Hostile files.** A file is opened non-blocking (a FIFO swapped in after
//!   the listing cannot hang us), checked to be regular on the open handle,
//!   and read up to [`MAX_FILE_BYTES`]. YAML aliases and nesting are bounded
//!   by serde-saphyr's default budget.
//! - YAML is parsed to a `serde_json::Value` first, then into the
//!   k8s-openapi type: one path for JSON and YAML, the `kind` can be looked
//!   at before choosing a type, and the canonical JSON for the UID hash
//!   comes for free.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::SourceError;

/// Whether a directory entry's name is read as a manifest (before `stat`):
/// every name not starting with `.`.
pub(crate) fn is_manifest_name(name: &std::ffi::OsStr) -> bool {
    !name.as_encoded_bytes().starts_with(b".")
}

/// Manifests larger than this are refused (an API object is at most 1.5 MiB in etcd).
pub(crate) const MAX_FILE_BYTES: u64 = 4 << 20;

/// The cheap change signature of one entry: (name, device, inode, size,
/// mtime ns, ctime ns), from the followed metadata; zeros when `stat` failed.
pub(crate) type EntrySignature = (PathBuf, u64, u64, u64, i64, i64);

/// One listing of a directory.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Whether the directory was read completely (a missing directory is a
    /// complete, empty listing, as in the kubelet; an unreadable one is not).
    pub complete: bool,
    /// The regular files to read, sorted by path.
    pub files: Vec<PathBuf>,
    /// Entries that were refused, and a failed directory read.
    pub errors: Vec<SourceError>,
    /// The signature of every manifest-named entry, sorted: equal signatures mean
    /// nothing worth re-reading changed.
    pub signature: Vec<EntrySignature>,
    /// When the listing began (before any `stat`): a file read after it
    /// whose ctime is well before it cannot have changed unseen
    /// (`manifest_cache.rs`).
    pub started: Option<std::time::SystemTime>,
}

/// One entry's signature from its `stat` (zeros when there was none).
pub(super) fn signature_of(path: PathBuf, st: Option<&nix::sys::stat::FileStat>) -> EntrySignature {
    let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000) + n;
    match st {
        Some(st) => (
            path,
            st.st_dev,
            st.st_ino,
            u64::try_from(st.st_size).unwrap_or(0),
            ns(st.st_mtime, st.st_mtime_nsec),
            ns(st.st_ctime, st.st_ctime_nsec),
        ),
        None => (path, 0, 0, 0, 0, 0),
    }
}

/// Lists `dir` by the rules in the module doc. Each entry is `stat`ed
/// relative to the dir's handle (no walk of the whole path per entry), and
/// both lists are sorted by the paths' bytes: every entry is a child of
/// `dir`, so that is the order of their paths without a component-wise
/// comparison per step (a quiet re-list of a big pods dir is these steps).
pub(crate) fn list_dir(dir: &Path) -> Listing {
    use nix::fcntl::AtFlags;
    use nix::sys::stat::{SFlag, fstatat};
    let mut out = Listing {
        started: Some(std::time::SystemTime::now()),
        ..Listing::default()
    };
    let opened = File::open(dir).and_then(|handle| Ok((std::fs::read_dir(dir)?, handle)));
    let (entries, handle) = match opened {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            out.complete = true;
            return out;
        }
        Err(source) => {
            out.errors.push(SourceError::ListDir {
                dir: dir.to_owned(),
                cause: source,
            });
            return out;
        }
    };
    out.complete = true;
    // each entry's signature, and whether it is a file to read: sorted
    // once, both lists then taken in order
    let mut listed: Vec<(EntrySignature, bool)> = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(source) => {
                out.complete = false;
                out.errors.push(SourceError::ListDir {
                    dir: dir.to_owned(),
                    cause: source,
                });
                continue;
            }
        };
        let name = entry.file_name();
        if !is_manifest_name(&name) {
            continue;
        }
        // sized at once: `join` copies the dir, then grows it for the name
        let mut path = PathBuf::with_capacity(dir.as_os_str().len() + 1 + name.len());
        path.push(dir);
        path.push(&name);
        // through symlinks, as the kubelet's `stat`
        match fstatat(&handle, name.as_os_str(), AtFlags::empty()) {
            Ok(st) => {
                let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
                if kind != SFlag::S_IFREG && kind != SFlag::S_IFDIR {
                    out.errors
                        .push(SourceError::NotRegularFile { file: path.clone() });
                }
                listed.push((signature_of(path, Some(&st)), kind == SFlag::S_IFREG));
            }
            Err(errno) => {
                out.errors.push(SourceError::ReadFile {
                    file: path.clone(),
                    cause: std::io::Error::from(errno),
                });
                listed.push((signature_of(path, None), false));
            }
        }
    }
    listed.sort_unstable_by(|a, b| a.0.0.as_os_str().cmp(b.0.0.as_os_str()));
    out.files = listed
        .iter()
        .filter(|(_, file)| *file)
        .map(|(e, _)| e.0.clone())
        .collect();
    out.signature = listed.into_iter().map(|(e, _)| e).collect();
    out
}

/// Reads one manifest: non-blocking open, regular-file check on the handle,
/// size cap.
pub(crate) fn read_file(file: &Path) -> Result<Vec<u8>, SourceError> {
    let io = |source| SourceError::ReadFile {
        file: file.to_owned(),
        cause: source,
    };
    let f = File::options()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(file)
        .map_err(io)?;
    if !f.metadata().map_err(io)?.is_file() {
        return Err(SourceError::NotRegularFile {
            file: file.to_owned(),
        });
    }
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(SourceError::TooLarge {
            file: file.to_owned(),
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(bytes)
}

/// Parses a file's bytes into its documents (JSON: exactly one; YAML: every
/// non-empty `---` document). Empty documents are dropped.
pub(crate) fn parse_documents(file: &Path, bytes: &[u8]) -> Result<Vec<Value>, SourceError> {
    let parse = |message: String| SourceError::Parse {
        file: file.to_owned(),
        message,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| parse(format!("not UTF-8: {e}")))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim_start().starts_with('{') {
        let v: Value = serde_json::from_str(text).map_err(|e| parse(format!("JSON: {e}")))?;
        return Ok(vec![v]);
    }
    // `defaultMode: 0400` is octal (256), as the kubelet's YAML 1.1 reader
    // takes it; YAML 1.2 would read 400
    let options = serde_saphyr::options! { with_snippet: false, legacy_octal_numbers: true };
    let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options)
        .map_err(|e| parse(format!("YAML: {e}")))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The `kind` of a parsed document, `""` when absent.
pub(crate) fn kind_of(doc: &Value) -> &str {
    doc.get("kind").and_then(Value::as_str).unwrap_or("")
}

/// A JSON rendering with object keys sorted at every level, whatever
/// `serde_json` features are unified in: the input of the UID hash.
pub(crate) fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    if let Some(v) = map.get(k) {
                        write(v, out);
                    }
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_skips_dotfiles_and_dirs_and_follows_symlinks_to_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.yaml"), "x: 1").unwrap();
        std::fs::write(d.path().join("m.manifest"), "x: 1").unwrap();
        std::fs::write(d.path().join("c.json"), "{}").unwrap();
        std::fs::write(d.path().join("d.yml"), "x: 1").unwrap();
        // any ending counts, as with the kubelet
        for counted in ["README.md", "a.yaml~", "a.yaml.orig"] {
            std::fs::write(d.path().join(counted), "x: 1").unwrap();
        }
        for skipped in [".hidden.yaml", ".yaml"] {
            std::fs::write(d.path().join(skipped), "x: 1").unwrap();
        }
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/b.yaml"), "x: 1").unwrap();
        std::os::unix::fs::symlink(d.path().join("a.yaml"), d.path().join("link.yaml")).unwrap();
        std::os::unix::fs::symlink(d.path().join("sub"), d.path().join("linkdir.yaml")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", d.path().join("dangling.yaml")).unwrap();
        let l = list_dir(d.path());
        assert!(l.complete);
        let names: Vec<_> = l.files.iter().map(|p| p.file_name().unwrap()).collect();
        assert_eq!(
            names,
            [
                "README.md",
                "a.yaml",
                "a.yaml.orig",
                "a.yaml~",
                "c.json",
                "d.yml",
                "link.yaml",
                "m.manifest"
            ]
        );
        assert_eq!(l.errors.len(), 1, "{:?}", l.errors);
        assert!(l.errors[0].to_string().contains("dangling"));
    }

    #[test]
    fn a_missing_dir_is_a_complete_empty_listing() {
        let d = tempfile::tempdir().unwrap();
        let l = list_dir(&d.path().join("nope"));
        assert!(l.complete && l.files.is_empty() && l.errors.is_empty());
    }

    #[test]
    fn documents_parse_from_json_and_multi_document_yaml() {
        let f = Path::new("/x");
        let json = parse_documents(f, br#" {"kind":"Pod","a":[1,2]}"#).unwrap();
        assert_eq!(kind_of(&json[0]), "Pod");
        let yaml = parse_documents(f, b"kind: A\n---\n---\nkind: B\n").unwrap();
        assert_eq!(yaml.len(), 2);
        assert_eq!(kind_of(&yaml[1]), "B");
        let err = parse_documents(f, b"a: [1,\n").unwrap_err().to_string();
        assert!(err.starts_with("parsing /x: YAML"), "{err}");
        let err = parse_documents(f, b"a: 1\na: 2\n").unwrap_err().to_string();
        assert!(err.contains("/x"), "duplicate keys refused: {err}");
        assert!(parse_documents(f, b"\xff\xfe").is_err());
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let v: Value =
            serde_json::from_str(r#"{"b":1,"a":{"d":[{"z":1,"y":"x"}],"c":null}}"#).unwrap();
        assert_eq!(
            canonical_json(&v),
            r#"{"a":{"c":null,"d":[{"y":"x","z":1}]},"b":1}"#
        );
    }

    #[test]
    fn read_file_refuses_fifos_and_oversized_files() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(matches!(
            read_file(&fifo),
            Err(SourceError::NotRegularFile { .. })
        ));
        let big = d.path().join("big");
        let f = File::create(&big).unwrap();
        f.set_len(MAX_FILE_BYTES + 1).unwrap();
        assert!(matches!(read_file(&big), Err(SourceError::TooLarge { .. })));
    }

    #[test]
    fn alias_bombs_and_deep_nesting_fail_cleanly() {
        let f = Path::new("/x");
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let prev = (b'a' + i - 1) as char;
            let cur = (b'a' + i) as char;
            bomb.push_str(&format!("{cur}: &{cur} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
        }
        assert!(parse_documents(f, bomb.as_bytes()).is_err());
        let deep = format!("a: {}{}", "[".repeat(200_000), "]".repeat(200_000));
        assert!(parse_documents(f, deep.as_bytes()).is_err());
        let deep_json = format!("{{\"a\": {}{}}}", "[".repeat(200_000), "]".repeat(200_000));
        assert!(parse_documents(f, deep_json.as_bytes()).is_err());
    }
}
