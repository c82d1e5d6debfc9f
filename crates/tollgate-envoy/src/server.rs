//! The gRPC server of [`EnvoyService`]: envoy-types' generated server, except for the status of
//! a request that never became a message, and a direct path for the common call.
//!
//! tonic answers INTERNAL when it cannot turn a request's body into a `RateLimitRequest` (bytes
//! that do not parse as protobuf, invalid UTF-8 in a string field, no message at all), as gRPC's
//! status code guide has it for a server that cannot parse what it got. For a rate-limit
//! service that reads as a fault of its own, which it is not: Tollgate answers INVALID_ARGUMENT,
//! the caller's fault, as it does for every other bad request. INTERNAL that the service itself
//! returns (an engine failure) is left alone: the request carries a marker that the service
//! sets when it is reached, and only a request that never reached it is re-labelled.
//!
//! The direct path: an uncompressed `ShouldRateLimit` whose body is exactly one message that
//! decodes is decoded from the body's bytes and answered with one pre-sized frame and the OK
//! trailers, without tonic's per-call codec (two 8 KiB buffers, a boxed body stream, a copy of
//! the message in and out). Everything else (compression, a message over tonic's 4 MiB limit,
//! bytes that do not decode, more than one message, request trailers, a body that fails) is
//! handed to the generated server with the bytes read so far put back in front of the rest, so
//! its answer is tonic's own.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::BodyExt;
use prost::Message;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer, SERVICE_NAME,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::metadata::GRPC_CONTENT_TYPE;
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
    /// The service the generated server holds too, for the direct path.
    service: Arc<Marking<T>>,
    generated: RateLimitServiceServer<Marking<T>>,
}

impl<T> Clone for EnvoyServer<T> {
    fn clone(&self) -> Self {
        EnvoyServer { service: self.service.clone(), generated: self.generated.clone() }
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
        let service = Arc::new(Marking(service));
        EnvoyServer { generated: RateLimitServiceServer::from_arc(service.clone()), service }
    }
}

impl<T> NamedService for EnvoyServer<T> {
    const NAME: &'static str = SERVICE_NAME;
}

impl<T, B> Service<http::Request<B>> for EnvoyServer<T>
where
    T: RateLimitService,
    B: Body + Send + Unpin + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<http::Request<B>>::poll_ready(&mut self.generated, cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() == SHOULD_RATE_LIMIT_PATH && !request.headers().contains_key(GRPC_ENCODING) {
            let server = self.clone();
            return Box::pin(async move { Ok(server.unary(request).await) });
        }
        self.generated_call(request)
    }
}

/// The request header naming a message's compression; without it messages are uncompressed.
const GRPC_ENCODING: &str = "grpc-encoding";

/// tonic's default limit on a received message, past which it answers OUT_OF_RANGE.
const MAX_MESSAGE: usize = 4 << 20;

/// The length prefix of a gRPC message: a compressed flag and a big-endian length.
const PREFIX: usize = 5;

impl<T: RateLimitService> EnvoyServer<T> {
    /// The generated server's answer to `request`, INTERNAL re-labelled for a request that never
    /// reached the service.
    fn generated_call<B>(
        &mut self,
        mut request: http::Request<B>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible>
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
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

    /// `request` (to `ShouldRateLimit`, uncompressed) answered directly when its body is one
    /// message that decodes, else by the generated server (see the [module docs](self)).
    async fn unary<B>(mut self, request: http::Request<B>) -> http::Response<tonic::body::Body>
    where
        B: Body + Send + Unpin + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        let (parts, mut body) = request.into_parts();
        let mut read = Read::default();
        let rest = loop {
            match body.frame().await {
                None => break Rest::Done,
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(mut data) => {
                        read.push(data.copy_to_bytes(data.remaining()));
                        if read.past_one_message() {
                            // Kept to what tonic would hold: the rest is its to read.
                            break Rest::Body(body);
                        }
                    }
                    Err(frame) => {
                        break frame.into_trailers().map_or(Rest::Done, Rest::Trailers);
                    }
                },
                Some(Err(e)) => break Rest::Error(e.into()),
            }
        };
        let message = match (&rest, read.message()) {
            (Rest::Done, Some(message)) => RateLimitRequest::decode(message).ok(),
            _ => None,
        };
        let Some(message) = message else {
            let replay = Replay { read: Some(read.into_bytes()), rest };
            let answer = self.generated_call(http::Request::from_parts(parts, replay));
            let Ok(response) = answer.await;
            return response;
        };
        let request = Request::from_http(http::Request::from_parts(parts, message));
        // Past the marker: a request answered here never needs re-labelling.
        match self.service.0.should_rate_limit(request).await {
            Ok(response) => answer(response),
            Err(status) => status.into_http(),
        }
    }
}

/// The OK answer of `response`: its metadata less gRPC's reserved headers, the message in one
/// frame, and `grpc-status: 0` in the trailers, as tonic sends it.
fn answer(response: Response<RateLimitResponse>) -> http::Response<tonic::body::Body> {
    let (metadata, message, extensions) = response.into_parts();
    let mut headers = metadata.into_headers();
    for reserved in ["te", "grpc-message", "grpc-message-type", "grpc-status"] {
        headers.remove(reserved);
    }
    headers.insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
    let length = message.encoded_len();
    let mut frame = BytesMut::with_capacity(PREFIX + length);
    frame.put_u8(0);
    // The service's answers are a few hundred bytes; one over 4 GiB cannot be made.
    frame.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    message.encode_raw(&mut frame);
    let mut trailers = http::HeaderMap::with_capacity(1);
    trailers.insert(Status::GRPC_STATUS, http::HeaderValue::from_static("0"));
    let body = OneMessage { frame: Some(frame.freeze()), trailers: Some(trailers) };
    let mut answer = http::Response::new(tonic::body::Body::new(body));
    *answer.version_mut() = http::Version::HTTP_2;
    *answer.headers_mut() = headers;
    *answer.extensions_mut() = extensions;
    answer
}

/// The bytes of a request body read so far: the first chunk as it came (a message usually
/// arrives in one DATA frame), copied together only when there are more.
#[derive(Default)]
struct Read {
    first: Bytes,
    more: Option<BytesMut>,
}

impl Read {
    fn push(&mut self, data: Bytes) {
        if self.first.is_empty() {
            self.first = data;
        } else if !data.is_empty() {
            let more = self.more.get_or_insert_with(|| BytesMut::from(&self.first[..]));
            more.extend_from_slice(&data);
        }
    }

    fn bytes(&self) -> &[u8] {
        self.more.as_deref().unwrap_or(&self.first)
    }

    /// The length the first message's prefix declares, once it has arrived.
    fn declared(&self) -> Option<usize> {
        let prefix = self.bytes().get(..PREFIX)?;
        Some(u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize)
    }

    /// Whether the bytes are more than one message, or declare one over tonic's limit.
    fn past_one_message(&self) -> bool {
        self.declared().is_some_and(|length| length > MAX_MESSAGE || self.bytes().len() > PREFIX + length)
    }

    /// The message, when the bytes are exactly one uncompressed message.
    fn message(&self) -> Option<&[u8]> {
        let bytes = self.bytes();
        let flag = *bytes.first()?;
        (flag == 0 && self.declared()? == bytes.len() - PREFIX).then(|| &bytes[PREFIX..])
    }

    fn into_bytes(self) -> Bytes {
        self.more.map_or(self.first, BytesMut::freeze)
    }
}

/// What followed the bytes read, when the direct path gave up.
enum Rest<B: Body> {
    /// The body ended.
    Done,
    /// The body's trailers, which ended it.
    Trailers(http::HeaderMap),
    /// The unread rest of the body.
    Body(B),
    /// The body failed.
    Error(StdError),
}

/// A request body replayed for the generated server: the bytes read, then what followed them.
struct Replay<B: Body> {
    read: Option<Bytes>,
    rest: Rest<B>,
}

impl<B> Body for Replay<B>
where
    B: Body + Unpin,
    B::Error: Into<StdError>,
{
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        let this = self.get_mut();
        if let Some(read) = this.read.take().filter(|read| !read.is_empty()) {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        match std::mem::replace(&mut this.rest, Rest::Done) {
            Rest::Done => Poll::Ready(None),
            Rest::Trailers(trailers) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Rest::Error(e) => Poll::Ready(Some(Err(e))),
            Rest::Body(mut body) => {
                let frame = Pin::new(&mut body).poll_frame(cx).map(|frame| {
                    frame.map(|frame| match frame {
                        Ok(frame) => Ok(frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))),
                        Err(e) => Err(e.into()),
                    })
                });
                if !matches!(frame, Poll::Ready(None)) {
                    this.rest = Rest::Body(body);
                }
                frame
            }
        }
    }
}

/// A response body of one frame and its trailers.
struct OneMessage {
    frame: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl Body for OneMessage {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = match self.frame.take() {
            Some(frame) => Frame::data(frame),
            None => match self.trailers.take() {
                Some(trailers) => Frame::trailers(trailers),
                None => return Poll::Ready(None),
            },
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.frame.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.frame.as_ref().map_or(0, |frame| frame.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::Full;

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

    /// Records, per call, whether the request came through tonic (it carries the marker) and
    /// the metadata `x-trailer` it had; answers a response with something in it.
    #[derive(Clone, Default)]
    struct Recording(Arc<std::sync::Mutex<Vec<Call>>>);

    /// Whether a call came through tonic, and its `x-trailer` metadata.
    type Call = (bool, Option<String>);

    #[tonic::async_trait]
    impl RateLimitService for Recording {
        async fn should_rate_limit(
            &self,
            request: Request<RateLimitRequest>,
        ) -> Result<Response<RateLimitResponse>, Status> {
            let through_tonic = request.extensions().get::<Reached>().is_some();
            let trailer = request.metadata().get("x-trailer").map(|v| v.to_str().unwrap().to_owned());
            self.0.lock().unwrap().push((through_tonic, trailer));
            let domain = &request.get_ref().domain;
            if domain == "fail" {
                return Err(Status::unavailable("backend down"));
            }
            let mut response = Response::new(RateLimitResponse {
                overall_code: 2,
                raw_body: domain.as_bytes().to_vec(),
                ..RateLimitResponse::default()
            });
            response.metadata_mut().insert("x-answered", "yes".parse().unwrap());
            Ok(response)
        }
    }

    /// A whole answer: headers but the date, the body's data, and the trailers.
    type Answer = (http::StatusCode, http::HeaderMap, Vec<u8>, http::HeaderMap);

    /// A piece of a request body.
    #[derive(Clone)]
    enum Part {
        Data(Vec<u8>),
        Trailers(http::HeaderMap),
        Fail,
    }

    /// The answer to a body of `parts`, sent with or without `grpc-encoding: identity` (which
    /// only tonic's path takes).
    async fn answer_to<T: RateLimitService>(
        server: &mut EnvoyServer<T>,
        parts: Vec<Part>,
        identity: bool,
    ) -> Answer {
        let frames = parts.into_iter().map(|part| match part {
            Part::Data(bytes) => Ok(Frame::data(Bytes::from(bytes))),
            Part::Trailers(trailers) => Ok(Frame::trailers(trailers)),
            Part::Fail => Err(Status::cancelled("gone")),
        });
        let body = http_body_util::StreamBody::new(tokio_stream::iter(frames));
        let mut request = http::Request::builder()
            .method("POST")
            .uri(format!("http://tollgate{SHOULD_RATE_LIMIT_PATH}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if identity {
            request = request.header(GRPC_ENCODING, "identity");
        }
        let response = server.call(request.body(tonic::body::Body::new(body)).unwrap()).await.unwrap();
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap_or_default();
        (parts.status, parts.headers, collected.to_bytes().to_vec(), trailers)
    }

    fn data(bytes: &[u8]) -> Part {
        Part::Data(bytes.to_vec())
    }

    #[tokio::test]
    async fn the_direct_path_answers_as_tonic_does_and_leaves_it_the_rest() {
        let message =
            RateLimitRequest { domain: "bench".into(), ..RateLimitRequest::default() }.encode_to_vec();
        let one = frame(&message);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-trailer", "late".parse().unwrap());
        let mut compressed = one.clone();
        compressed[0] = 1;
        let mut two = one.clone();
        two.extend_from_slice(&one);
        let fail =
            frame(&RateLimitRequest { domain: "fail".into(), ..RateLimitRequest::default() }.encode_to_vec());
        // (name, body, whether the direct path answers it)
        let cases: Vec<(&str, Vec<Part>, bool)> = vec![
            ("one message", vec![data(&one)], true),
            (
                "one message in three DATA frames",
                vec![data(&one[..2]), data(&one[2..7]), data(&one[7..])],
                true,
            ),
            ("empty DATA frames around it", vec![data(&[]), data(&one), data(&[])], true),
            ("the service's error", vec![data(&fail)], true),
            ("two messages", vec![data(&two)], false),
            ("a second message in its own frame", vec![data(&one), data(&one)], false),
            ("a byte past the message", vec![data(&one), data(&[0])], false),
            ("the compressed flag", vec![data(&compressed)], false),
            ("a cut prefix", vec![data(&one[..3])], false),
            ("a cut message", vec![data(&one[..one.len() - 1])], false),
            ("no body", vec![], false),
            ("bytes that do not decode", vec![data(&frame(&[0x0a, 0x05, b'e']))], false),
            ("request trailers", vec![data(&one), Part::Trailers(trailers)], false),
            ("a body that fails", vec![data(&one[..4]), Part::Fail], false),
            ("a body that fails after the message", vec![data(&one), Part::Fail], false),
        ];
        for (name, frames, direct) in cases {
            let calls = Recording::default();
            let mut server = EnvoyServer::new(calls.clone());
            let fast = answer_to(&mut server, frames.clone(), false).await;
            let slow = answer_to(&mut server, frames, true).await;
            assert_eq!(fast, slow, "{name}");
            let calls = calls.0.lock().unwrap().clone();
            // The direct path leaves no marker; whatever reached the service through tonic did.
            let reached: Vec<bool> = calls.iter().map(|(through_tonic, _)| *through_tonic).collect();
            if direct {
                assert_eq!(reached, [false, true], "{name}");
            } else {
                assert!(reached.iter().all(|through_tonic| *through_tonic), "{name}: {reached:?}");
            }
            if name == "request trailers" {
                assert!(calls.iter().all(|(_, trailer)| trailer.as_deref() == Some("late")), "{calls:?}");
            }
        }
    }

    #[tokio::test]
    async fn the_direct_answer_is_one_frame_the_metadata_and_status_ok() {
        let message = RateLimitRequest { domain: "d".into(), ..RateLimitRequest::default() }.encode_to_vec();
        let mut server = EnvoyServer::new(Recording::default());
        let (status, headers, body, trailers) =
            answer_to(&mut server, vec![data(&frame(&message))], false).await;
        assert_eq!(status, http::StatusCode::OK);
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["x-answered"], "yes");
        assert_eq!(trailers.len(), 1, "{trailers:?}");
        assert_eq!(trailers["grpc-status"], "0");
        let expected =
            RateLimitResponse { overall_code: 2, raw_body: b"d".to_vec(), ..RateLimitResponse::default() };
        assert_eq!(body, frame(&expected.encode_to_vec()));
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
