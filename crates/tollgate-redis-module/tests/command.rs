//! The command as Redis sees it: the module loads under its name and version, the command's
//! flags and key specs are declared (so Redis Cluster routes it), and a malformed `numkeys`
//! is an error reply, as `EVALSHA`'s is.

mod common;

use std::time::{Duration, Instant};

use common::{connect, server_with_module};
use redis::Value;

/// Every scalar of a reply, depth first, as text.
fn flatten(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => out.push(text.clone()),
        Value::Int(n) => out.push(n.to_string()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|v| flatten(v, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        other => out.push(format!("{other:?}")),
    }
}

fn contains_run(haystack: &[String], run: &[&str]) -> bool {
    haystack.windows(run.len()).any(|w| w.iter().zip(run).all(|(a, b)| a == b))
}

fn error_of(result: redis::RedisResult<Value>) -> String {
    match result {
        Err(e) => e.to_string(),
        Ok(v) => panic!("expected an error reply, got {v:?}"),
    }
}

#[test]
fn the_module_loads_with_the_crates_name_and_version() {
    let server = server_with_module(&[]);
    let mut conn = connect(&server);
    let modules: Value = redis::cmd("MODULE").arg("LIST").query(&mut conn).unwrap();
    let mut text = Vec::new();
    flatten(&modules, &mut text);
    let version: Vec<i64> = env!("CARGO_PKG_VERSION").split('.').map(|p| p.parse().unwrap()).collect();
    let expected = (version[0] * 10_000 + version[1] * 100 + version[2]).to_string();
    assert!(contains_run(&text, &["name", "tollgate", "ver", &expected]), "{text:?}");
}

#[test]
fn the_command_declares_its_flags_arity_and_key_specs() {
    let server = server_with_module(&[]);
    let mut conn = connect(&server);
    let info: Value = redis::cmd("COMMAND").arg("INFO").arg("TOLLGATE.DECIDE").query(&mut conn).unwrap();
    let Value::Array(commands) = &info else { panic!("COMMAND INFO: {info:?}") };
    let Some(Value::Array(entry)) = commands.first() else { panic!("no entry: {info:?}") };
    assert_eq!(entry[0], Value::BulkString(b"tollgate.decide".to_vec()));
    assert_eq!(entry[1], Value::Int(-2), "arity");
    let mut flags = Vec::new();
    flatten(&entry[2], &mut flags);
    for flag in ["write", "denyoom", "movablekeys"] {
        assert!(flags.iter().any(|f| f == flag), "flag {flag} in {flags:?}");
    }
    assert!(!flags.iter().any(|f| f == "fast"), "{flags:?}");
    let mut all = Vec::new();
    flatten(&info, &mut all);
    assert!(contains_run(&all, &["begin_search", "type", "index", "spec", "index", "1"]), "{all:?}");
    assert!(
        contains_run(
            &all,
            &["find_keys", "type", "keynum", "spec", "keynumidx", "0", "firstkey", "1", "keystep", "1"]
        ),
        "{all:?}"
    );
    assert!(contains_run(&all, &["flags", "RW", "access", "update"]), "{all:?}");

    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&["GETKEYS", "TOLLGATE.DECIDE", "2", "tg:{a}:h", "tg:{a}:swl:1", "x", "2"])
        .query(&mut conn)
        .unwrap();
    assert_eq!(keys, ["tg:{a}:h", "tg:{a}:swl:1"]);
    let none =
        error_of(redis::cmd("COMMAND").arg(&["GETKEYS", "TOLLGATE.DECIDE", "0", "x"]).query(&mut conn));
    assert!(none.contains("Invalid arguments") || none.contains("no key arguments"), "{none}");
}

#[test]
fn redis_cluster_routes_the_command_by_its_keys() {
    let server = server_with_module(&["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]);
    let mut conn = connect(&server);
    let _: () = redis::cmd("CLUSTER").arg(&["ADDSLOTSRANGE", "0", "16383"]).query(&mut conn).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut conn).unwrap();
        if info.contains("cluster_state:ok") {
            break;
        }
        assert!(Instant::now() < deadline, "the one-node cluster is not ok: {info}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Keys in two slots: Redis refuses the call before the module sees it.
    let cross =
        error_of(redis::cmd("TOLLGATE.DECIDE").arg(&["2", "tg:{a}:h", "tg:{b}:h", "x"]).query(&mut conn));
    assert!(cross.to_uppercase().contains("CROSSSLOT"), "{cross}");
    // One slot: the module answers (whatever it thinks of the arguments).
    let same =
        redis::cmd("TOLLGATE.DECIDE").arg(&["2", "tg:{a}:h", "tg:{a}:x", "x"]).query::<Value>(&mut conn);
    if let Err(e) = &same {
        let text = e.to_string().to_uppercase();
        assert!(!text.contains("CROSSSLOT") && !text.contains("MOVED"), "{e}");
    }
}

#[test]
fn a_malformed_numkeys_is_an_error_reply_as_evalshas() {
    let server = server_with_module(&[]);
    let mut conn = connect(&server);
    let cases: [(&[&str], &str); 8] = [
        (&[], "wrong number of arguments"),
        (&["x"], "not an integer"),
        (&["1.5", "a"], "not an integer"),
        (&["+1", "a"], "not an integer"),
        (&["-1", "a"], "can't be negative"),
        (&["3", "a", "b"], "greater than number of args"),
        (&["9223372036854775807", "a"], "greater than number of args"),
        (&["99999999999999999999", "a"], "not an integer"),
    ];
    for (args, expected) in cases {
        let reply = error_of(redis::cmd("TOLLGATE.DECIDE").arg(args).query(&mut conn));
        assert!(reply.contains(expected), "{args:?}: {reply}");
    }
    let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
    assert_eq!(pong, "PONG");
}
