//! The kernel's octal escapes in mountinfo fields, made and undone.

/// Escapes bytes the way the kernel writes paths in mountinfo: space, tab,
/// newline and backslash as three-digit octal.
pub fn escape(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if matches!(b, b' ' | b'\t' | b'\n' | b'\\') {
            out.extend_from_slice(format!("\\{b:03o}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// Undoes `\ooo` octal escapes. `None` when a backslash is not followed by
/// three octal digits of a byte value.
pub fn unescape(field: &[u8]) -> Option<Vec<u8>> {
    if !field.contains(&b'\\') {
        return Some(field.to_vec());
    }
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] != b'\\' {
            out.push(field[i]);
            i += 1;
            continue;
        }
        let digits = field.get(i + 1..i + 4)?;
        let mut v: u32 = 0;
        for &d in digits {
            if !(b'0'..=b'7').contains(&d) {
                return None;
            }
            v = v * 8 + u32::from(d - b'0');
        }
        out.push(u8::try_from(v).ok()?);
        i += 4;
    }
    Some(out)
}
