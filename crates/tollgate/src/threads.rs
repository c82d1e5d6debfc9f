//! Connection threads (`[server] connection_threads`): each an OS thread running its own
//! single-threaded Tokio runtime. The accept loop hands each new connection to the thread with
//! the fewest open, and the connection (its socket, its timers, its requests' handlers) stays
//! there for life.
//!
//! Why not Tokio's shared work-stealing runtime, where any worker may run any task: with two
//! cores, a third of the server's user time per request went to the two workers sharing cache
//! lines (a task's state, its socket's readiness, the run queues, every waker), which no count
//! of instructions shows (docs/benchmarks.md, "Where the servers' time goes on two cores").
//! Limitador's actix-web serves the same way: a thread per core, connections handed out.
//!
//! What a handler spawns runs on its connection's thread; work started at startup (Redis
//! connections, the policy sync, reloads) stays on the main runtime, whose wakers reach across.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Where connections are served: on threads of their own, or on the runtime that accepted them.
#[derive(Clone, Default)]
pub(crate) struct ConnectionThreads {
    threads: Arc<[Thread]>,
}

struct Thread {
    runtime: Handle,
    /// Connections served on this thread now.
    open: Arc<AtomicUsize>,
    /// Dropped (with the last clone of the set) to end the thread.
    _stop: oneshot::Sender<()>,
}

impl ConnectionThreads {
    /// Connections are served on the runtime that accepts them (Tokio's shared scheduler).
    pub(crate) fn shared() -> Self {
        Self::default()
    }

    /// What `[server] connection_threads` asks for.
    pub(crate) fn configured(count: tollgate_config::ConnectionThreadCount) -> std::io::Result<Self> {
        match NonZeroUsize::new(count.resolve()) {
            Some(count) => Self::start(count),
            None => Ok(Self::shared()),
        }
    }

    /// Starts `count` threads, named `tollgate-conn-N`. They end when the last clone of the set
    /// is dropped, dropping the connections still on them.
    pub(crate) fn start(count: NonZeroUsize) -> std::io::Result<Self> {
        let threads = (0..count.get()).map(Thread::start).collect::<std::io::Result<Vec<_>>>()?;
        Ok(ConnectionThreads { threads: threads.into() })
    }

    /// How many threads serve connections (0: the shared runtime does).
    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }

    /// Serves a connection: `serve(stream)` runs on the least busy thread (or, with none, as a
    /// task of the current runtime). Call within a Tokio runtime.
    pub(crate) fn spawn<F>(&self, stream: TcpStream, serve: impl FnOnce(TcpStream) -> F + Send + 'static)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Some(thread) = self.threads.iter().min_by_key(|t| t.open.load(Ordering::Relaxed)) else {
            tokio::spawn(serve(stream));
            return;
        };
        // The socket moves to the thread's own event loop: out of this runtime's, into that one's.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => return tracing::debug!(error = %e, "connection dropped: cannot hand it to its thread"),
        };
        let open = OpenCount::new(&thread.open);
        thread.runtime.spawn(async move {
            let _open = open;
            match TcpStream::from_std(stream) {
                Ok(stream) => serve(stream).await,
                Err(e) => tracing::debug!(error = %e, "connection dropped: its thread cannot watch it"),
            }
        });
    }
}

impl Thread {
    fn start(index: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new().name(format!("tollgate-conn-{index}")).spawn(move || {
            // Runs the tasks handed to it until told to stop; the runtime (with the tasks still
            // on it) is dropped here, outside any runtime, as Tokio requires.
            let _ = runtime.block_on(stopped);
        })?;
        Ok(Thread { runtime: handle, open: Arc::default(), _stop: stop })
    }
}

/// One connection in its thread's count, until dropped.
struct OpenCount(Arc<AtomicUsize>);

impl OpenCount {
    fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        OpenCount(Arc::clone(open))
    }
}

impl Drop for OpenCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections go to the thread with the fewest open, and run there (not on the runtime
    /// that accepted them); a thread's count drops when its connection ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_go_to_the_least_busy_thread_and_stay_there() {
        let threads = ConnectionThreads::start(NonZeroUsize::new(2).unwrap()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (names_tx, mut names) = tokio::sync::mpsc::unbounded_channel();
        let mut held = Vec::new();
        let mut releases = Vec::new();
        let mut ran_on = Vec::new();
        for _ in 0..4 {
            held.push(TcpStream::connect(addr).await.unwrap());
            let (stream, _) = listener.accept().await.unwrap();
            let (release, released) = oneshot::channel::<()>();
            releases.push(Some(release));
            let names_tx = names_tx.clone();
            threads.spawn(stream, move |stream| async move {
                names_tx.send(std::thread::current().name().map(str::to_owned)).unwrap();
                let _ = released.await;
                drop(stream);
            });
            ran_on.push(names.recv().await.unwrap().unwrap());
        }
        assert_eq!(ran_on, ["tollgate-conn-0", "tollgate-conn-1", "tollgate-conn-0", "tollgate-conn-1"]);
        let open: Vec<usize> = threads.threads.iter().map(|t| t.open.load(Ordering::Relaxed)).collect();
        assert_eq!(open, [2, 2]);
        // Thread 1's two connections end: the next goes there, though it is not first.
        for i in [1, 3] {
            releases[i].take().unwrap().send(()).unwrap();
        }
        while threads.threads[1].open.load(Ordering::Relaxed) != 0 {
            tokio::task::yield_now().await;
        }
        held.push(TcpStream::connect(addr).await.unwrap());
        let (stream, _) = listener.accept().await.unwrap();
        threads.spawn(stream, move |_| async move {
            names_tx.send(std::thread::current().name().map(str::to_owned)).unwrap();
        });
        assert_eq!(names.recv().await.unwrap().as_deref(), Some("tollgate-conn-1"));
        assert_eq!(threads.threads[0].open.load(Ordering::Relaxed), 2);
    }

    /// With no threads, a connection is a task of the accepting runtime.
    #[tokio::test]
    async fn the_shared_runtime_serves_when_there_are_no_threads() {
        let threads = ConnectionThreads::shared();
        assert_eq!(threads.len(), 0);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let (tx, rx) = oneshot::channel();
        let here = std::thread::current().id();
        threads.spawn(stream, move |_| async move {
            tx.send(std::thread::current().id()).unwrap();
        });
        assert_eq!(rx.await.unwrap(), here);
    }
}
