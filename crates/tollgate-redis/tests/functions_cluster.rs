//! The engine's Redis Functions library on a Redis Cluster: every node that decides needs it,
//! so it is loaded wherever a call finds it missing: after `FUNCTION FLUSH` on every node, and
//! on a master that joined the cluster after the library was loaded and was handed a slot.

use std::time::Duration;

use redis::Value;
use tollgate_core::{Backend, Period, Rule, RuleSet};
use tollgate_redis::RedisBackend;
use tollgate_testkit::{RedisCluster, RedisServer, key_slot};

/// Whether `node` holds a library named like Tollgate's (`tollgate_<hash>`).
fn has_library(node: &RedisServer) -> bool {
    let list: Vec<Value> = node.command(&["FUNCTION", "LIST", "LIBRARYNAME", "tollgate_*"]);
    !list.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_master_gets_the_library_again_after_a_flush_and_a_new_master_gets_it_too() {
    let mut cluster = RedisCluster::start();
    let backend = RedisBackend::builder(cluster.url())
        .timeout(Duration::from_secs(5))
        .deny_cache(false)
        .build()
        .unwrap();
    let rules = RuleSet::new([Rule::fixed_window(100, Period::HOUR)]).unwrap();
    // Keys on every master.
    let keys: Vec<String> = (0..30).map(|n| format!("user:{n}")).collect();
    for key in &keys {
        assert_eq!(backend.check(key, &rules, 1).await.unwrap().remaining(), 99);
    }
    let masters = cluster.masters();
    assert!(masters.iter().all(|&m| has_library(&cluster.nodes()[m])), "loaded on every master");

    // (on the masters: their replicas follow)
    for &m in &masters {
        let _: String = cluster.nodes()[m].command(&["FUNCTION", "FLUSH"]);
        assert!(!has_library(&cluster.nodes()[m]));
    }
    for key in &keys {
        assert_eq!(backend.check(key, &rules, 1).await.unwrap().remaining(), 98, "counts intact");
    }
    assert!(masters.iter().all(|&m| has_library(&cluster.nodes()[m])), "loaded again");

    // A master that joins now has no library; a slot moved to it, its keys are decided there.
    let key = &keys[0];
    let slot = key_slot(key.as_bytes());
    let cluster = tokio::task::spawn_blocking(move || {
        let new = cluster.add_master();
        let from = cluster.owner(slot);
        cluster.migrate_slot(slot, from, new);
        (cluster, new)
    })
    .await
    .unwrap();
    let (cluster, new) = cluster;
    assert!(!has_library(&cluster.nodes()[new]), "a new master starts without it");
    assert_eq!(cluster.owner(slot), new);
    assert_eq!(backend.check(key, &rules, 1).await.unwrap().remaining(), 97, "decided on the new master");
    assert!(has_library(&cluster.nodes()[new]));
}
