//! Both engines under one test: [`on_both_engines!`] turns `async fn name(engine: Engine)`
//! into the tests `name::on_lua` and `name::on_module`, and the helpers here give each engine
//! its servers: plain ones for the Lua, ones that loaded the Tollgate Redis module for the
//! module (`Engine::Module` never falls back to the Lua, so a module test is decided by the
//! module alone).

#![allow(dead_code)] // each test binary uses its own part of this module

use tollgate_redis::Engine;
use tollgate_testkit::{RedisCluster, RedisSentinel, RedisServer, module_args};

/// `on_both_engines!(name)` or `on_both_engines!(name, flavor = "multi_thread", ...)` (the
/// arguments of `#[tokio::test]`): the tests `name::on_lua` and `name::on_module`, which run
/// `name(Engine::Lua)` and `name(Engine::Module)`.
macro_rules! on_both_engines {
    ($name:ident $(, $($arg:tt)*)?) => {
        mod $name {
            #[tokio::test$(($($arg)*))?]
            async fn on_lua() {
                super::$name(::tollgate_redis::Engine::Lua).await
            }

            #[tokio::test$(($($arg)*))?]
            async fn on_module() {
                super::$name(::tollgate_redis::Engine::Module).await
            }
        }
    };
}
pub(crate) use on_both_engines;

/// The arguments that make a server load what `engine` needs: the module, or nothing.
fn args(engine: Engine) -> Vec<String> {
    match engine {
        Engine::Module => module_args(),
        _ => Vec::new(),
    }
}

fn with<'a>(engine_args: &'a [String], extra: &[&'a str]) -> Vec<&'a str> {
    engine_args.iter().map(String::as_str).chain(extra.iter().copied()).collect()
}

/// A private redis-server for `engine`.
pub fn server(engine: Engine) -> RedisServer {
    server_with(engine, &[])
}

/// A private redis-server for `engine`, with `extra` arguments.
pub fn server_with(engine: Engine, extra: &[&str]) -> RedisServer {
    RedisServer::start_with(&with(&args(engine), extra))
}

/// A private Redis Cluster for `engine` (every node, and a master added later, loads the module
/// for the module).
pub fn cluster(engine: Engine) -> RedisCluster {
    RedisCluster::start_with(&with(&args(engine), &[]))
}

/// A private Sentinel set-up for `engine` (its master and replica load the module for the
/// module).
pub fn sentinel(engine: Engine) -> RedisSentinel {
    RedisSentinel::start_with(&with(&args(engine), &[]))
}

/// Calls of the engine so far, whichever answered: `TOLLGATE.DECIDE`, `FCALL`, `EVALSHA` and
/// `EVAL` (a reset is an `EVALSHA` on both engines).
pub fn engine_calls(server: &RedisServer) -> u64 {
    ["tollgate.decide", "fcall", "evalsha", "eval"].iter().map(|c| server.calls(c)).sum()
}

/// Held for its run by a test whose bounds assume its load is the only one: the test's other
/// variant, in the same binary, waits for it instead of doubling that load (on two cores).
pub async fn one_variant_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ONE.lock().await
}
