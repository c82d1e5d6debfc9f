//! Nanoseconds per metric write when two threads write the same metrics at once, as a server's
//! two workers do with every decision: Prometheus's recorder alone, against the same recorder
//! behind Tollgate's per-thread layer (`tollgate_server::per_thread`): a counter increment (a
//! policy's decisions) and a histogram sample (the backend's latency), each on both threads.
//!
//! `cargo bench -p tollgate-server --bench recorder`; figures go to docs/benchmarks.md. The
//! figure is wall time over iterations, both threads together: the inverse of throughput.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use metrics::{Counter, Histogram, Recorder};
use metrics_exporter_prometheus::PrometheusBuilder;

/// One thread's handles: a decision counter and a latency histogram.
fn handles(recorder: &impl Recorder) -> (Counter, Histogram) {
    metrics::with_local_recorder(recorder, || {
        (
            metrics::counter!("tollgate_decisions_total", "policy" => "bench", "outcome" => "allowed"),
            metrics::histogram!("tollgate_backend_seconds", "backend" => "memory"),
        )
    })
}

/// One write of a thread's handles, the iteration's number given.
type Write = fn(&(Counter, Histogram), u64);

/// `iters` writes of one handle on each of two threads at once, by `write`.
fn two_threads(recorder: &impl Recorder, iters: u64, write: Write) {
    std::thread::scope(|s| {
        for _ in 0..2 {
            let handles = handles(recorder);
            s.spawn(move || (0..iters).for_each(|i| write(&handles, i)));
        }
    });
}

fn bench(c: &mut Criterion) {
    let cases: [(&str, Write); 2] = [
        ("counter", |(counter, _), _| counter.increment(1)),
        ("histogram", |(_, histogram), i| histogram.record(black_box(i as f64 * 1e-7))),
    ];
    for (metric, write) in cases {
        let mut group = c.benchmark_group(format!("recorder/two_threads/{metric}"));
        group.measurement_time(Duration::from_secs(3));
        group.bench_function("prometheus", |b| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            b.iter_custom(|iters| {
                let start = Instant::now();
                two_threads(&recorder, iters, write);
                handle.run_upkeep();
                start.elapsed()
            });
        });
        group.bench_function("per_thread", |b| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            let (recorder, metrics) = tollgate_server::per_thread(recorder, handle);
            b.iter_custom(|iters| {
                let start = Instant::now();
                two_threads(&recorder, iters, write);
                metrics.upkeep();
                start.elapsed()
            });
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
