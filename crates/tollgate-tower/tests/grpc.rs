//! Under tonic: a refused call is `RESOURCE_EXHAUSTED`, with the rate-limit headers as metadata.

mod common;

use common::*;
use tollgate_tower::{Key, TollgateLayer};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test]
async fn refused_grpc_calls_are_resource_exhausted() {
    let (limiter, _clock) = manual_limiter();
    // tonic puts its own connection info in the extensions, not a SocketAddr: a global key.
    let layer = TollgateLayer::builder(limiter)
        .key(Key::global())
        .default_policy(per_minute("grpc", 2))
        .build()
        .unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(health)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);

    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut client = HealthClient::new(channel);
    let request = || HealthCheckRequest { service: String::new() };
    let ok = client.check(request()).await.unwrap();
    assert_eq!(ok.metadata().get("x-ratelimit-remaining").unwrap(), "1");
    client.check(request()).await.unwrap();
    let status = client.check(request()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("grpc"), "{status:?}");
    let metadata = status.metadata();
    assert_eq!(metadata.get("x-ratelimit-remaining").unwrap(), "0");
    assert!(metadata.get("retry-after").unwrap().to_str().unwrap().parse::<u64>().unwrap() >= 1);
    assert!(metadata.get("ratelimit-policy").is_some());
}
