//! The journal's read path on arbitrary bytes: the envelope as stored, and
//! (sealed with a good checksum, so the fuzzer reaches past the CRC) record
//! payloads of both formats, the v1 → v2 migration of a value, and replay.
//!
//! Input: a run of bincode values, each decoded as a record of the current
//! format (v3) and of v1; consecutive values are consecutive sequence
//! numbers. Beyond "no panic": an envelope that opens re-seals to the same
//! bytes; a decoded record encodes and decodes back to itself; a v1 value
//! migrated means what it meant before; the state replay builds survives a
//! checkpoint (encode, decode) unchanged.
#![no_main]

use bincode::Options;
use libfuzzer_sys::fuzz_target;
use volumed::journal::envelope::{self, Kind};
use volumed::journal::migrations;
use volumed::journal::record::{self, CheckpointV5, RecordV1, RecordV3};
use volumed::journal::{JournalState, SCHEMA_VERSION};

const ID: u64 = 0x766f_6c75_6d65_6421;

fuzz_target!(|data: &[u8]| {
    // the bytes as a stored value
    let seq = envelope::claimed_seq(data).unwrap_or(0);
    for kind in [Kind::Record, Kind::Checkpoint] {
        if let Ok(payload) = envelope::open(ID, kind, seq, data) {
            assert_eq!(envelope::seal(ID, kind, seq, payload), data);
        }
    }
    let _ = record::open_record(ID, seq, data);

    // the bytes as a run of payloads
    let mut state = JournalState::default();
    let mut rest = data;
    let mut seq = 0u64;
    while !rest.is_empty() && seq < 64 {
        seq += 1;
        // one value's bytes: what a v3 (else v1) record consumes, else all
        // (a reader, unlike the slice the journal decodes from, would
        // allocate whatever a length field claims: the limit stops that)
        let options = || {
            bincode::DefaultOptions::new()
                .with_fixint_encoding()
                .allow_trailing_bytes()
                .with_limit(rest.len() as u64)
        };
        let (mut c2, mut c1) = (rest, rest);
        let len = if options().deserialize_from::<_, RecordV3>(&mut c2).is_ok() {
            rest.len() - c2.len()
        } else if options().deserialize_from::<_, RecordV1>(&mut c1).is_ok() {
            rest.len() - c1.len()
        } else {
            rest.len()
        };
        let (payload, tail) = rest.split_at(len.max(1));
        rest = tail;
        let sealed = envelope::seal(ID, Kind::Record, seq, payload);

        if let Ok(rec) = record::open_record(ID, seq, &sealed) {
            let again = envelope::seal(
                ID,
                Kind::Record,
                seq,
                &record::encode(&RecordV3::from(&rec)),
            );
            assert_eq!(record::open_record(ID, seq, &again).as_ref(), Ok(&rec));
            state.apply(&rec);
        }

        let v1 = record::open_record_of(1, ID, seq, &sealed);
        match migrations::record_v1_to_v2(ID, seq, &sealed) {
            Some(v2) => match &v1 {
                Ok(rec) => assert_eq!(record::open_record_of(2, ID, seq, &v2).as_ref(), Ok(rec)),
                Err(_) => assert!(record::open_record_of(2, ID, seq, &v2).is_err()),
            },
            None => assert!(v1.is_err(), "a v1 record that opens is migrated"),
        }
    }
    let ck = record::encode(&CheckpointV5::of(&state, 7));
    let (back, through, wall, n) = record::decode_checkpoint(SCHEMA_VERSION, &ck)
        .expect("a checkpoint of a replayed state decodes");
    assert_eq!((through, wall, n), (state.last_seq(), 7, state.len()));
    assert!(back == state, "a checkpoint holds the state replay built");
});
