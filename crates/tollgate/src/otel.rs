//! OpenTelemetry traces (`[tracing]` in the configuration): the OTLP exporter, the layer that
//! turns the libraries' `tracing` spans into OpenTelemetry spans, and the request span, whose
//! parent is the caller's W3C `traceparent`.
//!
//! Only this crate knows OpenTelemetry. The libraries make plain `tracing` spans at DEBUG
//! (`decision` in tollgate-limiter, `backend` around its backend call, `redis` in
//! tollgate-redis), which this layer exports; with tracing off no layer wants DEBUG, so their
//! callsites are disabled and cost a load of the level filter. The request span and its
//! `traceparent` are made here, in a layer over both routers (the HTTP API and the gRPC
//! service are served by the same accept loop, and gRPC metadata are HTTP/2 headers), and only
//! when tracing is on: tollgate-server and tollgate-envoy stay free of it.

use std::sync::LazyLock;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use tollgate_config::TracingSettings;
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The standard variables that name the collector when the file does not (the traces' own
/// first, as the OpenTelemetry SDKs read them).
const ENDPOINT_VARIABLES: [&str; 2] = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"];

/// Longest wait for the collector on one export: a slow collector delays only the exporting
/// thread, but shutdown waits for it.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The collector's endpoint: the file's `tracing.otlp_endpoint`, else the standard variables;
/// None when tracing is off, as it is whatever the endpoint when the standard
/// `OTEL_SDK_DISABLED` is `true`. A variable with a bad value is refused, naming it.
pub(crate) fn endpoint(settings: &TracingSettings) -> anyhow::Result<Option<String>> {
    if std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    if let Some(endpoint) = &settings.otlp_endpoint {
        return Ok(Some(endpoint.clone()));
    }
    for name in ENDPOINT_VARIABLES {
        if let Some(value) = std::env::var(name).ok().filter(|v| !v.trim().is_empty()) {
            TracingSettings::check_endpoint(&value).map_err(|e| anyhow::anyhow!("{name} = {e}"))?;
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// The exporting side of tracing: flush it with [`Tracing::shutdown`] before exiting.
pub(crate) struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// The OTLP (gRPC) exporter to `endpoint`, batched, sampled by `settings.sample_ratio`
    /// where the caller gave no decision. Call it within the Tokio runtime (the exporter's
    /// channel lives there); nothing connects until the first export.
    pub(crate) fn start(settings: &TracingSettings, endpoint: &str) -> anyhow::Result<(Tracing, SdkTracer)> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .with_context(|| format!("cannot set up the OTLP exporter to {endpoint}"))?;
        let batches = BatchConfigBuilder::default().with_scheduled_delay(settings.export_delay).build();
        let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batches).build();
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(settings.service_name.clone())
            .with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            // A caller's sampled flag is followed, so that its trace is whole or absent.
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sample_ratio))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("tollgate");
        Ok((Tracing { provider }, tracer))
    }

    /// Sends the spans still waiting and stops the exporter (at most [`EXPORT_TIMEOUT`] or so).
    pub(crate) async fn shutdown(self) {
        // The provider's shutdown blocks until the exporting thread is done, and that thread's
        // gRPC calls run on this runtime: wait for it off the runtime's threads.
        let provider = self.provider;
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not send the last spans"),
            Err(e) => tracing::warn!(error = %e, "could not send the last spans"),
        }
    }
}

/// The `tracing` layer that exports Tollgate's spans through `tracer`: the spans of Tollgate's
/// crates (at DEBUG and above) and, as events of those spans, their INFO and higher events.
pub(crate) fn layer<S>(tracer: SdkTracer) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::{FilterExt as _, Targets, filter_fn};
    let ours = Targets::new().with_target("tollgate", tracing::Level::DEBUG);
    let spans_and_notes = filter_fn(|meta| meta.is_span() || *meta.level() <= tracing::Level::INFO);
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_filter(ours.and(spans_and_notes))
}

/// Routes whose requests make no span: probes and scrapes, which would only bury the traces
/// of decisions.
const UNTRACED: [&str; 4] = ["/healthz", "/readyz", "/metrics", "/healthcheck"];

/// The W3C trace context (`traceparent`, `tracestate`).
static PROPAGATOR: LazyLock<TraceContextPropagator> = LazyLock::new(TraceContextPropagator::new);

/// A middleware (`route_layer`, so that the matched route is known) making each request's
/// span: `request`, named `POST /v1/check` or, for gRPC, `package.Service/Method`, child of
/// the caller's `traceparent` when there is one.
pub(crate) async fn trace_request(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or("", MatchedPath::as_str);
    let path = request.uri().path();
    if UNTRACED.contains(&route) || path.starts_with("/grpc.health.") {
        return next.run(request).await;
    }
    let grpc = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/grpc"));
    let span = if grpc {
        let method = path.trim_start_matches('/');
        let (service, name) = method.split_once('/').unwrap_or((method, ""));
        tracing::debug_span!(
            "request",
            otel.name = method,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = service,
            rpc.method = name,
            rpc.grpc.status_code = Empty,
            otel.status_code = Empty,
        )
    } else {
        let method = request.method().as_str();
        tracing::debug_span!(
            "request",
            otel.name = format!("{method} {route}"),
            otel.kind = "server",
            http.request.method = method,
            http.route = route,
            url.path = path,
            http.response.status_code = Empty,
            otel.status_code = Empty,
        )
    };
    let parent = PROPAGATOR.extract(&opentelemetry_http::HeaderExtractor(request.headers()));
    // Without a traceparent the context is empty, and the span starts a trace.
    let _ = span.set_parent(parent);
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    if !grpc {
        span.record("http.response.status_code", status.as_u16());
    } else if let Some(code) =
        response.headers().get("grpc-status").and_then(|c| c.to_str().ok()?.parse::<u8>().ok())
    {
        // A trailers-only answer (an error); a streamed one has its status in the trailers.
        span.record("rpc.grpc.status_code", code);
    }
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}
