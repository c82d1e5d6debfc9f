//! A TCP proxy of the tests' own, put between a client (Tollgate) and a server (Redis) to
//! inject network faults at run time: added latency, every connection dropped, new
//! connections refused, and a black hole that forwards nothing.
//!
//! Plain std threads (two per direction of each connection), so it works from any test,
//! async or not, without a runtime of its own; a test's few connections make that cheap.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Which way bytes flow through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the upstream server (requests).
    Upstream,
    /// From the upstream server back to the client (replies).
    Downstream,
}

/// A proxy on a free port of 127.0.0.1 forwarding to `127.0.0.1:<upstream port>`, stopped
/// (every connection closed) when dropped.
///
/// ```no_run
/// # use std::time::Duration;
/// # use tollgate_testkit::{FaultProxy, RedisServer};
/// let redis = RedisServer::start();
/// let proxy = FaultProxy::start(redis.port());
/// // Point the client at proxy.url() instead of redis.url(), then:
/// proxy.set_latency(Duration::from_millis(20)); // a round trip now takes 40 ms more
/// proxy.drop_all(); // every open connection closed at once
/// ```
pub struct FaultProxy {
    port: u16,
    faults: Arc<Faults>,
    acceptor: Option<JoinHandle<()>>,
}

/// What the proxy's handle and its threads share: where to forward, the faults switched on
/// now, counters, and the open connections.
struct Faults {
    upstream: SocketAddr,
    /// Added delay per direction, in microseconds (indexed by [`Direction`]).
    latency_us: [AtomicU64; 2],
    blackhole: AtomicBool,
    refusing: AtomicBool,
    stopping: AtomicBool,
    accepted: AtomicU64,
    forwarded: AtomicU64,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Connection>>>,
}

/// One proxied connection: handles to both sockets, so any of its threads (or
/// [`FaultProxy::drop_all`]) can close it, and the flag its threads watch.
struct Connection {
    client: TcpStream,
    server: TcpStream,
    closed: AtomicBool,
}

impl Connection {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

impl FaultProxy {
    /// Starts a proxy to `127.0.0.1:upstream_port`, forwarding faithfully until told otherwise.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub fn start(upstream_port: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("the fault proxy binds a loopback port");
        let port = listener.local_addr().expect("a bound address").port();
        let faults = Arc::new(Faults {
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            latency_us: [AtomicU64::new(0), AtomicU64::new(0)],
            blackhole: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        });
        let acceptor = {
            let faults = Arc::clone(&faults);
            std::thread::Builder::new()
                .name(format!("fault-proxy-{port}"))
                .spawn(move || accept_loop(&listener, &faults))
                .expect("the fault proxy's thread starts")
        };
        FaultProxy { port, faults, acceptor: Some(acceptor) }
    }

    /// The proxy's own port (clients connect here).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`: a Redis URL that goes through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Delays every chunk, in both directions, by `latency` from when the proxy read it (so a
    /// request-reply round trip takes twice `latency` more). Chunks in flight keep the delay
    /// they were read with; order is always kept.
    pub fn set_latency(&self, latency: Duration) {
        self.set_latency_towards(Direction::Upstream, latency);
        self.set_latency_towards(Direction::Downstream, latency);
    }

    /// Delays the chunks flowing one way only.
    pub fn set_latency_towards(&self, direction: Direction, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.faults.latency_us[direction as usize].store(micros, Ordering::Relaxed);
    }

    /// Closes every open connection now (both sides see the connection end). New connections
    /// are accepted as usual unless [`refuse`](Self::refuse) says otherwise.
    pub fn drop_all(&self) {
        for connection in self.faults.open.lock().unwrap_or_else(|e| e.into_inner()).values() {
            connection.close();
        }
    }

    /// While `on`, new connections are closed as soon as they are accepted: the upstream looks
    /// gone. Open connections are not touched (see [`drop_all`](Self::drop_all)).
    pub fn refuse(&self, on: bool) {
        self.faults.refusing.store(on, Ordering::Release);
    }

    /// While `on`, connections stay open (and new ones are accepted and connected upstream)
    /// but nothing is forwarded either way: bytes are held, not lost, and flow again, in
    /// order, when it is turned off (a partition that heals, as TCP would deliver them).
    pub fn blackhole(&self, on: bool) {
        self.faults.blackhole.store(on, Ordering::Release);
    }

    /// Connections accepted so far (refused ones included).
    pub fn connections_accepted(&self) -> u64 {
        self.faults.accepted.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn connections_open(&self) -> usize {
        self.faults.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Bytes delivered so far, both directions together.
    pub fn bytes_forwarded(&self) -> u64 {
        self.faults.forwarded.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.faults.stopping.store(true, Ordering::Release);
        // The acceptor blocks in accept(): a connection of our own wakes it to see `stopping`.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_secs(1),
        );
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        self.drop_all();
    }
}

fn accept_loop(listener: &TcpListener, faults: &Arc<Faults>) {
    for client in listener.incoming() {
        if faults.stopping.load(Ordering::Acquire) {
            return;
        }
        let Ok(client) = client else { continue };
        faults.accepted.fetch_add(1, Ordering::Relaxed);
        if faults.refusing.load(Ordering::Acquire) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        // Loopback connects at once or not at all; an upstream that is down closes the client.
        let Ok(server) = TcpStream::connect_timeout(&faults.upstream, Duration::from_secs(2)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        // Small messages (Redis commands) must not wait for Nagle's algorithm.
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        if let Err(e) = start_connection(faults, client, server) {
            eprintln!("fault proxy: cannot forward a connection: {e}");
        }
    }
}

fn start_connection(faults: &Arc<Faults>, client: TcpStream, server: TcpStream) -> std::io::Result<()> {
    let id = faults.next_id.fetch_add(1, Ordering::Relaxed);
    let connection = Arc::new(Connection {
        client: client.try_clone()?,
        server: server.try_clone()?,
        closed: AtomicBool::new(false),
    });
    faults.open.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Arc::clone(&connection));
    let ended = Arc::new(AtomicU64::new(0));
    let pipes = [
        (Direction::Upstream, client.try_clone()?, server.try_clone()?),
        (Direction::Downstream, server, client),
    ];
    for (direction, from, to) in pipes {
        let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
        let (shared_r, connection_r) = (Arc::clone(faults), Arc::clone(&connection));
        std::thread::Builder::new()
            .spawn(move || read_side(&shared_r, direction, from, &tx, &connection_r))?;
        let (faults, connection, ended) = (Arc::clone(faults), Arc::clone(&connection), Arc::clone(&ended));
        std::thread::Builder::new().spawn(move || {
            write_side(&faults, &rx, &to, &connection);
            // Once both directions are done, the connection is closed (which ends a reader
            // still waiting on its socket) and forgotten.
            if ended.fetch_add(1, Ordering::AcqRel) == 1 {
                connection.close();
                faults.open.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            }
        })?;
    }
    Ok(())
}

/// Reads chunks and hands them to the writer with the moment they are due.
fn read_side(
    faults: &Faults,
    direction: Direction,
    mut from: TcpStream,
    tx: &mpsc::Sender<(Instant, Vec<u8>)>,
    connection: &Connection,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return, // dropping `tx` tells the writer no more is coming
            Ok(n) => {
                let delay =
                    Duration::from_micros(faults.latency_us[direction as usize].load(Ordering::Relaxed));
                if connection.is_closed() || tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes each chunk when it is due (and the black hole is off); half-closes its side when
/// the reader saw the end, and closes the whole connection on an error.
fn write_side(
    faults: &Faults,
    rx: &mpsc::Receiver<(Instant, Vec<u8>)>,
    mut to: &TcpStream,
    connection: &Connection,
) {
    while let Ok((due, chunk)) = rx.recv() {
        let wait = due.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        while faults.blackhole.load(Ordering::Acquire) && !connection.is_closed() {
            std::thread::sleep(Duration::from_millis(2));
        }
        if connection.is_closed() || to.write_all(&chunk).is_err() {
            connection.close();
            return;
        }
        faults.forwarded.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port: each connection sends back what it reads.
    fn echo_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut reader = stream.try_clone().unwrap();
                    let mut writer = stream;
                    let _ = std::io::copy(&mut reader, &mut writer);
                });
            }
        });
        port
    }

    fn round_trip(stream: &mut TcpStream, message: &[u8]) -> (Vec<u8>, Duration) {
        let start = Instant::now();
        stream.write_all(message).unwrap();
        let mut reply = vec![0u8; message.len()];
        stream.read_exact(&mut reply).unwrap();
        (reply, start.elapsed())
    }

    fn connect(proxy: &FaultProxy) -> TcpStream {
        let stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream
    }

    #[test]
    fn bytes_pass_both_ways_unchanged() {
        let proxy = FaultProxy::start(echo_server());
        let mut stream = connect(&proxy);
        let message: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let (reply, _) = round_trip(&mut stream, &message);
        assert!(reply == message, "the echo came back changed");
        // The count follows the last write, which the echo's reader may see first.
        crate::redis_server::wait(Instant::now() + Duration::from_secs(5), "the count", || {
            proxy.bytes_forwarded() == 2 * message.len() as u64
        });
        assert_eq!((proxy.connections_accepted(), proxy.connections_open()), (1, 1));
    }

    #[test]
    fn latency_is_added_each_way() {
        let proxy = FaultProxy::start(echo_server());
        let mut stream = connect(&proxy);
        let (_, before) = round_trip(&mut stream, b"ping");
        proxy.set_latency(Duration::from_millis(50));
        let (reply, slow) = round_trip(&mut stream, b"ping");
        assert_eq!(reply, b"ping");
        // 50 ms each way; the upper bound only rules out a hang on a loaded machine.
        assert!(slow >= Duration::from_millis(100), "round trip {slow:?} (before: {before:?})");
        assert!(slow < Duration::from_secs(2), "round trip {slow:?}");
        proxy.set_latency_towards(Direction::Upstream, Duration::ZERO);
        let (_, one_way) = round_trip(&mut stream, b"ping");
        assert!(
            one_way >= Duration::from_millis(50) && one_way < Duration::from_millis(100) + slow,
            "{one_way:?}"
        );
        proxy.set_latency(Duration::ZERO);
        let (_, after) = round_trip(&mut stream, b"ping");
        assert!(after < Duration::from_millis(50), "no latency left: {after:?}");
    }

    #[test]
    fn drop_all_closes_open_connections_and_refuse_closes_new_ones() {
        let proxy = FaultProxy::start(echo_server());
        let mut streams = [connect(&proxy), connect(&proxy)];
        for stream in &mut streams {
            assert_eq!(round_trip(stream, b"x").0, b"x");
        }
        proxy.drop_all();
        for stream in &mut streams {
            let mut buf = [0u8; 1];
            // The proxy closed its side: the read ends (EOF, or a reset if our write raced it).
            assert!(matches!(stream.read(&mut buf), Ok(0) | Err(_)), "the connection is closed");
        }
        crate::redis_server::wait(Instant::now() + Duration::from_secs(5), "the threads to end", || {
            proxy.connections_open() == 0
        });

        proxy.refuse(true);
        let mut refused = connect(&proxy);
        let _ = refused.write_all(b"x");
        assert!(matches!(refused.read(&mut [0u8; 1]), Ok(0) | Err(_)), "a new connection is closed at once");
        proxy.refuse(false);
        let mut stream = connect(&proxy);
        assert_eq!(round_trip(&mut stream, b"again").0, b"again");
        assert_eq!(proxy.connections_accepted(), 4);
    }

    #[test]
    fn blackhole_holds_bytes_until_it_lifts() {
        let proxy = FaultProxy::start(echo_server());
        let mut stream = connect(&proxy);
        proxy.blackhole(true);
        stream.write_all(b"held").unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut buf = [0u8; 4];
        let err = stream.read(&mut buf).expect_err("nothing comes back through a black hole");
        assert!(matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{err}");
        // A new connection is accepted (and held) too.
        let _other = connect(&proxy);
        proxy.blackhole(false);
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"held");
        assert_eq!(proxy.connections_accepted(), 2);
    }
}
