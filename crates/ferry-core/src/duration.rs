//! The duration syntax of every ferry setting and flag (`ferry`'s configuration, `loadgen`).
use std::time::Duration;

/// Parses `500ms`, `30s`, `1.5s`, `5m`, `1h`, `7d` or `0s`; a bare `0` is zero (any other
/// number needs a unit, so `30` is never guessed to be seconds or milliseconds). A duration
/// too large to represent is refused, not wrapped.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; use e.g. 500ms, 30s, 5m, 1h"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        "" => return Err(format!("{s:?} has no unit; use e.g. 500ms, 30s, 5m, 1h")),
        u => {
            return Err(format!(
                "{s:?} has unknown unit {u:?}; use ms, s, m, h or d"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0.2ms").unwrap(), Duration::from_micros(200));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86_400)
        );
        assert_eq!(parse_duration(" 0 ").unwrap(), Duration::ZERO);
        assert!(parse_duration("5").unwrap_err().contains("no unit"));
        assert!(parse_duration("0.5").unwrap_err().contains("no unit"));
        assert!(parse_duration("5x").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("-1s").is_err());
        // beyond u64::MAX seconds: an error, not a panic
        assert!(parse_duration("300000000000000d")
            .unwrap_err()
            .contains("out of range"));
    }
}
