//! Tollgate's Redis module: the Rust engine of `tollgate-core` running inside `redis-server`, on
//! the very keys, and in the very encoding, that the Lua script of `tollgate-redis` uses, so a
//! deployment can load the module into a running Redis, or lose it, without losing or doubling
//! a count.
//!
//! # Loading it
//!
//! ```text
//! cargo build --release -p tollgate-redis-module   # needs libclang (bindgen): apt-get install clang libclang-dev
//! redis-server --loadmodule target/release/libtollgate_redis_module.so
//! ```
//!
//! or `loadmodule /path/to/libtollgate_redis_module.so` in `redis.conf`, or `MODULE LOAD` at
//! run time. It needs Redis 7.0 or later (key specs). `MODULE LIST` shows it as `tollgate`,
//! its version `major * 10000 + minor * 100 + patch` of this crate's.
//!
//! # The command
//!
//! `TOLLGATE.DECIDE numkeys key [key ...] arg [arg ...]`: exactly `EVALSHA`'s arguments without
//! the SHA, in the calling convention of `tollgate_core::script` (KEYS and ARGV as the script
//! gets them), answered with the script's reply (an array of integers) or an error reply. The
//! decision is `tollgate_core::script::execute` over [`store::ModuleStore`].
//!
//! - Flags `write deny-oom`: it writes state, and a decision that would need memory the server
//!   has not got is refused before it starts rather than half written. Not `fast`: a sliding
//!   window log reads its whole sorted set (up to its limit), so a call's cost is not O(1) of
//!   the data set, which is what `fast` promises (latency monitoring, `MULTI` accounting).
//! - Key specs: the keys start at argument 1 (after the name), their count is argument 1 and
//!   they follow it one by one, so Redis Cluster routes the command (and refuses cross-slot
//!   calls) as it routes `EVALSHA`. Redis 7.0 finds the keys of a module command by asking it
//!   (`getkeys-api`) rather than by its key specs, so the command answers that question too.
//! - Replication: the writes' effects, never the command (see [`store`]).
//! - Each key is opened once per call, and signalled modified (`WATCH`, client-side caching)
//!   only if the call wrote it: a denied check, which writes nothing, aborts no transaction.
//! - Cost: the arguments are read in place, and `execute` allocates nothing for a call of a
//!   few rules; a hash's fields are read in one module call and written in one, replicated as
//!   one HSET, its TTL only when it must grow. Where the rest goes: "The Redis module (issue
//!   16)" in docs/benchmarks.md, and `scripts/bench-redis-cpu --engine module`.
//!
//! # Testing
//!
//! `cargo test -p tollgate-redis-module` builds the cdylib (the crate is also an rlib, so cargo
//! compiles the library, both kinds, before the integration tests; the `.so` lands in
//! `target/debug/deps/`, beside the test binaries) and the tests load it into private
//! `redis-server`s (`tests/common/mod.rs` finds it; `TOLLGATE_REDIS_MODULE=/path/to/lib.so`
//! tests another build). Without redis-server or the module they fail, never skip.
//!
//! Unsafe code is denied in this crate as elsewhere and allowed only block by block where the
//! module API (C) is called, each with its reason; the rest of the workspace forbids it.

/// The module API's function `$name`. Redis fills the table in when it loads the module; a
/// function missing from the running server (older than the API the crate was built against)
/// panics here, which the command turns into an error reply, rather than calling null.
macro_rules! api {
    ($name:ident) => {{
        #[allow(unsafe_code)]
        // SAFETY: RedisModule_Init (run by the load entry point, before any command) writes the
        // API's function pointers once, on the main thread, and nothing writes them after;
        // reading one is a copy of a pointer-sized value, taking no reference to the static.
        let function = unsafe { redis_module::raw::$name };
        function.expect(concat!("the module API has no ", stringify!($name)))
    }};
}

pub mod args;
#[cfg(not(test))]
mod command;
mod key;
pub mod store;

/// The module's version as Redis shows it (`MODULE LIST`): `major * 10000 + minor * 100 + patch`.
pub const VERSION: i32 = {
    let major = parse_decimal(env!("CARGO_PKG_VERSION_MAJOR"));
    let minor = parse_decimal(env!("CARGO_PKG_VERSION_MINOR"));
    let patch = parse_decimal(env!("CARGO_PKG_VERSION_PATCH"));
    assert!(minor < 100 && patch < 100, "the module version packs minor and patch in two digits each");
    major * 10_000 + minor * 100 + patch
};

/// The module's name (`MODULE LIST`, `MODULE UNLOAD tollgate`).
pub const NAME: &str = "tollgate";

/// The command's name.
pub const COMMAND: &str = "TOLLGATE.DECIDE";

const fn parse_decimal(text: &str) -> i32 {
    let bytes = text.as_bytes();
    let mut value = 0;
    let mut i = 0;
    while i < bytes.len() {
        assert!(bytes[i].is_ascii_digit(), "a version number is decimal");
        value = value * 10 + (bytes[i] - b'0') as i32;
        i += 1;
    }
    value
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_is_the_crates() {
        let parts: Vec<i32> =
            env!("CARGO_PKG_VERSION").split(['.', '-']).take(3).map(|p| p.parse().unwrap()).collect();
        assert_eq!(super::VERSION, parts[0] * 10_000 + parts[1] * 100 + parts[2]);
    }
}
