//! Rate-limit response headers: the de-facto `X-RateLimit-*` trio, `Retry-After`, and the IETF
//! draft's (draft-ietf-httpapi-ratelimit-headers) `RateLimit-Policy` and `RateLimit` structured
//! fields, one item per rule. They are `tollgate-tower`'s, so the server and the middleware
//! answer alike; the server adds the millisecond rounding of its JSON bodies.

use std::time::Duration;

pub use tollgate_tower::headers::{ceil_secs, rate_limit_headers, rule_name};

/// Whole milliseconds in `d`, rounded up.
pub fn ceil_millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    u64::try_from(ms + u128::from(!d.as_nanos().is_multiple_of(1_000_000))).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;
    use tollgate_config::ResetHeader;
    use tollgate_core::{ManualClock, MemoryBackend, Operation, Period, Rule, RuleSet};

    #[test]
    fn rounding_is_up() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_millis(Duration::from_micros(1)), 1);
        assert_eq!(ceil_millis(Duration::from_micros(2001)), 3);
    }

    #[test]
    fn one_item_per_rule_and_retry_after_at_least_one() {
        let rules = RuleSet::new([
            Rule::fixed_window(2, Period::SECOND).named("sec\"ond"),
            Rule::token_bucket(10, 5, Period::SECOND),
            Rule::concurrency(3, Period::MINUTE),
        ])
        .unwrap();
        let backend = MemoryBackend::with_clock(ManualClock::at_wall_clock_second());
        let mut d = backend.execute_now("k", &rules, Operation::Check { cost: 0 }).unwrap();
        for _ in 0..3 {
            d = backend
                .execute_now(
                    "k",
                    &rules,
                    Operation::Acquire { cost: 1, lease: &tollgate_core::LeaseId::random() },
                )
                .unwrap();
        }
        assert!(!d.allowed());
        let mut h = HeaderMap::new();
        rate_limit_headers(&mut h, &rules, &d, ResetHeader::Delta, true);
        assert_eq!(
            h["ratelimit-policy"],
            r#""sec\"ond";q=2;w=1, "token_bucket.1";q=10;w=2, "concurrency.2";q=3"#
        );
        assert_eq!(
            h["ratelimit"],
            r#""sec\"ond";r=0;t=1, "token_bucket.1";r=8;t=1, "concurrency.2";r=1;t=60"#
        );
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["retry-after"], "1");
    }
}
