//! `tollgate serve`: configuration, backend, limiter and HTTP server, wired and run until a
//! signal.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tollgate_config::{BackendKind, Config, RedisEngine};
use tollgate_core::{Backend, MemoryBackend};
use tollgate_http::extract::MAX_BODY_BYTES;
use tollgate_limiter::Limiter;
use tollgate_redis::{Engine, RedisBackend};
use tollgate_server::AppState;
use tracing_subscriber::EnvFilter;

use crate::ServeArgs;
use crate::threads::ConnectionThreads;

/// How often the policy database's revision is polled: a change made through any instance is
/// applied by every other within this (plus one reload).
const POLICY_POLL: Duration = Duration::from_millis(250);

/// A URL with its password hidden, for logs and errors.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Connections the kernel may hold for us before we accept them (it caps this at
/// `net.core.somaxconn`). Tokio's default, 1024, overflows under a storm of new connections,
/// and a connection dropped from a full queue waits out SYN-ACK retransmits (1 s, 2 s, 4 s...).
const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` with a [`LISTEN_BACKLOG`] queue (and `SO_REUSEADDR`, as tokio's own
/// `bind` sets it).
pub(crate) fn bind_listener(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket =
        if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How long in-flight requests (delayed ones included) may take to finish after a signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Logs to standard error: JSON lines, or text coloured only when standard error is a terminal
/// and `NO_COLOR` is not set (a log file or journal gets no escape codes). With a `tracer`,
/// spans are exported too ([`crate::otel::layer`]); each side has its own filter, so RUST_LOG
/// does not decide what is traced, nor tracing what is logged.
pub(crate) fn init_logging(json: bool, tracer: Option<opentelemetry_sdk::trace::SdkTracer>) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(colour);
    let fmt = if json { fmt.json().boxed() } else { fmt.boxed() };
    tracing_subscriber::registry().with(fmt.with_filter(filter)).with(tracer.map(crate::otel::layer)).init();
}

/// Logs each policy of the file whose state for one key could exceed `[server]
/// max_request_state` (issue 18): applied all the same, since the operator sized it.
fn warn_of_large_policies(config: &Config) {
    for (policy, bytes) in config.policies_over_budget() {
        tracing::warn!(
            policy,
            worst_case_bytes_per_key = bytes,
            max_request_state = config.server.max_request_state,
            "a policy's state for one key could take more than [server] max_request_state allows \
             inline rules; it is applied all the same, but every key it counts can grow that large"
        );
    }
}

/// The configured backend, and its name (the limiter's metrics label). With the Redis engine
/// `module`, a Redis without the Tollgate Redis module is refused here, before serving.
pub(crate) async fn backend(config: &Config) -> anyhow::Result<(Arc<dyn Backend>, &'static str)> {
    let b = &config.backend;
    let backend: Arc<dyn Backend> = match b.kind {
        BackendKind::Memory => {
            let memory = MemoryBackend::builder().max_keys(config.memory.max_keys).build()?;
            Arc::new(memory)
        }
        BackendKind::Redis => {
            let url = b.url.as_deref().context("backend.kind = \"redis\" needs backend.url")?;
            let redis = RedisBackend::builder(url)
                .prefix(b.prefix.clone())
                .timeout(b.timeout)
                .connections(b.connections)
                .coalesce(b.coalesce)
                .deny_cache(b.deny_cache)
                .engine(redis_engine(b.engine))
                .build()
                .context("cannot configure the Redis backend")?;
            if b.engine == RedisEngine::Module {
                redis.require_module().await.context("backend.engine = \"module\"")?;
            }
            Arc::new(redis)
        }
    };
    Ok((backend, b.kind.as_str()))
}

/// The configuration's engine, as the Redis backend names it.
fn redis_engine(engine: RedisEngine) -> Engine {
    match engine {
        RedisEngine::Auto => Engine::Auto,
        RedisEngine::Module => Engine::Module,
        RedisEngine::Lua => Engine::Lua,
    }
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    // rediss:// needs a TLS crypto provider; ring builds with a C compiler alone.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = load_config(&args)?;
    let endpoint = crate::otel::endpoint(&config.tracing)?;
    let (tracing, tracer) = match &endpoint {
        Some(endpoint) => {
            let (tracing, tracer) = crate::otel::Tracing::start(&config.tracing, endpoint)?;
            (Some(tracing), Some(tracer))
        }
        None => (None, None),
    };
    init_logging(args.json_logs || config.server.json_logs, tracer);
    if let Some(endpoint) = &endpoint {
        tracing::info!(endpoint = %redact(endpoint), sample_ratio = config.tracing.sample_ratio,
            service_name = %config.tracing.service_name, "tracing: spans are exported over OTLP");
    }
    warn_of_large_policies(&config);

    let listen = config.server.listen;
    let limits = crate::listen::Limits::from_config(&config.server, Some(MAX_BODY_BYTES));
    let threads = ConnectionThreads::configured(config.server.connections.threads)
        .context("cannot start the connection threads")?;
    let limiter = start_limiter(&config).await?;
    let state = open_state(&args, limiter, config).await?;
    let _watcher = args.config.as_ref().map(|path| watch_config(path, &state)).transpose()?;

    let listener = bind_listener(listen).with_context(|| format!("cannot listen on {listen}"))?;
    let policies: Vec<String> = state.config().policies.iter().map(|(n, _)| n.to_owned()).collect();
    tracing::info!(
        address = %listener.local_addr()?, backend = state.limiter().backend_name(),
        config = %args.config.as_ref().map_or("builtin".into(), |p| p.display().to_string()),
        database = %redact(&args.database.url), connection_threads = threads.len(),
        policies = ?policies, "tollgate is listening"
    );

    let envoy = start_envoy(&args, state.limiter().clone())?;
    let _envoy_watcher = args
        .envoy_config
        .as_ref()
        .map(|path| watch_envoy(path, args.envoy_merge_domains, &envoy))
        .transpose()?;
    let _envoy_xds = match &args.envoy_xds_server {
        Some(server) => Some(subscribe_envoy_xds(&args, server, &envoy).await?),
        None => None,
    };
    let traced = tracing.is_some();
    // Upstream's health: /healthcheck, and the gRPC health service following it.
    let health =
        tollgate_envoy::ops::Health::new(args.envoy_health_checks_backend, args.envoy_health_needs_config);
    let grpc_health = serve_grpc(
        &args,
        envoy.clone(),
        health.clone(),
        crate::listen::Limits { max_body: None, ..limits },
        threads.clone(),
        traced,
    )
    .await?;
    let limiter = state.limiter().clone();
    // Upstream's HTTP endpoints beside the API: /json, /healthcheck and /rlconfig.
    let envoy_http =
        tollgate_envoy::json::router(envoy.clone()).merge(tollgate_envoy::ops::router(envoy, health.clone()));
    let app = with_request_spans(tollgate_server::router_with(state, envoy_http), traced);
    // On a signal, both health checks fail at once (upstream's sigterm component).
    let terminating = async move {
        health.terminate();
        grpc_health.set(false).await;
    };
    serve_http(listener, app, limits, threads, terminating).await;
    // Reserved units not admitted go back to the backend (see tollgate_limiter::reserve).
    limiter.shutdown().await;
    if let Some(tracing) = tracing {
        tracing.shutdown().await;
    }
    Ok(())
}

/// `app` with a span for each request when tracing is on ([`crate::otel::trace_request`]);
/// `app` itself when it is off, so that an untraced request pays nothing for it.
fn with_request_spans(app: axum::Router, traced: bool) -> axum::Router {
    if traced { app.route_layer(axum::middleware::from_fn(crate::otel::trace_request)) } else { app }
}

/// The configuration file (or the built-in one) with the command line's overrides.
fn load_config(args: &ServeArgs) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::builtin(),
    };
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(url) = &args.redis {
        config.backend.use_redis(url.clone())?;
    }
    if let Some(engine) = args.redis_engine {
        config.backend.engine = engine;
    }
    Ok(config)
}

/// The limiter over the configured backend, with the metrics recorder installed first so the
/// metrics it records at startup are kept. A Redis that does not answer yet is logged, not fatal.
async fn start_limiter(config: &Config) -> anyhow::Result<Limiter> {
    tollgate_server::prometheus();
    let (backend, backend_name) = backend(config).await?;
    let limiter = Limiter::new(backend, backend_name, config.limiter_settings());
    if config.backend.kind == BackendKind::Redis
        && let Err(e) = limiter.ping().await
    {
        tracing::warn!(error = %e, on_failure = limiter.failure_policy().as_str(),
            "Redis does not answer yet; decisions follow the failure policy until it does");
    }
    Ok(limiter)
}

/// The server's state over the policy database, whose changes are then polled for.
async fn open_state(args: &ServeArgs, limiter: Limiter, config: Config) -> anyhow::Result<AppState> {
    let store = tollgate_store::Store::connect(&args.database.url)
        .await
        .with_context(|| format!("cannot open the policy database {}", redact(&args.database.url)))?;
    let state =
        AppState::new(limiter, config).with_store(store).await.context("cannot load stored policies")?;
    // Detached: it polls for the life of the process.
    let _sync = state.spawn_policy_sync(POLICY_POLL);
    Ok(state)
}

/// Reloads the configuration file into `state` when it changes; what only a restart applies is
/// logged.
fn watch_config(path: &std::path::Path, state: &AppState) -> anyhow::Result<tollgate_config::Watcher> {
    let (state, startup) = (state.clone(), state.config());
    reloaded("file", None);
    tollgate_config::watch(path, move |result| match result {
        Ok(new) => {
            if new.server.listen != startup.server.listen
                || new.server.connections != startup.server.connections
                || new.backend.kind != startup.backend.kind
                || new.backend.url != startup.backend.url
                || new.memory != startup.memory
                || new.tracing != startup.tracing
            {
                tracing::warn!(
                    "server.listen, the connection bounds and threads, [backend], [memory] and \
                     [tracing] changes take effect at the next restart"
                );
            }
            let names: Vec<&str> = new.policies.iter().map(|(n, _)| n).collect();
            tracing::info!(policies = ?names, "configuration reloaded");
            warn_of_large_policies(&new);
            state.replace_config(new);
            reloaded("file", Some(true));
        }
        Err(e) => {
            reloaded("file", Some(false));
            tracing::error!(error = %e, "configuration reload refused; the last good configuration stays")
        }
    })
    .context("cannot watch the configuration file")
}

/// Records a reload of `config` (`file` or `envoy`): applied, refused, or (None, when the
/// watch starts) neither, which exports the series at zero so that alerts see the first refusal.
fn reloaded(config: &'static str, applied: Option<bool>) {
    use tollgate_limiter::metrics::{CONFIG_LAST_RELOAD_SUCCESSFUL, CONFIG_RELOADS};
    for result in ["applied", "refused"] {
        let counted = u64::from(applied == Some(result == "applied"));
        metrics::counter!(CONFIG_RELOADS, "config" => config, "result" => result).increment(counted);
    }
    metrics::gauge!(CONFIG_LAST_RELOAD_SUCCESSFUL, "config" => config).set(if applied == Some(false) {
        0.0
    } else {
        1.0
    });
}

/// The Envoy rate-limit service over `limiter`, with the domains of `--envoy-config` (none
/// without it, until xDS sends some).
fn start_envoy(args: &ServeArgs, limiter: Limiter) -> anyhow::Result<tollgate_envoy::EnvoyService> {
    let names = [&args.envoy_limit_header, &args.envoy_remaining_header, &args.envoy_reset_header];
    if names.iter().enumerate().any(|(i, a)| names[i + 1..].iter().any(|b| a.eq_ignore_ascii_case(b))) {
        anyhow::bail!(
            "--envoy-limit-header, --envoy-remaining-header and --envoy-reset-header must name three \
             different headers (they are {}, {} and {})",
            names[0],
            names[1],
            names[2]
        );
    }
    let domains = match &args.envoy_config {
        Some(path) => {
            let config = tollgate_envoy::load(path, args.envoy_merge_domains)?;
            for warning in &config.warnings {
                tracing::warn!("Envoy configuration: {warning}");
            }
            config.domains
        }
        None => Vec::new(),
    };
    Ok(tollgate_envoy::EnvoyService::new(limiter, domains)
        .with_response_headers(args.envoy_response_headers)
        .with_header_names(tollgate_envoy::HeaderNames {
            limit: args.envoy_limit_header.clone(),
            remaining: args.envoy_remaining_header.clone(),
            reset: args.envoy_reset_header.clone(),
        })
        .with_near_limit_ratio(args.envoy_near_limit_ratio)
        .with_stats_max_key_paths(args.envoy_stats_max_key_paths)
        .with_global_shadow_mode(args.envoy_shadow_mode)
        .with_global_quota_mode(args.envoy_quota_mode)
        .with_dynamic_metadata(args.envoy_response_dynamic_metadata)
        .with_charging(match (args.envoy_all_or_nothing, args.envoy_stop_increment_when_over_limit) {
            (true, _) => tollgate_envoy::Charging::AllOrNothing,
            (_, true) => tollgate_envoy::Charging::StopWhenOverLimit,
            _ => tollgate_envoy::Charging::Each,
        })
        .with_reserve(args.envoy_reserve))
}

/// Reloads the Envoy domains of `path` into `service` when they change.
fn watch_envoy(
    path: &std::path::Path,
    merge: bool,
    service: &tollgate_envoy::EnvoyService,
) -> anyhow::Result<tollgate_config::Watcher> {
    let (path, service) = (path.to_owned(), service.clone());
    reloaded("envoy", None);
    // Every write in the directory wakes the watcher (a database or a log beside the file, say):
    // the configuration is parsed again only when what it reads changed (its files' text, or
    // the error reading them, which is then not logged again at each write beside it).
    let mut last = tollgate_envoy::read(&path).map_err(|e| e.to_string());
    tollgate_config::watch_path(&path.clone(), move || {
        let now = tollgate_envoy::read(&path).map_err(|e| e.to_string());
        if now == last {
            return;
        }
        let parsed = match &now {
            Ok(files) => tollgate_envoy::parse(files, merge).map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        };
        last = now;
        match parsed {
            Ok(config) => {
                let names: Vec<&str> = config.domains.iter().map(|d| d.name.as_str()).collect();
                tracing::info!(domains = ?names, "Envoy configuration reloaded");
                for warning in &config.warnings {
                    tracing::warn!("Envoy configuration: {warning}");
                }
                service.replace_domains(config.domains);
                reloaded("envoy", Some(true));
            }
            Err(e) => {
                reloaded("envoy", Some(false));
                tracing::error!(error = %e, "Envoy configuration reload refused; the last good one stays")
            }
        }
    })
    .context("cannot watch the Envoy configuration")
}

/// Subscribes `service` to the xDS management server `server` and, unless
/// `--envoy-xds-force-start`, waits for its first answer (applied or refused), as upstream waits
/// for its first configuration before serving.
async fn subscribe_envoy_xds(
    args: &ServeArgs,
    server: &str,
    service: &tollgate_envoy::EnvoyService,
) -> anyhow::Result<tollgate_envoy::xds::XdsClient> {
    if args.envoy_xds_backoff_initial.is_zero() || args.envoy_xds_backoff_max < args.envoy_xds_backoff_initial
    {
        anyhow::bail!("--envoy-xds-backoff-initial must be above 0 and at most --envoy-xds-backoff-max");
    }
    if args.envoy_xds_max_message_bytes == 0 {
        anyhow::bail!("--envoy-xds-max-message-bytes must be above 0");
    }
    let mut node_metadata = Vec::new();
    for pair in args.envoy_xds_node_metadata.iter().flat_map(|m| m.split(',')).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            anyhow::bail!("--envoy-xds-node-metadata: {pair:?} is not key=value");
        };
        node_metadata.push((k.to_owned(), v.to_owned()));
    }
    let mut headers = Vec::new();
    for pair in args.envoy_xds_headers.iter().flat_map(|m| m.split(',')).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once(':') else {
            anyhow::bail!("--envoy-xds-headers: {pair:?} is not name:value");
        };
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let read = |path: &Option<std::path::PathBuf>, flag: &str| -> anyhow::Result<Option<Vec<u8>>> {
        path.as_ref()
            .map(|p| std::fs::read(p).with_context(|| format!("{flag}: cannot read {}", p.display())))
            .transpose()
    };
    let ca = read(&args.envoy_xds_tls_ca, "--envoy-xds-tls-ca")?;
    let cert = read(&args.envoy_xds_tls_cert, "--envoy-xds-tls-cert")?;
    let key = read(&args.envoy_xds_tls_key, "--envoy-xds-tls-key")?;
    let use_tls = args.envoy_xds_tls
        || server.starts_with("https://")
        || ca.is_some()
        || cert.is_some()
        || args.envoy_xds_tls_san.is_some();
    let tls = use_tls.then(|| {
        let identity = cert.as_deref().zip(key.as_deref());
        tollgate_envoy::xds::tls(ca.as_deref(), identity, args.envoy_xds_tls_san.as_deref())
    });
    let settings = tollgate_envoy::xds::XdsSettings {
        server: server.to_owned(),
        node_id: args.envoy_xds_node_id.clone(),
        node_metadata,
        headers,
        tls,
        max_message_bytes: args.envoy_xds_max_message_bytes,
        backoff_initial: args.envoy_xds_backoff_initial,
        backoff_max: args.envoy_xds_backoff_max,
        merge_domains: args.envoy_merge_domains,
    };
    reloaded("envoy", None);
    let mut client = tollgate_envoy::xds::subscribe(settings, service.clone(), |outcome| {
        reloaded("envoy", Some(matches!(outcome, tollgate_envoy::xds::Outcome::Applied { .. })));
    })
    .map_err(|e| anyhow::anyhow!("--envoy-xds-server or --envoy-xds-headers: {e}"))?;
    tracing::info!(server, node_id = %args.envoy_xds_node_id, tls = use_tls,
        "Envoy configuration: subscribing over xDS");
    if !args.envoy_xds_force_start {
        tracing::info!("waiting for the first Envoy configuration from the xDS server");
        client.first_response().await;
    }
    Ok(client)
}

/// The names the standard gRPC health service answers for: the server as a whole, the
/// rate-limit service, and upstream's name for it.
const GRPC_HEALTH_NAMES: [&str; 3] = ["", "envoy.service.ratelimit.v3.RateLimitService", "ratelimit"];

/// How often the gRPC health service asks what `/healthcheck` would answer.
const GRPC_HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// The standard gRPC health service's statuses.
#[derive(Clone)]
struct GrpcHealth(tonic_health::server::HealthReporter);

impl GrpcHealth {
    /// SERVING or NOT_SERVING, for every name of [`GRPC_HEALTH_NAMES`].
    async fn set(&self, serving: bool) {
        use tonic_health::ServingStatus;
        let status = if serving { ServingStatus::Serving } else { ServingStatus::NotServing };
        for name in GRPC_HEALTH_NAMES {
            self.0.set_service_status(name, status).await;
        }
    }
}

/// Serves the Envoy rate-limit service and the standard gRPC health service on
/// `--grpc-listen`, in the background; the health service answers what `/healthcheck` does
/// (`health`), asked every [`GRPC_HEALTH_INTERVAL`].
async fn serve_grpc(
    args: &ServeArgs,
    envoy: tollgate_envoy::EnvoyService,
    health: tollgate_envoy::ops::Health,
    limits: crate::listen::Limits,
    threads: ConnectionThreads,
    traced: bool,
) -> anyhow::Result<GrpcHealth> {
    let tls = match (&args.grpc_tls_cert, &args.grpc_tls_key) {
        (Some(cert), Some(key)) => Some(crate::tls::acceptor(
            cert,
            key,
            args.grpc_tls_client_ca.as_deref(),
            args.grpc_tls_client_san.as_deref(),
        )?),
        _ => None,
    };
    let grpc_listener = bind_listener(args.grpc_listen)
        .with_context(|| format!("cannot listen on {} (gRPC)", args.grpc_listen))?;
    tracing::info!(
        address = %grpc_listener.local_addr()?,
        tls = tls.is_some(),
        client_certificates = args.grpc_tls_client_ca.is_some(),
        "Envoy rate-limit service (gRPC) is listening"
    );
    // The standard gRPC health service: NOT_SERVING until /healthcheck's answer is known.
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let reporter = GrpcHealth(reporter);
    reporter.set(false).await;
    let watched = envoy.clone();
    let following = reporter.clone();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let healthy = health.check(&watched).await.is_ok();
            if last != Some(healthy) {
                following.set(healthy).await;
                last = Some(healthy);
            }
            tokio::time::sleep(GRPC_HEALTH_INTERVAL).await;
        }
    });
    // Served by the same connection loop as the HTTP API, so a stranger on the gRPC port meets
    // the same header, body and idle timeouts and the same connection cap (issue 18). No body
    // cap by Content-Length (gRPC sends none); tonic refuses messages over 4 MiB itself.
    let rls = tollgate_envoy::EnvoyServer::new(envoy);
    let grpc = tonic::service::Routes::new(health_service).add_service(rls.clone()).into_axum_router();
    let grpc = crate::listen::App::with_rls(with_request_spans(grpc, traced), (!traced).then_some(rls));
    tokio::spawn(crate::listen::serve(grpc_listener, grpc, limits, tls, threads, std::future::pending()));
    Ok(reporter)
}

/// Serves `app` on `listener` until a signal, then lets requests in flight finish for up to
/// [`SHUTDOWN_GRACE`].
async fn serve_http(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: crate::listen::Limits,
    threads: ConnectionThreads,
    on_signal: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let server = crate::listen::serve(listener, app, limits, None, threads, async move {
        shutdown_signal().await;
        on_signal.await;
        tracing::info!("shutting down: no new connections; finishing requests in flight");
        let _ = signalled_tx.send(());
    });
    tokio::select! {
        () = server => {}
        () = async {
            let _ = signalled_rx.await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => tracing::warn!("requests still in flight after {SHUTDOWN_GRACE:?}; stopping anyway"),
    }
}
