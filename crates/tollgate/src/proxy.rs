//! `tollgate proxy`: a reverse proxy that rate-limits with the tower layer before forwarding to
//! one upstream. Bodies stream both ways; nothing is buffered whole.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ipnet::IpNet;
use tollgate_config::Config;
use tollgate_limiter::Limiter;
use tollgate_tower::RoutesConfig;

/// Arguments of `tollgate proxy`.
#[derive(Debug, clap::Args)]
pub(crate) struct ProxyArgs {
    /// Where requests go once admitted: http://host:port[/prefix] (the request's path and query
    /// are appended).
    #[arg(long, env = "TOLLGATE_UPSTREAM", value_name = "URL")]
    upstream: Uri,
    /// Configuration file: the backend and the named policies (TOML; see tollgate.example.toml).
    /// Without it, the built-in configuration.
    #[arg(long, env = "TOLLGATE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Routes file (TOML): which policy and key for which path (see the README's "Gateway
    /// mode"). Without it, the policy "default" limits every request by peer address.
    #[arg(long, env = "TOLLGATE_ROUTES", value_name = "FILE")]
    routes: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "TOLLGATE_PROXY_LISTEN", value_name = "ADDR", default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Keep counters in Redis (overrides the config's [backend]).
    #[arg(long, env = "TOLLGATE_REDIS_URL", value_name = "URL")]
    redis: Option<String>,
    /// Which engine decides inside Redis: auto, module or lua (see `tollgate serve --help`).
    #[arg(long, env = "TOLLGATE_REDIS_ENGINE", value_name = "ENGINE")]
    redis_engine: Option<tollgate_config::RedisEngine>,
    /// Longest wait for the upstream's response headers before answering 504 ("30s", "500ms").
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    upstream_timeout: Duration,
    /// Log JSON lines instead of text.
    #[arg(long, env = "TOLLGATE_JSON_LOGS")]
    json_logs: bool,
}

/// What every forwarded request needs.
struct Upstream {
    client: Client<HttpConnector, Body>,
    base: Uri,
    timeout: Duration,
    /// Peers whose X-Forwarded-Proto and -Host are passed on (the routes' trusted proxies).
    trusted: Vec<IpNet>,
}

/// Headers that describe one connection, not the message: never forwarded (RFC 9110 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Headers with which an upstream may route a request by another path or method than the one
/// the layer matched: IIS's URL Rewrite and frameworks that trust it (older Symfony and Zend)
/// take the path from `X-Original-URL` or `X-Rewrite-URL`; Rails, Laravel, Spring's
/// `HiddenHttpMethodFilter` variants and many API frameworks take the method from the
/// `X-HTTP-Method-Override` family. From a client, each is a way around a route's policy (a GET
/// route's limit dodged by a GET that the upstream runs as the limited POST).
const ROUTE_OVERRIDES: [&str; 5] =
    ["x-original-url", "x-rewrite-url", "x-http-method-override", "x-http-method", "x-method-override"];

/// This hop's `Forwarded` element (RFC 7239 4): the peer (`for`, IPv6 bracketed and quoted),
/// the `Host` it asked for (quoted; left out when it cannot be a quoted-string), and `proto`
/// (the proxy listens on plain HTTP).
fn forwarded_element(peer: IpAddr, host: Option<&HeaderValue>) -> String {
    let mut element = match peer {
        IpAddr::V4(ip) => format!("for={ip}"),
        IpAddr::V6(ip) => format!("for=\"[{ip}]\""),
    };
    let host = host.and_then(|h| h.to_str().ok()).filter(|h| !h.contains(['"', '\\']));
    if let Some(host) = host {
        element.push_str(&format!(";host=\"{host}\""));
    }
    element.push_str(";proto=http");
    element
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named in Connection are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

/// An RFC 9457 problem of the proxy's own; `slug` is its entry in docs/api.md's problem types
/// (the layer's answers, 429 and the path's 400 among them, point there too).
fn problem(status: StatusCode, slug: &str, title: &str, detail: String) -> Response {
    let body = serde_json::json!({
        "type": format!("https://github.com/tollgate-rs/tollgate/blob/main/docs/api.md#{slug}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
}

impl Upstream {
    fn uri(&self, uri: &Uri) -> Result<Uri, axum::http::Error> {
        let prefix = self.base.path().trim_end_matches('/');
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut parts = self.base.clone().into_parts();
        parts.path_and_query = Some(format!("{prefix}{path}").parse()?);
        Ok(Uri::from_parts(parts)?)
    }

    /// Sets the forwarding headers: the peer appended to X-Forwarded-For; this hop's element
    /// appended to `Forwarded` (RFC 7239); X-Forwarded-Proto, X-Forwarded-Host and X-Real-IP
    /// passed on from trusted proxies, else written from this hop. A client that is not a
    /// trusted proxy chooses none of them: its own `Forwarded` and `X-Real-IP` are replaced, and
    /// the path and method overrides some servers obey ([`ROUTE_OVERRIDES`]) are dropped, as
    /// they would route the request by a path or method the layer never matched.
    fn forwarded_headers(&self, headers: &mut HeaderMap, peer: IpAddr) {
        let peer = peer.to_canonical();
        let xff = HeaderName::from_static("x-forwarded-for");
        let before: Vec<&str> = headers.get_all(&xff).iter().filter_map(|v| v.to_str().ok()).collect();
        let mut chain = before.join(", ");
        if !chain.is_empty() {
            chain.push_str(", ");
        }
        chain.push_str(&peer.to_string());
        if let Ok(value) = HeaderValue::try_from(chain) {
            headers.insert(xff, value);
        }
        let trusted = self.trusted.iter().any(|n| n.contains(&peer));
        let element = forwarded_element(peer, headers.get(header::HOST));
        let before: Result<Vec<&str>, _> =
            headers.get_all(header::FORWARDED).iter().map(|v| v.to_str()).collect();
        let forwarded = match before {
            Ok(before) if trusted && !before.is_empty() => format!("{}, {element}", before.join(", ")),
            _ => element,
        };
        // Removed first: whatever happens next, a client's own list never goes on.
        headers.remove(header::FORWARDED);
        if let Ok(value) = HeaderValue::try_from(forwarded) {
            headers.insert(header::FORWARDED, value);
        }
        let real_ip = HeaderName::from_static("x-real-ip");
        if !(trusted && headers.contains_key(&real_ip)) {
            headers.remove(&real_ip);
            if let Ok(value) = HeaderValue::try_from(peer.to_string()) {
                headers.insert(real_ip, value);
            }
        }
        if !trusted {
            for name in ROUTE_OVERRIDES {
                headers.remove(name);
            }
        }
        let proto = HeaderName::from_static("x-forwarded-proto");
        if !(trusted && headers.contains_key(&proto)) {
            headers.insert(proto, HeaderValue::from_static("http"));
        }
        let forwarded_host = HeaderName::from_static("x-forwarded-host");
        if !(trusted && headers.contains_key(&forwarded_host)) {
            match headers.get(header::HOST).cloned() {
                Some(host) => headers.insert(forwarded_host, host),
                None => headers.remove(forwarded_host),
            };
        }
        // The client fills Host from the upstream's URI.
        headers.remove(header::HOST);
    }
}

async fn forward(
    State(upstream): State<Arc<Upstream>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let (mut parts, body) = req.into_parts();
    let uri = match upstream.uri(&parts.uri) {
        Ok(uri) => uri,
        Err(e) => {
            return problem(StatusCode::BAD_REQUEST, "invalid-request", "Invalid request", e.to_string());
        }
    };
    strip_hop_by_hop(&mut parts.headers);
    upstream.forwarded_headers(&mut parts.headers, peer.ip());
    parts.uri = uri;
    // HTTP/1.1 to the upstream, whatever the client spoke.
    parts.version = axum::http::Version::HTTP_11;
    let request = Request::from_parts(parts, body);
    match tokio::time::timeout(upstream.timeout, upstream.client.request(request)).await {
        Ok(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Body::new(body))
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, upstream = %upstream.base, "upstream request failed");
            let detail = format!("the upstream {} could not be reached: {e}", upstream.base);
            problem(StatusCode::BAD_GATEWAY, "bad-gateway", "Bad gateway", detail)
        }
        Err(_) => {
            let detail = format!("the upstream did not answer within {:?}", upstream.timeout);
            problem(StatusCode::GATEWAY_TIMEOUT, "gateway-timeout", "Gateway timeout", detail)
        }
    }
}

pub(crate) async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    crate::serve::init_logging(args.json_logs, None);

    if args.upstream.scheme_str() != Some("http") || args.upstream.authority().is_none() {
        anyhow::bail!("--upstream must be an http://host:port URL (got {})", args.upstream);
    }
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::builtin(),
    };
    if let Some(url) = &args.redis {
        config.backend.use_redis(url.clone())?;
    }
    if let Some(engine) = args.redis_engine {
        config.backend.engine = engine;
    }
    let routes = match &args.routes {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            RoutesConfig::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => RoutesConfig { default_policy: Some("default".into()), ..RoutesConfig::default() },
    };
    let (backend, backend_name) = crate::serve::backend(&config).await?;
    let limiter = Limiter::new(backend, backend_name, config.limiter_settings());
    let policies = config.policies.clone();
    let layer = routes.build(limiter, |name| policies.get(name).cloned()).with_context(|| {
        format!("in {}", args.routes.as_ref().map_or("the routes".into(), |p| p.display().to_string()))
    })?;
    let mut trusted_text = routes.key.trusted_proxies();
    for key in routes.routes.iter().filter_map(|r| r.key.as_ref()) {
        trusted_text.extend(key.trusted_proxies());
    }
    let trusted = trusted_text
        .iter()
        .filter_map(|s| s.parse::<IpNet>().or_else(|_| s.parse::<IpAddr>().map(IpNet::from)).ok())
        .collect();

    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(args.upstream_timeout));
    let client = Client::builder(TokioExecutor::new()).build(connector);
    let upstream =
        Arc::new(Upstream { client, base: args.upstream.clone(), timeout: args.upstream_timeout, trusted });

    let app = Router::new().fallback(forward).with_state(upstream).layer(layer);
    let listener = crate::serve::bind_listener(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(address = %listener.local_addr()?, upstream = %args.upstream, backend = backend_name,
        "tollgate proxy is listening");
    // No body cap: bodies stream to the upstream, which applies its own (the body timeout
    // still bounds how long one may take).
    let limits = crate::listen::Limits::from_config(&config.server, None);
    let threads = crate::threads::ConnectionThreads::configured(config.server.connections.threads)
        .context("cannot start the connection threads")?;
    crate::listen::serve(listener, app, limits, None, threads, crate::serve::shutdown_signal()).await;
    Ok(())
}
