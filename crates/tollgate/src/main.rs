//! The `tollgate` command: `serve` (the HTTP decision API, Envoy's gRPC service and its `/json`
//! route), `proxy` (a rate-limiting reverse proxy), `bench` and `simulate` (load and algorithm
//! comparisons), `check-config`, the management clients `token`, `policy` and `consumer`, and
//! the shell's `completions` and `man` pages.
//! Wires the crates together (config, backend, limiter, server, envoy, tower) and owns the
//! process: logging, signals, reloading.

mod bench;
mod client;
mod listen;
mod otel;
mod proxy;
mod serve;
mod simulate;
mod threads;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// mimalloc (its v2 line), not the system's malloc: a request through hyper and h2 makes dozens
/// of small allocations, on which glibc spent a fifth of a request's instructions; under mimalloc
/// every path measured took less server CPU a request (docs/benchmarks.md, "mimalloc, its v2
/// line"). `--no-default-features` builds with the system's malloc.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The version and the commit it was built from (build.rs; "unknown" outside a git checkout).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("TOLLGATE_COMMIT"), ")");

/// Tollgate: a distributed rate limiter.
///
/// `tollgate serve` answers rate-limit decisions over HTTP (POST /v1/check). Counters live in
/// this process by default, or in Redis with --redis, shared by every instance.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version = VERSION, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP decision service.
    ///
    /// Without --config, the built-in configuration (tollgate.example.toml) is used: the
    /// in-memory backend and the example policies. A configuration file is reloaded when it
    /// changes; a file with a mistake is refused with its line and the last good one stays.
    #[command(
        after_help = "Example:\n  tollgate serve --config tollgate.toml --redis redis://127.0.0.1:6379"
    )]
    Serve(Box<ServeArgs>),
    /// Run a rate-limiting reverse proxy in front of one HTTP upstream.
    ///
    /// Requests are matched to the routes file's policies (from --config) and keyed as it says;
    /// admitted ones are forwarded with their bodies streamed, refused ones answered 429 here.
    #[command(
        after_help = "Example:\n  tollgate proxy --upstream http://127.0.0.1:3000 --config routes.toml"
    )]
    Proxy(proxy::ProxyArgs),
    /// Load a Redis, a Tollgate server or an Envoy-protocol service with rate-limit decisions
    /// and report decisions/s, allowed/denied, latency percentiles and, against Redis, Redis
    /// CPU per decision.
    #[command(
        after_help = "Example:\n  tollgate bench --target redis://127.0.0.1:6379 --algorithm fixed_window --duration 5s"
    )]
    Bench(bench::BenchArgs),
    /// Replay a request pattern through each given rule on a simulated clock (no sleeping) and
    /// show what each admits and denies over time: a table, --json, or an SVG chart (--out).
    #[command(
        after_help = "Example:\n  tollgate simulate --rules 'fixed_window 100/1m, gcra 100/1m burst=10' --traffic burst:150@59s"
    )]
    Simulate(simulate::SimulateArgs),
    /// Validate a configuration file and list its policies; exits non-zero on a mistake.
    ///
    /// A TOML file is checked as `serve --config` reads it. A `.yaml`/`.yml` file, or a
    /// directory, is checked as `serve --envoy-config` reads it (envoyproxy/ratelimit's
    /// `ratelimit_config_check`): its domains are listed, or the file and the reason.
    #[command(after_help = "Example:\n  tollgate check-config tollgate.toml")]
    CheckConfig {
        /// The TOML file, or an Envoy YAML file or directory, to check.
        file: PathBuf,
        /// Envoy YAML: merge files of one domain (upstream's MERGE_DOMAIN_CONFIG).
        #[arg(long, env = "TOLLGATE_ENVOY_MERGE_DOMAINS")]
        envoy_merge_domains: bool,
    },
    /// Manage API tokens directly in the policy database (to bootstrap the first admin).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Manage policies through a running server's management API.
    Policy {
        #[command(flatten)]
        remote: client::Remote,
        #[command(subcommand)]
        command: client::PolicyCommand,
    },
    /// Manage per-consumer limits through a running server's management API.
    Consumer {
        #[command(flatten)]
        remote: client::Remote,
        #[command(subcommand)]
        command: client::ConsumerCommand,
    },
    /// Print a shell completion script for tollgate to stdout.
    ///
    /// Bash: `tollgate completions bash > /etc/bash_completion.d/tollgate` (or source it from
    /// ~/.bashrc). Zsh: write it as `_tollgate` into a directory of $fpath. Fish: write it to
    /// ~/.config/fish/completions/tollgate.fish.
    #[command(after_help = "Example:\n  tollgate completions bash")]
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print tollgate's man page (roff) to stdout, or write one page per command into a
    /// directory.
    ///
    /// `tollgate man | man -l -` reads it now; `tollgate man --out /usr/local/share/man/man1`
    /// installs tollgate.1 and a page for each subcommand (tollgate-serve.1, ...).
    #[command(after_help = "Example:\n  tollgate man --out man1")]
    Man {
        /// Write tollgate.1 and every subcommand's page into this directory (created if missing)
        /// instead of printing tollgate.1.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a token and print its secret, once (it is stored only as a hash).
    #[command(
        after_help = "Example:\n  tollgate token create --name ops --role admin --database sqlite://tollgate.db"
    )]
    Create {
        /// The token's name: what the audit log records as the author of its changes.
        #[arg(long)]
        name: String,
        /// viewer (read), editor (also change policies and limits) or admin (also tokens).
        #[arg(long)]
        role: tollgate_store::Role,
        /// Restrict the token to these apps (comma-separated); default: all.
        #[arg(long, value_delimiter = ',')]
        apps: Option<Vec<String>>,
        #[command(flatten)]
        database: DatabaseArg,
    },
}

/// The policy database.
#[derive(Debug, clap::Args)]
struct DatabaseArg {
    /// Policy database: sqlite://PATH (created if missing) or postgres://USER@HOST/DB.
    #[arg(
        long = "database",
        env = "TOLLGATE_DATABASE_URL",
        value_name = "URL",
        default_value = "sqlite://tollgate.db"
    )]
    url: String,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Configuration file (TOML; see tollgate.example.toml).
    #[arg(long, env = "TOLLGATE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address of the HTTP API [default: the config's server.listen, else 127.0.0.1:8080].
    #[arg(long, env = "TOLLGATE_LISTEN", value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Keep counters in Redis: redis://[user:password@]host:port[/db], or rediss:// for TLS;
    /// a Redis Cluster as redis+cluster://[user:password@]host1:port1,host2:port2,...; Redis
    /// Sentinel as redis+sentinel://[user:password@]sentinel1:port,sentinel2:port/service
    /// Overrides the config's [backend].
    #[arg(long, env = "TOLLGATE_REDIS_URL", value_name = "URL")]
    redis: Option<String>,
    /// Which engine decides inside Redis: auto (the Tollgate Redis module where Redis has it
    /// loaded, else the Lua), module (refuses to start without it) or lua [default: the
    /// config's backend.engine, else auto].
    #[arg(long, env = "TOLLGATE_REDIS_ENGINE", value_name = "ENGINE")]
    redis_engine: Option<tollgate_config::RedisEngine>,
    /// Address of the Envoy rate-limit gRPC service (envoy.service.ratelimit.v3).
    #[arg(long, env = "TOLLGATE_GRPC_LISTEN", value_name = "ADDR", default_value = "127.0.0.1:8081")]
    grpc_listen: SocketAddr,
    /// TLS on the gRPC listener: the server's certificate chain, PEM (upstream's
    /// GRPC_SERVER_USE_TLS with GRPC_SERVER_TLS_CERT).
    #[arg(long, env = "TOLLGATE_GRPC_TLS_CERT", value_name = "FILE", requires = "grpc_tls_key")]
    grpc_tls_cert: Option<PathBuf>,
    /// The private key of --grpc-tls-cert, PEM (upstream's GRPC_SERVER_TLS_KEY).
    #[arg(long, env = "TOLLGATE_GRPC_TLS_KEY", value_name = "FILE", requires = "grpc_tls_cert")]
    grpc_tls_key: Option<PathBuf>,
    /// Mutual TLS on the gRPC listener: clients must present a certificate issued by a CA of
    /// this PEM file (upstream's GRPC_CLIENT_TLS_CACERT).
    #[arg(long, env = "TOLLGATE_GRPC_TLS_CLIENT_CA", value_name = "FILE", requires = "grpc_tls_cert")]
    grpc_tls_client_ca: Option<PathBuf>,
    /// With --grpc-tls-client-ca: the client's certificate must also be valid for this DNS
    /// name (upstream's GRPC_CLIENT_TLS_SAN).
    #[arg(long, env = "TOLLGATE_GRPC_TLS_CLIENT_SAN", value_name = "NAME", requires = "grpc_tls_client_ca")]
    grpc_tls_client_san: Option<String>,
    /// envoyproxy/ratelimit YAML configuration: a file, or a directory of *.yaml (one domain each).
    #[arg(long, env = "TOLLGATE_ENVOY_CONFIG", value_name = "PATH")]
    envoy_config: Option<PathBuf>,
    /// Add RateLimit-Limit/-Remaining/-Reset to Envoy answers (upstream's
    /// LIMIT_RESPONSE_HEADERS_ENABLED).
    #[arg(long, env = "TOLLGATE_ENVOY_RESPONSE_HEADERS")]
    envoy_response_headers: bool,
    /// Envoy: the name of the limit header (upstream's LIMIT_LIMIT_HEADER).
    #[arg(long, env = "TOLLGATE_ENVOY_LIMIT_HEADER", value_name = "NAME", default_value = "RateLimit-Limit", value_parser = tollgate_envoy::header_name)]
    envoy_limit_header: String,
    /// Envoy: the name of the remaining header (upstream's LIMIT_REMAINING_HEADER).
    #[arg(long, env = "TOLLGATE_ENVOY_REMAINING_HEADER", value_name = "NAME", default_value = "RateLimit-Remaining", value_parser = tollgate_envoy::header_name)]
    envoy_remaining_header: String,
    /// Envoy: the name of the reset header (upstream's LIMIT_RESET_HEADER).
    #[arg(long, env = "TOLLGATE_ENVOY_RESET_HEADER", value_name = "NAME", default_value = "RateLimit-Reset", value_parser = tollgate_envoy::header_name)]
    envoy_reset_header: String,
    /// Envoy: hits admitted with more than this share of a limit used count as near the limit
    /// (the near_limit metric; upstream's NEAR_LIMIT_RATIO), above 0 and at most 1.
    #[arg(long, env = "TOLLGATE_ENVOY_NEAR_LIMIT_RATIO", value_name = "RATIO", default_value = "0.8", value_parser = tollgate_envoy::near_limit_ratio)]
    envoy_near_limit_ratio: f32,
    /// Envoy: every descriptor in quota mode (upstream's QUOTA_MODE): a request is refused
    /// only when all its descriptors are over their limits; each status still says OVER_LIMIT.
    #[arg(long, env = "TOLLGATE_ENVOY_QUOTA_MODE")]
    envoy_quota_mode: bool,
    /// Envoy: at most this many distinct key paths (label sets) in the hit counters, per
    /// family of names; the hits of new ones past it are counted under key1="|overflow|"
    /// (descriptor="|overflow|" for the tollgate_envoy_* names).
    #[arg(long, env = "TOLLGATE_ENVOY_STATS_MAX_KEY_PATHS", value_name = "N", default_value_t = tollgate_envoy::DEFAULT_STATS_MAX_KEY_PATHS)]
    envoy_stats_max_key_paths: usize,
    /// Envoy: answer every request OK overall, whatever its descriptors' statuses say, and
    /// count those that would have been refused (upstream's SHADOW_MODE).
    #[arg(long, env = "TOLLGATE_ENVOY_SHADOW_MODE")]
    envoy_shadow_mode: bool,
    /// Envoy: GET /healthcheck asks the backend every time, and fails while it does not
    /// answer (upstream's REDIS_HEALTH_CHECK_ACTIVE_CONNECTION); by default only until it
    /// first answers.
    #[arg(long, env = "TOLLGATE_ENVOY_HEALTH_CHECKS_BACKEND")]
    envoy_health_checks_backend: bool,
    /// Envoy: GET /healthcheck fails while no Envoy domain is loaded (upstream's
    /// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
    #[arg(long, env = "TOLLGATE_ENVOY_HEALTH_NEEDS_CONFIG")]
    envoy_health_needs_config: bool,
    /// Envoy: send the request, and the YAML `metadata` of the descriptors that admitted it,
    /// as the answer's dynamic metadata (upstream's RESPONSE_DYNAMIC_METADATA).
    #[arg(long, env = "TOLLGATE_ENVOY_RESPONSE_DYNAMIC_METADATA")]
    envoy_response_dynamic_metadata: bool,
    /// Envoy: a request one descriptor refuses is charged to none of its descriptors. By
    /// default each descriptor is charged when its own limit admits it, as upstream does.
    #[arg(long, env = "TOLLGATE_ENVOY_ALL_OR_NOTHING")]
    envoy_all_or_nothing: bool,
    /// Envoy: a request with any descriptor over its limit (shadow and quota mode ones too) is
    /// charged to none (upstream's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
    #[arg(
        long,
        env = "TOLLGATE_ENVOY_STOP_INCREMENT_WHEN_OVER_LIMIT",
        conflicts_with = "envoy_all_or_nothing"
    )]
    envoy_stop_increment_when_over_limit: bool,
    /// Envoy: quota reservations for hot descriptors (`off`, `auto` or `max=N`; see the
    /// README's "Hot keys"): answered in process from blocks of units reserved in advance,
    /// never over the limit. Descriptors with sliding-window rules check every request.
    #[arg(long, env = "TOLLGATE_ENVOY_RESERVE", default_value = "off", value_name = "off|auto|max=N")]
    envoy_reserve: tollgate_limiter::Reserve,
    /// Envoy: merge YAML files of one domain instead of refusing the second (upstream's
    /// MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "TOLLGATE_ENVOY_MERGE_DOMAINS")]
    envoy_merge_domains: bool,
    /// Envoy: take the configuration from this xDS management server (State of the World over
    /// ADS, as upstream's CONFIG_TYPE=GRPC_XDS_SOTW with CONFIG_GRPC_XDS_SERVER_URL):
    /// http://host:port, https://host:port or host:port. Instead of --envoy-config.
    #[arg(long, env = "TOLLGATE_ENVOY_XDS_SERVER", value_name = "URL", conflicts_with = "envoy_config")]
    envoy_xds_server: Option<String>,
    /// xDS: this instance's node id (upstream's CONFIG_GRPC_XDS_NODE_ID).
    #[arg(
        long,
        env = "TOLLGATE_ENVOY_XDS_NODE_ID",
        value_name = "ID",
        default_value = "default",
        requires = "envoy_xds_server"
    )]
    envoy_xds_node_id: String,
    /// xDS: the node's metadata, key=value pairs separated by commas (upstream's
    /// CONFIG_GRPC_XDS_NODE_METADATA).
    #[arg(
        long,
        env = "TOLLGATE_ENVOY_XDS_NODE_METADATA",
        value_name = "K=V,...",
        requires = "envoy_xds_server"
    )]
    envoy_xds_node_metadata: Option<String>,
    /// xDS: headers sent to the server, name:value pairs separated by commas (upstream's
    /// CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS), such as a token it asks for.
    #[arg(
        long,
        env = "TOLLGATE_ENVOY_XDS_HEADERS",
        value_name = "NAME:VALUE,...",
        requires = "envoy_xds_server"
    )]
    envoy_xds_headers: Option<String>,
    /// xDS: TLS to the server (upstream's CONFIG_GRPC_XDS_SERVER_USE_TLS); an https:// URL
    /// turns it on too.
    #[arg(long, env = "TOLLGATE_ENVOY_XDS_TLS", requires = "envoy_xds_server")]
    envoy_xds_tls: bool,
    /// xDS TLS: the CAs of the server's certificate, PEM (upstream's
    /// CONFIG_GRPC_XDS_SERVER_TLS_CACERT) [default: the system's].
    #[arg(long, env = "TOLLGATE_ENVOY_XDS_TLS_CA", value_name = "FILE", requires = "envoy_xds_server")]
    envoy_xds_tls_ca: Option<PathBuf>,
    /// xDS TLS: this client's certificate chain, PEM (upstream's CONFIG_GRPC_XDS_CLIENT_TLS_CERT).
    #[arg(long, env = "TOLLGATE_ENVOY_XDS_TLS_CERT", value_name = "FILE", requires = "envoy_xds_tls_key")]
    envoy_xds_tls_cert: Option<PathBuf>,
    /// xDS TLS: the key of --envoy-xds-tls-cert, PEM (upstream's CONFIG_GRPC_XDS_CLIENT_TLS_KEY).
    #[arg(long, env = "TOLLGATE_ENVOY_XDS_TLS_KEY", value_name = "FILE", requires = "envoy_xds_tls_cert")]
    envoy_xds_tls_key: Option<PathBuf>,
    /// xDS TLS: the name the server's certificate must hold, instead of the URL's host
    /// (upstream's CONFIG_GRPC_XDS_SERVER_TLS_SAN).
    #[arg(long, env = "TOLLGATE_ENVOY_XDS_TLS_SAN", value_name = "NAME", requires = "envoy_xds_server")]
    envoy_xds_tls_san: Option<String>,
    /// xDS: the largest response read, in bytes (upstream's XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES).
    #[arg(long, env = "TOLLGATE_ENVOY_XDS_MAX_MESSAGE_BYTES", value_name = "BYTES", default_value_t = tollgate_envoy::xds::DEFAULT_MAX_MESSAGE_BYTES)]
    envoy_xds_max_message_bytes: usize,
    /// xDS: the first wait before reconnecting to the server, doubled after each failure
    /// (upstream's XDS_CLIENT_BACKOFF_INITIAL_INTERVAL).
    #[arg(long, env = "TOLLGATE_ENVOY_XDS_BACKOFF_INITIAL", value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    envoy_xds_backoff_initial: std::time::Duration,
    /// xDS: the longest wait before reconnecting (upstream's XDS_CLIENT_BACKOFF_MAX_INTERVAL).
    #[arg(long, env = "TOLLGATE_ENVOY_XDS_BACKOFF_MAX", value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    envoy_xds_backoff_max: std::time::Duration,
    /// xDS: serve before the first configuration arrives (upstream's
    /// FORCE_START_WITHOUT_INITIAL_CONFIG); by default serving waits for the server's first
    /// answer.
    #[arg(long, env = "TOLLGATE_ENVOY_XDS_FORCE_START", requires = "envoy_xds_server")]
    envoy_xds_force_start: bool,
    /// Log JSON lines instead of text (the log level comes from RUST_LOG; default info).
    #[arg(long, env = "TOLLGATE_JSON_LOGS")]
    json_logs: bool,
    #[command(flatten)]
    database: DatabaseArg,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file, envoy_merge_domains } => check_config(&file, envoy_merge_domains),
        Command::Serve(args) => run(serve::run(*args)),
        Command::Bench(args) => run(bench::run(args)),
        Command::Simulate(args) => run(async move { simulate::run(args) }),
        Command::Proxy(args) => run(proxy::run(args)),
        Command::Policy { remote, command } => run(client::policy(remote, command)),
        Command::Consumer { remote, command } => run(client::consumer(remote, command)),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "tollgate", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man { out } => man(out.as_deref()),
        Command::Token(TokenCommand::Create { name, role, apps, database }) => run(async move {
            let store = tollgate_store::Store::connect(&database.url).await?;
            let (token, secret) =
                store.create_token(tollgate_store::Actor::operator("cli"), &name, role, apps).await?;
            eprintln!("created {} token {:?}; its secret is shown once:", token.role.as_str(), token.name);
            println!("{secret}");
            Ok(())
        }),
    }
}

/// `check-config`: a TOML file's policies, or (a YAML file or a directory) Envoy's domains.
fn check_config(file: &std::path::Path, merge_domains: bool) -> ExitCode {
    let envoy = file.is_dir() || file.extension().is_some_and(|x| x == "yaml" || x == "yml");
    let checked = if envoy {
        tollgate_envoy::load(file, merge_domains).map_err(|e| e.to_string()).map(|config| {
            for warning in &config.warnings {
                eprintln!("warning: {warning}");
            }
            ("domain", "domains", config.domains.into_iter().map(|d| d.name).collect::<Vec<_>>())
        })
    } else {
        tollgate_config::Config::load(file).map_err(|e| e.to_string()).map(|config| {
            ("policy", "policies", config.policies.iter().map(|(name, _)| name.to_owned()).collect())
        })
    };
    match checked {
        Ok((one, many, names)) => {
            let noun = if names.len() == 1 { one } else { many };
            println!("{}: ok, {} {noun}: {}", file.display(), names.len(), names.join(", "));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `man`: tollgate.1 on stdout, or every command's page written into `out`.
fn man(out: Option<&std::path::Path>) -> ExitCode {
    let written = match out {
        None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout().lock()),
        Some(dir) => {
            std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(Cli::command(), dir))
        }
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "error: cannot write the man page{}: {e}",
                out.map(|d| format!(" into {}", d.display())).unwrap_or_default()
            );
            ExitCode::FAILURE
        }
    }
}

fn run(job: impl Future<Output = anyhow::Result<()>>) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build();
    match runtime.map_err(anyhow::Error::from).and_then(|rt| rt.block_on(job)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    /// Splits an example as a shell would, for the quoting the examples use (single quotes).
    fn words(line: &str) -> Vec<String> {
        let (mut out, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
        for c in line.chars() {
            match c {
                '\'' => (quoted, any) = (!quoted, true),
                c if c.is_whitespace() && !quoted => {
                    if any {
                        out.push(std::mem::take(&mut word));
                    }
                    any = false;
                }
                c => {
                    word.push(c);
                    any = true;
                }
            }
        }
        if any {
            out.push(word);
        }
        out
    }

    #[test]
    fn every_subcommand_shows_an_example_that_parses() {
        fn walk(command: &clap::Command, path: &str, examples: &mut Vec<(String, String)>) {
            for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
                let path = format!("{path} {}", sub.get_name());
                if sub.has_subcommands() {
                    walk(sub, &path, examples);
                    continue;
                }
                let help = sub.get_after_help().map(|h| h.to_string()).unwrap_or_default();
                let example = help.strip_prefix("Example:\n").map(str::trim).unwrap_or_default();
                assert!(
                    example.starts_with(&path),
                    "`{path} --help` ends with no example of itself: {help:?}"
                );
                examples.push((path, example.to_owned()));
            }
        }
        let mut examples = Vec::new();
        walk(&Cli::command(), "tollgate", &mut examples);
        assert!(examples.len() >= 14, "{examples:?}");
        for (path, example) in examples {
            if let Err(e) = Cli::try_parse_from(words(&example)) {
                panic!("{path}'s example does not parse: {example}\n{e}");
            }
        }
    }

    #[test]
    fn server_and_token_stand_before_or_after_the_subcommand() {
        for args in [
            "tollgate policy list --server 127.0.0.1:9 --token t",
            "tollgate policy --server 127.0.0.1:9 --token t list",
            "tollgate consumer limits alice --token t --server http://127.0.0.1:9",
        ] {
            let cli = Cli::try_parse_from(words(args)).unwrap_or_else(|e| panic!("{args}: {e}"));
            assert!(format!("{cli:?}").contains("http://127.0.0.1:9"), "{args}: {cli:?}");
        }
    }
}
