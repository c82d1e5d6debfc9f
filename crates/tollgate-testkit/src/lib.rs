//! Test support for Tollgate.
//!
//! - [`RedisServer`]: a private `redis-server` on a free loopback port, stopped on drop. Tests
//!   never touch the shared 6379. A missing `redis-server` fails the test with a message saying
//!   how to install it; it is never skipped.
//! - [`RedisCluster`]: a private Redis Cluster (3 masters, 3 replicas) of six such servers.
//! - [`RedisSentinel`]: a private master, replica and three sentinels.
//! - [`redis_module`]: the Tollgate Redis module, fresh from its sources (built if need be),
//!   for [`RedisServer::with_module`]; [`module_args`] load it into a cluster's or a
//!   sentinel set-up's servers (`RedisCluster::start_with`, `RedisSentinel::start_with`).
//! - [`FaultProxy`]: a TCP proxy to put between Tollgate and Redis, adding latency, dropping
//!   or refusing connections, or forwarding nothing, at the test's command.
//! - [`PostgresServer`]: a private PostgreSQL cluster (initdb in a temporary directory) on a
//!   free loopback port, with fresh databases on demand; never the shared 5432.
//! - [`conformance`]: scenarios that every backend must pass identically, run against a backend
//!   whose clock the test moves by hand, and the [`conformance_tests!`] macro that turns them
//!   into tests for one backend.
//! - [`MapStore`]: an in-process store shaped as Redis is, for `tollgate_core::script::execute`
//!   (the engine as a Redis module runs it) without a server; [`RedisStore`], the same over a
//!   Redis connection, command by command; [`ScriptBackend`] decides through `execute` over
//!   either, so the conformance scenarios run on `execute` too, and `execute` and the Lua twins
//!   can take turns on the same Redis keys.

pub mod conformance;
mod fault_proxy;
mod map_store;
mod postgres_server;
mod redis_cluster;
mod redis_module;
mod redis_sentinel;
mod redis_server;
mod redis_store;
mod script_backend;

pub use fault_proxy::{Direction, FaultProxy};
pub use map_store::{MapStore, Value};
pub use postgres_server::PostgresServer;
pub use redis_cluster::{RedisCluster, key_slot};
pub use redis_module::{module_args, redis_module};
pub use redis_sentinel::RedisSentinel;
pub use redis_server::{OnServer, RedisServer, free_port};
pub use redis_store::RedisStore;
pub use script_backend::{KeyNaming, ScriptBackend, TestStore, argv, redis_keys};
