//! The parser of one mountinfo line into a [`MountInfo`].

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use super::{LineErrorKind, MountInfo, Propagation, unescape};
use crate::host::super_options::parse_super_options;
use crate::model::DevId;

fn number(field: Option<&[u8]>, what: &'static str) -> Result<u32, LineErrorKind> {
    let f = field.ok_or(LineErrorKind::MissingField(what))?;
    if f.is_empty() || f.len() > 10 || !f.iter().all(u8::is_ascii_digit) {
        return Err(LineErrorKind::BadNumber(what));
    }
    let mut v: u64 = 0;
    for &d in f {
        v = v * 10 + u64::from(d - b'0');
    }
    u32::try_from(v).map_err(|_| LineErrorKind::BadNumber(what))
}

fn device(field: Option<&[u8]>) -> Result<DevId, LineErrorKind> {
    let f = field.ok_or(LineErrorKind::MissingField("device"))?;
    let colon = f
        .iter()
        .position(|&b| b == b':')
        .ok_or(LineErrorKind::BadDevice)?;
    let num = |s: &[u8]| number(Some(s), "device").map_err(|_| LineErrorKind::BadDevice);
    Ok(DevId {
        major: num(&f[..colon])?,
        minor: num(&f[colon + 1..])?,
    })
}

fn unescaped(field: Option<&[u8]>, what: &'static str) -> Result<Vec<u8>, LineErrorKind> {
    let f = field.ok_or(LineErrorKind::MissingField(what))?;
    let bytes = unescape(f).ok_or(LineErrorKind::BadEscape(what))?;
    // `\000` spells the NUL the raw-line check refuses: no path holds one
    // (the kernel never prints it), and a path with one cannot reach a syscall
    if bytes.contains(&0) {
        return Err(LineErrorKind::NulByte);
    }
    Ok(bytes)
}

fn path(field: Option<&[u8]>, what: &'static str) -> Result<PathBuf, LineErrorKind> {
    let bytes = unescaped(field, what)?;
    if bytes.is_empty() {
        return Err(LineErrorKind::MissingField(what));
    }
    Ok(PathBuf::from(OsString::from_vec(bytes)))
}

fn optional_field(f: &[u8], prop: &mut Propagation) -> Result<(), LineErrorKind> {
    let bad = || LineErrorKind::BadOptionalField(String::from_utf8_lossy(f).into_owned());
    if f == b"unbindable" {
        prop.unbindable = true;
        return Ok(());
    }
    let Some(colon) = f.iter().position(|&b| b == b':') else {
        prop.other.push(String::from_utf8_lossy(f).into_owned());
        return Ok(());
    };
    let (tag, val) = (&f[..colon], &f[colon + 1..]);
    let slot = match tag {
        b"shared" => &mut prop.shared,
        b"master" => &mut prop.master,
        b"propagate_from" => &mut prop.propagate_from,
        _ => {
            prop.other.push(String::from_utf8_lossy(f).into_owned());
            return Ok(());
        }
    };
    *slot = Some(number(Some(val), "optional field").map_err(|_| bad())?);
    Ok(())
}

pub(super) fn parse_line(
    line: &[u8],
    warn: &mut dyn FnMut(LineErrorKind),
) -> Result<MountInfo, LineErrorKind> {
    if line.is_empty() {
        return Err(LineErrorKind::EmptyLine);
    }
    if line.contains(&0) {
        return Err(LineErrorKind::NulByte);
    }
    let mut fields = line.split(|&b| b == b' ');
    let mount_id = number(fields.next(), "mount id")?;
    let parent_id = number(fields.next(), "parent id")?;
    let dev = device(fields.next())?;
    let root = path(fields.next(), "root")?;
    let mount_point = path(fields.next(), "mount point")?;
    let opts = fields
        .next()
        .filter(|f| !f.is_empty())
        .ok_or(LineErrorKind::MissingField("mount options"))?;
    let mount_options = opts
        .split(|&b| b == b',')
        .map(|o| String::from_utf8_lossy(o).into_owned())
        .collect();
    let mut propagation = Propagation::default();
    loop {
        let f = fields.next().ok_or(LineErrorKind::MissingSeparator)?;
        if f == b"-" {
            break;
        }
        optional_field(f, &mut propagation)?;
    }
    let fs_type = unescaped(fields.next(), "fs type")?;
    if fs_type.is_empty() {
        return Err(LineErrorKind::MissingField("fs type"));
    }
    let source = unescaped(fields.next(), "source")?;
    // The super options are the rest of the line; a filesystem that prints a
    // raw space in them must not cost us the entry.
    let rest: Vec<&[u8]> = fields.collect();
    if rest.is_empty() {
        return Err(LineErrorKind::MissingField("super options"));
    }
    let super_raw = rest.join(&b' ');
    Ok(MountInfo {
        mount_id,
        parent_id,
        dev,
        root,
        mount_point,
        mount_options,
        propagation,
        fs_type: String::from_utf8_lossy(&fs_type).into_owned(),
        source: OsString::from_vec(source),
        super_options: parse_super_options(&super_raw, warn),
        super_options_raw: OsString::from_vec(super_raw),
    })
}
