//! Tollgate's policy database: policies and per-consumer limits changed at run time, API tokens
//! (stored hashed), and an audit log of every change, in SQLite (a file, the embedded default)
//! or PostgreSQL (shared by several instances), through sqlx with migrations. Every change bumps one revision number in
//! the same transaction, which instances poll to know when to reload.
//!
//! Knows nothing of HTTP: the server maps [`StoreError`]s to answers.

mod audit;
mod consumers;
mod policies;
mod scope;
mod tokens;

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{Any, AnyPool, Transaction};

pub use audit::{Action, AuditEntry, AuditScope, ItemKind};
pub use consumers::{ConsumerLimit, ConsumerLimitInput, MAX_CONSUMER_BYTES, aggregate, validate_consumer_id};
pub use policies::PolicyRecord;
pub use scope::Actor;
pub use tokens::{Role, TokenRecord};

/// Most items one list call returns.
pub const MAX_PAGE: u32 = 200;
/// Items in a page when the request names no `limit`.
pub const DEFAULT_PAGE: u32 = 50;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database URL is not `sqlite://...` or `postgres://...`.
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://...")]
    Url(String),
    /// The database failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// No such item.
    #[error("there is no {kind} named {name:?}")]
    NotFound {
        /// `policy`, `token`, ...
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// An item of that name exists already.
    #[error("a {kind} named {name:?} exists already")]
    Exists {
        /// `policy`, `token`, ...
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The item changed since the version the caller read (optimistic concurrency).
    #[error("version {expected} is stale: the current version is {current}")]
    Stale {
        /// The version the caller gave.
        expected: i64,
        /// The version stored.
        current: i64,
    },
    /// The actor's apps do not cover the item: its apps as stored (read inside the change's
    /// transaction), or the apps the change would give it. The item's own apps are not named:
    /// the actor may not be allowed to see them.
    #[error("{actor:?} may not change the {kind} {name:?}: it is not limited to the apps {allowed:?}")]
    OutOfScope {
        /// `policy`, `token`, `consumer limit`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// Who asked.
        actor: String,
        /// The apps the actor is limited to.
        allowed: Vec<String>,
    },
    /// The actor's token was revoked (or is no longer what it was when the request was
    /// authenticated) before the change could be made.
    #[error("token {actor:?} was revoked while its request was under way")]
    TokenRevoked {
        /// The token's name.
        actor: String,
    },
    /// The input is not valid.
    #[error("{message}")]
    Invalid {
        /// The field at fault.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// Which database a [`Store`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

/// A connection pool to the policy database, migrated.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    driver: Driver,
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A page of a list: at most `limit` items after the cursor `after`.
#[derive(Clone, Debug, Default)]
pub struct Page {
    /// Items after this cursor (exclusive), in list order.
    pub after: Option<String>,
    /// At most this many (1 to [`MAX_PAGE`], default [`DEFAULT_PAGE`]).
    pub limit: Option<u32>,
}

impl Page {
    /// How many items the page holds at most: `limit` within 1 to [`MAX_PAGE`], or
    /// [`DEFAULT_PAGE`].
    pub fn size(&self) -> u32 {
        self.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE)
    }

    pub(crate) fn limit(&self) -> i64 {
        i64::from(self.size())
    }
}

impl Store {
    /// Connects to `url` (`sqlite://PATH`, the file created if missing, or `postgres://...`)
    /// and applies the migrations.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        install_default_drivers();
        let (driver, url) = if url == "sqlite::memory:" {
            (Driver::Sqlite, url.to_owned())
        } else if let Some(path) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) {
            // mode=rwc: create the file on first start.
            let url = if path.contains('?') { url.to_owned() } else { format!("sqlite://{path}?mode=rwc") };
            (Driver::Sqlite, url)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Driver::Postgres, url.to_owned())
        } else {
            return Err(StoreError::Url(url.to_owned()));
        };
        // SQLite allows one writer at a time: one connection avoids "database is locked".
        let max = if driver == Driver::Sqlite { 1 } else { 8 };
        let pool = AnyPoolOptions::new().max_connections(max).connect(&url).await?;
        match driver {
            Driver::Sqlite => sqlx::migrate!("./migrations/sqlite").run(&pool).await?,
            Driver::Postgres => sqlx::migrate!("./migrations/postgres").run(&pool).await?,
        }
        Ok(Store { pool, driver })
    }

    /// The database in use.
    pub fn driver(&self) -> Driver {
        self.driver
    }

    /// The number bumped by every change; instances reload when it moves.
    pub async fn revision(&self) -> Result<i64, StoreError> {
        let revision: i64 =
            sqlx::query_scalar("SELECT revision FROM revision WHERE id = 1").fetch_one(&self.pool).await?;
        Ok(revision)
    }

    /// Checks the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// `FOR UPDATE` where the database has row locks (PostgreSQL); SQLite has one writer at a
    /// time anyway. Reads before a versioned write use it, and the write repeats the version in
    /// its WHERE, so no concurrent writer slips in between.
    pub(crate) fn row_lock(&self) -> &'static str {
        if self.driver == Driver::Postgres { " FOR UPDATE" } else { "" }
    }

    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Any>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    /// Begins a change by `actor`. A token actor is read again inside the transaction (its row
    /// held `FOR SHARE` on PostgreSQL until the change commits, so a concurrent revocation
    /// waits for it or is seen by it): a token revoked while its request was under way, or
    /// whose apps are no longer those it was authenticated with, changes nothing.
    pub(crate) async fn begin_change(
        &self,
        actor: Actor<'_>,
    ) -> Result<Transaction<'static, Any>, StoreError> {
        let mut tx = self.begin().await?;
        if actor.is_token() {
            let lock = if self.driver == Driver::Postgres { " FOR SHARE" } else { "" };
            let row: Option<Option<String>> =
                sqlx::query_scalar(&format!("SELECT apps FROM tokens WHERE name = $1{lock}"))
                    .bind(actor.name())
                    .fetch_optional(&mut *tx)
                    .await?;
            let revoked = || StoreError::TokenRevoked { actor: actor.name().to_owned() };
            let Some(apps) = row else { return Err(revoked()) };
            let apps: Option<Vec<String>> = apps
                .map(|text| serde_json::from_str(&text))
                .transpose()
                .map_err(|e| StoreError::Database(sqlx::Error::Decode(Box::new(e))))?;
            if apps.as_deref() != actor.apps() {
                return Err(revoked());
            }
        }
        Ok(tx)
    }

    /// Ends a change: bumps the revision, records the audit entry, and commits, all in the
    /// change's own transaction (so instances never reload a half-written change).
    pub(crate) async fn commit_change(
        mut tx: Transaction<'static, Any>,
        entry: audit::Change<'_>,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE revision SET revision = revision + 1 WHERE id = 1").execute(&mut *tx).await?;
        audit::record(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Checks an `If-Match` version against the stored one.
pub(crate) fn expect_version(if_version: Option<i64>, current: i64) -> Result<(), StoreError> {
    match if_version {
        Some(expected) if expected != current => Err(StoreError::Stale { expected, current }),
        _ => Ok(()),
    }
}
