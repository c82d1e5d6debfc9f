//! `tollgate policy ...` and `tollgate consumer ...`: the management API from the command
//! line, for scripts. Prints the server's JSON; a refusal prints its problem and fails.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Subcommand;
use serde_json::Value;
use tollgate_config::PolicySpec;
use tollgate_store::MAX_PAGE;

/// Where the server is and who is asking. Global: the flags may come before or after the
/// subcommand (`tollgate policy --server URL list` and `tollgate policy list --server URL`).
#[derive(Debug, clap::Args)]
pub(crate) struct Remote {
    /// The Tollgate server: a URL, or an address such as 127.0.0.1:8080 (then http://).
    #[arg(long, global = true, env = "TOLLGATE_SERVER", default_value = "http://127.0.0.1:8080", value_name = "URL", value_parser = server_url)]
    server: String,
    /// An API token (see `tollgate token create`). Needed; optional here only because clap
    /// cannot require a flag that may stand anywhere.
    #[arg(long, global = true, env = "TOLLGATE_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// The server's base URL: `host:port` (no scheme) means `http://host:port`.
fn server_url(given: &str) -> Result<String, String> {
    let url = if given.contains("://") { given.to_owned() } else { format!("http://{given}") };
    match reqwest::Url::parse(&url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.host().is_some() => Ok(url),
        Ok(_) => Err(format!("{given:?} is not an http:// or https:// address")),
        Err(e) => Err(format!("{given:?} is not an address: {e}")),
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// List the policies the token may see (file and database).
    #[command(after_help = "Example:\n  tollgate policy list --server 127.0.0.1:8080 --token $TOKEN")]
    List,
    /// Show one policy.
    #[command(after_help = "Example:\n  tollgate policy get api --token $TOKEN")]
    Get {
        /// Its name.
        name: String,
    },
    /// Create or update the policies of a TOML file written like the configuration's
    /// `[policies.<name>]` sections (plus `apps` and `enabled`).
    #[command(after_help = "Example:\n  tollgate policy apply my-policies.toml --token $TOKEN")]
    Apply {
        /// The file.
        file: PathBuf,
    },
    /// Delete a policy.
    #[command(after_help = "Example:\n  tollgate policy delete api --token $TOKEN")]
    Delete {
        /// Its name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConsumerCommand {
    /// List a consumer's limit records.
    #[command(after_help = "Example:\n  tollgate consumer limits alice --token $TOKEN")]
    Limits {
        /// The consumer.
        consumer: String,
    },
    /// Add a limit record (each period -1 for unlimited, the default).
    #[command(
        after_help = "Example:\n  tollgate consumer add-limit alice --per-minute 100 --per-day 10000 --token $TOKEN"
    )]
    AddLimit {
        /// The consumer.
        consumer: String,
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        per_second: i64,
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        per_minute: i64,
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        per_hour: i64,
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        per_day: i64,
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        per_week: i64,
        #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
        per_month: i64,
        /// Only for checks whose scope starts with this.
        #[arg(long)]
        scope: Option<String>,
        /// Active from (RFC 3339).
        #[arg(long)]
        from: Option<String>,
        /// Active until (RFC 3339).
        #[arg(long)]
        to: Option<String>,
    },
    /// Delete a limit record.
    #[command(after_help = "Example:\n  tollgate consumer delete-limit alice 3f2a9c --token $TOKEN")]
    DeleteLimit {
        /// The consumer.
        consumer: String,
        /// The record's id.
        id: String,
    },
    /// The consumer's limits in force and live usage.
    #[command(after_help = "Example:\n  tollgate consumer call-limits alice --token $TOKEN")]
    CallLimits {
        /// The consumer.
        consumer: String,
    },
}

/// Why a management request failed.
#[derive(Debug, thiserror::Error)]
enum ClientError {
    /// The server could not be reached.
    #[error("cannot reach {url}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The answer could not be read.
    #[error(transparent)]
    Read(reqwest::Error),
    /// The server refused, with a problem's `detail` and the field it names, if any.
    #[error("{status}: {detail}{}", field_note(.field.as_deref()))]
    Status { status: reqwest::StatusCode, detail: String, field: Option<String> },
}

/// ` (field rules[0].limit)`, or nothing.
fn field_note(field: Option<&str>) -> String {
    field.map(|f| format!(" (field {f})")).unwrap_or_default()
}

struct Client {
    http: reqwest::Client,
    server: String,
    token: String,
}

impl Client {
    fn new(remote: Remote) -> anyhow::Result<Self> {
        let token = remote.token.context("a token is needed: --token TOKEN or TOLLGATE_TOKEN")?;
        Ok(Client { http: reqwest::Client::new(), server: remote.server, token })
    }

    /// Sends a request; the JSON answer (Null for 204), or the problem as an error.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<i64>,
    ) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.server.trim_end_matches('/'));
        let mut req = self.http.request(method, &url).bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(version) = if_match {
            req = req.header("if-match", format!("\"{version}\""));
        }
        let response = req.send().await.map_err(|source| ClientError::Unreachable { url, source })?;
        let status = response.status();
        let text = response.text().await.map_err(ClientError::Read)?;
        let value: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if !status.is_success() {
            let text = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_owned);
            let (detail, field) = (text("detail").unwrap_or_default(), text("field"));
            return Err(ClientError::Status { status, detail, field });
        }
        Ok(value)
    }
}

fn print(value: &Value) -> anyhow::Result<()> {
    if !value.is_null() {
        println!("{}", serde_json::to_string_pretty(value)?);
    }
    Ok(())
}

/// Segment-safe path component.
fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub(crate) async fn policy(remote: Remote, command: PolicyCommand) -> anyhow::Result<()> {
    use reqwest::Method;
    let client = Client::new(remote)?;
    match command {
        PolicyCommand::List => print(
            &client.send(Method::GET, &format!("/v1/admin/policies?limit={MAX_PAGE}"), None, None).await?,
        ),
        PolicyCommand::Get { name } => print(
            &client.send(Method::GET, &format!("/v1/admin/policies/{}", segment(&name)), None, None).await?,
        ),
        PolicyCommand::Delete { name } => {
            client
                .send(Method::DELETE, &format!("/v1/admin/policies/{}", segment(&name)), None, None)
                .await?;
            eprintln!("deleted policy {name:?}");
            Ok(())
        }
        PolicyCommand::Apply { file } => {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct PolicyFile {
                policies: BTreeMap<String, PolicySpec>,
            }
            let text =
                std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let parsed: PolicyFile =
                toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            for (name, input) in parsed.policies {
                let path = format!("/v1/admin/policies/{}", segment(&name));
                let body = serde_json::to_value(&input)?;
                match client.send(Method::GET, &path, None, None).await {
                    Ok(current) => {
                        let version = current.get("version").and_then(Value::as_i64);
                        client.send(Method::PUT, &path, Some(&body), version).await?;
                        eprintln!("updated policy {name:?}");
                    }
                    Err(ClientError::Status { status: reqwest::StatusCode::NOT_FOUND, .. }) => {
                        let mut body = body;
                        body["name"] = Value::String(name.clone());
                        client.send(Method::POST, "/v1/admin/policies", Some(&body), None).await?;
                        eprintln!("created policy {name:?}");
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(())
        }
    }
}

pub(crate) async fn consumer(remote: Remote, command: ConsumerCommand) -> anyhow::Result<()> {
    use reqwest::Method;
    let client = Client::new(remote)?;
    match command {
        ConsumerCommand::Limits { consumer } => print(
            &client
                .send(Method::GET, &format!("/v1/admin/consumers/{}/limits", segment(&consumer)), None, None)
                .await?,
        ),
        ConsumerCommand::AddLimit {
            consumer,
            per_second,
            per_minute,
            per_hour,
            per_day,
            per_week,
            per_month,
            scope,
            from,
            to,
        } => {
            let body = serde_json::json!({
                "per_second": per_second, "per_minute": per_minute, "per_hour": per_hour,
                "per_day": per_day, "per_week": per_week, "per_month": per_month,
                "scope": scope, "from": from, "to": to,
            });
            let path = format!("/v1/admin/consumers/{}/limits", segment(&consumer));
            print(&client.send(Method::POST, &path, Some(&body), None).await?)
        }
        ConsumerCommand::DeleteLimit { consumer, id } => {
            let path = format!("/v1/admin/consumers/{}/limits/{}", segment(&consumer), segment(&id));
            client.send(Method::DELETE, &path, None, None).await?;
            eprintln!("deleted limit {id} of consumer {consumer:?}");
            Ok(())
        }
        ConsumerCommand::CallLimits { consumer } => print(
            &client
                .send(Method::GET, &format!("/v1/consumers/{}/call-limits", segment(&consumer)), None, None)
                .await?,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{ClientError, server_url};

    #[test]
    fn addresses_with_or_without_a_scheme() {
        assert_eq!(server_url("127.0.0.1:8080").unwrap(), "http://127.0.0.1:8080");
        assert_eq!(server_url("localhost:9000").unwrap(), "http://localhost:9000");
        assert_eq!(server_url("https://rl.example:443").unwrap(), "https://rl.example:443");
        assert!(server_url("ftp://x:21").is_err());
        assert!(server_url("http://").is_err());
    }

    #[test]
    fn a_refusal_names_its_field_when_the_problem_does() {
        let refusal = |field: Option<&str>| ClientError::Status {
            status: reqwest::StatusCode::BAD_REQUEST,
            detail: "must be at least 1".into(),
            field: field.map(str::to_owned),
        };
        assert_eq!(
            refusal(Some("rules[0].limit")).to_string(),
            "400 Bad Request: must be at least 1 (field rules[0].limit)"
        );
        assert_eq!(refusal(None).to_string(), "400 Bad Request: must be at least 1");
    }
}
