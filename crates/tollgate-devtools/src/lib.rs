//! Tollgate's development tools: binaries the repository's scripts run, not part of the product
//! (this crate is not published). Each is `cargo run --release -p tollgate-devtools --bin NAME`:
//!
//! - `print_script`: the Lua script the Redis backend runs, and its SHA1
//!   (scripts/bench-redis-cpu).
//! - `rls_load`: a load client for the Envoy rate-limit service against the gRPC health check
//!   (docs/benchmarks.md).
//! - `bench_charts`: the SVG charts of bench/compare's results.
//! - `soak_chart`: scripts/soak's chart, and its verdict on memory growth.
//!
//! The user-facing load generator and simulator are `tollgate bench` and `tollgate simulate`
//! (the tollgate-bench and tollgate-simulate crates).
