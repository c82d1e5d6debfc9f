//! Policies in the database: validated like the file's, versioned for optimistic concurrency,
//! and scoped to the apps allowed to use them.

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;
use tollgate_config::PolicySpec;
use tollgate_limiter::Policy;

use crate::audit::{Action, AuditScope, Change, ItemKind};
use crate::scope::Actor;
use crate::{Page, Store, StoreError, now_ms};

/// A stored policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PolicyRecord {
    /// Its name.
    pub name: String,
    /// Rules, mode, strategy, apps and whether it is applied.
    #[serde(flatten)]
    pub spec: PolicySpec,
    /// Bumped by every update; give it back in `If-Match`.
    pub version: i64,
    /// The token name that created it.
    pub created_by: String,
    /// The token name that last changed it.
    pub updated_by: String,
    /// Creation time, Unix epoch milliseconds.
    pub created_at: i64,
    /// Last change, Unix epoch milliseconds.
    pub updated_at: i64,
}

/// Validates `spec` as the policy `name`.
fn validate(spec: &PolicySpec, name: &str) -> Result<Policy, StoreError> {
    spec.build(name).map_err(|e| StoreError::Invalid { field: e.field, message: e.message })
}

impl PolicyRecord {
    /// The policy to enforce.
    pub fn policy(&self) -> Result<Policy, StoreError> {
        validate(&self.spec, &self.name)
    }

    fn from_row(r: &AnyRow) -> Result<PolicyRecord, StoreError> {
        let spec: String = r.try_get("spec")?;
        let apps: String = r.try_get("apps")?;
        let corrupt = |e: serde_json::Error| StoreError::Database(sqlx::Error::Decode(Box::new(e)));
        // The apps and enabled columns are what queries and scope checks read: they win over
        // the copies in the spec's JSON (rows written before the spec held them have none).
        let spec = PolicySpec {
            apps: serde_json::from_str(&apps).map_err(corrupt)?,
            enabled: r.try_get::<i64, _>("enabled")? != 0,
            ..serde_json::from_str(&spec).map_err(corrupt)?
        };
        Ok(PolicyRecord {
            name: r.try_get("name")?,
            spec,
            version: r.try_get("version")?,
            created_by: r.try_get("created_by")?,
            updated_by: r.try_get("updated_by")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
        })
    }
}

const COLUMNS: &str = "name, spec, apps, enabled, version, created_by, updated_by, created_at, updated_at";

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

impl Store {
    /// Every policy, by name.
    pub async fn all_policies(&self) -> Result<Vec<PolicyRecord>, StoreError> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM policies ORDER BY name"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(PolicyRecord::from_row).collect()
    }

    /// One page of policies, by name.
    pub async fn list_policies(&self, page: &Page) -> Result<Vec<PolicyRecord>, StoreError> {
        let rows =
            sqlx::query(&format!("SELECT {COLUMNS} FROM policies WHERE name > $1 ORDER BY name LIMIT $2"))
                .bind(page.after.clone().unwrap_or_default())
                .bind(page.limit())
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(PolicyRecord::from_row).collect()
    }

    /// The policy called `name`.
    pub async fn get_policy(&self, name: &str) -> Result<PolicyRecord, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM policies WHERE name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => PolicyRecord::from_row(&row),
            None => Err(StoreError::NotFound { kind: "policy", name: name.to_owned() }),
        }
    }

    /// Creates the policy `name` (version 1) from `spec`; refused with [`StoreError::OutOfScope`] when its
    /// apps reach beyond the actor's.
    pub async fn create_policy(
        &self,
        actor: Actor<'_>,
        name: &str,
        spec: &PolicySpec,
    ) -> Result<PolicyRecord, StoreError> {
        actor.check("policy", name, &spec.apps)?;
        validate(spec, name)?;
        let now = now_ms();
        let record = PolicyRecord {
            name: name.to_owned(),
            spec: spec.clone(),
            version: 1,
            created_by: actor.name().to_owned(),
            updated_by: actor.name().to_owned(),
            created_at: now,
            updated_at: now,
        };
        let mut tx = self.begin_change(actor).await?;
        let inserted = sqlx::query(&format!(
            "INSERT INTO policies ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (name) DO NOTHING"
        ))
        .bind(&record.name)
        .bind(json(&record.spec))
        .bind(json(&record.spec.apps))
        .bind(i64::from(record.spec.enabled))
        .bind(record.version)
        .bind(&record.created_by)
        .bind(&record.updated_by)
        .bind(record.created_at)
        .bind(record.updated_at)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::Exists { kind: "policy", name: name.to_owned() });
        }
        let change = Change {
            actor: actor.name(),
            action: Action::Create,
            kind: ItemKind::Policy,
            subject: name,
            before: None,
            after: crate::audit::snapshot(&record),
            scope: AuditScope { before: None, after: Some(record.spec.apps.clone()) },
        };
        Store::commit_change(tx, change).await?;
        Ok(record)
    }

    /// Replaces the policy `name`; with `if_version`, only if that is still its version.
    /// Refused with [`StoreError::OutOfScope`] when the policy as stored (read inside the
    /// update's transaction) or as it would become reaches beyond the actor's apps; the scope
    /// is checked before the version and the input, so an actor learns nothing of a policy it
    /// may not change.
    pub async fn update_policy(
        &self,
        actor: Actor<'_>,
        name: &str,
        spec: &PolicySpec,
        if_version: Option<i64>,
    ) -> Result<PolicyRecord, StoreError> {
        let mut tx = self.begin_change(actor).await?;
        let before = self.locked_policy(&mut tx, actor, name, if_version).await?;
        actor.check("policy", name, &spec.apps)?;
        validate(spec, name)?;
        let record = PolicyRecord {
            spec: spec.clone(),
            version: before.version + 1,
            updated_by: actor.name().to_owned(),
            updated_at: now_ms(),
            ..before.clone()
        };
        sqlx::query(
            "UPDATE policies SET spec = $1, apps = $2, enabled = $3, version = $4, updated_by = $5, updated_at = $6 \
             WHERE name = $7 AND version = $8",
        )
        .bind(json(&record.spec))
        .bind(json(&record.spec.apps))
        .bind(i64::from(record.spec.enabled))
        .bind(record.version)
        .bind(&record.updated_by)
        .bind(record.updated_at)
        .bind(name)
        .bind(before.version)
        .execute(&mut *tx)
        .await?;
        let change = Change {
            actor: actor.name(),
            action: Action::Update,
            kind: ItemKind::Policy,
            subject: name,
            before: crate::audit::snapshot(&before),
            after: crate::audit::snapshot(&record),
            scope: AuditScope {
                before: Some(before.spec.apps.clone()),
                after: Some(record.spec.apps.clone()),
            },
        };
        Store::commit_change(tx, change).await?;
        Ok(record)
    }

    /// Deletes the policy `name`; with `if_version`, only if that is still its version.
    /// Refused with [`StoreError::OutOfScope`] when the policy as stored (read inside the
    /// delete's transaction) reaches beyond the actor's apps.
    pub async fn delete_policy(
        &self,
        actor: Actor<'_>,
        name: &str,
        if_version: Option<i64>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_change(actor).await?;
        let before = self.locked_policy(&mut tx, actor, name, if_version).await?;
        sqlx::query("DELETE FROM policies WHERE name = $1 AND version = $2")
            .bind(name)
            .bind(before.version)
            .execute(&mut *tx)
            .await?;
        let change = Change {
            actor: actor.name(),
            action: Action::Delete,
            kind: ItemKind::Policy,
            subject: name,
            before: crate::audit::snapshot(&before),
            after: None,
            scope: AuditScope { before: Some(before.spec.apps.clone()), after: None },
        };
        Store::commit_change(tx, change).await?;
        Ok(())
    }

    /// The current row, inside the transaction (see [`Store::row_lock`]), checked against the
    /// actor's apps, then against the expected version.
    async fn locked_policy(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        actor: Actor<'_>,
        name: &str,
        if_version: Option<i64>,
    ) -> Result<PolicyRecord, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM policies WHERE name = $1{}", self.row_lock()))
            .bind(name)
            .fetch_optional(&mut **tx)
            .await?;
        let before = match row {
            Some(row) => PolicyRecord::from_row(&row)?,
            None => return Err(StoreError::NotFound { kind: "policy", name: name.to_owned() }),
        };
        actor.check("policy", name, &before.spec.apps)?;
        crate::expect_version(if_version, before.version)?;
        Ok(before)
    }
}
