//! The Redis backend on a real Redis Cluster of the tests' own (three masters, three replicas):
//! keys spread over every master, exactness under concurrency across them, batches across
//! slots, resets, and a master killed under load. On both engines (`name::on_lua`,
//! `name::on_module`).

mod engines;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate_core::{Backend, Part, Period, Rule, RuleSet};
use tollgate_redis::{Engine, RedisBackend};
use tollgate_testkit::RedisCluster;

use engines::{cluster, on_both_engines};

fn backend(cluster: &RedisCluster, engine: Engine) -> Arc<RedisBackend> {
    Arc::new(
        RedisBackend::builder(cluster.url()).engine(engine).timeout(Duration::from_secs(5)).build().unwrap(),
    )
}

fn dbsize(cluster: &RedisCluster, node: usize) -> i64 {
    cluster.nodes()[node].command(&["DBSIZE"])
}

on_both_engines!(keys_spread_over_every_master_and_stay_exact, flavor = "multi_thread", worker_threads = 4);
async fn keys_spread_over_every_master_and_stay_exact(engine: Engine) {
    let cluster = cluster(engine);
    let backend = backend(&cluster, engine);
    let rules =
        RuleSet::new([Rule::fixed_window(20, Period::HOUR), Rule::gcra(20, Period::HOUR, 20)]).unwrap();
    const KEYS: usize = 30;
    // 64 tasks race 40 requests at each of 30 keys: exactly 20 per key get in.
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for task in 0..64 {
        let (backend, rules, admitted) = (backend.clone(), rules.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..(KEYS * 40 / 64 + 1) {
                let n = (task * 7 + i) % KEYS;
                if backend.check(&format!("user:{n}"), &rules, 1).await.unwrap().allowed() {
                    admitted[n].fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for (n, count) in admitted.iter().enumerate() {
        assert_eq!(count.load(Ordering::Relaxed), 20, "user:{n}");
    }
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    for &m in &masters {
        assert!(dbsize(&cluster, m) > 0, "master {m} holds none of the {KEYS} keys");
    }
    let total: i64 = masters.iter().map(|&m| dbsize(&cluster, m)).sum();
    assert_eq!(total, KEYS as i64, "one hash per key, on exactly one master");
}

on_both_engines!(batches_across_slots_and_resets_work, flavor = "multi_thread", worker_threads = 2);
async fn batches_across_slots_and_resets_work(engine: Engine) {
    let cluster = cluster(engine);
    let backend = backend(&cluster, engine);
    let per_ip = RuleSet::new([Rule::fixed_window(3, Period::MINUTE)]).unwrap();
    let per_path = RuleSet::new([Rule::fixed_window(5, Period::MINUTE)]).unwrap();
    // An Envoy-style request: two descriptors, two keys (two slots), one group.
    for round in 0..5 {
        let parts = [Part::new("ip:10.0.0.1", &per_ip, 1), Part::new("path:/login", &per_path, 1)];
        let decisions = backend.check_batch(&parts).await.unwrap();
        assert_eq!(decisions.len(), 2);
        assert_eq!(decisions[0].allowed(), round < 3, "round {round}: per ip");
        assert!(decisions[1].allowed(), "round {round}: per path");
    }
    backend.reset("ip:10.0.0.1", &per_ip).await.unwrap();
    assert_eq!(backend.check("ip:10.0.0.1", &per_ip, 0).await.unwrap().remaining(), 3);
    assert_eq!(backend.check("path:/login", &per_path, 0).await.unwrap().remaining(), 0);
    backend.ping().await.unwrap();
}

on_both_engines!(
    a_master_killed_under_load_fails_over_and_decisions_continue,
    flavor = "multi_thread",
    worker_threads = 4
);
async fn a_master_killed_under_load_fails_over_and_decisions_continue(engine: Engine) {
    let mut cluster = cluster(engine);
    let backend = backend(&cluster, engine);
    let rules = RuleSet::new([Rule::fixed_window(1_000_000, Period::HOUR)]).unwrap();
    // Keys on every master.
    for n in 0..30 {
        backend.check(&format!("k{n}"), &rules, 1).await.unwrap();
    }
    let running = Arc::new(AtomicBool::new(true));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let errors: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let mut load = Vec::new();
    for task in 0..8 {
        let (backend, rules, running) = (backend.clone(), rules.clone(), running.clone());
        let (ok, failed, errors) = (ok.clone(), failed.clone(), errors.clone());
        load.push(tokio::spawn(async move {
            let mut i = task;
            while running.load(Ordering::Relaxed) {
                match backend.check(&format!("k{}", i % 30), &rules, 1).await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => {
                        errors.lock().unwrap().push(Instant::now());
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let victim = cluster.masters()[0];
    let killed_at = Instant::now();
    cluster.node_mut(victim).kill();
    // The replica takes over after the node timeout (1 s) and an election.
    let recovered = tokio::task::spawn_blocking(move || {
        cluster.wait_masters(3, Duration::from_secs(30));
        cluster
    })
    .await
    .unwrap();
    let failed_over_in = killed_at.elapsed();
    let before = ok.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    running.store(false, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let after = ok.load(Ordering::Relaxed);
    assert_eq!(recovered.masters().len(), 3, "a replica was promoted");
    assert!(after > before + 50, "decisions continue after the fail-over ({before} -> {after})");
    // Every key answers again, on whichever node now serves it.
    for n in 0..30 {
        backend.check(&format!("k{n}"), &rules, 0).await.unwrap();
    }
    let errors = errors.lock().unwrap();
    if let (Some(first), Some(last)) = (errors.first(), errors.last()) {
        assert!(
            *last <= killed_at + failed_over_in + Duration::from_secs(3),
            "errors only during the fail-over window: last {:?} after the kill, fail-over took {failed_over_in:?}",
            last.duration_since(killed_at)
        );
        assert!(*first >= killed_at, "no error before the kill");
    }
    println!(
        "fail-over in {failed_over_in:?}; {} decisions, {} errors (all within the window)",
        after,
        failed.load(Ordering::Relaxed)
    );
}
