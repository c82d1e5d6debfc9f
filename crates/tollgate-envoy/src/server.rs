//! The gRPC server of [`EnvoyService`]: envoy-types' generated server, except for the status of
//! a request that never became a message.
//!
//! tonic answers INTERNAL when it cannot turn a request's body into a `RateLimitRequest` (bytes
//! that do not parse as protobuf, invalid UTF-8 in a string field, no message at all), as gRPC's
//! status code guide has it for a server that cannot parse what it got. For a rate-limit
//! service that reads as a fault of its own, which it is not: Tollgate answers INVALID_ARGUMENT,
//! the caller's fault, as it does for every other bad request. INTERNAL that the service itself
//! returns (an engine failure) is left alone: the request carries a marker that the service
//! sets when it is reached, and only a request that never reached it is re-labelled.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer, SERVICE_NAME,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::NamedService;
use tonic::{Code, Request, Response, Status};

use crate::EnvoyService;

/// The path of `ShouldRateLimit`, the service's one method, for a server that routes it by
/// itself.
pub const SHOULD_RATE_LIMIT_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Set by the service when a request reaches it.
#[derive(Clone, Default)]
struct Reached(Arc<AtomicBool>);

/// A service marking each request it is handed as reached.
struct Marking<T>(T);

#[tonic::async_trait]
impl<T: RateLimitService> RateLimitService for Marking<T> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        if let Some(reached) = request.extensions().get::<Reached>() {
            reached.0.store(true, Ordering::Relaxed);
        }
        self.0.should_rate_limit(request).await
    }
}

/// `envoy.service.ratelimit.v3.RateLimitService` over gRPC, for
/// [`tonic::transport::Server::add_service`]: a request that does not decode gets
/// INVALID_ARGUMENT (see the [module docs](self)). Serves an [`EnvoyService`], or any other
/// implementation of the service.
pub struct EnvoyServer<T = EnvoyService> {
    generated: RateLimitServiceServer<Marking<T>>,
}

impl<T> Clone for EnvoyServer<T> {
    fn clone(&self) -> Self {
        EnvoyServer { generated: self.generated.clone() }
    }
}

impl<T> std::fmt::Debug for EnvoyServer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvoyServer").finish_non_exhaustive()
    }
}

impl<T: RateLimitService> EnvoyServer<T> {
    /// Serves `service`.
    pub fn new(service: T) -> Self {
        EnvoyServer { generated: RateLimitServiceServer::new(Marking(service)) }
    }
}

impl<T> NamedService for EnvoyServer<T> {
    const NAME: &'static str = SERVICE_NAME;
}

impl<T, B> Service<http::Request<B>> for EnvoyServer<T>
where
    T: RateLimitService,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<http::Request<B>>::poll_ready(&mut self.generated, cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let reached = Reached::default();
        request.extensions_mut().insert(reached.clone());
        let answer = self.generated.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            // A failure before the service is tonic's, and is sent trailers-only: the status
            // is in the headers.
            let internal = response
                .headers()
                .get(Status::GRPC_STATUS)
                .is_some_and(|code| code.as_bytes() == (Code::Internal as i32).to_string().as_bytes());
            if internal && !reached.0.load(Ordering::Relaxed) {
                response.headers_mut().insert(Status::GRPC_STATUS, (Code::InvalidArgument as i32).into());
                // tonic also keeps the status it sent beside the response: keep the two agreed.
                if let Some(status) = response.extensions_mut().get_mut::<Status>() {
                    *status = Status::invalid_argument(status.message().to_owned());
                }
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full};
    use tonic::codegen::Bytes;

    use super::*;

    /// Answers `Ok` to everything, or the status it was made with.
    struct Stub(Option<Code>);

    #[tonic::async_trait]
    impl RateLimitService for Stub {
        async fn should_rate_limit(
            &self,
            _: Request<RateLimitRequest>,
        ) -> Result<Response<RateLimitResponse>, Status> {
            match self.0 {
                Some(code) => Err(Status::new(code, "from the service")),
                None => Ok(Response::new(RateLimitResponse::default())),
            }
        }
    }

    /// The gRPC status the server answers `frames` (length-prefixed messages) with.
    async fn status<T: RateLimitService>(server: &mut EnvoyServer<T>, frames: Vec<u8>) -> (String, String) {
        let request = http::Request::builder()
            .method("POST")
            .uri("http://tollgate/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(Full::new(Bytes::from(frames))))
            .unwrap();
        let response = server.call(request).await.unwrap();
        let (parts, body) = response.into_parts();
        // Trailers-only answers carry the status in the headers; others in the trailers.
        let trailers = body.collect().await.unwrap().trailers().cloned().unwrap_or_default();
        let text = |name| {
            let value = parts.headers.get(name).or_else(|| trailers.get(name));
            value.map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default()
        };
        (text("grpc-status"), text("grpc-message"))
    }

    /// One uncompressed gRPC message.
    fn frame(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    #[test]
    fn the_method_path_is_the_generated_services() {
        assert_eq!(SHOULD_RATE_LIMIT_PATH, format!("/{SERVICE_NAME}/ShouldRateLimit"));
    }

    #[tokio::test]
    async fn requests_that_do_not_decode_are_invalid_arguments() {
        let mut server = EnvoyServer::new(Stub(None));
        // Field 1 (domain) of length 5 with 1 byte: truncated.
        let (code, message) = status(&mut server, frame(&[0x0a, 0x05, b'e'])).await;
        assert_eq!(code, "3", "{message}");
        assert!(message.contains("decode"), "{message}");
        // Invalid UTF-8 in a string field.
        assert_eq!(status(&mut server, frame(&[0x0a, 0x02, b'e', 0xff])).await.0, "3");
        // No message at all.
        assert_eq!(status(&mut server, Vec::new()).await.0, "3");
        // What decodes reaches the service.
        assert_eq!(status(&mut server, frame(&[0x0a, 0x01, b'e'])).await.0, "0");
        // A message over the size limit keeps tonic's own status, OUT_OF_RANGE.
        let big = frame(&vec![0; 5 << 20]);
        assert_eq!(status(&mut server, big).await.0, "11");
    }

    #[tokio::test]
    async fn internal_errors_of_the_service_stay_internal() {
        let mut server = EnvoyServer::new(Stub(Some(Code::Internal)));
        // grpc-message is percent-encoded.
        assert_eq!(
            status(&mut server, frame(&[0x0a, 0x01, b'e'])).await,
            ("13".into(), "from%20the%20service".into())
        );
        let mut server = EnvoyServer::new(Stub(Some(Code::Unavailable)));
        assert_eq!(status(&mut server, frame(&[0x0a, 0x01, b'e'])).await.0, "14");
    }
}
