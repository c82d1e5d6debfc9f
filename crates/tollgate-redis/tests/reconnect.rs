//! Lost connections and restarts of a single Redis (issue 18): a denial cached from a Redis
//! that then restarted empty is dropped though no call failed; a connection dropped while idle
//! costs no call; and the first call after Redis comes back does not fail on the refusal it
//! met while Redis was down. On both engines (`name::on_lua`, `name::on_module`).

mod engines;

use std::time::{Duration, Instant};

use tollgate_core::{Backend, Error, Period, Rule, RuleSet};
use tollgate_redis::{Engine, RedisBackend};
use tollgate_testkit::FaultProxy;

use engines::{on_both_engines, server};

fn one_per_hour() -> RuleSet {
    // From the first hit, not the clock: an aligned window could roll over (and its retry shrink
    // below a minute) in the last minute of an hour.
    RuleSet::new([Rule::fixed_window_from_first_hit(2, Period::HOUR)]).unwrap()
}

on_both_engines!(
    a_quick_restart_drops_cached_denials_though_no_call_failed,
    flavor = "multi_thread",
    worker_threads = 2
);
/// Cached denials must stand for an hour unless the backend notices Redis went away.
async fn a_quick_restart_drops_cached_denials_though_no_call_failed(engine: Engine) {
    let mut redis = server(engine);
    // The deny cache is on by default; one connection, no coalescing: nothing else to reach.
    let backend =
        RedisBackend::builder(redis.url()).engine(engine).connections(1).coalesce(1).build().unwrap();
    let rules = one_per_hour();
    assert!(backend.check("spent", &rules, 1).await.unwrap().allowed());
    assert!(backend.check("spent", &rules, 1).await.unwrap().allowed());
    let denied = backend.check("spent", &rules, 1).await.unwrap();
    assert!(!denied.allowed() && denied.retry_after() > Duration::from_secs(60), "{denied:?}");
    // Redis answers no more: the denial is answered by the cache.
    redis.pause();
    let cached = backend.check("spent", &rules, 1).await.unwrap();
    assert!(!cached.allowed(), "the cache answered, without Redis");
    redis.resume();

    // Restarted empty, on the same port, faster than any call: only the denied key is asked.
    let redis = tokio::task::spawn_blocking(move || {
        redis.restart();
        redis
    })
    .await
    .unwrap();
    let restarted = Instant::now();
    assert!(redis.keys().is_empty(), "the new Redis starts empty");
    // The bound: the connection's close was seen while Redis was down, so the first call is
    // Redis's; a second for a loaded machine.
    let admitted_in = loop {
        match backend.check("spent", &rules, 1).await {
            Ok(d) if d.allowed() => break restarted.elapsed(),
            Ok(_) => {}
            Err(e) => panic!("a call failed after the restart: {e}"),
        }
        assert!(restarted.elapsed() < Duration::from_secs(1), "the cached denial stood");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!("admitted again {admitted_in:?} after Redis was back");
    // And that was Redis's own answer: one unit left of two.
    assert_eq!(backend.check("spent", &rules, 0).await.unwrap().remaining(), 1);
}

on_both_engines!(
    the_first_call_after_redis_returns_does_not_fail_on_an_old_refusal,
    flavor = "multi_thread",
    worker_threads = 2
);
async fn the_first_call_after_redis_returns_does_not_fail_on_an_old_refusal(engine: Engine) {
    let mut redis = server(engine);
    let backend = RedisBackend::builder(redis.url())
        .engine(engine)
        .connections(1)
        .coalesce(1)
        .deny_cache(false)
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let rules = one_per_hour();
    assert!(backend.check("k", &rules, 1).await.unwrap().allowed());
    redis.kill();
    let down = backend.check("k", &rules, 0).await;
    assert!(matches!(down, Err(Error::Unavailable(_))), "{down:?}");
    // Down for longer than the client's reconnection attempts (at most two, within the
    // timeout): the connection is left holding the refusal.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let redis = tokio::task::spawn_blocking(move || {
        redis.restart();
        redis
    })
    .await
    .unwrap();
    // Redis is up: the first call is answered (nothing was sent on the refused connection,
    // so trying again on a new one cannot count twice), and counts once.
    let first = backend.check("k", &rules, 1).await;
    assert!(first.as_ref().is_ok_and(|d| d.allowed()), "{first:?}");
    assert_eq!(backend.check("k", &rules, 0).await.unwrap().remaining(), 1);
    drop(redis);
}

on_both_engines!(a_connection_dropped_while_idle_costs_no_call, flavor = "multi_thread", worker_threads = 2);
async fn a_connection_dropped_while_idle_costs_no_call(engine: Engine) {
    let redis = server(engine);
    let proxy = FaultProxy::start(redis.port());
    let backend = RedisBackend::builder(proxy.url()).engine(engine).deny_cache(false).build().unwrap();
    let rules = RuleSet::new([Rule::fixed_window(1_000, Period::HOUR)]).unwrap();
    // Both connections open (calls alternate between them).
    for _ in 0..4 {
        backend.check("k", &rules, 1).await.unwrap();
    }
    assert_eq!(proxy.connections_open(), 2);
    let accepted = proxy.connections_accepted();
    // Dropped between calls (a Redis timeout killing idle clients, a load balancer, a blip):
    // the client sees the close, and reconnects before the next call needs the connection.
    proxy.drop_all();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for n in 0..10 {
        let answer = backend.check("k", &rules, 1).await;
        assert!(answer.is_ok(), "call {n} after the drop: {answer:?}");
    }
    assert!(proxy.connections_accepted() >= accepted + 2, "both connections opened again");
    // Every call counted once: 4 before, 10 after.
    assert_eq!(backend.check("k", &rules, 0).await.unwrap().remaining(), 1_000 - 14);
}
