//! [`ModuleStore`]: `tollgate_core::script::Store` over the module API, for the command's one
//! call to `execute`.
//!
//! Every access goes through the low-level key API ([`crate::key`]), none through
//! `RedisModule_Call`: it is the cheaper path (no command lookup, no argument strings, no reply
//! objects). The low-level writes are not replicated by Redis, so each write replicates itself
//! as the plain command that has its effect (HSET, HDEL, ZADD, ZREM, DEL, PEXPIREAT), which
//! Redis wraps with the command's other writes in one MULTI/EXEC for the replicas and the AOF.
//! The command itself is never replicated: it reads the clock, so a replica re-running it would
//! decide at another time.

use std::time::{SystemTime, UNIX_EPOCH};

use redis_module::raw::KeyType;
use redis_module::{Context, RedisString};
use tollgate_core::script::{Store, StoreError};

use crate::key::{self, Key, Mode};

/// The store of one command call.
pub struct ModuleStore<'c> {
    ctx: &'c Context,
}

impl<'c> ModuleStore<'c> {
    /// A store over the database `ctx` has selected.
    pub fn new(ctx: &'c Context) -> Self {
        ModuleStore { ctx }
    }

    /// A key's name as a Redis string. Not `Context::create_string`, which goes through a C
    /// string and panics on a NUL byte, which a key may hold.
    fn name(&self, name: &[u8]) -> RedisString {
        RedisString::create_from_slice(self.ctx.get_raw(), name)
    }

    fn open(&self, name: &[u8], mode: Mode, kind: KeyType) -> Result<Key, StoreError> {
        let key = Key::open(self.ctx, &self.name(name), mode);
        match key.kind() {
            KeyType::Empty => Ok(key),
            found if found == kind => Ok(key),
            _ => Err(StoreError::WrongType),
        }
    }

    fn replicate(&self, command: &str, args: &[&[u8]]) {
        self.ctx.replicate(command, args);
    }
}

/// A hash field's value, which Tollgate writes as a decimal integer.
fn integer(key: &[u8], field: &[u8], value: &[u8]) -> Result<i64, StoreError> {
    std::str::from_utf8(value).ok().and_then(|text| text.parse().ok()).ok_or_else(|| StoreError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        what: format!(
            "field {:?} is {:?}, not an integer",
            String::from_utf8_lossy(field),
            String::from_utf8_lossy(value)
        ),
    })
}

/// A score as ZADD reads it back exactly: Rust's shortest round-trip form (`inf`, `-inf`,
/// `1e300`, `0.5`), which `strtod` parses to the same double.
fn score_text(score: f64) -> String {
    format!("{score:?}")
}

impl Store for ModuleStore<'_> {
    /// The system clock, read in-process: what Redis's `TIME` (the Lua twin's clock) reads.
    fn now(&mut self) -> Result<i64, StoreError> {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| StoreError::Other("ERR tollgate: the server's clock is before 1970".into()))?;
        i64::try_from(since_epoch.as_micros())
            .map_err(|_| StoreError::Other("ERR tollgate: the server's clock is past year 294,000".into()))
    }

    fn hash_get(&mut self, key: &[u8], fields: &[&[u8]], out: &mut [Option<i64>]) -> Result<(), StoreError> {
        let hash = self.open(key, Mode::Read, KeyType::Hash)?;
        for (field, slot) in fields.iter().zip(out.iter_mut()) {
            *slot = match hash.hash_get(&hash.string(field)) {
                Some(value) => Some(integer(key, field, &value)?),
                None => None,
            };
        }
        Ok(())
    }

    fn hash_set(&mut self, key: &[u8], fields: &[(&[u8], i64)]) -> Result<(), StoreError> {
        if fields.is_empty() {
            return Ok(());
        }
        let hash = self.open(key, Mode::Write, KeyType::Hash)?;
        let values: Vec<String> = fields.iter().map(|(_, value)| value.to_string()).collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + 2 * fields.len());
        args.push(key);
        for ((field, _), value) in fields.iter().zip(&values) {
            hash.hash_set(&hash.string(field), Some(&hash.string(value.as_bytes())));
            args.extend([*field, value.as_bytes()]);
        }
        self.replicate("HSET", &args);
        Ok(())
    }

    fn hash_delete(&mut self, key: &[u8], fields: &[&[u8]]) -> Result<(), StoreError> {
        let hash = self.open(key, Mode::Write, KeyType::Hash)?;
        if fields.is_empty() || hash.kind() == KeyType::Empty {
            return Ok(());
        }
        for field in fields {
            hash.hash_set(&hash.string(field), None);
        }
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + fields.len());
        args.push(key);
        args.extend_from_slice(fields);
        self.replicate("HDEL", &args);
        Ok(())
    }

    fn sorted_set(&mut self, key: &[u8]) -> Result<Vec<(Vec<u8>, f64)>, StoreError> {
        Ok(self.open(key, Mode::Read, KeyType::ZSet)?.sorted_set())
    }

    fn sorted_set_add(&mut self, key: &[u8], members: &[(f64, &[u8])]) -> Result<(), StoreError> {
        if members.iter().any(|(score, _)| score.is_nan()) {
            return Err(StoreError::Other("ERR tollgate: a sorted set score is not a number".into()));
        }
        if members.is_empty() {
            return Ok(());
        }
        let set = self.open(key, Mode::Write, KeyType::ZSet)?;
        let scores: Vec<String> = members.iter().map(|(score, _)| score_text(*score)).collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + 2 * members.len());
        args.push(key);
        for ((score, member), text) in members.iter().zip(&scores) {
            if !set.sorted_set_add(*score, &set.string(member)) {
                return Err(StoreError::Other("ERR tollgate: Redis refused a sorted set member".into()));
            }
            args.extend([text.as_bytes(), *member]);
        }
        self.replicate("ZADD", &args);
        Ok(())
    }

    fn sorted_set_remove(&mut self, key: &[u8], members: &[&[u8]]) -> Result<(), StoreError> {
        let set = self.open(key, Mode::Write, KeyType::ZSet)?;
        if members.is_empty() || set.kind() == KeyType::Empty {
            return Ok(());
        }
        for member in members {
            set.sorted_set_remove(&set.string(member));
        }
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + members.len());
        args.push(key);
        args.extend_from_slice(members);
        self.replicate("ZREM", &args);
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError> {
        let target = Key::open(self.ctx, &self.name(key), Mode::Write);
        if target.delete() {
            self.replicate("DEL", &[key]);
        }
        Ok(())
    }

    fn time_to_live(&mut self, key: &[u8]) -> Result<Option<i64>, StoreError> {
        Ok(Key::open(self.ctx, &self.name(key), Mode::Read).time_to_live())
    }

    fn set_time_to_live(&mut self, key: &[u8], millis: i64) -> Result<(), StoreError> {
        // PEXPIRE with a time not in the future deletes the key; SetExpire would refuse it (or,
        // at -1, remove the expiry), so this does what the Lua twin's PEXPIRE does.
        if millis <= 0 {
            return self.delete(key);
        }
        let target = Key::open(self.ctx, &self.name(key), Mode::Write);
        if target.set_time_to_live(millis) {
            let at = key::milliseconds().saturating_add(millis).to_string();
            self.replicate("PEXPIREAT", &[key, at.as_bytes()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_are_written_so_that_they_read_back_exactly() {
        for score in [0.0, 1.5, -2.25, 1e300, 1.7e15 + 1.0, 0.1, f64::INFINITY, f64::NEG_INFINITY, 5e-324] {
            let text = score_text(score);
            let back: f64 = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(back.to_bits(), score.to_bits(), "{text}");
        }
        assert_eq!(score_text(f64::INFINITY), "inf");
    }

    #[test]
    fn a_field_that_is_not_an_integer_is_reported_as_corrupt() {
        assert_eq!(integer(b"k", b"f", b"-42"), Ok(-42));
        let err = integer(b"k", b"f", b"1.5").unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { ref key, .. } if key == "k"), "{err:?}");
        assert!(integer(b"k", b"f", b"99999999999999999999").is_err());
    }
}
