//! The JSON form of `ShouldRateLimit`, as upstream's `POST /json` speaks it (protobuf's JSON
//! mapping: camelCase fields, enums by name, durations as `"12.5s"`; snake_case field names are
//! accepted too), and the [`router`] that serves it over HTTP beside the decision API.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tollgate_http::Problem;
use tollgate_http::extract::ApiJson;
use tonic::Code as GrpcCode;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, rate_limit::Unit as ProtoUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value as ProtoValue};
use serde::{Deserialize, Serialize};

use crate::EnvoyService;

/// `POST /json` answered by `service`: 200 when every descriptor is OK, 429 when one is over its
/// limit, and problems as the decision API gives them (the binary merges this router into the
/// server's, under its body limit and fallbacks).
pub fn router(service: EnvoyService) -> axum::Router {
    axum::Router::new().route("/json", axum::routing::post(answer)).with_state(service)
}

async fn answer(
    State(envoy): State<EnvoyService>,
    ApiJson(req): ApiJson<JsonRequest>,
) -> Result<Response, Problem> {
    let answer = envoy.decide(req.into()).await.map_err(|status| match status.code() {
        GrpcCode::InvalidArgument => Problem::invalid("descriptors", status.message().to_owned()),
        GrpcCode::Unavailable => Problem::unavailable(status.message().to_owned()),
        _ => Problem::internal(),
    })?;
    let body = JsonResponse::from(answer);
    let code = if body.overall_code == "OVER_LIMIT" { StatusCode::TOO_MANY_REQUESTS } else { StatusCode::OK };
    Ok((code, Json(body)).into_response())
}

/// A request entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

/// A per-descriptor limit override.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JsonOverride {
    #[serde(alias = "requests_per_unit")]
    requests_per_unit: u32,
    unit: String,
}

/// A request descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JsonDescriptor {
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: Option<u64>,
}

/// `POST /json` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JsonRequest {
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: u32,
}

fn unit_number(name: &str) -> i32 {
    ProtoUnit::from_str_name(&name.to_ascii_uppercase()).map_or(-1, |u| u as i32)
}

impl From<JsonRequest> for RateLimitRequest {
    fn from(r: JsonRequest) -> Self {
        RateLimitRequest {
            domain: r.domain,
            hits_addend: r.hits_addend,
            descriptors: r
                .descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d.entries.into_iter().map(|e| Entry { key: e.key, value: e.value }).collect(),
                    limit: d.limit.map(|l| RateLimitOverride {
                        requests_per_unit: l.requests_per_unit,
                        unit: unit_number(&l.unit),
                    }),
                    hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                    ..Default::default()
                })
                .collect(),
        }
    }
}

/// A status's limit.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonLimit {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    requests_per_unit: u32,
    unit: &'static str,
}

/// One descriptor's status.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonStatus {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonLimit>,
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

/// A response header to add.
#[derive(Debug, Serialize)]
pub struct JsonHeader {
    key: String,
    value: String,
}

/// `POST /json` answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonResponse {
    /// `OK` or `OVER_LIMIT`.
    pub overall_code: &'static str,
    statuses: Vec<JsonStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dynamic_metadata: Option<JsonStruct>,
}

/// A protobuf `Struct` in protobuf's JSON mapping: an object.
#[derive(Debug)]
pub struct JsonStruct(Struct);

/// A protobuf `Value`: its JSON value (a number that JSON cannot hold, NaN or an infinity, as
/// protobuf's JSON mapping has none, is `null`).
struct JsonValue<'a>(&'a ProtoValue);

impl Serialize for JsonStruct {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Keys sorted, so that the answer reads the same every time.
        let sorted: std::collections::BTreeMap<&String, JsonValue<'_>> =
            self.0.fields.iter().map(|(k, v)| (k, JsonValue(v))).collect();
        sorted.serialize(s)
    }
}

impl Serialize for JsonValue<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0.kind {
            None | Some(Kind::NullValue(_)) => s.serialize_none(),
            Some(Kind::NumberValue(n)) if n.is_finite() => s.serialize_f64(*n),
            Some(Kind::NumberValue(_)) => s.serialize_none(),
            Some(Kind::StringValue(t)) => s.serialize_str(t),
            Some(Kind::BoolValue(b)) => s.serialize_bool(*b),
            Some(Kind::StructValue(st)) => {
                let sorted: std::collections::BTreeMap<&String, JsonValue<'_>> =
                    st.fields.iter().map(|(k, v)| (k, JsonValue(v))).collect();
                sorted.serialize(s)
            }
            Some(Kind::ListValue(l)) => s.collect_seq(l.values.iter().map(JsonValue)),
        }
    }
}

impl From<RateLimitResponse> for JsonResponse {
    fn from(r: RateLimitResponse) -> Self {
        let code = |c: i32| Code::try_from(c).unwrap_or(Code::Unknown).as_str_name();
        JsonResponse {
            overall_code: code(r.overall_code),
            statuses: r
                .statuses
                .into_iter()
                .map(|s| JsonStatus {
                    code: code(s.code),
                    current_limit: s.current_limit.map(|l| JsonLimit {
                        name: l.name,
                        requests_per_unit: l.requests_per_unit,
                        unit: ProtoUnit::try_from(l.unit).unwrap_or(ProtoUnit::Unknown).as_str_name(),
                    }),
                    limit_remaining: s.limit_remaining,
                    duration_until_reset: s.duration_until_reset.map(|d| {
                        if d.nanos == 0 {
                            format!("{}s", d.seconds)
                        } else {
                            format!("{}.{:09}s", d.seconds, d.nanos).trim_end_matches('0').to_owned()
                        }
                    }),
                })
                .collect(),
            response_headers_to_add: r
                .response_headers_to_add
                .into_iter()
                .map(|h| JsonHeader { key: h.key, value: h.value })
                .collect(),
            dynamic_metadata: r.dynamic_metadata.map(JsonStruct),
        }
    }
}
