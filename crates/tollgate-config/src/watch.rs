//! Reloading the configuration file when it changes.
//!
//! The file's directory is watched (editors and Kubernetes replace files rather than write
//! them in place), events are debounced, and the file is re-read only when its text changed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

use crate::{Config, ConfigError};

/// Quiet time after the last change before the file is read: writes often come in bursts.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Watches a configuration file for as long as it is kept.
pub struct Watcher {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").finish_non_exhaustive()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Calls `on_change` with the newly parsed configuration each time the file at `path` changes
/// (or with the error, when the new text is invalid; the caller keeps its last good one).
/// Must be called within a tokio runtime.
pub fn watch(
    path: &Path,
    on_change: impl Fn(Result<Config, ConfigError>) + Send + 'static,
) -> Result<Watcher, notify::Error> {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let dir = path.parent().map_or_else(|| PathBuf::from("."), Path::to_owned);
    let mut last = std::fs::read_to_string(&path).ok();
    watch_dir(&dir, RecursiveMode::NonRecursive, move || {
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(source) => {
                if last.take().is_some() {
                    on_change(Err(ConfigError::Read { path: path.clone(), source }));
                }
                return;
            }
        };
        if last.as_deref() != Some(text.as_str()) {
            on_change(Config::from_toml(&text, &path.display().to_string()));
            last = Some(text);
        }
    })
}

/// Calls `on_change` (debounced) whenever something changes in the directory `path` or its
/// subdirectories, or in the directory of the file `path`: for other configuration files that
/// reload the same way (such as the Envoy service's YAML). The callback reads and compares what
/// it needs.
pub fn watch_path(path: &Path, on_change: impl FnMut() + Send + 'static) -> Result<Watcher, notify::Error> {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    if path.is_dir() {
        return watch_dir(&path, RecursiveMode::Recursive, on_change);
    }
    let dir = path.parent().map_or_else(|| PathBuf::from("."), Path::to_owned);
    watch_dir(&dir, RecursiveMode::NonRecursive, on_change)
}

fn watch_dir(
    dir: &Path,
    mode: RecursiveMode,
    mut on_change: impl FnMut() + Send + 'static,
) -> Result<Watcher, notify::Error> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            let _ = tx.send(());
        }
    })?;
    watcher.watch(dir, mode)?;
    let task = tokio::spawn(async move {
        while rx.recv().await.is_some() {
            tokio::time::sleep(DEBOUNCE).await;
            while rx.try_recv().is_ok() {}
            on_change();
        }
    });
    Ok(Watcher { _watcher: watcher, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_a_changed_and_a_broken_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        let policy = |limit| {
            format!(
                "[policies.a]\nrules = [{{ algorithm = \"fixed_window\", limit = {limit}, period = \"1s\" }}]\n"
            )
        };
        std::fs::write(&path, policy(1)).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _w = watch(&path, move |r| tx.send(r).unwrap()).unwrap();

        // Replaced, as an editor does.
        std::fs::write(dir.path().join("t.toml.tmp"), policy(7)).unwrap();
        std::fs::rename(dir.path().join("t.toml.tmp"), &path).unwrap();
        let config = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap().unwrap();
        assert_eq!(config.policies.get("a").unwrap().rules.signatures().next().unwrap(), "fw:7:1000000");

        std::fs::write(&path, "[policies.a]\nrules = [{ algorithm = \"fixed_window\" }]\n").unwrap();
        let err =
            tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap().unwrap_err();
        assert_eq!(err.line(), Some(2), "{err}");
    }
}
