//! The layer in front of a real axum app over real HTTP (memory backend on a manual clock):
//! routes, headers, problem+json, preflight, CORS, shadow and delay.

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::Method;
use tollgate_core::{MemoryBackend, Period, Rule, RuleSet};
use tollgate_limiter::{LimiterSettings, Mode, OnLimit, Policy};
use tollgate_tower::{Cors, HeaderSet, Route, TollgateLayer};

#[tokio::test]
async fn routes_take_their_own_policy_by_pattern_and_method() {
    let (limiter, clock) = manual_limiter();
    let layer = TollgateLayer::builder(limiter)
        .default_policy(per_minute("default", 4))
        .route(Route::limit("/login", per_minute("login", 2)).methods([Method::POST]))
        .route(Route::limit("/api/{*rest}", per_minute("api", 3)))
        .route(Route::limit("/users/{id}", per_minute("user", 1)))
        .route(Route::exempt("/users/me"))
        .exempt("/healthz")
        .build()
        .unwrap();
    let base = serve(app(), layer).await;
    let c = client();
    let post = |path: &str| c.post(format!("{base}{path}")).send();

    assert_eq!(post("/login").await.unwrap().status(), 200);
    assert_eq!(post("/login").await.unwrap().status(), 200);
    assert_eq!(post("/login").await.unwrap().status(), 429);
    // GET /login is not the login route's method: the default policy takes it.
    let (s, body) = get(&c, &format!("{base}/login")).await;
    assert_eq!((s, body.as_str()), (200, "ip:127.0.0.1 default false false 0"));

    // One policy for every path under /api/, counted together.
    assert_eq!(status(&c, &format!("{base}/api/a")).await, 200);
    assert_eq!(status(&c, &format!("{base}/api/b/c")).await, 200);
    assert_eq!(status(&c, &format!("{base}/api/d")).await, 200);
    assert_eq!(status(&c, &format!("{base}/api/a")).await, 429);

    // A static segment beats the parameter, and exempt routes pass without headers.
    assert_eq!(status(&c, &format!("{base}/users/7")).await, 200);
    assert_eq!(status(&c, &format!("{base}/users/8")).await, 429);
    for _ in 0..10 {
        let r = c.get(format!("{base}/users/me")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("x-ratelimit-limit").is_none());
        assert_eq!(r.text().await.unwrap(), "unlimited");
        assert_eq!(status(&c, &format!("{base}/healthz")).await, 200);
    }

    // The default policy: three more (one was GET /login), then refused.
    for _ in 0..3 {
        assert_eq!(status(&c, &format!("{base}/other")).await, 200);
    }
    assert_eq!(status(&c, &format!("{base}/")).await, 429);

    // The next window admits again.
    clock.advance(Duration::from_secs(60));
    assert_eq!(post("/login").await.unwrap().status(), 200);
    assert_eq!(status(&c, &format!("{base}/")).await, 200);
}

#[tokio::test]
async fn without_a_default_policy_unmatched_routes_are_unlimited() {
    let (limiter, _clock) = manual_limiter();
    let layer =
        TollgateLayer::builder(limiter).route(Route::limit("/limited", per_minute("l", 1))).build().unwrap();
    let base = serve(app(), layer).await;
    let c = client();
    for _ in 0..5 {
        assert_eq!(get(&c, &format!("{base}/free")).await, (200, "unlimited".into()));
    }
    assert_eq!(status(&c, &format!("{base}/limited")).await, 200);
    assert_eq!(status(&c, &format!("{base}/limited")).await, 429);
}

#[tokio::test]
async fn headers_on_every_limited_answer_and_a_problem_on_429() {
    let (limiter, clock) = manual_limiter();
    let rules = RuleSet::new([
        Rule::fixed_window(2, Period::SECOND).named("second"),
        Rule::fixed_window(100, Period::HOUR).named("hour"),
    ])
    .unwrap();
    let layer =
        TollgateLayer::builder(limiter).default_policy(Policy::enforce("api", rules)).build().unwrap();
    let base = serve(app(), layer).await;
    let c = client();
    // Mid-second, so Retry-After (0.5 s) must round up to 1.
    clock.advance(Duration::from_millis(500));

    let r = c.get(format!("{base}/x")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-limit"), Some("2"));
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(header(&r, "x-ratelimit-reset"), Some("1"));
    assert_eq!(header(&r, "ratelimit-policy"), Some(r#""second";q=2;w=1, "hour";q=100;w=3600"#));
    assert!(header(&r, "ratelimit").unwrap().starts_with(r#""second";r=1;t=1, "hour";r=99;t="#));
    assert!(r.headers().get("retry-after").is_none());

    let r = c.get(format!("{base}/x")).send().await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));

    let r = c.get(format!("{base}/x")).send().await.unwrap();
    assert_eq!(header(&r, "retry-after"), Some("1"));
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    assert!(header(&r, "ratelimit").unwrap().starts_with(r#""second";r=0;t=1"#));
    let body = problem(r, 429).await;
    assert_eq!(body["policy"], "api");
    assert_eq!(body["title"], "Too many requests");
    assert!(body["detail"].as_str().unwrap().contains("retry in 1 s"), "{body}");
    // The problem type's own entry in the API's catalogue (the same answer comes from
    // `tollgate proxy`, whose clients never saw the layer's README section).
    assert_eq!(body["type"], "https://github.com/tollgate-rs/tollgate/blob/main/docs/api.md#rate-limited");
}

#[tokio::test]
async fn a_header_set_chooses_the_headers_written() {
    for (set, written, absent) in [
        (HeaderSet::Ietf, ["ratelimit-policy", "ratelimit"], ["x-ratelimit-limit", "x-ratelimit-remaining"]),
        (
            HeaderSet::Legacy,
            ["x-ratelimit-limit", "x-ratelimit-remaining"],
            ["ratelimit-policy", "ratelimit"],
        ),
    ] {
        let (limiter, _clock) = manual_limiter();
        let rules = RuleSet::new([Rule::fixed_window(1, Period::SECOND)]).unwrap();
        let layer = TollgateLayer::builder(limiter)
            .default_policy(Policy::enforce("api", rules))
            .headers(set)
            .build()
            .unwrap();
        let base = serve(app(), layer).await;
        let c = client();
        for status in [200, 429] {
            let r = c.get(format!("{base}/x")).send().await.unwrap();
            assert_eq!(r.status(), status);
            for name in written {
                assert!(r.headers().contains_key(name), "{set:?} {status}: {name} missing");
            }
            for name in absent {
                assert!(!r.headers().contains_key(name), "{set:?} {status}: {name} written");
            }
            assert_eq!(r.headers().contains_key("retry-after"), status == 429, "{set:?} {status}");
        }
    }
}

#[tokio::test]
async fn preflights_pass_unless_counted_and_429s_carry_cors_headers() {
    let (limiter, _clock) = manual_limiter();
    let layer = TollgateLayer::builder(limiter.clone())
        .default_policy(per_minute("p", 1))
        .cors(Cors::any_origin())
        .build()
        .unwrap();
    let base = serve(app(), layer).await;
    let c = client();
    let preflight = || {
        c.request(Method::OPTIONS, format!("{base}/x"))
            .header("origin", "https://app.example")
            .header("access-control-request-method", "POST")
            .send()
    };
    for _ in 0..5 {
        let r = preflight().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), "unlimited");
    }
    assert_eq!(status(&c, &format!("{base}/x")).await, 200);
    let r = c.get(format!("{base}/x")).header("origin", "https://app.example").send().await.unwrap();
    assert_eq!(header(&r, "access-control-allow-origin"), Some("*"));
    let exposed = header(&r, "access-control-expose-headers").unwrap();
    assert!(exposed.contains("retry-after") && exposed.contains("x-ratelimit-remaining"), "{exposed}");
    problem(r, 429).await;

    // Counted when asked, and a mirrored origin.
    let layer = TollgateLayer::builder(limiter)
        .default_policy(per_minute("q", 1))
        .exempt_preflight(false)
        .cors(Cors::mirror_origin().allow_credentials())
        .build()
        .unwrap();
    let base = serve(app(), layer).await;
    let preflight = || {
        c.request(Method::OPTIONS, format!("{base}/x"))
            .header("origin", "https://app.example")
            .header("access-control-request-method", "POST")
            .send()
    };
    assert_eq!(preflight().await.unwrap().status(), 200);
    let r = preflight().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "access-control-allow-origin"), Some("https://app.example"));
    assert_eq!(header(&r, "access-control-allow-credentials"), Some("true"));
    assert_eq!(header(&r, "vary"), Some("origin"));
}

#[tokio::test]
async fn shadow_mode_admits_and_tells_the_handler() {
    let (limiter, _clock) = manual_limiter();
    let policy = per_minute("trial", 1).with_mode(Mode::Shadow);
    let layer = TollgateLayer::builder(limiter).default_policy(policy).build().unwrap();
    let base = serve(app(), layer).await;
    let c = client();
    assert_eq!(get(&c, &format!("{base}/")).await, (200, "ip:127.0.0.1 trial false false 0".into()));
    for _ in 0..3 {
        let r = c.get(format!("{base}/")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
        assert!(r.headers().get("retry-after").is_none());
        assert_eq!(r.text().await.unwrap(), "ip:127.0.0.1 trial true false 0");
    }
}

#[tokio::test]
async fn delay_holds_a_request_until_it_fits() {
    // Real time here: the delay strategy sleeps. One request a second, held up to 5 s.
    let limiter = limiter_over(MemoryBackend::new(), LimiterSettings::default());
    let rules = RuleSet::new([Rule::token_bucket(1, 1, Period::SECOND)]).unwrap();
    let smooth =
        Policy::enforce("smooth", rules).with_on_limit(OnLimit::Delay { max_wait: Duration::from_secs(5) });
    let strict =
        per_minute("strict", 1).with_on_limit(OnLimit::Delay { max_wait: Duration::from_millis(50) });
    let layer = TollgateLayer::builder(limiter)
        .route(Route::limit("/smooth", smooth))
        .route(Route::limit("/strict", strict))
        .build()
        .unwrap();
    let base = serve(app(), layer).await;
    let c = client();
    assert_eq!(status(&c, &format!("{base}/smooth")).await, 200);
    let start = Instant::now();
    let (s, body) = get(&c, &format!("{base}/smooth")).await;
    assert_eq!(s, 200);
    // Held for most of the 1 s refill (a slow machine only makes it longer).
    assert!(start.elapsed() >= Duration::from_millis(300), "{:?}", start.elapsed());
    let waited: u64 = body.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(waited >= 300, "{body}");

    // A wait beyond max_wait is refused at once.
    assert_eq!(status(&c, &format!("{base}/strict")).await, 200);
    let r = c.get(format!("{base}/strict")).send().await.unwrap();
    assert_eq!(header(&r, "retry-after").map(|s| s.parse::<u64>().unwrap() > 1), Some(true));
    problem(r, 429).await;
}

#[tokio::test]
async fn policies_with_leases_are_refused_at_build() {
    let (limiter, _clock) = manual_limiter();
    let rules = RuleSet::new([Rule::concurrency(2, Period::MINUTE)]).unwrap();
    let err = TollgateLayer::builder(limiter.clone())
        .route(Route::limit("/upload", Policy::enforce("uploads", rules)))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("uploads"), "{err}");
    let err = TollgateLayer::builder(limiter)
        .route(Route::limit("/a/{x}", per_minute("a", 1)))
        .route(Route::limit("/a/{y}", per_minute("b", 1)))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("/a/{y}"), "{err}");
}
