//! Slot migration under load (issue 9): a master joins the Redis Cluster of the tests' own and a
//! slot moves onto it, one Redis key at a time with pauses, while tasks keep checking keys of
//! that slot. The client follows `ASK` (a key already moved), `TRYAGAIN` (a check whose two
//! keys are split between the nodes for a moment) and `MOVED` (once the slot changed hands),
//! and runs the script on a node that has never seen it. Every key admits exactly its limit
//! across the move: nothing is lost or counted twice, and no call fails.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::{Backend, Period, Rule, RuleSet};
use tollgate_redis::RedisBackend;
use tollgate_testkit::{RedisCluster, key_slot};

/// User keys whose Redis keys all hash to one slot.
const KEYS: usize = 6;
/// Per key and per rule; more than the load reaches, so every check until the end is counted.
const LIMIT: u64 = 10_000;

/// `count` user keys of one slot. Tollgate's Redis keys are `tollgate:{<key>}:...`
/// (crates/tollgate-redis/src/keys.rs), so a key's slot is its hash tag's, the key itself.
fn keys_of_one_slot(count: usize) -> (u16, Vec<String>) {
    let slot = key_slot(b"mig-0");
    let keys: Vec<String> =
        (0..).map(|n| format!("mig-{n}")).filter(|k| key_slot(k.as_bytes()) == slot).take(count).collect();
    (slot, keys)
}

/// Error replies of one kind (`ASK`, `MOVED`, `TRYAGAIN`, `NOSCRIPT`) a node has sent, from
/// `INFO errorstats`.
fn error_replies(cluster: &RedisCluster, node: usize, kind: &str) -> u64 {
    let info: String = cluster.nodes()[node].command(&["INFO", "errorstats"]);
    let prefix = format!("errorstat_{kind}:count=");
    info.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_moved_to_a_new_master_under_load_counts_every_check_once() {
    let mut cluster = RedisCluster::start();
    let (slot, keys) = keys_of_one_slot(KEYS);
    let first_key = format!("tollgate:{{{}}}:h", keys[0]);
    assert_eq!(cluster.nodes()[0].command::<i64>(&["CLUSTER", "KEYSLOT", &first_key]), i64::from(slot));
    let backend = Arc::new(
        RedisBackend::builder(cluster.url())
            .timeout(Duration::from_secs(5))
            // Every check goes to Redis (no denial is answered locally).
            .deny_cache(false)
            .build()
            .unwrap(),
    );
    // Two rules, two Redis keys per user key (a hash and a sorted set): a check is a multi-key
    // script call, which a node refuses with TRYAGAIN while its keys are split.
    let rules = RuleSet::new([
        Rule::fixed_window(LIMIT, Period::HOUR),
        Rule::sliding_window_log(LIMIT, Period::HOUR),
    ])
    .unwrap();
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    for (n, key) in keys.iter().enumerate() {
        assert!(backend.check(key, &rules, 1).await.unwrap().allowed());
        admitted[n].fetch_add(1, Ordering::Relaxed);
    }
    let from = cluster.owner(slot);
    // A new master, with no slot and no script loaded: scaling out.
    let to = cluster.add_master();
    assert_eq!(cluster.keys_in_slot(from, slot).len(), 2 * KEYS, "two Redis keys per user key");

    let running = Arc::new(AtomicBool::new(true));
    let denied = Arc::new(AtomicU64::new(0));
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut load = Vec::new();
    for task in 0..16 {
        let (backend, rules, running) = (backend.clone(), rules.clone(), running.clone());
        let (keys, admitted, denied, errors) =
            (keys.clone(), admitted.clone(), denied.clone(), errors.clone());
        load.push(tokio::spawn(async move {
            let mut i = task;
            while running.load(Ordering::Relaxed) {
                let n = i % KEYS;
                match backend.check(&keys[n], &rules, 1).await {
                    Ok(d) if d.allowed() => admitted[n].fetch_add(1, Ordering::Relaxed),
                    Ok(_) => denied.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        errors.lock().unwrap().push(format!("{}: {e}", keys[n]));
                        0
                    }
                };
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let decided = |admitted: &[AtomicU64]| admitted.iter().map(|a| a.load(Ordering::Relaxed)).sum::<u64>();
    let before = decided(&admitted);

    // One Redis key per MIGRATE, 40 ms apart: for most of the move some keys are on each node,
    // and each user key spends 40 ms with its hash on one and its sorted set on the other.
    let started = Instant::now();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.begin_migration(slot, from, to);
        while !cluster.migrate_keys(slot, from, to, 1).is_empty() {
            std::thread::sleep(Duration::from_millis(40));
        }
        cluster.finish_migration(slot, from, to);
        cluster
    })
    .await
    .unwrap();
    let moved_in = started.elapsed();
    let during = decided(&admitted) - before;
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.store(false, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let total = decided(&admitted);

    let (ask, tryagain, moved) = (
        error_replies(&cluster, from, "ASK"),
        error_replies(&cluster, from, "TRYAGAIN") + error_replies(&cluster, to, "TRYAGAIN"),
        error_replies(&cluster, from, "MOVED"),
    );
    let noscript = error_replies(&cluster, to, "NOSCRIPT");
    let errors = std::mem::take(&mut *errors.lock().unwrap());
    println!(
        "slot {slot} moved from node {from} (port {}) to new node {to} (port {}) in {moved_in:?}: {total} checks admitted \
         ({during} during the move), {} denied, {} errors; the old owner answered {ask} ASK, \
         {tryagain} TRYAGAIN (both nodes), {moved} MOVED; the new one {noscript} NOSCRIPT",
        cluster.nodes()[from].port(),
        cluster.nodes()[to].port(),
        denied.load(Ordering::Relaxed),
        errors.len(),
    );
    // The kinds of error, with how often each came.
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for e in errors.iter() {
        *kinds.entry(e.split_once(": ").map_or(e.clone(), |(_, e)| e.to_owned())).or_default() += 1;
    }
    assert!(errors.is_empty(), "{} checks failed: {kinds:#?}", errors.len());
    assert_eq!(denied.load(Ordering::Relaxed), 0, "the limit is beyond the load's reach");
    // What the test is about happened: checks reached the slot while it moved, redirected.
    assert!(during > 0, "no check completed during the move");
    assert!(ask > 0, "no ASK redirection: the load did not reach keys already moved");
    assert!(moved > 0, "no MOVED redirection after the slot changed hands");

    // The keys live on the new master, and only there.
    assert_eq!(cluster.owner(slot), to);
    assert_eq!(cluster.keys_in_slot(from, slot), Vec::<String>::new());
    assert_eq!(cluster.keys_in_slot(to, slot).len(), 2 * KEYS);

    // Exactly the admitted checks were counted, by both rules: what is left is the limit less
    // them, all of it can still be taken, and then nothing more.
    for (n, key) in keys.iter().enumerate() {
        let admitted = admitted[n].load(Ordering::Relaxed);
        let peek = backend.check(key, &rules, 0).await.unwrap();
        assert_eq!(peek.remaining(), LIMIT - admitted, "{key}: {admitted} admitted");
        assert!(backend.check(key, &rules, LIMIT - admitted).await.unwrap().allowed(), "{key}");
        assert!(!backend.check(key, &rules, 1).await.unwrap().allowed(), "{key}");
    }
}
