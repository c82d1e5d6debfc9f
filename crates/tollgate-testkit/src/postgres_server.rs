//! A private PostgreSQL cluster for one test binary: `initdb` into a temporary directory, a
//! `postgres` on a free loopback port, fresh databases on demand, stopped on drop. The shared
//! server on 5432 is never touched.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::free_port;

/// A throwaway PostgreSQL cluster (trust authentication, no fsync), stopped when dropped.
pub struct PostgresServer {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_postgres: bool,
    databases: AtomicUsize,
}

/// The directory holding `initdb`, `pg_ctl` and `createdb`: Debian's /usr/lib/postgresql/<v>/bin
/// (newest version), else one on PATH.
fn bin_dir() -> Option<PathBuf> {
    let complete = |d: &PathBuf| ["initdb", "pg_ctl", "createdb"].iter().all(|p| d.join(p).is_file());
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries.filter_map(|e| e.ok().map(|e| e.path().join("bin"))).filter(complete).collect()
        })
        .unwrap_or_default();
    versions.sort_by_key(|d| d.parent().and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok()));
    versions.pop().or_else(|| {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .find(complete)
    })
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

impl PostgresServer {
    /// Creates and starts a cluster, and waits until it accepts connections.
    ///
    /// # Panics
    /// If PostgreSQL is not installed (with how to install it), or does not start.
    pub fn start() -> PostgresServer {
        let Some(bin) = bin_dir() else {
            panic!(
                "PostgreSQL (initdb, postgres) is not installed, and the PostgreSQL tests need it{}. \
                 Install it with `apt-get install postgresql`, or run `scripts/test`, which does.",
                if std::env::var("CI").as_deref() == Ok("true") { " (CI=true)" } else { "" }
            );
        };
        // initdb refuses to run as root: then the cluster belongs to the `postgres` user.
        let as_postgres = is_root();
        let dir = tempfile::tempdir().expect("temporary directory");
        if as_postgres {
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status();
            assert!(status.is_ok_and(|s| s.success()), "chown of the cluster directory to postgres");
        }
        let mut server = PostgresServer { bin, dir, port: 0, as_postgres, databases: AtomicUsize::new(0) };
        let data = server.data();
        server.run(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync", "--no-instructions"],
        );
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port();
            let log = server.dir.path().join("postgres.log").to_string_lossy().into_owned();
            let options = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
                 -c full_page_writes=off",
                server.port,
                server.dir.path().display()
            );
            let started = server
                .command("pg_ctl", &["-D", &data, "-l", &log, "-o", &options, "-w", "-t", "30", "start"])
                .output();
            match started {
                Ok(o) if o.status.success() => return server,
                Ok(o) => {
                    last = format!(
                        "{}{}",
                        String::from_utf8_lossy(&o.stderr),
                        std::fs::read_to_string(&log).unwrap_or_default()
                    )
                }
                Err(e) => last = e.to_string(),
            }
        }
        panic!("postgres did not start: {last}");
    }

    fn data(&self) -> String {
        self.dir.path().join("data").to_string_lossy().into_owned()
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let program = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        cmd.args(args).current_dir(Path::new("/")).stdin(Stdio::null());
        cmd
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self.command(program, args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL to a new, empty database of this cluster.
    pub fn fresh_database(&self) -> String {
        let name = format!("tollgate_test_{}", self.databases.fetch_add(1, Ordering::Relaxed));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = self
                .command(
                    "createdb",
                    &["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", &name],
                )
                .output()
                .expect("createdb runs");
            if out.status.success() {
                break;
            }
            assert!(Instant::now() < deadline, "createdb failed: {}", String::from_utf8_lossy(&out.stderr));
            std::thread::sleep(Duration::from_millis(50));
        }
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self.command("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]).output();
    }
}
