//! [`ModuleStore`]: `tollgate_core::script::Store` over the module API, for the command's one
//! call to `execute`.
//!
//! Every access goes through the low-level key API ([`crate::key`]), none through
//! `RedisModule_Call`: it is the cheaper path (no command lookup, no argument strings, no reply
//! objects). Each key is opened once per call, for writing, on its first use, and closed when
//! the store is dropped, at the end of the call; a key is signalled modified (`WATCH`,
//! client-side caching) then if, and only if, the call wrote it, so a check that changed
//! nothing (a denial) touches no watcher.
//!
//! The low-level writes are not replicated by Redis, so each write replicates itself as the
//! plain command that has its effect (HSET, HDEL, ZADD, ZREM, DEL, PEXPIREAT), which Redis
//! wraps with the command's other writes in one MULTI/EXEC for the replicas and the AOF.
//! `execute` writes a hash once per call (one HSET of the fields that changed) and its TTL
//! only when it must grow, so a decision on a shared hash replicates one HSET, and a PEXPIREAT
//! only when its expiry moves. The command itself is never replicated: it reads the clock, so a
//! replica re-running it would decide at another time.

use std::time::{SystemTime, UNIX_EPOCH};

use redis_module::RedisString;
use redis_module::raw::{KeyType, RedisModuleCtx, RedisModuleString};
use smallvec::SmallVec;
use tollgate_core::script::{Store, StoreError, parse_int};

use crate::key::{self, Key};

/// From this many fields wanted of one hash on, they are read in one pass over the hash
/// rather than one by one: a listpack (a small hash) is searched from its start for each field,
/// so many fields cost the square of their number (12 fields of a 12-field hash: 20k
/// instructions one by one, measured with callgrind).
const SCAN_FIELDS: usize = 5;

/// The store of one command call.
pub struct ModuleStore<'a> {
    ctx: *mut RedisModuleCtx,
    /// The call's keys, as bytes and as the strings Redis passed (`argv`), by position.
    keys: &'a [&'a [u8]],
    names: &'a [*mut RedisModuleString],
    /// The keys opened so far.
    open: SmallVec<[Open; 4]>,
    /// Redis's clock in milliseconds, read once per call (TTLs are set and compared on it).
    clock: Option<i64>,
}

/// A key opened by this call.
struct Open {
    /// Its name: one of the call's strings, or (for a key that is not one of the call's, which
    /// `execute` never names) a string of the store's own.
    name: *mut RedisModuleString,
    /// The string behind `name` when the store made it.
    _owned: Option<RedisString>,
    /// Its name as bytes (borrowed from the string, which lives as long as the call).
    bytes: *const [u8],
    key: Key,
    /// Whether this call wrote it.
    written: bool,
}

impl<'a> ModuleStore<'a> {
    /// A store over the database `ctx` has selected, for a call whose keys are `keys` (bytes)
    /// and `names` (the same, as the strings Redis passed).
    pub fn new(ctx: *mut RedisModuleCtx, keys: &'a [&'a [u8]], names: &'a [*mut RedisModuleString]) -> Self {
        debug_assert_eq!(keys.len(), names.len());
        ModuleStore { ctx, keys, names, open: SmallVec::new(), clock: None }
    }

    /// The open key named `name`, opened now if this is its first use.
    fn key(&mut self, name: &[u8]) -> usize {
        #[allow(unsafe_code)]
        // SAFETY: `bytes` points into a string that lives as long as the call (one of the call's
        // arguments, or a string the entry owns), and so as long as the store.
        let found = self.open.iter().position(|open| unsafe { &*open.bytes } == name);
        if let Some(at) = found {
            return at;
        }
        // `execute` passes the call's own key slices: found by address first, by bytes else.
        let given = self
            .keys
            .iter()
            .position(|k| std::ptr::eq(k.as_ptr(), name.as_ptr()) && k.len() == name.len())
            .or_else(|| self.keys.iter().position(|k| *k == name));
        let (string, owned, bytes) = match given {
            Some(at) => (self.names[at], None, self.keys[at] as *const [u8]),
            None => {
                let owned = key::string(self.ctx, name);
                (owned.inner, Some(owned), name as *const [u8])
            }
        };
        let bytes = match &owned {
            Some(owned) => owned.as_slice() as *const [u8],
            None => bytes,
        };
        let key = Key::open_for_writing(self.ctx, string);
        self.open.push(Open { name: string, _owned: owned, bytes, key, written: false });
        self.open.len() - 1
    }

    /// The open key named `name`, which must hold `kind` or nothing.
    fn key_of(&mut self, name: &[u8], kind: KeyType) -> Result<usize, StoreError> {
        let at = self.key(name);
        match self.open[at].key.kind() {
            KeyType::Empty => Ok(at),
            found if found == kind => Ok(at),
            _ => Err(StoreError::WrongType),
        }
    }

    fn strings(&self, items: &[&[u8]]) -> SmallVec<[RedisString; 12]> {
        items.iter().map(|item| key::string(self.ctx, item)).collect()
    }

    /// Redis's clock in milliseconds, the same all through the call.
    fn clock(&mut self) -> i64 {
        *self.clock.get_or_insert_with(key::milliseconds)
    }

    /// Makes the key at `at` (holding a value) expire at `expires` (ms since the epoch).
    fn expire_at(&mut self, at: usize, expires: i64) {
        let open = &mut self.open[at];
        if open.key.set_expiry(expires) {
            open.written = true;
            let when = key::integer_string(self.ctx, expires);
            key::replicate(self.ctx, c"PEXPIREAT", &[open.name, when.inner]);
        }
    }
}

impl Drop for ModuleStore<'_> {
    /// Signals each key the call wrote, then closes every key (`Key`'s own drop).
    fn drop(&mut self) {
        for open in self.open.iter().filter(|open| open.written) {
            key::signal_modified(self.ctx, open.name);
        }
    }
}

/// A hash field's value, which Tollgate writes as a decimal integer.
fn integer(key: &[u8], field: &[u8], value: &[u8]) -> Result<i64, StoreError> {
    parse_int(value).ok_or_else(|| corrupt(key, field, value))
}

/// A field name's length and first and last bytes: names that differ in these differ.
fn tag(name: &[u8]) -> u32 {
    let ends = match name {
        [] => 0,
        [first, .., last] => u32::from(*first) << 8 | u32::from(*last),
        [only] => u32::from(*only) << 8 | u32::from(*only),
    };
    (name.len() as u32) << 16 ^ ends
}

fn corrupt(key: &[u8], field: &[u8], value: &[u8]) -> StoreError {
    StoreError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        what: format!(
            "field {:?} is {:?}, not an integer",
            String::from_utf8_lossy(field),
            String::from_utf8_lossy(value)
        ),
    }
}

/// A score as ZADD reads it back exactly: Rust's shortest round-trip form (`inf`, `-inf`,
/// `1e300`, `0.5`), which `strtod` parses to the same double.
fn score_text(score: f64) -> String {
    format!("{score:?}")
}

impl Store for ModuleStore<'_> {
    /// The system clock, read in-process: what Redis's `TIME` (the Lua twin's clock) reads.
    /// Its milliseconds are the call's clock for TTLs too, as Redis's `mstime()` would read them.
    fn now(&mut self) -> Result<i64, StoreError> {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| StoreError::Other("ERR tollgate: the server's clock is before 1970".into()))?;
        let micros = i64::try_from(since_epoch.as_micros())
            .map_err(|_| StoreError::Other("ERR tollgate: the server's clock is past year 294,000".into()))?;
        self.clock.get_or_insert(micros.div_euclid(1000));
        Ok(micros)
    }

    fn hash_get(&mut self, key: &[u8], fields: &[&[u8]], out: &mut [Option<i64>]) -> Result<(), StoreError> {
        let at = self.key_of(key, KeyType::Hash)?;
        out.fill(None);
        if self.open[at].key.kind() == KeyType::Empty || fields.is_empty() {
            return Ok(());
        }
        if fields.len() >= SCAN_FIELDS {
            // One pass over the hash; each field it holds matched against those wanted, by a
            // tag of their length and ends first (cheaper than comparing the bytes of each).
            let tags: SmallVec<[u32; 12]> = fields.iter().map(|field| tag(field)).collect();
            let mut bad: Option<(usize, Vec<u8>)> = None;
            self.open[at].key.hash_scan(|field, value| {
                let wanted = tag(field);
                for (((name, slot), &tag), i) in fields.iter().zip(out.iter_mut()).zip(&tags).zip(0..) {
                    if tag == wanted && *name == field {
                        match parse_int(value) {
                            Some(value) => *slot = Some(value),
                            None => bad = bad.take().or_else(|| Some((i, value.to_vec()))),
                        }
                    }
                }
            });
            return match bad {
                Some((i, value)) => Err(corrupt(key, fields[i], &value)),
                None => Ok(()),
            };
        }
        let names = self.strings(fields);
        let mut values: SmallVec<[Option<RedisString>; 12]> = (0..fields.len()).map(|_| None).collect();
        self.open[at].key.hash_get(&names, &mut values);
        for ((slot, value), field) in out.iter_mut().zip(&values).zip(fields) {
            if let Some(value) = value {
                *slot = Some(integer(key, field, value.as_slice())?);
            }
        }
        Ok(())
    }

    fn hash_set(&mut self, key: &[u8], fields: &[(&[u8], i64)]) -> Result<(), StoreError> {
        if fields.is_empty() {
            return Ok(());
        }
        let at = self.key_of(key, KeyType::Hash)?;
        let names: SmallVec<[RedisString; 12]> =
            fields.iter().map(|(f, _)| key::string(self.ctx, f)).collect();
        let values: SmallVec<[RedisString; 12]> =
            fields.iter().map(|(_, v)| key::integer_string(self.ctx, *v)).collect();
        let pairs: SmallVec<[_; 12]> = names.iter().zip(&values).map(|(f, v)| (f, Some(v))).collect();
        let open = &mut self.open[at];
        open.key.hash_set(&pairs);
        open.written = true;
        let mut args: SmallVec<[*mut RedisModuleString; 25]> = SmallVec::new();
        args.push(open.name);
        for (f, v) in names.iter().zip(&values) {
            args.extend([f.inner, v.inner]);
        }
        key::replicate(self.ctx, c"HSET", &args);
        Ok(())
    }

    fn hash_delete(&mut self, key: &[u8], fields: &[&[u8]]) -> Result<(), StoreError> {
        let at = self.key_of(key, KeyType::Hash)?;
        if fields.is_empty() || self.open[at].key.kind() == KeyType::Empty {
            return Ok(());
        }
        let names = self.strings(fields);
        let pairs: SmallVec<[_; 12]> = names.iter().map(|f| (f, None)).collect();
        let open = &mut self.open[at];
        open.key.hash_set(&pairs);
        open.written = true;
        let mut args: SmallVec<[*mut RedisModuleString; 13]> = SmallVec::new();
        args.push(open.name);
        args.extend(names.iter().map(|f| f.inner));
        key::replicate(self.ctx, c"HDEL", &args);
        Ok(())
    }

    fn sorted_set(&mut self, key: &[u8]) -> Result<Vec<(Vec<u8>, f64)>, StoreError> {
        let at = self.key_of(key, KeyType::ZSet)?;
        Ok(self.open[at].key.sorted_set())
    }

    fn sorted_set_add(&mut self, key: &[u8], members: &[(f64, &[u8])]) -> Result<(), StoreError> {
        if members.iter().any(|(score, _)| score.is_nan()) {
            return Err(StoreError::Other("ERR tollgate: a sorted set score is not a number".into()));
        }
        if members.is_empty() {
            return Ok(());
        }
        let at = self.key_of(key, KeyType::ZSet)?;
        let ctx = self.ctx;
        let strings: Vec<(RedisString, RedisString)> = members
            .iter()
            .map(|(score, member)| {
                (key::string(ctx, score_text(*score).as_bytes()), key::string(ctx, member))
            })
            .collect();
        let open = &mut self.open[at];
        let mut args = Vec::with_capacity(1 + 2 * members.len());
        args.push(open.name);
        for ((score, _), (text, member)) in members.iter().zip(&strings) {
            if !open.key.sorted_set_add(*score, member) {
                return Err(StoreError::Other("ERR tollgate: Redis refused a sorted set member".into()));
            }
            open.written = true;
            args.extend([text.inner, member.inner]);
        }
        key::replicate(ctx, c"ZADD", &args);
        Ok(())
    }

    fn sorted_set_remove(&mut self, key: &[u8], members: &[&[u8]]) -> Result<(), StoreError> {
        let at = self.key_of(key, KeyType::ZSet)?;
        if members.is_empty() || self.open[at].key.kind() == KeyType::Empty {
            return Ok(());
        }
        let ctx = self.ctx;
        let strings: Vec<RedisString> = members.iter().map(|member| key::string(ctx, member)).collect();
        let open = &mut self.open[at];
        for member in &strings {
            open.key.sorted_set_remove(member);
        }
        open.written = true;
        let mut args = Vec::with_capacity(1 + members.len());
        args.push(open.name);
        args.extend(strings.iter().map(|member| member.inner));
        key::replicate(ctx, c"ZREM", &args);
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError> {
        let at = self.key(key);
        let open = &mut self.open[at];
        if open.key.delete() {
            open.written = true;
            key::replicate(self.ctx, c"DEL", &[open.name]);
        }
        Ok(())
    }

    fn time_to_live(&mut self, key: &[u8]) -> Result<Option<i64>, StoreError> {
        let clock = self.clock();
        let at = self.key(key);
        Ok(self.open[at].key.expiry().map(|expires| expires - clock))
    }

    fn set_time_to_live(&mut self, key: &[u8], millis: i64) -> Result<(), StoreError> {
        // PEXPIRE with a time not in the future deletes the key; SetAbsExpire would refuse it,
        // so this does what the Lua twin's PEXPIRE does.
        if millis <= 0 {
            return self.delete(key);
        }
        let expires = self.clock().saturating_add(millis);
        let at = self.key(key);
        if self.open[at].key.expiry() != Some(expires) {
            self.expire_at(at, expires);
        }
        Ok(())
    }

    /// Compares absolute expiries, both on the call's one reading of Redis's clock, so a TTL
    /// that covers `millis` is never rewritten for the milliseconds the call took.
    fn extend_time_to_live(&mut self, key: &[u8], millis: i64) -> Result<(), StoreError> {
        if millis <= 0 {
            return Ok(());
        }
        let expires = self.clock().saturating_add(millis);
        let at = self.key(key);
        if self.open[at].key.expiry().is_none_or(|current| current < expires) {
            self.expire_at(at, expires);
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
