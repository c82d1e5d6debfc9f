//! The management API, `/v1/admin/...`: policies, tokens and the audit log over the policy
//! database, behind bearer tokens with a role (viewer < editor < admin) and optional apps.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tollgate_config::PolicySpec;
use tollgate_store::{
    ConsumerLimit, ConsumerLimitInput, DEFAULT_PAGE, MAX_PAGE, Page, PolicyRecord, Role, StoreError,
    TokenRecord,
};

use crate::auth::{AsAdmin, AsEditor, AsViewer, store_problem};
use crate::decision::{ANONYMOUS_POLICY, CONSUMER_POLICY, INLINE_POLICY};
use crate::live::{self, LiveBody};
use crate::state::AppState;
use tollgate_http::Problem;
use tollgate_http::extract::{ApiJson, Path, Query, UniqueObject};

/// `?after=<cursor>&limit=<n>`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    after: Option<String>,
    limit: Option<u32>,
}

/// The OpenAPI description of a list's `limit`, from the store's bounds.
fn page_limit_doc() -> String {
    format!("1 to {MAX_PAGE}, default {DEFAULT_PAGE}")
}

impl From<PageQuery> for Page {
    fn from(q: PageQuery) -> Page {
        Page { after: q.after, limit: q.limit }
    }
}

/// A page of items, and the cursor of the next page (absent on the last).
#[derive(Debug, Serialize)]
pub struct List<T> {
    items: Vec<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// A policy in a management answer: stored (versioned, editable) or from the file (read-only).
#[derive(Debug, Serialize)]
#[serde(untagged)]
#[allow(missing_docs)] // fields are documented where they are defined (PolicyRecord, PolicySpec)
pub enum PolicyView {
    Stored {
        #[serde(flatten)]
        record: PolicyRecord,
        source: &'static str,
    },
    File {
        name: String,
        #[serde(flatten)]
        spec: PolicySpec,
        source: &'static str,
        read_only: bool,
    },
}

impl PolicyView {
    fn name(&self) -> &str {
        match self {
            PolicyView::Stored { record, .. } => &record.name,
            PolicyView::File { name, .. } => name,
        }
    }
}

fn etag(version: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{version}\"")).unwrap_or_else(|_| HeaderValue::from_static("\"0\""))
}

/// The version `If-Match` asks for: `"3"`, `3` or `W/"3"`; `*` or absent: any.
fn if_match(headers: &HeaderMap) -> Result<Option<i64>, Problem> {
    let Some(value) = headers.get(header::IF_MATCH) else { return Ok(None) };
    let text = value.to_str().unwrap_or("").trim();
    if text == "*" {
        return Ok(None);
    }
    let bare = text.trim_start_matches("W/").trim_matches('"');
    bare.parse::<i64>()
        .map(Some)
        .map_err(|_| Problem::invalid("If-Match", "If-Match is the version from the ETag, like \"3\""))
}

fn file_policy(state: &AppState, name: &str) -> Option<PolicyView> {
    let config = state.config();
    let policy = config.policies.get(name)?;
    Some(PolicyView::File {
        name: name.to_owned(),
        spec: PolicySpec::of(policy),
        source: "file",
        read_only: true,
    })
}

fn stored_response(status: StatusCode, record: PolicyRecord) -> Response {
    let tag = etag(record.version);
    let mut response = (status, Json(PolicyView::Stored { record, source: "database" })).into_response();
    response.headers_mut().insert(header::ETAG, tag);
    response
}

/// After a change through this instance, its own view is updated at once (the others within
/// their poll interval).
async fn refresh(state: &AppState) {
    if let Err(e) = state.reload_stored().await {
        tracing::warn!(error = %e, "cannot reload stored policies after a change");
    }
}

/// `GET /v1/admin/policies`: file and stored policies the token may see, by name.
#[utoipa::path(get, path = "/v1/admin/policies", tag = "management", params(("after" = Option<String>, Query, description = "Cursor: the previous page's `next`"), ("limit" = Option<u32>, Query, description = page_limit_doc())), responses((status = 200, description = "File and database policies the token may see, by name: `items`, `next`"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn list_policies(
    State(state): State<AppState>,
    AsViewer(caller): AsViewer,
    Query(query): Query<PageQuery>,
) -> Result<Json<List<PolicyView>>, Problem> {
    let page = Page::from(query);
    let mut views: Vec<PolicyView> = caller
        .store
        .all_policies()
        .await
        .map_err(store_problem)?
        .into_iter()
        .filter(|r| caller.token.may_see(&r.spec.apps))
        .map(|record| PolicyView::Stored { record, source: "database" })
        .collect();
    let config = state.config();
    views.extend(config.policies.iter().filter_map(|(name, _)| file_policy(&state, name)));
    views.sort_by(|a, b| a.name().cmp(b.name()));
    let after = page.after.clone().unwrap_or_default();
    let limit = page.size() as usize;
    let mut items: Vec<PolicyView> =
        views.into_iter().filter(|v| v.name() > after.as_str()).take(limit + 1).collect();
    let next = (items.len() > limit).then(|| {
        items.truncate(limit);
        items.last().map(|v| v.name().to_owned()).unwrap_or_default()
    });
    Ok(Json(List { items, next }))
}

/// `GET /v1/admin/policies/{name}`.
#[utoipa::path(get, path = "/v1/admin/policies/{name}", tag = "management", params(("name" = String, Path)), responses((status = 200, description = "The policy, with `ETag: \"<version>\"`"), (status = 404, body = Problem, content_type = "application/problem+json"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn get_policy(
    State(state): State<AppState>,
    AsViewer(caller): AsViewer,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    if let Some(view) = file_policy(&state, &name) {
        return Ok(Json(view).into_response());
    }
    let record = caller.store.get_policy(&name).await.map_err(store_problem)?;
    if !caller.token.may_see(&record.spec.apps) {
        return Err(store_problem(StoreError::NotFound { kind: "policy", name }));
    }
    Ok(stored_response(StatusCode::OK, record))
}

/// `POST /v1/admin/policies` with `{"name": ..., rules, ...}`.
#[utoipa::path(post, path = "/v1/admin/policies", tag = "management", request_body(content = Object, description = "`name`, `rules`, `description`, `mode`, `on_limit`, `max_wait`, `reserve`, `apps`, `enabled`"), responses((status = 201, description = "Created, with ETag and Location"), (status = 400, body = Problem, content_type = "application/problem+json"), (status = 409, body = Problem, content_type = "application/problem+json"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn create_policy(
    State(state): State<AppState>,
    AsEditor(caller): AsEditor,
    ApiJson(UniqueObject(mut body)): ApiJson<UniqueObject>,
) -> Result<Response, Problem> {
    let name = match body.remove("name") {
        Some(Value::String(name)) => name,
        _ => return Err(Problem::invalid("name", "a policy needs a name (a string)")),
    };
    let input: PolicySpec = tollgate_http::extract::parse(&serde_json::to_vec(&body).unwrap_or_default())?;
    if state.config().policies.get(&name).is_some() {
        return Err(Problem::conflict(format!("policy {name:?} is defined in the configuration file")));
    }
    // The store refuses apps beyond the token's (403).
    let record =
        caller.store.create_policy(caller.token.actor(), &name, &input).await.map_err(store_problem)?;
    refresh(&state).await;
    let mut response = stored_response(StatusCode::CREATED, record);
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/admin/policies/{name}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `PUT /v1/admin/policies/{name}`, with `If-Match: "<version>"` for optimistic concurrency.
#[utoipa::path(put, path = "/v1/admin/policies/{name}", tag = "management", params(("name" = String, Path), ("If-Match" = Option<String>, Header, description = "The version from the ETag")), request_body(content = Object, description = "As for creation, without `name`"), responses((status = 200, description = "Updated, with the new ETag"), (status = 400, body = Problem, content_type = "application/problem+json"), (status = 404, body = Problem, content_type = "application/problem+json"), (status = 409, body = Problem, content_type = "application/problem+json"), (status = 412, body = Problem, content_type = "application/problem+json"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn update_policy(
    State(state): State<AppState>,
    AsEditor(caller): AsEditor,
    Path(name): Path<String>,
    headers: HeaderMap,
    ApiJson(input): ApiJson<PolicySpec>,
) -> Result<Response, Problem> {
    let version = if_match(&headers)?;
    if state.config().policies.get(&name).is_some() {
        return Err(Problem::conflict(format!(
            "policy {name:?} is defined in the configuration file: read-only"
        )));
    }
    // The store checks the token's apps against the policy as stored, inside the update's
    // transaction, and against the apps it would have (403).
    let record = caller
        .store
        .update_policy(caller.token.actor(), &name, &input, version)
        .await
        .map_err(store_problem)?;
    refresh(&state).await;
    Ok(stored_response(StatusCode::OK, record))
}

/// `DELETE /v1/admin/policies/{name}`, with an optional `If-Match`.
#[utoipa::path(delete, path = "/v1/admin/policies/{name}", tag = "management", params(("name" = String, Path), ("If-Match" = Option<String>, Header)), responses((status = 204, description = "Deleted"), (status = 404, body = Problem, content_type = "application/problem+json"), (status = 409, body = Problem, content_type = "application/problem+json"), (status = 412, body = Problem, content_type = "application/problem+json"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn delete_policy(
    State(state): State<AppState>,
    AsEditor(caller): AsEditor,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, Problem> {
    let version = if_match(&headers)?;
    if state.config().policies.get(&name).is_some() {
        return Err(Problem::conflict(format!(
            "policy {name:?} is defined in the configuration file: read-only"
        )));
    }
    // The store checks the token's apps against the policy as stored, inside the delete's
    // transaction (403).
    caller.store.delete_policy(caller.token.actor(), &name, version).await.map_err(store_problem)?;
    refresh(&state).await;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/admin/tokens` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    name: String,
    role: Role,
    #[serde(default)]
    apps: Option<Vec<String>>,
}

/// A token as created: the only time its secret is shown.
#[derive(Debug, Serialize)]
pub struct CreatedToken {
    #[serde(flatten)]
    token: TokenRecord,
    secret: String,
}

/// `GET /v1/admin/tokens` (admin): the tokens within the caller's apps.
#[utoipa::path(get, path = "/v1/admin/tokens", tag = "management", params(("after" = Option<String>, Query, description = "Cursor: the previous page's `next`"), ("limit" = Option<u32>, Query, description = page_limit_doc())), responses((status = 200, description = "Tokens within the caller's apps (admin)"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn list_tokens(
    AsAdmin(caller): AsAdmin,
    Query(query): Query<PageQuery>,
) -> Result<Json<List<TokenRecord>>, Problem> {
    // Filtered while paging, so neither the page nor its cursor names a token beyond the
    // caller's apps.
    let (items, next) = caller
        .store
        .tokens_visible_to(caller.token.actor(), &Page::from(query))
        .await
        .map_err(store_problem)?;
    Ok(Json(List { items, next }))
}

/// `POST /v1/admin/tokens` (admin): answers the secret once.
#[utoipa::path(post, path = "/v1/admin/tokens", tag = "management", request_body(content = Object, description = "`name`, `role` (viewer, editor, admin), `apps`"), responses((status = 201, description = "The token and its `secret`, shown once"), (status = 400, body = Problem, content_type = "application/problem+json"), (status = 409, body = Problem, content_type = "application/problem+json"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn create_token(
    AsAdmin(caller): AsAdmin,
    ApiJson(new): ApiJson<NewToken>,
) -> Result<Response, Problem> {
    // The store refuses apps beyond the token's (403).
    let (token, secret) = caller
        .store
        .create_token(caller.token.actor(), &new.name, new.role, new.apps)
        .await
        .map_err(store_problem)?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, secret })).into_response())
}

/// `DELETE /v1/admin/tokens/{name}` (admin).
#[utoipa::path(delete, path = "/v1/admin/tokens/{name}", tag = "management", params(("name" = String, Path)), responses((status = 204, description = "Revoked"), (status = 404, body = Problem, content_type = "application/problem+json"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn delete_token(AsAdmin(caller): AsAdmin, Path(name): Path<String>) -> Result<StatusCode, Problem> {
    // The store reads the target token itself and checks its apps against the caller's inside
    // the delete's transaction (403): never a lookup in a page of tokens.
    caller.store.delete_token(caller.token.actor(), &name).await.map_err(store_problem)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/admin/audit`: changes, newest first; policy changes the token may see, and token
/// changes for admins.
#[utoipa::path(get, path = "/v1/admin/audit", tag = "management", params(("after" = Option<String>, Query, description = "Cursor: the previous page's `next`"), ("limit" = Option<u32>, Query, description = page_limit_doc())), responses((status = 200, description = "Changes, newest first: `at`, `actor`, `action`, `kind`, `subject`, `before`, `after`"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn audit(
    AsViewer(caller): AsViewer,
    Query(query): Query<PageQuery>,
) -> Result<Json<List<Value>>, Problem> {
    let page = Page::from(query);
    let entries = caller.store.audit(&page).await.map_err(store_problem)?;
    let next = (entries.len() as u32 == page.size())
        .then(|| entries.last().map(|e| e.id.to_string()).unwrap_or_default());
    // Each entry's scope is a typed part of it (see `AuditEntry::visible_to`): token changes
    // for admins whose apps cover that token, other changes when the item is visible.
    let items = entries
        .into_iter()
        .filter(|e| e.visible_to(&caller.token))
        .filter_map(|e| serde_json::to_value(e).ok())
        .collect();
    Ok(Json(List { items, next }))
}

fn limit_response(status: StatusCode, record: ConsumerLimit) -> Response {
    let tag = etag(record.version);
    let mut response = (status, Json(record)).into_response();
    response.headers_mut().insert(header::ETAG, tag);
    response
}

/// `GET /v1/admin/consumers/{consumer}/limits`.
#[utoipa::path(get, path = "/v1/admin/consumers/{consumer}/limits", tag = "management", params(("consumer" = String, Path)), responses((status = 200, description = "The consumer's limit records"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn list_consumer_limits(
    AsViewer(caller): AsViewer,
    Path(consumer): Path<String>,
) -> Result<Json<List<ConsumerLimit>>, Problem> {
    let items = caller.store.consumer_limits(&consumer).await.map_err(store_problem)?;
    Ok(Json(List { items, next: None }))
}

/// `POST /v1/admin/consumers/{consumer}/limits`: a new limit record.
#[utoipa::path(post, path = "/v1/admin/consumers/{consumer}/limits", tag = "management", params(("consumer" = String, Path)), request_body(content = Object, description = "`per_second` .. `per_month` (-1 unlimited), `scope`, `from`, `to`"), responses((status = 201, description = "Created"), (status = 400, body = Problem, content_type = "application/problem+json"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn create_consumer_limit(
    State(state): State<AppState>,
    AsEditor(caller): AsEditor,
    Path(consumer): Path<String>,
    ApiJson(input): ApiJson<ConsumerLimitInput>,
) -> Result<Response, Problem> {
    // Consumer limits belong to no app: the store refuses tokens limited to some (403).
    let record = caller
        .store
        .create_consumer_limit(caller.token.actor(), &consumer, &input)
        .await
        .map_err(store_problem)?;
    refresh(&state).await;
    let mut response = limit_response(StatusCode::CREATED, record.clone());
    if let Ok(location) =
        HeaderValue::from_str(&format!("/v1/admin/consumers/{consumer}/limits/{}", record.id))
    {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `PUT /v1/admin/consumers/{consumer}/limits/{id}`, with an optional `If-Match`.
#[utoipa::path(put, path = "/v1/admin/consumers/{consumer}/limits/{id}", tag = "management", params(("consumer" = String, Path), ("id" = String, Path), ("If-Match" = Option<String>, Header)), request_body(content = Object), responses((status = 200, description = "Updated"), (status = 400, body = Problem, content_type = "application/problem+json"), (status = 404, body = Problem, content_type = "application/problem+json"), (status = 412, body = Problem, content_type = "application/problem+json"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn update_consumer_limit(
    State(state): State<AppState>,
    AsEditor(caller): AsEditor,
    Path((consumer, id)): Path<(String, String)>,
    headers: HeaderMap,
    ApiJson(input): ApiJson<ConsumerLimitInput>,
) -> Result<Response, Problem> {
    let version = if_match(&headers)?;
    let record = caller
        .store
        .update_consumer_limit(caller.token.actor(), &consumer, &id, &input, version)
        .await
        .map_err(store_problem)?;
    refresh(&state).await;
    Ok(limit_response(StatusCode::OK, record))
}

/// `DELETE /v1/admin/consumers/{consumer}/limits/{id}`, with an optional `If-Match`.
#[utoipa::path(delete, path = "/v1/admin/consumers/{consumer}/limits/{id}", tag = "management", params(("consumer" = String, Path), ("id" = String, Path), ("If-Match" = Option<String>, Header)), responses((status = 204, description = "Deleted"), (status = 404, body = Problem, content_type = "application/problem+json"), (status = 412, body = Problem, content_type = "application/problem+json"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn delete_consumer_limit(
    State(state): State<AppState>,
    AsEditor(caller): AsEditor,
    Path((consumer, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<StatusCode, Problem> {
    let version = if_match(&headers)?;
    caller
        .store
        .delete_consumer_limit(caller.token.actor(), &consumer, &id, version)
        .await
        .map_err(store_problem)?;
    refresh(&state).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Policy names reported without a policy of that name in the file or the database.
const BUILTIN_NAMES: &[&str] = &[INLINE_POLICY, CONSUMER_POLICY, ANONYMOUS_POLICY];

/// Allowed and denied checks per second over the last 15 minutes, and the keys nearest their
/// limits, as seen by this instance (viewer).
///
/// The keys are callers' identities (users, addresses, API keys) of every app whose traffic
/// the policy counts, so a token sees them only when the policy's traffic is all within its
/// apps: unrestricted tokens everywhere; tokens limited to some apps for stored policies all of
/// whose apps they hold. Such tokens get the counts of global policies (the file's, stored
/// ones of no app) with the keys withheld, and nothing of the pseudo-policies `inline`,
/// `consumer` and `anonymous`, which count every caller of every app (404, as for a policy
/// they may not see).
#[utoipa::path(get, path = "/v1/admin/live/policies/{name}", tag = "management", params(("name" = String, Path)), responses((status = 200, description = "`allowed`, `denied`, `shadow_denied`: 900 one-second buckets, oldest first, from `start_sec`; `nearest`: up to 20 keys with the smallest fraction left (empty, with `keys_withheld`, for a token limited to some apps on a policy reaching beyond them)"), (status = 404, body = Problem, content_type = "application/problem+json"), (status = 401, description = "No or unknown bearer token", body = Problem, content_type = "application/problem+json"), (status = 403, description = "Outside the token's role or apps", body = Problem, content_type = "application/problem+json")))]
pub async fn policy_live(
    State(state): State<AppState>,
    AsViewer(signed): AsViewer,
    Path(name): Path<String>,
) -> Result<Json<LiveBody>, Problem> {
    let token = &signed.token;
    let unknown = || Problem::no_such(format!("there is no policy named {name:?}"));
    // The apps of the policy's traffic: None when it is not visible to the token at all.
    let apps: Vec<String> = if BUILTIN_NAMES.contains(&name.as_str()) {
        if token.apps.is_some() {
            return Err(unknown());
        }
        Vec::new()
    } else if state.config().policies.get(&name).is_some() {
        Vec::new()
    } else {
        match signed.store.get_policy(&name).await {
            Ok(record) if token.may_see(&record.spec.apps) => record.spec.apps,
            Ok(_) | Err(tollgate_store::StoreError::NotFound { .. }) => return Err(unknown()),
            Err(_) => {
                return Err(Problem::database_unavailable("the policy database did not answer; try again"));
            }
        }
    };
    let now = live::now_ms();
    let mut body = state.live.snapshot_at(&name, now).unwrap_or_else(|| LiveBody::empty(&name, now));
    if !token.may_change(&apps) {
        body.nearest.clear();
        body.keys_withheld = true;
    }
    Ok(Json(body))
}
