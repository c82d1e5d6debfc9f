//! [`MapStore`]: an in-process [`Store`] that behaves as Redis does for the commands a Redis
//! module would issue, so `tollgate_core::script::execute` can be tested (and fuzzed) without
//! a server.

use std::collections::{BTreeMap, HashMap};

use tollgate_core::script::{Store, StoreError};

use crate::TestStore;

/// A value under a key.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A hash of integer fields.
    Hash(BTreeMap<Vec<u8>, i64>),
    /// A sorted set: member to score.
    SortedSet(BTreeMap<Vec<u8>, f64>),
    /// A string (never written by Tollgate: a wrong type for every state).
    Text(Vec<u8>),
}

/// Keys, values and expiries in memory, on a clock the test sets. Expired keys are gone, as
/// in Redis; every command is counted.
#[derive(Debug, Default)]
pub struct MapStore {
    values: HashMap<Vec<u8>, Value>,
    /// Each key's expiry, in microseconds.
    expiries: HashMap<Vec<u8>, i64>,
    /// The store's clock, in microseconds.
    pub now: i64,
    /// Commands run, by name (`HSET`, `PEXPIRE`, ...).
    pub commands: BTreeMap<&'static str, usize>,
}

impl MapStore {
    /// The value at `key`, if it has not expired.
    pub fn get(&self, key: &[u8]) -> Option<&Value> {
        if self.expiries.get(key).is_some_and(|&at| at <= self.now) {
            return None;
        }
        self.values.get(key)
    }

    /// Puts `value` at `key` without an expiry (to plant a wrong type or a corrupt state).
    pub fn put(&mut self, key: &[u8], value: Value) {
        self.values.insert(key.to_vec(), value);
        self.expiries.remove(key);
    }

    /// Every key's value and expiry, to compare before and after a call.
    pub fn contents(&self) -> (HashMap<Vec<u8>, Value>, HashMap<Vec<u8>, i64>) {
        (self.values.clone(), self.expiries.clone())
    }

    /// The live keys.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.values.keys().filter(|k| self.get(k).is_some()).cloned().collect()
    }

    /// When `key` expires (microseconds), if it has an expiry.
    pub fn expiry(&self, key: &[u8]) -> Option<i64> {
        self.expiries.get(key).copied()
    }

    fn count(&mut self, command: &'static str) {
        *self.commands.entry(command).or_default() += 1;
    }

    fn purge(&mut self, key: &[u8]) {
        if self.expiries.get(key).is_some_and(|&at| at <= self.now) {
            self.values.remove(key);
            self.expiries.remove(key);
        }
    }

    fn hash_mut(&mut self, key: &[u8]) -> Result<&mut BTreeMap<Vec<u8>, i64>, StoreError> {
        self.purge(key);
        match self.values.entry(key.to_vec()).or_insert_with(|| Value::Hash(BTreeMap::new())) {
            Value::Hash(hash) => Ok(hash),
            _ => Err(StoreError::WrongType),
        }
    }

    fn set_mut(&mut self, key: &[u8]) -> Result<&mut BTreeMap<Vec<u8>, f64>, StoreError> {
        self.purge(key);
        match self.values.entry(key.to_vec()).or_insert_with(|| Value::SortedSet(BTreeMap::new())) {
            Value::SortedSet(set) => Ok(set),
            _ => Err(StoreError::WrongType),
        }
    }

    /// Removes `key` if its hash or set is empty, as Redis does.
    fn drop_if_empty(&mut self, key: &[u8]) {
        let empty = match self.values.get(key) {
            Some(Value::Hash(hash)) => hash.is_empty(),
            Some(Value::SortedSet(set)) => set.is_empty(),
            _ => false,
        };
        if empty {
            self.values.remove(key);
            self.expiries.remove(key);
        }
    }
}

impl Store for MapStore {
    fn now(&mut self) -> Result<i64, StoreError> {
        self.count("TIME");
        Ok(self.now)
    }

    fn hash_get(&mut self, key: &[u8], fields: &[&[u8]], out: &mut [Option<i64>]) -> Result<(), StoreError> {
        self.count("HMGET");
        match self.get(key) {
            None => out.fill(None),
            Some(Value::Hash(hash)) => {
                for (slot, field) in out.iter_mut().zip(fields) {
                    *slot = hash.get(*field).copied();
                }
            }
            Some(_) => return Err(StoreError::WrongType),
        }
        Ok(())
    }

    fn hash_set(&mut self, key: &[u8], fields: &[(&[u8], i64)]) -> Result<(), StoreError> {
        self.count("HSET");
        let hash = self.hash_mut(key)?;
        for (field, value) in fields {
            hash.insert(field.to_vec(), *value);
        }
        Ok(())
    }

    fn hash_delete(&mut self, key: &[u8], fields: &[&[u8]]) -> Result<(), StoreError> {
        self.count("HDEL");
        if self.get(key).is_none() {
            return Ok(());
        }
        let hash = self.hash_mut(key)?;
        for field in fields {
            hash.remove(*field);
        }
        self.drop_if_empty(key);
        Ok(())
    }

    fn sorted_set(&mut self, key: &[u8]) -> Result<Vec<(Vec<u8>, f64)>, StoreError> {
        self.count("ZRANGE");
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::SortedSet(set)) => {
                let mut members: Vec<(Vec<u8>, f64)> = set.iter().map(|(m, s)| (m.clone(), *s)).collect();
                members.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
                Ok(members)
            }
            Some(_) => Err(StoreError::WrongType),
        }
    }

    fn sorted_set_add(&mut self, key: &[u8], members: &[(f64, &[u8])]) -> Result<(), StoreError> {
        self.count("ZADD");
        let set = self.set_mut(key)?;
        for (score, member) in members {
            set.insert(member.to_vec(), *score);
        }
        Ok(())
    }

    fn sorted_set_remove(&mut self, key: &[u8], members: &[&[u8]]) -> Result<(), StoreError> {
        self.count("ZREM");
        if self.get(key).is_none() {
            return Ok(());
        }
        let set = self.set_mut(key)?;
        for member in members {
            set.remove(*member);
        }
        self.drop_if_empty(key);
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError> {
        self.count("DEL");
        self.values.remove(key);
        self.expiries.remove(key);
        Ok(())
    }

    fn time_to_live(&mut self, key: &[u8]) -> Result<Option<i64>, StoreError> {
        self.count("PTTL");
        if self.get(key).is_none() {
            return Ok(None);
        }
        Ok(self.expiries.get(key).map(|&at| (at - self.now) / 1000))
    }

    fn set_time_to_live(&mut self, key: &[u8], millis: i64) -> Result<(), StoreError> {
        self.count("PEXPIRE");
        if self.get(key).is_some() {
            self.expiries.insert(key.to_vec(), self.now + millis * 1000);
        }
        Ok(())
    }
}

impl TestStore for MapStore {
    fn set_now(&mut self, micros: i64) {
        self.now = micros;
    }
}
