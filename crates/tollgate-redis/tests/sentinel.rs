//! The Redis backend behind Redis Sentinel of the tests' own (a master, a replica, three
//! sentinels): exact decisions through the sentinels' master, and the master followed through a
//! fail-over under load. On both engines (`name::on_lua`, `name::on_module`: the master and
//! the replica promoted both loaded the module).

mod engines;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate_core::{Backend, Period, Rule, RuleSet};
use tollgate_redis::{Engine, RedisBackend};

use engines::{on_both_engines, sentinel};

on_both_engines!(
    the_master_is_found_and_followed_through_a_fail_over,
    flavor = "multi_thread",
    worker_threads = 4
);
async fn the_master_is_found_and_followed_through_a_fail_over(engine: Engine) {
    let mut setup = sentinel(engine);
    let backend = Arc::new(
        RedisBackend::builder(setup.url())
            .engine(engine)
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    );
    let rules = RuleSet::new([Rule::fixed_window(1_000_000, Period::HOUR)]).unwrap();
    let exact = RuleSet::new([Rule::fixed_window(10, Period::HOUR)]).unwrap();

    // Exact through the sentinels' master, and written there.
    let mut admitted = 0;
    for _ in 0..15 {
        admitted += usize::from(backend.check("exact", &exact, 1).await.unwrap().allowed());
    }
    assert_eq!(admitted, 10);
    assert_eq!(setup.master_mut().keys().len(), 1);

    let running = Arc::new(AtomicBool::new(true));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for task in 0..4 {
        let (backend, rules, running, ok, failed) =
            (backend.clone(), rules.clone(), running.clone(), ok.clone(), failed.clone());
        load.push(tokio::spawn(async move {
            let mut i = task;
            while running.load(Ordering::Relaxed) {
                match backend.check(&format!("k{}", i % 20), &rules, 1).await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed_at = Instant::now();
    setup.master_mut().kill();
    let setup = tokio::task::spawn_blocking(move || {
        setup.wait_promoted(Duration::from_secs(30));
        setup
    })
    .await
    .unwrap();
    let promoted_in = killed_at.elapsed();
    let before = ok.load(Ordering::Relaxed);
    // After the promotion, the backend finds the new master within a few calls.
    let deadline = Instant::now() + Duration::from_secs(5);
    while ok.load(Ordering::Relaxed) < before + 50 {
        assert!(Instant::now() < deadline, "no decisions after the fail-over ({before} before it)");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resumed_in = killed_at.elapsed();
    running.store(false, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    assert!(backend.check("after", &rules, 1).await.unwrap().allowed());
    assert!(setup.replica().keys().contains(&"tollgate:{after}:h".to_owned()), "written on the new master");
    println!(
        "promoted in {promoted_in:?}, decisions resumed {:?} after the kill; {} decisions, {} errors",
        resumed_in,
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
}
