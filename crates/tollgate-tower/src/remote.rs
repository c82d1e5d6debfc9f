//! [`RemoteBackend`]: a running `tollgate serve` as the backend, over its HTTP decision API.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_core::{Backend, Decision, Error, Operation, Rule, RuleReport, RuleSet};

/// Most rules the server takes inline in one request.
pub const MAX_REMOTE_RULES: usize = 16;

/// A [`Backend`] that asks a running `tollgate serve` (`POST /v1/check` and `/v1/reset` with
/// the rules inline), so several services share its counters without a Redis of their own.
///
/// The server's 200 and 429 are decisions; a connection failure, a timeout or a 5xx is a
/// backend failure, answered by the [`Limiter`](tollgate_limiter::Limiter)'s failure policy.
/// Checks only: rule sets with a concurrency rule (leases) and refunds are refused with
/// [`Error::Backend`], as are sets of more than [`MAX_REMOTE_RULES`] rules.
///
/// ```no_run
/// use std::sync::Arc;
/// use tollgate_limiter::{FailurePolicy, Limiter, LimiterSettings};
/// use tollgate_tower::RemoteBackend;
///
/// let backend = RemoteBackend::new("http://127.0.0.1:8080");
/// let settings = LimiterSettings { on_failure: FailurePolicy::Local, ..Default::default() };
/// let limiter = Limiter::new(Arc::new(backend), "remote", settings);
/// ```
#[derive(Clone, Debug)]
pub struct RemoteBackend {
    client: reqwest::Client,
    base: String,
    timeout: Duration,
}

#[derive(Serialize)]
struct CheckBody<'a> {
    key: &'a str,
    limits: Vec<&'a Rule>,
    cost: u64,
}

#[derive(Serialize)]
struct ResetBody<'a> {
    key: &'a str,
    limits: Vec<&'a Rule>,
}

#[derive(Deserialize)]
struct DecisionBody {
    rules: Vec<RuleBody>,
}

#[derive(Deserialize)]
struct RuleBody {
    allowed: bool,
    remaining: u64,
    reset_after_ms: u64,
    retry_after_ms: u64,
}

fn unsupported(what: &str) -> Error {
    Error::Backend(format!("{what} is not supported by the remote backend").into())
}

impl RemoteBackend {
    /// The server at `base_url` (`http://host:port`), with a 250 ms timeout per call.
    pub fn new(base_url: impl Into<String>) -> Self {
        let base = base_url.into().trim_end_matches('/').to_owned();
        RemoteBackend { client: reqwest::Client::new(), base, timeout: Duration::from_millis(250) }
    }

    /// The longest a call may take before it counts as a failure.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Uses `client` (for TLS settings, proxies, connection pooling shared with the app).
    pub fn with_client(mut self, client: reqwest::Client) -> Self {
        self.client = client;
        self
    }

    fn failure(&self, e: reqwest::Error) -> Error {
        if e.is_timeout() { Error::Timeout(self.timeout) } else { Error::Unavailable(Box::new(e)) }
    }

    async fn post(&self, path: &str, body: &impl Serialize) -> Result<reqwest::Response, Error> {
        let request = self.client.post(format!("{}{path}", self.base)).json(body).timeout(self.timeout);
        let response = request.send().await.map_err(|e| self.failure(e))?;
        let status = response.status();
        if status.is_success() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Ok(response);
        }
        let text = response.text().await.unwrap_or_default();
        let message = format!("{path} answered {status}: {text}");
        Err(if status.is_server_error() {
            Error::Unavailable(message.into())
        } else {
            Error::Backend(message.into())
        })
    }

    async fn check(&self, key: &str, rules: &RuleSet, cost: u64) -> Result<Decision, Error> {
        if rules.len() > MAX_REMOTE_RULES {
            return Err(unsupported("a rule set of more than 16 rules"));
        }
        let body = CheckBody { key, limits: rules.rules().collect(), cost };
        let response = self.post("/v1/check", &body).await?;
        let body: DecisionBody = response.json().await.map_err(|e| self.failure(e))?;
        let ms = Duration::from_millis;
        let reports = body.rules.iter().map(|r| RuleReport {
            allowed: r.allowed,
            remaining: r.remaining,
            reset_after: ms(r.reset_after_ms),
            retry_after: ms(r.retry_after_ms),
        });
        Decision::from_reports(rules, reports).ok_or_else(|| {
            let message =
                format!("the server answered {} rule outcomes for {} rules", body.rules.len(), rules.len());
            Error::Backend(message.into())
        })
    }
}

#[async_trait::async_trait]
impl Backend for RemoteBackend {
    async fn execute(&self, key: &str, rules: &RuleSet, op: Operation<'_>) -> Result<Decision, Error> {
        match op {
            Operation::Check { cost } => self.check(key, rules, cost).await,
            // Without concurrency rules, an acquire is a check and a release a peek.
            Operation::Acquire { cost, .. } if !rules.has_concurrency() => self.check(key, rules, cost).await,
            Operation::Release { .. } if !rules.has_concurrency() => self.check(key, rules, 0).await,
            Operation::Acquire { .. } | Operation::Release { .. } => Err(unsupported("a concurrency lease")),
            Operation::Refund { .. } => Err(unsupported("a refund")),
        }
    }

    async fn reset(&self, key: &str, rules: &RuleSet) -> Result<(), Error> {
        self.post("/v1/reset", &ResetBody { key, limits: rules.rules().collect() }).await.map(drop)
    }

    async fn ping(&self) -> Result<(), Error> {
        let request = self.client.get(format!("{}/healthz", self.base)).timeout(self.timeout);
        let response = request.send().await.map_err(|e| self.failure(e))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(Error::Unavailable(format!("/healthz answered {}", response.status()).into()))
        }
    }
}
