//! The shared conformance scenarios on the Redis backend, each on a private redis-server.

use std::time::Duration;

use tollgate_core::ManualClock;
use tollgate_redis::RedisBackend;
use tollgate_testkit::{OnServer, RedisServer};

fn backend(clock: ManualClock) -> OnServer<RedisBackend> {
    let server = RedisServer::start();
    let backend =
        RedisBackend::builder(server.url()).clock(clock).timeout(Duration::from_secs(5)).build().unwrap();
    OnServer { backend, server }
}

tollgate_testkit::conformance_tests!(backend);
