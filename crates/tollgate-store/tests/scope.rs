//! Issue 18: the store checks an actor's apps against the row it changes, inside the change's
//! own transaction. Every scenario runs on a SQLite file and on a private PostgreSQL.

#[macro_use]
mod common;

use sqlx::Connection;
use tollgate_config::PolicySpec;
use tollgate_store::{Actor, ConsumerLimitInput, MAX_PAGE, Page, Role, Store, StoreError};
use tollgate_testkit::PostgresServer;

fn input(limit: u64, apps: &[&str]) -> PolicySpec {
    serde_json::from_value(serde_json::json!({
        "rules": [{"algorithm": "fixed_window", "limit": limit, "period": "1m"}],
        "apps": apps,
    }))
    .unwrap()
}

fn apps(names: &[&str]) -> Option<Vec<String>> {
    Some(names.iter().map(|a| (*a).to_owned()).collect())
}

fn out_of_scope<T: std::fmt::Debug>(result: Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::OutOfScope { .. }))
}

/// The issue's attack: a scoped admin that made more than a page of tokens revoked an
/// unrestricted admin, because the check looked the target up in the first page only.
async fn a_scoped_admin_cannot_delete_a_token_beyond_its_apps_past_the_first_page(store: &Store) {
    let operator = Actor::operator("bootstrap");
    let (_, root_secret) = store.create_token(operator, "zz-root", Role::Admin, None).await.unwrap();
    store.create_token(operator, "zz-both", Role::Viewer, apps(&["shop", "blog"])).await.unwrap();
    store.create_token(operator, "zz-blog", Role::Admin, apps(&["blog"])).await.unwrap();
    let (shop_admin, _) =
        store.create_token(operator, "shop-admin", Role::Admin, apps(&["shop"])).await.unwrap();
    for i in 0..=MAX_PAGE {
        store
            .create_token(shop_admin.actor(), &format!("shop-{i:03}"), Role::Viewer, apps(&["shop"]))
            .await
            .unwrap();
    }
    let first_page = store.list_tokens(&Page { after: None, limit: Some(MAX_PAGE) }).await.unwrap();
    assert!(first_page.iter().all(|t| !t.name.starts_with("zz-")), "the targets are past the first page");

    for target in ["zz-root", "zz-both", "zz-blog"] {
        let refused = store.delete_token(shop_admin.actor(), target).await;
        assert!(out_of_scope(refused), "{target}");
    }
    assert!(store.authenticate(&root_secret).await.unwrap().is_some(), "the unrestricted admin is kept");
    assert_eq!(store.count_tokens().await.unwrap(), 4 + i64::from(MAX_PAGE) + 1);
    // Within its apps, it still may.
    store.delete_token(shop_admin.actor(), "shop-200").await.unwrap();
    assert!(matches!(
        store.delete_token(shop_admin.actor(), "nobody").await,
        Err(StoreError::NotFound { .. })
    ));
    // Nor may it mint a token beyond its apps.
    for reach in [None, apps(&["blog"]), apps(&["shop", "blog"])] {
        assert!(out_of_scope(store.create_token(shop_admin.actor(), "escalate", Role::Admin, reach).await));
    }
}

async fn policy_writes_are_checked_against_the_stored_row(store: &Store) {
    let operator = Actor::operator("root");
    store.create_policy(operator, "shop-p", &input(1, &["shop"])).await.unwrap();
    store.create_policy(operator, "blog-p", &input(1, &["blog"])).await.unwrap();
    store.create_policy(operator, "global-p", &input(1, &[])).await.unwrap();
    let (shop_editor, _) =
        store.create_token(operator, "shop-editor", Role::Editor, apps(&["shop"])).await.unwrap();
    let editor = shop_editor.actor();

    assert!(out_of_scope(store.create_policy(editor, "new-blog", &input(1, &["blog"])).await));
    assert!(out_of_scope(store.create_policy(editor, "new-global", &input(1, &[])).await));
    assert!(out_of_scope(store.update_policy(editor, "blog-p", &input(2, &["shop"]), None).await));
    assert!(out_of_scope(store.update_policy(editor, "global-p", &input(2, &["shop"]), None).await));
    assert!(out_of_scope(store.update_policy(editor, "shop-p", &input(2, &["blog"]), None).await));
    assert!(out_of_scope(store.update_policy(editor, "shop-p", &input(2, &["shop", "blog"]), None).await));
    assert!(out_of_scope(store.delete_policy(editor, "blog-p", None).await));
    // The scope is judged before the version and the input: a stale version or a bad body on
    // another app's policy is still a refusal of scope.
    assert!(out_of_scope(store.update_policy(editor, "blog-p", &input(2, &["blog"]), Some(9)).await));
    assert!(out_of_scope(store.update_policy(editor, "blog-p", &input(0, &["blog"]), None).await));
    assert!(out_of_scope(store.delete_policy(editor, "blog-p", Some(9)).await));
    // Nothing changed, nothing audited beyond the three creations and the token's.
    for name in ["shop-p", "blog-p", "global-p"] {
        assert_eq!(store.get_policy(name).await.unwrap().version, 1, "{name}");
    }
    assert_eq!(store.audit(&Page::default()).await.unwrap().len(), 4);

    // Within its apps.
    store.update_policy(editor, "shop-p", &input(2, &["shop"]), Some(1)).await.unwrap();
    store.delete_policy(editor, "shop-p", Some(2)).await.unwrap();

    // Consumer limits belong to no app: unrestricted actors only.
    let limits: ConsumerLimitInput = serde_json::from_value(serde_json::json!({
        "per_second": 5, "per_minute": -1, "per_hour": -1, "per_day": -1, "per_week": -1, "per_month": -1,
    }))
    .unwrap();
    assert!(out_of_scope(store.create_consumer_limit(editor, "acme", &limits).await));
    let record = store.create_consumer_limit(operator, "acme", &limits).await.unwrap();
    assert!(out_of_scope(store.update_consumer_limit(editor, "acme", &record.id, &limits, None).await));
    assert!(out_of_scope(store.delete_consumer_limit(editor, "acme", &record.id, None).await));
}

/// The audit's scope is a typed part of each entry, written with it.
async fn audit_entries_carry_their_scope(store: &Store) {
    let operator = Actor::operator("root");
    let (shop_admin, _) =
        store.create_token(operator, "shop-admin", Role::Admin, apps(&["shop"])).await.unwrap();
    let (shop_viewer, _) =
        store.create_token(operator, "shop-viewer", Role::Viewer, apps(&["shop"])).await.unwrap();
    store.create_token(operator, "blog-viewer", Role::Viewer, apps(&["blog"])).await.unwrap();
    store.create_policy(operator, "moved", &input(1, &["blog"])).await.unwrap();
    store.update_policy(operator, "moved", &input(1, &["shop"]), None).await.unwrap();
    let entries = store.audit(&Page::default()).await.unwrap();
    let subjects = |token: &tollgate_store::TokenRecord| -> Vec<String> {
        entries
            .iter()
            .filter(|e| e.visible_to(token))
            .map(|e| format!("{} {}", e.action, e.subject))
            .collect()
    };
    // The shop admin: tokens of its apps (itself, the shop viewer), not the blog viewer's; the
    // policy while it is or was the shop's.
    assert_eq!(subjects(&shop_admin), ["update moved", "create shop-viewer", "create shop-admin"]);
    // A viewer reads no token changes.
    assert_eq!(subjects(&shop_viewer), ["update moved"]);
    assert_eq!(entries[0].scope.before, apps(&["blog"]));
    assert_eq!(entries[0].scope.after, apps(&["shop"]));
}

/// PostgreSQL: a change of a policy's apps committed while a scoped update waits on the row is
/// seen by that update's check (the row is re-read, locked, inside its transaction).
async fn a_concurrent_move_to_another_app_is_seen(url: &str, store: &Store) {
    store.create_policy(Actor::operator("root"), "contested", &input(1, &["shop"])).await.unwrap();
    let (editor, _) = store
        .create_token(Actor::operator("root"), "shop-editor", Role::Editor, apps(&["shop"]))
        .await
        .unwrap();
    let mut other = sqlx::PgConnection::connect(url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("UPDATE policies SET apps = '[\"blog\"]', version = version + 1 WHERE name = 'contested'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move {
            store.update_policy(editor.actor(), "contested", &input(5, &["shop"]), None).await
        })
    };
    // Commit the move only once the scoped update is waiting on the row's lock, so its check
    // cannot have run on the row as it was before.
    wait_for_a_lock_waiter(url, &waiting).await;
    tx.commit().await.unwrap();
    let result = waiting.await.unwrap();
    assert!(out_of_scope(result), "the update saw the policy it was asked to change");
    assert_eq!(store.get_policy("contested").await.unwrap().spec.apps, ["blog"]);
}

/// Waits until a session of the database waits on a lock, or `task` ends (a failure).
async fn wait_for_a_lock_waiter<T: std::fmt::Debug>(url: &str, task: &tokio::task::JoinHandle<T>) {
    let mut watcher = sqlx::PgConnection::connect(url).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let waiting_on_lock: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if waiting_on_lock > 0 {
            return;
        }
        assert!(!task.is_finished(), "the change did not wait for the row");
        assert!(std::time::Instant::now() < deadline, "the change never waited on the row's lock");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A token revoked while its change is under way changes nothing: revoked before, the change
/// is refused; on PostgreSQL, a revocation committed while the change waits is seen by it.
async fn a_revoked_token_changes_nothing(store: &Store) {
    let operator = Actor::operator("root");
    let (gone, _) = store.create_token(operator, "gone", Role::Admin, apps(&["shop"])).await.unwrap();
    store.delete_token(operator, "gone").await.unwrap();
    let revoked = |r: Result<_, StoreError>| matches!(r, Err(StoreError::TokenRevoked { .. }));
    assert!(revoked(store.create_policy(gone.actor(), "p", &input(1, &["shop"])).await.map(|_| ())));
    assert!(revoked(store.create_token(gone.actor(), "t", Role::Viewer, apps(&["shop"])).await.map(|_| ())));
    assert!(store.get_policy("p").await.is_err());
    // A token whose apps are not those it was authenticated with is not that token.
    let (shop, _) = store.create_token(operator, "shop", Role::Admin, apps(&["shop"])).await.unwrap();
    let wider = ["shop".to_owned(), "blog".to_owned()];
    let forged = Actor::new(&shop.name, Some(&wider));
    assert!(revoked(store.create_policy(forged, "p", &input(1, &["blog"])).await.map(|_| ())));
    store.create_policy(shop.actor(), "p", &input(1, &["shop"])).await.unwrap();
}

/// PostgreSQL: a revocation committed while the token's change waits on the token's row.
async fn a_concurrent_revocation_is_seen(url: &str, store: &Store) {
    let (editor, _) =
        store.create_token(Actor::operator("root"), "editor", Role::Editor, apps(&["shop"])).await.unwrap();
    let mut other = sqlx::PgConnection::connect(url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("DELETE FROM tokens WHERE name = 'editor'").execute(&mut *tx).await.unwrap();
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.create_policy(editor.actor(), "late", &input(1, &["shop"])).await })
    };
    wait_for_a_lock_waiter(url, &waiting).await;
    tx.commit().await.unwrap();
    let result = waiting.await.unwrap();
    assert!(matches!(result, Err(StoreError::TokenRevoked { .. })), "{result:?}");
    assert!(store.get_policy("late").await.is_err());
}

on_both_drivers!(
    a_scoped_admin_cannot_delete_a_token_beyond_its_apps_past_the_first_page,
    policy_writes_are_checked_against_the_stored_row,
    audit_entries_carry_their_scope,
    a_revoked_token_changes_nothing;
    postgres_only: a_concurrent_move_to_another_app_is_seen, a_concurrent_revocation_is_seen,
);

/// Entries written before the scope columns existed get theirs from the recorded JSON when the
/// migration runs: a database at migration 0001 with such entries, then opened by the store.
async fn legacy_audit_entries_get_their_scope(url: &str, driver: &str) {
    sqlx::any::install_default_drivers();
    let first_only = tempfile::tempdir().unwrap();
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(driver);
    std::fs::copy(source.join("0001_init.sql"), first_only.path().join("0001_init.sql")).unwrap();
    let pool = sqlx::AnyPool::connect(url).await.unwrap();
    sqlx::migrate::Migrator::new(first_only.path()).await.unwrap().run(&pool).await.unwrap();
    let legacy = [
        ("token", "blog-admin", None, Some(r#"{"name":"blog-admin","role":"admin","apps":["blog"]}"#)),
        ("token", "root", None, Some(r#"{"name":"root","role":"admin","apps":null}"#)),
        (
            "policy",
            "moved",
            Some(r#"{"name":"moved","apps":["blog"]}"#),
            Some(r#"{"name":"moved","apps":["shop"]}"#),
        ),
        ("consumer_limit", "acme", None, Some(r#"{"id":"x","consumer_id":"acme"}"#)),
    ];
    for (kind, subject, before, after) in legacy {
        sqlx::query(
            "INSERT INTO audit_log (at, actor, action, kind, subject, before_json, after_json) \
             VALUES (1, 'old', 'create', $1, $2, $3, $4)",
        )
        .bind(kind)
        .bind(subject)
        .bind(before)
        .bind(after)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;

    let store = Store::connect(url).await.unwrap();
    let entries = store.audit(&Page::default()).await.unwrap();
    let scopes: Vec<_> = entries
        .iter()
        .rev()
        .map(|e| (e.subject.as_str(), e.scope.before.clone(), e.scope.after.clone()))
        .collect();
    assert_eq!(
        scopes,
        [
            ("blog-admin", None, apps(&["blog"])),
            ("root", None, Some(vec![])),
            ("moved", apps(&["blog"]), apps(&["shop"])),
            ("acme", None, None),
        ],
        "{driver}"
    );
    let (shop_admin, _) =
        store.create_token(Actor::operator("t"), "shop-admin", Role::Admin, apps(&["shop"])).await.unwrap();
    let seen: Vec<&str> =
        entries.iter().filter(|e| e.visible_to(&shop_admin)).map(|e| e.subject.as_str()).collect();
    assert_eq!(seen, ["acme", "moved"], "{driver}");
}

#[tokio::test]
async fn legacy_audit_entries_get_their_scope_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("old.db").display());
    legacy_audit_entries_get_their_scope(&url, "sqlite").await;
}

#[tokio::test]
async fn legacy_audit_entries_get_their_scope_on_postgres() {
    let server = PostgresServer::start();
    legacy_audit_entries_get_their_scope(&server.fresh_database(), "postgres").await;
}
