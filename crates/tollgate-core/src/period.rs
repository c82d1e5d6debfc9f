//! [`Period`]: the length of a window, a refill interval or a lease; exact, from 1 ms to 1 year.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const MICROS_PER_MILLI: u64 = 1_000;
const MICROS_PER_SECOND: u64 = 1_000_000;

/// A validated duration used as a rule parameter: at least [`Period::MIN`] (1 ms), at most
/// [`Period::MAX`] (one year of 365.25 days, what `"1y"` means), in whole microseconds.
///
/// Written in configuration as `"250ms"`, `"1s"`, `"1h"`, `"7d"` (or a bare integer of
/// milliseconds).
///
/// ```
/// use tollgate_core::Period;
///
/// let p: Period = "1m 30s".parse().unwrap();
/// assert_eq!(p.as_micros(), 90_000_000);
/// assert_eq!(p.to_string(), "1m 30s");
/// assert!("0ms".parse::<Period>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Period(u64);

/// Why a duration is not a valid [`Period`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    /// Shorter than one millisecond.
    #[error("period {0:?} is shorter than the minimum of 1ms")]
    TooShort(Duration),
    /// Longer than one year.
    #[error("period {0:?} is longer than the maximum of 1 year (365.25 days)")]
    TooLong(Duration),
    /// Not a whole number of microseconds.
    #[error("period {0:?} is not a whole number of microseconds")]
    SubMicrosecond(Duration),
    /// Text that is not a duration.
    #[error(
        "invalid duration {text:?}: {reason} (write it like \"250ms\", \"1s\", \"5m\", \"1h\" or \"7d\")"
    )]
    Syntax {
        /// The text given.
        text: String,
        /// What the parser objected to.
        reason: String,
    },
}

impl Period {
    /// The shortest period: one millisecond.
    pub const MIN: Period = Period(MICROS_PER_MILLI);
    /// The longest period: one year of 365.25 days.
    pub const MAX: Period = Period(31_557_600 * MICROS_PER_SECOND);
    /// One second.
    pub const SECOND: Period = Period(MICROS_PER_SECOND);
    /// One minute.
    pub const MINUTE: Period = Period(60 * MICROS_PER_SECOND);
    /// One hour.
    pub const HOUR: Period = Period(3_600 * MICROS_PER_SECOND);
    /// One day (86,400 s).
    pub const DAY: Period = Period(86_400 * MICROS_PER_SECOND);
    /// One week (7 days).
    pub const WEEK: Period = Period(7 * 86_400 * MICROS_PER_SECOND);
    /// A 30-day month, the month of per-consumer limits.
    pub const MONTH_30_DAYS: Period = Period(30 * 86_400 * MICROS_PER_SECOND);

    /// A period of `millis` milliseconds.
    pub fn from_millis(millis: u64) -> Result<Self, PeriodError> {
        Self::try_from(Duration::from_millis(millis))
    }

    /// A period of `secs` seconds.
    pub fn from_secs(secs: u64) -> Result<Self, PeriodError> {
        Self::try_from(Duration::from_secs(secs))
    }

    /// The period in microseconds.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// The period as a [`Duration`].
    pub const fn as_duration(self) -> Duration {
        Duration::from_micros(self.0)
    }
}

impl TryFrom<Duration> for Period {
    type Error = PeriodError;

    fn try_from(d: Duration) -> Result<Self, PeriodError> {
        if !d.subsec_nanos().is_multiple_of(1_000) {
            return Err(PeriodError::SubMicrosecond(d));
        }
        let micros = u64::try_from(d.as_micros()).map_err(|_| PeriodError::TooLong(d))?;
        if micros < Period::MIN.0 {
            Err(PeriodError::TooShort(d))
        } else if micros > Period::MAX.0 {
            Err(PeriodError::TooLong(d))
        } else {
            Ok(Period(micros))
        }
    }
}

impl From<Period> for Duration {
    fn from(p: Period) -> Duration {
        p.as_duration()
    }
}

impl FromStr for Period {
    type Err = PeriodError;

    fn from_str(text: &str) -> Result<Self, PeriodError> {
        let d = humantime::parse_duration(text.trim())
            .map_err(|e| PeriodError::Syntax { text: text.to_owned(), reason: e.to_string() })?;
        Period::try_from(d)
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.as_duration()))
    }
}

impl Serialize for Period {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Period {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Period;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as \"250ms\", \"1s\" or \"1h\", or an integer of milliseconds")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Period, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Period, E> {
                Period::from_millis(v).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Period, E> {
                let v = u64::try_from(v).map_err(|_| E::custom("a period cannot be negative"))?;
                self.visit_u64(v)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_spellings() {
        for (text, micros) in [
            ("1ms", 1_000),
            ("250ms", 250_000),
            ("1s", 1_000_000),
            ("90s", 90_000_000),
            ("1h", 3_600_000_000),
            ("7d", 604_800_000_000),
            ("1y", 31_557_600_000_000),
            ("1500us", 1_500),
        ] {
            assert_eq!(text.parse::<Period>().unwrap().as_micros(), micros, "{text}");
        }
    }

    #[test]
    fn rejects_out_of_range_and_garbage() {
        assert!(matches!("999us".parse::<Period>(), Err(PeriodError::TooShort(_))));
        assert!(matches!("2y".parse::<Period>(), Err(PeriodError::TooLong(_))));
        assert!(matches!("1500ns".parse::<Period>(), Err(PeriodError::SubMicrosecond(_))));
        assert!(matches!(Period::try_from(Duration::new(1, 1)), Err(PeriodError::SubMicrosecond(_))));
        let err = "soon".parse::<Period>().unwrap_err();
        assert!(err.to_string().contains("\"soon\""), "{err}");
    }

    #[test]
    fn serde_round_trips_and_accepts_milliseconds() {
        let p: Period = serde_json::from_str("\"1h\"").unwrap();
        assert_eq!(p, Period::HOUR);
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"1h\"");
        let p: Period = serde_json::from_str("1500").unwrap();
        assert_eq!(p.as_micros(), 1_500_000);
        assert!(serde_json::from_str::<Period>("-5").is_err());
        assert!(serde_json::from_str::<Period>("0").is_err());
    }
}
