//! The patch formats: JSON merge patch (RFC 7386), also used for strategic
//! merge and apply patches (see the module doc of `apiserver` for what that
//! loses), and JSON patch (RFC 6902).

use serde_json::Value;

/// Applies an RFC 7386 merge patch to `target` in place: objects merge key
/// by key, `null` removes a key, anything else (lists included) replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Applies an RFC 6902 JSON patch (a list of operations) to a copy of
/// `target`; `Err` carries the message for a 422 (or a 400 for a malformed
/// document, which the caller cannot tell apart, so both are 422 here).
pub fn json_patch(target: &Value, ops: &Value) -> Result<Value, String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be a list of operations")?;
    let mut doc = target.clone();
    for op in ops {
        let name = op["op"].as_str().ok_or("operation without \"op\"")?;
        let path = op["path"].as_str().ok_or("operation without \"path\"")?;
        match name {
            "add" => add(&mut doc, path, value(op)?)?,
            "remove" => {
                remove(&mut doc, path)?;
            }
            "replace" => {
                remove(&mut doc, path)?;
                add(&mut doc, path, value(op)?)?;
            }
            "move" => {
                let from = op["from"].as_str().ok_or("move without \"from\"")?;
                let v = remove(&mut doc, from)?;
                add(&mut doc, path, v)?;
            }
            "copy" => {
                let from = op["from"].as_str().ok_or("copy without \"from\"")?;
                let v = doc
                    .pointer(from)
                    .cloned()
                    .ok_or(format!("no value at {from}"))?;
                add(&mut doc, path, v)?;
            }
            "test" => {
                if doc.pointer(path) != Some(&value(op)?) {
                    return Err(format!("test operation for path {path:?} failed"));
                }
            }
            other => return Err(format!("unknown JSON patch operation {other:?}")),
        }
    }
    Ok(doc)
}

fn value(op: &Value) -> Result<Value, String> {
    op.get("value")
        .cloned()
        .ok_or_else(|| "operation without \"value\"".to_owned())
}

/// Splits a JSON pointer into its parent pointer and unescaped last token.
fn split(path: &str) -> Result<(&str, String), String> {
    let i = path
        .rfind('/')
        .ok_or(format!("invalid JSON pointer {path:?}"))?;
    let last = path[i + 1..].replace("~1", "/").replace("~0", "~");
    Ok((&path[..i], last))
}

fn add(doc: &mut Value, path: &str, v: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = v;
        return Ok(());
    }
    let (parent, last) = split(path)?;
    match doc.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.insert(last, v);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse().map_err(|_| format!("bad index in {path:?}"))?
            };
            if i > a.len() {
                return Err(format!("index out of range in {path:?}"));
            }
            a.insert(i, v);
            Ok(())
        }
        _ => Err(format!("no parent object for {path:?}")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split(path)?;
    let missing = || format!("no value at {path:?}");
    match doc.pointer_mut(parent) {
        Some(Value::Object(m)) => m.remove(&last).ok_or_else(missing),
        Some(Value::Array(a)) => {
            let i: usize = last.parse().map_err(|_| missing())?;
            if i < a.len() {
                Ok(a.remove(i))
            } else {
                Err(missing())
            }
        }
        _ => Err(missing()),
    }
}
