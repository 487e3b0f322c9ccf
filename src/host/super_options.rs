//! Super-block options: the last field of a mountinfo line, split on commas
//! outside double quotes, with the SELinux labels pulled out.
//!
//! SELinux prints `fscontext=`, `context=`, `defcontext=`, `rootcontext=`
//! (kernel `selinux_sb_show_options`) and wraps the label in double quotes
//! only when it contains a comma (two MCS categories), escaping `"`, `\n` and
//! `\` inside it as octal; it adds the flag `seclabel` when the filesystem
//! supports labelling. Labels are parsed into the normalised
//! [`SeLinuxContext`], so `c10,c5` compares equal to `c5,c10`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use crate::host::mountinfo::{LineErrorKind, unescape};
use crate::model::SeLinuxContext;

/// The SELinux options of a super block (security/selinux `show_sid`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeLinuxMountOptions {
    /// `context=`
    pub context: Option<SeLinuxContext>,
    /// `fscontext=`
    pub fscontext: Option<SeLinuxContext>,
    /// `defcontext=`
    pub defcontext: Option<SeLinuxContext>,
    /// `rootcontext=`
    pub rootcontext: Option<SeLinuxContext>,
    /// the `seclabel` flag: the filesystem supports labelling
    pub seclabel: bool,
    /// label options whose value did not parse, as `name=value` (lossy);
    /// the matching field above is then `None` although a label is set
    pub invalid: Vec<String>,
}

/// One super-block option, `name` or `name=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuperOption {
    /// the name (lossily decoded)
    pub name: String,
    /// the value with surrounding double quotes stripped and octal escapes undone
    pub value: Option<OsString>,
}

/// Parsed super-block options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SuperOptions {
    /// every option in order
    pub options: Vec<SuperOption>,
    /// the SELinux labels among them
    pub selinux: SeLinuxMountOptions,
}

impl SuperOptions {
    /// The value of the first option called `name`; `Some(None)` for a flag.
    pub fn get(&self, name: &str) -> Option<Option<&OsString>> {
        self.options
            .iter()
            .find(|o| o.name == name)
            .map(|o| o.value.as_ref())
    }
}

/// Splits super options on commas outside double quotes.
pub(crate) fn split_super(raw: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, &b) in raw.iter().enumerate() {
        match b {
            b'"' => quoted = !quoted,
            b',' if !quoted => {
                out.push(&raw[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&raw[start..]);
    out
}

pub(crate) fn parse_super_options(raw: &[u8], warn: &mut dyn FnMut(LineErrorKind)) -> SuperOptions {
    let mut opts = SuperOptions::default();
    for item in split_super(raw).into_iter().filter(|o| !o.is_empty()) {
        let (name, value) = match item.iter().position(|&b| b == b'=') {
            Some(eq) => (&item[..eq], Some(&item[eq + 1..])),
            None => (item, None),
        };
        let name = String::from_utf8_lossy(name).into_owned();
        let value = value.map(|v| {
            let v = v
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .unwrap_or(v);
            unescape(v).unwrap_or_else(|| v.to_vec())
        });
        let selinux = &mut opts.selinux;
        let slot = match name.as_str() {
            "seclabel" => {
                selinux.seclabel = true;
                None
            }
            "context" => Some(&mut selinux.context),
            "fscontext" => Some(&mut selinux.fscontext),
            "defcontext" => Some(&mut selinux.defcontext),
            "rootcontext" => Some(&mut selinux.rootcontext),
            _ => None,
        };
        if let (Some(slot), Some(v)) = (slot, value.as_ref()) {
            match std::str::from_utf8(v).ok().map(SeLinuxContext::parse) {
                Some(Ok(ctx)) => *slot = Some(ctx),
                _ => {
                    let shown = String::from_utf8_lossy(item).into_owned();
                    selinux.invalid.push(shown.clone());
                    warn(LineErrorKind::InvalidSeLinuxContext(shown));
                }
            }
        }
        opts.options.push(SuperOption {
            name,
            value: value.map(OsString::from_vec),
        });
    }
    opts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_outside_quotes_only() {
        let parts = |s: &str| -> Vec<String> {
            split_super(s.as_bytes())
                .into_iter()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect()
        };
        assert_eq!(parts("rw"), ["rw"]);
        assert_eq!(
            parts(r#"rw,context="a:b:c:s0:c1,c2",size=4k"#),
            ["rw", r#"context="a:b:c:s0:c1,c2""#, "size=4k"]
        );
        assert_eq!(
            parts(r#"rw,context="a,b"#),
            ["rw", r#"context="a,b"#],
            "unterminated quote runs to the end"
        );
        assert_eq!(parts(""), [""]);
    }

    #[test]
    fn label_escapes_are_undone_and_flags_kept() {
        let mut warnings = Vec::new();
        let o = parse_super_options(
            br#"rw,seclabel,rootcontext=u:r:t:s0,lowerdir=/a\054b"#,
            &mut |w| warnings.push(w),
        );
        assert!(warnings.is_empty());
        assert!(o.selinux.seclabel);
        assert_eq!(o.selinux.rootcontext.as_ref().unwrap().as_str(), "u:r:t:s0");
        assert_eq!(o.get("lowerdir"), Some(Some(&OsString::from("/a,b"))));
        assert_eq!(o.get("seclabel"), Some(None));
        assert_eq!(o.get("absent"), None);
    }
}
