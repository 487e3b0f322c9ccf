//! The mount table parser (`host::mountinfo`, super options included) on
//! arbitrary bytes. Beyond "no panic": every entry, written back the way
//! the kernel writes a line (octal escapes), parses to the same entry; the
//! table's lookups find every entry's mount point; escaping any bytes and
//! unescaping them is the identity.
#![no_main]

use std::os::unix::ffi::OsStrExt;

use libfuzzer_sys::fuzz_target;
use volumed::host::mountinfo::{MountInfo, MountTable, escape, unescape};

/// One mountinfo line for `m`, as `show_mountinfo` prints it.
fn line_of(m: &MountInfo) -> Vec<u8> {
    let mut out = format!("{} {} {} ", m.mount_id, m.parent_id, m.dev).into_bytes();
    out.extend(escape(m.root.as_os_str().as_bytes()));
    out.push(b' ');
    out.extend(escape(m.mount_point.as_os_str().as_bytes()));
    out.push(b' ');
    out.extend(m.mount_options.join(",").as_bytes());
    let p = &m.propagation;
    for (tag, v) in [
        ("shared", p.shared),
        ("master", p.master),
        ("propagate_from", p.propagate_from),
    ] {
        if let Some(v) = v {
            out.extend(format!(" {tag}:{v}").as_bytes());
        }
    }
    if p.unbindable {
        out.extend(b" unbindable");
    }
    for o in &p.other {
        out.push(b' ');
        out.extend(o.as_bytes());
    }
    out.extend(b" - ");
    out.extend(escape(m.fs_type.as_bytes()));
    out.push(b' ');
    out.extend(escape(m.source.as_bytes()));
    out.push(b' ');
    // the super options are kept exactly as read, escapes and all
    out.extend(m.super_options_raw.as_bytes());
    out.push(b'\n');
    out
}

fn canonical(p: &[u8]) -> bool {
    p == b"/"
        || (p.first() == Some(&b'/')
            && p[1..]
                .split(|&b| b == b'/')
                .all(|c| !matches!(c, b"" | b"." | b"..")))
}

fuzz_target!(|data: &[u8]| {
    let table = MountTable::parse(data);
    for m in table.entries() {
        let line = line_of(m);
        let again = MountTable::parse(&line);
        assert!(
            again.errors().is_empty(),
            "{:?}: {:?}",
            String::from_utf8_lossy(&line),
            again.errors()
        );
        assert_eq!(
            again.entries(),
            std::slice::from_ref(m),
            "{:?}",
            String::from_utf8_lossy(&line)
        );
        // The lookups promise to find paths as the kernel prints them
        // (d_path: absolute, no `//`, no trailing `/`, no `.`/`..`); a line
        // with another spelling still parses but is outside that promise.
        if !canonical(m.mount_point.as_os_str().as_bytes()) {
            continue;
        }
        let top = table
            .top_at(&m.mount_point)
            .expect("an entry's mount point is found");
        assert_eq!(top.mount_point, m.mount_point);
        assert!(table.is_mount_point(&m.mount_point));
        for under in table.under(&m.mount_point) {
            // another entry may spell the same path otherwise (`/sys//`
            // beside `/sys`): equal as paths, outside the kernel's spelling
            if !canonical(under.mount_point.as_os_str().as_bytes()) {
                continue;
            }
            assert!(
                under.mount_point.starts_with(&m.mount_point),
                "{:?} under {:?}",
                under.mount_point,
                m.mount_point
            );
            assert_ne!(under.mount_point, m.mount_point);
        }
        let _ = m.identity();
    }
    assert_eq!(unescape(&escape(data)).as_deref(), Some(data));
});
