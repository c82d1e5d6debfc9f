//! The process's metrics recorder: Prometheus's, behind a layer that keeps each thread's
//! counts apart until a scrape reads them.
//!
//! Every decision writes metrics that every worker thread shares: its policy's decision
//! counter, the backend's latency histogram, and on the Envoy path a descriptor's hit counters.
//! A counter in Prometheus's recorder is one atomic (and a generation beside it), so two cores
//! counting decisions move its cache line between them on every write. Here each thread counts
//! in a block of slots of its own, one slot a counter, and keeps its histogram samples in a
//! buffer of its own; a scrape ([`Metrics::render`]) first sums the slots into the Prometheus
//! counters and hands the buffered samples over; the upkeep hands the samples over every
//! [`UPKEEP_EVERY`] (counters need no upkeep: only a scrape reads them). A buffer that fills ([`SAMPLES_PER_THREAD`]) is handed over by its
//! thread. Gauges are set rarely and go straight through.
//!
//! A thread's slots are its own allocations, not entries beside other threads' in one array
//! (as `thread_local`'s [`ThreadLocal`] keeps its values): two threads' slots on one cache line
//! would bounce it as a shared counter does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::PrometheusHandle;
use thread_local::ThreadLocal;

/// Samples a thread keeps of one histogram (512 KiB) before it hands them to Prometheus's
/// itself; the upkeep takes them sooner at any rate below 65,536 a second a thread.
pub const SAMPLES_PER_THREAD: usize = 65_536;

/// How often the buffered samples are handed over and Prometheus's recorder folds recorded
/// samples into its histograms, between scrapes (its upkeep, which the recorder leaves to its
/// installer: without it, samples of a server nobody scrapes pile up without bound).
pub const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// The upkeep thread's name.
const UPKEEP_THREAD: &str = "metrics-upkeep";

/// Counters a chunk of a thread's slots holds (8 KiB).
const CHUNK: usize = 1024;

/// Chunks a thread's block can hold: counters past `CHUNK * CHUNKS` (262,144) count in
/// Prometheus's own counters, shared.
const CHUNKS: usize = 256;

/// The installed recorder's handle: renders the scrape, the per-thread counts summed first.
#[derive(Clone)]
pub struct Metrics {
    prometheus: PrometheusHandle,
    shards: Arc<Shards>,
}

impl Metrics {
    /// The Prometheus text exposition of every metric, as of now.
    pub fn render(&self) -> String {
        self.shards.sum_counters();
        self.shards.hand_over_samples();
        self.prometheus.render()
    }

    /// Hands the buffered samples over and folds them into Prometheus's histograms, as the
    /// upkeep thread does every [`UPKEEP_EVERY`].
    pub fn upkeep(&self) {
        self.shards.hand_over_samples();
        self.prometheus.run_upkeep();
    }

    /// Starts a thread that folds recorded samples into Prometheus's histograms every
    /// [`UPKEEP_EVERY`], for the life of the process.
    pub(crate) fn start_upkeep(&self) {
        let metrics = self.clone();
        let spawned = std::thread::Builder::new().name(UPKEEP_THREAD.into()).spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                metrics.upkeep();
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "no thread for the metrics' upkeep: histogram samples are kept until scraped");
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// `inner`'s counters and histograms, each kept per thread, and the handle that reads them
/// (`prometheus`, `inner`'s handle). [`prometheus`](crate::prometheus) installs this layer over
/// its recorder; an application that installs its own may use it too.
pub fn per_thread<R: Recorder>(inner: R, prometheus: PrometheusHandle) -> (PerThread<R>, Metrics) {
    let shards = Arc::new(Shards::default());
    (PerThread { inner, shards: Arc::clone(&shards) }, Metrics { prometheus, shards })
}

/// A recorder whose counters count on a slot of the calling thread's, and whose histograms keep
/// the calling thread's samples in a buffer of its own, over `inner`'s counters and histograms.
pub struct PerThread<R> {
    inner: R,
    shards: Arc<Shards>,
}

/// Every counter and histogram handed out, by key (one per key, as `inner` keeps one), and the
/// threads' slots.
#[derive(Default)]
struct Shards {
    counters: RwLock<HashMap<Key, Arc<Counts>>>,
    histograms: RwLock<HashMap<Key, Arc<Samples>>>,
    slots: Arc<Slots>,
}

impl Shards {
    /// Sums every counter's slots into its Prometheus counter.
    fn sum_counters(&self) {
        for counts in read(&self.counters).values() {
            counts.exported.absolute(counts.total());
        }
    }

    /// Hands every buffered sample to Prometheus's histograms.
    fn hand_over_samples(&self) {
        for samples in read(&self.histograms).values() {
            for buffer in samples.buffers.iter() {
                // Taken under the lock, handed over after it: the thread records on meanwhile.
                let taken = std::mem::take(&mut *buffer.0.lock().unwrap_or_else(PoisonError::into_inner));
                samples.hand_over(taken);
            }
        }
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// The `key` entry of `map`, made by `make` if new.
fn entry<T>(map: &RwLock<HashMap<Key, Arc<T>>>, key: &Key, make: impl FnOnce() -> T) -> Arc<T> {
    if let Some(found) = read(map).get(key) {
        return Arc::clone(found);
    }
    let mut map = map.write().unwrap_or_else(PoisonError::into_inner);
    Arc::clone(map.entry(key.clone()).or_insert_with(|| Arc::new(make())))
}

/// Each thread's block of counter slots, and the next slot to hand out.
#[derive(Default)]
struct Slots {
    blocks: ThreadLocal<Block>,
    next: AtomicUsize,
}

/// One thread's slots, in chunks it allocates itself as it first counts in them (and so on
/// memory of its own allocator's), which only it writes.
struct Block {
    chunks: [OnceLock<Box<[AtomicU64; CHUNK]>>; CHUNKS],
}

impl Default for Block {
    fn default() -> Self {
        Block { chunks: [const { OnceLock::new() }; CHUNKS] }
    }
}

impl Slots {
    /// A new counter's slot; None once every slot is taken.
    fn take(&self) -> Option<usize> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed);
        (slot < CHUNK * CHUNKS).then_some(slot)
    }

    fn add(&self, slot: usize, value: u64) {
        let chunk = self.blocks.get_or_default().chunks[slot / CHUNK]
            .get_or_init(|| Box::new([const { AtomicU64::new(0) }; CHUNK]));
        // Only this thread writes its slot: the line stays in its core's cache.
        chunk[slot % CHUNK].fetch_add(value, Ordering::Relaxed);
    }

    fn sum(&self, slot: usize) -> u64 {
        self.blocks
            .iter()
            .filter_map(|block| block.chunks[slot / CHUNK].get())
            .fold(0u64, |sum, chunk| sum.wrapping_add(chunk[slot % CHUNK].load(Ordering::Relaxed)))
    }
}

/// A counter counted per thread: its total is its slots' sum (and at least the largest value
/// it was set to).
struct Counts {
    slots: Arc<Slots>,
    /// None when every slot was taken: then increments go to `exported` itself.
    slot: Option<usize>,
    floor: AtomicU64,
    exported: Counter,
}

impl Counts {
    fn total(&self) -> u64 {
        let sum = self.slot.map_or(0, |slot| self.slots.sum(slot));
        sum.max(self.floor.load(Ordering::Relaxed))
    }
}

impl CounterFn for Counts {
    fn increment(&self, value: u64) {
        match self.slot {
            Some(slot) => self.slots.add(slot, value),
            None => self.exported.increment(value),
        }
    }

    fn absolute(&self, value: u64) {
        self.floor.fetch_max(value, Ordering::Relaxed);
    }
}

/// A histogram whose samples wait in the recording thread's buffer.
struct Samples {
    buffers: ThreadLocal<Padded<Mutex<Vec<f64>>>>,
    exported: Histogram,
}

/// A value on cache lines of its own: `ThreadLocal` keeps threads' values side by side, and
/// each record writes its buffer's lock.
#[derive(Default)]
#[repr(align(128))]
struct Padded<T>(T);

impl Samples {
    fn hand_over(&self, samples: Vec<f64>) {
        for value in samples {
            self.exported.record(value);
        }
    }
}

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        // Locked by this thread alone but when the samples are handed over.
        let mut buffer = self.buffers.get_or_default().0.lock().unwrap_or_else(PoisonError::into_inner);
        buffer.push(value);
        if buffer.len() >= SAMPLES_PER_THREAD {
            let full = std::mem::take(&mut *buffer);
            drop(buffer);
            self.hand_over(full);
        }
    }
}

impl<R: Recorder> Recorder for PerThread<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let slots = &self.shards.slots;
        let counts = entry(&self.shards.counters, key, || Counts {
            slots: Arc::clone(slots),
            slot: slots.take(),
            floor: AtomicU64::new(0),
            exported: self.inner.register_counter(key, metadata),
        });
        Counter::from_arc(counts)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        let samples = entry(&self.shards.histograms, key, || Samples {
            buffers: ThreadLocal::new(),
            exported: self.inner.register_histogram(key, metadata),
        });
        Histogram::from_arc(samples)
    }
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    fn layered() -> (PerThread<metrics_exporter_prometheus::PrometheusRecorder>, Metrics) {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        per_thread(recorder, handle)
    }

    /// The value of the series `line` starts with, in `text`.
    fn value(text: &str, line: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
    }

    #[test]
    fn counts_of_every_thread_are_summed_at_the_scrape() {
        let (recorder, metrics) = layered();
        let (a, b) = metrics::with_local_recorder(&recorder, || {
            (metrics::counter!("hits", "policy" => "p"), metrics::counter!("hits", "policy" => "p"))
        });
        std::thread::scope(|s| {
            for counter in [a.clone(), a, b.clone(), b] {
                s.spawn(move || (0..1000).for_each(|_| counter.increment(3)));
            }
        });
        assert_eq!(value(&metrics.render(), "hits{policy=\"p\"}"), Some(12_000.0));
        // A second scrape neither loses nor doubles them.
        metrics::with_local_recorder(&recorder, || metrics::counter!("hits", "policy" => "p").increment(1));
        assert_eq!(value(&metrics.render(), "hits{policy=\"p\"}"), Some(12_001.0));
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("hits", "policy" => "p").absolute(50_000)
        });
        assert_eq!(value(&metrics.render(), "hits{policy=\"p\"}"), Some(50_000.0));
    }

    #[test]
    fn samples_wait_in_a_bounded_buffer_and_all_reach_the_scrape() {
        let (recorder, metrics) = layered();
        let histogram = metrics::with_local_recorder(&recorder, || metrics::histogram!("seconds"));
        let per_thread = SAMPLES_PER_THREAD + 1000;
        std::thread::scope(|s| {
            for _ in 0..3 {
                let histogram = histogram.clone();
                s.spawn(move || (0..per_thread).for_each(|i| histogram.record((i % 1000) as f64 / 1000.0)));
            }
        });
        for samples in read(&metrics.shards.histograms).values() {
            for buffer in samples.buffers.iter() {
                // A full buffer was handed over by its thread; the rest waits.
                assert_eq!(buffer.0.lock().unwrap().len(), 1000);
            }
        }
        let text = metrics.render();
        assert_eq!(value(&text, "seconds_count"), Some(3.0 * per_thread as f64), "{text}");
        let sum = value(&text, "seconds_sum").expect("a sum");
        // Summed in whatever order the threads handed their samples over.
        let expected = 3.0 * (0..per_thread).map(|i| (i % 1000) as f64 / 1000.0).sum::<f64>();
        assert!((sum - expected).abs() < 1e-3, "{sum} against {expected}");
    }

    #[test]
    fn counters_past_the_last_slot_count_in_prometheus_itself() {
        let (recorder, metrics) = layered();
        metrics.shards.slots.next.store(CHUNK * CHUNKS - 1, Ordering::Relaxed);
        let (last, past) = metrics::with_local_recorder(&recorder, || {
            (metrics::counter!("last"), metrics::counter!("past"))
        });
        std::thread::scope(|s| {
            for _ in 0..2 {
                let (last, past) = (last.clone(), past.clone());
                s.spawn(move || {
                    last.increment(2);
                    past.increment(5);
                });
            }
        });
        let text = metrics.render();
        assert_eq!(value(&text, "last"), Some(4.0), "{text}");
        assert_eq!(value(&text, "past"), Some(10.0), "{text}");
    }

    #[test]
    fn gauges_go_straight_through() {
        let (recorder, metrics) = layered();
        metrics::with_local_recorder(&recorder, || metrics::gauge!("held").set(7.0));
        assert_eq!(value(&metrics.render(), "held"), Some(7.0));
    }

    #[test]
    fn the_installed_recorder_has_its_upkeep_thread() {
        crate::prometheus().expect("the first recorder of this test process");
        let names = || -> Vec<String> {
            std::fs::read_dir("/proc/self/task")
                .expect("Linux's /proc")
                .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
                .collect()
        };
        // A new thread names itself once it runs.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !names().iter().any(|n| n.trim() == UPKEEP_THREAD) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let names = names();
        assert!(names.iter().any(|n| n.trim() == UPKEEP_THREAD), "threads: {names:?}");
    }
}
