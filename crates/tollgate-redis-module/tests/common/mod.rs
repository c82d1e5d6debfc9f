//! What the module's tests share: the built module, a server that loads it, calls in the
//! script's convention (KEYS and ARGV as `tollgate-redis` builds them), and a dump of a server's
//! keys to compare.
//!
//! The module under test is the cdylib cargo builds for this test run: the crate is also an
//! rlib, so `cargo test -p tollgate-redis-module` compiles the library, both kinds at once,
//! before the tests, and the `.so` lands in `target/<profile>/deps/`, beside the test binary.
//! The tests do not link the rlib (it installs Redis's allocator, which only works inside
//! redis-server). `TOLLGATE_REDIS_MODULE=/path/to/lib.so` tests another build instead.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::collections::BTreeMap;
use std::path::PathBuf;

use tollgate_core::script::{self, Arg, StateLocation};
use tollgate_core::{Operation, Part, RuleSet, Timestamp};
use tollgate_testkit::RedisServer;

/// The module's file (see [`tollgate_testkit::redis_module`]).
pub fn module_path() -> PathBuf {
    tollgate_testkit::redis_module()
}

/// A private redis-server that loaded the module.
pub fn server_with_module(extra: &[&str]) -> RedisServer {
    RedisServer::with_module(extra)
}

/// A connection to `server`.
pub fn connect(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .and_then(|c| c.get_connection_with_timeout(std::time::Duration::from_secs(5)))
        .expect("connect to the private redis-server")
}

/// One call in the script's convention.
#[derive(Clone, Debug)]
pub struct Call {
    /// KEYS.
    pub keys: Vec<String>,
    /// ARGV.
    pub argv: Vec<String>,
}

/// The state keys of `key` under `rules`, named as `tollgate-redis` names them
/// (`tg:{key}:<signature>`, or `tg:{key}:h` for the shared hash).
pub fn state_keys(key: &str, rules: &RuleSet) -> Vec<String> {
    script::locations(rules)
        .map(|location| match location {
            StateLocation::Own { signature } => format!("tg:{{{key}}}:{signature}"),
            StateLocation::SharedHash { .. } => format!("tg:{{{key}}}:{}", script::SHARED_HASH),
        })
        .collect()
}

/// The call that decides `parts` at `now` (Redis's clock with `None`).
pub fn call(parts: &[Part<'_>], now: Option<Timestamp>) -> Call {
    let keys = parts.iter().flat_map(|p| state_keys(p.key, p.rules)).collect();
    let argv = script::arguments(parts, now)
        .into_iter()
        .map(|arg| match arg {
            Arg::Int(n) => n.to_string(),
            Arg::Text(t) => t.to_owned(),
        })
        .collect();
    Call { keys, argv }
}

/// A check of `cost` on `key`, in group 0.
pub fn check<'a>(key: &'a str, rules: &'a RuleSet, cost: u64) -> Part<'a> {
    Part::operation(key, rules, Operation::Check { cost })
}

/// `TOLLGATE.DECIDE` with `call`.
pub fn decide_module(conn: &mut redis::Connection, call: &Call) -> redis::RedisResult<Vec<i64>> {
    redis::cmd("TOLLGATE.DECIDE").arg(call.keys.len()).arg(&call.keys).arg(&call.argv).query(conn)
}

/// The script's SHA on `conn`'s server, loading it (the variant with every algorithm).
pub fn load_script(conn: &mut redis::Connection) -> String {
    redis::cmd("SCRIPT").arg("LOAD").arg(script::Variant::ALL.source()).query(conn).expect("SCRIPT LOAD")
}

/// `EVALSHA sha` with `call`: the Lua twin's answer.
pub fn decide_lua(conn: &mut redis::Connection, sha: &str, call: &Call) -> redis::RedisResult<Vec<i64>> {
    redis::cmd("EVALSHA").arg(sha).arg(call.keys.len()).arg(&call.keys).arg(&call.argv).query(conn)
}

/// A key's value, as comparable text, and its time to live in milliseconds (-1: none).
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// `hash`, `zset`, `string`, ...
    pub kind: String,
    /// Hash fields or sorted set members (member -> score), sorted; a string's value.
    pub value: BTreeMap<String, String>,
    /// PTTL.
    pub ttl: i64,
}

/// Every key of `conn`'s server with its value and TTL. Names and values are read as bytes and
/// shown as text (lossily): a random call may write a key whose name is not UTF-8.
pub fn dump(conn: &mut redis::Connection) -> BTreeMap<String, Entry> {
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    let pairs = |v: Vec<(Vec<u8>, Vec<u8>)>| v.into_iter().map(|(k, v)| (text(k), text(v))).collect();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(conn).expect("KEYS");
    keys.into_iter()
        .filter_map(|key| {
            let kind: String = redis::cmd("TYPE").arg(&key).query(conn).expect("TYPE");
            let value: BTreeMap<String, String> = match kind.as_str() {
                "hash" => pairs(redis::cmd("HGETALL").arg(&key).query(conn).expect("HGETALL")),
                "zset" => pairs(
                    redis::cmd("ZRANGE")
                        .arg(&key)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query(conn)
                        .expect("ZRANGE"),
                ),
                "string" => {
                    let v: Vec<u8> = redis::cmd("GET").arg(&key).query(conn).expect("GET");
                    BTreeMap::from([(String::new(), text(v))])
                }
                "none" => return None, // expired between KEYS and TYPE
                other => panic!("{} holds a {other}, which no test writes", text(key)),
            };
            let ttl: i64 = redis::cmd("PTTL").arg(&key).query(conn).expect("PTTL");
            Some((text(key), Entry { kind, value, ttl }))
        })
        .collect()
}

/// SplitMix64: a small seeded generator, so a failing random test replays exactly.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}
