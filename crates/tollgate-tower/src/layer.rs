//! [`TollgateLayer`] and the [`Tollgate`] service it wraps around an inner one.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri, header};
use pin_project_lite::pin_project;
use tollgate_core::Decision;
use tollgate_http::headers::{ceil_secs, rate_limit_headers};
use tollgate_http::{FixedHeaders, HeaderSet, ResetHeader};
use tollgate_limiter::keyspace::{policy_key, with_policy_key};
use tollgate_limiter::{LimitError, Limiter, Policy, Verdict};

use crate::path::{PathError, Spelling, canonicalize, route_key, upper_case_escapes};
use crate::response::{Problem, answer, backend_unavailable, is_grpc, key_refused, misconfigured};
use crate::route::{Action, RouteError, RouteTable};
use crate::{Cors, Key, NonCanonicalPaths, PathCase, ResponseBody, Route};

/// Why a layer could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A route pattern is malformed or conflicts with another.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// A route pattern that is not in canonical form: requests are matched on their canonical
    /// paths, so it could never match as written.
    #[error("route {pattern:?} is not a canonical path: {detail}")]
    NonCanonicalPattern {
        /// The pattern.
        pattern: String,
        /// What is wrong, and the canonical form when there is one.
        detail: String,
    },
    /// A policy holds a concurrency rule: units held at once need a lease released when the
    /// work ends, which a per-request check does not do.
    #[error("policy {policy:?} has a concurrency rule, which the layer does not support")]
    ConcurrencyPolicy {
        /// The policy's name.
        policy: String,
    },
}

/// What a limited request learned, put in its extensions for the handler: the key it was
/// counted under, the policy applied and the verdict (shadow-mode denials included:
/// `verdict.shadow_denied`).
#[derive(Clone, Debug)]
pub struct RateLimitInfo {
    /// The key read from the request (`ip:203.0.113.7`, `hdr:x-api-key:<hash>`, `id:...`,
    /// `global`, `fn:...`), before the policy's name scopes it.
    pub key: String,
    /// The policy applied.
    pub policy: Arc<Policy>,
    /// The limiter's verdict.
    pub verdict: Verdict,
}

/// What every clone of a layer and of its services shares: the limiter, the key, the route
/// table and the answers' settings, fixed when the layer is built.
struct LayerSettings {
    limiter: Limiter,
    key: Key,
    default: Option<Arc<Policy>>,
    routes: RouteTable,
    exempt_preflight: bool,
    cors: Option<Cors>,
    reset: ResetHeader,
    headers: HeaderSet,
    non_canonical_paths: NonCanonicalPaths,
    path_case: PathCase,
    /// Each policy's header values that depend on its rules alone, by [`policy_id`].
    policy_headers: HashMap<usize, FixedHeaders, foldhash::fast::RandomState>,
}

/// A policy's identity in [`LayerSettings::policy_headers`]: where its `Arc` points (the layer
/// holds every policy it checks under, so the address is not reused while it runs).
fn policy_id(policy: &Arc<Policy>) -> usize {
    Arc::as_ptr(policy) as usize
}

/// Builds a [`TollgateLayer`]; from [`TollgateLayer::builder`].
#[must_use]
pub struct Builder {
    limiter: Limiter,
    key: Key,
    default: Option<Arc<Policy>>,
    routes: Vec<Route>,
    exempt_preflight: bool,
    cors: Option<Cors>,
    reset: ResetHeader,
    headers: HeaderSet,
    non_canonical_paths: NonCanonicalPaths,
    path_case: PathCase,
}

impl Builder {
    /// The key of every limited route that does not name its own (default:
    /// [`Key::peer_ip`]).
    pub fn key(mut self, key: Key) -> Self {
        self.key = key;
        self
    }

    /// The policy of requests no route takes. Without one, such requests pass unlimited.
    pub fn default_policy(mut self, policy: impl Into<Arc<Policy>>) -> Self {
        self.default = Some(policy.into());
        self
    }

    /// A route: limited by its own policy, or exempt.
    pub fn route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }

    /// Shorthand for `.route(Route::exempt(pattern))`.
    pub fn exempt(self, pattern: impl Into<String>) -> Self {
        self.route(Route::exempt(pattern))
    }

    /// Whether CORS preflights (`OPTIONS` with `Access-Control-Request-Method`) pass without a
    /// check (default: true). A browser sends one before many cross-origin requests; counting
    /// both halves the limit, and a refused preflight shows as a CORS error, not a 429.
    pub fn exempt_preflight(mut self, exempt: bool) -> Self {
        self.exempt_preflight = exempt;
        self
    }

    /// CORS headers on the layer's own answers (429, and its 400, 401 and 503), so the page's
    /// script can read them and `Retry-After`.
    pub fn cors(mut self, cors: Cors) -> Self {
        self.cors = Some(cors);
        self
    }

    /// `X-RateLimit-Reset` as seconds from now (default) or a Unix time.
    pub fn reset_header(mut self, reset: ResetHeader) -> Self {
        self.reset = reset;
        self
    }

    /// Which rate-limit headers the layer writes (default [`HeaderSet::All`]: `X-RateLimit-*`
    /// and the IETF draft's `RateLimit-Policy` and `RateLimit`); `Retry-After` on a 429 in any
    /// case. Fewer headers cost a request less.
    pub fn headers(mut self, headers: HeaderSet) -> Self {
        self.headers = headers;
        self
    }

    /// What a request whose path is not in [canonical form](crate#canonical-paths) gets:
    /// matched on the canonical form, which replaces its path (default), or refused with 400.
    pub fn non_canonical_paths(mut self, paths: NonCanonicalPaths) -> Self {
        self.non_canonical_paths = paths;
        self
    }

    /// Whether routes match paths case-sensitively (default) or not: set
    /// [`PathCase::Insensitive`] when the service serves `/LOGIN` as `/login`, or `/LOGIN`
    /// escapes `/login`'s policy.
    pub fn path_case(mut self, case: PathCase) -> Self {
        self.path_case = case;
        self
    }

    /// The layer, once every route is valid.
    pub fn build(self) -> Result<TollgateLayer, BuildError> {
        let mut routes = RouteTable::default();
        for route in self.routes {
            let key = pattern_key(&route.pattern, self.path_case)?;
            routes.add(route, key)?;
        }
        let limited = routes.routes().filter_map(|r| match &r.action {
            Action::Limit { policy, .. } => Some(policy),
            Action::Exempt => None,
        });
        if let Some(p) = limited.chain(&self.default).find(|p| p.rules.has_concurrency()) {
            return Err(BuildError::ConcurrencyPolicy { policy: p.name.to_string() });
        }
        let policy_headers = routes
            .routes()
            .filter_map(|r| match &r.action {
                Action::Limit { policy, .. } => Some(policy),
                Action::Exempt => None,
            })
            .chain(&self.default)
            .map(|p| (policy_id(p), FixedHeaders::new(&p.rules)))
            .collect();
        let shared = LayerSettings {
            policy_headers,
            limiter: self.limiter,
            key: self.key,
            default: self.default,
            routes,
            exempt_preflight: self.exempt_preflight,
            cors: self.cors,
            reset: self.reset,
            headers: self.headers,
            non_canonical_paths: self.non_canonical_paths,
            path_case: self.path_case,
        };
        Ok(TollgateLayer { shared: Arc::new(shared) })
    }
}

/// What a route pattern is matched as, once it is known to be canonical.
fn pattern_key(pattern: &str, case: PathCase) -> Result<String, BuildError> {
    let refused = |detail: String| BuildError::NonCanonicalPattern { pattern: pattern.to_owned(), detail };
    if !pattern.starts_with('/') {
        return Err(refused("a pattern starts with `/`".into()));
    }
    let canonical = canonicalize(pattern, Spelling::Pattern).map_err(|e| refused(e.to_string()))?;
    if canonical != upper_case_escapes(pattern) {
        return Err(refused(format!("requests are matched on canonical paths; write {canonical:?}")));
    }
    Ok(route_key(&canonical, case).into_owned())
}

/// A tower [`Layer`](tower::Layer) that rate-limits requests before they reach the service.
///
/// Each request is matched to a [`Route`] (or the default policy), keyed by a [`Key`], and
/// checked against the [`Limiter`]: admitted requests reach the service and get the rate-limit
/// headers on their response; refused ones are answered 429 with `Retry-After` and an RFC 9457
/// problem+json body (under gRPC: `RESOURCE_EXHAUSTED`). The limiter's failure policy, shadow
/// mode and `delay` strategy apply as in the server. Cheap to clone.
#[derive(Clone)]
pub struct TollgateLayer {
    shared: Arc<LayerSettings>,
}

impl std::fmt::Debug for TollgateLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TollgateLayer")
            .field("limiter", &self.shared.limiter)
            .field("key", &self.shared.key)
            .field("default", &self.shared.default.as_ref().map(|p| &p.name))
            .finish_non_exhaustive()
    }
}

impl TollgateLayer {
    /// A builder over `limiter` (see [`crate::in_memory`] for one in this process).
    pub fn builder(limiter: Limiter) -> Builder {
        Builder {
            limiter,
            key: Key::peer_ip(),
            default: None,
            routes: Vec::new(),
            exempt_preflight: true,
            cors: None,
            reset: ResetHeader::Delta,
            headers: HeaderSet::All,
            non_canonical_paths: NonCanonicalPaths::default(),
            path_case: PathCase::default(),
        }
    }

    /// The limiter behind the layer.
    pub fn limiter(&self) -> &Limiter {
        &self.shared.limiter
    }
}

impl<S> tower::Layer<S> for TollgateLayer {
    type Service = Tollgate<S>;

    fn layer(&self, inner: S) -> Tollgate<S> {
        Tollgate { inner, shared: Arc::clone(&self.shared) }
    }
}

/// The service a [`TollgateLayer`] wraps around `S`.
#[derive(Clone)]
pub struct Tollgate<S> {
    inner: S,
    shared: Arc<LayerSettings>,
}

impl<S> std::fmt::Debug for Tollgate<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tollgate").finish_non_exhaustive()
    }
}

/// What the layer decided before the inner service is called.
enum Gate {
    /// Not limited: call the service, add nothing.
    Pass,
    /// Admitted: call the service, write the headers of this decision into its response.
    Admit(RateLimitInfo),
    /// Answered by the layer.
    Answer(Problem, HeaderMap),
}

/// What the layer knows of a request before asking the limiter.
enum Prepared<'a> {
    /// Decided already: passed (exempt, unrouted) or answered (a bad path, an unreadable key).
    Gate(Gate),
    /// To be checked: `key` under `policy`.
    Check { policy: &'a Arc<Policy>, key: String },
}

fn is_preflight<B>(req: &Request<B>) -> bool {
    req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// `req`'s path replaced by `path`, its query kept.
fn set_path<B>(req: &mut Request<B>, path: &str) -> Result<(), http::Error> {
    let path_and_query = match req.uri().query() {
        Some(query) => PathAndQuery::try_from(format!("{path}?{query}"))?,
        None => PathAndQuery::try_from(path)?,
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(path_and_query);
    *req.uri_mut() = Uri::from_parts(parts)?;
    Ok(())
}

impl LayerSettings {
    /// The key `req`'s route is found by, from its canonical path; under
    /// [`NonCanonicalPaths::Normalize`] the canonical path replaces the request's.
    fn route_path<B>(&self, req: &mut Request<B>) -> Result<String, PathError> {
        let Cow::Owned(canonical) = canonicalize(req.uri().path(), Spelling::Request)? else {
            return Ok(route_key(req.uri().path(), self.path_case).into_owned());
        };
        match self.non_canonical_paths {
            NonCanonicalPaths::Reject => {
                if canonical != upper_case_escapes(req.uri().path()) {
                    return Err(PathError::NotCanonical { canonical });
                }
            }
            NonCanonicalPaths::Normalize => {
                // A canonical path holds only characters a URI's path may hold, so this
                // cannot fail; were it to, the request is refused rather than passed on as sent.
                set_path(req, &canonical).map_err(|e| {
                    tracing::error!(error = %e, path = %canonical, "a canonical path was not a valid URI");
                    PathError::NotCanonical { canonical: canonical.clone() }
                })?;
            }
        }
        Ok(route_key(&canonical, self.path_case).into_owned())
    }

    /// What the layer knows of `req` before asking the limiter: passed or answered already, or
    /// to be checked under a policy with a key. Hands `req` back for the inner service.
    fn prepare<B>(&self, mut req: Request<B>) -> (Request<B>, Prepared<'_>) {
        // First, so that even an exempt or preflight request reaches the service only by its
        // canonical path.
        let path = match self.route_path(&mut req) {
            Ok(path) => path,
            Err(e) => {
                let answer = Gate::Answer(Problem::invalid("path", e.to_string()), HeaderMap::new());
                return (req, Prepared::Gate(answer));
            }
        };
        if self.exempt_preflight && is_preflight(&req) {
            return (req, Prepared::Gate(Gate::Pass));
        }
        let (policy, key) = match self.routes.find(&path, req.method()) {
            Some(Action::Exempt) => return (req, Prepared::Gate(Gate::Pass)),
            Some(Action::Limit { policy, key }) => (policy, key.as_ref().unwrap_or(&self.key)),
            None => match &self.default {
                Some(policy) => (policy, &self.key),
                None => return (req, Prepared::Gate(Gate::Pass)),
            },
        };
        // The extractors read the request's head; taking it apart and back is only moves.
        let (parts, body) = req.into_parts();
        let extracted = key.extract(&parts);
        let req = Request::from_parts(parts, body);
        let prepared = match extracted {
            Ok(key) => Prepared::Check { policy, key },
            Err((e, rejection)) => {
                tracing::debug!(error = %e, policy = %policy.name, "rate-limit key unreadable");
                Prepared::Gate(Gate::Answer(key_refused(rejection.status(), e.to_string()), HeaderMap::new()))
            }
        };
        (req, prepared)
    }

    /// The check of `key` under `policy`, answered without awaiting where the limiter can
    /// ([`Limiter::check_now`]: an in-process backend); the key handed back (`Err`) when the
    /// check must be awaited ([`decide`](Self::decide)), nothing having been asked.
    fn decide_now(&self, policy: &Arc<Policy>, key: String) -> Result<Gate, String> {
        match with_policy_key(&policy.name, &key, |scoped| self.limiter.check_now(scoped, policy, 1)) {
            Some(checked) => Ok(self.gate_of(policy, key, checked)),
            None => Err(key),
        }
    }

    /// The check of `key` under `policy`, awaited.
    async fn decide(&self, policy: &Arc<Policy>, key: String) -> Gate {
        let checked = self.limiter.check(&policy_key(&policy.name, &key), policy, 1).await;
        self.gate_of(policy, key, checked)
    }

    /// What the layer does with a request whose check of `key` under `policy` gave `checked`.
    fn gate_of(&self, policy: &Arc<Policy>, key: String, checked: Result<Verdict, LimitError>) -> Gate {
        let verdict = match checked {
            Ok(v) => v,
            Err(LimitError::Unavailable(e)) => {
                let mut headers = HeaderMap::new();
                headers.insert(header::RETRY_AFTER, HeaderValue::from(1));
                let detail = format!("{e}; the failure policy is closed, so no request is admitted");
                return Gate::Answer(backend_unavailable(detail), headers);
            }
            Err(e) => {
                tracing::error!(error = %e, policy = %policy.name, "rate-limit check refused its input");
                return Gate::Answer(misconfigured(), HeaderMap::new());
            }
        };
        if verdict.allowed() {
            // The headers are written into the response itself, once the service answers.
            Gate::Admit(RateLimitInfo { key, policy: Arc::clone(policy), verdict })
        } else {
            let mut headers = HeaderMap::new();
            self.write_headers(&mut headers, policy, &verdict.decision, true);
            let secs = ceil_secs(verdict.decision.retry_after()).max(1);
            Gate::Answer(Problem::rate_limited(&policy.name, secs), headers)
        }
    }

    /// The rate-limit headers of `decision` under `policy`, those that depend on its rules
    /// alone made when the layer was built.
    fn write_headers(
        &self,
        headers: &mut HeaderMap,
        policy: &Arc<Policy>,
        decision: &Decision,
        denied: bool,
    ) {
        let kept = self.policy_headers.get(&policy_id(policy));
        rate_limit_headers(headers, &policy.rules, decision, self.reset, self.headers, denied, kept);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

pin_project! {
    /// The future a [`Tollgate`] service answers with: the inner service's response with the
    /// rate-limit headers written into it, or the layer's own answer. Decided before it is
    /// returned wherever the limiter answers at once (an in-process backend); a boxed future
    /// only where the check must be awaited (a remote backend).
    pub struct ResponseFuture<F, ResBody, E> {
        #[pin]
        state: State<F, ResBody, E>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<F, ResBody, E> {
        /// The inner service's response to come; the headers of an admission to write into it.
        Inner { #[pin] future: F, admitted: Option<Admitted> },
        /// The layer's own answer.
        Answered { response: Option<Response<ResponseBody<ResBody>>> },
        /// The check awaited first.
        Deciding { future: BoxFuture<Result<Response<ResponseBody<ResBody>>, E>> },
    }
}

/// An admission's rate-limit headers, written once the inner service answers.
struct Admitted {
    shared: Arc<LayerSettings>,
    policy: Arc<Policy>,
    decision: Decision,
}

impl<F, ResBody, E> Future for ResponseFuture<F, ResBody, E>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProjection::Inner { future, admitted } => {
                let mut response = std::task::ready!(future.poll(cx))?.map(ResponseBody::inner);
                if let Some(Admitted { shared, policy, decision }) = admitted.take() {
                    shared.write_headers(response.headers_mut(), &policy, &decision, false);
                }
                Poll::Ready(Ok(response))
            }
            StateProjection::Answered { response } => Poll::Ready(Ok(response
                .take()
                .expect("a Tollgate response future polled after it completed"))),
            StateProjection::Deciding { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, ResBody, E> std::fmt::Debug for ResponseFuture<F, ResBody, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// What the layer's `gate` means for `req`: the inner service called (with the admission's
/// headers to write) or the layer's own answer.
fn respond<S, B, ResBody>(
    shared: &Arc<LayerSettings>,
    inner: &mut S,
    mut req: Request<B>,
    gate: Gate,
) -> ResponseFuture<S::Future, ResBody, S::Error>
where
    S: tower::Service<Request<B>, Response = Response<ResBody>>,
{
    let state = match gate {
        Gate::Pass => State::Inner { future: inner.call(req), admitted: None },
        Gate::Admit(info) => {
            let admitted = Admitted {
                shared: Arc::clone(shared),
                policy: Arc::clone(&info.policy),
                decision: info.verdict.decision.clone(),
            };
            req.extensions_mut().insert(info);
            State::Inner { future: inner.call(req), admitted: Some(admitted) }
        }
        Gate::Answer(problem, headers) => {
            let mut response = answer(problem, is_grpc(req.headers()), headers);
            if let Some(cors) = &shared.cors {
                cors.apply(response.headers_mut(), req.headers().get(header::ORIGIN));
            }
            State::Answered { response: Some(response) }
        }
    };
    ResponseFuture { state }
}

impl<S, B, ResBody> tower::Service<Request<B>> for Tollgate<S>
where
    S: tower::Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let shared = &self.shared;
        let (req, prepared) = shared.prepare(req);
        let (policy, key) = match prepared {
            Prepared::Gate(gate) => return respond(shared, &mut self.inner, req, gate),
            Prepared::Check { policy, key } => (policy, key),
        };
        let key = match shared.decide_now(policy, key) {
            Ok(gate) => return respond(shared, &mut self.inner, req, gate),
            Err(key) => key,
        };
        // Awaited: the service that was polled ready is the one to call once decided; a fresh
        // clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (shared, policy) = (Arc::clone(shared), Arc::clone(policy));
        let future = Box::pin(async move {
            let gate = shared.decide(&policy, key).await;
            respond(&shared, &mut inner, req, gate).await
        });
        ResponseFuture { state: State::Deciding { future } }
    }
}
