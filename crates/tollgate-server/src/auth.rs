//! Who calls a management route: the [`Caller`] named by the request's bearer token, and the
//! extractors that require a role of it before the rest of the request is read.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tollgate_http::Problem;
use tollgate_store::{Role, Store, StoreError, TokenRecord};

use crate::state::AppState;

/// The caller of a management route: the token its bearer secret names.
pub struct Caller {
    pub(crate) token: TokenRecord,
    pub(crate) store: Store,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let Some(store) = state.store.clone() else {
            return Err(
                Problem::no_such("the management API needs a policy database (--database)").into_response()
            );
        };
        let unauthorized = |detail: &str| {
            let mut r = Problem::unauthorized(detail).into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"tollgate\""));
            r
        };
        // Two Authorization headers are ambiguous (which one did a proxy in front check?).
        if parts.headers.get_all(header::AUTHORIZATION).iter().nth(1).is_some() {
            return Err(unauthorized("send one Authorization header, not several"));
        }
        let secret = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer);
        let Some(secret) = secret.filter(|s| !s.is_empty()) else {
            return Err(unauthorized("send a token: Authorization: Bearer <token>"));
        };
        match store.authenticate(secret).await {
            Ok(Some(token)) => Ok(Caller { token, store }),
            Ok(None) => Err(unauthorized("unknown token")),
            Err(e) => Err(store_problem(e).into_response()),
        }
    }
}

/// The credentials of an `Authorization` value of the Bearer scheme. The scheme is
/// case-insensitive (RFC 9110 section 11.1: `bearer`, `Bearer`, `BEARER` alike) and is
/// followed by one or more spaces; any other scheme is not a bearer token.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| credentials.trim_matches(' '))
}

/// A caller of at least some role, checked while extracting the request's parts: a handler
/// takes it before its path, query and body, so a caller without the role is refused (401 or
/// 403) before anything of the request is read, and learns nothing of the rules of its body.
macro_rules! role_extractor {
    ($(#[$doc:meta])* $name:ident, $role:expr) => {
        $(#[$doc])*
        pub struct $name(pub Caller);

        impl FromRequestParts<AppState> for $name {
            type Rejection = Response;

            async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
                let caller = Caller::from_request_parts(parts, state).await?;
                caller.require($role).map_err(IntoResponse::into_response)?;
                Ok($name(caller))
            }
        }
    };
}

role_extractor!(
    /// A caller whose token is a viewer, an editor or an admin.
    AsViewer,
    Role::Viewer
);
role_extractor!(
    /// A caller whose token is an editor or an admin.
    AsEditor,
    Role::Editor
);
role_extractor!(
    /// A caller whose token is an admin.
    AsAdmin,
    Role::Admin
);

impl Caller {
    pub(crate) fn require(&self, role: Role) -> Result<(), Problem> {
        if self.token.role >= role {
            Ok(())
        } else {
            Err(Problem::forbidden(format!(
                "token {:?} is a {}; this needs {}",
                self.token.name,
                self.token.role.as_str(),
                role.as_str()
            )))
        }
    }
}

/// A store failure as an answer.
pub(crate) fn store_problem(e: StoreError) -> Problem {
    match e {
        StoreError::NotFound { .. } => Problem::no_such(e.to_string()),
        StoreError::Exists { .. } => Problem::conflict(e.to_string()),
        StoreError::Stale { .. } => Problem::stale(e.to_string()),
        StoreError::OutOfScope { .. } => Problem::forbidden(e.to_string()),
        StoreError::TokenRevoked { .. } => Problem::unauthorized(e.to_string()),
        StoreError::Invalid { field, message } => Problem::invalid(field, message),
        StoreError::Database(_) => {
            tracing::error!(error = %e, "policy database failed");
            Problem::database_unavailable("the policy database did not answer; try again")
        }
        _ => Problem::internal(),
    }
}
