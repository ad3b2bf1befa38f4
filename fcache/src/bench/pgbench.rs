//! `fcache bench pgbench`: PostgreSQL's pgbench through the kernel's page cache and through
//! the preload library on a shared cache, with the same memory on both sides.
//!
//! * Once: a cluster is made (`initdb`, `pgbench -i -s 20`, about 300 MiB) and kept as a
//!   template. Every run starts from a fresh copy of it, its pages dropped from the kernel's
//!   cache (`POSIX_FADV_DONTNEED`), and a shared cache that does not exist yet.
//! * The server: Debian's PostgreSQL, as the `postgres` user when this runs as root,
//!   listening only on a Unix socket in the suite's directory, with `shared_buffers=16MB` so
//!   that its reads reach the file system. Servers are stopped when the suite ends, failed or
//!   not.
//! * Systems: `kernel` (the server as it is); `shared` and `shared-back` (the server with
//!   `libfoliocache_preload.so` serving the data directory on one shared cache of the suite's
//!   own, with `FOLIOCACHE_WRITES=through`, the default, and `back`).
//! * Memory: `large`, a cache half as large again as the database, and `small`, half of the
//!   database. The server (and the shared cache's owner, which the server's processes start)
//!   runs in a memory cgroup of its own whose limit is the cache's size plus a fixed margin
//!   for the server's own memory (80 MiB with 16 MiB of shared buffers): the kernel's page
//!   cache gets that memory, foliocache's cache is that size (its mapping is reserved whole
//!   when it is made). Where no memory cgroup can be made, the suite says so and the kernel's
//!   side runs unlimited.
//! * Workloads, in each run, after a warm-up (`pgbench -S` for a few seconds, not recorded):
//!   `select-only` (`pgbench -S`) and `tpcb` (pgbench's default mix), 4 clients on 2 threads,
//!   for a fixed time. The figure is pgbench's tps; the cgroup's peak memory is recorded.
//!   Systems alternate in order from one repetition to the next.

use super::BenchArgs;
use super::files::data_dir;
use super::measure::wait_for_idle;
use super::report::{Figure, Plot, Report};
use super::summary::{Row, Spread, Unit, value};
use crate::run::{find_preload, preload_env};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const KERNEL: &str = "kernel";
const SHARED: &str = "shared";
const SHARED_BACK: &str = "shared-back";
const SYSTEMS: [&str; 3] = [KERNEL, SHARED, SHARED_BACK];
const WORKLOADS: [&str; 2] = ["select-only", "tpcb"];
const SIZES: [&str; 2] = ["large", "small"];
const SCALE: u32 = 20;
const CLIENTS: &str = "4";
const THREADS: &str = "2";
const SHARED_BUFFERS_MB: u64 = 16;
/// The server's own memory beside the cache in its cgroup (processes, shared buffers, WAL).
const MARGIN_MB: u64 = 80;

/// PostgreSQL's programs (the newest version installed under /usr/lib/postgresql), or what is
/// missing.
fn pg_bin() -> Result<PathBuf, String> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| {
            "PostgreSQL not found: install Debian's postgresql (`apt-get install postgresql`)"
                .to_owned()
        })?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            ["postgres", "pg_ctl", "initdb", "pgbench"]
                .iter()
                .all(|p| bin.join(p).is_file())
                .then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "PostgreSQL's programs (postgres, pg_ctl, initdb, pgbench) not found under \
         /usr/lib/postgresql: install Debian's postgresql"
            .to_owned()
    })
}

/// PostgreSQL and the preload library, or what is missing.
pub(crate) fn prerequisites() -> Result<(PathBuf, PathBuf), String> {
    Ok((pg_bin()?, find_preload(None)?))
}

/// Who runs the server: `postgres` when we are root (PostgreSQL refuses root; the user is
/// made if missing), else ourselves.
fn server_user() -> Result<Option<(u32, u32)>, String> {
    if !rustix::process::geteuid().is_root() {
        return Ok(None);
    }
    let lookup = || -> Option<(u32, u32)> {
        let id = |flag: &str| -> Option<u32> {
            let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        };
        Some((id("-u")?, id("-g")?))
    };
    if let Some(ids) = lookup() {
        return Ok(Some(ids));
    }
    println!("pgbench: adding the system user `postgres` to run the server (useradd)");
    let status = Command::new("useradd")
        .args(["--system", "--user-group", "--no-create-home", "postgres"])
        .status()
        .map_err(|e| format!("cannot run useradd: {e}"))?;
    if !status.success() {
        return Err("useradd postgres failed".into());
    }
    lookup()
        .map(Some)
        .ok_or_else(|| "no postgres user after useradd".into())
}

/// A memory cgroup of the suite's own, below the one this process is in (cgroup v1's memory
/// controller or cgroup v2), removed when dropped.
struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// Makes it, writable by `owner` (the server joins it itself), or says why not.
    fn create(name: &str, owner: Option<(u32, u32)>) -> Result<Self, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let v1 = own.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_owned())
        });
        let (parent, v2) = match v1 {
            Some(path) => (
                Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')),
                false,
            ),
            None => {
                let path = own
                    .lines()
                    .find_map(|line| line.strip_prefix("0::"))
                    .ok_or("no memory cgroup controller (neither v1 nor v2)")?;
                let parent = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
                let enabled = std::fs::read_to_string(parent.join("cgroup.subtree_control"))
                    .unwrap_or_default();
                if !enabled.split_whitespace().any(|c| c == "memory") {
                    std::fs::write(parent.join("cgroup.subtree_control"), "+memory").map_err(
                        |e| {
                            format!(
                                "cgroup v2: cannot enable the memory controller below {}: {e}",
                                parent.display()
                            )
                        },
                    )?;
                }
                (parent, true)
            }
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir)
            .map_err(|e| format!("cannot make the memory cgroup {}: {e}", dir.display()))?;
        let cgroup = Self { dir, v2 };
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(cgroup.dir.join("cgroup.procs"), Some(uid), Some(gid))
                .map_err(|e| format!("chown of the cgroup's cgroup.procs: {e}"))?;
        }
        Ok(cgroup)
    }

    fn file(&self, v1: &str, v2: &str) -> PathBuf {
        self.dir.join(if self.v2 { v2 } else { v1 })
    }

    fn set_limit(&self, bytes: u64) -> Result<(), String> {
        std::fs::write(
            self.file("memory.limit_in_bytes", "memory.max"),
            bytes.to_string(),
        )
        .map_err(|e| format!("setting the cgroup's memory limit: {e}"))
    }

    /// The peak of its memory since the last reset (where the kernel keeps it).
    fn peak(&self) -> Option<u64> {
        std::fs::read_to_string(self.file("memory.max_usage_in_bytes", "memory.peak"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Processes the kernel's OOM killer has killed in the group (v1 `memory.oom_control`, v2
    /// `memory.events`: the `oom_kill` line); `None` where the kernel does not say.
    fn oom_kills(&self) -> Option<u64> {
        oom_kill_count(
            &std::fs::read_to_string(self.file("memory.oom_control", "memory.events")).ok()?,
        )
    }

    fn reset_peak(&self) {
        let _ = std::fs::write(self.file("memory.max_usage_in_bytes", "memory.peak"), "0");
    }

    /// The processes in it.
    fn processes(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Waits up to `wait` for every process to leave, then kills what is left.
    fn empty(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        while !self.processes().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for pid in self.processes() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        self.empty(Duration::from_secs(10));
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The `oom_kill` count of a cgroup's `memory.oom_control` (v1) or `memory.events` (v2).
fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("oom_kill "))?
        .trim()
        .parse()
        .ok()
}

/// The suite's directory: the template cluster, the run's copy, the sockets and the logs.
struct Site {
    bin: PathBuf,
    dir: PathBuf,
    user: Option<(u32, u32)>,
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Site {
    /// `program args` as the server's user, within `secs` seconds (`timeout`), without the
    /// library.
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
            .env_remove("LD_PRELOAD");
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn run(&self, program: &str, args: &[&str], secs: u32) -> Result<Output, String> {
        let out = self
            .command(program, args, secs)
            .output()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{program} {} failed ({}): {}{}\n{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log_tail()
            ));
        }
        Ok(out)
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// A directory owned by the server's user.
    fn own_dir(&self, path: &Path, mode: u32) -> Result<(), String> {
        std::fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = self.user {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// A running server, stopped (immediately) when dropped.
struct Server<'a> {
    site: &'a Site,
    data: PathBuf,
    running: bool,
}

impl<'a> Server<'a> {
    /// Starts the server on `data` with `env`, in `cgroup` if given.
    fn start(
        site: &'a Site,
        data: &Path,
        env: &[(String, String)],
        cgroup: Option<&MemoryCgroup>,
    ) -> Result<Self, String> {
        let options = format!(
            "-k {} -c listen_addresses= -c shared_buffers={SHARED_BUFFERS_MB}MB",
            site.dir.display()
        );
        let log = site.dir.join("log");
        let args = [
            "-D",
            data.to_str().ok_or("a data path that is not UTF-8")?,
            "-o",
            &options,
            "-l",
            log.to_str().ok_or("a log path that is not UTF-8")?,
            "-w",
            "-t",
            "120",
            "start",
        ];
        let mut command = match cgroup {
            // The server's user joins the cgroup itself (its cgroup.procs is theirs), then
            // becomes pg_ctl: every process the server starts is in it.
            Some(cgroup) => {
                let mut command = Command::new("sh");
                command
                    .arg("-c")
                    .arg("echo $$ > \"$0\" && exec \"$@\"")
                    .arg(cgroup.dir.join("cgroup.procs"))
                    .arg("timeout")
                    .arg("180")
                    .arg(site.bin.join("pg_ctl"))
                    .args(args)
                    .current_dir(&site.dir)
                    .env_remove("LD_PRELOAD");
                if let Some((uid, gid)) = site.user {
                    command.uid(uid).gid(gid);
                }
                command
            }
            None => site.command("pg_ctl", &args, 180),
        };
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let mut server = Server {
            site,
            data: data.to_owned(),
            running: true, // stop even a server that started but did not answer
        };
        let out = command
            .output()
            .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
        if !out.status.success() {
            server.stop("immediate");
            return Err(format!(
                "pg_ctl start failed ({}): {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                site.log_tail()
            ));
        }
        Ok(server)
    }

    fn stop(&mut self, mode: &str) {
        if let Some(data) = self.data.to_str() {
            let _ = self
                .site
                .command("pg_ctl", &["-D", data, "-m", mode, "-w", "stop"], 120)
                .output();
        }
        self.running = false;
    }

    /// pgbench's tps for `extra` arguments run for `secs` seconds.
    fn pgbench(&self, extra: &[&str], secs: u64) -> Result<f64, String> {
        let time = secs.to_string();
        let mut args = vec!["-n", "-c", CLIENTS, "-j", THREADS, "-T", &time];
        args.extend(extra);
        let out = self.site.run("pgbench", &args, secs as u32 + 120)?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|line| line.strip_prefix("tps = "))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                format!(
                    "no tps in pgbench's output: {}",
                    String::from_utf8_lossy(&out.stdout)
                )
            })
    }
}

impl Drop for Server<'_> {
    fn drop(&mut self) {
        if self.running {
            self.stop("immediate");
        }
    }
}

/// Bytes of the regular files under `dir`.
fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => total += tree_bytes(&entry.path()),
                Ok(m) if m.is_file() => total += m.len(),
                _ => {}
            }
        }
    }
    total
}

/// Drops the kernel's clean pages of every file under `dir` (they were synced first).
fn drop_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.metadata() {
                Ok(m) if m.is_dir() => drop_tree(&path),
                Ok(m) if m.is_file() => {
                    if let Ok(file) = std::fs::File::open(&path) {
                        let _ = file.sync_data();
                        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
                    }
                }
                _ => {}
            }
        }
    }
}

/// Waits until the shared cache's owner has written its last line ("stopped") or `wait`
/// passed.
fn wait_for_owner_exit(log: &Path, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.is_empty() || text.lines().last().is_some_and(|l| l.ends_with("stopped")) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The preload library's per-process counters summed over the server's processes: reads,
/// bytes served from the cache, and reads passed through to the kernel.
fn served(stats: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(stats).unwrap_or_default();
    let mut sums = [0u64; 3];
    for line in text.lines() {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            for (sum, key) in
                sums.iter_mut()
                    .zip(["reads", "bytes_from_cache", "passthrough_reads"])
            {
                *sum += v[key].as_u64().unwrap_or(0);
            }
        }
    }
    json!({"reads": sums[0], "bytes_from_cache": sums[1], "passthrough_reads": sums[2]})
}

/// One run's figures: tps per workload, and the cgroup's peak memory.
struct RunFigures {
    tps: [f64; 2],
    peak: Option<u64>,
    served: serde_json::Value,
}

struct Suite<'a> {
    site: &'a Site,
    template: PathBuf,
    lib: &'a Path,
    cgroup: Option<&'a MemoryCgroup>,
    warmup_secs: u64,
    secs: u64,
}

impl Suite<'_> {
    /// One run: a fresh copy of the template, the server started through `system` with a
    /// cache of `cache_mb` (and its cgroup limited to it plus the margin), the warm-up, the
    /// workloads, the server stopped and the shared cache gone.
    fn run(&self, system: &str, cache_mb: u64, run: usize) -> Result<RunFigures, String> {
        let data = self.site.dir.join("run");
        let _ = std::fs::remove_dir_all(&data);
        let copied = Command::new("cp")
            .arg("-a")
            .arg(&self.template)
            .arg(&data)
            .status()
            .map_err(|e| format!("cannot run cp: {e}"))?;
        if !copied.success() {
            return Err("copying the template cluster failed".into());
        }
        drop_tree(&self.template);
        drop_tree(&data);
        let runtime = self.site.dir.join(format!("rt-{run}"));
        self.site.own_dir(&runtime, 0o700)?;
        let stats = self.site.dir.join(format!("stats-{run}.jsonl"));
        let name = "pgbench";
        let env = if system == KERNEL {
            Vec::new()
        } else {
            let mut env = preload_env(
                self.lib,
                &data.display().to_string(),
                Some(cache_mb),
                None,
                Some(&stats),
            );
            env.extend([
                ("FOLIOCACHE_SHARED".to_owned(), name.to_owned()),
                (
                    "FOLIOCACHE_RUNTIME_DIR".to_owned(),
                    runtime.display().to_string(),
                ),
                ("FOLIOCACHE_IDLE_SECS".to_owned(), "1".to_owned()),
                (
                    "FOLIOCACHE_WRITES".to_owned(),
                    if system == SHARED_BACK {
                        "back"
                    } else {
                        "through"
                    }
                    .to_owned(),
                ),
            ]);
            env
        };
        if let Some(cgroup) = self.cgroup {
            cgroup.set_limit((cache_mb + MARGIN_MB) << 20)?;
            cgroup.reset_peak();
        }
        let kills_before = self.cgroup.and_then(MemoryCgroup::oom_kills);
        // What the OOM killer did in this run, if anything: a process killed for the cgroup's
        // limit explains a failed or slow run, and taints a run's figures.
        let oom_note = || {
            let killed = self
                .cgroup
                .and_then(MemoryCgroup::oom_kills)?
                .saturating_sub(kills_before?);
            (killed > 0).then(|| {
                format!(
                    "the memory cgroup's OOM killer killed {killed} process(es) during the \
                     {system} run with a {cache_mb} MiB cache (limit {} MiB): see `dmesg`",
                    cache_mb + MARGIN_MB
                )
            })
        };
        let mut server = Server::start(self.site, &data, &env, self.cgroup)?;
        let workloads = server
            .pgbench(&["-S"], self.warmup_secs)
            .and_then(|_| server.pgbench(&["-S"], self.secs))
            .and_then(|select| Ok((select, server.pgbench(&[], self.secs)?)));
        let (select, tpcb) = workloads.map_err(|e| match oom_note() {
            Some(note) => format!("{e}\n{note}"),
            None => e,
        })?;
        if let Some(note) = oom_note() {
            eprintln!("fcache: pgbench: {note}; its figures count as they are");
        }
        let peak = self.cgroup.and_then(MemoryCgroup::peak);
        server.stop("fast");
        drop(server);
        if system != KERNEL
            && !wait_for_owner_exit(
                &runtime.join(format!("{name}.log")),
                Duration::from_secs(60),
            )
        {
            return Err("the shared cache's owner did not stop within 60 s of the server".into());
        }
        if let Some(cgroup) = self.cgroup {
            cgroup.empty(Duration::from_secs(10));
        }
        Ok(RunFigures {
            tps: [select, tpcb],
            peak,
            served: served(&stats),
        })
    }
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let (bin, lib) = prerequisites()?;
    let user = server_user()?;
    let base = data_dir(args)?;
    let reps = args
        .reps
        .map_or(if args.full { 5 } else { 3 }, |r| r as usize);
    let (warmup_secs, secs) = if args.full { (10, 30) } else { (3, 8) };
    let dir = base.join(format!("fcache-pgbench-{}", std::process::id()));
    let site = Site {
        bin,
        dir: dir.clone(),
        user,
    };
    site.own_dir(&dir, 0o755)?;
    let bar = ProgressBar::new((reps * SIZES.len() * SYSTEMS.len() + 1) as u64).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("pgbench");
    bar.set_message(format!("initdb, pgbench -i -s {SCALE}"));
    let template = dir.join("template");
    let template_str = template.to_str().ok_or("a path that is not UTF-8")?;
    site.run(
        "initdb",
        &["-D", template_str, "--auth=trust", "-U", "postgres"],
        120,
    )?;
    {
        let mut server = Server::start(&site, &template, &[], None)?;
        site.run("pgbench", &["-i", "-q", "-s", &SCALE.to_string()], 600)?;
        server.stop("fast");
    }
    bar.inc(1);
    // The database: its relations (`base/`), without the WAL pgbench -i left.
    let db_bytes = tree_bytes(&template.join("base"));
    let db_mb = db_bytes >> 20;
    let cache_mb = |size: &str| {
        if size == "large" {
            db_mb * 3 / 2
        } else {
            db_mb / 2
        }
    };
    let mut report = Report::new(
        "pgbench",
        json!({
            "postgres": site.bin.display().to_string(),
            "scale": SCALE,
            "database_bytes": db_bytes,
            "shared_buffers_mb": SHARED_BUFFERS_MB,
            "clients": CLIENTS,
            "threads": THREADS,
            "seconds": secs,
            "warmup_seconds": warmup_secs,
            "reps": reps,
            "cache_mb": {"large": cache_mb("large"), "small": cache_mb("small")},
            "cgroup_margin_mb": MARGIN_MB,
            "preload": lib.display().to_string(),
        }),
    );
    let (cgroup, cgroup_note) =
        match MemoryCgroup::create(&format!("fcache-pgbench-{}", std::process::id()), user) {
            Ok(cgroup) => (Some(cgroup), None),
            Err(why) => (
                None,
                Some(format!(
                    "No memory cgroup could be made ({why}): the kernel's side ran with all \
                     the machine's memory, so its `small` figures are not the same memory as \
                     foliocache's."
                )),
            ),
        };
    let suite = Suite {
        site: &site,
        template: template.clone(),
        lib: &lib,
        cgroup: cgroup.as_ref(),
        warmup_secs,
        secs,
    };
    // [size][system][workload] tps samples; [size][system] peak memory and served bytes.
    let mut tps = vec![vec![[Vec::new(), Vec::new()]; SYSTEMS.len()]; SIZES.len()];
    let mut peaks = vec![vec![Vec::new(); SYSTEMS.len()]; SIZES.len()];
    let mut served = serde_json::Map::new();
    let mut run_index = 0;
    for rep in 0..reps {
        for (s, size) in SIZES.iter().enumerate() {
            wait_for_idle(Duration::from_secs(3));
            for step in 0..SYSTEMS.len() {
                // Forward on even repetitions, backward on odd ones.
                let k = if rep % 2 == 0 {
                    step
                } else {
                    SYSTEMS.len() - 1 - step
                };
                let system = SYSTEMS[k];
                bar.set_message(format!("{size} {system} rep {}/{reps}", rep + 1));
                run_index += 1;
                let figures = suite.run(system, cache_mb(size), run_index)?;
                for (samples, tps) in tps[s][k].iter_mut().zip(figures.tps) {
                    samples.push(tps);
                }
                if let Some(peak) = figures.peak {
                    peaks[s][k].push(peak as f64 / f64::from(1 << 20));
                }
                if system != KERNEL {
                    served.insert(format!("{size}/{system}"), figures.served);
                }
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    report.sizes["memory_cgroup"] = json!(cgroup.as_ref().map(|c| c.dir.display().to_string()));
    let mut groups = Vec::new();
    for (s, size) in SIZES.iter().enumerate() {
        for (w, workload) in WORKLOADS.iter().enumerate() {
            let case = format!("{workload}/{size}");
            for (k, system) in SYSTEMS.iter().enumerate() {
                report
                    .results
                    .push(Figure::new(&case, system, "tps", &tps[s][k][w], 0));
                if w == 0 && !peaks[s][k].is_empty() {
                    report.results.push(Figure::new(
                        &format!("memory/{size}"),
                        system,
                        "peak_mib",
                        &peaks[s][k],
                        0,
                    ));
                }
            }
            for (k, system) in SYSTEMS.iter().enumerate().skip(1) {
                report.paired(&case, (system, &tps[s][k][w]), (KERNEL, &tps[s][0][w]), 0);
            }
            let bars = SYSTEMS
                .iter()
                .filter_map(|system| {
                    report
                        .figure(&case, system, "tps")
                        .map(|f| ((*system).to_owned(), f.median))
                })
                .collect();
            groups.push((case, bars));
        }
    }
    report.plots.push(Plot {
        file: "pgbench.svg".into(),
        title: format!(
            "pgbench, scale {SCALE} ({db_mb} MiB), {CLIENTS} clients, shared_buffers \
             {SHARED_BUFFERS_MB} MiB; cache {} MiB (large) and {} MiB (small)",
            cache_mb("large"),
            cache_mb("small")
        ),
        unit: "tps".into(),
        groups,
    });
    served.insert(
        "note".into(),
        json!("the preload library's counters of the last run of each, summed over the server's processes"),
    );
    report.counters = serde_json::Value::Object(served);
    report.notes.push(format!(
        "Each run: a fresh copy of a scale-{SCALE} cluster ({db_mb} MiB) with its pages dropped \
         from the kernel's cache, the server started cold (a new shared cache), {warmup_secs} s \
         of select-only not recorded, then {secs} s of each workload. The server runs in a \
         memory cgroup limited to the cache's size plus {MARGIN_MB} MiB: that is all the \
         kernel's page cache can have; foliocache's cache is the size itself, its mapping \
         reserved whole inside the same limit. `memory/*` is the cgroup's peak."
    ));
    if let Some(note) = cgroup_note {
        report.notes.push(note);
    }
    for (size, goal_note) in [
        (
            "large",
            "the cache holds the database: reads are hits once warm",
        ),
        (
            "small",
            "the cache holds half the database: both sides read from the device",
        ),
    ] {
        let ratio = |w: &str, system: &str| {
            report
                .paired_ratio(&format!("{w}/{size}"), system, KERNEL)
                .map_or(f64::NAN, |f| f.median)
        };
        report.notes.push(format!(
            "{size} ({goal_note}): select-only shared/kernel {:.2}×, tpcb shared/kernel {:.2}×, \
             shared-back/kernel {:.2}×.",
            ratio("select-only", SHARED),
            ratio("tpcb", SHARED),
            ratio("tpcb", SHARED_BACK),
        ));
    }
    Ok(report)
}

/// The summary's rows: tps through the shared cache against the kernel with the same memory.
pub(crate) fn summary(report: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    for size in SIZES {
        for workload in WORKLOADS {
            let case = format!("{workload}/{size}");
            for system in [SHARED, SHARED_BACK] {
                let Some(p) = report.paired_ratio(&case, system, KERNEL) else {
                    continue;
                };
                let tps = |s: &str| report.figure(&case, s, "tps");
                rows.push(
                    Row::new("pgbench", format!("pgbench {case}, {system} (tps)"))
                        .after(value(tps(system), 1.0, ""))
                        .kernel(value(tps(KERNEL), 1.0, ""))
                        .ratio(Spread::of(p, Unit::Times)),
                );
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::oom_kill_count;

    #[test]
    fn oom_kills_are_read_from_either_cgroup_version() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(oom_kill_count(v1), Some(3));
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(v2), Some(1));
        assert_eq!(oom_kill_count("oom_kill_disable 0\nunder_oom 0\n"), None);
    }
}
