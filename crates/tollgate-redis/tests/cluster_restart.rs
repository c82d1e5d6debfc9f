//! A cluster master restarted empty (issue 18): the denials cached from it are dropped when
//! the cluster client sees its connection close, though no call failed; the key is then
//! decided by the new, empty master. On both engines (`name::on_lua`, `name::on_module`).

mod engines;

use std::time::{Duration, Instant};

use tollgate_core::{Backend, Period, Rule, RuleSet};
use tollgate_redis::{Engine, RedisBackend};
use tollgate_testkit::key_slot;

use engines::{cluster, on_both_engines};

on_both_engines!(
    a_master_restarted_empty_drops_its_cached_denials,
    flavor = "multi_thread",
    worker_threads = 2
);
async fn a_master_restarted_empty_drops_its_cached_denials(engine: Engine) {
    let mut cluster = cluster(engine);
    // The deny cache is on by default.
    let backend =
        RedisBackend::builder(cluster.url()).engine(engine).timeout(Duration::from_secs(2)).build().unwrap();
    let rules = RuleSet::new([Rule::fixed_window(2, Period::HOUR)]).unwrap();
    for _ in 0..2 {
        assert!(backend.check("spent", &rules, 1).await.unwrap().allowed());
    }
    assert!(!backend.check("spent", &rules, 1).await.unwrap().allowed());
    let owner = cluster.owner(key_slot(b"spent"));
    // Restarted faster than the node timeout (1 s): it stays the slot's master (its
    // nodes.conf survives), and comes back empty; no fail-over to a replica that kept the
    // count.
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.node_mut(owner).restart();
        cluster.wait_ok(Duration::from_secs(30));
        cluster
    })
    .await
    .unwrap();
    assert_eq!(cluster.owner(key_slot(b"spent")), owner, "no fail-over");
    assert_eq!(cluster.nodes()[owner].command::<i64>(&["DBSIZE"]), 0, "restarted empty");
    let back = Instant::now();
    let admitted_in = loop {
        // Errors are allowed while the client finds the node again; a cached denial is not.
        if let Ok(d) = backend.check("spent", &rules, 1).await
            && d.allowed()
        {
            break back.elapsed();
        }
        assert!(back.elapsed() < Duration::from_secs(2), "the cached denial stood");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!("admitted again {admitted_in:?} after the cluster was ok");
    assert_eq!(backend.check("spent", &rules, 0).await.unwrap().remaining(), 1);
}
