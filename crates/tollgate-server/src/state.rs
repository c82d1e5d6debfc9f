//! What the handlers share: the limiter, and the configuration that reloads swap in.

use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tollgate_config::Config;
use tollgate_limiter::Limiter;

/// Shared state of the HTTP API. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub(crate) limiter: Limiter,
    pub(crate) config: Arc<ArcSwap<Config>>,
    pub(crate) metrics: Option<PrometheusHandle>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("limiter", &self.limiter).finish_non_exhaustive()
    }
}

/// Installs the process-wide Prometheus recorder once; later calls get the same handle (or None
/// if another recorder was installed first). Call it before building the limiter so the
/// metrics it records at startup are kept.
pub fn prometheus() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets =
                [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
            PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(tollgate_limiter::metrics::BACKEND_SECONDS.into()),
                    &buckets,
                )
                .ok()?
                .install_recorder()
                .ok()
        })
        .clone()
}

impl AppState {
    /// State over `limiter` with the configuration `config` (whose policies and header settings
    /// [`replace_config`](Self::replace_config) can later swap).
    pub fn new(limiter: Limiter, config: Config) -> Self {
        AppState { limiter, config: Arc::new(ArcSwap::from_pointee(config)), metrics: prometheus() }
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Swaps in a reloaded configuration. Policies and `reset_header` take effect at once;
    /// `listen` and the backend keep their startup values (the caller warns about those).
    pub fn replace_config(&self, config: Config) {
        self.config.store(Arc::new(config));
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}
