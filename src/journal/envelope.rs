//! The versioned, checksummed envelope around every value the journal
//! stores in sled (records and checkpoints).
//!
//! ```text
//! offset  size  field
//!      0     4  magic b"VMDJ"
//!      4     2  envelope format version, u16 LE (1)
//!      6     1  kind: 1 = record, 2 = checkpoint
//!      7     1  reserved, 0
//!      8     8  sequence number, u64 LE (the sled key, repeated: a value
//!               copied under the wrong key fails to verify)
//!     16     4  payload length n, u32 LE (capped before anything is allocated)
//!     20     n  payload: bincode 1.3.3 (default options) of the kind's type
//!   20+n     4  CRC-32C over (journal id, u64 LE) ++ bytes[0 .. 20+n], u32 LE
//! ```
//!
//! The journal id is a random value drawn when the journal is created and
//! kept in its meta tree. Mixing it into the checksum makes a value copied
//! from another journal fail; it is per journal, never per boot, so records
//! written before a reboot stay readable.

/// Magic at the start of every envelope.
pub const MAGIC: [u8; 4] = *b"VMDJ";
/// The envelope format this build writes.
pub const ENVELOPE_VERSION: u16 = 1;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 20;
/// Bytes after the payload.
pub const TRAILER_LEN: usize = 4;
/// Largest record payload accepted.
pub const MAX_RECORD_PAYLOAD: u32 = 1 << 20;
/// Largest checkpoint payload accepted.
pub const MAX_CHECKPOINT_PAYLOAD: u32 = 1 << 30;

/// What an envelope holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A journal record.
    Record = 1,
    /// A checkpoint.
    Checkpoint = 2,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Kind::Record),
            2 => Some(Kind::Checkpoint),
            _ => None,
        }
    }
    fn max_payload(self) -> u32 {
        match self {
            Kind::Record => MAX_RECORD_PAYLOAD,
            Kind::Checkpoint => MAX_CHECKPOINT_PAYLOAD,
        }
    }
}

/// Why an envelope did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// fewer bytes than a header and trailer
    #[error("value is {0} bytes, shorter than an empty envelope")]
    TooShort(usize),
    /// the magic is not `VMDJ`
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// a version this build cannot read
    #[error("envelope version {0} is newer than this build reads ({ENVELOPE_VERSION})")]
    UnknownVersion(u16),
    /// an unknown kind byte
    #[error("unknown kind {0}")]
    UnknownKind(u8),
    /// the kind is not the one expected at this place
    #[error("expected a {expected:?}, found a {found:?}")]
    WrongKind {
        /// expected kind
        expected: Kind,
        /// kind found
        found: Kind,
    },
    /// the length field exceeds the cap for the kind
    #[error("payload length {len} exceeds the cap of {cap}")]
    TooLong {
        /// length field
        len: u32,
        /// cap
        cap: u32,
    },
    /// the length field disagrees with the value's size
    #[error("payload length {len} does not match the value size {size}")]
    LengthMismatch {
        /// length field
        len: u32,
        /// total value size
        size: usize,
    },
    /// the checksum does not match
    #[error("checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    Checksum {
        /// stored checksum
        stored: u32,
        /// computed checksum
        computed: u32,
    },
    /// the sequence number inside differs from the key
    #[error("value carries sequence number {inside}, stored under {key}")]
    SeqMismatch {
        /// seq in the envelope
        inside: u64,
        /// seq of the key
        key: u64,
    },
}

fn checksum(journal_id: u64, bytes: &[u8]) -> u32 {
    let salt = crc32c::crc32c(&journal_id.to_le_bytes());
    crc32c::crc32c_append(salt, bytes)
}

/// Wraps `payload` in an envelope.
pub fn seal(journal_id: u64, kind: Kind, seq: u64, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + TRAILER_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&ENVELOPE_VERSION.to_le_bytes());
    out.push(kind as u8);
    out.push(0);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = checksum(journal_id, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The sequence number an envelope claims to carry, unverified: what to
/// pass to [`open`] for a value whose key does not say it (the checkpoint's).
pub fn claimed_seq(value: &[u8]) -> Option<u64> {
    value
        .get(8..16)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
}

/// Verifies an envelope stored under `key_seq` and returns its payload.
pub fn open(
    journal_id: u64,
    expected: Kind,
    key_seq: u64,
    value: &[u8],
) -> Result<&[u8], EnvelopeError> {
    if value.len() < HEADER_LEN + TRAILER_LEN {
        return Err(EnvelopeError::TooShort(value.len()));
    }
    let magic = [value[0], value[1], value[2], value[3]];
    if magic != MAGIC {
        return Err(EnvelopeError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([value[4], value[5]]);
    if version != ENVELOPE_VERSION {
        return Err(EnvelopeError::UnknownVersion(version));
    }
    let kind = Kind::from_byte(value[6]).ok_or(EnvelopeError::UnknownKind(value[6]))?;
    let len = u32::from_le_bytes([value[16], value[17], value[18], value[19]]);
    if len > kind.max_payload() {
        return Err(EnvelopeError::TooLong {
            len,
            cap: kind.max_payload(),
        });
    }
    let body_end = HEADER_LEN + len as usize;
    if value.len() != body_end + TRAILER_LEN {
        return Err(EnvelopeError::LengthMismatch {
            len,
            size: value.len(),
        });
    }
    let stored = u32::from_le_bytes([
        value[body_end],
        value[body_end + 1],
        value[body_end + 2],
        value[body_end + 3],
    ]);
    let computed = checksum(journal_id, &value[..body_end]);
    if stored != computed {
        return Err(EnvelopeError::Checksum { stored, computed });
    }
    if kind != expected {
        return Err(EnvelopeError::WrongKind {
            expected,
            found: kind,
        });
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&value[8..16]);
    let inside = u64::from_le_bytes(seq);
    if inside != key_seq {
        return Err(EnvelopeError::SeqMismatch {
            inside,
            key: key_seq,
        });
    }
    Ok(&value[HEADER_LEN..body_end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_then_open_returns_the_payload() {
        let v = seal(42, Kind::Record, 7, b"hello");
        assert_eq!(v.len(), HEADER_LEN + 5 + TRAILER_LEN);
        assert_eq!(open(42, Kind::Record, 7, &v).unwrap(), b"hello");
    }

    #[test]
    fn every_damage_is_reported_by_name() {
        let good = seal(42, Kind::Record, 7, b"hello");
        let flip = |i: usize| {
            let mut v = good.clone();
            v[i] ^= 0x01;
            v
        };
        type Check = fn(&EnvelopeError) -> bool;
        let table: Vec<(&str, Vec<u8>, u64, u64, Check)> = vec![
            ("short", good[..10].to_vec(), 42, 7, |e| {
                matches!(e, EnvelopeError::TooShort(10))
            }),
            ("magic", flip(0), 42, 7, |e| {
                matches!(e, EnvelopeError::BadMagic(_))
            }),
            ("version", flip(4), 42, 7, |e| {
                matches!(e, EnvelopeError::UnknownVersion(0))
            }),
            ("kind", flip(6), 42, 7, |e| {
                matches!(e, EnvelopeError::UnknownKind(0))
            }),
            ("payload bit", flip(21), 42, 7, |e| {
                matches!(e, EnvelopeError::Checksum { .. })
            }),
            ("crc bit", flip(good.len() - 1), 42, 7, |e| {
                matches!(e, EnvelopeError::Checksum { .. })
            }),
            ("other journal", good.clone(), 43, 7, |e| {
                matches!(e, EnvelopeError::Checksum { .. })
            }),
            ("wrong key", good.clone(), 42, 8, |e| {
                matches!(e, EnvelopeError::SeqMismatch { inside: 7, key: 8 })
            }),
            ("truncated", good[..good.len() - 1].to_vec(), 42, 7, |e| {
                matches!(e, EnvelopeError::LengthMismatch { .. })
            }),
        ];
        for (name, value, id, key, check) in table {
            let err = open(id, Kind::Record, key, &value).expect_err(name);
            assert!(check(&err), "{name}: got {err}");
        }
    }

    #[test]
    fn a_huge_length_is_refused_before_allocation() {
        let mut v = seal(1, Kind::Record, 1, b"x");
        v[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            open(1, Kind::Record, 1, &v),
            Err(EnvelopeError::TooLong { .. })
        ));
    }

    #[test]
    fn kinds_are_not_interchangeable() {
        let v = seal(1, Kind::Checkpoint, 3, b"x");
        assert!(matches!(
            open(1, Kind::Record, 3, &v),
            Err(EnvelopeError::WrongKind { .. })
        ));
    }
}
