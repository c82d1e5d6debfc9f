//! Slot migration under load (issue 9), on a Redis Cluster of the tests' own: a slot moves to
//! another master in steps with pauses (onto a master that just joined, one Redis key per
//! `MIGRATE`; between two masters, ten per `MIGRATE` as `redis-cli --cluster reshard` does)
//! while tasks keep checking keys of that slot. The client follows `ASK` (a key already moved),
//! `TRYAGAIN` (a check whose two keys are split between the nodes for a moment) and `MOVED`
//! (once the slot changed hands), and runs the script on a node that has never seen it. Every
//! key admits exactly its limit across the move: nothing is lost or counted twice, and no call
//! fails. On both engines (`name::on_lua`, `name::on_module`: the new master loads the module
//! too, as the others did).

mod engines;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::{Backend, Period, Rule, RuleSet};
use tollgate_redis::{Engine, RedisBackend};
use tollgate_testkit::{RedisCluster, key_slot};

use engines::{cluster, on_both_engines};

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

/// Where the slot goes.
enum Target {
    /// A master that joins first, with no slot and no script loaded: scaling out.
    NewMaster,
    /// Another of the three masters.
    OtherMaster,
}

/// Moves the slot of `key_count` user keys to `target`, `per_migrate` Redis keys per `MIGRATE`
/// 40 ms apart, under load from 16 tasks; checks that nothing failed and every check counted
/// once. Answers the cluster, the backend, the rules, the keys, what each admitted, the slot
/// and the node it moved to.
async fn migrate_under_load(engine: Engine, key_count: usize, target: Target, per_migrate: usize) -> Moved {
    let mut cluster = cluster(engine);
    let (slot, keys) = keys_of_one_slot(key_count);
    let first_key = format!("tollgate:{{{}}}:h", keys[0]);
    assert_eq!(cluster.nodes()[0].command::<i64>(&["CLUSTER", "KEYSLOT", &first_key]), i64::from(slot));
    let backend = Arc::new(
        RedisBackend::builder(cluster.url())
            .engine(engine)
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
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..key_count).map(|_| AtomicU64::new(0)).collect());
    for (n, key) in keys.iter().enumerate() {
        assert!(backend.check(key, &rules, 1).await.unwrap().allowed());
        admitted[n].fetch_add(1, Ordering::Relaxed);
    }
    let from = cluster.owner(slot);
    let to = match target {
        Target::NewMaster => cluster.add_master(),
        Target::OtherMaster => cluster.masters().into_iter().find(|&m| m != from).unwrap(),
    };
    assert_eq!(cluster.keys_in_slot(from, slot).len(), 2 * key_count, "two Redis keys per user key");

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
                let n = i % keys.len();
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

    // For most of the move some keys are on each node, and a user key whose hash and sorted set
    // went in different batches has them on different nodes for 40 ms.
    let started = Instant::now();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.begin_migration(slot, from, to);
        while !cluster.migrate_keys(slot, from, to, per_migrate).is_empty() {
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
        "slot {slot} ({key_count} keys, {per_migrate} Redis keys per MIGRATE) moved from node {from} \
         to node {to} in {moved_in:?}: {total} checks admitted ({during} during the move), {} denied, \
         {} errors; the old owner answered {ask} ASK, {moved} MOVED, the two {tryagain} TRYAGAIN, \
         the new owner {noscript} NOSCRIPT",
        denied.load(Ordering::Relaxed),
        errors.len(),
    );
    // The kinds of error, with how often each came.
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for e in &errors {
        *kinds.entry(e.split_once(": ").map_or(e.clone(), |(_, e)| e.to_owned())).or_default() += 1;
    }
    assert!(errors.is_empty(), "{} checks failed: {kinds:#?}", errors.len());
    assert_eq!(denied.load(Ordering::Relaxed), 0, "the limit is beyond the load's reach");
    // What the test is about happened: checks reached the slot while it moved, redirected.
    assert!(during > 0, "no check completed during the move");
    assert!(ask > 0, "no ASK redirection: the load did not reach keys already moved");
    assert!(moved > 0, "no MOVED redirection after the slot changed hands");

    // The keys live on the new owner, and only there.
    assert_eq!(cluster.owner(slot), to);
    assert_eq!(cluster.keys_in_slot(from, slot), Vec::<String>::new());
    assert_eq!(cluster.keys_in_slot(to, slot).len(), 2 * key_count);
    let admitted = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    Moved { cluster, backend, rules, keys, admitted, slot, from, to }
}

/// What [`migrate_under_load`] leaves.
struct Moved {
    cluster: RedisCluster,
    backend: Arc<RedisBackend>,
    rules: RuleSet,
    keys: Vec<String>,
    admitted: Vec<u64>,
    slot: u16,
    from: usize,
    to: usize,
}

impl Moved {
    /// Exactly the admitted checks were counted, by both rules: what is left is the limit less
    /// them, all of it can still be taken, and then nothing more.
    async fn assert_exact(&self) {
        for (key, admitted) in self.keys.iter().zip(&self.admitted) {
            let peek = self.backend.check(key, &self.rules, 0).await.unwrap();
            assert_eq!(peek.remaining(), LIMIT - admitted, "{key}: {admitted} admitted");
            assert!(self.backend.check(key, &self.rules, LIMIT - admitted).await.unwrap().allowed(), "{key}");
            assert!(!self.backend.check(key, &self.rules, 1).await.unwrap().allowed(), "{key}");
        }
    }
}

on_both_engines!(
    a_slot_moved_to_a_new_master_under_load_counts_every_check_once,
    flavor = "multi_thread",
    worker_threads = 4
);
async fn a_slot_moved_to_a_new_master_under_load_counts_every_check_once(engine: Engine) {
    migrate_under_load(engine, 6, Target::NewMaster, 1).await.assert_exact().await;
}

on_both_engines!(
    a_slot_resharded_between_masters_under_load_counts_every_check_once,
    flavor = "multi_thread",
    worker_threads = 4
);
async fn a_slot_resharded_between_masters_under_load_counts_every_check_once(engine: Engine) {
    let moved = migrate_under_load(engine, 30, Target::OtherMaster, 10).await;
    // And back in one go, as `redis-cli --cluster reshard` would (no load): still exact.
    let (cluster, slot, from, to) = (&moved.cluster, moved.slot, moved.from, moved.to);
    tokio::task::block_in_place(|| cluster.migrate_slot(slot, to, from));
    assert_eq!(cluster.owner(slot), from);
    assert_eq!(cluster.keys_in_slot(from, slot).len(), 2 * moved.keys.len());
    moved.assert_exact().await;
}
