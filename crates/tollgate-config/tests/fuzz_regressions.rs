//! Inputs the `config_toml` fuzz target (fuzz/, scripts/fuzz) failed on, kept as tests. Each is
//! also under fuzz/regressions/config_toml/.

use tollgate_config::{Config, PolicySpec};
use tollgate_limiter::OnLimit;

/// A policy's spec (what the management API lists for file policies) kept a `max_wait` of
/// 1.5 ms as 1 ms: it was truncated to whole milliseconds.
#[test]
fn a_sub_millisecond_max_wait_survives_the_spec_round_trip() {
    let text = "[policies.a]\nrules = [{ algorithm = \"fixed_window\", limit = 1, period = \"1s\" }]\n\
                on_limit = \"delay\"\nmax_wait = \"1500us\"\n";
    let config = Config::from_toml(text, "max-wait-sub-millisecond.toml").unwrap();
    let policy = config.policies.get("a").unwrap();
    let wait = std::time::Duration::from_micros(1_500);
    assert_eq!(policy.on_limit, OnLimit::Delay { max_wait: wait });
    let spec = PolicySpec::of(policy);
    assert_eq!(spec.max_wait.map(|p| p.as_duration()), Some(wait));
    assert_eq!(spec.build("a").unwrap().on_limit, policy.on_limit);
}
