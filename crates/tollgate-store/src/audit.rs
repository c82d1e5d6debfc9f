//! The audit log: who changed what, when, with the item before and after.

use serde::Serialize;
use sqlx::{Any, Row, Transaction};

use crate::{Page, Store, StoreError, now_ms};

/// One change.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditEntry {
    /// Increasing identity (the list's cursor).
    pub id: i64,
    /// When, in Unix epoch milliseconds.
    pub at: i64,
    /// The token name that made the change.
    pub actor: String,
    /// `create`, `update` or `delete`.
    pub action: String,
    /// `policy`, `token`, ...
    pub kind: String,
    /// The item's name.
    pub subject: String,
    /// The item before (absent for a creation). Token secrets are never recorded.
    pub before: Option<serde_json::Value>,
    /// The item after (absent for a deletion).
    pub after: Option<serde_json::Value>,
}

pub(crate) struct Change<'a> {
    pub actor: &'a str,
    pub action: &'static str,
    pub kind: &'static str,
    pub subject: &'a str,
    pub before: Option<serde_json::Value>,
    pub after: Option<serde_json::Value>,
}

/// An item as the audit log keeps it.
pub(crate) fn snapshot<T: Serialize>(item: &T) -> Option<serde_json::Value> {
    serde_json::to_value(item).ok()
}

pub(crate) async fn record(tx: &mut Transaction<'static, Any>, c: Change<'_>) -> Result<(), StoreError> {
    let text = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string());
    sqlx::query(
        "INSERT INTO audit_log (at, actor, action, kind, subject, before_json, after_json) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(now_ms())
    .bind(c.actor)
    .bind(c.action)
    .bind(c.kind)
    .bind(c.subject)
    .bind(text(&c.before))
    .bind(text(&c.after))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Store {
    /// The audit log, newest first; `page.after` is the id of the last entry already seen.
    pub async fn audit(&self, page: &Page) -> Result<Vec<AuditEntry>, StoreError> {
        let before = match &page.after {
            Some(cursor) => cursor.parse::<i64>().map_err(|_| StoreError::Invalid {
                field: "after".into(),
                message: "the audit log's cursor is an entry id".into(),
            })?,
            None => i64::MAX,
        };
        let rows = sqlx::query(
            "SELECT id, at, actor, action, kind, subject, before_json, after_json FROM audit_log \
             WHERE id < $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(before)
        .bind(page.limit())
        .fetch_all(&self.pool)
        .await?;
        let json = |v: Option<String>| v.and_then(|t| serde_json::from_str(&t).ok());
        rows.into_iter()
            .map(|r| {
                Ok(AuditEntry {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    kind: r.try_get("kind")?,
                    subject: r.try_get("subject")?,
                    before: json(r.try_get("before_json")?),
                    after: json(r.try_get("after_json")?),
                })
            })
            .collect()
    }
}
