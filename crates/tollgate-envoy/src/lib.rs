//! Tollgate on Envoy's wire: the `envoy.service.ratelimit.v3.RateLimitService` gRPC service
//! that Envoy, Istio, Envoy Gateway, Contour and Emissary call, configured by
//! envoyproxy/ratelimit's YAML files, plus Tollgate's extensions (any engine algorithm, windows
//! like 30 s, several limits per descriptor). Decides through a [`tollgate_limiter::Limiter`],
//! so the backend, failure policy and metrics are the HTTP API's. [`json::router`] serves the
//! same service as upstream's `POST /json`.

pub mod config;
pub mod json;
mod server;
mod service;

pub use config::{Domain, EnvoyConfigError};
pub use server::EnvoyServer;
pub use service::{EnvoyService, MAX_DESCRIPTORS, MAX_ENTRIES, MAX_TEXT_BYTES, names as metrics};

/// Loads every `*.yaml` / `*.yml` file of `path` (a file, or a directory as upstream's
/// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config`), one domain each.
pub fn load(path: &std::path::Path) -> Result<Vec<Domain>, EnvoyConfigError> {
    let read_err = |p: &std::path::Path, e: std::io::Error| EnvoyConfigError {
        origin: p.display().to_string(),
        message: format!("cannot read: {e}"),
    };
    let files: Vec<std::path::PathBuf> = if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| read_err(path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut domains: Vec<Domain> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| read_err(&file, e))?;
        let domain = Domain::from_yaml(&text, &file.display().to_string())?;
        if domains.iter().any(|d| d.name == domain.name) {
            return Err(EnvoyConfigError {
                origin: file.display().to_string(),
                message: format!("domain {:?} is defined by two files", domain.name),
            });
        }
        domains.push(domain);
    }
    Ok(domains)
}
