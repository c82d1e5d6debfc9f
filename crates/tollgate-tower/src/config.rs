//! [`RoutesConfig`]: a layer's routes and keys as a TOML (or any serde) file, naming policies
//! defined elsewhere (the `[policies]` of `tollgate.toml`). `tollgate proxy` reads it.
//!
//! ```toml
//! default_policy = "default"            # requests no route takes; omit for unlimited
//! key = { kind = "client_ip", trusted_proxies = ["10.0.0.0/8"] }
//!
//! [[routes]]
//! path = "/login"
//! methods = ["POST"]
//! policy = "login"
//! key = { kind = "peer_ip" }
//!
//! [[routes]]
//! path = "/healthz"
//! exempt = true
//! ```
//!
//! Paths are matched in [canonical form](crate#canonical-paths): `non_canonical_paths =
//! "normalize"` (default) matches and forwards a loosely spelled path (`//login`, `/x/../login`,
//! `/%6Cogin`, `/login;x`) as its canonical form, `"reject"` answers it 400; `path_case =
//! "insensitive"` matches `/LOGIN` as `/login` (default `"sensitive"`).

use std::sync::Arc;

use http::{HeaderName, HeaderValue, Method};
use serde::Deserialize;
use tollgate_http::{HeaderSet, ResetHeader};
use tollgate_limiter::{Limiter, Policy};

use crate::{
    BuildError, Cors, ForwardedHeader, IpGrouping, Key, NonCanonicalPaths, PathCase, Route, TollgateLayer,
    TrustedProxies,
};

/// Where a request's key comes from, as written in a file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySpec {
    /// `peer_ip` (default), `client_ip`, `header`, `bearer_token` or `global`.
    #[serde(default)]
    pub kind: KeyKind,
    /// `client_ip`: the proxies whose forwarding header is believed (CIDRs or addresses).
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// `client_ip`: the header they write (default `x-forwarded-for`; `forwarded`, `x-real-ip`).
    #[serde(default)]
    pub forwarded_header: ForwardedHeader,
    /// IPv6 addresses are grouped by this prefix (default 56).
    #[serde(default)]
    pub ipv6_prefix: Option<u8>,
    /// `header`: the header's name.
    #[serde(default)]
    pub header: Option<String>,
    /// Tried when this key cannot be read (else 400 or 401).
    #[serde(default)]
    pub fallback: Option<Box<KeySpec>>,
}

/// The kinds of [`KeySpec`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    /// [`Key::peer_ip`].
    #[default]
    PeerIp,
    /// [`Key::client_ip`].
    ClientIp,
    /// [`Key::header_name`].
    Header,
    /// [`Key::bearer_token`].
    BearerToken,
    /// [`Key::global`].
    Global,
}

/// One route, as written in a file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// The path pattern (`/users/{id}`, `/static/{*path}`).
    pub path: String,
    /// Methods taken (default: all).
    #[serde(default)]
    pub methods: Vec<String>,
    /// The policy's name. Give this or `exempt = true`.
    #[serde(default)]
    pub policy: Option<String>,
    /// Not limited.
    #[serde(default)]
    pub exempt: bool,
    /// This route's key, instead of the file's.
    #[serde(default)]
    pub key: Option<KeySpec>,
}

/// A layer's routes, keys and options, as written in a file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutesConfig {
    /// The policy of requests no route takes (none: unlimited).
    #[serde(default)]
    pub default_policy: Option<String>,
    /// The key of routes without their own (default: the peer address).
    #[serde(default)]
    pub key: KeySpec,
    /// The routes, tried by pattern (static segments first), then in order within a pattern.
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    /// Let CORS preflights pass unchecked (default true).
    #[serde(default = "yes")]
    pub exempt_preflight: bool,
    /// `Access-Control-Allow-Origin` on the layer's own answers: `*`, `mirror`, or an origin.
    #[serde(default)]
    pub cors_origin: Option<String>,
    /// `X-RateLimit-Reset` as `delta` seconds (default) or `epoch` time.
    #[serde(default)]
    pub reset_header: Option<ResetHeader>,
    /// The rate-limit headers written: `all` (default), `ietf` (`RateLimit-Policy`,
    /// `RateLimit`) or `legacy` (`X-RateLimit-*`); `Retry-After` on a 429 in any case.
    #[serde(default)]
    pub headers: HeaderSet,
    /// Paths not in canonical form: `normalize` (default: matched, and passed on, as their
    /// canonical form) or `reject` (400).
    #[serde(default)]
    pub non_canonical_paths: NonCanonicalPaths,
    /// `sensitive` (default) or `insensitive` (ASCII case) route matching.
    #[serde(default)]
    pub path_case: PathCase,
}

fn yes() -> bool {
    true
}

/// Why a [`RoutesConfig`] does not make a layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RoutesConfigError {
    /// Not valid TOML, or an unknown field.
    #[error("cannot read the routes: {error}")]
    Parse {
        /// The TOML reader's error: its message, and the span of the text at fault. (Not the
        /// `source`: its text is already in this one's.)
        error: toml::de::Error,
    },
    /// A policy name that the configuration does not define.
    #[error("{field}: there is no policy named {name:?}")]
    UnknownPolicy {
        /// Where: `default_policy` or `routes[2].policy`.
        field: String,
        /// The name.
        name: String,
    },
    /// Anything else, named by its field.
    #[error("{field}: {message}")]
    Invalid {
        /// Where.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The layer refused the routes.
    #[error(transparent)]
    Build(#[from] BuildError),
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> RoutesConfigError {
    RoutesConfigError::Invalid { field: field.into(), message: message.into() }
}

impl KeySpec {
    /// The key this spec describes; `field` names it in errors.
    pub fn build(&self, field: &str) -> Result<Key, RoutesConfigError> {
        let grouping = IpGrouping::new().ipv6_prefix(self.ipv6_prefix.unwrap_or(56));
        let needs_header = self.kind == KeyKind::Header;
        if needs_header != self.header.is_some() {
            return Err(invalid(
                format!("{field}.header"),
                "give header with kind = \"header\", and only then",
            ));
        }
        if (self.kind == KeyKind::ClientIp) == self.trusted_proxies.is_empty() {
            return Err(invalid(
                format!("{field}.trusted_proxies"),
                "kind = \"client_ip\" needs trusted_proxies, and only it takes them",
            ));
        }
        let key = match self.kind {
            KeyKind::PeerIp => Key::peer_ip_grouped(grouping),
            KeyKind::ClientIp => {
                let proxies = TrustedProxies::parse(&self.trusted_proxies)
                    .map_err(|e| invalid(format!("{field}.trusted_proxies"), e.to_string()))?;
                Key::client_ip(proxies.header(self.forwarded_header).grouping(grouping))
            }
            KeyKind::Header => {
                let name = self.header.as_deref().unwrap_or_default();
                let name = HeaderName::try_from(name.to_ascii_lowercase())
                    .map_err(|e| invalid(format!("{field}.header"), e.to_string()))?;
                Key::header_name(name)
            }
            KeyKind::BearerToken => Key::bearer_token(),
            KeyKind::Global => Key::global(),
        };
        match &self.fallback {
            Some(fallback) => Ok(key.or(fallback.build(&format!("{field}.fallback"))?)),
            None => Ok(key),
        }
    }

    /// The trusted proxies of this key and its fallbacks.
    pub fn trusted_proxies(&self) -> Vec<String> {
        let mut all = self.trusted_proxies.clone();
        if let Some(f) = &self.fallback {
            all.extend(f.trusted_proxies());
        }
        all
    }
}

impl RoutesConfig {
    /// Parses TOML.
    pub fn from_toml(text: &str) -> Result<Self, RoutesConfigError> {
        toml::from_str(text).map_err(|error| RoutesConfigError::Parse { error })
    }

    /// The layer over `limiter`, with policies looked up by name in `policy`.
    pub fn build(
        &self,
        limiter: Limiter,
        policy: impl Fn(&str) -> Option<Arc<Policy>>,
    ) -> Result<TollgateLayer, RoutesConfigError> {
        let lookup = |field: String, name: &str| {
            policy(name).ok_or_else(|| RoutesConfigError::UnknownPolicy { field, name: name.to_owned() })
        };
        let mut builder = TollgateLayer::builder(limiter)
            .key(self.key.build("key")?)
            .exempt_preflight(self.exempt_preflight)
            .reset_header(self.reset_header.unwrap_or_default())
            .headers(self.headers)
            .non_canonical_paths(self.non_canonical_paths)
            .path_case(self.path_case);
        if let Some(name) = &self.default_policy {
            builder = builder.default_policy(lookup("default_policy".into(), name)?);
        }
        if let Some(origin) = &self.cors_origin {
            let cors = match origin.as_str() {
                "*" => Cors::any_origin(),
                "mirror" => Cors::mirror_origin(),
                other => Cors::origin(
                    HeaderValue::try_from(other).map_err(|e| invalid("cors_origin", e.to_string()))?,
                ),
            };
            builder = builder.cors(cors);
        }
        for (i, spec) in self.routes.iter().enumerate() {
            let field = format!("routes[{i}]");
            let methods = spec
                .methods
                .iter()
                .map(|m| Method::from_bytes(m.to_ascii_uppercase().as_bytes()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(format!("{field}.methods"), e.to_string()))?;
            let route = match (&spec.policy, spec.exempt) {
                (Some(name), false) => {
                    let route = Route::limit(&spec.path, lookup(format!("{field}.policy"), name)?);
                    match &spec.key {
                        Some(key) => route.key(key.build(&format!("{field}.key"))?),
                        None => route,
                    }
                }
                (None, true) => Route::exempt(&spec.path),
                _ => return Err(invalid(field, "give either policy = \"name\" or exempt = true")),
            };
            builder = builder.route(route.methods(methods));
        }
        Ok(builder.build()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{Period, Rule, RuleSet};

    fn policy(name: &str) -> Option<Arc<Policy>> {
        let rules = RuleSet::new([Rule::fixed_window(1, Period::SECOND)]).unwrap();
        (name != "missing").then(|| Arc::new(Policy::enforce(name, rules)))
    }

    fn build(text: &str) -> Result<TollgateLayer, RoutesConfigError> {
        RoutesConfig::from_toml(text)?.build(crate::in_memory(), policy)
    }

    #[test]
    fn a_full_file_builds() {
        let text = r#"
            default_policy = "default"
            key = { kind = "client_ip", trusted_proxies = ["10.0.0.0/8", "::1"], forwarded_header = "forwarded", fallback = { kind = "global" } }
            cors_origin = "*"
            reset_header = "epoch"
            headers = "legacy"
            non_canonical_paths = "reject"
            path_case = "insensitive"

            [[routes]]
            path = "/login"
            methods = ["post"]
            policy = "login"
            key = { kind = "header", header = "X-Api-Key" }

            [[routes]]
            path = "/healthz"
            exempt = true
        "#;
        build(text).unwrap();
    }

    #[test]
    fn the_readme_example_builds() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("# routes.toml\n").expect("the README's routes example");
        let text = &readme[start..start + readme[start..].find("```").unwrap()];
        build(text).unwrap();
    }

    #[test]
    fn mistakes_name_their_field() {
        let err = |text: &str| build(text).unwrap_err().to_string();
        assert!(err("default_policy = \"missing\"").starts_with("default_policy:"));
        assert!(err("[[routes]]\npath = \"/a\"\npolicy = \"missing\"").starts_with("routes[0].policy:"));
        assert!(err("[[routes]]\npath = \"/a\"").starts_with("routes[0]:"));
        assert!(err("key = { kind = \"client_ip\" }").starts_with("key.trusted_proxies:"));
        assert!(err("key = { kind = \"client_ip\", trusted_proxies = [\"x\"] }").contains("\"x\""));
        assert!(err("key = { kind = \"header\" }").starts_with("key.header:"));
        assert!(err("[[routes]]\npath = \"/a\"\npolicy = \"p\"\nmethods = [\"B A D\"]").contains("methods"));
        assert!(err("unknown = 1").contains("unknown field"));
        assert!(err("non_canonical_paths = \"fix\"").contains("unknown variant"));
        assert!(err("path_case = \"upper\"").contains("unknown variant"));
        // A pattern no canonical path could match is refused, with the form to write.
        let e = err("[[routes]]\npath = \"/a//b\"\npolicy = \"p\"");
        assert!(e.contains("\"/a//b\"") && e.contains("\"/a/b\""), "{e}");
        assert!(err("[[routes]]\npath = \"/a%2Fb\"\npolicy = \"p\"").contains("%2F"));
        assert!(err("[[routes]]\npath = \"/login;x\"\npolicy = \"p\"").contains("\"/login\""));
    }

    #[test]
    fn unreadable_routes_keep_the_readers_error() {
        let text = "cors_origin = \"*\"\nunknown = 1\n";
        let Err(RoutesConfigError::Parse { error }) = RoutesConfig::from_toml(text) else {
            panic!("an unknown field is a parse error");
        };
        assert!(error.message().contains("unknown field"), "{error}");
        assert_eq!(error.span().map(|s| &text[s]), Some("unknown"));
    }
}
