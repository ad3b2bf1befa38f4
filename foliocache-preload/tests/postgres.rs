//! PostgreSQL through the library, on the shared cache and on private caches, in both write
//! modes, compared with a run without it: a cluster whose data directory is served,
//! `pgbench -i`, a fixed number of `pgbench` transactions from four clients, an immediate
//! shutdown, a start (crash recovery), the invariants and `pg_amcheck --heapallindexed`, then
//! a fast shutdown, a start and the invariants again. On the shared cache, its owner is
//! SIGKILLed twice during the transactions, and none may fail. Before the library held leases this
//! corrupted the cluster in both modes (each backend kept a private copy of pages another
//! backend rewrote); on the shared cache every backend reads and writes the same pages.
//!
//! The servers run as the `postgres` user (created if missing), listen only on a Unix socket
//! in the test's directory, and are stopped when the test ends, failed or not. One test in
//! this binary: the three clusters (kernel, write-through, write-back) run one after the
//! other. `FOLIOCACHE_STRESS_SECS` scales the number of transactions.

mod common;

use common::{CacheMode, Writes, stats, work_dir};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Transactions per client by default: enough to corrupt the cluster on 554bbda in both modes
/// (4 clients).
const TRANSACTIONS: usize = 1000;
const SCALE: &str = "20";

/// PostgreSQL's programs (the newest version Debian installed).
fn pg_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// The `postgres` user's uid and gid, creating the user if missing.
fn postgres_user() -> (u32, u32) {
    let lookup = || -> Option<(u32, u32)> {
        let out = Command::new("id").args(["-u", "postgres"]).output().ok()?;
        let uid = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
        let out = Command::new("id").args(["-g", "postgres"]).output().ok()?;
        let gid = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
        Some((uid, gid))
    };
    if let Some(ids) = lookup() {
        return ids;
    }
    let status = Command::new("useradd")
        .args(["--system", "--user-group", "--no-create-home", "postgres"])
        .status()
        .expect("run useradd");
    assert!(status.success(), "useradd postgres failed");
    lookup().expect("the postgres user after useradd")
}

/// One cluster, run as `postgres`, with or without the library.
struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    data: PathBuf,
    ids: (u32, u32),
    /// The library's settings for the server, if it runs with it.
    env: Vec<(String, String)>,
    running: bool,
}

impl Cluster {
    fn new(bin: &Path, dir: PathBuf, ids: (u32, u32), with: Option<(CacheMode, Writes)>) -> Self {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(ids.0), Some(ids.1)).unwrap();
        let data = dir.join("data");
        // The shared cache's owner runs as `postgres` too, with its socket and log here.
        let runtime = dir.join("rt");
        std::fs::create_dir_all(&runtime).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&runtime, Some(ids.0), Some(ids.1)).unwrap();
        let env = match with {
            None => Vec::new(),
            Some((cache, writes)) => vec![
                (
                    "FOLIOCACHE_SHARED".to_owned(),
                    match cache {
                        CacheMode::Shared => "default".to_owned(),
                        CacheMode::Private => "off".to_owned(),
                    },
                ),
                (
                    "FOLIOCACHE_RUNTIME_DIR".to_owned(),
                    runtime.display().to_string(),
                ),
                ("FOLIOCACHE_IDLE_SECS".to_owned(), "10".to_owned()),
                (
                    "LD_PRELOAD".to_owned(),
                    common::preload_lib().display().to_string(),
                ),
                ("FOLIOCACHE_PATHS".to_owned(), data.display().to_string()),
                ("FOLIOCACHE_WRITES".to_owned(), writes.as_str().to_owned()),
                (
                    "FOLIOCACHE_STATS".to_owned(),
                    dir.join("stats.jsonl").display().to_string(),
                ),
            ],
        };
        Self {
            bin: bin.to_owned(),
            dir,
            data,
            ids,
            env,
            running: false,
        }
    }

    /// `program args` as `postgres`, within `secs` seconds (`timeout`), without the library
    /// (clients).
    fn command(&self, program: &str, args: &[&str], secs: u32) -> Command {
        let mut command = Command::new("timeout");
        command
            .arg("--kill-after=10")
            .arg(secs.to_string())
            .arg(self.bin.join(program))
            .args(args)
            .current_dir(&self.dir)
            .env("PGHOST", &self.dir)
            .env("PGUSER", "postgres")
            .env("PGDATABASE", "postgres")
            .env_remove("LD_PRELOAD")
            .uid(self.ids.0)
            .gid(self.ids.1);
        command
    }

    fn run(&self, program: &str, args: &[&str], secs: u32) -> Output {
        let out = self
            .command(program, args, secs)
            .output()
            .expect("run a PostgreSQL program");
        assert!(
            out.status.success(),
            "{program} {args:?} failed ({}): {}{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
        out
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn initdb(&self) {
        self.run(
            "initdb",
            &[
                "-D",
                self.data.to_str().unwrap(),
                "--auth=trust",
                "-U",
                "postgres",
            ],
            120,
        );
    }

    /// Starts the server (with the library's settings); false if it did not come up.
    fn start(&mut self) -> bool {
        let options = format!(
            "-k {} -c listen_addresses= -c shared_buffers=1MB -c fsync=on",
            self.dir.display()
        );
        let mut command = self.command(
            "pg_ctl",
            &[
                "-D",
                self.data.to_str().unwrap(),
                "-o",
                &options,
                "-l",
                self.dir.join("log").to_str().unwrap(),
                "-w",
                "-t",
                "120",
                "start",
            ],
            180,
        );
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        let ok = command.output().expect("pg_ctl start").status.success();
        self.running = true; // stop even a server that started but did not answer
        ok
    }

    fn stop(&mut self, mode: &str) {
        let _ = self
            .command(
                "pg_ctl",
                &["-D", self.data.to_str().unwrap(), "-m", mode, "-w", "stop"],
                120,
            )
            .output();
        self.running = false;
    }

    fn sql(&self, query: &str) -> String {
        let out = self.run("psql", &["-At", "-c", query], 120);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running {
            self.stop("immediate");
        }
    }
}

/// tps from pgbench's output.
fn tps(out: &Output) -> f64 {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0)
}

/// The pid of a shared cache `default`'s owner run by `uid`, if one runs (the only owner of
/// that user and name while this binary's single test runs).
fn find_owner(uid: u32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let entry = entry.ok()?;
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let mut args = cmdline.split(|&b| b == 0);
        let program = String::from_utf8_lossy(args.next()?).into_owned();
        if !program.ends_with("foliocache-owner") || args.next()? != b"default" {
            return None;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
        let owner_uid: u32 = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        (owner_uid == uid).then_some(pid)
    })
}

/// SIGKILLs the shared cache's owner (see [`find_owner`]) up to `times` times while `running`
/// holds, each time one that was not killed before (the one the next request started).
/// Returns how many it killed.
fn kill_owners(uid: u32, times: usize, running: &std::sync::atomic::AtomicBool) -> usize {
    let mut killed: Vec<i32> = Vec::new();
    while running.load(std::sync::atomic::Ordering::Relaxed) && killed.len() < times {
        if let Some(pid) = find_owner(uid).filter(|pid| !killed.contains(pid)) {
            // SAFETY: kill(2) with integer arguments.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed.push(pid);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    killed.len()
}

/// initdb, pgbench -i, `transactions` per client (with `kill_owner`, the shared cache's owner,
/// run by that uid, SIGKILLed twice meanwhile), an immediate shutdown, crash recovery, the
/// invariants and pg_amcheck. Returns the tps.
fn crash_and_recover(
    cluster: &mut Cluster,
    transactions: usize,
    label: &str,
    kill_owner: Option<u32>,
) -> f64 {
    cluster.initdb();
    assert!(
        cluster.start(),
        "{label}: the server did not start:\n{}",
        cluster.log_tail()
    );
    cluster.run("pgbench", &["-i", "-q", "-s", SCALE], 600);
    let running = std::sync::atomic::AtomicBool::new(true);
    let (out, killed) = std::thread::scope(|scope| {
        let running = &running;
        let killer = kill_owner.map(|uid| scope.spawn(move || kill_owners(uid, 2, running)));
        let out = cluster.run(
            "pgbench",
            &["-c", "4", "-j", "2", "-t", &transactions.to_string()],
            1800,
        );
        running.store(false, std::sync::atomic::Ordering::Relaxed);
        (out, killer.map(|k| k.join().unwrap()))
    });
    if let Some(killed) = killed {
        // The workload ran across the owner's deaths: every transaction below committed.
        assert!(killed > 0, "{label}: no owner was killed during pgbench");
        eprintln!("{label}: the shared cache's owner was killed {killed} times during pgbench");
    }
    let tps = tps(&out);
    let processed = format!(
        "number of transactions actually processed: {}/{}",
        4 * transactions,
        4 * transactions
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&processed),
        "{label}: pgbench: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    cluster.stop("immediate");
    assert!(
        cluster.start(),
        "{label}: crash recovery failed, the server did not come up:\n{}",
        cluster.log_tail()
    );
    assert_eq!(
        cluster.sql(
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = \
             (SELECT sum(delta) FROM pgbench_history), \
             (SELECT count(*) FROM pgbench_history), (SELECT count(*) FROM pgbench_accounts)"
        ),
        format!(
            "t|{}|{}",
            4 * transactions,
            100_000 * SCALE.parse::<usize>().unwrap()
        ),
        "{label}: the balances do not sum to the history's deltas, or rows were lost"
    );
    let check = cluster
        .command(
            "pg_amcheck",
            &["--install-missing", "--heapallindexed", "postgres"],
            600,
        )
        .output()
        .expect("run pg_amcheck");
    assert!(
        check.status.success() && check.stdout.is_empty(),
        "{label}: pg_amcheck found corruption ({}): {}{}",
        check.status,
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    // A clean stop and start: the same database.
    cluster.stop("fast");
    assert!(
        cluster.start(),
        "{label}: the server did not come up after a fast shutdown:\n{}",
        cluster.log_tail()
    );
    assert_eq!(
        cluster.sql(
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = \
             (SELECT sum(delta) FROM pgbench_history), (SELECT count(*) FROM pgbench_history)"
        ),
        format!("t|{}", 4 * transactions),
        "{label}: after a fast shutdown and a start"
    );
    cluster.stop("fast");
    tps
}

#[test]
fn postgresql_recovers_from_a_crash_and_checks_clean_through_the_library() {
    let Some(bin) = pg_bin() else {
        if std::env::var("FOLIOCACHE_ALLOW_SKIP").as_deref() == Ok("1") {
            eprintln!("SKIPPED: PostgreSQL is not installed (FOLIOCACHE_ALLOW_SKIP=1)");
            return;
        }
        panic!(
            "PostgreSQL is not installed: `apt-get install postgresql` (see .ci/run), or set \
             FOLIOCACHE_ALLOW_SKIP=1 to skip"
        );
    };
    let ids = postgres_user();
    let factor = std::env::var("FOLIOCACHE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .map_or(1, |secs| (secs / 3).clamp(1, 100));
    let transactions = TRANSACTIONS * factor;
    let root = work_dir("postgres");
    std::os::unix::fs::chown(&root, Some(ids.0), Some(ids.1)).unwrap();
    let mut report: Vec<(String, f64)> = Vec::new();
    let mut kernel = Cluster::new(&bin, root.join("kernel"), ids, None);
    report.push((
        "kernel".to_owned(),
        crash_and_recover(&mut kernel, transactions, "kernel", None),
    ));
    for (cache, writes) in common::modes() {
        let name = format!("{}-{}", cache.as_str(), writes.as_str());
        let label = format!(
            "library, {} cache, write-{}",
            cache.as_str(),
            writes.as_str()
        );
        let mut cluster = Cluster::new(&bin, root.join(&name), ids, Some((cache, writes)));
        // On the shared cache its owner is killed during the workload, as the OOM killer
        // would: the backends must recover without an error PostgreSQL sees.
        let kill_owner = (cache == CacheMode::Shared).then_some(ids.0);
        report.push((
            name,
            crash_and_recover(&mut cluster, transactions, &label, kill_owner),
        ));
        let s = stats(&cluster.dir.join("stats.jsonl"));
        assert!(s.processes > 0, "{label}: no backend wrote its counters");
        assert!(s.files > 0, "{label}: no file was cached: {s:?}");
        match cache {
            CacheMode::Private => {
                assert!(s.leases_taken > 0, "{label}: {s:?}");
                assert!(
                    s.leases_broken + s.passed("busy") > 0,
                    "{label}: no file was ever shared between backends? {s:?}"
                );
            }
            CacheMode::Shared => {
                // The backends' reads came from the one shared cache, which several of them
                // were attached to at once.
                assert!(s.hits > 0 && s.bytes_from_cache > 0, "{label}: {s:?}");
                assert!(s.shared_used_pages > 0, "{label}: {s:?}");
                assert!(
                    s.shared_attached_most > 1,
                    "{label}: never more than one process attached: {s:?}"
                );
            }
        }
    }
    eprintln!("pgbench -c 4 -j 2 -t {transactions} (scale {SCALE}, shared_buffers 1MB), tps:");
    for (label, tps) in &report {
        eprintln!("  {label:>15}: {tps:8.1}");
    }
    let _ = std::fs::remove_dir_all(&root);
}
