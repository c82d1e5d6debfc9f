//! API tokens: a role and an optional set of apps, stored as a SHA-256 hash of the secret
//! (the secret is shown once, at creation, and never stored or logged).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::Row;
use sqlx::any::AnyRow;
use tollgate_config::{MAX_APPS, PolicySpec};

use crate::audit::{Action, AuditScope, Change, ItemKind};
use crate::scope::Actor;
use crate::{Page, Store, StoreError, now_ms};

/// What a token may do. Each role includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read policies, limits and the audit log.
    Viewer,
    /// Also create, change and delete policies and consumer limits.
    Editor,
    /// Also manage tokens.
    Admin,
}

impl Role {
    /// The role's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Admin => "admin",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "editor" => Ok(Role::Editor),
            "admin" => Ok(Role::Admin),
            _ => Err(format!("unknown role {s:?}: viewer, editor or admin")),
        }
    }
}

/// A token, without its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenRecord {
    /// Its name: what lands in `created_by`, `updated_by` and the audit log.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The apps it may touch; `None`: all.
    pub apps: Option<Vec<String>>,
    /// Who created it.
    pub created_by: String,
    /// When, Unix epoch milliseconds.
    pub created_at: i64,
}

impl TokenRecord {
    /// Whether the token may touch something belonging to `apps`: unrestricted tokens touch
    /// everything; restricted ones only items all of whose apps they hold (not global ones).
    pub fn may_change(&self, apps: &[String]) -> bool {
        self.actor().may_change(apps)
    }

    /// The token as the actor of a change: the store checks its apps against the changed row
    /// inside the change's transaction.
    pub fn actor(&self) -> Actor<'_> {
        Actor::new(&self.name, self.apps.as_deref())
    }

    /// The apps a token's scope is judged by: its own, or none for an unrestricted token (so
    /// only unrestricted actors may change, list or read the audit of unrestricted tokens).
    pub(crate) fn scope_apps(&self) -> Vec<String> {
        self.apps.clone().unwrap_or_default()
    }

    /// Whether the token may see something belonging to `apps`: global items, and items
    /// sharing an app with it.
    pub fn may_see(&self, apps: &[String]) -> bool {
        match &self.apps {
            None => true,
            Some(mine) => apps.is_empty() || apps.iter().any(|a| mine.contains(a)),
        }
    }

    fn from_row(r: &AnyRow) -> Result<TokenRecord, StoreError> {
        let role: String = r.try_get("role")?;
        let apps: Option<String> = r.try_get("apps")?;
        let corrupt = |e: String| StoreError::Database(sqlx::Error::Decode(e.into()));
        Ok(TokenRecord {
            name: r.try_get("name")?,
            role: role.parse().map_err(corrupt)?,
            apps: apps.map(|a| serde_json::from_str(&a)).transpose().map_err(|e| corrupt(e.to_string()))?,
            created_by: r.try_get("created_by")?,
            created_at: r.try_get("created_at")?,
        })
    }
}

fn hash(secret: &str) -> String {
    format!("{:x}", Sha256::digest(secret.as_bytes()))
}

/// A new secret: `tg_` and 64 hex digits (244 random bits from two v4 UUIDs).
fn new_secret() -> String {
    format!("tg_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

impl Store {
    /// Creates a token; returns it with its secret, which is not kept.
    /// Refused with [`StoreError::OutOfScope`] when the token would reach beyond the actor's apps.
    pub async fn create_token(
        &self,
        actor: Actor<'_>,
        name: &str,
        role: Role,
        apps: Option<Vec<String>>,
    ) -> Result<(TokenRecord, String), StoreError> {
        if !tollgate_config::valid_policy_name(name) {
            return Err(StoreError::Invalid {
                field: "name".into(),
                message: "a token name is 1 to 64 letters, digits, '_', '-' or '.'".into(),
            });
        }
        if let Some(apps) = &apps
            && (apps.is_empty() || !PolicySpec::valid_apps(apps))
        {
            return Err(StoreError::Invalid {
                field: "apps".into(),
                message: format!("1 to {MAX_APPS} apps, each 1 to 64 letters, digits, '_', '-' or '.'"),
            });
        }
        actor.check("token", name, apps.as_deref().unwrap_or_default())?;
        let secret = new_secret();
        let record = TokenRecord {
            name: name.to_owned(),
            role,
            apps,
            created_by: actor.name().to_owned(),
            created_at: now_ms(),
        };
        let mut tx = self.begin_change(actor).await?;
        let inserted = sqlx::query(
            "INSERT INTO tokens (name, hash, role, apps, created_by, created_at) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(&record.name)
        .bind(hash(&secret))
        .bind(record.role.as_str())
        .bind(record.apps.as_ref().map(|a| serde_json::to_string(a).unwrap_or_default()))
        .bind(&record.created_by)
        .bind(record.created_at)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::Exists { kind: "token", name: name.to_owned() });
        }
        let after = crate::audit::snapshot(&record);
        let scope = AuditScope { before: None, after: Some(record.scope_apps()) };
        Store::commit_change(
            tx,
            Change {
                actor: actor.name(),
                action: Action::Create,
                kind: ItemKind::Token,
                subject: name,
                before: None,
                after,
                scope,
            },
        )
        .await?;
        Ok((record, secret))
    }

    /// The token whose secret this is.
    pub async fn authenticate(&self, secret: &str) -> Result<Option<TokenRecord>, StoreError> {
        let row = sqlx::query("SELECT name, role, apps, created_by, created_at FROM tokens WHERE hash = $1")
            .bind(hash(secret))
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(TokenRecord::from_row).transpose()
    }

    /// One page of tokens, by name.
    pub async fn list_tokens(&self, page: &Page) -> Result<Vec<TokenRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT name, role, apps, created_by, created_at FROM tokens WHERE name > $1 ORDER BY name LIMIT $2",
        )
        .bind(page.after.clone().unwrap_or_default())
        .bind(page.limit())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(TokenRecord::from_row).collect()
    }

    /// One page of the tokens `actor` may change (those all of whose apps it holds; every token
    /// for an unrestricted actor), by name, and the cursor of the next page (`None` on the
    /// last). Tokens beyond the actor's apps are skipped while reading, never counted in the
    /// page nor named by the cursor: a page is `page.limit` visible tokens, and the cursor is
    /// the last of them.
    pub async fn tokens_visible_to(
        &self,
        actor: Actor<'_>,
        page: &Page,
    ) -> Result<(Vec<TokenRecord>, Option<String>), StoreError> {
        let limit = usize::try_from(page.limit()).unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut cursor = page.after.clone();
        loop {
            let raw = self.list_tokens(&Page { after: cursor.clone(), limit: Some(crate::MAX_PAGE) }).await?;
            let exhausted = raw.len() < crate::MAX_PAGE as usize;
            cursor = raw.last().map(|t| t.name.clone());
            items.extend(raw.into_iter().filter(|t| actor.may_change(&t.scope_apps())));
            if items.len() > limit {
                items.truncate(limit);
                let next = items.last().map(|t| t.name.clone());
                return Ok((items, next));
            }
            if exhausted {
                return Ok((items, None));
            }
        }
    }

    /// How many tokens exist.
    pub async fn count_tokens(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM tokens").fetch_one(&self.pool).await?)
    }

    /// Deletes the token `name`: the row itself is read (locked on PostgreSQL) and checked
    /// against the actor's apps inside the delete's transaction; refused with
    /// [`StoreError::OutOfScope`] when the token reaches beyond them.
    pub async fn delete_token(&self, actor: Actor<'_>, name: &str) -> Result<(), StoreError> {
        let mut tx = self.begin_change(actor).await?;
        let row = sqlx::query(&format!(
            "SELECT name, role, apps, created_by, created_at FROM tokens WHERE name = $1{}",
            self.row_lock()
        ))
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(target) = row.as_ref().map(TokenRecord::from_row).transpose()? else {
            return Err(StoreError::NotFound { kind: "token", name: name.to_owned() });
        };
        actor.check("token", name, &target.scope_apps())?;
        sqlx::query("DELETE FROM tokens WHERE name = $1").bind(name).execute(&mut *tx).await?;
        let scope = AuditScope { before: Some(target.scope_apps()), after: None };
        let before = crate::audit::snapshot(&target);
        Store::commit_change(
            tx,
            Change {
                actor: actor.name(),
                action: Action::Delete,
                kind: ItemKind::Token,
                subject: name,
                before,
                after: None,
                scope,
            },
        )
        .await?;
        Ok(())
    }
}
