//! Tollgate's HTTP vocabulary, shared by the HTTP API (`tollgate-server`), the tower layer
//! (`tollgate-tower`) and the proxy, so that each answers alike:
//!
//! - [`headers`]: the rate-limit headers of a decision (`X-RateLimit-*`, `Retry-After`, the
//!   IETF draft's `RateLimit-Policy` and `RateLimit`), and [`ResetHeader`], how
//!   `X-RateLimit-Reset` is written;
//! - [`Problem`]: the one RFC 9457 `application/problem+json` error, with its gRPC status;
//! - `extract` (feature `axum`): JSON body, path and query extractors whose rejections are
//!   problems naming the field at fault, for the server's and Envoy's JSON routes.
//!
//! Knows nothing of routes, policies or backends; depends on the engine only for its decisions.

#[cfg(feature = "axum")]
pub mod extract;
pub mod headers;
pub mod problem;

pub use headers::{FixedHeaders, HeaderSet, ResetHeader};
pub use problem::Problem;
