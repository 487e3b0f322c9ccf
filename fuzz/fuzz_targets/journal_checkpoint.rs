//! A checkpoint payload on arbitrary bytes, in both formats (sealed with a
//! good checksum, so the fuzzer reaches the decode). Beyond "no panic": a
//! state that decodes is checkpointed again to the same state; a v1
//! checkpoint migrated to v2 holds the same state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use volumed::journal::envelope::{self, Kind};
use volumed::journal::migrations;
use volumed::journal::record::{self, CheckpointV2};

const ID: u64 = 0x766f_6c75_6d65_6421;

fuzz_target!(|data: &[u8]| {
    if let Ok((state, through, wall, _)) = record::decode_checkpoint(2, data) {
        assert_eq!(state.last_seq(), through);
        let again = record::encode(&CheckpointV2::of(&state, wall));
        let (back, through2, wall2, n) =
            record::decode_checkpoint(2, &again).expect("re-encoded checkpoint decodes");
        assert_eq!((through2, wall2, n), (through, wall, state.len()));
        assert!(back == state, "a checkpoint round-trips");
    }
    let sealed = envelope::seal(ID, Kind::Checkpoint, 9, data);
    let v1 = record::decode_checkpoint(1, data);
    match migrations::checkpoint_v1_to_v2(ID, &sealed) {
        Some(v2) => {
            let payload =
                envelope::open(ID, Kind::Checkpoint, 9, &v2).expect("migrated checkpoint verifies");
            let migrated = record::decode_checkpoint(2, payload);
            match v1 {
                Ok((s1, t1, w1, n1)) => {
                    let (s2, t2, w2, n2) =
                        migrated.expect("a good v1 checkpoint migrates to a good v2 one");
                    assert_eq!((t1, w1, n1), (t2, w2, n2));
                    assert!(s1 == s2, "migration keeps the state");
                }
                Err(_) => assert!(migrated.is_err()),
            }
        }
        None => assert!(v1.is_err(), "a v1 checkpoint that decodes is migrated"),
    }
});
