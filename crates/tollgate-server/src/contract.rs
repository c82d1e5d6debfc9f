//! What the derived OpenAPI document cannot say by itself, added to it before it is served:
//! the exact request shapes (required fields, `oneOf` for the alternatives a handler picks
//! between, enums of algorithms and roles, bounds), and the statuses every route shares (415
//! and 413 on body routes, 400 on routes with query parameters, 401 and 403 behind tokens).
//!
//! The handlers validate more than JSON Schema can express (a rule's state budget, a period's
//! range); those refusals are the documented 400s.

use serde_json::{Map, Value, json};
use tollgate_config::MAX_APPS;
use tollgate_core::limits::{MAX_CONCURRENCY_LIMIT, MAX_KEY_BYTES, MAX_NAME_BYTES, MAX_RULES};
use tollgate_store::MAX_CONSUMER_BYTES;

use crate::api::MAX_INLINE_RULES;

const PROBLEM: &str = "application/problem+json";

/// A duration: "250ms", "1s", "1h", "7d", or an integer of milliseconds.
fn period() -> Value {
    // The strings described are a safe subset of what the server parses (humantime, within
    // 1ms to a year); integers are exact.
    json!({"oneOf": [
        {"type": "string", "pattern": "^([1-9][0-9]{0,2}(ms|s|m|h)|[1-9][0-9]?d)$",
         "description": "\"250ms\", \"1s\", \"1h\", \"7d\""},
        {"type": "integer", "minimum": 1, "maximum": MAX_PERIOD_MS, "description": "milliseconds"},
    ]})
}

/// [`tollgate_core::Period::MAX`] in milliseconds: a year of 365.25 days.
const MAX_PERIOD_MS: u64 = 31_557_600_000;

fn count() -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": tollgate_core::limits::MAX_COUNT})
}

/// One rule: `algorithm` and that algorithm's parameters, an optional `name`.
fn rule(with_concurrency: bool) -> Value {
    let name = json!({"type": ["string", "null"], "maxLength": MAX_NAME_BYTES});
    let shape = |algorithm: &str, params: &[(&str, Value)], required: &[&str]| {
        let mut properties = Map::new();
        properties.insert("algorithm".into(), json!({"type": "string", "enum": [algorithm]}));
        properties.insert("name".into(), name.clone());
        for (field, schema) in params {
            properties.insert((*field).into(), schema.clone());
        }
        let mut all = vec!["algorithm"];
        all.extend_from_slice(required);
        json!({"type": "object", "title": algorithm, "properties": properties, "required": all,
               "additionalProperties": false})
    };
    let mut rules = json!({
        "description": "A rule as in the configuration file, chosen by its `algorithm`.",
        "oneOf": [
            shape("fixed_window", &[("limit", count()), ("period", period()),
                ("align", json!({"type": ["string", "null"], "enum": ["clock", "first_hit", null]}))], &["limit", "period"]),
            shape("sliding_window_log", &[("limit", json!({"type": "integer", "minimum": 1,
                "maximum": tollgate_core::limits::MAX_LOG_LIMIT})), ("period", period())], &["limit", "period"]),
            shape("sliding_window_counter", &[("limit", count()), ("period", period())], &["limit", "period"]),
            shape("token_bucket", &[("capacity", count()), ("refill", count()), ("per", period())],
                &["capacity", "refill", "per"]),
            shape("gcra", &[("limit", count()), ("period", period()), ("burst", count())],
                &["limit", "period", "burst"]),
        ],
    });
    // Units held under leases are taken with /v1/acquire, not checked.
    if with_concurrency {
        let concurrency = shape(
            "concurrency",
            &[
                (
                    "limit",
                    json!({"type": "integer", "minimum": 1,
            "maximum": MAX_CONCURRENCY_LIMIT}),
                ),
                ("lease", period()),
            ],
            &["limit", "lease"],
        );
        if let Some(shapes) = rules["oneOf"].as_array_mut() {
            shapes.push(concurrency);
        }
    }
    rules
}

/// An object of exactly `properties`, `required` among them.
fn object(properties: &[(&str, Value)], required: &[&str]) -> Value {
    let properties: Map<String, Value> =
        properties.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

fn key() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": MAX_KEY_BYTES,
           "description": "1 to 512 bytes, not starting with `consumer:`, `anonymous:`, `envoy:` or `envoy#`"})
}

fn name() -> Value {
    json!({"type": "string", "minLength": 1})
}

/// A policy's or token's name as created.
fn new_name() -> Value {
    json!({"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"})
}

fn inline_rules(schema: &str) -> Value {
    json!({"type": "array", "items": {"$ref": format!("#/components/schemas/{schema}")}, "minItems": 1,
           "maxItems": MAX_INLINE_RULES, "uniqueItems": true})
}

fn consumer_id() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": MAX_CONSUMER_BYTES,
           "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
           "description": "1 to 256 bytes without control characters"})
}

/// A consumer limit's scope (a policy or route name of the caller's): as a consumer id, or null.
fn scope() -> Value {
    json!({"type": ["string", "null"], "minLength": 1, "maxLength": MAX_CONSUMER_BYTES,
           "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
           "description": "1 to 256 bytes without control characters"})
}

/// The request bodies, by schema name: the alternatives a handler accepts, each exactly.
fn request_schemas() -> Vec<(&'static str, Value)> {
    let cost = json!({"type": "integer", "minimum": 0, "default": 1});
    // 0 only peeks.
    let units = json!({"type": "integer", "minimum": 0, "maximum": MAX_CONCURRENCY_LIMIT, "default": 1});
    let lease_limit = json!({"type": "integer", "minimum": 1, "maximum": MAX_CONCURRENCY_LIMIT});
    let lease_id = json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"});
    let release_units = json!({"type": ["integer", "null"], "minimum": 1, "maximum": MAX_CONCURRENCY_LIMIT,
        "description": "default: all the lease holds"});
    vec![
        ("Rule", rule(true)),
        ("CheckRule", rule(false)),
        (
            "CheckRequest",
            json!({"oneOf": [
                object(&[("key", key()), ("policy", name()), ("cost", cost.clone())], &["key", "policy"]),
                object(&[("key", key()), ("limits", inline_rules("CheckRule")), ("cost", cost.clone())], &["key", "limits"]),
                object(&[("consumer", consumer_id()), ("scope", scope()), ("cost", cost.clone())], &["consumer"]),
                object(&[("anonymous_ip", json!({"type": "string", "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]})),
                    ("cost", cost.clone())], &["anonymous_ip"]),
            ]}),
        ),
        (
            "AcquireRequest",
            json!({"oneOf": [
                object(&[("key", key()), ("policy", name()), ("cost", units.clone())], &["key", "policy"]),
                object(&[("key", key()), ("limit", lease_limit.clone()), ("lease", period()), ("cost", units.clone())],
                    &["key", "limit", "lease"]),
            ]}),
        ),
        (
            "ReleaseRequest",
            json!({"oneOf": [
                object(&[("key", key()), ("policy", name()), ("lease_id", lease_id.clone()), ("cost", release_units.clone())],
                    &["key", "policy", "lease_id"]),
                object(&[("key", key()), ("limit", lease_limit), ("lease", period()), ("lease_id", lease_id),
                    ("cost", release_units)], &["key", "limit", "lease", "lease_id"]),
            ]}),
        ),
        (
            "ResetRequest",
            json!({"oneOf": [
                object(&[("key", key()), ("policy", name())], &["key", "policy"]),
                object(&[("key", key()), ("limits", inline_rules("Rule"))], &["key", "limits"]),
            ]}),
        ),
        ("EnvoyRequest", envoy_request()),
        ("PolicySpec", policy_spec(false)),
        ("NewPolicy", policy_spec(true)),
        (
            "NewToken",
            object(
                &[
                    ("name", new_name()),
                    ("role", json!({"type": "string", "enum": ["viewer", "editor", "admin"]})),
                    (
                        "apps",
                        json!({"type": ["array", "null"], "items": app(), "minItems": 1, "maxItems": MAX_APPS,
                "description": "absent or null: every app"}),
                    ),
                ],
                &["name", "role"],
            ),
        ),
        ("ConsumerLimitInput", {
            let per = json!({"type": "integer", "description": "-1: unlimited",
                "oneOf": [{"enum": [-1]}, {"minimum": 1, "maximum": tollgate_core::limits::MAX_COUNT}]});
            let moment = json!({"type": ["string", "null"], "format": "date-time"});
            object(
                &[
                    ("per_second", per.clone()),
                    ("per_minute", per.clone()),
                    ("per_hour", per.clone()),
                    ("per_day", per.clone()),
                    ("per_week", per.clone()),
                    ("per_month", per),
                    ("scope", scope()),
                    ("from", moment.clone()),
                    ("to", moment),
                ],
                &["per_second", "per_minute", "per_hour", "per_day", "per_week", "per_month"],
            )
        }),
    ]
}

/// An app's name.
fn app() -> Value {
    json!({"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"})
}

/// Envoy's RateLimitRequest in protobuf's JSON mapping, as `/json` takes it.
fn envoy_request() -> Value {
    let text = json!({"type": "string", "minLength": 1, "maxLength": 256});
    let entry =
        object(&[("key", text.clone()), ("value", json!({"type": "string", "maxLength": 256}))], &["key"]);
    let limit = object(
        &[
            ("requestsPerUnit", json!({"type": "integer", "minimum": 0, "maximum": u32::MAX})),
            (
                "unit",
                json!({"type": "string", "enum": ["SECOND", "MINUTE", "HOUR", "DAY", "second", "minute", "hour", "day"]}),
            ),
        ],
        &["requestsPerUnit", "unit"],
    );
    let descriptor = object(
        &[
            ("entries", json!({"type": "array", "items": entry, "maxItems": 16})),
            ("limit", json!({"oneOf": [limit, {"type": "null"}]})),
            ("hitsAddend", json!({"type": ["integer", "null"], "minimum": 0, "maximum": u64::MAX})),
        ],
        &["entries"],
    );
    object(
        &[
            ("domain", text),
            ("descriptors", json!({"type": "array", "items": descriptor, "minItems": 1, "maxItems": 64})),
            ("hitsAddend", json!({"type": "integer", "minimum": 0, "maximum": u32::MAX})),
        ],
        &["domain", "descriptors"],
    )
}

/// A policy as written to the management API (`PolicySpec`); with its `name` on creation.
fn policy_spec(with_name: bool) -> Value {
    let mut properties = vec![
        ("description", json!({"type": ["string", "null"]})),
        (
            "rules",
            json!({"type": "array", "items": {"$ref": "#/components/schemas/Rule"}, "minItems": 1,
            "maxItems": MAX_RULES}),
        ),
        ("mode", json!({"type": "string", "enum": ["enforce", "shadow"], "default": "enforce"})),
        ("on_limit", json!({"type": "string", "enum": ["reject", "delay"], "default": "reject"})),
        (
            "max_wait",
            json!({"oneOf": [
            {"type": "string", "pattern": "^([1-9][0-9]{0,2}ms|[1-9]s|[1-5][0-9]s|60s)$"},
            {"type": "integer", "minimum": 1, "maximum": 60_000, "description": "milliseconds"},
            {"type": "null"},
        ], "description": "up to 60s; with on_limit = delay only, which needs it"}),
        ),
        (
            "reserve",
            json!({"oneOf": [
            {"type": "string", "enum": ["off", "auto"]},
            {"type": "object", "properties": {"max": {"type": "integer", "minimum": 1, "maximum": u64::MAX}},
             "required": ["max"], "additionalProperties": false},
        ], "default": "off", "description": "quota reservations; fixed window, token bucket and GCRA rules only"}),
        ),
        (
            "apps",
            json!({"type": "array", "items": app(), "maxItems": MAX_APPS, "description": "empty: a global policy"}),
        ),
        ("enabled", json!({"type": "boolean", "default": true})),
    ];
    let mut required = vec!["rules"];
    if with_name {
        properties.insert(0, ("name", new_name()));
        required.insert(0, "name");
    }
    let mut schema = object(&properties, &required);
    // A longest wait belongs to delaying policies only.
    schema["allOf"] = json!([
        {"if": {"properties": {"max_wait": {"not": {"type": "null"}}}, "required": ["max_wait"]},
         "then": {"properties": {"on_limit": {"enum": ["delay"]}}, "required": ["on_limit"]}},
        {"if": {"properties": {"on_limit": {"enum": ["delay"]}}, "required": ["on_limit"]},
         "then": {"properties": {"max_wait": {"not": {"type": "null"}}}, "required": ["max_wait"]}},
    ]);
    schema
}

/// Which body schema each body route takes.
const BODIES: &[(&str, &str, &str)] = &[
    ("/json", "post", "EnvoyRequest"),
    ("/v1/check", "post", "CheckRequest"),
    ("/v1/acquire", "post", "AcquireRequest"),
    ("/v1/release", "post", "ReleaseRequest"),
    ("/v1/reset", "post", "ResetRequest"),
    ("/v1/admin/policies", "post", "NewPolicy"),
    ("/v1/admin/policies/{name}", "put", "PolicySpec"),
    ("/v1/admin/tokens", "post", "NewToken"),
    ("/v1/admin/consumers/{consumer}/limits", "post", "ConsumerLimitInput"),
    ("/v1/admin/consumers/{consumer}/limits/{id}", "put", "ConsumerLimitInput"),
];

fn problem(description: &str) -> Value {
    json!({"description": description,
           "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}})
}

/// Adds `status` to an operation's responses unless it is there.
fn answer(op: &mut Value, status: &str, description: &str) {
    if let Some(responses) = op["responses"].as_object_mut() {
        responses.entry(status).or_insert_with(|| problem(description));
    }
}

/// Links from what a creation answers to the routes that read, change and delete it, so that
/// clients (and schemathesis's stateful phase) can follow create → get → update → delete.
fn links(doc: &mut Value) {
    let name = json!({"name": "$response.body#/name"});
    let policy = json!({"name": "$response.body#/name", "header.If-Match": "$response.header.ETag"});
    let limit = json!({"consumer": "$request.path.consumer", "id": "$response.body#/id",
                       "header.If-Match": "$response.header.ETag"});
    let set = [
        (
            "/v1/admin/policies",
            "post",
            vec![
                ("GetPolicy", "get_policy", name.clone()),
                ("UpdatePolicy", "update_policy", policy.clone()),
                ("DeletePolicy", "delete_policy", policy),
            ],
        ),
        ("/v1/admin/tokens", "post", vec![("DeleteToken", "delete_token", name)]),
        (
            "/v1/admin/consumers/{consumer}/limits",
            "post",
            vec![
                ("UpdateConsumerLimit", "update_consumer_limit", limit.clone()),
                ("DeleteConsumerLimit", "delete_consumer_limit", limit),
            ],
        ),
    ];
    for (path, method, targets) in set {
        let links: Map<String, Value> = targets
            .into_iter()
            .map(|(link, op, parameters)| {
                (link.to_owned(), json!({"operationId": op, "parameters": parameters}))
            })
            .collect();
        doc["paths"][path][method]["responses"]["201"]["links"] = Value::Object(links);
    }
}

/// The derived document with the contract's precision added.
pub fn complete(mut doc: Value) -> Value {
    let schemas = &mut doc["components"]["schemas"];
    for (name, schema) in request_schemas() {
        schemas[name] = schema;
    }
    doc["components"]["securitySchemes"]["bearer"] =
        json!({"type": "http", "scheme": "bearer", "description": "A token secret, `tg_...`"});
    // A consumer without any limit is answered with no limit and nothing remaining (null).
    for field in ["limit", "remaining"] {
        doc["components"]["schemas"]["DecisionBody"]["properties"][field]["type"] =
            json!(["integer", "null"]);
    }
    // Explained, a check answers each rule's state instead of a decision.
    doc["paths"]["/v1/check"]["post"]["responses"]["200"]["content"]["application/json"]["schema"] = json!({"oneOf": [{"$ref": "#/components/schemas/DecisionBody"}, {"$ref": "#/components/schemas/ExplainBody"}]});
    for (path, method, schema) in BODIES {
        doc["paths"][path][method]["requestBody"] = json!({"required": true, "content": {
            "application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}});
    }
    links(&mut doc);
    let Some(paths) = doc["paths"].as_object_mut() else { return doc };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else { continue };
        for (method, op) in item.iter_mut() {
            if op.get("requestBody").is_some() {
                answer(op, "413", "The body is larger than the server takes");
                answer(op, "415", "The body is not `application/json`");
                answer(op, "400", "Invalid request");
            }
            let params = op.get_mut("parameters").and_then(Value::as_array_mut);
            let mut bad_params_refused = false;
            for param in params.into_iter().flatten() {
                match (param["in"].as_str(), param["name"].as_str()) {
                    // The audit log's cursor is an entry id; the other lists' a name.
                    (Some("query"), Some("after")) if path == "/v1/admin/audit" => {
                        bad_params_refused = true;
                        param["schema"] = json!({"type": "string", "pattern": "^[0-9]{1,18}$"});
                    }
                    (Some("query"), Some("explain")) => {
                        bad_params_refused = true;
                        param["schema"] = json!({"type": "string", "enum": ["1", "true", "0", "false"]});
                    }
                    (Some("query"), Some("limit")) => {
                        bad_params_refused = true;
                        // Out of range is clamped to 1 to MAX_PAGE, not refused.
                        param["schema"] = json!({"type": "integer", "minimum": 0, "maximum": u32::MAX});
                    }
                    (Some("query"), _) => bad_params_refused = true,
                    (Some("header"), Some("If-Match")) => {
                        // `*`, or the ETag's version: `"3"`, `W/"3"` or `3`.
                        bad_params_refused = true;
                        param["schema"] =
                            json!({"type": "string", "pattern": "^(\\*|(W/)?\"?[0-9]{1,18}\"?)$"});
                    }
                    // Listing a consumer's records does not check the id: none match.
                    (Some("path"), Some("consumer")) if !(path.ends_with("/limits") && method == "get") => {
                        param["schema"] = consumer_id();
                        bad_params_refused = true; // validated by the handler
                    }
                    (Some("path"), Some("name")) => param["schema"] = name(),
                    _ => {}
                }
            }
            if bad_params_refused {
                answer(op, "400", "An unknown or invalid parameter");
            }
            let behind_token = path.starts_with("/v1/admin/") || path.starts_with("/v1/consumers/");
            if behind_token {
                op["security"] = json!([{"bearer": []}]);
                answer(op, "401", "No or unknown bearer token");
                if path != "/v1/admin/me" {
                    answer(op, "403", "Outside the token's role or apps");
                }
            }
        }
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openapi::document;

    fn shapes(doc: &Value, schema: &str) -> Vec<Vec<String>> {
        doc["components"]["schemas"][schema]["oneOf"]
            .as_array()
            .unwrap_or_else(|| panic!("{schema} has no oneOf"))
            .iter()
            .map(|s| {
                let mut r: Vec<String> = s["required"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_owned())
                    .collect();
                r.sort();
                r
            })
            .collect()
    }

    #[test]
    fn a_checks_four_shapes_are_alternatives() {
        let doc = document();
        assert_eq!(
            shapes(&doc, "CheckRequest"),
            [vec!["key", "policy"], vec!["key", "limits"], vec!["consumer"], vec!["anonymous_ip"]]
        );
        for s in doc["components"]["schemas"]["CheckRequest"]["oneOf"].as_array().unwrap() {
            assert_eq!(s["additionalProperties"], false, "{s}");
        }
        assert_eq!(shapes(&doc, "ResetRequest"), [vec!["key", "policy"], vec!["key", "limits"]]);
        assert_eq!(shapes(&doc, "AcquireRequest"), [vec!["key", "policy"], vec!["key", "lease", "limit"]]);
    }

    #[test]
    fn rules_name_every_algorithm_with_its_parameters() {
        let doc = document();
        let rules = doc["components"]["schemas"]["Rule"]["oneOf"].as_array().unwrap();
        let algorithms: Vec<&str> =
            rules.iter().map(|r| r["properties"]["algorithm"]["enum"][0].as_str().unwrap()).collect();
        assert_eq!(
            algorithms,
            [
                "fixed_window",
                "sliding_window_log",
                "sliding_window_counter",
                "token_bucket",
                "gcra",
                "concurrency"
            ]
        );
        // Each documented shape is one the server's rule parser takes.
        for (rule, example) in rules.iter().zip([
            json!({"algorithm": "fixed_window", "limit": 5, "period": "1h"}),
            json!({"algorithm": "sliding_window_log", "limit": 5, "period": "1m"}),
            json!({"algorithm": "sliding_window_counter", "limit": 5, "period": 1000}),
            json!({"algorithm": "token_bucket", "capacity": 5, "refill": 1, "per": "1s"}),
            json!({"algorithm": "gcra", "limit": 5, "period": "1s", "burst": 2}),
            json!({"algorithm": "concurrency", "limit": 5, "lease": "30s"}),
        ]) {
            let required: Vec<&str> =
                rule["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
            let given: Vec<&str> = example.as_object().unwrap().keys().map(String::as_str).collect();
            for field in &required {
                assert!(given.contains(field), "{field} of {example}");
            }
            serde_json::from_value::<tollgate_core::Rule>(example.clone()).expect("a valid rule");
        }
    }

    #[test]
    fn checks_take_no_concurrency_rule_and_delay_goes_with_max_wait() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        let algorithms = |name: &str| -> Vec<String> {
            schemas[name]["oneOf"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["properties"]["algorithm"]["enum"][0].as_str().unwrap().to_owned())
                .collect()
        };
        assert!(!algorithms("CheckRule").contains(&"concurrency".to_owned()));
        assert!(algorithms("Rule").contains(&"concurrency".to_owned()));
        let inline = &schemas["CheckRequest"]["oneOf"][1]["properties"]["limits"]["items"]["$ref"];
        assert_eq!(inline, "#/components/schemas/CheckRule");
        for name in ["PolicySpec", "NewPolicy"] {
            let both_ways = schemas[name]["allOf"].as_array().unwrap();
            assert_eq!(both_ways.len(), 2, "{name}");
            assert_eq!(both_ways[0]["then"]["properties"]["on_limit"]["enum"], json!(["delay"]));
            assert_eq!(both_ways[1]["then"]["required"], json!(["max_wait"]));
        }
    }

    #[test]
    fn body_routes_document_their_media_type_and_size_refusals() {
        let doc = document();
        for (path, method, schema) in BODIES {
            let op = &doc["paths"][path][method];
            assert_eq!(op["requestBody"]["required"], true, "{method} {path}");
            assert_eq!(
                op["requestBody"]["content"]["application/json"]["schema"]["$ref"],
                format!("#/components/schemas/{schema}")
            );
            for status in ["400", "413", "415"] {
                assert!(op["responses"][status].is_object(), "{method} {path} lacks {status}");
            }
        }
    }

    #[test]
    fn routes_behind_tokens_say_so_and_lists_refuse_bad_queries() {
        let doc = document();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                if path.starts_with("/v1/admin/") {
                    assert_eq!(op["security"][0]["bearer"], json!([]), "{method} {path}");
                    assert!(op["responses"]["401"].is_object(), "{method} {path}");
                }
                let queries = op["parameters"].as_array().into_iter().flatten().any(|p| p["in"] == "query");
                if queries {
                    assert!(op["responses"]["400"].is_object(), "{method} {path}");
                }
            }
        }
        let call_limits = &doc["paths"]["/v1/consumers/{consumer}/call-limits"]["get"]["parameters"][0];
        assert_eq!(call_limits["schema"]["maxLength"], MAX_CONSUMER_BYTES);
    }

    #[test]
    fn creations_link_to_the_operations_on_what_they_created() {
        let doc = document();
        let mut operations = Vec::new();
        for item in doc["paths"].as_object().unwrap().values() {
            for op in item.as_object().unwrap().values() {
                operations.extend(op["operationId"].as_str().map(str::to_owned));
            }
        }
        let mut linked = 0;
        for path in ["/v1/admin/policies", "/v1/admin/tokens", "/v1/admin/consumers/{consumer}/limits"] {
            for link in doc["paths"][path]["post"]["responses"]["201"]["links"].as_object().unwrap().values()
            {
                let target = link["operationId"].as_str().unwrap();
                assert!(operations.iter().any(|o| o == target), "{target} is no operation");
                linked += 1;
            }
        }
        assert_eq!(linked, 6);
    }

    #[test]
    fn if_match_takes_what_the_etag_gives() {
        let doc = document();
        let params = doc["paths"]["/v1/admin/policies/{name}"]["put"]["parameters"].as_array().unwrap();
        let if_match = params.iter().find(|p| p["name"] == "If-Match").unwrap();
        let pattern = if_match["schema"]["pattern"].as_str().unwrap();
        assert_eq!(pattern, "^(\\*|(W/)?\"?[0-9]{1,18}\"?)$");
    }
}
