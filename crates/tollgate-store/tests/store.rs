//! The store's behaviour, the same on both drivers: every scenario runs on a SQLite file and on
//! a fresh database of a private PostgreSQL cluster.

#[macro_use]
mod common;

use tollgate_config::PolicySpec;
use tollgate_store::{Actor, Page, Role, Store, StoreError};

fn input(limit: u64, apps: &[&str]) -> PolicySpec {
    serde_json::from_value(serde_json::json!({
        "description": "test",
        "rules": [{"algorithm": "fixed_window", "limit": limit, "period": "1m"}],
        "apps": apps,
    }))
    .unwrap()
}

async fn crud_and_optimistic_versions(store: &Store) {
    let created = store.create_policy(Actor::operator("alice"), "api", &input(10, &["shop"])).await.unwrap();
    assert_eq!((created.version, created.created_by.as_str()), (1, "alice"));
    assert!(matches!(
        store.create_policy(Actor::operator("bob"), "api", &input(1, &[])).await,
        Err(StoreError::Exists { .. })
    ));

    let got = store.get_policy("api").await.unwrap();
    assert_eq!(got, created);
    assert_eq!(got.policy().unwrap().rules.len(), 1);

    let updated =
        store.update_policy(Actor::operator("bob"), "api", &input(20, &["shop"]), Some(1)).await.unwrap();
    assert_eq!(
        (updated.version, updated.updated_by.as_str(), updated.created_by.as_str()),
        (2, "bob", "alice")
    );
    let stale = store.update_policy(Actor::operator("carol"), "api", &input(30, &["shop"]), Some(1)).await;
    assert!(matches!(stale, Err(StoreError::Stale { expected: 1, current: 2 })), "{stale:?}");
    assert!(matches!(
        store.delete_policy(Actor::operator("carol"), "api", Some(1)).await,
        Err(StoreError::Stale { .. })
    ));
    store.delete_policy(Actor::operator("carol"), "api", Some(2)).await.unwrap();
    assert!(matches!(store.get_policy("api").await, Err(StoreError::NotFound { .. })));
    assert!(matches!(
        store.update_policy(Actor::operator("x"), "api", &input(1, &[]), None).await,
        Err(StoreError::NotFound { .. })
    ));
}

async fn invalid_input_names_the_field(store: &Store) {
    let mut bad = input(0, &[]);
    match store.create_policy(Actor::operator("alice"), "bad", &bad).await {
        Err(StoreError::Invalid { field, .. }) => assert_eq!(field, "rules[0].limit"),
        other => panic!("{other:?}"),
    }
    bad = input(1, &["no spaces"]);
    assert!(
        matches!(store.create_policy(Actor::operator("alice"), "bad", &bad).await, Err(StoreError::Invalid { field, .. }) if field == "apps")
    );
    assert!(
        matches!(store.create_policy(Actor::operator("alice"), "a b", &input(1, &[])).await, Err(StoreError::Invalid { field, .. }) if field == "name")
    );
    assert!(store.all_policies().await.unwrap().is_empty(), "nothing written");
}

async fn reserve_is_stored_and_refused_for_sliding_rules(store: &Store) {
    let mut hot = input(1_000, &[]);
    hot.reserve = tollgate_limiter::Reserve::Max(8);
    store.create_policy(Actor::operator("alice"), "hot", &hot).await.unwrap();
    let record = store.get_policy("hot").await.unwrap();
    assert_eq!(record.policy().unwrap().reserve, tollgate_limiter::Reserve::Max(8));
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(json["reserve"], serde_json::json!({"max": 8}));
    // Off is the default, and not written.
    store.create_policy(Actor::operator("alice"), "cold", &input(1, &[])).await.unwrap();
    let json = serde_json::to_value(store.get_policy("cold").await.unwrap()).unwrap();
    assert!(json.get("reserve").is_none(), "{json}");

    let sliding: PolicySpec = serde_json::from_value(serde_json::json!({
        "rules": [{"algorithm": "sliding_window_log", "limit": 10, "period": "1m"}],
        "reserve": "auto",
    }))
    .unwrap();
    match store.create_policy(Actor::operator("alice"), "sliding", &sliding).await {
        Err(StoreError::Invalid { field, message }) => {
            assert_eq!(field, "reserve");
            assert!(message.contains("sliding_window_log"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

async fn pages_in_name_order(store: &Store) {
    for i in 0..7 {
        store.create_policy(Actor::operator("alice"), &format!("p{i}"), &input(1, &[])).await.unwrap();
    }
    let first = store.list_policies(&Page { after: None, limit: Some(3) }).await.unwrap();
    let names: Vec<_> = first.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["p0", "p1", "p2"]);
    let next = store.list_policies(&Page { after: Some("p2".into()), limit: Some(3) }).await.unwrap();
    assert_eq!(next.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["p3", "p4", "p5"]);
    assert_eq!(store.list_policies(&Page { after: Some("p5".into()), limit: None }).await.unwrap().len(), 1);
}

async fn tokens_are_stored_hashed(store: &Store) {
    assert_eq!(store.count_tokens().await.unwrap(), 0);
    let (token, secret) =
        store.create_token(Actor::operator("bootstrap"), "ops", Role::Admin, None).await.unwrap();
    assert!(secret.starts_with("tg_") && secret.len() == 67, "{secret}");
    assert_eq!(store.authenticate(&secret).await.unwrap(), Some(token.clone()));
    assert_eq!(store.authenticate("tg_wrong").await.unwrap(), None);
    let (viewer, viewer_secret) = store
        .create_token(Actor::operator("ops"), "shop-viewer", Role::Viewer, Some(vec!["shop".into()]))
        .await
        .unwrap();
    assert_ne!(secret, viewer_secret);
    assert_eq!(
        store.authenticate(&viewer_secret).await.unwrap().unwrap().apps,
        Some(vec!["shop".to_owned()])
    );
    assert!(viewer.may_see(&["shop".into(), "blog".into()]) && viewer.may_see(&[]));
    assert!(!viewer.may_change(&[]) && !viewer.may_change(&["shop".into(), "blog".into()]));
    assert!(viewer.may_change(&["shop".into()]));
    assert!(matches!(
        store.create_token(Actor::operator("ops"), "ops", Role::Viewer, None).await,
        Err(StoreError::Exists { .. })
    ));

    // The secret is nowhere in the audit log.
    let audit = store.audit(&Page::default()).await.unwrap();
    let text = serde_json::to_string(&audit).unwrap();
    assert!(!text.contains(&secret) && !text.contains(&viewer_secret));

    store.delete_token(Actor::operator("ops"), "shop-viewer").await.unwrap();
    assert_eq!(store.authenticate(&viewer_secret).await.unwrap(), None);
    assert_eq!(store.list_tokens(&Page::default()).await.unwrap().len(), 1);
}

async fn audit_trail_and_revision(store: &Store) {
    let start = store.revision().await.unwrap();
    store.create_policy(Actor::operator("alice"), "a", &input(1, &[])).await.unwrap();
    store.update_policy(Actor::operator("bob"), "a", &input(2, &[]), Some(1)).await.unwrap();
    store.delete_policy(Actor::operator("carol"), "a", None).await.unwrap();
    assert_eq!(store.revision().await.unwrap(), start + 3, "every change bumps the revision");
    // A refused change leaves no trace.
    let _ = store.update_policy(Actor::operator("dave"), "a", &input(3, &[]), None).await;
    assert_eq!(store.revision().await.unwrap(), start + 3);

    let audit = store.audit(&Page::default()).await.unwrap();
    let last: Vec<_> = audit.iter().take(3).map(|e| (e.action.as_str(), e.actor.as_str())).collect();
    assert_eq!(last, [("delete", "carol"), ("update", "bob"), ("create", "alice")]);
    let update = &audit[1];
    assert_eq!(update.before.as_ref().unwrap()["rules"][0]["limit"], 1);
    assert_eq!(update.after.as_ref().unwrap()["rules"][0]["limit"], 2);
    assert!(audit[0].after.is_none() && audit[2].before.is_none());
    let older = store.audit(&Page { after: Some(audit[0].id.to_string()), limit: Some(1) }).await.unwrap();
    assert_eq!(older[0].id, audit[1].id);
}

async fn concurrent_updates_of_one_version_let_one_win(store: &Store) {
    store.create_policy(Actor::operator("alice"), "race", &input(1, &[])).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .update_policy(Actor::operator(&format!("w{i}")), "race", &input(i + 2, &[]), Some(1))
                    .await
            })
        })
        .collect();
    let mut wins = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(record) => {
                wins += 1;
                assert_eq!(record.version, 2);
            }
            Err(StoreError::Stale { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(wins, 1);
    assert_eq!(store.get_policy("race").await.unwrap().version, 2);
}

async fn consumer_limits_round_trip(store: &Store) {
    let input: tollgate_store::ConsumerLimitInput = serde_json::from_value(serde_json::json!({
        "per_second": 5, "per_minute": -1, "per_hour": 100, "per_day": -1, "per_week": -1, "per_month": 1000,
        "scope": "/orders", "from": "2026-01-01T00:00:00Z", "to": "2027-01-01T00:00:00Z",
    }))
    .unwrap();
    let created = store.create_consumer_limit(Actor::operator("alice"), "acme", &input).await.unwrap();
    assert_eq!(created.from.as_deref(), Some("2026-01-01T00:00:00.000Z"));
    let listed = store.consumer_limits("acme").await.unwrap();
    assert_eq!(listed, std::slice::from_ref(&created));
    assert_eq!(store.all_consumer_limits().await.unwrap().len(), 1);

    let mut changed = input.clone();
    changed.per_second = 7;
    let stale =
        store.update_consumer_limit(Actor::operator("bob"), "acme", &created.id, &changed, Some(9)).await;
    assert!(matches!(stale, Err(StoreError::Stale { .. })));
    let updated = store
        .update_consumer_limit(Actor::operator("bob"), "acme", &created.id, &changed, Some(1))
        .await
        .unwrap();
    assert_eq!((updated.version, updated.limits.per_second), (2, 7));
    assert!(matches!(
        store.update_consumer_limit(Actor::operator("bob"), "other", &created.id, &changed, None).await,
        Err(StoreError::NotFound { .. })
    ));

    let mut bad = input.clone();
    bad.per_minute = 0;
    assert!(
        matches!(store.create_consumer_limit(Actor::operator("a"), "acme", &bad).await, Err(StoreError::Invalid { field, .. }) if field == "per_minute")
    );
    bad = input.clone();
    bad.to = Some("2025-01-01T00:00:00Z".into());
    assert!(
        matches!(store.create_consumer_limit(Actor::operator("a"), "acme", &bad).await, Err(StoreError::Invalid { field, .. }) if field == "to")
    );
    bad = input.clone();
    bad.from = Some("yesterday".into());
    assert!(
        matches!(store.create_consumer_limit(Actor::operator("a"), "acme", &bad).await, Err(StoreError::Invalid { field, .. }) if field == "from")
    );

    store.delete_consumer_limit(Actor::operator("carol"), "acme", &created.id, None).await.unwrap();
    assert!(store.consumer_limits("acme").await.unwrap().is_empty());
    let audit = store.audit(&Page::default()).await.unwrap();
    assert_eq!(audit[0].kind, tollgate_store::ItemKind::ConsumerLimit);
    assert_eq!(audit[0].action, "delete");
}

on_both_drivers!(
    crud_and_optimistic_versions,
    invalid_input_names_the_field,
    reserve_is_stored_and_refused_for_sliding_rules,
    pages_in_name_order,
    tokens_are_stored_hashed,
    audit_trail_and_revision,
    concurrent_updates_of_one_version_let_one_win,
    consumer_limits_round_trip,
);

#[tokio::test]
async fn sqlite_file_is_created_and_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("sub.db").display());
    let store = Store::connect(&url).await.unwrap();
    store.create_policy(Actor::operator("alice"), "kept", &input(1, &[])).await.unwrap();
    drop(store);
    let again = Store::connect(&url).await.unwrap();
    assert_eq!(again.get_policy("kept").await.unwrap().version, 1);
    assert!(matches!(Store::connect("mysql://x").await, Err(StoreError::Url(_))));
}
