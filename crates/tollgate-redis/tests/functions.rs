//! The engine as a Redis Functions library (issue 16): loaded by the backend wherever it is
//! missing (after `FUNCTION FLUSH`, on a Redis restarted from a snapshot without it), named
//! after its code so that two Tollgate versions share a Redis, and replaced by scripts
//! (`EVALSHA`) on a server without Functions.

use redis::Value;
use tollgate_core::script;
use tollgate_core::{Backend, Part, Period, Rule, RuleSet};
use tollgate_redis::RedisBackend;
use tollgate_testkit::RedisServer;

/// The library's name as the backend derives it: `tollgate_` and 12 hex digits of its code's
/// SHA1.
fn our_library() -> String {
    let hash = redis::Script::new(script::library_code()).get_hash().to_owned();
    format!("tollgate_{}", &hash[..12])
}

/// The names of the libraries loaded on `server`.
fn libraries(server: &RedisServer) -> Vec<String> {
    let list: Vec<Value> = server.command(&["FUNCTION", "LIST"]);
    let mut names: Vec<String> = list
        .iter()
        .filter_map(|library| {
            let fields: Vec<(String, Value)> = redis::from_redis_value(library.clone()).ok()?;
            let (_, name) = fields.into_iter().find(|(field, _)| field == "library_name")?;
            redis::from_redis_value(name).ok()
        })
        .collect();
    names.sort();
    names
}

fn ten_per_hour() -> RuleSet {
    RuleSet::new([Rule::fixed_window(10, Period::HOUR)]).unwrap()
}

/// One backend per test, no coalescing or deny cache: every check is one call of Redis.
fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder(server.url()).connections(1).coalesce(1).deny_cache(false).build().unwrap()
}

#[tokio::test]
async fn checks_call_the_library_and_it_is_loaded_again_after_a_function_flush() {
    let server = RedisServer::start();
    let backend = backend(&server);
    let (rules, gcra) = (ten_per_hour(), RuleSet::new([Rule::gcra(5, Period::MINUTE, 5)]).unwrap());
    for _ in 0..3 {
        assert!(backend.check("k", &rules, 1).await.unwrap().allowed());
    }
    assert_eq!(backend.check("g", &gcra, 2).await.unwrap().remaining(), 3);
    assert_eq!(libraries(&server), [our_library()], "loaded on first use");
    assert_eq!(server.calls("fcall"), 5, "the first call found no library and was sent again");
    assert_eq!(server.calls("evalsha") + server.calls("eval"), 0, "no script");

    let _: String = server.command(&["FUNCTION", "FLUSH"]);
    assert!(libraries(&server).is_empty());
    // The next checks load it again, and find every count where it was.
    assert_eq!(backend.check("k", &rules, 1).await.unwrap().remaining(), 6);
    assert_eq!(backend.check("g", &gcra, 1).await.unwrap().remaining(), 2);
    assert_eq!(libraries(&server), [our_library()]);
    assert_eq!(server.calls("function|load"), 2, "once at first use, once after the flush");
}

#[tokio::test]
async fn a_redis_restarted_without_the_library_gets_it_again_with_its_counts_intact() {
    let mut server = RedisServer::start();
    let backend = backend(&server);
    let rules = ten_per_hour();
    for _ in 0..4 {
        assert!(backend.check("k", &rules, 1).await.unwrap().allowed());
    }
    // A snapshot with the counts but without this version's library (as one taken before an
    // upgrade of Tollgate), restored by a restart.
    let _: String = server.command(&["FUNCTION", "DELETE", &our_library()]);
    let _: String = server.command(&["SAVE"]);
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    assert!(libraries(&server).is_empty(), "the snapshot had no library");
    assert_eq!(server.keys().len(), 1, "the snapshot's counts are back");
    // Decisions go on, on the restored counts; the first call after the restart may meet the
    // closed connection (the backend reconnects), so it is tried until Redis answers.
    let mut decision = backend.check("k", &rules, 1).await;
    for _ in 0..10 {
        if decision.is_ok() {
            break;
        }
        decision = backend.check("k", &rules, 1).await;
    }
    assert_eq!(decision.unwrap().remaining(), 5, "four before the restart, one after");
    assert_eq!(libraries(&server), [our_library()]);

    // A restart that lost everything: decisions start over, and the library is back again.
    let mut server = server;
    let server = tokio::task::spawn_blocking(move || {
        std::fs::remove_file(server.dir().join("dump.rdb")).unwrap();
        server.restart();
        server
    })
    .await
    .unwrap();
    let mut decision = backend.check("k", &rules, 1).await;
    for _ in 0..10 {
        if decision.is_ok() {
            break;
        }
        decision = backend.check("k", &rules, 1).await;
    }
    assert_eq!(decision.unwrap().remaining(), 9);
    assert_eq!(libraries(&server), [our_library()]);
}

#[tokio::test]
async fn two_versions_libraries_share_one_redis_and_its_counts() {
    let server = RedisServer::start();
    // Another Tollgate version's library: another name (here the same code, which lets the
    // test call it: another version's code reads and writes the same keys the same way).
    let other = "tollgate_0ther0version0";
    let loaded: String = server.command(&["FUNCTION", "LOAD", &script::library(other)]);
    assert_eq!(loaded, other);
    let backend = backend(&server);
    let rules = ten_per_hour();
    assert_eq!(backend.check("k", &rules, 3).await.unwrap().remaining(), 7);
    let mut both = vec![our_library(), other.to_owned()];
    both.sort();
    assert_eq!(libraries(&server), both, "ours loaded beside the other, which stays");

    // The other version's function decides on the same state: a lone check of cost 2 of the
    // same rule (the arguments as the backend sends them: see tollgate_core::script).
    let key = backend.state_keys("k", &rules).remove(0);
    let parts = [Part::new("k", &rules, 2)];
    let mut args = vec!["FCALL".to_owned(), other.to_owned(), "1".to_owned(), key];
    args.extend(script::arguments(&parts, None).iter().map(|arg| match arg {
        script::Arg::Int(n) => n.to_string(),
        script::Arg::Text(t) => (*t).to_owned(),
    }));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let reply: Vec<i64> = server.command(&args);
    assert_eq!(reply[1..3], [1, 5], "admitted, 5 left after ours took 3");
    assert_eq!(backend.check("k", &rules, 0).await.unwrap().remaining(), 5, "ours sees the other's");
}

/// A server without Redis Functions answers `FCALL` (or `FUNCTION LOAD`) with "unknown
/// command", as Redis 6 does; renaming the command away makes one of this Redis 7.
async fn falls_back_to_scripts_without(command: &str) {
    let server = RedisServer::start_with(&["--rename-command", command, ""]);
    let backend = backend(&server);
    let rules = ten_per_hour();
    for remaining in (6..=9).rev() {
        assert_eq!(backend.check("k", &rules, 1).await.unwrap().remaining(), remaining);
    }
    let batch = [Part::new("b", &rules, 2)];
    assert_eq!(backend.check_batch(&batch).await.unwrap()[0].remaining(), 8);
    backend.reset("k", &rules).await.unwrap();
    assert_eq!(backend.check("k", &rules, 0).await.unwrap().remaining(), 10);
    // One call found no Functions; every later one went straight to a script: 7 calls (the
    // reset is always a script), of which the first of each script met NOSCRIPT and was sent
    // again as EVAL.
    let scripts = server.calls("evalsha") + server.calls("eval");
    assert_eq!(scripts, 7 + 2, "every decision by script");
    assert!(server.calls("fcall") <= 1);
    if command != "FUNCTION" {
        assert!(libraries(&server).is_empty());
    }
}

#[tokio::test]
async fn without_fcall_decisions_are_made_by_scripts() {
    falls_back_to_scripts_without("FCALL").await;
}

#[tokio::test]
async fn without_function_load_decisions_are_made_by_scripts() {
    falls_back_to_scripts_without("FUNCTION").await;
}
