//! Tollgate's engine at work, in memory, with no server: a burst of requests from two callers
//! against a rule set of three algorithms, decided all-or-nothing.
//!
//! `cargo run --release -p tollgate-core --example quickstart`

use std::time::Duration;

use tollgate_core::{Backend, MemoryBackend, Period, Rule, RuleSet};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rules = RuleSet::new([
        Rule::gcra(5, Period::SECOND, 3).named("rate"),
        Rule::fixed_window(8, Period::MINUTE).named("per-minute"),
        Rule::sliding_window_log(20, Period::HOUR).named("per-hour"),
    ])?;
    let backend = MemoryBackend::new();

    println!("rules: 5/s with bursts of 3 (gcra), 8/min (fixed window), 20/h (sliding log)\n");
    println!(
        "{:>6}  {:<6} {:<8} {:>5} {:>9} {:>10} {:>10}  binding",
        "t", "caller", "answer", "limit", "remaining", "reset", "retry"
    );
    let start = tokio::time::Instant::now();
    for _ in 0..12 {
        for caller in ["alice", "bob"] {
            // bob sends twice as much as alice.
            let cost = if caller == "bob" { 2 } else { 1 };
            let d = backend.check(caller, &rules, cost).await?;
            println!(
                "{:>4}ms  {:<6} {:<8} {:>5} {:>9} {:>8}ms {:>8}ms  {}",
                start.elapsed().as_millis(),
                caller,
                if d.allowed() { "allowed" } else { "denied" },
                d.binding(&rules).limit(),
                d.remaining(),
                d.reset_after().as_millis(),
                d.retry_after().as_millis(),
                d.binding(&rules).name().unwrap_or("-"),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
