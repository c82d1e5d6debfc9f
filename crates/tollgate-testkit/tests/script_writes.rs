//! What `script::execute` (the engine of the Redis module) writes, command by command: what a
//! call changed and nothing more (at most one HSET and one HDEL per hash, nothing for a key
//! that did not change), TTLs as the Lua twins compute them (`expire_at` in `prelude.lua`), a
//! shared hash's TTL only growing, and a key deleted with its last state. The keys' contents are
//! held to the Lua's by the module's differential tests (with Redis); these hold the writes
//! themselves, in process.

use tollgate_core::script::{self, Store, StoreError};
use tollgate_core::{Operation, Part, Period, Rule, RuleSet, Timestamp};
use tollgate_testkit::{MapStore, Value, argv, redis_keys};

/// A window boundary (µs): the calls below start 250 ms into a second.
const SECOND: i64 = 1_700_000_000_000_000;
const T0: i64 = SECOND + 250_000;

/// A [`MapStore`] that logs every write: `HSET key field...` (field names without their rule's
/// prefix), `HDEL key field...`, `DEL key`, `ZADD key n`, `ZREM key n`, `PEXPIRE key ms`
/// (`set_time_to_live`) and `PEXPIRE+ key ms` (`extend_time_to_live`: only ever longer).
#[derive(Default)]
struct Recording {
    store: MapStore,
    writes: Vec<String>,
}

/// A field's name without its rule's prefix (`<id>.`).
fn field(name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    name.rsplit('.').next().unwrap_or_default().to_owned()
}

fn text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

impl Store for Recording {
    fn now(&mut self) -> Result<i64, StoreError> {
        self.store.now()
    }

    fn hash_get(&mut self, key: &[u8], fields: &[&[u8]], out: &mut [Option<i64>]) -> Result<(), StoreError> {
        self.store.hash_get(key, fields, out)
    }

    fn hash_set(&mut self, key: &[u8], fields: &[(&[u8], i64)]) -> Result<(), StoreError> {
        let names: Vec<String> = fields.iter().map(|(f, _)| field(f)).collect();
        self.writes.push(format!("HSET {} {}", text(key), names.join(" ")));
        self.store.hash_set(key, fields)
    }

    fn hash_delete(&mut self, key: &[u8], fields: &[&[u8]]) -> Result<(), StoreError> {
        let names: Vec<String> = fields.iter().map(|f| field(f)).collect();
        self.writes.push(format!("HDEL {} {}", text(key), names.join(" ")));
        self.store.hash_delete(key, fields)
    }

    fn sorted_set(&mut self, key: &[u8]) -> Result<Vec<(Vec<u8>, f64)>, StoreError> {
        self.store.sorted_set(key)
    }

    fn sorted_set_add(&mut self, key: &[u8], members: &[(f64, &[u8])]) -> Result<(), StoreError> {
        self.writes.push(format!("ZADD {} {}", text(key), members.len()));
        self.store.sorted_set_add(key, members)
    }

    fn sorted_set_remove(&mut self, key: &[u8], members: &[&[u8]]) -> Result<(), StoreError> {
        self.writes.push(format!("ZREM {} {}", text(key), members.len()));
        self.store.sorted_set_remove(key, members)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StoreError> {
        self.writes.push(format!("DEL {}", text(key)));
        self.store.delete(key)
    }

    fn time_to_live(&mut self, key: &[u8]) -> Result<Option<i64>, StoreError> {
        self.store.time_to_live(key)
    }

    fn set_time_to_live(&mut self, key: &[u8], millis: i64) -> Result<(), StoreError> {
        self.writes.push(format!("PEXPIRE {} {millis}", text(key)));
        self.store.set_time_to_live(key, millis)
    }

    fn extend_time_to_live(&mut self, key: &[u8], millis: i64) -> Result<(), StoreError> {
        self.writes.push(format!("PEXPIRE+ {} {millis}", text(key)));
        self.store.extend_time_to_live(key, millis)
    }
}

/// A call as the Redis backend sends it.
struct Call {
    keys: Vec<String>,
    argv: Vec<Vec<u8>>,
}

impl Call {
    /// `op` on `key` under `rules`; `now` is sent when given, else the store's clock is used.
    fn new(key: &str, rules: &RuleSet, op: Operation<'_>, now: Option<i64>) -> Call {
        let parts = [Part::operation(key, rules, op)];
        let now = now.map(|n| Timestamp::from_micros(n.unsigned_abs()));
        Call { keys: redis_keys(key, rules), argv: argv(&script::arguments(&parts, now)) }
    }

    /// The same call with every state's key the rule's own: its field prefix sent empty and
    /// its key renamed (what a rule set whose rules' ids collide sends).
    fn own_key(mut self, rules: &RuleSet, key: &str) -> Call {
        for prefix in script::locations(rules).filter_map(|l| match l {
            script::StateLocation::SharedHash { prefix, .. } => Some(prefix),
            script::StateLocation::Own { .. } => None,
        }) {
            for arg in self.argv.iter_mut().filter(|a| a.as_slice() == prefix.as_bytes()) {
                arg.clear();
            }
        }
        self.keys = vec![key.to_owned(); self.keys.len()];
        self
    }

    /// Runs the call at `now` on the store's clock; the reply, and the writes it made.
    fn run(&self, store: &mut Recording, now: i64) -> (Vec<i64>, Vec<String>) {
        store.store.now = now;
        store.writes.clear();
        let keys: Vec<&[u8]> = self.keys.iter().map(|k| k.as_bytes()).collect();
        let argv: Vec<&[u8]> = self.argv.iter().map(Vec::as_slice).collect();
        let reply = script::execute(&keys, &argv, store).unwrap();
        (reply, std::mem::take(&mut store.writes))
    }
}

fn set(rules: impl IntoIterator<Item = Rule>) -> RuleSet {
    RuleSet::new(rules).unwrap()
}

fn check(cost: u64) -> Operation<'static> {
    Operation::Check { cost }
}

/// The TTL (ms) of a state expiring at `expires_at` written at `now`, as the Lua's `expire_at`:
/// rounded up to a millisecond, at least 1, plus the margin (1 s).
fn ttl(expires_at: i64, now: i64) -> i64 {
    ((expires_at - now + 999).div_euclid(1000)).max(1) + 1000
}

#[test]
fn a_new_state_is_written_whole_and_a_ttl_covers_it() {
    let mut store = Recording::default();
    // Its `p` (the previous window's count) is 0: absent fields are written all the same.
    let counter = set([Rule::sliding_window_counter(5, Period::SECOND)]);
    let (reply, writes) = Call::new("k", &counter, check(1), None).run(&mut store, T0);
    assert_eq!(reply[1], 1, "admitted");
    // The state lasts two windows (the next one still weighs this one's count): to SECOND + 2 s.
    assert_eq!(
        writes,
        ["HSET {k}:h s p c".to_owned(), format!("PEXPIRE+ {{k}}:h {}", ttl(SECOND + 2_000_000, T0))]
    );
    assert_eq!(ttl(SECOND + 2_000_000, T0), 2750);

    // At the very end of a state's life a TTL is never below 1 ms (plus the margin).
    let window = set([Rule::fixed_window(5, Period::SECOND)]);
    let (_, writes) = Call::new("e", &window, check(1), None).run(&mut store, SECOND + 999_999);
    assert_eq!(writes, ["HSET {e}:h s c", "PEXPIRE+ {e}:h 1001"]);
    let (_, writes) = Call::new("f", &window, check(1), None).run(&mut store, SECOND + 998_001);
    assert_eq!(writes, ["HSET {f}:h s c", "PEXPIRE+ {f}:h 1002"]);
}

#[test]
fn a_check_writes_only_the_fields_it_changed() {
    let mut store = Recording::default();
    let window = set([Rule::fixed_window(5, Period::SECOND)]);
    let call = Call::new("k", &window, check(1), None);
    call.run(&mut store, T0);
    // Same window: the count moves, the start does not; the key's TTL already covers the
    // window (it was written for it, on the store's clock), so it is left alone.
    let (reply, writes) = call.run(&mut store, T0 + 100_000);
    assert_eq!(reply[2], 3, "remaining");
    assert_eq!(writes, ["HSET {k}:h c"]);
    // A peek (cost 0) changes nothing, and writes nothing.
    let (reply, writes) = Call::new("k", &window, check(0), None).run(&mut store, T0 + 200_000);
    assert_eq!(reply[2], 3);
    assert!(writes.is_empty(), "{writes:?}");
    // The next window: both fields move, and the TTL grows to cover it.
    let (reply, writes) = call.run(&mut store, SECOND + 1_100_000);
    assert_eq!(reply[2], 4);
    assert_eq!(
        writes,
        [
            "HSET {k}:h s c".to_owned(),
            format!("PEXPIRE+ {{k}}:h {}", ttl(SECOND + 2_000_000, SECOND + 1_100_000))
        ]
    );
    let Some(Value::Hash(hash)) = store.store.get(b"{k}:h") else { panic!("the hash is gone") };
    let mut values: Vec<i64> = hash.values().copied().collect();
    values.sort_unstable();
    assert_eq!(values, [1, SECOND + 1_000_000], "count and window start, read back as written");
}

#[test]
fn a_callers_clock_always_extends_the_ttl() {
    // With `now` sent by the caller, which may run behind the store's clock, an expiry read
    // back does not prove the TTL covers it: every write extends it (only ever longer).
    let mut store = Recording::default();
    let window = set([Rule::fixed_window(5, Period::SECOND)]);
    Call::new("k", &window, check(1), Some(T0)).run(&mut store, T0);
    let (_, writes) = Call::new("k", &window, check(1), Some(T0 + 100_000)).run(&mut store, T0 + 100_000);
    assert_eq!(
        writes,
        ["HSET {k}:h c".to_owned(), format!("PEXPIRE+ {{k}}:h {}", ttl(SECOND + 1_000_000, T0 + 100_000))]
    );
}

#[test]
fn rules_sharing_a_hash_write_once_and_their_ttl_covers_the_longest() {
    let mut store = Recording::default();
    let both = set([Rule::fixed_window(5, Period::SECOND), Rule::gcra(6, Period::MINUTE, 3)]);
    let call = Call::new("k", &both, check(1), None);
    let (reply, writes) = call.run(&mut store, T0);
    assert_eq!(reply[1], 1);
    // GCRA: 6 a minute is one every 10 s; one taken of a burst of 3 is full again in 10 s.
    let longest = T0 + 10_000_000;
    // Every field of a new state, the GCRA's fraction `f` (0) too.
    assert_eq!(writes, ["HSET {k}:h s c t f".to_owned(), format!("PEXPIRE+ {{k}}:h {}", ttl(longest, T0))]);

    // 1.5 s on, the window has passed: a peek finds the window's fields stale (its state is
    // gone) and deletes them, leaving the GCRA's, whose state did not change.
    let (reply, writes) = Call::new("k", &both, check(0), None).run(&mut store, T0 + 1_500_000);
    assert_eq!(reply[1], 1);
    assert_eq!(writes, ["HDEL {k}:h s c"]);
    let Some(Value::Hash(hash)) = store.store.get(b"{k}:h") else { panic!("the hash is gone") };
    assert_eq!(hash.len(), 2, "the GCRA's fields alone: {hash:?}");

    // A check now writes the window's fields anew and the GCRA's time (its debt grows; its
    // fraction stays 0, unwritten): the TTL
    // grows to the GCRA's new expiry, the later one.
    let now = T0 + 1_600_000;
    let (_, writes) = call.run(&mut store, now);
    assert_eq!(
        writes,
        ["HSET {k}:h s c t".to_owned(), format!("PEXPIRE+ {{k}}:h {}", ttl(T0 + 20_000_000, now))]
    );
}

#[test]
fn a_rules_own_key_is_set_and_deleted_with_its_state() {
    let mut store = Recording::default();
    let window = set([Rule::fixed_window(5, Period::SECOND)]);
    let call = Call::new("k", &window, check(1), None).own_key(&window, "own");
    let (reply, writes) = call.run(&mut store, T0);
    assert_eq!(reply[2], 4);
    // The fields without a prefix, and the key's TTL set (not only extended): it is the state's.
    assert_eq!(writes, ["HSET own s c".to_owned(), format!("PEXPIRE own {}", ttl(SECOND + 1_000_000, T0))]);
    let Some(Value::Hash(hash)) = store.store.get(b"own") else { panic!("no key") };
    assert_eq!(hash.keys().cloned().collect::<Vec<_>>(), [b"c".to_vec(), b"s".to_vec()]);
    let (_, writes) = call.run(&mut store, T0 + 100_000);
    assert_eq!(
        writes,
        ["HSET own c".to_owned(), format!("PEXPIRE own {}", ttl(SECOND + 1_000_000, T0 + 100_000))]
    );

    // The window over but the key still there (its TTL has a margin): a peek finds the state
    // gone, and deletes the key.
    let peek = Call::new("k", &window, check(0), None).own_key(&window, "own");
    let (_, writes) = peek.run(&mut store, SECOND + 1_200_000);
    assert_eq!(writes, ["DEL own"]);
    assert!(store.store.get(b"own").is_none());
    // Nothing stored, nothing to delete.
    let (_, writes) = peek.run(&mut store, SECOND + 1_300_000);
    assert!(writes.is_empty(), "{writes:?}");
}

#[test]
fn a_sorted_set_is_written_only_where_it_changed() {
    let mut store = Recording::default();
    let log = set([Rule::sliding_window_log(3, Period::SECOND)]);
    let call = Call::new("k", &log, check(1), None);
    let key = redis_keys("k", &log).remove(0);
    let (_, writes) = call.run(&mut store, T0);
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert!(writes[0].starts_with(&format!("ZADD {key} ")), "{writes:?}");
    assert_eq!(writes[1], format!("PEXPIRE {key} {}", ttl(T0 + 1_000_000, T0)));
    let (_, writes) = call.run(&mut store, T0 + 100_000);
    assert!(writes[0].starts_with(&format!("ZADD {key} ")), "{writes:?}");
    assert_eq!(writes[1], format!("PEXPIRE {key} {}", ttl(T0 + 1_100_000, T0 + 100_000)));
    // A peek changes nothing: nothing is written.
    let (reply, writes) = Call::new("k", &log, check(0), None).run(&mut store, T0 + 200_000);
    assert_eq!(reply[2], 1, "remaining");
    assert!(writes.is_empty(), "{writes:?}");
    // Once every entry has left the window, the key goes with the state.
    let (reply, writes) = Call::new("k", &log, check(0), None).run(&mut store, T0 + 1_150_000);
    assert_eq!(reply[2], 3);
    assert_eq!(writes, [format!("DEL {key}")]);
}
