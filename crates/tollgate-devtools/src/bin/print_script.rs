//! Prints the Lua script the Redis backend runs for rule sets of the named algorithms (all of
//! them when none is named), and its SHA1 on stderr, for inspection or for loading into
//! `redis-benchmark` (see scripts/bench-redis-cpu).
//!
//! `cargo run -q -p tollgate-devtools --bin print_script -- fixed_window gcra > tollgate.lua`
//!
//! With `--library`, prints instead the Redis Functions library the backend loads on Redis 7.0+
//! (every algorithm; `FUNCTION LOAD` it), and its function's name on stderr.

use tollgate_core::script::Variant;
use tollgate_core::{Period, Rule, RuleSet};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let names: Vec<String> = std::env::args().skip(1).collect();
    if names.iter().any(|n| n == "--library") {
        // As tollgate-redis names it: after the SHA1 of its code.
        let hash = redis::Script::new(tollgate_core::script::library_code()).get_hash().to_owned();
        let name = format!("tollgate_{}", &hash[..12]);
        print!("{}", tollgate_core::script::library(&name));
        eprintln!("function {name}");
        return Ok(());
    }
    let variant = if names.is_empty() {
        Variant::ALL
    } else {
        let s = Period::SECOND;
        let rules = names
            .iter()
            .map(|name| match name.as_str() {
                "fixed_window" => Ok(Rule::fixed_window(1, s)),
                "sliding_window_log" => Ok(Rule::sliding_window_log(1, s)),
                "sliding_window_counter" => Ok(Rule::sliding_window_counter(1, s)),
                "token_bucket" | "gcra" => Ok(Rule::gcra(1, s, 1)),
                "concurrency" => Ok(Rule::concurrency(1, s)),
                other => Err(format!("unknown algorithm {other:?}")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Variant::of(&RuleSet::new(rules)?)
    };
    let source = variant.source();
    print!("{source}");
    eprintln!("sha1 {}", redis::Script::new(source).get_hash());
    Ok(())
}
