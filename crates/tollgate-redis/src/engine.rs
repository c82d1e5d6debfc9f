//! Which engine decides inside Redis: the Tollgate Redis module's `TOLLGATE.DECIDE`, or the Lua
//! twins. Both take the very same keys and arguments and keep the same state encoding, so a
//! call can go to either, and a deployment can load the module, or lose it, under load.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The module's command: the script's `KEYS` and `ARGV` after `numkeys`, as `EVALSHA` takes
/// them after the script's hash.
pub(crate) const MODULE_COMMAND: &str = "TOLLGATE.DECIDE";

/// Calls of the engine by the engine that took them (`engine` = `module` or `lua`).
pub(crate) const CALLS_METRIC: &str = "tollgate_redis_calls_total";

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

/// What `auto` has learnt of the module.
const UNKNOWN: u8 = 0;
const LOADED: u8 = 1;
const MISSING: u8 = 2;

/// The engine chosen, and for `auto` what Redis last said of the module.
#[derive(Debug)]
pub(crate) struct Choice {
    engine: Engine,
    seen: AtomicU8,
    /// When `seen` became MISSING, in milliseconds since `start`.
    missing_at: AtomicU64,
    start: Instant,
}

impl Choice {
    pub(crate) fn new(engine: Engine) -> Self {
        Choice { engine, seen: AtomicU8::new(UNKNOWN), missing_at: AtomicU64::new(0), start: Instant::now() }
    }

    pub(crate) fn engine(&self) -> Engine {
        self.engine
    }

    /// Whether the next call goes to the module.
    pub(crate) fn module_first(&self) -> bool {
        match self.engine {
            Engine::Module => true,
            Engine::Lua => false,
            Engine::Auto => {
                self.seen.load(Ordering::Relaxed) != MISSING
                    || self.elapsed_ms().saturating_sub(self.missing_at.load(Ordering::Relaxed))
                        >= ASK_AGAIN.as_millis() as u64
            }
        }
    }

    /// Redis answered the module's command.
    pub(crate) fn module_answered(&self) {
        self.seen.store(LOADED, Ordering::Relaxed);
    }

    /// Redis does not know the module's command.
    pub(crate) fn module_missing(&self) {
        self.missing_at.store(self.elapsed_ms(), Ordering::Relaxed);
        self.seen.store(MISSING, Ordering::Relaxed);
    }

    /// The engine that decides now: `module` or `lua` (for `/v1/info`).
    pub(crate) fn current(&self) -> &'static str {
        match self.engine {
            Engine::Module => "module",
            Engine::Lua => "lua",
            Engine::Auto if self.seen.load(Ordering::Relaxed) == LOADED => "module",
            Engine::Auto => "lua",
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
        let choice = Choice::new(Engine::Auto);
        assert!(choice.module_first());
        assert_eq!(choice.current(), "lua", "not known yet");
        choice.module_answered();
        assert_eq!(choice.current(), "module");
        choice.module_missing();
        assert!(!choice.module_first(), "kept to the Lua for a while");
        assert_eq!(choice.current(), "lua");
        choice.missing_at.store(0, Ordering::Relaxed);
        let start = Instant::now().checked_sub(ASK_AGAIN).expect("a clock running for 10 s");
        let long_ago = Choice { start, ..Choice::new(Engine::Auto) };
        long_ago.module_missing();
        long_ago.missing_at.store(0, Ordering::Relaxed);
        assert!(long_ago.module_first(), "asked again after ASK_AGAIN");
        assert!(Choice::new(Engine::Module).module_first());
        assert!(!Choice::new(Engine::Lua).module_first());
    }
}
