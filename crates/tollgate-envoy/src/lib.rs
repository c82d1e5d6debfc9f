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
pub mod xds;

pub use config::{Config, Domain, EnvoyConfigError};
pub use server::EnvoyServer;
pub use service::{
    Charging, DEFAULT_STATS_MAX_KEY_PATHS, EnvoyService, HeaderNames, MAX_DESCRIPTORS, MAX_ENTRIES,
    MAX_HEADER_NAME_BYTES, MAX_MERGED_METADATA_BYTES, MAX_TEXT_BYTES, OVERFLOW_KEY, UpstreamCounts,
    header_name, names as metrics, near_limit_ratio, upstream_labels,
};

use std::path::{Path, PathBuf};

/// Loads `path`: one YAML file, or every file of a directory and of its subdirectories, as
/// upstream's loader reads `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config` (any file name; names
/// starting with `.` are skipped, as with upstream's `RUNTIME_IGNOREDOTFILES`, which keeps a
/// Kubernetes ConfigMap's `..data` copies out; a symlinked file is read, a symlinked directory
/// is not entered). Files are read in path order. Each file is one domain; two files of one
/// domain are refused, or merged with `merge_domains` (upstream's `MERGE_DOMAIN_CONFIG`).
pub fn load(path: &Path, merge_domains: bool) -> Result<Config, EnvoyConfigError> {
    let files = if path.is_dir() {
        let mut files = Vec::new();
        collect(path, &mut files)?;
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut config = Config::default();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| read_error(&file, &e))?;
        config.add_file(&text, &file.display().to_string(), merge_domains)?;
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
