//! Time as volumed writes it: UTC calendar dates from Unix time, for the
//! stamps it writes (the kubelet's payload dir names) and prints (`dump`),
//! without a date crate; and durations in milliseconds for the startup
//! phase lines.

/// (year, month, day) of a count of days since 1970-01-01 (Howard
/// Hinnant's civil-from-days, for non-negative days).
pub fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// (year, month, day, hour, minute, second) in UTC of seconds since the
/// Unix epoch.
pub fn utc(secs: u64) -> (u64, u64, u64, u64, u64, u64) {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A duration in milliseconds to 0.1 ms, as the startup phase lines carry
/// it: `phase=<name> elapsed_ms=<n>`, the shape `benches/scale.rs` parses.
pub fn elapsed_ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_seconds_become_the_calendar_date() {
        for (days, want) in [
            (0, (1970, 1, 1)),
            (11_016, (2000, 2, 29)),
            (20_783, (2026, 11, 26)),
            (47_541, (2100, 3, 1)),
        ] {
            assert_eq!(civil_from_days(days), want, "day {days}");
        }
        assert_eq!(utc(20_783 * 86_400 + 3_723), (2026, 11, 26, 1, 2, 3));
    }
}
