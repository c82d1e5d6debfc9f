//! Coalescing: concurrent operations from many callers decided in one script call.
//!
//! Callers hand their operation to one collector task. The collector takes a free call slot
//! (one per connection), then everything queued at that moment (up to the batch size), and
//! sends it as one script call in which each operation is a group of its own, so each is
//! decided exactly as if alone. Nothing lingers: at light load an operation finds a free slot
//! and goes alone at once; under load, operations queue while every slot is busy and leave
//! together, so Redis pays a call's fixed costs (the call itself, `TIME`, defining the
//! script's functions) once per batch instead of once per decision.

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tollgate_core::{Decision, Error, Lease, LeaseId, Operation, Part, RuleSet};

use crate::Client;

/// Operations waiting for the collector, at most; beyond, callers wait to enqueue (their own
/// timeout still bounds the wait).
const QUEUE: usize = 4096;

/// An [`Operation`] that owns its lease, so it can wait in a queue.
enum OwnedOp {
    Check(u64),
    Acquire(u64, LeaseId),
    Refund(u64),
    Release(Lease),
}

impl OwnedOp {
    fn of(op: Operation<'_>) -> Self {
        match op {
            Operation::Check { cost } => OwnedOp::Check(cost),
            Operation::Acquire { cost, lease } => OwnedOp::Acquire(cost, lease.clone()),
            Operation::Refund { amount } => OwnedOp::Refund(amount),
            Operation::Release { lease } => OwnedOp::Release(lease.clone()),
        }
    }

    fn as_op(&self) -> Operation<'_> {
        match self {
            OwnedOp::Check(cost) => Operation::Check { cost: *cost },
            OwnedOp::Acquire(cost, lease) => Operation::Acquire { cost: *cost, lease },
            OwnedOp::Refund(amount) => Operation::Refund { amount: *amount },
            OwnedOp::Release(lease) => Operation::Release { lease },
        }
    }
}

struct Job {
    key: Box<str>,
    rules: RuleSet,
    op: OwnedOp,
    reply: oneshot::Sender<Result<Decision, Error>>,
}

/// The callers' side of the collector task; dropping it ends the task.
pub(crate) struct Coalescer {
    queue: mpsc::Sender<Job>,
    client: Arc<Client>,
    max_parts: usize,
}

impl Coalescer {
    /// Starts the collector task (within a Tokio runtime).
    pub(crate) fn start(client: Arc<Client>, max_parts: usize) -> Self {
        let (queue, jobs) = mpsc::channel(QUEUE);
        let slots = Arc::new(Semaphore::new(client.connections.call_slots()));
        tokio::spawn(collect(Arc::clone(&client), jobs, slots, max_parts));
        Coalescer { queue, client, max_parts }
    }

    pub(crate) fn max_parts(&self) -> usize {
        self.max_parts
    }

    /// Runs one (validated) operation in the next batch, within the backend's timeout.
    pub(crate) async fn execute(
        &self,
        key: &str,
        rules: &RuleSet,
        op: Operation<'_>,
    ) -> Result<Decision, Error> {
        let timeout = self.client.timeout;
        let (reply, answer) = oneshot::channel();
        let job = Job { key: key.into(), rules: rules.clone(), op: OwnedOp::of(op), reply };
        let sent = tokio::time::timeout(timeout, async {
            self.queue
                .send(job)
                .await
                .map_err(|_| Error::Backend("the Redis batch collector has stopped".into()))?;
            answer.await.map_err(|_| Error::Backend("a Redis batch was dropped before it answered".into()))?
        });
        sent.await.unwrap_or(Err(Error::Timeout(timeout)))
    }
}

/// Collects queued jobs into batches, one script call per free connection slot.
async fn collect(
    client: Arc<Client>,
    mut jobs: mpsc::Receiver<Job>,
    slots: Arc<Semaphore>,
    max_parts: usize,
) {
    while let Some(first) = jobs.recv().await {
        // Wait for a slot first: jobs arriving meanwhile join this batch.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        let mut batch = vec![first];
        while batch.len() < max_parts {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // Callers that gave up (timed out) need no answer; skip their work.
        batch.retain(|job| !job.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let client = Arc::clone(&client);
        tokio::spawn(async move {
            let _slot = slot;
            run(&client, batch).await;
        });
    }
}

/// One script call for `batch`, each job its own group; every caller gets its answer.
async fn run(client: &Client, batch: Vec<Job>) {
    // Each job its own group: coalesced callers are never all or nothing together.
    let parts: Vec<Part<'_>> = (0u32..)
        .zip(&batch)
        .map(|(group, job)| Part::operation(&job.key, &job.rules, job.op.as_op()).in_group(group))
        .collect();
    match client.run(&parts).await {
        Ok(decisions) => {
            for (job, decision) in batch.into_iter().zip(decisions) {
                let _ = job.reply.send(Ok(decision));
            }
        }
        Err(e) => {
            // One failure answers the whole batch; errors are not Clone, so each caller gets
            // the same kind with the message.
            for job in batch {
                let _ = job.reply.send(Err(copy(&e)));
            }
        }
    }
}

fn copy(e: &Error) -> Error {
    match e {
        Error::Timeout(d) => Error::Timeout(*d),
        Error::Unavailable(source) => Error::Unavailable(source.to_string().into()),
        other => Error::Backend(other.to_string().into()),
    }
}
