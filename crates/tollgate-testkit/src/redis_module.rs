//! The Tollgate Redis module (`crates/tollgate-redis-module`), for tests that load it into a
//! private `redis-server`.
//!
//! A test must never load a module built from other sources than the ones it is testing, and
//! must never disturb the build that is running it. So:
//!
//! - The cdylib that cargo built for this very run (in `target/<profile>/deps`, beside the test
//!   binary: `cargo test -p tollgate-redis-module` and `cargo test --workspace` build it) is used
//!   only while no source of the module, of `tollgate-core` (its one path dependency) or
//!   `Cargo.lock` is newer than it, which is how cargo itself judges freshness. A test binary of
//!   a crate that does not build the module (`cargo test -p tollgate-redis`) would otherwise find
//!   whatever an earlier build left there.
//! - Otherwise the module is built by `cargo build -p tollgate-redis-module`, in the same profile,
//!   into a target directory of its own (`target/tollgate-redis-module`), and cargo decides
//!   whether anything needs compiling. Not into the running build's directory: a lone build of
//!   the module unifies other features than the workspace's (serde, tracing, smallvec ...), and
//!   a cdylib's outputs carry no hash in their names, so it would overwrite that build's
//!   `libtollgate_redis_module.so` and `.rlib` with ones of another feature set, which later
//!   compilations of the module's tests and doctests then link.
//! - One thread of a test binary looks and builds; the others wait for its answer. Test binaries
//!   running at once wait for each other on cargo's lock of the target directory, and a module
//!   built already is not rewritten by the next build, which finds it fresh.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

use crate::RedisServer;

/// The module's file name (`libtollgate_redis_module.so` on Linux).
fn file_name() -> String {
    format!("{}tollgate_redis_module{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// The workspace's root (this crate is `crates/tollgate-testkit` in it).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The module's file: `TOLLGATE_REDIS_MODULE` if set; else the module built for this run,
/// when it is fresh; else one built now (see the [module docs](self)). Asked once per test
/// binary.
///
/// # Panics
/// When it cannot be found or built: tests needing the module fail, never skip.
pub fn redis_module() -> PathBuf {
    static MODULE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match MODULE.get_or_init(locate) {
        Ok(path) => path.clone(),
        Err(why) => panic!("the Tollgate Redis module: {why}"),
    }
}

fn locate() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("TOLLGATE_REDIS_MODULE") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("TOLLGATE_REDIS_MODULE names no file: {}", path.display()))
        };
    }
    let build = Build::of_this_test()?;
    let sources = newest_source()?;
    let this_run = build.profile_dir.join("deps").join(file_name());
    if modified(&this_run).is_ok_and(|built| built >= sources) {
        return Ok(this_run);
    }
    build.run()
}

/// The newest modification time among the files the module is built from: the sources of the
/// module and of `tollgate-core` (the one crate of the workspace it depends on, as
/// docs/architecture.md allows), their manifests, and `Cargo.lock`.
fn newest_source() -> Result<SystemTime, String> {
    let crates = workspace().join("crates");
    let mut newest = modified(&workspace().join("Cargo.lock"))?;
    for krate in ["tollgate-redis-module", "tollgate-core"] {
        let dir = crates.join(krate);
        newest = newest.max(modified(&dir.join("Cargo.toml"))?);
        newest = newest.max(newest_in(&dir.join("src"))?);
    }
    Ok(newest)
}

/// The newest modification time of the files under `dir`.
fn newest_in(dir: &Path) -> Result<SystemTime, String> {
    let mut newest = SystemTime::UNIX_EPOCH;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?.path();
        let time = if path.is_dir() { newest_in(&path)? } else { modified(&path)? };
        newest = newest.max(time);
    }
    Ok(newest)
}

fn modified(path: &Path) -> Result<SystemTime, String> {
    std::fs::metadata(path).and_then(|m| m.modified()).map_err(|e| format!("{}: {e}", path.display()))
}

/// Where the running test binary was built, and so how to build the module alike.
struct Build {
    /// `target/<profile>` or `target/<triple>/<profile>`: the test binary is in its `deps`.
    profile_dir: PathBuf,
    /// The target directory (where cargo wrote `CACHEDIR.TAG`).
    target_dir: PathBuf,
    /// The target triple, when the build named one (`--target`).
    triple: Option<String>,
}

impl Build {
    fn of_this_test() -> Result<Build, String> {
        let exe = std::env::current_exe().map_err(|e| format!("the test binary's path: {e}"))?;
        let profile_dir = exe
            .parent()
            .filter(|deps| deps.ends_with("deps"))
            .and_then(Path::parent)
            .ok_or_else(|| format!("{} is not a test binary in a cargo target directory", exe.display()))?
            .to_owned();
        let above = profile_dir.parent().ok_or("a profile directory at the root")?;
        let (target_dir, triple) = if above.join("CACHEDIR.TAG").is_file() {
            (above.to_owned(), None)
        } else {
            let target = above.parent().filter(|t| t.join("CACHEDIR.TAG").is_file());
            let target =
                target.ok_or_else(|| format!("no cargo target directory above {}", exe.display()))?;
            (target.to_owned(), above.file_name().map(|t| t.to_string_lossy().into_owned()))
        };
        Ok(Build { profile_dir, target_dir, triple })
    }

    /// `cargo build -p tollgate-redis-module` in this test's profile, into the module's own
    /// target directory; answers the module's file there.
    fn run(&self) -> Result<PathBuf, String> {
        let profile = self.profile_dir.file_name().and_then(|p| p.to_str()).ok_or("a profile directory")?;
        // The directory `dev` and `test` build into is `debug`; another profile's is its name.
        let cargo_profile = if profile == "debug" { "dev" } else { profile };
        let target_dir = self.target_dir.join("tollgate-redis-module");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = Command::new(cargo);
        command
            .args(["build", "-p", "tollgate-redis-module", "--profile", cargo_profile])
            .arg("--target-dir")
            .arg(&target_dir)
            .current_dir(workspace());
        let mut built = target_dir.clone();
        if let Some(triple) = &self.triple {
            command.args(["--target", triple]);
            built.push(triple);
        }
        built.push(profile);
        built.push(file_name());
        eprintln!("tollgate-testkit: building the Redis module into {}", target_dir.display());
        let status = command.status().map_err(|e| format!("cannot run cargo to build it: {e}"))?;
        if !status.success() {
            return Err(format!("cargo build -p tollgate-redis-module failed ({status})"));
        }
        if built.is_file() { Ok(built) } else { Err(format!("built, but {} is missing", built.display())) }
    }
}

impl RedisServer {
    /// A private `redis-server` that loaded the Tollgate Redis module ([`redis_module`]).
    pub fn with_module(extra: &[&str]) -> RedisServer {
        let mut args = module_args();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }
}

/// `["--loadmodule", <the module's path>]`: the arguments that make a `redis-server` (a cluster
/// node, a sentinel's master or replica) load the module.
pub fn module_args() -> Vec<String> {
    let path = redis_module();
    vec!["--loadmodule".to_owned(), path.to_str().expect("the module's path is UTF-8").to_owned()]
}
