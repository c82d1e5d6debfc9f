//! The file as written (serde structs, unknown fields refused) and its validation into a
//! [`Config`], with the line of each mistake.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;

use serde::Deserialize;
use tollgate_core::{Period, Rule};
use tollgate_http::{HeaderSet, ResetHeader};
use tollgate_limiter::{
    DecisionLogSettings, FailurePolicy, LimiterSettings, LoggedKey, Mode, Policy, Reserve, SixPeriods,
};
use toml::Spanned;

use crate::redis_url::RedisTopology;
use crate::spec::{OnLimitKind, PolicySpec};
use crate::{
    BackendKind, BackendSettings, Config, ConfigError, ConnectionSettings, ConnectionThreadCount,
    ConsumerSettings, MemorySettings, Policies, RedisEngine, ServerSettings, TracingSettings,
};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    server: ServerSection,
    #[serde(default)]
    backend: BackendSection,
    #[serde(default)]
    memory: MemorySection,
    #[serde(default)]
    policies: BTreeMap<Spanned<String>, PolicySection>,
    #[serde(default)]
    consumers: Option<Spanned<ConsumersSection>>,
    #[serde(default)]
    decision_log: DecisionLogSection,
    #[serde(default)]
    tracing: TracingSection,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct TracingSection {
    otlp_endpoint: Option<Spanned<String>>,
    sample_ratio: Spanned<f64>,
    service_name: Spanned<String>,
    export_delay: Spanned<Period>,
}

impl Default for TracingSection {
    fn default() -> Self {
        let settings = TracingSettings::default();
        TracingSection {
            otlp_endpoint: None,
            sample_ratio: unwritten(settings.sample_ratio),
            service_name: unwritten(settings.service_name),
            export_delay: unwritten(
                Period::try_from(settings.export_delay).expect("the default is a valid period"),
            ),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct DecisionLogSection {
    enabled: bool,
    key: LoggedKey,
    sample_rate: Spanned<f64>,
    max_per_second: Spanned<u32>,
}

impl Default for DecisionLogSection {
    fn default() -> Self {
        let settings = DecisionLogSettings::default();
        DecisionLogSection {
            enabled: false,
            key: settings.key,
            sample_rate: unwritten(settings.sample_rate),
            max_per_second: unwritten(settings.max_per_second),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumersSection {
    #[serde(default)]
    defaults: Option<SixPeriods>,
    #[serde(default)]
    anonymous_per_hour: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ServerSection {
    listen: Spanned<String>,
    reset_header: ResetHeader,
    headers: HeaderSet,
    json_logs: bool,
    max_delayed: Spanned<usize>,
    max_request_state: Spanned<u64>,
    inline_limits: bool,
    // Connection bounds (`ConnectionSettings`).
    header_timeout: Spanned<Period>,
    body_timeout: Spanned<Period>,
    idle_timeout: Spanned<Period>,
    max_connections: Spanned<usize>,
    max_connections_per_address: usize,
    connection_threads: Option<Spanned<usize>>,
}

/// A default value: it has no place in the file, and is valid, so its span is never shown.
fn unwritten<T>(value: T) -> Spanned<T> {
    Spanned::new(0..0, value)
}

impl Default for ServerSection {
    fn default() -> Self {
        let connections = ConnectionSettings::default();
        let period =
            |d: std::time::Duration| unwritten(Period::try_from(d).expect("the defaults are valid periods"));
        ServerSection {
            listen: unwritten("127.0.0.1:8080".into()),
            reset_header: ResetHeader::Delta,
            headers: HeaderSet::All,
            json_logs: false,
            max_delayed: unwritten(LimiterSettings::default().max_delayed),
            max_request_state: unwritten(crate::DEFAULT_MAX_REQUEST_STATE),
            inline_limits: true,
            header_timeout: period(connections.header_timeout),
            body_timeout: period(connections.body_timeout),
            idle_timeout: period(connections.idle_timeout),
            max_connections: unwritten(connections.max_connections),
            max_connections_per_address: connections.max_connections_per_address,
            connection_threads: None,
        }
    }
}

/// Longest connection timeout (`header_timeout`, `body_timeout`, `idle_timeout`): an hour is
/// beyond any client's honest need, and a bound is the point of these settings.
const MAX_CONNECTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct MemorySection {
    max_keys: Spanned<usize>,
}

impl Default for MemorySection {
    fn default() -> Self {
        MemorySection { max_keys: unwritten(MemorySettings::default().max_keys) }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct BackendSection {
    kind: Spanned<BackendKind>,
    url: Option<Spanned<String>>,
    prefix: String,
    engine: RedisEngine,
    timeout: Period,
    connections: Spanned<usize>,
    coalesce: Spanned<usize>,
    deny_cache: bool,
    on_failure: FailurePolicy,
    failure_threshold: Spanned<u32>,
    probe_interval: Period,
}

impl Default for BackendSection {
    fn default() -> Self {
        let limiter = LimiterSettings::default();
        BackendSection {
            kind: unwritten(BackendKind::Memory),
            url: None,
            prefix: "tollgate".into(),
            engine: RedisEngine::default(),
            timeout: Period::from_millis(50).expect("50ms is a valid period"),
            connections: unwritten(2),
            coalesce: unwritten(32),
            deny_cache: true,
            on_failure: limiter.on_failure,
            failure_threshold: unwritten(limiter.failure_threshold),
            probe_interval: Period::from_millis(250).expect("250ms is a valid period"),
        }
    }
}

/// A [`PolicySpec`] with the line of each field that validation can fault; without `apps`
/// and `enabled`, which are the database's (see [`crate::spec`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicySection {
    #[serde(default)]
    description: Option<String>,
    rules: Spanned<Vec<Spanned<Rule>>>,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    on_limit: OnLimitKind,
    #[serde(default)]
    max_wait: Option<Spanned<Period>>,
    #[serde(default)]
    reserve: Option<Spanned<Reserve>>,
}

/// A mistake in the file: where (a byte range of the text) and what.
struct Mistake {
    span: Range<usize>,
    message: String,
}

impl Mistake {
    fn at(span: Range<usize>, message: impl Into<String>) -> Self {
        Mistake { span, message: message.into() }
    }

    /// A mistake in the value of `field`.
    fn in_value<T>(field: &Spanned<T>, message: impl Into<String>) -> Self {
        Mistake::at(field.span(), message)
    }
}

/// Fails with `message` at `field` unless its value is within `range`.
fn within<T: PartialOrd>(
    field: &Spanned<T>,
    range: std::ops::RangeInclusive<T>,
    message: impl FnOnce() -> String,
) -> Result<(), Mistake> {
    if range.contains(field.get_ref()) { Ok(()) } else { Err(Mistake::in_value(field, message())) }
}

pub(crate) fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    // Spans are byte ranges of `text`; the error names the line they start on.
    let line_of = |span: Range<usize>| Some(text[..span.start.min(text.len())].matches('\n').count() + 1);
    let file: File = toml::from_str(text).map_err(|e| {
        let line = e.span().and_then(line_of);
        ConfigError::at(origin, line, e.message().trim_end().to_owned())
    })?;
    validate(file).map_err(|m| ConfigError::at(origin, line_of(m.span), m.message))
}

/// The file's sections, each validated into its settings.
fn validate(file: File) -> Result<Config, Mistake> {
    let server = server_settings(&file.server)?;
    let memory = MemorySettings { max_keys: max_keys(&file.memory)? };
    let mut backend = backend_settings(&file.backend, &server, &memory)?;
    backend.limiter.decision_log = decision_log_settings(&file.decision_log)?;
    let mut policies = BTreeMap::new();
    for (name, section) in file.policies {
        let policy = policy(&name, section)?;
        policies.insert(name.into_inner(), Arc::new(policy));
    }
    let consumers = match file.consumers {
        Some(section) => consumer_settings(section)?,
        None => ConsumerSettings::default(),
    };
    let tracing = tracing_settings(&file.tracing)?;
    Ok(Config { consumers, server, memory, backend, policies: Policies(policies), tracing })
}

/// The `[tracing]` section (off without an endpoint; its other fields are checked all the same).
fn tracing_settings(section: &TracingSection) -> Result<TracingSettings, Mistake> {
    if let Some(endpoint) = &section.otlp_endpoint {
        TracingSettings::check_endpoint(endpoint.get_ref())
            .map_err(|e| Mistake::in_value(endpoint, format!("tracing.otlp_endpoint = {e}")))?;
    }
    let ratio = *section.sample_ratio.get_ref();
    if !(0.0..=1.0).contains(&ratio) {
        return Err(Mistake::in_value(
            &section.sample_ratio,
            format!(
                "tracing.sample_ratio = {ratio}: it must be between 0 and 1 (0.1 samples one trace in ten)"
            ),
        ));
    }
    let name = section.service_name.get_ref();
    if name.trim().is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
        return Err(Mistake::in_value(
            &section.service_name,
            "tracing.service_name must be 1 to 255 bytes, not blank, without control characters",
        ));
    }
    let delay = section.export_delay.get_ref().as_duration();
    if delay > TracingSettings::MAX_EXPORT_DELAY {
        return Err(Mistake::in_value(&section.export_delay, "tracing.export_delay must be at most 1m"));
    }
    Ok(TracingSettings {
        otlp_endpoint: section.otlp_endpoint.as_ref().map(|e| e.get_ref().clone()),
        sample_ratio: ratio,
        service_name: name.clone(),
        export_delay: delay,
    })
}

fn server_settings(server: &ServerSection) -> Result<ServerSettings, Mistake> {
    let listen: SocketAddr = server.listen.get_ref().parse().map_err(|_| {
        Mistake::in_value(
            &server.listen,
            format!("server.listen = {:?} is not an address like 127.0.0.1:8080", server.listen.get_ref()),
        )
    })?;
    within(&server.max_delayed, 1..=100_000, || "server.max_delayed must be between 1 and 100000".into())?;
    let range = crate::MAX_REQUEST_STATE_RANGE;
    within(&server.max_request_state, range.clone(), || {
        format!(
            "server.max_request_state = {} bytes: it must be between {} (the state of a few fixed \
             windows) and {} (1 GiB)",
            server.max_request_state.get_ref(),
            range.start(),
            range.end()
        )
    })?;
    Ok(ServerSettings {
        listen,
        reset_header: server.reset_header,
        headers: server.headers,
        json_logs: server.json_logs,
        max_delayed: *server.max_delayed.get_ref(),
        max_request_state: *server.max_request_state.get_ref(),
        inline_limits: server.inline_limits,
        connections: connection_settings(server)?,
    })
}

fn connection_settings(server: &ServerSection) -> Result<ConnectionSettings, Mistake> {
    let timeout = |name: &str, value: &Spanned<Period>| {
        let duration = value.get_ref().as_duration();
        if duration > MAX_CONNECTION_TIMEOUT {
            Err(Mistake::in_value(value, format!("server.{name} must be at most 1h")))
        } else {
            Ok(duration)
        }
    };
    let most = ConnectionSettings::MAX_CONNECTIONS_LIMIT;
    within(&server.max_connections, 1..=most, || {
        format!("server.max_connections must be between 1 and {most}")
    })?;
    Ok(ConnectionSettings {
        header_timeout: timeout("header_timeout", &server.header_timeout)?,
        body_timeout: timeout("body_timeout", &server.body_timeout)?,
        idle_timeout: timeout("idle_timeout", &server.idle_timeout)?,
        max_connections: *server.max_connections.get_ref(),
        max_connections_per_address: server.max_connections_per_address,
        threads: connection_threads(server.connection_threads.as_ref())?,
    })
}

fn connection_threads(field: Option<&Spanned<usize>>) -> Result<ConnectionThreadCount, Mistake> {
    let Some(field) = field else { return Ok(ConnectionThreadCount::PerCore) };
    let most = ConnectionThreadCount::MAX;
    within(field, 0..=most, || {
        format!("server.connection_threads must be between 0 (none of their own) and {most}")
    })?;
    Ok(std::num::NonZeroUsize::new(*field.get_ref())
        .map_or(ConnectionThreadCount::Shared, ConnectionThreadCount::Exactly))
}

fn max_keys(memory: &MemorySection) -> Result<usize, Mistake> {
    let least = tollgate_core::MIN_MAX_KEYS;
    within(&memory.max_keys, least..=usize::MAX, || {
        format!("memory.max_keys must be at least {least} (the most keys one batch names)")
    })?;
    Ok(*memory.max_keys.get_ref())
}

fn backend_settings(
    backend: &BackendSection,
    server: &ServerSettings,
    memory: &MemorySettings,
) -> Result<BackendSettings, Mistake> {
    if let Some(url) = &backend.url {
        RedisTopology::of_url(url.get_ref())
            .map_err(|e| Mistake::in_value(url, format!("backend.url: {e}")))?;
    }
    if *backend.kind.get_ref() == BackendKind::Redis && backend.url.is_none() {
        return Err(Mistake::in_value(&backend.kind, "backend.kind = \"redis\" needs backend.url"));
    }
    within(&backend.connections, 1..=64, || "backend.connections must be between 1 and 64".into())?;
    let max_parts = tollgate_core::limits::MAX_BATCH_PARTS;
    within(&backend.coalesce, 1..=max_parts, || {
        format!("backend.coalesce must be between 1 and {max_parts}")
    })?;
    within(&backend.failure_threshold, 1..=100, || {
        "backend.failure_threshold must be between 1 and 100".into()
    })?;
    Ok(BackendSettings {
        kind: *backend.kind.get_ref(),
        url: backend.url.as_ref().map(|u| u.get_ref().clone()),
        prefix: backend.prefix.clone(),
        engine: backend.engine,
        timeout: backend.timeout.as_duration(),
        connections: *backend.connections.get_ref(),
        coalesce: *backend.coalesce.get_ref(),
        deny_cache: backend.deny_cache,
        limiter: LimiterSettings {
            on_failure: backend.on_failure,
            failure_threshold: *backend.failure_threshold.get_ref(),
            probe_interval: backend.probe_interval.as_duration(),
            max_delayed: server.max_delayed,
            fallback_max_keys: memory.max_keys,
            decision_log: None,
        },
    })
}

/// The `[decision_log]` section: None when it is off.
fn decision_log_settings(section: &DecisionLogSection) -> Result<Option<DecisionLogSettings>, Mistake> {
    let settings = DecisionLogSettings {
        sample_rate: *section.sample_rate.get_ref(),
        max_per_second: *section.max_per_second.get_ref(),
        key: section.key,
    };
    settings.validate().map_err(|e| {
        let span = match e {
            tollgate_limiter::DecisionLogError::SampleRate(_) => section.sample_rate.span(),
            _ => section.max_per_second.span(),
        };
        Mistake::at(span, format!("decision_log.{e}"))
    })?;
    Ok(section.enabled.then_some(settings))
}

fn consumer_settings(section: Spanned<ConsumersSection>) -> Result<ConsumerSettings, Mistake> {
    let span = section.span();
    let section = section.into_inner();
    let mut consumers = ConsumerSettings::default();
    if let Some(defaults) = section.defaults {
        defaults.validate().map_err(|e| Mistake::at(span.clone(), format!("consumers.defaults.{e}")))?;
        consumers.defaults = defaults;
    }
    if let Some(per_hour) = section.anonymous_per_hour {
        if !(1..=tollgate_core::limits::MAX_COUNT).contains(&per_hour) {
            return Err(Mistake::at(span, "consumers.anonymous_per_hour must be 1 to 10^12"));
        }
        consumers.anonymous_per_hour = per_hour;
    }
    Ok(consumers)
}

fn policy(name: &Spanned<String>, section: PolicySection) -> Result<Policy, Mistake> {
    let rule_spans: Vec<Range<usize>> = section.rules.get_ref().iter().map(Spanned::span).collect();
    let rules_span = section.rules.span();
    let wait_span = section.max_wait.as_ref().map(Spanned::span);
    let reserve_span = section.reserve.as_ref().map(Spanned::span);
    let spec = PolicySpec {
        description: section.description,
        rules: section.rules.into_inner().into_iter().map(Spanned::into_inner).collect(),
        mode: section.mode,
        on_limit: section.on_limit,
        max_wait: section.max_wait.map(Spanned::into_inner),
        reserve: section.reserve.map(Spanned::into_inner).unwrap_or_default(),
        apps: Vec::new(),
        enabled: true,
    };
    spec.build(name.get_ref()).map_err(|e| {
        // The line of the field at fault: the name, one rule, max_wait, or the rule list.
        let rule = e.field.strip_prefix("rules[").and_then(|r| r.split(']').next()?.parse::<usize>().ok());
        let span = match e.field.as_str() {
            "name" => name.span(),
            "max_wait" => wait_span.clone().unwrap_or(rules_span.clone()),
            "reserve" => reserve_span.clone().unwrap_or(rules_span.clone()),
            _ => rule.and_then(|i| rule_spans.get(i).cloned()).unwrap_or(rules_span.clone()),
        };
        Mistake::at(span, format!("policy {:?}: {}", name.get_ref(), e.message))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> ConfigError {
        parse(text, "t.toml").unwrap_err()
    }

    #[test]
    fn errors_name_their_line() {
        let e = error("[server]\nlisten = \"nowhere\"\n");
        assert_eq!(e.line(), Some(2), "{e}");
        assert!(e.to_string().starts_with("t.toml:2: server.listen"), "{e}");

        let e = error(
            "[policies.a]\nrules = [\n  { algorithm = \"fixed_window\", limit = 1, period = \"1s\" },\n  { algorithm = \"gcra\", limit = 1, period = \"1s\", burst = 0 },\n]\n",
        );
        assert_eq!(e.line(), Some(4), "{e}");
        assert!(e.to_string().contains("burst"), "{e}");

        let e = error("[backend]\nkind = \"redis\"\n");
        assert_eq!(e.line(), Some(2), "{e}");

        let e = error(
            "\n\n[policies.a]\nrules = [{ algorithm = \"fixed_window\", limit = 1, perod = \"1s\" }]\n",
        );
        assert_eq!(e.line(), Some(4), "{e}");
        assert!(e.to_string().contains("perod"), "{e}");

        // Two bounds once said line 1 wherever they were written; a section's mistakes name it.
        for (text, start) in [
            ("[server]\nlisten = \"127.0.0.1:1\"\nmax_delayed = 0\n", "t.toml:3: server.max_delayed"),
            ("[backend]\nprefix = \"x\"\n\nfailure_threshold = 101\n", "t.toml:4: backend.failure_threshold"),
            ("[server]\n[consumers]\nanonymous_per_hour = 0\n", "t.toml:2: consumers.anonymous_per_hour"),
        ] {
            let e = error(text).to_string();
            assert!(e.starts_with(start), "{e}");
        }
    }

    #[test]
    fn the_redis_engine_is_auto_unless_chosen() {
        let url = "[backend]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n";
        assert_eq!(parse(url, "t.toml").unwrap().backend.engine, RedisEngine::Auto);
        for engine in [RedisEngine::Module, RedisEngine::Lua, RedisEngine::Auto] {
            let text = format!("{url}engine = \"{}\"\n", engine.as_str());
            assert_eq!(parse(&text, "t.toml").unwrap().backend.engine, engine);
            assert_eq!(engine.as_str().parse::<RedisEngine>(), Ok(engine));
        }
        let e = error(&format!("{url}engine = \"wasm\"\n"));
        assert_eq!(e.line(), Some(4), "{e}");
        assert!(e.to_string().contains("wasm"), "{e}");
        assert!("Module".parse::<RedisEngine>().is_err());
    }

    #[test]
    fn unknown_sections_and_fields_are_refused() {
        assert!(error("[sever]\n").to_string().contains("sever"));
        assert!(error("[backend]\ntimout = \"1s\"\n").to_string().contains("timout"));
        assert!(error("[policies.a]\nrules = []\nmod = \"shadow\"\n").to_string().contains("mod"));
    }

    #[test]
    fn apps_and_enabled_are_the_databases() {
        let rules = "rules = [{ algorithm = \"fixed_window\", limit = 1, period = \"1s\" }]\n";
        for field in ["apps = [\"shop\"]", "enabled = false"] {
            let e = error(&format!("[policies.a]\n{rules}{field}\n"));
            assert_eq!(e.line(), Some(3), "{e}");
            assert!(e.to_string().contains("unknown field"), "{e}");
        }
    }

    #[test]
    fn delay_needs_a_bounded_max_wait() {
        let rules = "rules = [{ algorithm = \"fixed_window\", limit = 1, period = \"1s\" }]\n";
        assert!(
            error(&format!("[policies.a]\n{rules}on_limit = \"delay\"\n")).to_string().contains("max_wait")
        );
        assert!(error(&format!("[policies.a]\n{rules}max_wait = \"1s\"\n")).to_string().contains("delay"));
        assert!(
            error(&format!("[policies.a]\n{rules}on_limit = \"delay\"\nmax_wait = \"2m\"\n"))
                .to_string()
                .contains("at most 60s")
        );
        let ok = parse(&format!("[policies.a]\n{rules}on_limit = \"delay\"\nmax_wait = \"250ms\"\n"), "t")
            .unwrap();
        let policy = ok.policies.get("a").unwrap();
        assert_eq!(
            policy.on_limit,
            tollgate_limiter::OnLimit::Delay { max_wait: std::time::Duration::from_millis(250) }
        );
    }

    #[test]
    fn reserve_is_off_auto_or_a_max_and_refused_for_sliding_and_concurrency_rules() {
        let fixed = "rules = [{ algorithm = \"fixed_window\", limit = 100, period = \"1m\" }]\n";
        let reserve_of = |text: &str| {
            parse(&format!("[policies.a]\n{text}"), "t").unwrap().policies.get("a").unwrap().reserve
        };
        assert_eq!(reserve_of(fixed), Reserve::Off);
        assert_eq!(reserve_of(&format!("{fixed}reserve = \"auto\"\n")), Reserve::Auto);
        assert_eq!(reserve_of(&format!("{fixed}reserve = \"off\"\n")), Reserve::Off);
        assert_eq!(reserve_of(&format!("{fixed}reserve = {{ max = 50 }}\n")), Reserve::Max(50));
        let bucket = "rules = [{ algorithm = \"token_bucket\", capacity = 10, refill = 1, per = \"1s\" }, \
                      { algorithm = \"gcra\", limit = 10, period = \"1s\", burst = 5 }]\n";
        assert_eq!(reserve_of(&format!("{bucket}reserve = \"auto\"\n")), Reserve::Auto);

        for (algorithm, extra) in [
            ("sliding_window_log", "limit = 5, period = \"1m\""),
            ("sliding_window_counter", "limit = 5, period = \"1m\""),
            ("concurrency", "limit = 5, lease = \"1m\""),
        ] {
            let text = format!(
                "[policies.hot]\nrules = [{{ algorithm = \"fixed_window\", limit = 9, period = \"1s\" }},\n\
                 {{ algorithm = \"{algorithm}\", {extra} }}]\nreserve = \"auto\"\n"
            );
            let e = error(&text);
            let message = e.to_string();
            assert!(message.contains("policy \"hot\""), "{message}");
            assert!(message.contains(&format!("rules[1], a {algorithm} rule")), "{message}");
            assert_eq!(e.line(), Some(4), "{message}");
        }
        let e = error(&format!("[policies.a]\n{fixed}reserve = {{ max = 0 }}\n"));
        assert!(e.to_string().contains("max must be at least 1"), "{e}");
        assert!(
            error(&format!("[policies.a]\n{fixed}reserve = \"always\"\n")).to_string().contains("reserve")
        );
        // A key beside max is a mistake (schemathesis found it accepted).
        let e = error(&format!("[policies.a]\n{fixed}reserve = {{ max = 5, mx = 6 }}\n"));
        assert_eq!(e.line(), Some(3), "{e}");
    }

    #[test]
    fn tracing_is_off_by_default_and_its_fields_are_checked() {
        let c = parse("", "t").unwrap();
        assert!(!c.tracing.enabled());
        assert_eq!(c.tracing, TracingSettings::default());
        let c = parse(
            "[tracing]\notlp_endpoint = \"http://127.0.0.1:4317\"\nsample_ratio = 0.1\n\
             service_name = \"edge\"\nexport_delay = \"200ms\"\n",
            "t",
        )
        .unwrap();
        assert!(c.tracing.enabled());
        assert_eq!(c.tracing.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4317"));
        assert_eq!((c.tracing.sample_ratio, c.tracing.service_name.as_str()), (0.1, "edge"));
        assert_eq!(c.tracing.export_delay, std::time::Duration::from_millis(200));
        // An integer ratio is a ratio too.
        assert_eq!(parse("[tracing]\nsample_ratio = 1\n", "t").unwrap().tracing.sample_ratio, 1.0);
        for (text, field, line) in [
            ("[tracing]\notlp_endpoint = \"127.0.0.1:4317\"\n", "tracing.otlp_endpoint", 2),
            ("[tracing]\n\notlp_endpoint = \"http://\"\n", "tracing.otlp_endpoint", 3),
            ("[tracing]\notlp_endpoint = \"grpc://collector:4317\"\n", "tracing.otlp_endpoint", 2),
            ("[tracing]\notlp_endpoint = \"http://a b:4317\"\n", "tracing.otlp_endpoint", 2),
            ("[tracing]\nsample_ratio = 1.5\n", "tracing.sample_ratio", 2),
            ("[tracing]\nsample_ratio = -0.1\n", "tracing.sample_ratio", 2),
            ("[tracing]\nsample_ratio = nan\n", "tracing.sample_ratio", 2),
            ("[tracing]\nservice_name = \" \"\n", "tracing.service_name", 2),
            ("[tracing]\nexport_delay = \"2m\"\n", "tracing.export_delay", 2),
        ] {
            let e = error(text);
            assert_eq!(e.line(), Some(line), "{text}: {e}");
            assert!(e.to_string().contains(field), "{text}: {e}");
        }
        // Unknown fields and wrong types are refused at their line too.
        assert_eq!(error("[tracing]\nendpoint = \"http://x:4317\"\n").line(), Some(2));
        assert_eq!(error("[tracing]\nsample_ratio = \"all\"\n").line(), Some(2));
    }

    #[test]
    fn the_inline_state_budget_and_switch() {
        let c = parse("", "t").unwrap();
        assert_eq!(c.server.max_request_state, crate::DEFAULT_MAX_REQUEST_STATE);
        assert!(c.server.inline_limits);
        let c = parse("[server]\nmax_request_state = 4096\ninline_limits = false\n", "t").unwrap();
        assert_eq!((c.server.max_request_state, c.server.inline_limits), (4096, false));
        let e = error("[server]\ninline_limits = false\nmax_request_state = 10\n");
        assert_eq!(e.line(), Some(3), "{e}");
        assert!(e.to_string().contains("server.max_request_state = 10 bytes"), "{e}");
        assert_eq!(error("[server]\n\nmax_request_state = -1\n").line(), Some(3));
        assert_eq!(error("[server]\ninline_limits = \"no\"\n").line(), Some(2));
    }

    #[test]
    fn policies_over_the_inline_budget_are_named_not_refused() {
        let text = "[policies.small]\nrules = [{ algorithm = \"sliding_window_log\", limit = 100, period = \"1h\" }]\n\
                    [policies.big]\nrules = [{ algorithm = \"sliding_window_log\", limit = 10000, period = \"365d\" }]\n";
        let c = parse(text, "t").unwrap();
        assert_eq!(c.policies_over_budget(), [("big", 160 + 10_000 * 130)]);
        let c = parse(&format!("[server]\nmax_request_state = 2000000\n{text}"), "t").unwrap();
        assert!(c.policies_over_budget().is_empty());
    }

    #[test]
    fn policy_names_are_checked() {
        let e = error(
            "[policies.\"a b\"]\nrules = [{ algorithm = \"fixed_window\", limit = 1, period = \"1s\" }]\n",
        );
        assert_eq!(e.line(), Some(1));
        assert!(crate::valid_policy_name("api.v1-read_x"));
        assert!(!crate::valid_policy_name(""));
    }

    #[test]
    fn consumer_defaults_and_the_anonymous_limit() {
        let c = parse("[consumers]\nanonymous_per_hour = 50\n", "t").unwrap();
        assert_eq!((c.consumers.anonymous_per_hour, c.consumers.defaults), (50, SixPeriods::UNLIMITED));
        let text = "[consumers]\ndefaults = { per_second = 5, per_minute = -1, per_hour = -1, per_day = -1, per_week = -1, per_month = 0 }\n";
        let e = error(text);
        assert!(e.to_string().contains("per_month is 0"), "{e}");
        assert_eq!(e.line(), Some(1));
    }

    #[test]
    fn connection_bounds_and_the_memory_cap() {
        let c = parse("", "t").unwrap();
        assert_eq!(c.server.connections, ConnectionSettings::default());
        assert_eq!(c.memory.max_keys, tollgate_core::DEFAULT_MAX_KEYS);
        assert_eq!(c.limiter_settings().fallback_max_keys, tollgate_core::DEFAULT_MAX_KEYS);

        let c = parse(
            "[server]\nheader_timeout = \"250ms\"\nbody_timeout = \"2s\"\nidle_timeout = \"1m\"\nmax_connections = 50\nmax_connections_per_address = 7\n[memory]\nmax_keys = 5000\n",
            "t",
        )
        .unwrap();
        let expected = ConnectionSettings {
            header_timeout: std::time::Duration::from_millis(250),
            body_timeout: std::time::Duration::from_secs(2),
            idle_timeout: std::time::Duration::from_secs(60),
            max_connections: 50,
            max_connections_per_address: 7,
            threads: ConnectionThreadCount::PerCore,
        };
        assert_eq!(c.server.connections, expected);
        assert_eq!((c.memory.max_keys, c.limiter_settings().fallback_max_keys), (5000, 5000));

        let e = error("[server]\nlisten = \"127.0.0.1:1\"\nmax_connections = 0\n");
        assert_eq!(e.line(), Some(3), "{e}");
        assert!(e.to_string().contains("server.max_connections"), "{e}");
        let e = error("[server]\nidle_timeout = \"2h\"\n");
        assert_eq!(e.line(), Some(2), "{e}");
        assert!(e.to_string().contains("server.idle_timeout must be at most 1h"), "{e}");
        let e = error("[memory]\nmax_keys = 10\n");
        assert_eq!(e.line(), Some(2), "{e}");
        assert!(e.to_string().contains("memory.max_keys must be at least 64"), "{e}");
        assert!(error("[memory]\nmax_key = 10\n").to_string().contains("max_key"));
    }

    #[test]
    fn connection_threads_per_core_by_default_a_number_or_none() {
        let threads = |text: &str| parse(text, "t").unwrap().server.connections.threads;
        assert_eq!(threads(""), ConnectionThreadCount::PerCore);
        assert!(ConnectionThreadCount::PerCore.resolve() >= 1);
        let three = threads("[server]\nconnection_threads = 3\n");
        assert_eq!((three, three.resolve()), (ConnectionThreadCount::Exactly(3.try_into().unwrap()), 3));
        let none = threads("[server]\nconnection_threads = 0\n");
        assert_eq!((none, none.resolve()), (ConnectionThreadCount::Shared, 0));
        let e = error("[server]\nlisten = \"127.0.0.1:1\"\nconnection_threads = 1025\n");
        assert_eq!(e.line(), Some(3), "{e}");
        assert!(e.to_string().contains("server.connection_threads must be between 0"), "{e}");
        assert_eq!(error("[server]\nconnection_threads = -1\n").line(), Some(2));
    }

    #[test]
    fn the_decision_log_is_off_unless_enabled_and_bounded() {
        assert_eq!(parse("", "t").unwrap().limiter_settings().decision_log, None);
        // Settings without `enabled` are checked, and stay off.
        assert_eq!(
            parse("[decision_log]\nmax_per_second = 5\n", "t").unwrap().limiter_settings().decision_log,
            None
        );
        let c = parse("[decision_log]\nenabled = true\n", "t").unwrap();
        assert_eq!(c.limiter_settings().decision_log, Some(DecisionLogSettings::default()));
        let c = parse(
            "[decision_log]\nenabled = true\nkey = \"plain\"\nsample_rate = 0.25\nmax_per_second = 3\n",
            "t",
        )
        .unwrap();
        let expected = DecisionLogSettings { sample_rate: 0.25, max_per_second: 3, key: LoggedKey::Plain };
        assert_eq!(c.limiter_settings().decision_log, Some(expected));

        let e = error("[decision_log]\nenabled = true\n\nsample_rate = 0.0\n");
        assert_eq!(e.line(), Some(4), "{e}");
        assert!(e.to_string().contains("decision_log.sample_rate = 0 must be above 0"), "{e}");
        let e = error("[decision_log]\nmax_per_second = 0\n");
        assert_eq!(e.line(), Some(2), "{e}");
        assert!(e.to_string().contains("decision_log.max_per_second"), "{e}");
        assert!(error("[decision_log]\nkey = \"md5\"\n").to_string().contains("md5"));
        assert!(error("[decision_log]\nenable = true\n").to_string().contains("enable"));
    }

    #[test]
    fn durations_are_written_like_250ms_and_7d() {
        let c = parse(
            "[backend]\ntimeout = \"250ms\"\n[policies.w]\nrules = [{ algorithm = \"fixed_window\", limit = 1, period = \"7d\" }]\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.backend.timeout, std::time::Duration::from_millis(250));
        assert_eq!(c.policies.get("w").unwrap().rules.signatures().next().unwrap(), "fw:1:604800000000");
    }
}
