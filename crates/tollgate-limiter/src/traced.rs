//! The `decision` span of each check (docs/api.md, "Tracing"), with its outcome recorded when
//! the check ends.
//!
//! The span is a plain `tracing` span at DEBUG: the binary exports it over OpenTelemetry when
//! tracing is on; otherwise no subscriber wants DEBUG, its callsite is disabled, and the check
//! runs untraced: awaited directly, with no wrapper (a check's future is over a kilobyte, and
//! each wrapper that moves it costs a copy). Traced, the check is boxed, so that the wrapper
//! moves a pointer.

use std::future::Future;

use tracing::{Instrument as _, Span};

use crate::limiter::LimitError;
use crate::policy::Outcome;

/// What a finished check records: its [`Outcome`] and whether it was degraded.
pub(crate) type Describe<T> = fn(&T) -> (Outcome, bool);

/// Runs `check` in `span` (which is on), then records its outcome, or its error, on the span.
pub(crate) async fn traced<T>(
    span: Span,
    check: impl Future<Output = Result<T, LimitError>>,
    describe: Describe<T>,
) -> Result<T, LimitError> {
    let result = Box::pin(check).instrument(span.clone()).await;
    match &result {
        Ok(answer) => {
            let (decision, degraded) = describe(answer);
            span.record("tollgate.decision", decision.as_str());
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
    result
}
