//! Every key extractor over real HTTP, including spoofing attempts: connections come from
//! different loopback addresses (127.0.0.2 is an untrusted client, 127.0.0.1 a trusted proxy).

mod common;

use std::net::SocketAddr;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use common::*;
use tollgate_tower::{
    ExtractError, ForwardedHeader, IpGrouping, Key, Rejection, TollgateLayer, TrustedProxies,
};

async fn layer_with(key: Key, limit: u64) -> String {
    let (limiter, _clock) = manual_limiter();
    let layer =
        TollgateLayer::builder(limiter).key(key).default_policy(per_minute("p", limit)).build().unwrap();
    serve(app(), layer).await
}

#[tokio::test]
async fn peer_ip_keys_each_address() {
    let base = layer_with(Key::peer_ip(), 1).await;
    let (a, b) = (client_from("127.0.0.1"), client_from("127.0.0.2"));
    assert_eq!(get(&a, &base).await, (200, "ip:127.0.0.1 p false false 0".into()));
    assert_eq!(status(&a, &base).await, 429);
    assert_eq!(get(&b, &base).await, (200, "ip:127.0.0.2 p false false 0".into()));
    // A forwarding header changes nothing for peer_ip.
    let r = b.get(&base).header("x-forwarded-for", "203.0.113.1").send().await.unwrap();
    assert_eq!(r.status(), 429);
}

#[tokio::test]
async fn ipv6_peers_are_grouped_by_prefix() {
    let (limiter, _clock) = manual_limiter();
    let layer = TollgateLayer::builder(limiter).default_policy(per_minute("p", 5)).build().unwrap();
    let Ok(base) = serve_on("[::1]:0".parse().unwrap(), app().layer(layer)).await else {
        eprintln!("no IPv6 loopback here; the grouping itself is unit-tested");
        return;
    };
    assert_eq!(get(&client_from("::1"), &base).await, (200, "ip:::/56 p false false 0".into()));
    let (limiter, _clock) = manual_limiter();
    let layer = TollgateLayer::builder(limiter)
        .key(Key::peer_ip_grouped(IpGrouping::new().ipv6_prefix(128)))
        .default_policy(per_minute("p", 5))
        .build()
        .unwrap();
    let base = serve_on("[::1]:0".parse().unwrap(), app().layer(layer)).await.unwrap();
    assert_eq!(get(&client_from("::1"), &base).await, (200, "ip:::1 p false false 0".into()));
}

#[tokio::test]
async fn forwarding_headers_count_only_from_trusted_proxies() {
    let proxies = TrustedProxies::parse(["127.0.0.1/32", "10.0.0.0/8"]).unwrap();
    let base = layer_with(Key::client_ip(proxies), 2).await;
    let (proxy, stranger) = (client_from("127.0.0.1"), client_from("127.0.0.2"));

    // An untrusted peer cannot choose its key, whatever it claims.
    for (i, claim) in ["203.0.113.1", "203.0.113.2", "198.51.100.9"].iter().enumerate() {
        let r =
            stranger.get(&base).header("x-forwarded-for", *claim).header("x-real-ip", *claim).send().await;
        let r = r.unwrap();
        assert_eq!(r.status(), if i < 2 { 200 } else { 429 });
        if i < 2 {
            assert_eq!(r.text().await.unwrap(), "ip:127.0.0.2 p false false 0");
        }
    }

    // Through the trusted proxy: the rightmost untrusted hop; the client's own forged entries
    // (left of it) are ignored, so varying them does not escape the limit.
    let via = |forged: &str| {
        proxy.get(&base).header("x-forwarded-for", format!("{forged}, 198.51.100.7, 10.1.2.3")).send()
    };
    let r = via("1.1.1.1").await.unwrap();
    assert_eq!(r.text().await.unwrap(), "ip:198.51.100.7 p false false 0");
    assert_eq!(via("2.2.2.2").await.unwrap().status(), 200);
    assert_eq!(via("3.3.3.3").await.unwrap().status(), 429);
    // Another client behind the same proxy has its own key.
    let r = proxy.get(&base).header("x-forwarded-for", "198.51.100.8").send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "ip:198.51.100.8 p false false 0");

    // Garbage appended by the trusted proxy itself is a 400, not a 500.
    let r = proxy.get(&base).header("x-forwarded-for", "not-an-address").send().await.unwrap();
    let body = problem(r, 400).await;
    assert!(body["detail"].as_str().unwrap().contains("x-forwarded-for"), "{body}");
}

#[tokio::test]
async fn forwarded_header_when_the_proxy_writes_it() {
    let proxies = TrustedProxies::parse(["127.0.0.1"]).unwrap().header(ForwardedHeader::Forwarded);
    let base = layer_with(Key::client_ip(proxies), 5).await;
    let proxy = client_from("127.0.0.1");
    let r = proxy
        .get(&base)
        .header("forwarded", r#"for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https"#)
        .header("x-forwarded-for", "7.7.7.7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "ip:2001:db8:cafe::/56 p false false 0");
}

#[tokio::test]
async fn api_keys_are_required_or_fall_back() {
    let base = layer_with(Key::header("x-api-key"), 1).await;
    let c = client();
    let body = problem(c.get(&base).send().await.unwrap(), 401).await;
    assert!(body["detail"].as_str().unwrap().contains("x-api-key"), "{body}");
    let r = c.get(&base).header("x-api-key", "k1").send().await.unwrap();
    let text = r.text().await.unwrap();
    assert!(text.starts_with("hdr:x-api-key:") && !text.contains("k1"), "{text}");
    assert_eq!(c.get(&base).header("x-api-key", "k1").send().await.unwrap().status(), 429);
    assert_eq!(c.get(&base).header("x-api-key", "k2").send().await.unwrap().status(), 200);

    // Anonymous callers fall back to their address; or a 400 when asked.
    let base = layer_with(Key::header("x-api-key").or(Key::peer_ip()), 1).await;
    assert_eq!(get(&c, &base).await, (200, "ip:127.0.0.1 p false false 0".into()));
    let base = layer_with(Key::bearer_token().reject_with(Rejection::BadRequest), 1).await;
    problem(c.get(&base).header("authorization", "Basic eDp5").send().await.unwrap(), 400).await;
    let r = c.get(&base).header("authorization", "Bearer t0ken").send().await.unwrap();
    assert!(r.text().await.unwrap().starts_with("bearer:"));
}

#[derive(Clone)]
struct User(String);

/// An authentication layer: `x-user` becomes a `User` in the request's extensions.
async fn authenticate(mut req: Request, next: Next) -> Response {
    if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
        let user = User(user.to_owned());
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

#[tokio::test]
async fn identities_from_an_earlier_layer() {
    let (limiter, _clock) = manual_limiter();
    let layer = TollgateLayer::builder(limiter)
        .key(Key::extension(|u: &User| u.0.clone()))
        .default_policy(per_minute("p", 1))
        .build()
        .unwrap();
    // axum: the last layer added runs first.
    let app = app().layer(layer).layer(middleware::from_fn(authenticate));
    let base = serve_on("127.0.0.1:0".parse().unwrap(), app).await.unwrap();
    let c = client();
    let body = problem(c.get(&base).send().await.unwrap(), 401).await;
    assert!(body["detail"].as_str().unwrap().contains("User"), "{body}");
    let r = c.get(&base).header("x-user", "alice").send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "id:alice p false false 0");
    assert_eq!(c.get(&base).header("x-user", "alice").send().await.unwrap().status(), 429);
    assert_eq!(c.get(&base).header("x-user", "bob").send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_global_key_is_shared_by_everyone() {
    let base = layer_with(Key::global(), 2).await;
    assert_eq!(get(&client_from("127.0.0.1"), &base).await, (200, "global p false false 0".into()));
    assert_eq!(status(&client_from("127.0.0.2"), &base).await, 200);
    assert_eq!(status(&client_from("127.0.0.3"), &base).await, 429);
}

#[tokio::test]
async fn a_closure_for_anything_else() {
    let tenant = Key::from_fn(|parts| {
        parts
            .uri
            .query()
            .and_then(|q| q.strip_prefix("tenant="))
            .map(str::to_owned)
            .ok_or_else(|| ExtractError::custom("pass ?tenant=NAME"))
    });
    let base = layer_with(tenant, 1).await;
    let c = client();
    assert_eq!(get(&c, &format!("{base}/?tenant=acme")).await, (200, "fn:acme p false false 0".into()));
    assert_eq!(status(&c, &format!("{base}/?tenant=acme")).await, 429);
    assert_eq!(status(&c, &format!("{base}/?tenant=umbrella")).await, 200);
    let body = problem(c.get(&base).send().await.unwrap(), 400).await;
    assert_eq!(body["detail"], "pass ?tenant=NAME");
}

#[tokio::test]
async fn no_peer_address_is_a_400_not_a_500() {
    // Served without ConnectInfo: the peer address is unknown.
    let (limiter, _clock) = manual_limiter();
    let layer = TollgateLayer::builder(limiter).default_policy(per_minute("p", 1)).build().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app().layer(layer)).await.unwrap() });
    let body = problem(client().get(format!("http://{addr}/")).send().await.unwrap(), 400).await;
    assert!(body["detail"].as_str().unwrap().contains("ConnectInfo"), "{body}");
}
