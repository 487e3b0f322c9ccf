//! What an API server's watches send (`apiserver::Loose` objects, then
//! `sources::api::ApiState`), on arbitrary bytes: one JSON watch event per
//! line, `{"type": ADDED|MODIFIED|DELETED|RELIST|LISTED, "object": {...}}`
//! (the last two stand for kube's Init and InitDone of the object's kind).
//! Beyond "no panic": a second `take_events` right after one yields
//! nothing (every change was sent once), and every pod the DSW was told
//! of is this node's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use volumed::apiserver::Loose;
use volumed::host::sys::LinuxSys;
use volumed::sources::SourceEvent;
use volumed::sources::api::{ApiState, Change, Kind};

const NODE: &str = "fuzz-node";

fn kind_of(v: &Value) -> Option<Kind> {
    Some(match v.get("kind")?.as_str()? {
        "Pod" => Kind::Pod,
        "PersistentVolume" => Kind::PersistentVolume,
        "PersistentVolumeClaim" => Kind::PersistentVolumeClaim,
        "CSIDriver" => Kind::CsiDriver,
        "VolumeAttachment" => Kind::VolumeAttachment,
        _ => return None,
    })
}

fn change(line: &[u8]) -> Option<Change> {
    let ev: Value = serde_json::from_slice(line).ok()?;
    let obj = ev.get("object")?.clone();
    let kind = kind_of(&obj)?;
    let what = ev.get("type")?.as_str()?;
    match what {
        "RELIST" => return Some(Change::Relist(kind)),
        "LISTED" => return Some(Change::Listed(kind)),
        _ => {}
    }
    let deleted = what == "DELETED";
    if kind == Kind::Pod {
        let loose: Loose<k8s_openapi::api::core::v1::Pod> = serde_json::from_value(obj).ok()?;
        let pod = Box::new(loose.decode().ok()?);
        return Some(match deleted {
            true => Change::PodDeleted(pod),
            false => Change::PodApplied(pod),
        });
    }
    Some(match deleted {
        true => Change::Deleted(kind, obj),
        false => Change::Applied(kind, obj),
    })
}

fuzz_target!(|data: &[u8]| {
    // only `stat` of a local PV's path is asked of it (read-only)
    let sys = LinuxSys;
    let mut state = ApiState::new(NODE);
    for line in data.split(|b| *b == b'\n') {
        if let Some(c) = change(line) {
            state.apply(c);
        }
        for ev in state.take_events(&sys) {
            if let SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p) = &ev {
                assert!(p.file.starts_with("/api/v1/namespaces/"), "{:?}", p.file);
            }
        }
        assert!(state.take_events(&sys).is_empty(), "every change is sent once");
        let _ = state.take_errors();
    }
});
