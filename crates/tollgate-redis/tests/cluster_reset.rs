//! Resets on a Redis Cluster (issue 18): a reset is one script call sent as a check is, so it
//! follows `ASK`, `MOVED` and `TRYAGAIN` while a slot migrates, and finds the new master after a
//! fail-over, as checks do; and it is never half done (a rule set whose states live in two Redis
//! keys, a hash and a sorted set, has both forgotten or neither). On both engines
//! (`name::on_lua`, `name::on_module`): a reset is the same script on both, and the checks around
//! it are each engine's.

mod engines;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::{Backend, Period, Rule, RuleSet};
use tollgate_redis::{Engine, RedisBackend};
use tollgate_testkit::{RedisCluster, key_slot};

use engines::{cluster, on_both_engines};

/// Per key and per rule; far beyond what the tests spend.
const LIMIT: u64 = 1_000;

/// `count` user keys of one slot (Tollgate's Redis keys hash on the user key, keys.rs).
fn keys_of_one_slot(count: usize) -> (u16, Vec<String>) {
    let slot = key_slot(b"reset-0");
    let keys: Vec<String> =
        (0..).map(|n| format!("reset-{n}")).filter(|k| key_slot(k.as_bytes()) == slot).take(count).collect();
    (slot, keys)
}

/// A fixed window (in the key's hash) and a sliding log (a sorted set of its own): two Redis
/// keys per user key, which a migration can split between two nodes.
fn rules() -> RuleSet {
    RuleSet::new([Rule::fixed_window(LIMIT, Period::HOUR), Rule::sliding_window_log(LIMIT, Period::HOUR)])
        .unwrap()
}

fn backend(cluster: &RedisCluster, engine: Engine) -> Arc<RedisBackend> {
    Arc::new(
        RedisBackend::builder(cluster.url())
            .engine(engine)
            .timeout(Duration::from_secs(5))
            // Every check goes to Redis.
            .deny_cache(false)
            .build()
            .unwrap(),
    )
}

/// Error replies of one kind a node has sent, from `INFO errorstats`.
fn error_replies(cluster: &RedisCluster, node: usize, kind: &str) -> u64 {
    let info: String = cluster.nodes()[node].command(&["INFO", "errorstats"]);
    let prefix = format!("errorstat_{kind}:count=");
    info.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |n| n.trim().parse().unwrap())
}

/// What one key's task saw: each cycle spends, resets, then peeks; right after its own reset
/// (nothing else touches its key), both rules must be full again.
#[derive(Default)]
struct Seen {
    resets: AtomicU64,
    errors: Mutex<Vec<String>>,
    /// Peeks after a reset that found a rule not full: a reset half done.
    half_done: Mutex<Vec<String>>,
}

async fn spend_reset_peek(backend: &RedisBackend, rules: &RuleSet, key: &str, seen: &Seen) {
    let spent = backend.check(key, rules, 2).await;
    let reset = match spent {
        Ok(_) => backend.reset(key, rules).await,
        Err(e) => Err(e),
    };
    if let Err(e) = reset {
        seen.errors.lock().unwrap().push(format!("{key}: {e}"));
        return;
    }
    seen.resets.fetch_add(1, Ordering::Relaxed);
    match backend.check(key, rules, 0).await {
        Ok(peek) if peek.outcomes(rules).all(|r| r.remaining() == LIMIT) => {}
        Ok(peek) => seen.half_done.lock().unwrap().push(format!(
            "{key}: remaining {:?} after a reset",
            peek.outcomes(rules).map(|r| r.remaining()).collect::<Vec<_>>()
        )),
        Err(e) => seen.errors.lock().unwrap().push(format!("{key} (peek): {e}")),
    }
}

on_both_engines!(
    resets_during_a_slot_migration_follow_the_redirections_and_are_never_half_done,
    flavor = "multi_thread",
    worker_threads = 4
);
async fn resets_during_a_slot_migration_follow_the_redirections_and_are_never_half_done(engine: Engine) {
    let cluster = cluster(engine);
    let (slot, keys) = keys_of_one_slot(8);
    let backend = backend(&cluster, engine);
    let rules = rules();
    for key in &keys {
        assert!(backend.check(key, &rules, 1).await.unwrap().allowed());
    }
    let from = cluster.owner(slot);
    let to = cluster.masters().into_iter().find(|&m| m != from).unwrap();

    let running = Arc::new(AtomicBool::new(true));
    let seen = Arc::new(Seen::default());
    let mut tasks = Vec::new();
    for key in keys.clone() {
        let (backend, rules, running, seen) = (backend.clone(), rules.clone(), running.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                spend_reset_peek(&backend, &rules, &key, &seen).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = seen.resets.load(Ordering::Relaxed);
    // One Redis key per MIGRATE, 40 ms apart: for most of the move a user key's hash and
    // sorted set can be on different nodes (TRYAGAIN), and keys already moved answer ASK.
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.begin_migration(slot, from, to);
        while !cluster.migrate_keys(slot, from, to, 1).is_empty() {
            std::thread::sleep(Duration::from_millis(40));
        }
        // Keys deleted by resets are created again on the importing node (ASK): the source
        // empties even under load. A little longer with the slot half-moved, still.
        std::thread::sleep(Duration::from_millis(200));
        cluster.finish_migration(slot, from, to);
        cluster
    })
    .await
    .unwrap();
    let during = seen.resets.load(Ordering::Relaxed) - before;
    // After the move, the old owner answers MOVED until the client re-reads the slot map.
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.store(false, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let (ask, moved, tryagain) = (
        error_replies(&cluster, from, "ASK"),
        error_replies(&cluster, from, "MOVED"),
        error_replies(&cluster, from, "TRYAGAIN") + error_replies(&cluster, to, "TRYAGAIN"),
    );
    let errors = std::mem::take(&mut *seen.errors.lock().unwrap());
    let half_done = std::mem::take(&mut *seen.half_done.lock().unwrap());
    println!(
        "{} resets ({during} during the move), {} errors, {} half done; the old owner answered \
         {ask} ASK and {moved} MOVED, the two {tryagain} TRYAGAIN",
        seen.resets.load(Ordering::Relaxed),
        errors.len(),
        half_done.len()
    );
    assert!(errors.is_empty(), "{} calls failed, first: {:?}", errors.len(), &errors[..errors.len().min(5)]);
    assert!(half_done.is_empty(), "{half_done:?}");
    // What the test is about happened: resets reached the slot while it moved, redirected.
    assert!(during > 0, "no reset completed during the move");
    assert!(ask > 0 && moved > 0, "redirections: {ask} ASK, {moved} MOVED");
    assert_eq!(cluster.owner(slot), to);
    // Every key is full again after a last reset, on its new owner.
    for key in &keys {
        backend.reset(key, &rules).await.unwrap();
        assert!(
            backend.check(key, &rules, 0).await.unwrap().outcomes(&rules).all(|r| r.remaining() == LIMIT)
        );
    }
}

on_both_engines!(
    resets_during_a_fail_over_fail_only_while_the_slot_has_no_master,
    flavor = "multi_thread",
    worker_threads = 4
);
async fn resets_during_a_fail_over_fail_only_while_the_slot_has_no_master(engine: Engine) {
    let mut cluster = cluster(engine);
    let (slot, keys) = keys_of_one_slot(4);
    let backend = backend(&cluster, engine);
    let rules = rules();
    for key in &keys {
        assert!(backend.check(key, &rules, 1).await.unwrap().allowed());
    }
    let running = Arc::new(AtomicBool::new(true));
    let seen = Arc::new(Seen::default());
    let last_error: Arc<Mutex<Option<Instant>>> = Arc::default();
    let mut tasks = Vec::new();
    for key in keys.clone() {
        let (backend, rules, running, seen) = (backend.clone(), rules.clone(), running.clone(), seen.clone());
        let last_error = last_error.clone();
        tasks.push(tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                let errors = seen.errors.lock().unwrap().len();
                spend_reset_peek(&backend, &rules, &key, &seen).await;
                if seen.errors.lock().unwrap().len() > errors {
                    *last_error.lock().unwrap() = Some(Instant::now());
                    // A caller would not hammer a cluster that is failing over.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim = cluster.owner(slot);
    let killed_at = Instant::now();
    cluster.node_mut(victim).kill();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.wait_masters(3, Duration::from_secs(30));
        cluster
    })
    .await
    .unwrap();
    let recovered_at = Instant::now();
    let resets_at_recovery = seen.resets.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.store(false, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let errors = seen.errors.lock().unwrap().len();
    let half_done = std::mem::take(&mut *seen.half_done.lock().unwrap());
    let after = seen.resets.load(Ordering::Relaxed) - resets_at_recovery;
    println!(
        "fail-over in {:?}: {} resets, {after} after it; {errors} failed, the last {:?} after the kill",
        recovered_at - killed_at,
        seen.resets.load(Ordering::Relaxed),
        last_error.lock().unwrap().map(|at| at - killed_at),
    );
    assert!(half_done.is_empty(), "{half_done:?}");
    assert_ne!(cluster.owner(slot), victim);
    assert!(after > 0, "resets go on after the fail-over");
    // A reset fails (503) only while the slot has no master; the first ones after the
    // fail-over (the client's slot map still names the dead node) already succeed. The
    // margin: a call that began before the fail-over ended may wait out its retries.
    if let Some(last) = *last_error.lock().unwrap() {
        assert!(
            last <= recovered_at + Duration::from_millis(500),
            "a reset failed {:?} after the cluster had recovered",
            last - recovered_at
        );
    }
    for key in &keys {
        backend.reset(key, &rules).await.unwrap();
        assert!(
            backend.check(key, &rules, 0).await.unwrap().outcomes(&rules).all(|r| r.remaining() == LIMIT)
        );
    }
}
