//! Field and label selectors: parsed from the query as the real server
//! parses them (unknown field labels refused), matched against stored JSON.

use serde_json::Value;

use super::resources::Resource;

/// A parsed `fieldSelector` and `labelSelector`, plus the namespace of the
/// request path; an object passes when every part matches.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    fields: Vec<(String, bool, String)>,
    labels: Vec<LabelReq>,
    /// Whether any selector was given (the real server then leaves out
    /// `remainingItemCount`).
    pub selective: bool,
}

#[derive(Clone, Debug)]
enum LabelReq {
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Gt(String, i64),
    Lt(String, i64),
}

impl Filter {
    /// Parses both selectors for `res`; `Err` carries the 400 message.
    pub fn parse(
        res: &Resource,
        namespace: Option<String>,
        fields: Option<&str>,
        labels: Option<&str>,
    ) -> Result<Self, String> {
        let mut f = Filter {
            namespace,
            selective: fields.is_some_and(|s| !s.is_empty())
                || labels.is_some_and(|s| !s.is_empty()),
            ..Filter::default()
        };
        for term in split_unescaped(fields.unwrap_or_default()) {
            let (key, eq, value) = if let Some((k, v)) = term.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let key = key.trim();
            if !res.has_field(key) {
                return Err(format!("field label not supported: {key}"));
            }
            f.fields.push((key.to_owned(), eq, unescape(value.trim())));
        }
        for term in split_labels(labels.unwrap_or_default())? {
            f.labels.push(parse_label(&term)?);
        }
        Ok(f)
    }

    /// Whether `obj` passes the namespace and both selectors.
    pub fn matches(&self, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        if let Some(ns) = &self.namespace
            && meta["namespace"].as_str().unwrap_or_default() != ns
        {
            return false;
        }
        let fields_ok = self
            .fields
            .iter()
            .all(|(key, eq, want)| (field_value(obj, key) == *want) == *eq);
        let labels = &meta["labels"];
        fields_ok
            && self.labels.iter().all(|r| {
                let get = |k: &str| labels.get(k).and_then(Value::as_str);
                match r {
                    LabelReq::Exists(k) => get(k).is_some(),
                    LabelReq::Absent(k) => get(k).is_none(),
                    LabelReq::In(k, vs) => get(k).is_some_and(|v| vs.iter().any(|w| w == v)),
                    LabelReq::NotIn(k, vs) => get(k).is_none_or(|v| vs.iter().all(|w| w != v)),
                    LabelReq::Gt(k, n) => get(k)
                        .and_then(|v| v.parse::<i64>().ok())
                        .is_some_and(|v| v > *n),
                    LabelReq::Lt(k, n) => get(k)
                        .and_then(|v| v.parse::<i64>().ok())
                        .is_some_and(|v| v < *n),
                }
            })
    }
}

/// The value a field label selects: strings as they are, booleans and
/// numbers printed, a missing field as the empty string (as the server's
/// field sets do).
fn field_value(obj: &Value, key: &str) -> String {
    let mut v = obj;
    for part in key.split('.') {
        v = &v[part];
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        // spec.unschedulable and spec.hostNetwork read "false" when unset
        Value::Null if key == "spec.unschedulable" || key == "spec.hostNetwork" => "false".into(),
        _ => String::new(),
    }
}

/// Splits a field selector at commas not escaped with a backslash.
fn split_unescaped(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                cur.push(c);
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            ',' => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() || !out.is_empty() {
        out.push(cur);
    }
    out.retain(|t| !t.trim().is_empty());
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Splits a label selector at commas outside parentheses.
fn split_labels(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0u32;
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1).ok_or_else(|| {
                    format!("unable to parse requirement: unbalanced ')' in {s:?}")
                })?;
            }
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if depth != 0 {
        return Err(format!(
            "unable to parse requirement: unbalanced '(' in {s:?}"
        ));
    }
    out.push(cur);
    out.retain(|t| !t.trim().is_empty());
    Ok(out)
}

fn parse_label(term: &str) -> Result<LabelReq, String> {
    let t = term.trim();
    let bad = || format!("unable to parse requirement: {t:?}");
    let key_ok = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
    };
    let set = |rest: &str| -> Result<Vec<String>, String> {
        let inner = rest
            .trim()
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(bad)?;
        Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
    };
    if let Some(k) = t.strip_prefix('!') {
        return if key_ok(k.trim()) {
            Ok(LabelReq::Absent(k.trim().to_owned()))
        } else {
            Err(bad())
        };
    }
    for (op, ctor) in [
        (
            "!=",
            (|k, v| LabelReq::NotIn(k, vec![v])) as fn(String, String) -> LabelReq,
        ),
        ("==", |k, v| LabelReq::In(k, vec![v])),
        ("=", |k, v| LabelReq::In(k, vec![v])),
    ] {
        if let Some((k, v)) = t.split_once(op) {
            return if key_ok(k.trim()) {
                Ok(ctor(k.trim().to_owned(), v.trim().to_owned()))
            } else {
                Err(bad())
            };
        }
    }
    for (op, gt) in [(">", true), ("<", false)] {
        if let Some((k, v)) = t.split_once(op) {
            let n: i64 = v.trim().parse().map_err(|_| bad())?;
            let k = k.trim().to_owned();
            return Ok(if gt {
                LabelReq::Gt(k, n)
            } else {
                LabelReq::Lt(k, n)
            });
        }
    }
    if let Some((k, rest)) = t.split_once(" notin ") {
        return Ok(LabelReq::NotIn(k.trim().to_owned(), set(rest)?));
    }
    if let Some((k, rest)) = t.split_once(" in ") {
        return Ok(LabelReq::In(k.trim().to_owned(), set(rest)?));
    }
    if key_ok(t) {
        Ok(LabelReq::Exists(t.to_owned()))
    } else {
        Err(bad())
    }
}
