//! Tollgate on Envoy's wire: the `envoy.service.ratelimit.v3.RateLimitService` gRPC service
//! that Envoy, Istio, Envoy Gateway, Contour and Emissary call, configured by
//! envoyproxy/ratelimit's YAML files, plus Tollgate's extensions (any engine algorithm, windows
//! like 30 s, several limits per descriptor). Decides through a [`tollgate_limiter::Limiter`],
//! so the backend, failure policy and metrics are the HTTP API's. [`json::router`] serves the
//! same service as upstream's `POST /json`. [`xds`] takes the configuration from an xDS
//! management server instead of files, as upstream's `CONFIG_TYPE=GRPC_XDS_SOTW`.

pub mod config;
pub mod json;
pub mod ops;
mod server;
mod service;
mod stats;
pub mod xds;

pub use config::{Config, Domain, EnvoyConfigError};
pub use server::{EnvoyServer, SHOULD_RATE_LIMIT_PATH};
pub use service::{
    Charging, EnvoyService, HeaderNames, MAX_DESCRIPTORS, MAX_ENTRIES, MAX_HEADER_NAME_BYTES,
    MAX_MERGED_METADATA_BYTES, MAX_TEXT_BYTES, header_name, near_limit_ratio,
};
pub use stats::{
    DEFAULT_STATS_MAX_KEY_PATHS, OVERFLOW_KEY, UpstreamCounts, names as metrics, upstream_labels,
};

use std::path::{Path, PathBuf};

/// Loads `path`: one YAML file, or every file of a directory and of its subdirectories, as
/// upstream's loader reads `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config` (any file name; names
/// starting with `.` are skipped, as with upstream's `RUNTIME_IGNOREDOTFILES`, which keeps a
/// Kubernetes ConfigMap's `..data` copies out; a symlinked file is read, a symlinked directory
/// is not entered). Files are read in path order. Each file is one domain; two files of one
/// domain are refused, or merged with `merge_domains` (upstream's `MERGE_DOMAIN_CONFIG`).
pub fn load(path: &Path, merge_domains: bool) -> Result<Config, EnvoyConfigError> {
    parse(&read(path)?, merge_domains)
}

/// The files [`load`] reads under `path`, each with its text, in the order it reads them: what
/// a watcher compares to tell a change of the configuration from another file's write in its
/// directory (a database, a log).
pub fn read(path: &Path) -> Result<Vec<(PathBuf, String)>, EnvoyConfigError> {
    let files = if path.is_dir() {
        let mut files = Vec::new();
        collect(path, &mut files)?;
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).map_err(|e| read_error(&file, &e))?;
            Ok((file, text))
        })
        .collect()
}

/// The configuration of files [`read`] (see [`load`]).
pub fn parse(files: &[(PathBuf, String)], merge_domains: bool) -> Result<Config, EnvoyConfigError> {
    let mut config = Config::default();
    for (file, text) in files {
        config.add_file(text, &file.display().to_string(), merge_domains)?;
    }
    Ok(config)
}

fn read_error(path: &Path, e: &std::io::Error) -> EnvoyConfigError {
    EnvoyConfigError::new(path.display().to_string(), format!("cannot read: {e}"))
}

/// The files under `dir`, recursively.
fn collect(dir: &Path, into: &mut Vec<PathBuf>) -> Result<(), EnvoyConfigError> {
    for entry in std::fs::read_dir(dir).map_err(|e| read_error(dir, &e))? {
        let entry = entry.map_err(|e| read_error(dir, &e))?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| read_error(&path, &e))?;
        if kind.is_dir() {
            collect(&path, into)?;
        } else if kind.is_file() || (kind.is_symlink() && path.is_file()) {
            into.push(path);
        }
    }
    Ok(())
}
