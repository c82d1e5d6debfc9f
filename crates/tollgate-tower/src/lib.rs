//! Tollgate as a tower [`Layer`](tower::Layer): rate limits in front of any axum, hyper or tonic
//! service, decided by a [`tollgate_limiter::Limiter`] over any backend (in-process memory,
//! Redis, or a running `tollgate serve` through `RemoteBackend`, feature `remote`).
//!
//! - **Routes**: a [`Policy`] per path pattern and method set ([`Route::limit`]), a default
//!   policy, and exempt routes ([`Route::exempt`]).
//! - **Keys**: whose requests count together ([`Key`]): the peer address (IPv6 grouped by /56),
//!   the client address behind trusted proxies (the rightmost untrusted hop, never a client's own
//!   claim), a header or bearer token (hashed), an identity an earlier layer put in the request's
//!   extensions, one global key, or a closure; with fallbacks, and a 400 or 401 when none can be
//!   read (never a 500).
//! - **Answers**: admitted responses carry `X-RateLimit-Limit/Remaining/Reset`, `RateLimit-Policy`
//!   and `RateLimit`; refused requests get 429 with `Retry-After` (whole seconds, rounded up, never
//!   zero) and an RFC 9457 problem+json body, or under gRPC `RESOURCE_EXHAUSTED` with the same
//!   headers as metadata. CORS preflights pass unchecked by default, and [`Cors`] headers can be
//!   added to the layer's own answers.
//! - **Policies** behave as in the server: shadow mode admits and reports, `delay` holds a request
//!   until it fits, and the limiter's failure policy (open, closed, local) answers when the
//!   backend fails (closed: 503).
//!
//! ```
//! use axum::{Router, routing::get, routing::post};
//! use http::Method;
//! use tollgate_core::Period;
//! use tollgate_tower::{Key, Route, TollgateLayer, TrustedProxies, in_memory, requests_per_period};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = TollgateLayer::builder(in_memory())
//!     // Clients behind our load balancers (10.0.0.0/8), by their X-Forwarded-For hop.
//!     .key(Key::client_ip(TrustedProxies::parse(["10.0.0.0/8"])?))
//!     .default_policy(requests_per_period(100, Period::MINUTE)?)
//!     .route(Route::limit("/login", requests_per_period(5, Period::MINUTE)?).methods([Method::POST]))
//!     .route(Route::limit("/api/{*rest}", requests_per_period(1_000, Period::HOUR)?).key(Key::header("x-api-key")))
//!     .exempt("/healthz")
//!     .build()?;
//!
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .route("/login", post(|| async { "welcome" }))
//!     .route("/healthz", get(|| async { "ok" }))
//!     .layer(layer);
//! // axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())
//! # Ok(()) }
//! ```
//!
//! The peer address comes from axum's `ConnectInfo<SocketAddr>` (serve with
//! `into_make_service_with_connect_info`) or a `SocketAddr` that a hyper server loop puts in the
//! request's extensions.
//!
//! # Canonical paths
//!
//! Routes are matched on one spelling of each path, so that `//login`, `/./login`, `/%6Cogin`,
//! `/x/../login` or `/login;x` cannot miss `/login`'s policy while the service behind serves
//! them as `/login`. The canonical form decodes escaped unreserved characters (`%6C` is `l`,
//! `%2e` is `.`), keeps other escapes (hex upper-cased) and encodes what a path may not hold
//! raw, drops `;` parameters from every segment, merges `//` and resolves `.` and `..`
//! (never above the root). Refused with 400 (problem+json naming `path`) whatever the mode,
//! because servers disagree on what they mean: `%2F`, `\` and `%5C`, `%25`, control
//! characters (`%00`), `%` without two hex digits, and escapes that are not UTF-8 (`%ff`).
//! Matching ignores a trailing `/`, and ASCII case under [`PathCase::Insensitive`].
//!
//! A path that is not canonical is, by [`NonCanonicalPaths`], matched on its canonical form,
//! which replaces the request's path before the service sees it (`Normalize`, the default),
//! or refused with 400 (`Reject`). Route patterns must be canonical (the builder refuses one
//! that is not). Note that axum's `Router::layer` runs after the router has chosen a handler by
//! the path as sent; wrap the whole router (`tower::Layer::layer(&layer, router)`) for the
//! router to see the canonical path too.

mod body;
pub mod config;
mod key;
mod layer;
mod path;
#[cfg(feature = "remote")]
mod remote;
mod response;
mod route;

use std::sync::Arc;

use tollgate_core::{MemoryBackend, Period, Rule, RuleError, RuleSet};

pub use body::ResponseBody;
pub use config::{RoutesConfig, RoutesConfigError};
pub use key::{
    CidrError, ExtractError, ForwardedHeader, IpGrouping, Key, Rejection, TrustedProxies, peer_addr,
};
pub use layer::{BuildError, Builder, RateLimitInfo, ResponseFuture, Tollgate, TollgateLayer};
pub use path::{NonCanonicalPaths, PathCase, PathError};
#[cfg(feature = "remote")]
pub use remote::{MAX_REMOTE_RULES, RemoteBackend};
pub use response::Cors;
pub use route::{Route, RouteError};
pub use tollgate_http::{HeaderSet, ResetHeader};
pub use tollgate_limiter::{FailurePolicy, Limiter, LimiterSettings, Mode, OnLimit, Policy};

/// A limiter with its counters in this process (a [`MemoryBackend`]): right for one instance;
/// several instances share limits through Redis or a remote server.
pub fn in_memory() -> Limiter {
    Limiter::new(Arc::new(MemoryBackend::new()), "memory", LimiterSettings::default())
}

/// An enforced policy of at most `limit` requests in each window of `period`, windows aligned
/// to the clock (a fixed window: across a window's edge up to twice `limit` can pass in less
/// than `period`; build the policy from [`Rule::sliding_window_log`] for an exact sliding
/// limit). The policy and its rule are named `<limit>-per-<period>`, such as `100-per-1m`.
///
/// ```
/// use tollgate_core::Period;
/// let policy = tollgate_tower::requests_per_period(100, Period::MINUTE).unwrap();
/// assert_eq!(&*policy.name, "100-per-1m");
/// ```
pub fn requests_per_period(limit: u64, period: Period) -> Result<Policy, RuleError> {
    let name = format!("{limit}-per-{period}");
    let rules = RuleSet::new([Rule::fixed_window(limit, period).named(name.clone())])?;
    Ok(Policy::enforce(name, rules))
}
