//! The Tollgate Redis module (`crates/tollgate-redis-module`), for tests that load it into a
//! private `redis-server`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::RedisServer;

/// The module's file name (`libtollgate_redis_module.so` on Linux).
fn file_name() -> String {
    format!("{}tollgate_redis_module{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// The module's file: `TOLLGATE_REDIS_MODULE` if set; else the one cargo built beside the
/// running test binary (in `target/<profile>/deps`, or one directory up); else it is built now
/// (`cargo build -p tollgate-redis-module`, into the same target directory), so a test of
/// another crate never runs without it.
///
/// # Panics
/// When it cannot be found or built: tests needing the module fail, never skip.
pub fn redis_module() -> PathBuf {
    if let Some(path) = std::env::var_os("TOLLGATE_REDIS_MODULE") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    let profile_dir = deps.parent().unwrap_or(deps);
    let found = |dir: &Path| Some(dir.join(file_name())).filter(|p| p.is_file());
    if let Some(path) = found(deps).or_else(|| found(profile_dir)) {
        return path;
    }
    build(profile_dir);
    found(profile_dir)
        .unwrap_or_else(|| panic!("{} was built but is not in {}", file_name(), profile_dir.display()))
}

/// `cargo build -p tollgate-redis-module` into the target directory holding `profile_dir`.
fn build(profile_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = profile_dir.parent().expect("a target directory");
    let mut command = Command::new(cargo);
    command.args(["build", "-p", "tollgate-redis-module"]).arg("--target-dir").arg(target);
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        command.arg("--release");
    }
    let status = command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the Redis module: {e}"));
    assert!(status.success(), "cargo build -p tollgate-redis-module failed ({status})");
}

impl RedisServer {
    /// A private `redis-server` that loaded the Tollgate Redis module ([`redis_module`]).
    pub fn with_module(extra: &[&str]) -> RedisServer {
        let path = redis_module();
        let path = path.to_str().expect("the module's path is UTF-8");
        let mut args = vec!["--loadmodule", path];
        args.extend_from_slice(extra);
        RedisServer::start_with(&args)
    }
}
