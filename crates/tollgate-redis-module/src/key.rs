//! A key opened through the module API's low-level key interface: the only place the crate
//! calls Redis's C functions for data (the rest goes through `redis-module`'s safe wrappers).
//!
//! `redis-module` wraps hashes with C-string field names only (a field holding a NUL byte could
//! not be named) and does not wrap sorted sets, so this calls the functions itself, with field
//! names and members as `RedisModuleString`s, which may hold any bytes.

use std::ffi::c_int;
use std::ptr::{self, NonNull};

use redis_module::raw::{self, KeyType, RedisModuleCtx, RedisModuleKey, RedisModuleString};
use redis_module::{Context, RedisString};

/// How a key is opened: reading alone does not mark it modified (`WATCH`, client tracking).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `REDISMODULE_READ`.
    Read,
    /// `REDISMODULE_READ | REDISMODULE_WRITE`.
    Write,
}

/// An open key, closed when dropped. In read mode a missing key is a null handle, which every
/// method treats as the empty key.
pub struct Key {
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleKey,
}

/// The module API's function `$name`. Redis fills the table in when it loads the module; a
/// function missing from the running server (older than the API the crate was built against)
/// panics here, which the command turns into an error reply, rather than calling null.
macro_rules! api {
    ($name:ident) => {{
        #[allow(unsafe_code)]
        // SAFETY: RedisModule_Init (run by the load entry point, before any command) writes the
        // API's function pointers once, on the main thread, and nothing writes them after;
        // reading one is a copy of a pointer-sized value, taking no reference to the static.
        let function = unsafe { raw::$name };
        function.expect(concat!("the module API has no ", stringify!($name)))
    }};
}

impl Key {
    /// Opens `name` in the context's database.
    pub fn open(ctx: &Context, name: &RedisString, mode: Mode) -> Key {
        let bits = match mode {
            Mode::Read => raw::REDISMODULE_READ,
            Mode::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        };
        let ctx = ctx.get_raw();
        let open = api!(RedisModule_OpenKey);
        #[allow(unsafe_code)]
        // SAFETY: `ctx` is the live context of the command being run (a `Context` borrows it for
        // the call), and `name.inner` a valid string that outlives the call; OpenKey does not keep
        // the name. The returned handle is closed exactly once, by `Drop`.
        let key = unsafe { open(ctx, name.inner, bits as c_int) }.cast::<RedisModuleKey>();
        Key { ctx, key }
    }

    /// The type of the value at the key (`Empty` when there is none).
    pub fn kind(&self) -> KeyType {
        if self.key.is_null() {
            return KeyType::Empty;
        }
        let kind = api!(RedisModule_KeyType);
        #[allow(unsafe_code)]
        // SAFETY: `self.key` is an open, non-null key handle (see `open`).
        let kind = unsafe { kind(self.key) };
        KeyType::from(kind)
    }

    /// A new string of the context's, holding `bytes`, freed when dropped.
    pub fn string(&self, bytes: &[u8]) -> RedisString {
        RedisString::create_from_slice(self.ctx, bytes)
    }

    /// The value of `field` of the hash, as bytes (`None` when absent). The caller checked the
    /// key is a hash or empty.
    pub fn hash_get(&self, field: &RedisString) -> Option<Vec<u8>> {
        if self.key.is_null() {
            return None;
        }
        let get = api!(RedisModule_HashGet);
        let mut value: *mut RedisModuleString = ptr::null_mut();
        #[allow(unsafe_code)]
        // SAFETY: a non-null open key holding a hash (checked by the caller, so HashGet does not
        // fail on the type); with REDISMODULE_HASH_NONE the variadic arguments are pairs of
        // (RedisModuleString *field, RedisModuleString **value) ended by NULL, which is what is
        // passed. HashGet writes a new string, or NULL, into `value`.
        unsafe {
            get(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                &mut value as *mut *mut RedisModuleString,
                ptr::null_mut::<RedisModuleString>(),
            )
        };
        // The string is ours to free (no automatic memory): RedisString frees it when dropped.
        NonNull::new(value).map(|_| RedisString::new(NonNull::new(self.ctx), value).as_slice().to_vec())
    }

    /// Sets `field` to `value` (the key opened for writing), or deletes it with `None`.
    /// Deleting a hash's last field deletes the key, as HDEL does.
    pub fn hash_set(&self, field: &RedisString, value: Option<&RedisString>) {
        if self.key.is_null() {
            return;
        }
        let set = api!(RedisModule_HashSet);
        let value = value.map_or(raw::REDISMODULE_HASH_DELETE.cast_mut(), |v| v.inner);
        #[allow(unsafe_code)]
        // SAFETY: a non-null key opened for writing, holding a hash or empty (checked by the
        // caller); with REDISMODULE_HASH_NONE the variadic arguments are (field, value) pairs
        // of RedisModuleString pointers, REDISMODULE_HASH_DELETE as a value deletes the field,
        // and NULL ends the list. HashSet copies what it keeps. Its answer counts fields that
        // existed before, which says nothing of success, so it is not read.
        unsafe {
            set(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                value,
                ptr::null_mut::<RedisModuleString>(),
            )
        };
    }

    /// Every member of the sorted set with its score, in the set's order (by score, then by
    /// member). The caller checked the key is a sorted set or empty.
    pub fn sorted_set(&self) -> Vec<(Vec<u8>, f64)> {
        let mut members = Vec::new();
        if self.key.is_null() || self.kind() != KeyType::ZSet {
            return members;
        }
        let first = api!(RedisModule_ZsetFirstInScoreRange);
        let end_reached = api!(RedisModule_ZsetRangeEndReached);
        let current = api!(RedisModule_ZsetRangeCurrentElement);
        let next = api!(RedisModule_ZsetRangeNext);
        let stop = api!(RedisModule_ZsetRangeStop);
        #[allow(unsafe_code)]
        // SAFETY: a non-null key holding a sorted set. The range functions are called in the
        // order the API prescribes (first, then current/next until the end, then stop), on
        // this key alone, and the range is stopped before the key can be closed. Each current
        // element is a new string, ours to free: RedisString frees it when dropped.
        unsafe {
            if first(self.key, f64::NEG_INFINITY, f64::INFINITY, 0, 0) == raw::REDISMODULE_OK as c_int {
                while end_reached(self.key) == 0 {
                    let mut score = 0.0;
                    let member = current(self.key, &mut score);
                    if !member.is_null() {
                        let member = RedisString::new(NonNull::new(self.ctx), member);
                        members.push((member.as_slice().to_vec(), score));
                    }
                    if next(self.key) == 0 {
                        break;
                    }
                }
            }
            stop(self.key);
        }
        members
    }

    /// Adds `member` with `score`, or updates its score (the key opened for writing, a sorted
    /// set or empty). False when Redis refuses (a NaN score).
    pub fn sorted_set_add(&self, score: f64, member: &RedisString) -> bool {
        if self.key.is_null() {
            return false;
        }
        let add = api!(RedisModule_ZsetAdd);
        #[allow(unsafe_code)]
        // SAFETY: a non-null key opened for writing, holding a sorted set or empty; `member`
        // is a valid string, which ZsetAdd copies; the flags pointer may be NULL (no flags in,
        // none wanted out).
        let status = unsafe { add(self.key, score, member.inner, ptr::null_mut()) };
        status == raw::REDISMODULE_OK as c_int
    }

    /// Removes `member` (the key opened for writing). Removing the last member deletes the key.
    pub fn sorted_set_remove(&self, member: &RedisString) -> bool {
        if self.key.is_null() {
            return false;
        }
        let remove = api!(RedisModule_ZsetRem);
        let mut deleted: c_int = 0;
        #[allow(unsafe_code)]
        // SAFETY: a non-null key opened for writing, holding a sorted set (or empty, when
        // ZsetRem answers an error and touches nothing); `deleted` is a valid out pointer.
        let status = unsafe { remove(self.key, member.inner, &mut deleted) };
        status == raw::REDISMODULE_OK as c_int && deleted != 0
    }

    /// Deletes the key (opened for writing); false when there was none.
    pub fn delete(&self) -> bool {
        if self.key.is_null() || self.kind() == KeyType::Empty {
            return false;
        }
        let delete = api!(RedisModule_DeleteKey);
        #[allow(unsafe_code)]
        // SAFETY: a non-null key opened for writing, holding a value.
        let status = unsafe { delete(self.key) };
        status == raw::REDISMODULE_OK as c_int
    }

    /// The milliseconds the key has left to live; `None` without an expiry or a value.
    pub fn time_to_live(&self) -> Option<i64> {
        if self.key.is_null() {
            return None;
        }
        let get = api!(RedisModule_GetExpire);
        #[allow(unsafe_code)]
        // SAFETY: a non-null open key.
        let ttl = unsafe { get(self.key) };
        (ttl != raw::REDISMODULE_NO_EXPIRE as i64).then_some(ttl)
    }

    /// Makes the key (opened for writing, holding a value) expire `millis` from now; false when
    /// Redis refuses (no value at the key).
    pub fn set_time_to_live(&self, millis: i64) -> bool {
        if self.key.is_null() || self.kind() == KeyType::Empty {
            return false;
        }
        raw::set_expire(self.key, millis) == raw::Status::Ok
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.key.is_null() {
            raw::close_key(self.key);
        }
    }
}

/// Redis's `mstime()`: the clock `SetExpire` adds its milliseconds to, so that the absolute
/// time replicated (`PEXPIREAT`) is the one the master set.
pub fn milliseconds() -> i64 {
    let now = api!(RedisModule_Milliseconds);
    #[allow(unsafe_code)]
    // SAFETY: takes no argument and reads the server's clock.
    unsafe {
        now()
    }
}
