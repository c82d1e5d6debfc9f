//! `auto` on a Redis Cluster whose masters differ: the module loaded into one master of three
//! (a rolling deployment half done). That master's keys are decided by the module, the others'
//! by the Lua, every count stays exact, and each master without the module is asked once, not
//! once per slot.

use std::time::{Duration, Instant};

use tollgate_core::{Backend, Period, Rule, RuleSet};
use tollgate_redis::{Engine, RedisBackend};
use tollgate_testkit::{RedisCluster, RedisServer, key_slot, redis_module};

/// Calls of `command` that succeeded.
fn succeeded(server: &RedisServer, command: &str) -> u64 {
    server.command_stat(command, "calls") - server.command_stat(command, "failed_calls")
}

/// Error replies the server has sent, in all.
fn error_replies(server: &RedisServer) -> u64 {
    let info: String = server.command(&["INFO", "stats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("total_error_replies:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats has total_error_replies")
}

#[tokio::test]
async fn auto_uses_the_module_on_the_master_that_has_it() {
    let cluster = RedisCluster::start_with(&["--enable-module-command", "yes"]);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let with_module = masters[0];
    let path = redis_module();
    let _: () = cluster.nodes()[with_module].command(&["MODULE", "LOAD", path.to_str().unwrap()]);
    // Each read of the error count opens a connection of its own, whose handshake Redis 7.0
    // may answer with errors (CLIENT SETINFO): every node pays the same, so deltas compare.
    let errors_before: Vec<u64> = masters.iter().map(|&m| error_replies(&cluster.nodes()[m])).collect();

    let backend = RedisBackend::builder(cluster.url())
        .engine(Engine::Auto)
        .deny_cache(false)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let rules = RuleSet::new([Rule::fixed_window(3, Period::MINUTE)]).unwrap();
    let keys: Vec<String> = (0..60).map(|i| format!("user-{i}")).collect();
    let started = Instant::now();
    for key in &keys {
        for n in 0..4 {
            let decision = backend.check(key, &rules, 1).await.unwrap();
            assert_eq!(decision.allowed(), n < 3, "{key}, check {n}");
        }
    }
    let took = started.elapsed();
    assert_eq!(backend.engine(), Some("mixed"));

    // Read once each, as before the checks (a read opens a connection: see above).
    let errors: Vec<u64> = masters
        .iter()
        .zip(&errors_before)
        .map(|(&m, before)| error_replies(&cluster.nodes()[m]) - before)
        .collect();
    for (i, &master) in masters.iter().enumerate() {
        let node = &cluster.nodes()[master];
        // Tollgate's state keys carry the caller's key as their hash tag.
        let checks = 4 * keys
            .iter()
            .filter(|k| cluster.owner(key_slot(format!("{{{k}}}").as_bytes())) == master)
            .count();
        assert!(checks > 0, "every master serves some of the keys");
        if master == with_module {
            assert_eq!(succeeded(node, "tollgate.decide") as usize, checks, "the module decided its keys");
            assert_eq!(node.command_stat("fcall", "calls"), 0, "and the Lua none");
        } else {
            assert_eq!(succeeded(node, "fcall") as usize, checks, "the Lua decided master {master}'s keys");
            assert_eq!(succeeded(node, "tollgate.decide"), 0);
            // One "unknown command" for the master (not one per slot: that would be about 20),
            // and one "Function not found" before the library is loaded; `auto` asks again
            // every 10 s, which a slow run may reach.
            let allowed = 2 * (1 + took.as_secs() / 10);
            assert!(
                errors[i] <= errors[0] + allowed,
                "master {master}: {} error replies, against {} on the module's master",
                errors[i],
                errors[0]
            );
        }
    }
}
