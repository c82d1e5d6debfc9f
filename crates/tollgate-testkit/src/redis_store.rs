//! [`RedisStore`]: a [`Store`] over a Redis connection, one command per call. Not atomic (a
//! module runs `execute` inside Redis, where nothing else runs meanwhile): for tests in which
//! one client at a time takes turns with the Lua twins on the same keys.

use redis::{Connection, RedisError, Value};
use tollgate_core::script::{Store, StoreError};

use crate::TestStore;

/// A [`Store`] over a synchronous Redis connection.
pub struct RedisStore {
    connection: Connection,
}

impl RedisStore {
    /// A store over a new connection to `url`.
    ///
    /// # Panics
    /// If Redis cannot be reached.
    pub fn open(url: &str) -> RedisStore {
        let client = redis::Client::open(url).expect("a Redis URL");
        RedisStore { connection: client.get_connection().expect("a connection to Redis") }
    }

    fn run<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        cmd.query(&mut self.connection).map_err(store_error)
    }
}

fn store_error(e: RedisError) -> StoreError {
    if e.code() == Some("WRONGTYPE") { StoreError::WrongType } else { StoreError::Other(e.to_string()) }
}

impl TestStore for RedisStore {}

impl Store for RedisStore {
    fn now(&mut self) -> Result<i64, StoreError> {
        let (seconds, micros): (i64, i64) = self.run(&redis::cmd("TIME"))?;
        Ok(seconds * 1_000_000 + micros)
    }

    fn hash_get(&mut self, key: &[u8], fields: &[&[u8]], out: &mut [Option<i64>]) -> Result<(), StoreError> {
        let values: Vec<Option<Vec<u8>>> = self.run(redis::cmd("HMGET").arg(key).arg(fields))?;
        for (slot, value) in out.iter_mut().zip(values) {
            *slot = match value {
                None => None,
                Some(text) => {
                    Some(std::str::from_utf8(&text).ok().and_then(|t| t.parse().ok()).ok_or_else(|| {
                        StoreError::Corrupt {
                            key: String::from_utf8_lossy(key).into_owned(),
                            what: "a hash field that is not an integer".to_owned(),
                        }
                    })?)
                }
            };
        }
        Ok(())
    }

    fn hash_set(&mut self, key: &[u8], fields: &[(&[u8], i64)]) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(key);
        for (field, value) in fields {
            cmd.arg(*field).arg(*value);
        }
        self.run::<Value>(&cmd).map(drop)
    }

    fn hash_delete(&mut self, key: &[u8], fields: &[&[u8]]) -> Result<(), StoreError> {
        self.run::<Value>(redis::cmd("HDEL").arg(key).arg(fields)).map(drop)
    }

    fn sorted_set(&mut self, key: &[u8]) -> Result<Vec<(Vec<u8>, f64)>, StoreError> {
        self.run(redis::cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES"))
    }

    fn sorted_set_add(&mut self, key: &[u8], members: &[(f64, &[u8])]) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(key);
        for (score, member) in members {
            // Redis reads "inf" as +inf; integers are written whole, as the Lua writes them.
            if score.is_infinite() {
                cmd.arg("+inf");
            } else {
                cmd.arg(format!("{score:.0}"));
            }
            cmd.arg(*member);
        }
        self.run::<Value>(&cmd).map(drop)
    }

    fn sorted_set_remove(&mut self, key: &[u8], members: &[&[u8]]) -> Result<(), StoreError> {
        self.run::<Value>(redis::cmd("ZREM").arg(key).arg(members)).map(drop)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError> {
        self.run::<Value>(redis::cmd("DEL").arg(key)).map(drop)
    }

    fn time_to_live(&mut self, key: &[u8]) -> Result<Option<i64>, StoreError> {
        let ttl: i64 = self.run(redis::cmd("PTTL").arg(key))?;
        Ok((ttl >= 0).then_some(ttl))
    }

    fn set_time_to_live(&mut self, key: &[u8], millis: i64) -> Result<(), StoreError> {
        self.run::<Value>(redis::cmd("PEXPIRE").arg(key).arg(millis)).map(drop)
    }
}
