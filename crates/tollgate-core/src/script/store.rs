//! [`Store`]: the Redis-shaped storage that [`execute`](super::execute) reads states from and
//! writes them to, so that the engine can run inside Redis (a module) on the very keys, and in
//! the very encoding, that the Lua twins use.

/// A failure of the store, passed on to the caller (as a Redis error reply, in a module).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A key holds a value of another type than the state it should hold.
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    /// A stored value is not what Tollgate writes (a hash field that is not an integer, a
    /// sorted set member of an unknown form).
    #[error("ERR tollgate: key {key} holds a value Tollgate did not write: {what}")]
    Corrupt {
        /// The key, lossily as text.
        key: String,
        /// What was found.
        what: String,
    },
    /// Any other failure, with the store's own message.
    #[error("{0}")]
    Other(String),
}

/// Hashes and sorted sets under byte-string keys, with expiries: the part of Redis the
/// engine's states live in. [`execute`](super::execute) reads every state a call needs before
/// it writes any, and writes what changed once, at the end, key by key: a hash's fields (those
/// of all the states it holds) are read in one [`hash_get`](Self::hash_get), and written in at
/// most one [`hash_set`](Self::hash_set) and one [`hash_delete`](Self::hash_delete), then its
/// TTL once; a key nothing changed in is not written at all.
pub trait Store {
    /// The store's clock, in microseconds since the Unix epoch (Redis's `TIME`).
    fn now(&mut self) -> Result<i64, StoreError>;

    /// The values of `fields` of the hash at `key`, as integers, into `out` (one per field;
    /// `None` where the field or the key is absent).
    fn hash_get(&mut self, key: &[u8], fields: &[&[u8]], out: &mut [Option<i64>]) -> Result<(), StoreError>;

    /// Sets `fields` of the hash at `key` (creating it).
    fn hash_set(&mut self, key: &[u8], fields: &[(&[u8], i64)]) -> Result<(), StoreError>;

    /// Deletes `fields` of the hash at `key` (a hash left empty is gone, as in Redis).
    fn hash_delete(&mut self, key: &[u8], fields: &[&[u8]]) -> Result<(), StoreError>;

    /// Every member of the sorted set at `key` with its score, in Redis's order (by score,
    /// then by member); empty when there is no key.
    fn sorted_set(&mut self, key: &[u8]) -> Result<Vec<(Vec<u8>, f64)>, StoreError>;

    /// Adds `members` (score, member) to the sorted set at `key`, or updates their scores.
    fn sorted_set_add(&mut self, key: &[u8], members: &[(f64, &[u8])]) -> Result<(), StoreError>;

    /// Removes `members` from the sorted set at `key` (a set left empty is gone).
    fn sorted_set_remove(&mut self, key: &[u8], members: &[&[u8]]) -> Result<(), StoreError>;

    /// Deletes `key`.
    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError>;

    /// The time `key` has left to live, in milliseconds; `None` when it has no expiry or does
    /// not exist.
    fn time_to_live(&mut self, key: &[u8]) -> Result<Option<i64>, StoreError>;

    /// Makes `key` expire `millis` milliseconds from now.
    fn set_time_to_live(&mut self, key: &[u8], millis: i64) -> Result<(), StoreError>;

    /// Makes `key` live at least `millis` milliseconds from now: sets its TTL when it has none
    /// or a shorter one, and leaves a longer one (the Lua's `PEXPIRE NX`, then `GT`). A store
    /// that reads a key's expiry as an absolute time should override this, comparing on one
    /// reading of its clock: the default compares [`time_to_live`](Self::time_to_live), which
    /// runs on between the two calls.
    fn extend_time_to_live(&mut self, key: &[u8], millis: i64) -> Result<(), StoreError> {
        if self.time_to_live(key)?.is_some_and(|ttl| ttl >= millis) {
            return Ok(());
        }
        self.set_time_to_live(key, millis)
    }
}
