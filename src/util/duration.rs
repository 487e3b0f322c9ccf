//! Duration flags as the kubelet spells them (`60s`, `500ms`, `5m`, `1h`):
//! one parser for every `--*-period`, `--*-timeout` and `--sync-frequency`.

use std::time::Duration;

/// A duration flag that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {value:?}: expected a duration like 60s, 500ms, 5m or 1h")]
pub struct DurationError {
    /// the flag
    pub flag: &'static str,
    /// its value
    pub value: String,
}

/// Parses `60s`, `500ms`, `5m`, `1h` (a bare number is seconds); `0s` is
/// zero, which each flag gives its own meaning or refuses.
pub fn parse_duration(flag: &'static str, value: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError {
        flag,
        value: value.to_owned(),
    };
    let v = value.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        "h" => Ok(Duration::from_secs(n.saturating_mul(3600))),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_spellings_parse_and_others_are_named() {
        let ok: [(&str, u64); 6] = [
            ("60s", 60_000),
            ("500ms", 500),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("7", 7_000),
            ("0s", 0),
        ];
        for (v, ms) in ok {
            assert_eq!(
                parse_duration("--x", v),
                Ok(Duration::from_millis(ms)),
                "{v}"
            );
        }
        for v in ["", "s", "1d", "-1s", "1.5s"] {
            let e = parse_duration("--x", v).unwrap_err();
            assert!(e.to_string().starts_with("--x"), "{e}");
        }
    }
}
