//! [`Route`]s: which policy (and key) limits a request, by path pattern and method.

use std::sync::Arc;

use http::Method;
use tollgate_limiter::Policy;

use crate::Key;

/// What a matched route does.
#[derive(Clone, Debug)]
pub(crate) enum Action {
    /// Limited by the policy, keyed by the route's key or else the layer's.
    Limit { policy: Arc<Policy>, key: Option<Key> },
    /// Passed through without a check or headers.
    Exempt,
}

/// A path pattern and method set, limited by a policy or exempted.
///
/// Patterns are [matchit](https://docs.rs/matchit)'s, as axum writes them: `/users/{id}` matches
/// one segment, `/static/{*path}` the rest of the path (at least one character; add `/static`
/// too for the bare prefix). A static segment beats a parameter (`/users/me` before
/// `/users/{id}`). Without [`methods`](Route::methods) a route takes every method; routes of
/// the same pattern are tried in the order given, and a request no route takes gets the
/// layer's default policy.
///
/// Requests are matched on their [canonical path](crate#canonical-paths), without its
/// trailing `/`, so a pattern must be canonical too (no `//`, `.` or `..` segments, `;` or
/// needless escapes; the layer refuses one that is not); `/login` and `/login/` are one
/// pattern. Write reserved characters (`!`, `:`, `@`, ...) as the requests spell them: escapes
/// of reserved characters are kept as they are, not decoded.
///
/// ```
/// use http::Method;
/// use tollgate_core::Period;
/// use tollgate_tower::{Key, Route, requests_per_period};
///
/// let login = requests_per_period(5, Period::MINUTE).unwrap();
/// let route = Route::limit("/login", login).methods([Method::POST]).key(Key::peer_ip());
/// let health = Route::exempt("/healthz");
/// ```
#[derive(Clone, Debug)]
pub struct Route {
    pub(crate) pattern: String,
    pub(crate) methods: Vec<Method>,
    pub(crate) action: Action,
}

impl Route {
    /// Requests matching `pattern` are limited by `policy`.
    pub fn limit(pattern: impl Into<String>, policy: impl Into<Arc<Policy>>) -> Self {
        Route {
            pattern: pattern.into(),
            methods: Vec::new(),
            action: Action::Limit { policy: policy.into(), key: None },
        }
    }

    /// Requests matching `pattern` are not limited (health checks, metrics).
    pub fn exempt(pattern: impl Into<String>) -> Self {
        Route { pattern: pattern.into(), methods: Vec::new(), action: Action::Exempt }
    }

    /// Only these methods (default: every method).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Keys this route's requests by `key` instead of the layer's key (no effect on an exempt
    /// route).
    pub fn key(mut self, key: Key) -> Self {
        if let Action::Limit { key: k, .. } = &mut self.action {
            *k = Some(key);
        }
        self
    }

    fn takes(&self, method: &Method) -> bool {
        self.methods.is_empty() || self.methods.contains(method)
    }
}

/// A route pattern matchit refuses (malformed, or conflicting with another).
#[derive(Debug, thiserror::Error)]
#[error("route {pattern:?}: {source}")]
pub struct RouteError {
    /// The pattern.
    pub pattern: String,
    /// Why.
    #[source]
    pub source: matchit::InsertError,
}

/// Every route, by the [`route_key`](crate::path::route_key) of its pattern.
#[derive(Clone, Default)]
pub(crate) struct RouteTable {
    router: matchit::Router<usize>,
    /// Routes whose patterns have one key, in the order given; with that key.
    groups: Vec<(String, Vec<Route>)>,
}

impl RouteTable {
    /// Adds `route`, matched on `key`: its pattern in canonical form, as requests are (so
    /// `/login` and `/login/` are one pattern, and under case-insensitive matching `/Login` too).
    pub(crate) fn add(&mut self, route: Route, key: String) -> Result<(), RouteError> {
        if let Some((_, group)) = self.groups.iter_mut().find(|(k, _)| *k == key) {
            group.push(route);
            return Ok(());
        }
        self.router
            .insert(key.clone(), self.groups.len())
            .map_err(|source| RouteError { pattern: route.pattern.clone(), source })?;
        self.groups.push((key, vec![route]));
        Ok(())
    }

    /// The action of the first route whose pattern and methods take the request; `path` is the
    /// request's route key.
    pub(crate) fn find(&self, path: &str, method: &Method) -> Option<&Action> {
        let matched = self.router.at(path).ok()?;
        self.groups[*matched.value].1.iter().find(|r| r.takes(method)).map(|r| &r.action)
    }

    pub(crate) fn routes(&self) -> impl Iterator<Item = &Route> {
        self.groups.iter().flat_map(|(_, group)| group)
    }
}
