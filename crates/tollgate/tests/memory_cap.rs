//! `[memory] max_keys` on the real server (issue 18): a stranger inventing keys cannot grow the
//! memory backend past it; evictions are counted in the metrics and logged, sparingly.

mod common;

use common::Tollgate;
use serde_json::json;

const CONFIG: &str = r#"
[memory]
max_keys = 64

[policies.day]
rules = [{ algorithm = "fixed_window", limit = 5, period = "1d", align = "first_hit" }]
"#;

#[tokio::test]
async fn past_max_keys_the_oldest_windows_are_evicted_counted_and_logged_once() {
    let server = Tollgate::start(CONFIG, &[]).await;
    // A caller spends its quota: its window opened first, so it expires soonest of all.
    for _ in 0..5 {
        assert_eq!(server.check(json!({"key": "victim", "policy": "day"})).await.0, 200);
    }
    assert_eq!(server.check(json!({"key": "victim", "policy": "day"})).await.0, 429);
    // 63 more keys fill the cap; the victim keeps its count.
    for i in 0..63 {
        assert_eq!(server.check(json!({"key": format!("stranger{i}"), "policy": "day"})).await.0, 200);
    }
    assert_eq!(server.check(json!({"key": "victim", "policy": "day"})).await.0, 429);
    assert_eq!(server.metric("tollgate_memory_evictions_total").await, 0.0);
    // 100 more: each evicts the soonest-expiring key, the victim first.
    for i in 63..163 {
        assert_eq!(server.check(json!({"key": format!("stranger{i}"), "policy": "day"})).await.0, 200);
    }
    assert_eq!(server.metric("tollgate_memory_evictions_total{backend=\"memory\"}").await, 100.0);
    let logs = server.logs();
    assert_eq!(logs.matches("the memory backend is full").count(), 1, "{logs}");
    // The strangers' newest windows are intact; the victim's was forgotten.
    let (status, body) = server.check(json!({"key": "stranger162", "policy": "day", "cost": 0})).await;
    assert_eq!((status, &body["remaining"]), (200, &json!(4)), "{body}");
    assert_eq!(server.check(json!({"key": "victim", "policy": "day"})).await.0, 200);
}
