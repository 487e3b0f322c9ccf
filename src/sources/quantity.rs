//! Kubernetes `Quantity` strings (`1Gi`, `500M`, `1.5Ki`, `1e3`, `2048`)
//! as a whole number of bytes, for emptyDir `sizeLimit`.
//!
//! Follows `k8s.io/apimachinery/pkg/api/resource`: a signed decimal number,
//! then a binary suffix (`Ki Mi Gi Ti Pi Ei`), a decimal suffix
//! (`m`, none, `k M G T P E`) or an exponent (`e3`, `E-2`). A fractional
//! result is rounded *up* to a whole byte, as `Quantity.Value()` does.
//! Refused: negative values (a size limit cannot be negative), values above
//! `i64::MAX` (the Go type's range), anything else malformed. No floating
//! point is involved.

/// Parses a quantity into bytes; the error says what is wrong.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let bad = |why: &str| Err(format!("invalid quantity {s:?}: {why}"));
    let t = s.trim();
    let (negative, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(num_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return bad("no number");
    }
    if frac_part.contains('.') {
        return bad("more than one decimal point");
    }
    // (power of two, power of ten) the suffix multiplies by
    let (pow2, pow10): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        _ => match suffix
            .strip_prefix(['e', 'E'])
            .and_then(|e| e.parse::<i32>().ok())
        {
            Some(e) if (-40..=40).contains(&e) => (0, e),
            _ => return bad("unknown suffix"),
        },
    };
    if int_part.len() + frac_part.len() > 30 {
        return bad("too many digits");
    }
    let digits = format!("{int_part}{frac_part}");
    let Ok(mantissa) = digits.parse::<u128>() else {
        return bad("not a number");
    };
    if negative && mantissa != 0 {
        return bad("negative");
    }
    let Ok(frac_len) = i32::try_from(frac_part.len()) else {
        return bad("too many digits");
    };
    let exp10 = pow10 - frac_len;
    let scaled = mantissa.checked_mul(1u128 << pow2);
    let value = scaled.and_then(|m| {
        if exp10 >= 0 {
            m.checked_mul(10u128.checked_pow(exp10.unsigned_abs())?)
        } else {
            let div = 10u128.checked_pow(exp10.unsigned_abs())?;
            Some(m.div_ceil(div))
        }
    });
    match value.and_then(|v| i64::try_from(v).ok()) {
        Some(v) => Ok(v.unsigned_abs()),
        None => bad("larger than 2^63-1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_binary_decimal_and_plain_bytes() {
        let table = [
            ("0", 0),
            ("2048", 2048),
            ("1Ki", 1024),
            ("64Mi", 64 << 20),
            ("1Gi", 1 << 30),
            ("2Ti", 2 << 40),
            ("1Pi", 1 << 50),
            ("1k", 1000),
            ("500M", 500_000_000),
            ("3G", 3_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1.5Gi", 1_610_612_736),
            ("0.5Ki", 512),
            ("1500m", 2),
            ("1e3", 1000),
            ("1E6", 1_000_000),
            ("+1k", 1000),
            (".5k", 500),
            ("1.0001", 2),
            ("-0", 0),
        ];
        for (input, want) in table {
            assert_eq!(parse_bytes(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn malformed_negative_and_huge_quantities_are_refused() {
        for bad in [
            "",
            "Gi",
            "1Gb",
            "1 Gi",
            "-1Gi",
            "1.2.3",
            "abc",
            "1Zi",
            "16Ei",
            "1e40",
            "1e-x",
            "99999999999999999999999999999999",
        ] {
            let err = parse_bytes(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }
}
