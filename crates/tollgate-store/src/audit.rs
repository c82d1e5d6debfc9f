//! The audit log: who changed what, when, with the item before and after.

use serde::Serialize;
use sqlx::{Any, Row, Transaction};

use crate::tokens::{Role, TokenRecord};
use crate::{Page, Store, StoreError, now_ms};

/// What kind of item a change is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// A stored policy.
    Policy,
    /// An API token.
    Token,
    /// A consumer limit record.
    ConsumerLimit,
}

impl ItemKind {
    /// The name stored in the audit log and shown in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::Policy => "policy",
            ItemKind::Token => "token",
            ItemKind::ConsumerLimit => "consumer_limit",
        }
    }

    fn parse(text: &str) -> Option<ItemKind> {
        [ItemKind::Policy, ItemKind::Token, ItemKind::ConsumerLimit].into_iter().find(|k| k.as_str() == text)
    }
}

/// What a change did to its item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The item was created.
    Create,
    /// The item was changed.
    Update,
    /// The item was deleted (or a token revoked).
    Delete,
}

impl Action {
    /// The name stored in the audit log and shown in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Delete => "delete",
        }
    }

    fn parse(text: &str) -> Option<Action> {
        [Action::Create, Action::Update, Action::Delete].into_iter().find(|a| a.as_str() == text)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for Action {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The apps an audit entry's item belonged to before and after the change: what decides who
/// may read the entry. Kept in columns of its own (`apps_before`, `apps_after`), written with
/// the entry, so authorisation never digs in the recorded JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditScope {
    /// The item's apps before the change; `None` when it did not exist, or belongs to no app
    /// by nature (consumer limits, readable by every token). A token's are its apps, or none
    /// for an unrestricted token.
    pub before: Option<Vec<String>>,
    /// The item's apps after the change; `None` when it no longer exists, or as above.
    pub after: Option<Vec<String>>,
}

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
    pub action: Action,
    /// What was changed: `policy`, `token` or `consumer_limit`.
    pub kind: ItemKind,
    /// The item's name.
    pub subject: String,
    /// The item before (absent for a creation). Token secrets are never recorded.
    pub before: Option<serde_json::Value>,
    /// The item after (absent for a deletion).
    pub after: Option<serde_json::Value>,
    /// The apps the item belonged to, which decide who may read this entry.
    #[serde(skip)]
    pub scope: AuditScope,
}

impl AuditEntry {
    /// Whether `token` may read this entry: a token change if the token is an admin that may
    /// list that token (its apps within the admin's); anything else if the token may see the
    /// item on one side of the change (global items and items sharing an app with it).
    pub fn visible_to(&self, token: &TokenRecord) -> bool {
        let sides = || self.scope.before.iter().chain(self.scope.after.iter());
        match self.kind {
            ItemKind::Token => token.role == Role::Admin && sides().any(|apps| token.may_change(apps)),
            ItemKind::Policy | ItemKind::ConsumerLimit => {
                self.scope.before.is_none() && self.scope.after.is_none()
                    || sides().any(|apps| token.may_see(apps))
            }
        }
    }
}

pub(crate) struct Change<'a> {
    pub actor: &'a str,
    pub action: Action,
    pub kind: ItemKind,
    pub subject: &'a str,
    pub before: Option<serde_json::Value>,
    pub after: Option<serde_json::Value>,
    pub scope: AuditScope,
}

/// An item as the audit log keeps it.
pub(crate) fn snapshot<T: Serialize>(item: &T) -> Option<serde_json::Value> {
    serde_json::to_value(item).ok()
}

pub(crate) async fn record(tx: &mut Transaction<'static, Any>, c: Change<'_>) -> Result<(), StoreError> {
    let text = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string());
    let apps = |a: &Option<Vec<String>>| a.as_ref().map(|a| serde_json::to_string(a).unwrap_or_default());
    sqlx::query(
        "INSERT INTO audit_log (at, actor, action, kind, subject, before_json, after_json, apps_before, apps_after) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(now_ms())
    .bind(c.actor)
    .bind(c.action.as_str())
    .bind(c.kind.as_str())
    .bind(c.subject)
    .bind(text(&c.before))
    .bind(text(&c.after))
    .bind(apps(&c.scope.before))
    .bind(apps(&c.scope.after))
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
            "SELECT id, at, actor, action, kind, subject, before_json, after_json, apps_before, apps_after \
             FROM audit_log \
             WHERE id < $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(before)
        .bind(page.limit())
        .fetch_all(&self.pool)
        .await?;
        let json = |v: Option<String>| v.and_then(|t| serde_json::from_str(&t).ok());
        // A scope column that does not hold a list of names is corrupt: fail rather than guess
        // who may read the entry.
        let apps = |v: Option<String>| -> Result<Option<Vec<String>>, StoreError> {
            v.map(|t| serde_json::from_str(&t))
                .transpose()
                .map_err(|e| StoreError::Database(sqlx::Error::Decode(Box::new(e))))
        };
        rows.into_iter()
            .map(|r| {
                Ok(AuditEntry {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    actor: r.try_get("actor")?,
                    action: {
                        let action: String = r.try_get("action")?;
                        Action::parse(&action).ok_or_else(|| {
                            StoreError::Database(sqlx::Error::Decode(
                                format!("unknown audit action {action:?}").into(),
                            ))
                        })?
                    },
                    kind: {
                        let kind: String = r.try_get("kind")?;
                        ItemKind::parse(&kind).ok_or_else(|| {
                            StoreError::Database(sqlx::Error::Decode(
                                format!("unknown audit kind {kind:?}").into(),
                            ))
                        })?
                    },
                    subject: r.try_get("subject")?,
                    before: json(r.try_get("before_json")?),
                    after: json(r.try_get("after_json")?),
                    scope: AuditScope {
                        before: apps(r.try_get("apps_before")?)?,
                        after: apps(r.try_get("apps_after")?)?,
                    },
                })
            })
            .collect()
    }
}
