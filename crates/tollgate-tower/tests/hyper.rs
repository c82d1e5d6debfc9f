//! The layer around a plain hyper service (no axum): the server loop puts the peer address in
//! the request's extensions, as the crate documents.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tollgate_tower::TollgateLayer;
use tower::{ServiceBuilder, ServiceExt};

#[tokio::test]
async fn a_hyper_service_behind_the_layer() {
    let (limiter, _clock) = manual_limiter();
    let layer = TollgateLayer::builder(limiter).default_policy(per_minute("p", 2)).build().unwrap();
    let service = ServiceBuilder::new().layer(layer).service_fn(|_req: Request<Incoming>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = service.clone().map_request(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert::<SocketAddr>(peer);
                req
            });
            tokio::spawn(async move {
                let io = TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, TowerToHyperService::new(service))
                    .await;
            });
        }
    });
    let url = format!("http://{addr}/");
    let (a, b) = (client_from("127.0.0.1"), client_from("127.0.0.2"));
    let r = a.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(r.text().await.unwrap(), "hello");
    assert_eq!(status(&a, &url).await, 200);
    problem(a.get(&url).send().await.unwrap(), 429).await;
    // Keyed by peer address: another client is not affected.
    assert_eq!(status(&b, &url).await, 200);
}
