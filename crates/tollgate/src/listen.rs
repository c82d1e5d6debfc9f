//! The HTTP server of `tollgate serve` and `tollgate proxy`: an accept loop handing each
//! connection to hyper-util (HTTP/1.1, and HTTP/2 with prior knowledge), with the bounds a
//! stranger must not be able to stretch ([`Limits`], from the config's `[server]` section):
//!
//! - a cap on open connections from one client address: past it, a new connection from that
//!   address is closed at once, so that one client cannot take every slot of the cap below;
//! - a cap on open connections: past it, one new connection is accepted and held unserved and
//!   the next ones wait in the kernel's backlog (all served in turn as others close, rather
//!   than refused), and idle keep-alive connections are asked to close to make room;
//! - a header timeout: a request's head must arrive whole within it, counted from the
//!   connection's opening, or from the first byte after it went idle;
//! - an idle timeout: a connection with no request in flight and nothing received closes
//!   after it (gracefully: HTTP/2 clients get a GOAWAY);
//! - a body timeout: a request's body must arrive whole within it, counted from its head (a
//!   total, not a gap between bytes, so a body sent a byte at a time cannot hold on); past it
//!   the request is answered 408 and the connection closed;
//! - a body size: a request whose Content-Length is above it is answered 413 at once, before
//!   any of the body is read (so `Expect: 100-continue` gets 413, never `100 Continue`);
//! - with TLS, the handshake runs in the connection's own task (a client that stalls it holds
//!   its own slot, not the accept loop) and within the header timeout: it is the first part of
//!   the wait for the first request's head.
//!
//! hyper's own `header_read_timeout` is not used: it also runs while a keep-alive connection
//! is idle, so it cannot be longer than the idle timeout, and HTTP/2 has none.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::response::IntoResponse as _;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tollgate_http::Problem;
use tower::ServiceExt as _;

use crate::threads::ConnectionThreads;

/// While connections wait for a slot, how often idle ones are asked again to close.
const MAKE_ROOM_INTERVAL: Duration = Duration::from_millis(100);

/// The bounds on connections and requests (see the module's documentation).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Longest wait for a request's head.
    pub header_timeout: Duration,
    /// Longest wait for a request's whole body, from its head.
    pub body_timeout: Duration,
    /// Longest a connection stays open with nothing in flight and nothing received.
    pub idle_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most connections open at once from one address (0: no cap).
    pub max_connections_per_address: usize,
    /// Requests whose Content-Length is above this get 413 before their body is read (`None`:
    /// no cap, for the proxy, which streams bodies).
    pub max_body: Option<usize>,
}

impl Limits {
    pub(crate) fn from_config(server: &tollgate_config::ServerSettings, max_body: Option<usize>) -> Self {
        let c = &server.connections;
        Limits {
            header_timeout: c.header_timeout,
            body_timeout: c.body_timeout,
            idle_timeout: c.idle_timeout,
            max_connections: c.max_connections,
            max_connections_per_address: c.max_connections_per_address,
            max_body,
        }
    }
}

/// What a listener serves: an axum app, and on the gRPC port Envoy's `ShouldRateLimit` answered
/// without it.
///
/// Every call of the hot gRPC method would otherwise go through axum's router (tonic's
/// `Routes` is one): matching the path, a map of its parameters put in the request's extensions,
/// and two more layers of futures, about 3,000 instructions a call (scripts/bench-server-instructions
/// --grpc). The method's server is the one the router holds, so what it answers is the same;
/// with request spans (`[tracing]`), which are the router's layers, the router takes it too.
///
/// The gRPC port's answers carry no `Date` header: gRPC does not use one (grpc-go sends none),
/// and hyper's costs a header encoded into every answer.
#[derive(Clone)]
pub(crate) struct App {
    router: Router,
    rls: Option<tollgate_envoy::EnvoyServer>,
    date_header: bool,
}

impl App {
    /// The gRPC port's app: `router`, with requests for exactly `ShouldRateLimit`'s path handed
    /// to `rls` instead.
    pub(crate) fn with_rls(router: Router, rls: Option<tollgate_envoy::EnvoyServer>) -> Self {
        App { router, rls, date_header: false }
    }
}

impl From<Router> for App {
    fn from(router: Router) -> Self {
        App { router, rls: None, date_header: true }
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets every
/// connection finish what it has in flight, and returns once all are closed. Connections are
/// served on `threads` (accepted here, then each on one thread for life).
pub(crate) async fn serve(
    listener: TcpListener,
    app: impl Into<App>,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    threads: ConnectionThreads,
    shutdown: impl Future<Output = ()>,
) {
    let app = app.into();
    let slots = Slots::new(limits.max_connections);
    let per_address = PerAddress::new(limits.max_connections_per_address);
    let (stop, _) = watch::channel(false);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Our own header timeout replaces hyper's (see the module's documentation).
    builder.http1().header_read_timeout(None);
    builder.http2().auto_date_header(app.date_header);
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Closed at once (dropped) when its address already holds its share.
        let Some(address_slot) = per_address.take(peer.ip()) else { continue };
        let Some(permit) = slots.take(shutdown.as_mut()).await else { break };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            app: app.clone(),
            peer,
            limits,
            state: Arc::new(ConnState::new(limits)),
            waiting: slots.waiting.clone(),
            make_room: slots.make_room.subscribe(),
            stop: stop.subscribe(),
            builder: builder.clone(),
        };
        let tls = tls.clone();
        threads.spawn(stream, move |stream| async move {
            connection.start(stream, tls).await;
            drop(permit);
            drop(address_slot);
        });
    }
    drop(listener);
    stop.send_replace(true);
    slots.all_closed(limits.max_connections).await;
}

/// The connection slots (`max_connections`), and the signals that ask idle connections to
/// close when the accept loop waits for one.
struct Slots {
    free: Arc<Semaphore>,
    /// Whether the accept loop waits for a slot: connections going idle then close.
    waiting: Arc<AtomicBool>,
    /// Bumped while the loop waits: connections idle now close.
    make_room: watch::Sender<u64>,
}

impl Slots {
    fn new(max_connections: usize) -> Self {
        let (make_room, _) = watch::channel(0u64);
        Slots { free: Arc::new(Semaphore::new(max_connections)), waiting: Arc::default(), make_room }
    }

    /// A slot for the next connection; `None` when `shutdown` completes first. At the cap,
    /// this connection waits for a slot (and the next ones in the backlog), and idle
    /// connections are asked to close: only when someone is waiting, so that keep-alive
    /// clients keep their connections while the server is merely full.
    async fn take(&self, mut shutdown: Pin<&mut impl Future<Output = ()>>) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.free.clone().try_acquire_owned() {
            return Some(permit);
        }
        self.waiting.store(true, Ordering::Release);
        let permit = loop {
            self.make_room.send_modify(|n| *n += 1);
            tokio::select! {
                permit = self.free.clone().acquire_owned() => break Some(permit.expect("the semaphore is never closed")),
                // Again, for connections that went idle since (and at most this often: each
                // bump wakes every connection).
                () = tokio::time::sleep(MAKE_ROOM_INTERVAL) => {}
                () = &mut shutdown => break None,
            }
        };
        self.waiting.store(false, Ordering::Release);
        permit
    }

    /// Returns once every connection has closed (each holds a slot until then).
    async fn all_closed(&self, max_connections: usize) {
        let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
        let _ = self.free.acquire_many(all).await;
    }
}

/// Open connections per client address (an IPv6 address counts as its /64: one host is
/// usually given a whole /64, and could otherwise open connections from as many addresses).
#[derive(Clone)]
struct PerAddress {
    cap: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection's place in its address's count, given back when dropped.
struct AddressSlot {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    address: IpAddr,
}

impl PerAddress {
    fn new(cap: usize) -> Self {
        PerAddress { cap, open: Arc::default() }
    }

    /// A place for a connection from `peer`, or `None` when its address holds `cap` already.
    fn take(&self, peer: IpAddr) -> Option<Option<AddressSlot>> {
        if self.cap == 0 {
            return Some(None);
        }
        let address = match peer.to_canonical() {
            IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
            v4 => v4,
        };
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(address).or_default();
        if *count >= self.cap {
            tracing::debug!(%address, cap = self.cap, "connection closed: its address holds max_connections_per_address");
            return None;
        }
        *count += 1;
        Some(Some(AddressSlot { open: self.open.clone(), address }))
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                // Addresses with no connection are forgotten, so the map holds at most
                // max_connections entries.
                open.remove(&self.address);
            }
        }
    }
}

/// Like axum's `serve`: errors about one connection are ignored; others (such as too many open
/// files) are logged and accepting pauses, rather than spinning.
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset) {
        return;
    }
    tracing::error!(error = %e, "cannot accept connections; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// What one connection's deadline depends on, shared by its task, its socket and its requests.
struct ConnState {
    limits: Limits,
    /// Requests whose response has not been sent whole yet.
    in_flight: AtomicUsize,
    /// Whether bytes have arrived since the connection went idle (or opened).
    heard: AtomicBool,
    /// When the current wait began: the opening, the end of the last response, or the first
    /// byte after it.
    since: Mutex<Instant>,
    /// Wakes the connection's task when its deadline moves.
    changed: Notify,
}

/// What the connection is waiting for, and until when.
#[derive(Debug, PartialEq, Eq)]
enum Wait {
    /// A request's head (the connection is new, or bytes came after it went idle).
    Head(Instant),
    /// Anything: the connection is idle.
    Idle(Instant),
    /// Its requests: no connection deadline (the body timeout bounds their bodies).
    Busy,
}

impl ConnState {
    fn new(limits: Limits) -> Self {
        ConnState {
            limits,
            in_flight: AtomicUsize::new(0),
            // A new connection is opened to send a request: its head is awaited at once.
            heard: AtomicBool::new(true),
            since: Mutex::new(Instant::now()),
            changed: Notify::new(),
        }
    }

    fn since(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.since.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait(&self) -> Wait {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Wait::Busy;
        }
        let since = *self.since();
        if self.heard.load(Ordering::Acquire) {
            Wait::Head(since + self.limits.header_timeout)
        } else {
            Wait::Idle(since + self.limits.idle_timeout)
        }
    }

    /// Bytes arrived: if the connection was idle, the header timeout starts.
    fn heard(&self) {
        if !self.heard.load(Ordering::Relaxed) && self.in_flight.load(Ordering::Acquire) == 0 {
            let mut since = self.since();
            if !self.heard.swap(true, Ordering::AcqRel) {
                *since = Instant::now();
                drop(since);
                self.changed.notify_one();
            }
        }
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A response was sent whole (or abandoned): with none left, the connection is idle.
    fn request_ended(&self) {
        let mut since = self.since();
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            *since = Instant::now();
            self.heard.store(false, Ordering::Release);
            drop(since);
            self.changed.notify_one();
        }
    }
}

struct Connection {
    app: App,
    peer: SocketAddr,
    limits: Limits,
    state: Arc<ConnState>,
    /// Whether the accept loop waits for a slot.
    waiting: Arc<AtomicBool>,
    make_room: watch::Receiver<u64>,
    stop: watch::Receiver<bool>,
    builder: Arc<auto::Builder<TokioExecutor>>,
}

impl Connection {
    /// Serves the connection on `stream`, after a TLS handshake with `tls` (which must end
    /// within the header timeout) when given.
    async fn start(self, stream: tokio::net::TcpStream, tls: Option<tokio_rustls::TlsAcceptor>) {
        let Some(acceptor) = tls else { return self.run(stream).await };
        let deadline = *self.state.since() + self.limits.header_timeout;
        let peer = self.peer;
        match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => self.run(tls).await,
            Ok(Err(e)) => tracing::debug!(peer = %peer, error = %e, "TLS handshake failed"),
            Err(_) => tracing::debug!(peer = %peer, "TLS handshake timed out: connection closed"),
        }
    }

    async fn run<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(mut self, stream: S) {
        let io = TokioIo::new(Watched { inner: stream, state: self.state.clone() });
        let service = Service {
            app: self.app.clone(),
            peer: self.peer,
            limits: self.limits,
            state: self.state.clone(),
        };
        let conn = self
            .builder
            .serve_connection_with_upgrades(io, hyper_util::service::TowerToHyperService::new(service));
        tokio::pin!(conn);
        let mut closing = false;
        loop {
            let wait = self.state.wait();
            if !closing && matches!(wait, Wait::Idle(_)) && self.waiting.load(Ordering::Acquire) {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            let deadline = match wait {
                Wait::Head(at) | Wait::Idle(at) => at,
                Wait::Busy => Instant::now() + Duration::from_secs(86_400),
            };
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(peer = %self.peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                () = tokio::time::sleep_until(deadline) => match self.state.wait() {
                    Wait::Head(at) if at <= Instant::now() => {
                        // A client that has not sent a whole head in time: closed at once.
                        tracing::debug!(peer = %self.peer, "header timeout: connection closed");
                        return;
                    }
                    Wait::Idle(at) if at <= Instant::now() && !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ => {}
                },
                () = self.state.changed.notified() => {}
                Ok(()) = self.make_room.changed(), if !closing => {
                    if matches!(self.state.wait(), Wait::Idle(_)) {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
                Ok(()) = self.stop.changed(), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// The socket (or its TLS session), telling the connection's state when bytes arrive.
struct Watched<S> {
    inner: S,
    state: Arc<ConnState>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.heard();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// One connection's requests: the peer address for `ConnectInfo`, the early 413, the body
/// deadline and its 408, and the in-flight count.
#[derive(Clone)]
struct Service {
    app: App,
    peer: SocketAddr,
    limits: Limits,
    state: Arc<ConnState>,
}

impl tower::Service<Request<Incoming>> for Service {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let guard = InFlight::new(self.state.clone());
        let (peer, limits) = (self.peer, self.limits);
        // Two futures, each boxed at its own size: the router's requests do not carry room for
        // the gRPC method's, nor the other way round.
        match &self.app.rls {
            Some(rls) if req.uri().path() == tollgate_envoy::SHOULD_RATE_LIMIT_PATH => {
                let rls = rls.clone();
                Box::pin(respond(req, peer, limits, guard, move |req| async move {
                    let Ok(response) = rls.oneshot(req).await;
                    Ok(response.map(Body::new))
                }))
            }
            _ => {
                let router = self.app.router.clone();
                Box::pin(respond(req, peer, limits, guard, move |req| router.oneshot(req)))
            }
        }
    }
}

/// `req`'s answer from `app`, within the connection's bounds: the early 413, the body deadline
/// and its 408, the peer address for `ConnectInfo`, and `guard` counting it in flight.
async fn respond<F>(
    req: Request<Incoming>,
    peer: SocketAddr,
    limits: Limits,
    guard: InFlight,
    app: impl FnOnce(Request<Body>) -> F,
) -> Result<Response<Body>, Infallible>
where
    F: Future<Output = Result<Response<Body>, Infallible>>,
{
    let (mut parts, body) = req.into_parts();
    if let Some(max) = limits.max_body
        && declared_length(&parts.headers).is_some_and(|length| length > max as u64)
    {
        // Answered before the body is polled, so hyper sends no `100 Continue`, and closes the
        // connection rather than read the body it was told about.
        let mut response = Problem::too_large(max).into_response();
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        return Ok(guard.wrap(response));
    }
    parts.extensions.insert(ConnectInfo(peer));
    let timed_out = Arc::new(AtomicBool::new(false));
    let body =
        Deadline { inner: body, timeout: limits.body_timeout, sleep: None, timed_out: timed_out.clone() };
    let response = app(Request::from_parts(parts, Body::new(body))).await?;
    if timed_out.load(Ordering::Acquire) {
        return Ok(guard.wrap(request_timeout(limits.body_timeout)));
    }
    Ok(guard.wrap(response))
}

/// The Content-Length a request declares, if any (a malformed one is left to hyper, which
/// refuses it before we see the request).
fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// 408, for a body that did not arrive in time; the connection is closed after it.
fn request_timeout(after: Duration) -> Response<Body> {
    let problem = Problem::new(
        StatusCode::REQUEST_TIMEOUT,
        "request-timeout",
        "Request timeout",
        format!("the request body did not arrive within {after:?} ([server] body_timeout)"),
    );
    let mut response = problem.into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Counts a request as in flight until its response body is dropped (sent whole, or abandoned).
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn new(state: Arc<ConnState>) -> Self {
        state.request_started();
        InFlight(state)
    }

    fn wrap(self, response: Response<Body>) -> Response<Body> {
        response.map(|body| Body::new(Tracked { inner: body, _in_flight: self }))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

pin_project_lite::pin_project! {
    /// A response body that holds its request's [`InFlight`].
    struct Tracked {
        #[pin]
        inner: Body,
        _in_flight: InFlight,
    }
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Why a request body stopped.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within the body timeout")]
struct BodyTimeout;

pin_project_lite::pin_project! {
    /// A request body that fails `timeout` after it was first found waiting for bytes: the
    /// deadline is set then, once, and not moved by the bytes that arrive after. A body that is
    /// whole when it is first read (nearly every API call's) never starts a timer: no clock
    /// read, no timer entry, no allocation.
    struct Deadline {
        #[pin]
        inner: Incoming,
        timeout: Duration,
        sleep: Option<Pin<Box<Sleep>>>,
        timed_out: Arc<AtomicBool>,
    }
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(axum::BoxError::from)));
        }
        let timeout = *this.timeout;
        let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(sleep.as_mut().poll(cx));
        this.timed_out.store(true, Ordering::Release);
        Poll::Ready(Some(Err(BodyTimeout.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
