//! The Redis backend on the Tollgate Redis module's engine (`TOLLGATE.DECIDE`): the shared
//! scenarios; the engine `auto` picks; `module` refusing a Redis without the module; the module
//! loaded into a running Redis mid-count; both engines at once on the same keys, under load,
//! admitting exactly the limit; and the module unloaded, loaded and unloaded again under load
//! (`engine_switch`). The other backend tests run on both engines too (`on_both_engines!`, in
//! tests/engines).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tollgate_core::{Backend, LeaseId, ManualClock, Operation, Period, Rule, RuleSet};
use tollgate_redis::{Engine, RedisBackend};
use tollgate_testkit::conformance::one_of_each;
use tollgate_testkit::{OnServer, RedisCluster, RedisServer, redis_module};

fn on(server: &RedisServer, engine: Engine) -> RedisBackend {
    RedisBackend::builder(server.url()).engine(engine).timeout(Duration::from_secs(5)).build().unwrap()
}

mod scenarios {
    use super::*;

    fn backend(clock: ManualClock) -> OnServer<RedisBackend> {
        let server = RedisServer::with_module(&[]);
        let backend = RedisBackend::builder(server.url())
            .engine(Engine::Module)
            .clock(clock)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        OnServer { backend, server }
    }

    tollgate_testkit::conformance_tests!(backend);
}

#[tokio::test]
async fn auto_uses_the_module_where_it_is_loaded_and_the_lua_elsewhere() {
    let rules = RuleSet::new([Rule::fixed_window(5, Period::MINUTE)]).unwrap();

    let plain = RedisServer::start();
    let auto = on(&plain, Engine::Auto);
    assert_eq!(auto.check("k", &rules, 2).await.unwrap().remaining(), 3);
    assert_eq!(auto.engine(), Some("lua"));
    assert_eq!(plain.calls("tollgate.decide"), 0, "an unknown command is not counted as a call");
    assert!(on(&plain, Engine::Module).require_module().await.is_err());
    let refused = on(&plain, Engine::Module).check("k", &rules, 1).await.unwrap_err();
    assert!(refused.to_string().contains("unknown command"), "{refused}");

    let loaded = RedisServer::with_module(&[]);
    let auto = on(&loaded, Engine::Auto);
    assert_eq!(auto.check("k", &rules, 2).await.unwrap().remaining(), 3);
    assert_eq!(auto.engine(), Some("module"));
    assert!(on(&loaded, Engine::Module).require_module().await.is_ok());
    assert_eq!(on(&loaded, Engine::Lua).check("k", &rules, 1).await.unwrap().remaining(), 2);
    assert_eq!(loaded.calls("tollgate.decide"), 1);
    assert!(loaded.calls("fcall") >= 1, "the Lua engine's call (after loading its library)");
}

#[tokio::test]
async fn the_module_loaded_into_a_running_redis_takes_over_the_counts() {
    let server = RedisServer::start_with(&["--enable-module-command", "yes"]);
    let rules = RuleSet::new([
        Rule::fixed_window(10, Period::MINUTE),
        Rule::sliding_window_log(10, Period::MINUTE),
        Rule::gcra(10, Period::MINUTE, 10),
    ])
    .unwrap();
    let lua = on(&server, Engine::Lua);
    for remaining in [7, 4] {
        assert_eq!(lua.check("k", &rules, 3).await.unwrap().remaining(), remaining);
    }
    let path = redis_module();
    let loaded: String = server.command(&["MODULE", "LOAD", path.to_str().unwrap()]);
    assert_eq!(loaded, "OK");
    let module = on(&server, Engine::Module);
    assert_eq!(module.check("k", &rules, 3).await.unwrap().remaining(), 1);
    assert!(!module.check("k", &rules, 2).await.unwrap().allowed());
    assert_eq!(lua.check("k", &rules, 1).await.unwrap().remaining(), 0, "and back to the Lua");
    assert_eq!(server.calls("tollgate.decide"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_engines_at_once_admit_exactly_the_limit() {
    let server = RedisServer::with_module(&[]);
    let year: Period = "1y".parse().unwrap();
    let engines = [Arc::new(on(&server, Engine::Module)), Arc::new(on(&server, Engine::Lua))];
    for rule in one_of_each(200, year) {
        let rules = Arc::new(RuleSet::new([rule.clone()]).unwrap());
        let admitted = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for task in 0..64 {
            let (backend, rules, admitted) =
                (Arc::clone(&engines[task % 2]), rules.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let id = LeaseId::random();
                    let op = if rules.has_concurrency() {
                        Operation::Acquire { cost: 1, lease: &id }
                    } else {
                        Operation::Check { cost: 1 }
                    };
                    if backend.execute("one-key", &rules, op).await.unwrap().allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 200, "{rule:?}");
        for backend in &engines {
            let peek = backend.check("one-key", &rules, 0).await.unwrap();
            assert_eq!(peek.remaining(), 0, "{rule:?}");
        }
    }
    // Both engines took calls (each call may carry several coalesced decisions).
    assert!(server.calls("tollgate.decide") > 0 && server.calls("fcall") > 0);
}

#[tokio::test]
async fn on_a_cluster_the_module_is_routed_by_key() {
    let path = redis_module();
    let cluster = RedisCluster::start_with(&["--loadmodule", path.to_str().unwrap()]);
    let backend = RedisBackend::builder(cluster.url())
        .engine(Engine::Module)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    backend.require_module().await.unwrap();
    let rules =
        RuleSet::new([Rule::fixed_window(2, Period::MINUTE), Rule::sliding_window_log(2, Period::MINUTE)])
            .unwrap();
    // Keys of many slots, so every master decides some.
    for key in (0..30).map(|i| format!("user-{i}")) {
        assert_eq!(backend.check(&key, &rules, 1).await.unwrap().remaining(), 1, "{key}");
        assert_eq!(backend.check(&key, &rules, 1).await.unwrap().remaining(), 0, "{key}");
        assert!(!backend.check(&key, &rules, 1).await.unwrap().allowed(), "{key}");
    }
    assert_eq!(backend.engine(), Some("module"));
    let answered: u64 = cluster.masters().iter().map(|&m| cluster.nodes()[m].calls("tollgate.decide")).sum();
    assert_eq!(answered, 90);
    assert!(cluster.masters().iter().all(|&m| cluster.nodes()[m].calls("tollgate.decide") > 0));
}

/// Switching engines under load: the module unloaded, loaded again and unloaded again while 32
/// tasks on `auto` keep checking. Every check is answered (`auto` decides a call the module can
/// no longer take with the Lua at once), and both engines keep one count: each key admits
/// exactly its limit, and Redis holds exactly what was admitted.
mod engine_switch {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::time::Instant;

    use super::*;

    const TASKS: usize = 32;
    /// Fresh keys per round; every task checks each once per round.
    const KEYS_PER_ROUND: usize = 4;
    const LIMIT: u64 = 20;
    /// The whole test's bound (it takes about 15 s: `auto` waits 10 s before it asks for the
    /// module again).
    const BOUND: Duration = Duration::from_secs(50);

    /// Five rules of limit 20 over a year: nothing refills or rolls over during the test.
    fn rules() -> RuleSet {
        let year: Period = "1y".parse().unwrap();
        RuleSet::new([
            Rule::fixed_window(LIMIT, year),
            Rule::sliding_window_log(LIMIT, year),
            Rule::sliding_window_counter(LIMIT, year),
            Rule::token_bucket(LIMIT, LIMIT, year),
            Rule::gcra(LIMIT, year, LIMIT),
        ])
        .unwrap()
    }

    #[derive(Default)]
    struct Tally {
        /// Per key: checks answered, and admitted.
        keys: Mutex<BTreeMap<String, (u64, u64)>>,
        errors: Mutex<Vec<String>>,
    }

    /// Polls `done` every 20 ms for at most `within`; answers how long it took.
    async fn until(within: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < within, "{what}: not within {within:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        start.elapsed()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn switching_engines_under_load_loses_nothing() {
        tokio::time::timeout(BOUND, switch_under_load()).await.expect("the test's time bound");
    }

    async fn switch_under_load() {
        let server = RedisServer::with_module(&["--enable-module-command", "yes"]);
        let path = redis_module();
        let path = path.to_str().unwrap();
        let backend = Arc::new(
            RedisBackend::builder(server.url())
                .engine(Engine::Auto)
                // Every check reaches Redis, across every switch.
                .deny_cache(false)
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
        );
        let rules = Arc::new(rules());
        let (running, tally) = (Arc::new(AtomicBool::new(true)), Arc::new(Tally::default()));
        let answered = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for task in 0..TASKS {
            let (backend, rules, running) = (backend.clone(), rules.clone(), running.clone());
            let (tally, answered) = (tally.clone(), answered.clone());
            tasks.push(tokio::spawn(async move {
                let mut round = 0;
                while running.load(Ordering::Relaxed) {
                    for i in 0..KEYS_PER_ROUND {
                        let key = format!("switch:{round}:{}", (task + i) % KEYS_PER_ROUND);
                        match backend.check(&key, &rules, 1).await {
                            Ok(d) => {
                                let mut keys = tally.keys.lock().unwrap();
                                let (checks, admitted) = keys.entry(key).or_default();
                                *checks += 1;
                                *admitted += u64::from(d.allowed());
                            }
                            Err(e) => tally.errors.lock().unwrap().push(format!("{key}: {e}")),
                        }
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    round += 1;
                }
                round
            }));
        }
        let answered_since = |from: u64| answered.load(Ordering::Relaxed) - from;
        let second = Duration::from_secs(1);
        let module_calls = || server.calls("tollgate.decide");
        let lua_calls = || server.calls("fcall");

        // The module decides.
        until(5 * second, "checks on the module", || module_calls() >= 100).await;
        assert_eq!(backend.engine(), Some("module"));

        // Unloaded: the Lua takes over at once.
        let unloaded: String = server.command(&["MODULE", "UNLOAD", "tollgate"]);
        assert_eq!(unloaded, "OK");
        let (from, lua) = (answered.load(Ordering::Relaxed), lua_calls());
        until(5 * second, "checks on the Lua", || lua_calls() >= lua + 100).await;
        assert_eq!(backend.engine(), Some("lua"));

        // Loaded again: `auto` asks for it again within its 10 s, and it decides again.
        let loaded: String = server.command(&["MODULE", "LOAD", path]);
        assert_eq!(loaded, "OK");
        let module = module_calls();
        let back_in = until(20 * second, "auto back on the module", || {
            backend.engine() == Some("module") && module_calls() >= module + 100
        })
        .await;
        let on_lua = answered_since(from);

        // Unloaded again, under load.
        let unloaded: String = server.command(&["MODULE", "UNLOAD", "tollgate"]);
        assert_eq!(unloaded, "OK");
        let lua = lua_calls();
        until(5 * second, "checks on the Lua again", || lua_calls() >= lua + 100).await;

        running.store(false, Ordering::Relaxed);
        let mut rounds = 0;
        for task in tasks {
            rounds = rounds.max(task.await.unwrap());
        }
        let errors = std::mem::take(&mut *tally.errors.lock().unwrap());
        assert!(
            errors.is_empty(),
            "{} checks failed, first: {:?}",
            errors.len(),
            &errors[..errors.len().min(5)]
        );

        // Exactly the limit per key, and Redis holds what was admitted: on every rule, the
        // limit less the admitted is left, and once the admitted units are refunded, all of it.
        let keys = std::mem::take(&mut *tally.keys.lock().unwrap());
        let lua = on(&server, Engine::Lua);
        let mut full = 0;
        let mut admitted_in_all = 0;
        for (key, &(checks, admitted)) in &keys {
            assert_eq!(admitted, checks.min(LIMIT), "{key}: {checks} checks");
            full += usize::from(admitted == LIMIT);
            admitted_in_all += admitted;
            let left: Vec<u64> =
                lua.check(key, &rules, 0).await.unwrap().outcomes(&rules).map(|r| r.remaining()).collect();
            assert_eq!(left, [LIMIT - admitted; 5], "{key}: {admitted} admitted");
            lua.refund(key, &rules, admitted).await.unwrap();
            let left: Vec<u64> =
                lua.check(key, &rules, 0).await.unwrap().outcomes(&rules).map(|r| r.remaining()).collect();
            assert_eq!(left, [LIMIT; 5], "{key}: {admitted} admitted, and refunded");
        }
        println!(
            "{rounds} rounds, {} keys ({full} at the limit), {admitted_in_all} admitted of {} checks; \
             {on_lua} checks while the module was away, auto back on it {back_in:?} after it was loaded",
            keys.len(),
            answered.load(Ordering::Relaxed),
        );
        // Every round but the last few (tasks keep their own pace) gave each of its keys more
        // checks than the limit.
        assert!(full >= 100 && full >= keys.len() / 2, "{full} of {} keys at the limit", keys.len());
    }
}
