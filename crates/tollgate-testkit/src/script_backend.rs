//! [`ScriptBackend`]: a [`Backend`] deciding through `tollgate_core::script::execute`, the way
//! a Redis module does, over any [`Store`].

use std::sync::Mutex;

use async_trait::async_trait;
use tollgate_core::script::{self, Arg, StateLocation, Store};
use tollgate_core::{
    Backend, BatchPlan, Clock, Decision, Error, ManualClock, Operation, Part, RuleSet, Timestamp,
    validate_key,
};

use crate::MapStore;

/// A [`Store`] a test can drive: told the time before each call (a store that keeps its own
/// clock, as Redis does, ignores it).
pub trait TestStore: Store + Send {
    /// The backend's clock, in microseconds, before a call.
    fn set_now(&mut self, micros: i64) {
        let _ = micros;
    }
}

/// Names the Redis keys of a key's states under a rule set, in the rules' order.
pub type KeyNaming = Box<dyn Fn(&str, &RuleSet) -> Vec<String> + Send + Sync>;

/// A [`Backend`] that decides every operation with `script::execute` over a [`Store`], the way
/// a Redis module does: the script's arguments with `now` from the backend's clock, and the
/// Redis backend's key layout (by default `{key}:h` for hash-stored rules and
/// `{key}:<signature>` for the others; see [`with_store`](ScriptBackend::with_store)).
pub struct ScriptBackend<S = MapStore> {
    clock: ManualClock,
    naming: KeyNaming,
    /// The store, for tests to look into.
    pub store: Mutex<S>,
}

impl ScriptBackend<MapStore> {
    /// A backend on `clock`, with an empty [`MapStore`].
    pub fn with_clock(clock: ManualClock) -> Self {
        ScriptBackend::with_store(clock, MapStore::default(), Box::new(redis_keys))
    }
}

/// The keys of `key`'s states under `rules`, one per rule in order, as the Redis backend names
/// them without a prefix: `{key}:h` for hash-stored rules, `{key}:<signature>` for the others.
pub fn redis_keys(key: &str, rules: &RuleSet) -> Vec<String> {
    script::locations(rules)
        .map(|location| match location {
            StateLocation::Own { signature } => format!("{{{key}}}:{signature}"),
            StateLocation::SharedHash { .. } => format!("{{{key}}}:{}", script::SHARED_HASH),
        })
        .collect()
}

/// The script's arguments as the bytes a Redis module receives.
pub fn argv(args: &[Arg<'_>]) -> Vec<Vec<u8>> {
    args.iter()
        .map(|arg| match arg {
            Arg::Int(n) => n.to_string().into_bytes(),
            Arg::Text(t) => t.as_bytes().to_vec(),
        })
        .collect()
}

impl<S: TestStore> ScriptBackend<S> {
    /// A backend on `clock` over `store`, naming keys with `naming` (a Redis backend's
    /// `state_keys`, to share its keys).
    pub fn with_store(clock: ManualClock, store: S, naming: KeyNaming) -> Self {
        ScriptBackend { clock, naming, store: Mutex::new(store) }
    }

    fn state_keys(&self, key: &str, rules: &RuleSet) -> Vec<String> {
        (self.naming)(key, rules)
    }

    /// Runs `parts` with their arguments `args` (made for `now`), as the Redis backend sends
    /// them.
    fn run(&self, now: Timestamp, parts: &[Part<'_>], args: &[Arg<'_>]) -> Result<Vec<Decision>, Error> {
        let keys: Vec<String> = parts.iter().flat_map(|p| self.state_keys(p.key, p.rules)).collect();
        let args = argv(args);
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        store.set_now(i64::try_from(now.as_micros()).unwrap_or(i64::MAX));
        let reply = script::execute(&keys, &argv, &mut *store).map_err(|e| Error::Backend(Box::new(e)))?;
        let (_, decisions) = script::decode(parts, &reply).map_err(|e| Error::Backend(Box::new(e)))?;
        Ok(decisions)
    }
}

#[async_trait]
impl<S: TestStore> Backend for ScriptBackend<S> {
    async fn execute(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error> {
        op.validate(key, rules)?;
        let (now, part) = (self.clock.now(), [Part::operation(key, rules, op)]);
        let mut decisions = self.run(now, &part, &script::arguments(&part, Some(now)))?;
        Ok(decisions.remove(0))
    }

    async fn check_planned(&self, batch: &BatchPlan<'_>) -> Result<Vec<Decision>, Error> {
        let parts = batch.parts();
        let order: Vec<usize> = batch.groups().flatten().copied().collect();
        let now = self.clock.now();
        let (sent, args) = script::batch_arguments(batch, Some(now));
        let decided = self.run(now, &sent, &args)?;
        let mut decisions: Vec<Option<Decision>> = vec![None; parts.len()];
        for (&i, decision) in order.iter().zip(decided) {
            decisions[i] = Some(decision);
        }
        Ok(decisions.into_iter().flatten().collect())
    }

    async fn reset(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        validate_key(key)?;
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        for (location, state_key) in script::locations(rules).zip(self.state_keys(key, rules)) {
            let result = match location {
                StateLocation::Own { .. } => store.delete(state_key.as_bytes()),
                StateLocation::SharedHash { prefix, fields } => {
                    let names: Vec<String> = fields.iter().map(|f| format!("{prefix}{f}")).collect();
                    let names: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
                    store.hash_delete(state_key.as_bytes(), &names)
                }
            };
            result.map_err(|e| Error::Backend(Box::new(e)))?;
        }
        Ok(())
    }
}
