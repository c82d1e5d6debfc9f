//! What the handlers share: the limiter, and the configuration that reloads swap in.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tollgate_config::Config;
use tollgate_limiter::{Limiter, Policy};
use tollgate_store::{ConsumerLimit, Store};

use crate::recorder::{self, Metrics};

/// The enabled policies of the database, by name, as last loaded.
pub(crate) type StoredPolicies = BTreeMap<String, Arc<Policy>>;

/// The consumer limit records of the database, by consumer, as last loaded.
pub(crate) type StoredConsumers = HashMap<String, Vec<ConsumerLimit>>;

/// Shared state of the HTTP API. Cheap to clone: one reference count.
///
/// One `Arc` around the parts rather than an `Arc` each: axum clones the state for the matched
/// route and for each extractor of every request, and each clone and drop of a reference count
/// is a write to a cache line the server's other threads write too. With a count per part, a
/// check made some 64 such writes; one count took a check's server CPU on two cores from 9.1 to
/// 8.0 µs of user time (docs/benchmarks.md, "workers that share cache lines").
#[derive(Clone)]
pub struct AppState(Arc<Parts>);

/// What [`AppState`] holds (its fields are the server's own).
#[derive(Clone)]
pub struct Parts {
    pub(crate) limiter: Limiter,
    pub(crate) config: Arc<ArcSwap<Config>>,
    pub(crate) metrics: Option<Metrics>,
    pub(crate) store: Option<Store>,
    pub(crate) stored: Arc<ArcSwap<StoredPolicies>>,
    pub(crate) consumers: Arc<ArcSwap<StoredConsumers>>,
    /// Decisions per second and keys near their limits, for the console (bounded).
    pub(crate) live: Arc<crate::live::Live>,
    /// Named policies' unchanging rate-limit header values.
    pub(crate) kept_headers: Arc<crate::decision::KeptHeaders>,
}

impl std::ops::Deref for AppState {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.0
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("limiter", &self.limiter).finish_non_exhaustive()
    }
}

/// Installs the process-wide Prometheus recorder once, behind the per-thread layer of
/// [`Metrics`], and starts its upkeep; later calls get the same handle (or None if another
/// recorder was installed first). Call it before building the limiter so the metrics it
/// records at startup are kept.
pub fn prometheus() -> Option<Metrics> {
    static HANDLE: OnceLock<Option<Metrics>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets =
                [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(tollgate_limiter::metrics::BACKEND_SECONDS.into()),
                    &buckets,
                )
                .ok()?
                .build_recorder();
            let handle = recorder.handle();
            let (recorder, metrics) = recorder::per_thread(recorder, handle);
            metrics::set_global_recorder(recorder).ok()?;
            metrics.start_upkeep();
            Some(metrics)
        })
        .clone()
}

impl AppState {
    /// State over `limiter` with the configuration `config` (whose policies and header settings
    /// [`replace_config`](Self::replace_config) can later swap).
    pub fn new(limiter: Limiter, config: Config) -> Self {
        // The file's [decision_log] is the one in force, here and at every reload.
        limiter.set_decision_log(config.limiter_settings().decision_log);
        AppState(Arc::new(Parts {
            limiter,
            config: Arc::new(ArcSwap::from_pointee(config)),
            metrics: prometheus(),
            store: None,
            stored: Arc::default(),
            consumers: Arc::default(),
            live: Arc::default(),
            kept_headers: Arc::default(),
        }))
    }

    /// This state with a policy database: its enabled policies are served beside the file's,
    /// and the management API (`/v1/admin/...`) works on it. Loads the policies now.
    pub async fn with_store(self, store: Store) -> Result<Self, tollgate_store::StoreError> {
        let mut parts = Arc::unwrap_or_clone(self.0);
        parts.store = Some(store);
        let state = AppState(Arc::new(parts));
        state.reload_stored().await?;
        Ok(state)
    }

    /// The policy database, if any.
    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    /// The policy called `name`: from the configuration file first, else from the database.
    pub(crate) fn policy(&self, name: &str) -> Option<Arc<Policy>> {
        self.config.load().policies.get(name).cloned().or_else(|| self.stored.load().get(name).cloned())
    }

    /// Reloads the database's enabled policies and consumer limits. A stored policy that no longer validates (say,
    /// after a downgrade) is skipped and logged rather than failing the others.
    pub async fn reload_stored(&self) -> Result<(), tollgate_store::StoreError> {
        let Some(store) = &self.store else { return Ok(()) };
        let mut policies = StoredPolicies::new();
        for record in store.all_policies().await?.into_iter().filter(|r| r.spec.enabled) {
            match record.policy() {
                Ok(policy) => {
                    policies.insert(record.name.clone(), Arc::new(policy));
                }
                Err(e) => {
                    tracing::error!(policy = %record.name, error = %e, "stored policy is invalid; skipped")
                }
            }
        }
        let mut consumers = StoredConsumers::new();
        for record in store.all_consumer_limits().await? {
            consumers.entry(record.consumer_id.clone()).or_default().push(record);
        }
        self.stored.store(Arc::new(policies));
        self.consumers.store(Arc::new(consumers));
        Ok(())
    }

    /// Polls the database's revision every `interval` and reloads its policies when it moved:
    /// how every instance sees a change made through any other.
    pub fn spawn_policy_sync(&self, interval: Duration) -> Option<tokio::task::JoinHandle<()>> {
        let store = self.store.clone()?;
        let state = self.clone();
        Some(tokio::spawn(async move {
            let mut seen = store.revision().await.ok();
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                match store.revision().await {
                    Ok(revision) if Some(revision) != seen => match state.reload_stored().await {
                        Ok(()) => {
                            tracing::info!(revision, "stored policies reloaded");
                            seen = Some(revision);
                        }
                        Err(e) => tracing::warn!(error = %e, "cannot reload stored policies; will retry"),
                    },
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the policy database's revision; will retry")
                    }
                }
            }
        }))
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Swaps in a reloaded configuration. Policies, `reset_header`, `headers` and the decision
    /// log take effect at once; `listen` and the backend keep their startup values (the caller
    /// warns about those).
    pub fn replace_config(&self, config: Config) {
        self.limiter.set_decision_log(config.limiter_settings().decision_log);
        self.config.store(Arc::new(config));
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}
