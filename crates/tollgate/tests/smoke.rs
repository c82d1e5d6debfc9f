//! The first README command's promise: the built-in configuration answers at once.

mod common;

use common::Tollgate;
use serde_json::json;

#[tokio::test]
async fn builtin_configuration_answers_and_turns_200s_into_429s() {
    let server = Tollgate::start_builtin(&[]).await;
    let mut statuses = Vec::new();
    for _ in 0..11 {
        let (status, _) = server.check(json!({"key": "newcomer", "policy": "default"})).await;
        statuses.push(status);
    }
    assert_eq!(&statuses[..10], &[200; 10], "{statuses:?}");
    // The 11th within the same second is denied, unless the second turned meanwhile.
    let denied = statuses[10] == 429;
    let (status, body) = server.check(json!({"key": "newcomer", "policy": "default"})).await;
    assert!(denied || status == 429 || body["remaining"].as_u64().unwrap() < 10, "{body}");
}
