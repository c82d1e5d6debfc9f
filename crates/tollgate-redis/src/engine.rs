//! Which engine decides inside Redis: the Tollgate Redis module's `TOLLGATE.DECIDE`, or the Lua
//! twins. Both take the very same keys and arguments and keep the same state encoding, so a
//! call can go to either, and a deployment can load the module, or lose it, under load.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The module's command: the script's `KEYS` and `ARGV` after `numkeys`, as `EVALSHA` takes
/// them after the script's hash.
pub(crate) const MODULE_COMMAND: &str = "TOLLGATE.DECIDE";

/// Calls of the engine by the engine that took them (`engine` = `module` or `lua`).
pub(crate) const CALLS_METRIC: &str = "tollgate_redis_calls_total";

/// Operations (checks, acquires, ...) sent in those calls: over [`CALLS_METRIC`], how many
/// decisions coalescing put in one call on average.
pub(crate) const OPERATIONS_METRIC: &str = "tollgate_redis_operations_total";

/// How long `auto` keeps to the Lua after Redis said it has no module, before it asks again
/// (a module loaded meanwhile, or a new Cluster master that has it, is then used).
const ASK_AGAIN: Duration = Duration::from_secs(10);

/// Which engine decides: chosen with [`RedisBackendBuilder::engine`](crate::RedisBackendBuilder::engine).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Engine {
    /// The module where Redis has it loaded, else the Lua (the default). A call that Redis
    /// refuses as an unknown command is decided by the Lua at once, and the Lua is kept for
    /// a few seconds before the module is tried again.
    #[default]
    Auto,
    /// The module only: building the backend fails where Redis lacks it, and so does a call to
    /// a node without it.
    Module,
    /// The Lua only, even where the module is loaded.
    Lua,
}

impl Engine {
    /// `auto`, `module` or `lua`.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Auto => "auto",
            Engine::Module => "module",
            Engine::Lua => "lua",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Text that names no engine.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the Redis engine is auto, module or lua (got {0:?})")]
pub struct EngineError(String);

impl FromStr for Engine {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self, EngineError> {
        match s {
            "auto" => Ok(Engine::Auto),
            "module" => Ok(Engine::Module),
            "lua" => Ok(Engine::Lua),
            other => Err(EngineError(other.to_owned())),
        }
    }
}

/// What `auto` has learnt of the module where a key lives: nothing yet, that it answered, or
/// (any larger value) that it is missing, since `value - MISSING` milliseconds after `start`.
const UNKNOWN: u64 = 0;
const LOADED: u64 = 1;
const MISSING: u64 = 2;

/// Hash slots of a Redis Cluster.
pub(crate) const CLUSTER_SLOTS: usize = 16_384;

/// The engine chosen, and for `auto` what Redis last said of the module: once for a single
/// Redis (or Sentinel's master), and per hash slot on a Cluster, whose masters may differ (a
/// module loaded into one master first, during a rolling deployment, is used there at once
/// while the others keep to the Lua).
#[derive(Debug)]
pub(crate) struct Choice {
    engine: Engine,
    /// One entry, or one per hash slot (a Cluster under `auto`): `UNKNOWN`, `LOADED` or
    /// `MISSING` plus when.
    seen: Box<[AtomicU64]>,
    start: Instant,
}

impl Choice {
    /// The choice for `engine`; `per_slot` on a Redis Cluster.
    pub(crate) fn new(engine: Engine, per_slot: bool) -> Self {
        let entries = if per_slot && engine == Engine::Auto { CLUSTER_SLOTS } else { 1 };
        Choice {
            engine,
            seen: (0..entries).map(|_| AtomicU64::new(UNKNOWN)).collect(),
            start: Instant::now(),
        }
    }

    pub(crate) fn engine(&self) -> Engine {
        self.engine
    }

    /// Whether what is learnt is kept per hash slot.
    pub(crate) fn per_slot(&self) -> bool {
        self.seen.len() == CLUSTER_SLOTS
    }

    fn entry(&self, slot: u16) -> &AtomicU64 {
        self.seen.get(usize::from(slot)).unwrap_or(&self.seen[0])
    }

    /// Whether the next call for a key in `slot` (any value off a Cluster) goes to the module.
    pub(crate) fn module_first(&self, slot: u16) -> bool {
        match self.engine {
            Engine::Module => true,
            Engine::Lua => false,
            Engine::Auto => match self.entry(slot).load(Ordering::Relaxed) {
                UNKNOWN | LOADED => true,
                missing_at => {
                    self.elapsed_ms().saturating_sub(missing_at - MISSING) >= ASK_AGAIN.as_millis() as u64
                }
            },
        }
    }

    /// Redis answered the module's command for a key in `slot`.
    pub(crate) fn module_answered(&self, slot: u16) {
        let entry = self.entry(slot);
        // Read first: the common case changes nothing and leaves the cache line shared.
        if entry.load(Ordering::Relaxed) != LOADED {
            entry.store(LOADED, Ordering::Relaxed);
        }
    }

    /// Redis does not know the module's command where `slots` live.
    pub(crate) fn module_missing(&self, slots: impl IntoIterator<Item = u16>) {
        let at = MISSING.saturating_add(self.elapsed_ms());
        for slot in slots {
            self.entry(slot).store(at, Ordering::Relaxed);
        }
    }

    /// The engine that decides now, for `/v1/info`: `module`, `lua`, or on a Cluster where
    /// some masters have the module and others not, `mixed`.
    pub(crate) fn current(&self) -> &'static str {
        match self.engine {
            Engine::Module => "module",
            Engine::Lua => "lua",
            Engine::Auto => {
                let (mut loaded, mut missing) = (false, false);
                for entry in &self.seen {
                    match entry.load(Ordering::Relaxed) {
                        UNKNOWN => {}
                        LOADED => loaded = true,
                        _ => missing = true,
                    }
                }
                match (loaded, missing) {
                    (true, true) => "mixed",
                    (true, false) => "module",
                    (false, _) => "lua",
                }
            }
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Whether `error` is Redis refusing the module's command as unknown (no module loaded).
pub(crate) fn is_unknown_command(error: &redis::RedisError) -> bool {
    error.code() == Some("ERR") && error.detail().is_some_and(|d| d.starts_with("unknown command"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_parse_and_print() {
        for engine in [Engine::Auto, Engine::Module, Engine::Lua] {
            assert_eq!(engine.as_str().parse::<Engine>(), Ok(engine));
            assert_eq!(engine.to_string(), engine.as_str());
        }
        assert_eq!("Lua".parse::<Engine>(), Err(EngineError("Lua".into())));
    }

    #[test]
    fn auto_tries_the_module_until_redis_says_it_has_none() {
        let choice = Choice::new(Engine::Auto, false);
        assert!(choice.module_first(0));
        assert_eq!(choice.current(), "lua", "not known yet");
        choice.module_answered(0);
        assert_eq!(choice.current(), "module");
        choice.module_missing([0]);
        assert!(!choice.module_first(0), "kept to the Lua for a while");
        assert!(!choice.module_first(9), "off a Cluster, one answer holds for every key");
        assert_eq!(choice.current(), "lua");
        let start = Instant::now().checked_sub(ASK_AGAIN).expect("a clock running for 10 s");
        let long_ago = Choice { start, ..Choice::new(Engine::Auto, false) };
        long_ago.seen[0].store(MISSING, Ordering::Relaxed);
        assert!(long_ago.module_first(0), "asked again after ASK_AGAIN");
        assert!(Choice::new(Engine::Module, true).module_first(0));
        assert!(!Choice::new(Engine::Lua, true).module_first(0));
        assert!(!Choice::new(Engine::Lua, true).per_slot(), "only auto learns");
    }

    #[test]
    fn on_a_cluster_auto_learns_per_slot() {
        let choice = Choice::new(Engine::Auto, true);
        assert!(choice.per_slot());
        choice.module_answered(5);
        choice.module_missing(100..200);
        assert!(choice.module_first(5) && choice.module_first(99) && choice.module_first(200));
        assert!(!choice.module_first(100) && !choice.module_first(199));
        assert_eq!(choice.current(), "mixed");
        choice.module_answered(150);
        assert!(choice.module_first(150));
        let lua_only = Choice::new(Engine::Auto, true);
        lua_only.module_missing(0..CLUSTER_SLOTS as u16);
        assert_eq!(lua_only.current(), "lua");
    }
}
