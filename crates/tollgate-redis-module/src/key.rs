//! A key opened through the module API's low-level key interface, and the other C functions
//! the store needs (replication, the modified-key signal, the clock): the only place the crate
//! calls Redis's C functions for data (the rest goes through `redis-module`'s safe wrappers).
//!
//! `redis-module` wraps hashes with C-string field names only, one field per call, and does not
//! wrap sorted sets, so this calls the functions itself, with field names and members as
//! `RedisModuleString`s (which may hold any bytes), several fields per call.
//!
//! Strings: every string Redis hands back (a hash field's value, a sorted set's member) is new
//! and ours to free, and is freed exactly once: it is wrapped at once with
//! [`RedisString::from_redis_module_string`], which takes it over without retaining it (and
//! frees it when dropped). [`RedisString::new`] would retain it a second time, and leak it.

use std::ffi::{CStr, c_int, c_void};
use std::ptr;

use redis_module::RedisString;
use redis_module::raw::{self, KeyType, RedisModuleCtx, RedisModuleKey, RedisModuleString};

/// Pairs of (field, value) passed to one variadic `HashGet` or `HashSet` call. More are passed
/// in several calls.
const PAIRS_PER_CALL: usize = 8;

/// An open key, closed when dropped.
pub struct Key {
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleKey,
}

/// A new string holding `bytes`, freed when dropped.
pub fn string(ctx: *mut RedisModuleCtx, bytes: &[u8]) -> RedisString {
    RedisString::create_from_slice(ctx, bytes)
}

/// A new string holding `value` in decimal, freed when dropped.
pub fn integer_string(ctx: *mut RedisModuleCtx, value: i64) -> RedisString {
    let create = api!(RedisModule_CreateStringFromLongLong);
    #[allow(unsafe_code)]
    // SAFETY: `ctx` is the live context of the command being run; the new string is ours, and
    // handed to a RedisString that frees it once.
    let inner = unsafe { create(ctx, value) };
    RedisString::from_redis_module_string(ctx, inner)
}

impl Key {
    /// Opens `name` in the context's database for reading and writing: a missing key is an
    /// empty key (a handle all the same). Closing it does not mark it modified (the module
    /// sets `REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED`): the store signals the keys it
    /// wrote ([`signal_modified`]).
    pub fn open_for_writing(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) -> Key {
        let open = api!(RedisModule_OpenKey);
        let bits = raw::REDISMODULE_READ | raw::REDISMODULE_WRITE;
        #[allow(unsafe_code)]
        // SAFETY: `ctx` is the live context of the command being run, and `name` a valid string
        // that outlives the call; OpenKey retains what it keeps of it. The returned handle is
        // closed exactly once, by `Drop`.
        let key = unsafe { open(ctx, name, bits as c_int) }.cast::<RedisModuleKey>();
        Key { ctx, key }
    }

    /// The type of the value at the key (`Empty` when there is none).
    pub fn kind(&self) -> KeyType {
        if self.key.is_null() {
            return KeyType::Empty;
        }
        let kind = api!(RedisModule_KeyType);
        #[allow(unsafe_code)]
        // SAFETY: `self.key` is an open, non-null key handle (see `open_for_writing`).
        let kind = unsafe { kind(self.key) };
        KeyType::from(kind)
    }

    /// The values of `fields` of the hash, into `out` (one per field; `None` where absent).
    /// The caller checked the key is a hash.
    pub fn hash_get(&self, fields: &[RedisString], out: &mut [Option<RedisString>]) {
        if self.key.is_null() {
            return;
        }
        let get = api!(RedisModule_HashGet);
        let flags = raw::REDISMODULE_HASH_NONE as c_int;
        let null = ptr::null_mut::<RedisModuleString>();
        for (fields, out) in fields.chunks(PAIRS_PER_CALL).zip(out.chunks_mut(PAIRS_PER_CALL)) {
            let mut values = [null; PAIRS_PER_CALL];
            let f = |i: usize| fields[i].inner;
            let v = values.as_mut_ptr();
            #[allow(unsafe_code)]
            // SAFETY: a non-null open key holding a hash (checked by the caller, so HashGet does
            // not fail on the type); with REDISMODULE_HASH_NONE the variadic arguments are pairs
            // of (RedisModuleString *field, RedisModuleString **value) ended by NULL, which is
            // what each arm passes: `fields.len()` pairs (at most PAIRS_PER_CALL), each value
            // pointer into `values`, which outlives the call. HashGet writes a new string, or
            // NULL, into each.
            unsafe {
                let k = self.key;
                match fields.len() {
                    1 => get(k, flags, f(0), v, null),
                    2 => get(k, flags, f(0), v, f(1), v.add(1), null),
                    3 => get(k, flags, f(0), v, f(1), v.add(1), f(2), v.add(2), null),
                    4 => get(k, flags, f(0), v, f(1), v.add(1), f(2), v.add(2), f(3), v.add(3), null),
                    5 => get(
                        k,
                        flags,
                        f(0),
                        v,
                        f(1),
                        v.add(1),
                        f(2),
                        v.add(2),
                        f(3),
                        v.add(3),
                        f(4),
                        v.add(4),
                        null,
                    ),
                    6 => get(
                        k,
                        flags,
                        f(0),
                        v,
                        f(1),
                        v.add(1),
                        f(2),
                        v.add(2),
                        f(3),
                        v.add(3),
                        f(4),
                        v.add(4),
                        f(5),
                        v.add(5),
                        null,
                    ),
                    7 => get(
                        k,
                        flags,
                        f(0),
                        v,
                        f(1),
                        v.add(1),
                        f(2),
                        v.add(2),
                        f(3),
                        v.add(3),
                        f(4),
                        v.add(4),
                        f(5),
                        v.add(5),
                        f(6),
                        v.add(6),
                        null,
                    ),
                    _ => get(
                        k,
                        flags,
                        f(0),
                        v,
                        f(1),
                        v.add(1),
                        f(2),
                        v.add(2),
                        f(3),
                        v.add(3),
                        f(4),
                        v.add(4),
                        f(5),
                        v.add(5),
                        f(6),
                        v.add(6),
                        f(7),
                        v.add(7),
                        null,
                    ),
                };
            }
            for (slot, value) in out.iter_mut().zip(values) {
                // Each new string is ours: taken over (not retained), freed once when dropped.
                *slot = (!value.is_null()).then(|| RedisString::from_redis_module_string(self.ctx, value));
            }
        }
    }

    /// Calls `visit` with each field and value of the hash, in one pass over it (a listpack's
    /// fields are otherwise found one by one from its start: reading many fields that way costs
    /// the square of their number). The caller checked the key is a hash. `visit` must not
    /// panic (it runs under a C callback, where a panic aborts the server).
    pub fn hash_scan<F: FnMut(&[u8], &[u8])>(&self, mut visit: F) {
        if self.key.is_null() {
            return;
        }
        /// The C callback: hands each pair to the closure `data` points to.
        extern "C" fn each<F: FnMut(&[u8], &[u8])>(
            _key: *mut RedisModuleKey,
            field: *mut RedisModuleString,
            value: *mut RedisModuleString,
            data: *mut c_void,
        ) {
            if field.is_null() || value.is_null() || data.is_null() {
                return;
            }
            #[allow(unsafe_code)]
            // SAFETY: `data` is the `&mut F` hash_scan passed to ScanKey, alive and not otherwise
            // borrowed while ScanKey runs; Redis calls this on the same thread, during ScanKey.
            let visit = unsafe { &mut *data.cast::<F>() };
            visit(RedisString::string_as_slice(field), RedisString::string_as_slice(value));
        }
        let create = api!(RedisModule_ScanCursorCreate);
        let scan = api!(RedisModule_ScanKey);
        let destroy = api!(RedisModule_ScanCursorDestroy);
        let data = (&mut visit as *mut F).cast::<c_void>();
        #[allow(unsafe_code)]
        // SAFETY: a non-null open key holding a hash (checked by the caller); the cursor is
        // created, used for this key alone until ScanKey answers 0 (done), and destroyed once.
        // The strings the callback gets are Redis's, valid during the callback, and not kept.
        unsafe {
            let cursor = create();
            while scan(self.key, cursor, Some(each::<F>), data) != 0 {}
            destroy(cursor);
        }
    }

    /// Sets each field to its value (the key opened for writing, a hash or empty), or deletes
    /// it where the value is `None`. Deleting a hash's last field deletes the key, as HDEL does.
    pub fn hash_set(&self, pairs: &[(&RedisString, Option<&RedisString>)]) {
        if self.key.is_null() {
            return;
        }
        let set = api!(RedisModule_HashSet);
        let flags = raw::REDISMODULE_HASH_NONE as c_int;
        let null = ptr::null_mut::<RedisModuleString>();
        for pairs in pairs.chunks(PAIRS_PER_CALL) {
            let f = |i: usize| pairs[i].0.inner;
            let v =
                |i: usize| pairs[i].1.map_or(raw::REDISMODULE_HASH_DELETE.cast_mut(), |value| value.inner);
            #[allow(unsafe_code)]
            // SAFETY: a non-null key opened for writing, holding a hash or empty (checked by the
            // caller); with REDISMODULE_HASH_NONE the variadic arguments are (field, value)
            // pairs of RedisModuleString pointers, REDISMODULE_HASH_DELETE as a value deletes the
            // field, and NULL ends the list: each arm passes `pairs.len()` pairs (at most
            // PAIRS_PER_CALL) of strings that outlive the call. HashSet copies what it keeps.
            // Its answer counts fields that existed before, which says nothing of success, so it
            // is not read.
            unsafe {
                let k = self.key;
                match pairs.len() {
                    1 => set(k, flags, f(0), v(0), null),
                    2 => set(k, flags, f(0), v(0), f(1), v(1), null),
                    3 => set(k, flags, f(0), v(0), f(1), v(1), f(2), v(2), null),
                    4 => set(k, flags, f(0), v(0), f(1), v(1), f(2), v(2), f(3), v(3), null),
                    5 => set(k, flags, f(0), v(0), f(1), v(1), f(2), v(2), f(3), v(3), f(4), v(4), null),
                    6 => set(
                        k,
                        flags,
                        f(0),
                        v(0),
                        f(1),
                        v(1),
                        f(2),
                        v(2),
                        f(3),
                        v(3),
                        f(4),
                        v(4),
                        f(5),
                        v(5),
                        null,
                    ),
                    7 => set(
                        k,
                        flags,
                        f(0),
                        v(0),
                        f(1),
                        v(1),
                        f(2),
                        v(2),
                        f(3),
                        v(3),
                        f(4),
                        v(4),
                        f(5),
                        v(5),
                        f(6),
                        v(6),
                        null,
                    ),
                    _ => set(
                        k,
                        flags,
                        f(0),
                        v(0),
                        f(1),
                        v(1),
                        f(2),
                        v(2),
                        f(3),
                        v(3),
                        f(4),
                        v(4),
                        f(5),
                        v(5),
                        f(6),
                        v(6),
                        f(7),
                        v(7),
                        null,
                    ),
                };
            }
        }
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
        // element is a new string, ours: taken over by a RedisString, which frees it once.
        unsafe {
            if first(self.key, f64::NEG_INFINITY, f64::INFINITY, 0, 0) == raw::REDISMODULE_OK as c_int {
                while end_reached(self.key) == 0 {
                    let mut score = 0.0;
                    let member = current(self.key, &mut score);
                    if !member.is_null() {
                        let member = RedisString::from_redis_module_string(self.ctx, member);
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

    /// When the key expires, in milliseconds since the Unix epoch; `None` without an expiry or
    /// a value.
    pub fn expiry(&self) -> Option<i64> {
        if self.key.is_null() {
            return None;
        }
        let get = api!(RedisModule_GetAbsExpire);
        #[allow(unsafe_code)]
        // SAFETY: a non-null open key.
        let at = unsafe { get(self.key) };
        (at != raw::REDISMODULE_NO_EXPIRE as i64).then_some(at)
    }

    /// Makes the key (opened for writing, holding a value) expire at `at`, milliseconds since
    /// the Unix epoch (positive); false when Redis refuses (no value at the key).
    pub fn set_expiry(&self, at: i64) -> bool {
        if self.key.is_null() || self.kind() == KeyType::Empty {
            return false;
        }
        let set = api!(RedisModule_SetAbsExpire);
        #[allow(unsafe_code)]
        // SAFETY: a non-null key opened for writing, holding a value; `at` is positive (the
        // caller's), so not REDISMODULE_NO_EXPIRE.
        let status = unsafe { set(self.key, at) };
        status == raw::REDISMODULE_OK as c_int
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.key.is_null() {
            raw::close_key(self.key);
        }
    }
}

/// Replicates `command` with `args` (key first) to the replicas and the AOF, wrapped with the
/// command's other effects in one MULTI/EXEC. The strings are passed as a vector (`v`), which
/// Redis retains rather than copies.
pub fn replicate(ctx: *mut RedisModuleCtx, command: &CStr, args: &[*mut RedisModuleString]) {
    if args.is_empty() {
        return;
    }
    let replicate = api!(RedisModule_Replicate);
    #[allow(unsafe_code)]
    // SAFETY: `ctx` is the live context of the command being run; `command` a NUL-terminated
    // name of a Redis command; with the format "v" the variadic arguments are a pointer to an
    // array of RedisModuleString pointers and its length (size_t), which is what is passed, and
    // each string is valid for the call (Replicate retains what it keeps). Its answer (an
    // unknown command name) cannot happen for the fixed names the store passes.
    unsafe {
        replicate(ctx, command.as_ptr(), c"v".as_ptr(), args.as_ptr(), args.len());
    }
}

/// Tells Redis that the key `name` was modified (`WATCH`, client-side caching), in place of
/// the automatic signal the module turned off.
pub fn signal_modified(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) {
    let signal = api!(RedisModule_SignalModifiedKey);
    #[allow(unsafe_code)]
    // SAFETY: `ctx` is the live context of the command being run and `name` a valid string.
    unsafe {
        signal(ctx, name);
    }
}

/// Redis's `mstime()`: the clock key expiries are counted on.
pub fn milliseconds() -> i64 {
    let now = api!(RedisModule_Milliseconds);
    #[allow(unsafe_code)]
    // SAFETY: takes no argument and reads the server's clock.
    unsafe {
        now()
    }
}
