//! The `decision` span of each check (docs/api.md, "Tracing"), with its outcome recorded when
//! the check ends.
//!
//! The span is a plain `tracing` span at DEBUG: the binary exports it over OpenTelemetry when
//! tracing is on, and otherwise no subscriber wants DEBUG, so its callsite is disabled. The
//! limiter's public checks return a [`Traced`] future rather than awaiting an inner one, so that
//! a check with tracing off is one future, moved as before, not a future inside another.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tracing::Span;
use tracing::instrument::Instrumented;

use crate::limiter::LimitError;

/// What a finished check records: its outcome (`allowed`, `denied`, `shadow_denied`) and
/// whether it was degraded.
pub(crate) type Outcome<T> = fn(&T) -> (&'static str, bool);

pin_project_lite::pin_project! {
    /// A check running in its span, recording its outcome on the span when it ends.
    pub(crate) struct Traced<F, T> {
        #[pin]
        inner: Instrumented<F>,
        outcome: Outcome<T>,
    }
}

impl<F, T> Traced<F, T>
where
    F: Future<Output = Result<T, LimitError>>,
{
    pub(crate) fn new(span: Span, check: F, outcome: Outcome<T>) -> Self {
        use tracing::Instrument as _;
        Traced { inner: check.instrument(span), outcome }
    }
}

impl<F, T> Future for Traced<F, T>
where
    F: Future<Output = Result<T, LimitError>>,
{
    type Output = Result<T, LimitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let result = ready!(this.inner.as_mut().poll(cx));
        let span = this.inner.span();
        if !span.is_disabled() {
            match &result {
                Ok(answer) => {
                    let (decision, degraded) = (this.outcome)(answer);
                    span.record("tollgate.decision", decision);
                    span.record("tollgate.degraded", degraded);
                }
                Err(e) => {
                    let kind = match e {
                        LimitError::Invalid(_) => "invalid",
                        LimitError::Unavailable(_) => "unavailable",
                    };
                    span.record("error.type", kind);
                    span.record("otel.status_code", "ERROR");
                }
            }
        }
        Poll::Ready(result)
    }
}
