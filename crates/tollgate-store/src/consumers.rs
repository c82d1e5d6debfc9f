//! Per-consumer limits: records of six periods (second to 30-day month), each a positive
//! number or -1 for unlimited, optionally scoped to a path or API prefix and active between two
//! dates; and how the active records of a consumer add up.

use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;
use tollgate_core::limits::MAX_COUNT;
use tollgate_limiter::SixPeriods;

use crate::audit::{Action, AuditScope, Change, ItemKind};
use crate::scope::Actor;
use crate::{Store, StoreError, now_ms};

/// The apps consumer limits belong to: none. Like global policies, only unrestricted actors
/// change them (every token may read them, and their audit entries).
const CONSUMER_LIMIT_APPS: &[String] = &[];

/// Longest consumer id and scope, in bytes.
pub const MAX_CONSUMER_BYTES: usize = 256;

/// A consumer limit as the management API writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerLimitInput {
    /// Requests per second (-1: unlimited).
    pub per_second: i64,
    /// Requests per minute.
    pub per_minute: i64,
    /// Requests per hour.
    pub per_hour: i64,
    /// Requests per day.
    pub per_day: i64,
    /// Requests per week.
    pub per_week: i64,
    /// Requests per 30-day month.
    pub per_month: i64,
    /// Applies only to checks whose `scope` starts with this (an API name or path prefix).
    #[serde(default)]
    pub scope: Option<String>,
    /// Active from this moment (RFC 3339), or always.
    #[serde(default)]
    pub from: Option<String>,
    /// Active until this moment (RFC 3339, exclusive), or forever.
    #[serde(default)]
    pub to: Option<String>,
}

/// A stored consumer limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConsumerLimit {
    /// The record's id.
    pub id: String,
    /// Whose limit.
    pub consumer_id: String,
    /// The six limits.
    #[serde(flatten)]
    pub limits: SixPeriods,
    /// The scope prefix, if any.
    pub scope: Option<String>,
    /// Active from (Unix epoch milliseconds).
    #[serde(skip)]
    pub from_ms: Option<i64>,
    /// Active until (Unix epoch milliseconds, exclusive).
    #[serde(skip)]
    pub to_ms: Option<i64>,
    /// `from` as RFC 3339.
    pub from: Option<String>,
    /// `to` as RFC 3339.
    pub to: Option<String>,
    /// Bumped by every update.
    pub version: i64,
    /// Who created it.
    pub created_by: String,
    /// Who last changed it.
    pub updated_by: String,
    /// Created, Unix epoch milliseconds.
    pub created_at: i64,
    /// Changed, Unix epoch milliseconds.
    pub updated_at: i64,
}

fn rfc3339(ms: i64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(time).to_string()
}

/// An RFC 3339 date-time, any offset, as Unix epoch milliseconds; a time before 1970 counts as
/// 1970 (a window opened before then is open since the epoch, the stored times' origin).
fn parse_time(field: &str, text: &str) -> Result<i64, StoreError> {
    let time =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).map_err(|e| {
            StoreError::Invalid {
                field: field.to_owned(),
                message: format!("{field} = {text:?} is not a date-time like 2026-01-31T00:00:00Z: {e}"),
            }
        })?;
    let ms = time.unix_timestamp_nanos() / 1_000_000;
    Ok(i64::try_from(ms.max(0)).unwrap_or(i64::MAX))
}

/// Checks a consumer id (or scope): 1 to 256 bytes, no control characters.
pub fn validate_consumer_id(field: &str, id: &str) -> Result<(), StoreError> {
    if id.is_empty() || id.len() > MAX_CONSUMER_BYTES || id.chars().any(char::is_control) {
        return Err(StoreError::Invalid {
            field: field.to_owned(),
            message: format!("{field} is 1 to {MAX_CONSUMER_BYTES} bytes without control characters"),
        });
    }
    Ok(())
}

impl ConsumerLimitInput {
    fn limits(&self) -> SixPeriods {
        SixPeriods::from_values([
            self.per_second,
            self.per_minute,
            self.per_hour,
            self.per_day,
            self.per_week,
            self.per_month,
        ])
    }

    /// Validates; the active window in epoch milliseconds.
    fn validate(&self) -> Result<(Option<i64>, Option<i64>), StoreError> {
        self.limits()
            .validate()
            .map_err(|e| StoreError::Invalid { field: e.field.into(), message: e.to_string() })?;
        if let Some(scope) = &self.scope {
            validate_consumer_id("scope", scope)?;
        }
        let from = self.from.as_deref().map(|t| parse_time("from", t)).transpose()?;
        let to = self.to.as_deref().map(|t| parse_time("to", t)).transpose()?;
        if let (Some(f), Some(t)) = (from, to)
            && f >= t
        {
            return Err(StoreError::Invalid {
                field: "to".into(),
                message: "`to` must be after `from`".into(),
            });
        }
        Ok((from, to))
    }
}

impl ConsumerLimit {
    /// Whether the record applies at `now_ms` to a check of `scope`.
    pub fn applies(&self, now_ms: i64, scope: Option<&str>) -> bool {
        let active = self.from_ms.is_none_or(|f| f <= now_ms) && self.to_ms.is_none_or(|t| now_ms < t);
        let in_scope = match &self.scope {
            None => true,
            Some(prefix) => scope.is_some_and(|s| s.starts_with(prefix.as_str())),
        };
        active && in_scope
    }

    fn from_row(r: &AnyRow) -> Result<ConsumerLimit, StoreError> {
        let from_ms: Option<i64> = r.try_get("active_from")?;
        let to_ms: Option<i64> = r.try_get("active_to")?;
        Ok(ConsumerLimit {
            id: r.try_get("id")?,
            consumer_id: r.try_get("consumer_id")?,
            limits: SixPeriods::from_values([
                r.try_get("per_second")?,
                r.try_get("per_minute")?,
                r.try_get("per_hour")?,
                r.try_get("per_day")?,
                r.try_get("per_week")?,
                r.try_get("per_month")?,
            ]),
            scope: r.try_get("scope")?,
            from_ms,
            to_ms,
            from: from_ms.map(rfc3339),
            to: to_ms.map(rfc3339),
            version: r.try_get("version")?,
            created_by: r.try_get("created_by")?,
            updated_by: r.try_get("updated_by")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
        })
    }
}

/// The limits in force for a consumer at `now_ms` for a check of `scope`: per period, the sum
/// of the positive values of the active records; a period with only -1 is unlimited (`None`).
/// With no active record at all, `defaults` apply.
pub fn aggregate(
    records: &[ConsumerLimit],
    now_ms: i64,
    scope: Option<&str>,
    defaults: SixPeriods,
) -> [Option<u64>; 6] {
    let active: Vec<&ConsumerLimit> = records.iter().filter(|r| r.applies(now_ms, scope)).collect();
    let limited = |v: i64| u64::try_from(v).ok().filter(|v| *v > 0);
    if active.is_empty() {
        return defaults.values().map(limited);
    }
    std::array::from_fn(|i| {
        let positive: Vec<u64> = active.iter().filter_map(|r| limited(r.limits.values()[i])).collect();
        (!positive.is_empty()).then(|| positive.iter().sum::<u64>().min(MAX_COUNT))
    })
}

const COLUMNS: &str = "id, consumer_id, scope, per_second, per_minute, per_hour, per_day, per_week, per_month, \
                       active_from, active_to, version, created_by, updated_by, created_at, updated_at";

impl Store {
    /// Every consumer limit (for the in-memory copy the hot path reads).
    pub async fn all_consumer_limits(&self) -> Result<Vec<ConsumerLimit>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM consumer_limits ORDER BY consumer_id, created_at, id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ConsumerLimit::from_row).collect()
    }

    /// The limit records of one consumer.
    pub async fn consumer_limits(&self, consumer_id: &str) -> Result<Vec<ConsumerLimit>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM consumer_limits WHERE consumer_id = $1 ORDER BY created_at, id"
        ))
        .bind(consumer_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ConsumerLimit::from_row).collect()
    }

    async fn consumer_limit(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        consumer_id: &str,
        id: &str,
        if_version: Option<i64>,
    ) -> Result<ConsumerLimit, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM consumer_limits WHERE consumer_id = $1 AND id = $2{}",
            self.row_lock()
        ))
        .bind(consumer_id)
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
        let current = match row {
            Some(row) => ConsumerLimit::from_row(&row)?,
            None => return Err(StoreError::NotFound { kind: "consumer limit", name: id.to_owned() }),
        };
        crate::expect_version(if_version, current.version)?;
        Ok(current)
    }

    /// Adds a limit record for `consumer_id`; refused with [`StoreError::OutOfScope`] for an
    /// actor limited to some apps.
    pub async fn create_consumer_limit(
        &self,
        actor: Actor<'_>,
        consumer_id: &str,
        input: &ConsumerLimitInput,
    ) -> Result<ConsumerLimit, StoreError> {
        actor.check("consumer limit", consumer_id, CONSUMER_LIMIT_APPS)?;
        validate_consumer_id("consumer_id", consumer_id)?;
        let (from_ms, to_ms) = input.validate()?;
        let now = now_ms();
        let record = ConsumerLimit {
            id: uuid::Uuid::new_v4().simple().to_string(),
            consumer_id: consumer_id.to_owned(),
            limits: input.limits(),
            scope: input.scope.clone(),
            from_ms,
            to_ms,
            from: from_ms.map(rfc3339),
            to: to_ms.map(rfc3339),
            version: 1,
            created_by: actor.name().to_owned(),
            updated_by: actor.name().to_owned(),
            created_at: now,
            updated_at: now,
        };
        let mut tx = self.begin_change(actor).await?;
        let v = record.limits.values();
        sqlx::query(&format!(
            "INSERT INTO consumer_limits ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
        ))
        .bind(&record.id)
        .bind(&record.consumer_id)
        .bind(record.scope.clone())
        .bind(v[0])
        .bind(v[1])
        .bind(v[2])
        .bind(v[3])
        .bind(v[4])
        .bind(v[5])
        .bind(from_ms)
        .bind(to_ms)
        .bind(record.version)
        .bind(&record.created_by)
        .bind(&record.updated_by)
        .bind(record.created_at)
        .bind(record.updated_at)
        .execute(&mut *tx)
        .await?;
        let after = crate::audit::snapshot(&record);
        let change = Change {
            actor: actor.name(),
            action: Action::Create,
            kind: ItemKind::ConsumerLimit,
            subject: consumer_id,
            before: None,
            after,
            scope: AuditScope::default(),
        };
        Store::commit_change(tx, change).await?;
        Ok(record)
    }

    /// Replaces a limit record; with `if_version`, only if that is still its version. Refused
    /// with [`StoreError::OutOfScope`] for an actor limited to some apps.
    pub async fn update_consumer_limit(
        &self,
        actor: Actor<'_>,
        consumer_id: &str,
        id: &str,
        input: &ConsumerLimitInput,
        if_version: Option<i64>,
    ) -> Result<ConsumerLimit, StoreError> {
        actor.check("consumer limit", consumer_id, CONSUMER_LIMIT_APPS)?;
        let (from_ms, to_ms) = input.validate()?;
        let mut tx = self.begin_change(actor).await?;
        let before = self.consumer_limit(&mut tx, consumer_id, id, if_version).await?;
        let record = ConsumerLimit {
            limits: input.limits(),
            scope: input.scope.clone(),
            from_ms,
            to_ms,
            from: from_ms.map(rfc3339),
            to: to_ms.map(rfc3339),
            version: before.version + 1,
            updated_by: actor.name().to_owned(),
            updated_at: now_ms(),
            ..before.clone()
        };
        let v = record.limits.values();
        sqlx::query(
            "UPDATE consumer_limits SET scope = $1, per_second = $2, per_minute = $3, per_hour = $4, per_day = $5, \
             per_week = $6, per_month = $7, active_from = $8, active_to = $9, version = $10, updated_by = $11, \
             updated_at = $12 WHERE id = $13 AND version = $14",
        )
        .bind(record.scope.clone())
        .bind(v[0])
        .bind(v[1])
        .bind(v[2])
        .bind(v[3])
        .bind(v[4])
        .bind(v[5])
        .bind(from_ms)
        .bind(to_ms)
        .bind(record.version)
        .bind(&record.updated_by)
        .bind(record.updated_at)
        .bind(id)
        .bind(before.version)
        .execute(&mut *tx)
        .await?;
        let change = Change {
            actor: actor.name(),
            action: Action::Update,
            kind: ItemKind::ConsumerLimit,
            subject: consumer_id,
            before: crate::audit::snapshot(&before),
            after: crate::audit::snapshot(&record),
            scope: AuditScope::default(),
        };
        Store::commit_change(tx, change).await?;
        Ok(record)
    }

    /// Deletes a limit record; with `if_version`, only if that is still its version. Refused
    /// with [`StoreError::OutOfScope`] for an actor limited to some apps.
    pub async fn delete_consumer_limit(
        &self,
        actor: Actor<'_>,
        consumer_id: &str,
        id: &str,
        if_version: Option<i64>,
    ) -> Result<(), StoreError> {
        actor.check("consumer limit", consumer_id, CONSUMER_LIMIT_APPS)?;
        let mut tx = self.begin_change(actor).await?;
        let before = self.consumer_limit(&mut tx, consumer_id, id, if_version).await?;
        sqlx::query("DELETE FROM consumer_limits WHERE id = $1").bind(id).execute(&mut *tx).await?;
        let change = Change {
            actor: actor.name(),
            action: Action::Delete,
            kind: ItemKind::ConsumerLimit,
            subject: consumer_id,
            before: crate::audit::snapshot(&before),
            after: None,
            scope: AuditScope::default(),
        };
        Store::commit_change(tx, change).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(values: [i64; 6], scope: Option<&str>, from: Option<i64>, to: Option<i64>) -> ConsumerLimit {
        ConsumerLimit {
            id: "x".into(),
            consumer_id: "c".into(),
            limits: SixPeriods::from_values(values),
            scope: scope.map(Into::into),
            from_ms: from,
            to_ms: to,
            from: None,
            to: None,
            version: 1,
            created_by: String::new(),
            updated_by: String::new(),
            created_at: 0,
            updated_at: 0,
        }
    }

    const DEFAULTS: SixPeriods =
        SixPeriods { per_second: 5, per_minute: -1, per_hour: -1, per_day: -1, per_week: -1, per_month: -1 };

    #[test]
    fn positive_values_add_up_and_only_minus_one_is_unlimited() {
        let records = [
            record([10, -1, 100, -1, -1, -1], None, None, None),
            record([5, -1, -1, -1, -1, 1000], None, None, None),
        ];
        assert_eq!(
            aggregate(&records, 0, None, DEFAULTS),
            [Some(15), None, Some(100), None, None, Some(1000)]
        );
    }

    #[test]
    fn defaults_apply_only_without_an_active_record() {
        assert_eq!(aggregate(&[], 0, None, DEFAULTS), [Some(5), None, None, None, None, None]);
        let expired = [record([1; 6], None, Some(0), Some(100))];
        assert_eq!(aggregate(&expired, 100, None, DEFAULTS)[0], Some(5), "`to` is exclusive");
        assert_eq!(aggregate(&expired, 99, None, DEFAULTS)[0], Some(1));
        let future = [record([1; 6], None, Some(500), None)];
        assert_eq!(aggregate(&future, 499, None, DEFAULTS)[0], Some(5));
        assert_eq!(aggregate(&future, 500, None, DEFAULTS)[0], Some(1));
        let unlimited = [record([-1; 6], None, None, None)];
        assert_eq!(
            aggregate(&unlimited, 0, None, DEFAULTS),
            [None; 6],
            "an all -1 record is unlimited, not the defaults"
        );
    }

    #[test]
    fn scoped_records_apply_to_matching_checks_only() {
        let records = [
            record([10, -1, -1, -1, -1, -1], None, None, None),
            record([2, -1, -1, -1, -1, -1], Some("/orders"), None, None),
        ];
        assert_eq!(aggregate(&records, 0, None, DEFAULTS)[0], Some(10));
        assert_eq!(aggregate(&records, 0, Some("/orders/7"), DEFAULTS)[0], Some(12));
        assert_eq!(aggregate(&records, 0, Some("/users"), DEFAULTS)[0], Some(10));
    }

    #[test]
    fn values_are_minus_one_or_positive() {
        for bad in [0, -2, MAX_COUNT as i64 + 1] {
            let six = SixPeriods { per_hour: bad, ..SixPeriods::UNLIMITED };
            assert_eq!(six.validate().unwrap_err().field, "per_hour");
        }
    }
}

#[cfg(test)]
mod time_tests {
    use super::parse_time;

    /// What JSON Schema's `date-time` (RFC 3339) allows is taken: offsets, lower-case
    /// separators, fractions, a leap second; before 1970 reads as 1970.
    #[test]
    fn every_rfc3339_date_time_is_read() {
        let at = |t: &str| parse_time("from", t).unwrap();
        assert_eq!(at("2026-01-31T00:00:00Z"), 1_769_817_600_000);
        assert_eq!(at("2026-01-31T01:00:00+01:00"), 1_769_817_600_000);
        assert_eq!(at("2026-01-30T00:01:00-23:59"), 1_769_817_600_000);
        assert_eq!(at("2026-01-31t00:00:00z"), 1_769_817_600_000);
        assert_eq!(at("2026-01-31T00:00:00.123456789Z"), 1_769_817_600_123);
        assert_eq!(at("0001-01-01T00:00:00Z"), 0);
        assert!(at("9999-12-31T23:59:59Z") > 0);
        for bad in ["2026-01-31", "2026-13-01T00:00:00Z", "yesterday", ""] {
            let e = parse_time("to", bad).unwrap_err().to_string();
            assert!(e.contains("to ="), "{bad}: {e}");
        }
    }
}
