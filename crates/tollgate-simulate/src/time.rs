//! Simulated time: microseconds, the round steps buckets and ticks are cut at, and how
//! durations are written.

use crate::traffic::format_micros;

/// One second, in the simulation's unit (microseconds).
pub(crate) const SECOND: u64 = 1_000_000;

/// Round bucket (and axis tick) sizes, in microseconds.
pub(crate) const ROUND_STEPS: [u64; 27] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    SECOND,
    2 * SECOND,
    5 * SECOND,
    10 * SECOND,
    15 * SECOND,
    30 * SECOND,
    60 * SECOND,
    2 * 60 * SECOND,
    5 * 60 * SECOND,
    10 * 60 * SECOND,
    15 * 60 * SECOND,
    30 * 60 * SECOND,
    3_600 * SECOND,
    2 * 3_600 * SECOND,
    6 * 3_600 * SECOND,
    12 * 3_600 * SECOND,
    86_400 * SECOND,
    7 * 86_400 * SECOND,
];

/// The smallest round step that cuts `span` into at most `most` pieces.
pub(crate) fn round_step(span: u64, most: u64) -> u64 {
    ROUND_STEPS.into_iter().find(|&step| span.div_ceil(step) <= most).unwrap_or(30 * 86_400 * SECOND)
}

/// Seconds as a compact duration: `1m30s`, `250ms`.
pub(crate) fn seconds(s: f64) -> String {
    format_micros((s * SECOND as f64).round() as u64).replace(' ', "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_round_and_few() {
        assert_eq!(round_step(120 * SECOND, 120), SECOND);
        assert_eq!(round_step(10 * SECOND, 120), 100_000);
        assert_eq!(round_step(180 * SECOND, 120), 2 * SECOND);
        assert_eq!(round_step(3_600 * SECOND, 120), 30 * SECOND);
        assert_eq!(round_step(1_000, 120), 1_000);
    }
}
