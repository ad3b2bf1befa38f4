//! `fcache bench dbbench`: seed 000's experiment with the real program. RocksDB's `db_bench`
//! (Debian's rocksdb-tools; an assertion build, so absolute figures are low) reads one database
//! through the kernel's page cache and through the preload library.
//!
//! * Once: `fillseq` (no compression, no WAL) writes a database several times the size of the
//!   block cache, then it is synced.
//! * Cases: `readseq` and `readrandom`, each in three states. `cold`: every cache emptied (the
//!   database files' pages dropped from the kernel's cache with `POSIX_FADV_DONTNEED`, checked
//!   with `mincore`, and the shared cache's clean pages dropped), then one db_bench process.
//!   `warm`: right after the cold run, nothing dropped, a second db_bench process, served by
//!   what the first one left (the kernel's page cache, the shared cache). `warm-in-process`:
//!   from cold, one db_bench process with two passes (`--benchmarks=X,X`), the second being the
//!   figure; a private cache lives in its process, so this is the only way it is warm.
//!   readrandom reads 50,000 keys per thread in a cold or warm run, and 400,000 in each
//!   warm-in-process pass, so that the figure's pass lasts two seconds or more on 2 vCPUs
//!   (200,000 and 800,000 with `--full`).
//! * Systems: `kernel` (db_bench as it is); `private` and `shared` (db_bench with
//!   `libfoliocache_preload.so` serving the database directory, on a cache of its own
//!   (`FOLIOCACHE_SHARED=off`) or on a shared cache the suite makes for itself and ends at
//!   its end). `private, placed`: the private cache with small fills' pages placed by their
//!   file offset (`FOLIOCACHE_PLACE=offset`), so placement is measured against the private
//!   cache without it in the same run. `kernel` and the limit are measured in every case, the
//!   private systems cold and warm-in-process, `shared` cold and warm. All with `--use_direct_reads=false`: RocksDB
//!   reads with `pread`, and advises random access on open (its default), so its iterators
//!   issue `readahead(2)` themselves. And the limit, `kernel-mmap`: `--mmap_read=1`, RocksDB
//!   reading the kernel's page cache through `mmap` (no system call and no copy per block, no
//!   block buffer allocated or cached), a limit no cache behind `pread` reaches. And the limit
//!   of a cache behind `pread`, `pread-limit`: RocksDB's reads of its table files served by a
//!   copy out of the whole file, read into huge-page memory when the file is opened
//!   (`pread_limit.c`, a preload library for db_bench alone, built with the machine's C
//!   compiler when the suite starts):
//!   what a `pread` costs when serving it costs nothing but the copy. Both limits are measured
//!   in the warm cases only.
//! * Metrics: `ops/s` as db_bench reports it (all threads), and `cpu_s`, user + system CPU
//!   seconds of the db_bench process: the whole run (`wait4`), starting and opening the
//!   database included, except for warm-in-process: from the first pass's result line
//!   (`/proc/PID/stat`, 10 ms ticks; db_bench runs under `stdbuf -oL`) to the end.
//! * Before each run, memory the size of the database and 32 MiB more is touched in huge pages
//!   and freed (this VM hands idle memory back to the host and a first touch afterwards is
//!   slow, `docs/BENCHMARKS.md`; see `warm_guest_memory`), for both systems alike; systems
//!   alternate in order from one repetition to the next, after a wait for an idle machine.

use super::BenchArgs;
use super::files::data_dir;
use super::measure::{IdleGuard, settle, wait_for_idle};
use super::memory::{Mapping, warm_guest_memory};
use super::report::{Figure, Plot, Report};
use super::summary::{Row, Spread, Unit, value};
use crate::run::{find_preload, preload_env};
use foliocache::CacheCommand;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The systems' names in the figures.
const KERNEL: &str = "kernel";
/// db_bench through the preload library on a cache of its own (`FOLIOCACHE_SHARED=off`).
const PRIVATE: &str = "private";
/// [`PRIVATE`] with small fills placed by their file offset (`FOLIOCACHE_PLACE=offset`).
const PRIVATE_PLACED: &str = "private, placed";
/// db_bench through the preload library on a shared cache that outlives each process.
const SHARED: &str = "shared";
/// The zero-copy limit: RocksDB reading through `mmap` of the kernel's page cache
/// (`--mmap_read=1`): no system call, no copy, and no block buffer to allocate or to put in
/// the block cache. No cache behind `pread` can do better.
const MMAP: &str = "kernel-mmap";
/// The limit of a cache behind `pread`: each read of a table file is a copy out of the file's
/// bytes held in huge-page memory (`pread_limit.c`), so RocksDB still allocates, fills and
/// caches its block buffers, as it does through any `pread`.
const PREAD_LIMIT: &str = "pread-limit";
/// The source of the `pread-limit` preload library.
const PREAD_LIMIT_SOURCE: &str = include_str!("pread_limit.c");
const WORKLOADS: [&str; 2] = ["readseq", "readrandom"];

struct Sizes {
    /// Keys in the database.
    num: u64,
    value_bytes: u64,
    /// Reads per thread for readrandom's single-pass runs, cold and warm (readseq reads every
    /// key per thread).
    random_reads: u64,
    /// Reads per thread in each pass of readrandom's warm-in-process run: enough for its
    /// second pass, the figure, to last seconds (a quarter-second pass spreads with the
    /// host's noise more than the differences it is there to show).
    in_process_reads: u64,
    /// RocksDB's block cache (small: the database is several times larger).
    block_cache: u64,
    threads: u32,
}

/// One finished db_bench run.
struct RunResult {
    /// ops/s of each benchmark pass, in order.
    ops: Vec<f64>,
    /// CPU seconds of each pass (the first includes starting and opening the database).
    cpu_s: Vec<f64>,
    /// What each pass did, without its timings: operations and `(N of M found)`. It must be
    /// the same through the kernel and through the library.
    outcome: Vec<String>,
}

/// A result line's outcome: the benchmark, its operation count, and what it found.
fn outcome(line: &str) -> String {
    let name = line.split_whitespace().next().unwrap_or("");
    let operations = line
        .split(';')
        .next()
        .and_then(|head| head.split_whitespace().rev().nth(1))
        .unwrap_or("");
    let found = line.find('(').map_or("", |at| &line[at..]);
    format!("{name}: {operations} operations {found}")
        .trim_end()
        .to_owned()
}

fn db_bench() -> Result<PathBuf, String> {
    let find = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("db_bench"))
                .find(|path| path.is_file())
        })
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    // Where it can (as root, with apt-get), the suite installs what it runs: one line says so.
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 && Path::new("/usr/bin/apt-get").is_file() {
        println!("dbbench: installing Debian's rocksdb-tools (apt-get install rocksdb-tools)");
        let quiet = |args: &[&str]| {
            std::process::Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        };
        if quiet(&["update", "-qq"]) {
            quiet(&["install", "-y", "-qq", "rocksdb-tools"]);
        }
    }
    find().ok_or_else(|| {
        "db_bench not found: install Debian's rocksdb-tools (`apt-get install rocksdb-tools`)"
            .to_owned()
    })
}

fn common_args(db: &Path, sizes: &Sizes) -> Vec<String> {
    vec![
        format!("--db={}", db.display()),
        format!("--num={}", sizes.num),
        format!("--value_size={}", sizes.value_bytes),
        "--compression_type=none".into(),
        format!("--cache_size={}", sizes.block_cache),
        "--use_direct_reads=false".into(),
        "--seed=1".into(),
    ]
}

/// Whether a db_bench output line is a pass's result (`readseq : ... N ops/sec ...`; not the
/// `Read rate: 0 ops/second` line printed at start).
fn is_result(line: &str) -> bool {
    line.split_whitespace().any(|word| word == "ops/sec")
}

/// User + system CPU seconds of process `pid` so far (`/proc/PID/stat`, clock ticks).
fn cpu_so_far(pid: libc::pid_t) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    Some(ticks as f64 / hz as f64)
}

/// Runs db_bench with `args` (and the preload environment if given); returns each pass's ops/s
/// and CPU time: the whole process for the first pass, and from the moment the previous pass
/// printed its result for the later ones (db_bench's stdout is line buffered with `stdbuf`, so
/// the result line arrives as the pass ends).
fn run_db_bench(
    program: &Path,
    args: &[String],
    env: &[(String, String)],
) -> Result<RunResult, String> {
    let child = Command::new("stdbuf")
        .arg("-oL")
        .arg(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run stdbuf db_bench: {e}"))?;
    let pid = child.id() as libc::pid_t;
    // Read the pipes on threads so the child never blocks on a full one, and reap it with
    // wait4 for its resource usage.
    let stdout = child.stdout.ok_or("no stdout")?;
    let mut stderr = child.stderr.ok_or("no stderr")?;
    let out_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let mut marks = Vec::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            if is_result(&line) {
                marks.push(cpu_so_far(pid));
            }
            text.push_str(&line);
            text.push('\n');
        }
        (text, marks)
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child, with valid pointers to locals.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let (out, marks) = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    if rc != pid {
        return Err(format!(
            "wait4 on db_bench failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    let exit = std::process::ExitStatus::from_raw(status);
    if !exit.success() {
        return Err(format!(
            "db_bench {} failed ({exit}):\n{out}\n{err}",
            args.join(" ")
        ));
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let total = seconds(usage.ru_utime) + seconds(usage.ru_stime);
    let results: Vec<&str> = out.lines().filter(|line| is_result(line)).collect();
    let ops: Vec<f64> = results
        .iter()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "ops/sec")?;
            words.get(at.checked_sub(1)?)?.parse().ok()
        })
        .collect();
    // Pass k's CPU: from the previous pass's result line to this one's (the last: to exit).
    let mut cpu_s = Vec::new();
    let mut before = 0.0;
    for k in 0..ops.len() {
        let at = if k + 1 == ops.len() {
            total
        } else {
            marks.get(k).copied().flatten().unwrap_or(f64::NAN)
        };
        cpu_s.push(at - before);
        before = at;
    }
    let outcome = results.iter().map(|line| outcome(line)).collect();
    Ok(RunResult {
        ops,
        cpu_s,
        outcome,
    })
}

/// Drops the database files' pages from the kernel's cache and returns how many stayed
/// resident (0 unless something keeps them, `mincore` tells).
fn drop_kernel_cache(dir: &Path) -> Result<u64, String> {
    let mut resident = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if !path.is_file() {
            continue;
        }
        let file = std::fs::File::open(&path).map_err(|e| e.to_string())?;
        let _ = file.sync_data();
        rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(|e| format!("fadvise {}: {e}", path.display()))?;
        resident += resident_pages(&file)?;
    }
    Ok(resident)
}

/// Pages of `file` in the kernel's page cache (`mincore` over a read-only mapping).
fn resident_pages(file: &std::fs::File) -> Result<u64, String> {
    let len = file.metadata().map_err(|e| e.to_string())?.len() as usize;
    if len == 0 {
        return Ok(0);
    }
    let map = Mapping::file(file, len).map_err(|e| format!("mmap: {e}"))?;
    map.resident_pages().map_err(|e| format!("mincore: {e}"))
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(std::fs::Metadata::is_file)
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// How a case's run finds the caches. Every system's turn runs its cases in this order, so a
/// `Warm` run follows the system's `Cold` run with nothing dropped in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// Every cache emptied, then one db_bench process with one pass.
    Cold,
    /// Right after the cold run, nothing dropped: a second db_bench process reads what the
    /// first one left, as the kernel's page cache (and the shared cache) keep it.
    Warm,
    /// Every cache emptied, then one db_bench process with two passes: the second is served
    /// from what the first read in the same process (the only way a private cache is warm).
    InProcess,
}

const CASES: [Case; 3] = [Case::Cold, Case::Warm, Case::InProcess];

impl Case {
    fn label(self) -> &'static str {
        match self {
            Case::Cold => "cold",
            Case::Warm => "warm",
            Case::InProcess => "warm-in-process",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// db_bench passes in the run; the figure is the last one's.
    fn passes(self) -> usize {
        if self == Case::InProcess { 2 } else { 1 }
    }
}

/// A system dbbench measures: what it is called, and how db_bench runs through it.
trait System {
    /// The system's name in the figures.
    fn name(&self) -> &'static str;

    /// The cases it is measured in.
    fn cases(&self) -> &'static [Case] {
        &CASES
    }

    /// The environment db_bench runs in.
    fn env(&self) -> &[(String, String)] {
        &[]
    }

    /// What it adds to db_bench's arguments.
    fn args(&self) -> &[&'static str] {
        &[]
    }

    /// Empties its own cache (besides the kernel's, which every cold run drops).
    fn drop_cache(&self) -> Result<(), String> {
        Ok(())
    }

    /// Called right before each db_bench run.
    fn before_run(&self) {}

    /// Its own counters after its latest run (the cache's, for the preload library).
    fn counters(&self) -> Option<serde_json::Value> {
        None
    }

    /// Checks, after each run, that the system did what its figures are credited to.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The kernel: db_bench as it is, reading with `pread` through the kernel's page cache.
struct Kernel;

impl System for Kernel {
    fn name(&self) -> &'static str {
        KERNEL
    }
}

/// foliocache: db_bench with the preload library serving the database directory, on a
/// private cache (one per process) or on a shared cache of its own name.
struct Preload<'a> {
    name: &'static str,
    env: Vec<(String, String)>,
    /// Where the library writes its cache's counters when the process ends.
    stats: &'a Path,
    /// The shared cache's name, or none for the private cache.
    shared: Option<String>,
}

impl System for Preload<'_> {
    fn name(&self) -> &'static str {
        self.name
    }

    /// A private cache is never warm in a new process: its `Warm` case would be its cold one.
    /// The shared cache is measured across processes, as the kernel's page cache is used.
    fn cases(&self) -> &'static [Case] {
        if self.shared.is_some() {
            &[Case::Cold, Case::Warm]
        } else {
            &[Case::Cold, Case::InProcess]
        }
    }

    fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The shared cache's clean pages dropped (`fcache cache drop`); no owner running is an
    /// empty cache already.
    fn drop_cache(&self) -> Result<(), String> {
        let Some(name) = &self.shared else {
            return Ok(());
        };
        if foliocache::cache_command(name, CacheCommand::Status).is_err() {
            return Ok(());
        }
        foliocache::cache_command(name, CacheCommand::Drop)
            .map(|_| ())
            .map_err(|e| format!("dropping the shared cache {name}: {e}"))
    }

    fn before_run(&self) {
        let _ = std::fs::remove_file(self.stats);
    }

    /// The cache's own counters of the last run, as a check that it served the reads.
    fn counters(&self) -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(self.stats).unwrap_or_default();
        serde_json::from_str(text.lines().next()?).ok()
    }
}

/// The shared cache the suite made, ended when the suite ends (failed or not).
struct SharedCacheGuard {
    name: String,
}

impl Drop for SharedCacheGuard {
    fn drop(&mut self) {
        let _ = foliocache::cache_command(&self.name, CacheCommand::Destroy { force: true });
    }
}

/// The zero-copy limit: RocksDB reading the kernel's page cache through `mmap`.
struct Mmap;

impl System for Mmap {
    fn name(&self) -> &'static str {
        MMAP
    }

    fn args(&self) -> &[&'static str] {
        &["--mmap_read=1"]
    }
}

/// The limit of a cache behind `pread` (see [`PREAD_LIMIT`]).
struct PreadLimit {
    env: Vec<(String, String)>,
    /// Where the library appends `maps M preads P` at exit.
    stats: PathBuf,
}

impl PreadLimit {
    /// Builds the library from [`PREAD_LIMIT_SOURCE`] in `dir` with the machine's C compiler
    /// (`cc`, else `gcc`).
    fn build(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let source = dir.join("pread_limit.c");
        let library = dir.join("pread_limit.so");
        std::fs::write(&source, PREAD_LIMIT_SOURCE)
            .map_err(|e| format!("{}: {e}", source.display()))?;
        let mut failures = Vec::new();
        for compiler in ["cc", "gcc"] {
            let built = Command::new(compiler)
                .args(["-O2", "-shared", "-fPIC", "-o"])
                .arg(&library)
                .arg(&source)
                .arg("-ldl")
                .stdout(Stdio::null())
                .output();
            match built {
                Ok(out) if out.status.success() => {
                    return Ok(Self {
                        env: vec![
                            ("LD_PRELOAD".into(), library.display().to_string()),
                            (
                                "FCACHE_PREAD_LIMIT_STATS".into(),
                                dir.join("stats").display().to_string(),
                            ),
                        ],
                        stats: dir.join("stats"),
                    });
                }
                Ok(out) => failures.push(format!(
                    "{compiler}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Err(e) => failures.push(format!("{compiler}: {e}")),
            }
        }
        Err(failures.join("; "))
    }

    /// `(maps, preads)` of the last run.
    fn served(&self) -> Option<(u64, u64)> {
        let text = std::fs::read_to_string(&self.stats).ok()?;
        let words: Vec<&str> = text.lines().last()?.split_whitespace().collect();
        match words[..] {
            ["maps", maps, "preads", preads] => Some((maps.parse().ok()?, preads.parse().ok()?)),
            _ => None,
        }
    }
}

impl System for PreadLimit {
    fn name(&self) -> &'static str {
        PREAD_LIMIT
    }

    /// A limit of warm reads only; its files are populated when opened, so both cases are
    /// served from memory.
    fn cases(&self) -> &'static [Case] {
        &[Case::Warm, Case::InProcess]
    }

    fn env(&self) -> &[(String, String)] {
        &self.env
    }

    fn before_run(&self) {
        let _ = std::fs::remove_file(&self.stats);
    }

    fn counters(&self) -> Option<serde_json::Value> {
        let (maps, preads) = self.served()?;
        Some(json!({ "table_files_mapped": maps, "preads_served_at_least": preads }))
    }

    fn check(&self) -> Result<(), String> {
        match self.served() {
            Some((maps, preads)) if maps > 0 && preads > 0 => Ok(()),
            Some((maps, preads)) => Err(format!(
                "the pread limit mapped {maps} table files and served {preads} reads: its \
                 figures would be the kernel's"
            )),
            None => Err(format!(
                "the pread limit left no counters in {}",
                self.stats.display()
            )),
        }
    }
}

/// A directory removed when the suite ends (failed or not): the database's, the pread limit's.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What every db_bench run of the suite shares: the program, the database and its size, the
/// repetitions and the progress bar.
struct Bench<'a> {
    program: &'a Path,
    db: &'a Path,
    db_bytes: u64,
    reps: usize,
    bar: &'a ProgressBar,
}

/// One workload's samples, `[system][case]`: ops/s, CPU seconds, and how many were taken on a
/// busy machine (db_bench is our child: the idle guard counts its CPU time as ours once it is
/// waited for). And the outcome of the first run with 1 and 2 passes (system, outcome).
struct Samples {
    ops: Vec<[Vec<f64>; 3]>,
    cpu: Vec<[Vec<f64>; 3]>,
    busy: Vec<[usize; 3]>,
    expected: [Option<(&'static str, Vec<String>)>; 2],
}

/// The measuring body: one workload, each repetition running every system in turn (forward on
/// even repetitions, backward on odd ones) after a wait for an idle machine. A system's turn
/// runs its cases in order (cold, warm, warm-in-process), each one db_bench process under the
/// idle guard, with the arguments `run_args[case]`. Every run must find what the first with as
/// many passes did, whichever system it ran through. Counts the database pages that stayed resident after each drop, and keeps each system's
/// counters of its last run in `counters`.
fn measure_workload(
    bench: &Bench<'_>,
    workload: &str,
    run_args: &[Vec<String>; 3],
    systems: &[Box<dyn System + '_>],
    resident_after_drop: &mut u64,
    counters: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<Samples, String> {
    let n = systems.len();
    let mut samples = Samples {
        ops: vec![Default::default(); n],
        cpu: vec![Default::default(); n],
        busy: vec![[0; 3]; n],
        expected: [None, None],
    };
    let mut guard = IdleGuard::new();
    let reps = bench.reps;
    for rep in 0..reps {
        wait_for_idle(Duration::from_secs(3));
        for step in 0..n {
            // Forward on even repetitions, backward on odd ones.
            let k = if rep % 2 == 0 { step } else { n - 1 - step };
            let system = &systems[k];
            for &case in system.cases() {
                bench.bar.set_message(format!(
                    "{workload}/{} {} rep {}/{reps}",
                    case.label(),
                    system.name(),
                    rep + 1
                ));
                if case != Case::Warm {
                    *resident_after_drop += drop_kernel_cache(bench.db)?;
                    system.drop_cache()?;
                }
                warm_guest_memory(bench.db_bytes as usize + (32 << 20));
                settle();
                let passes = case.passes();
                let mut this = run_args[case.index()].clone();
                this.push(format!("--benchmarks={}", vec![workload; passes].join(",")));
                system.before_run();
                this.extend(system.args().iter().map(|a| (*a).to_owned()));
                let (result, was_busy) =
                    guard.sample(|| run_db_bench(bench.program, &this, system.env()))?;
                let c = case.index();
                samples.busy[k][c] += usize::from(was_busy);
                if result.ops.len() != passes {
                    return Err(format!(
                        "db_bench printed {} results for {passes} passes",
                        result.ops.len()
                    ));
                }
                // Every run of this workload, whichever system, must find the same.
                let first = &mut samples.expected[passes - 1];
                match first {
                    None => *first = Some((system.name(), result.outcome.clone())),
                    Some((who, what)) if *what != result.outcome => {
                        return Err(format!(
                            "db_bench's output differs: {what:?} through {who}, {:?} \
                             through {}",
                            result.outcome,
                            system.name()
                        ));
                    }
                    Some(_) => {}
                }
                system.check()?;
                samples.ops[k][c].push(result.ops[passes - 1]);
                samples.cpu[k][c].push(result.cpu_s[passes - 1]);
                if let Some(value) = system.counters() {
                    counters.insert(
                        format!("{workload}/{}/{}", case.label(), system.name()),
                        value,
                    );
                }
                bench.bar.inc(1);
            }
        }
    }
    Ok(samples)
}

impl Samples {
    /// Records the workload's figures (`{workload}/{case}`): every system's ops/s and cpu_s,
    /// each foliocache system over the kernel as ratios of medians, and every system over the
    /// first (the kernel) per repetition. Returns the plot's groups.
    fn record(
        &self,
        report: &mut Report,
        workload: &str,
        systems: &[Box<dyn System + '_>],
    ) -> Vec<(String, Vec<(String, f64)>)> {
        let mut groups = Vec::new();
        for case in CASES {
            let c = case.index();
            let label = format!("{workload}/{}", case.label());
            let measured: Vec<usize> = (0..systems.len())
                .filter(|&k| systems[k].cases().contains(&case))
                .collect();
            for &k in &measured {
                let name = systems[k].name();
                report.results.push(Figure::new(
                    &label,
                    name,
                    "ops/s",
                    &self.ops[k][c],
                    self.busy[k][c],
                ));
                report.results.push(Figure::new(
                    &label,
                    name,
                    "cpu_s",
                    &self.cpu[k][c],
                    self.busy[k][c],
                ));
            }
            for &k in &measured {
                let name = systems[k].name();
                if [PRIVATE, PRIVATE_PLACED, SHARED].contains(&name) {
                    report.ratio(&label, "ops/s", name, KERNEL);
                    report.ratio(&label, "cpu_s", name, KERNEL);
                }
            }
            // Every system runs in every repetition: the per-repetition ratio too.
            for &k in measured.iter().skip(1) {
                report.paired(
                    &label,
                    (systems[k].name(), &self.ops[k][c]),
                    (systems[0].name(), &self.ops[0][c]),
                    self.busy[0][c].max(self.busy[k][c]),
                );
            }
            // Placement against none, per repetition.
            let find = |name: &str| {
                measured
                    .iter()
                    .copied()
                    .find(|&k| systems[k].name() == name)
            };
            if let (Some(placed), Some(private)) = (find(PRIVATE_PLACED), find(PRIVATE)) {
                report.paired(
                    &label,
                    (PRIVATE_PLACED, &self.ops[placed][c]),
                    (PRIVATE, &self.ops[private][c]),
                    self.busy[placed][c].max(self.busy[private][c]),
                );
            }
            // The library's share of each limit measured in the case, per repetition (warm
            // cases only: cold, mmap faults the file in and is no limit).
            for &k in measured.iter().filter(|_| case != Case::Cold) {
                if ![PRIVATE, PRIVATE_PLACED, SHARED].contains(&systems[k].name()) {
                    continue;
                }
                for &l in &measured {
                    if [MMAP, PREAD_LIMIT].contains(&systems[l].name()) {
                        report.paired(
                            &label,
                            (systems[k].name(), &self.ops[k][c]),
                            (systems[l].name(), &self.ops[l][c]),
                            self.busy[l][c].max(self.busy[k][c]),
                        );
                    }
                }
            }
            let bars = measured
                .iter()
                .filter_map(|&k| {
                    let name = systems[k].name();
                    report
                        .figure(&label, name, "ops/s")
                        .map(|f| (name.to_owned(), f.median / 1e3))
                })
                .collect();
            groups.push((label, bars));
        }
        groups
    }
}

/// db_bench and the preload library, or what is missing.
pub(crate) fn prerequisites() -> Result<(PathBuf, PathBuf), String> {
    Ok((db_bench()?, find_preload(None)?))
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let (program, lib) = prerequisites()?;
    let base = data_dir(args)?;
    let threads = args
        .threads
        .as_ref()
        .and_then(|t| t.first().copied())
        .unwrap_or(2);
    let sizes = if args.full {
        Sizes {
            num: 1_000_000,
            value_bytes: 1024,
            random_reads: 200_000,
            in_process_reads: 800_000,
            block_cache: 8 << 20,
            threads,
        }
    } else {
        Sizes {
            num: 100_000,
            value_bytes: 1024,
            random_reads: 50_000,
            in_process_reads: 400_000,
            block_cache: 8 << 20,
            threads,
        }
    };
    let reps = args.reps.map_or(5, |r| r as usize);
    let database = TempDir(base.join(format!("fcache-dbbench-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&database.0);
    std::fs::create_dir_all(&database.0).map_err(|e| e.to_string())?;
    let db = std::fs::canonicalize(&database.0).map_err(|e| e.to_string())?;
    let common = common_args(&db, &sizes);

    // The limit of a cache behind pread, if this machine can build it.
    let limit_dir = TempDir(
        std::env::temp_dir().join(format!("fcache-dbbench-pread-limit-{}", std::process::id())),
    );
    let pread_limit = PreadLimit::build(&limit_dir.0);
    // Its length is set once the systems are known.
    let bar = ProgressBar::new(1).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("dbbench");
    bar.set_message("fillseq");
    let mut fill = common.clone();
    fill.extend([
        "--benchmarks=fillseq".into(),
        "--threads=1".into(),
        "--disable_wal=1".into(),
    ]);
    run_db_bench(&program, &fill, &[])?;
    bar.inc(1);
    let db_bytes = dir_bytes(&db);
    // The cache holds the whole database (a warm pass is then served from memory).
    let capacity_mb = (db_bytes >> 20) * 3 / 2 + 64;
    let stats_path = db.with_extension("stats.jsonl");
    let _ = std::fs::remove_file(&stats_path);
    let preload = preload_env(
        &lib,
        &db.display().to_string(),
        Some(capacity_mb),
        None,
        Some(&stats_path),
    );
    let with = |extra: &[(&str, &str)]| {
        let mut env = preload.clone();
        env.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        env
    };
    // A shared cache of the suite's own (never the user's default one), kept between runs
    // (no idle ending within the suite) and ended with it.
    let shared_name = format!("fcache-dbbench-{}", std::process::id());
    let _shared_guard = SharedCacheGuard {
        name: shared_name.clone(),
    };
    let mut report = Report::new(
        "dbbench",
        json!({
            "db_bench": program.display().to_string(),
            "keys": sizes.num,
            "value_bytes": sizes.value_bytes,
            "database_bytes": db_bytes,
            "block_cache_bytes": sizes.block_cache,
            "threads": sizes.threads,
            "readrandom_reads_per_thread": sizes.random_reads,
            "readrandom_in_process_reads_per_thread_per_pass": sizes.in_process_reads,
            "readseq_reads_per_thread": sizes.num,
            "reps": reps,
            "foliocache_capacity_mb": capacity_mb,
            "shared_cache": shared_name,
            "preload": lib.display().to_string(),
            "dir": db.display().to_string(),
        }),
    );
    let mut systems: Vec<Box<dyn System + '_>> = vec![
        Box::new(Kernel),
        Box::new(Preload {
            name: PRIVATE,
            env: with(&[("FOLIOCACHE_SHARED", "off")]),
            stats: &stats_path,
            shared: None,
        }),
        Box::new(Preload {
            name: PRIVATE_PLACED,
            env: with(&[("FOLIOCACHE_SHARED", "off"), ("FOLIOCACHE_PLACE", "offset")]),
            stats: &stats_path,
            shared: None,
        }),
        Box::new(Preload {
            name: SHARED,
            env: with(&[
                ("FOLIOCACHE_SHARED", &shared_name),
                ("FOLIOCACHE_IDLE_SECS", "3600"),
            ]),
            stats: &stats_path,
            shared: Some(shared_name.clone()),
        }),
        Box::new(Mmap),
    ];
    let pread_limit_missing = match pread_limit {
        Ok(limit) => {
            systems.push(Box::new(limit));
            None
        }
        Err(why) => Some(why),
    };
    // Runs per repetition and workload, and fillseq.
    let runs_per_rep: usize = systems.iter().map(|s| s.cases().len()).sum();
    bar.set_length((reps * WORKLOADS.len() * runs_per_rep + 1) as u64);
    let bench = Bench {
        program: &program,
        db: &db,
        db_bytes,
        reps,
        bar: &bar,
    };
    let mut resident_after_drop = 0u64;
    let mut counters = serde_json::Map::new();
    let mut plot_groups = Vec::new();
    let mut outcomes = serde_json::Map::new();
    for workload in WORKLOADS {
        // Each case's arguments: readrandom's warm-in-process passes are longer.
        let run_args = CASES.map(|case| {
            let mut args = common.clone();
            args.extend([
                "--use_existing_db=1".to_owned(),
                format!("--threads={}", sizes.threads),
            ]);
            if workload == "readrandom" {
                let reads = if case == Case::InProcess {
                    sizes.in_process_reads
                } else {
                    sizes.random_reads
                };
                args.push(format!("--reads={reads}"));
            }
            args
        });
        let samples = measure_workload(
            &bench,
            workload,
            &run_args,
            &systems,
            &mut resident_after_drop,
            &mut counters,
        )?;
        plot_groups.extend(samples.record(&mut report, workload, &systems));
        if let [Some((_, one)), Some((_, two))] = &samples.expected {
            outcomes.insert(workload.into(), json!([one, two]));
        }
    }
    bar.finish_and_clear();
    counters.insert(
        "kernel_pages_resident_after_drop".into(),
        json!(resident_after_drop),
    );
    counters.insert(
        "db_bench_outcomes".into(),
        serde_json::Value::Object(outcomes),
    );
    report.counters = serde_json::Value::Object(counters);
    report.plots.push(Plot {
        file: "dbbench.svg".into(),
        title: format!(
            "db_bench, {} threads, {} MiB database, {} MiB block cache",
            sizes.threads,
            db_bytes >> 20,
            sizes.block_cache >> 20
        ),
        unit: "kops/s".into(),
        groups: plot_groups,
    });
    // Medians of the per-repetition ratios, as the summary checks them.
    let paired = |case: &str, system: &str| {
        report
            .paired_ratio(case, system, KERNEL)
            .map_or(f64::NAN, |f| f.median)
    };
    let mut goals = Vec::new();
    for goal in GOALS {
        let measured = paired(goal.case, goal.system);
        let (at_least, bound) = goal.at_least(&|case| paired(case, MMAP));
        let met = measured >= at_least;
        goals.push(format!(
            "{} {}/kernel ≥ {at_least:.2}×{}: measured {measured:.2}× ({}){}",
            goal.case,
            goal.system,
            bound.map_or(String::new(), |mmap| format!(
                " (90% of the zero-copy limit, RocksDB's mmap reads at {mmap:.2}× the \
                 kernel's pread, lower than {:.2}×)",
                goal.ratio
            )),
            if met {
                "met"
            } else {
                "out of reach in this run"
            },
            if goal.capped && !met {
                limit_text(&report, goal.case, goal.system)
            } else {
                String::new()
            }
        ));
    }
    report.notes.push(format!(
        "Goals (medians of per-repetition ratios): {}. `warm` is a second db_bench process \
         after a cold one, nothing dropped between them (the kernel's page cache and the \
         shared cache keep what the first read); `warm-in-process` is the second pass of one \
         process started cold (a private cache is warm only so). db_bench is Debian's \
         assertion build. cpu_s is the whole process, but the second pass alone for \
         warm-in-process (from the first pass's result line, 10 ms ticks). Every run's \
         outcome (operations, keys found) was the same through every system.",
        goals.join("; ")
    ));
    if let Some(why) = pread_limit_missing {
        report.notes.push(format!(
            "The limit of a cache behind pread ({PREAD_LIMIT}) was not measured: its preload \
             library could not be built ({why})."
        ));
    }
    if resident_after_drop > 0 {
        report.notes.push(format!(
            "Warning: {resident_after_drop} database pages stayed in the kernel's cache after \
             POSIX_FADV_DONTNEED (mincore); cold figures may be partly warm."
        ));
    }
    let _ = std::fs::remove_file(&stats_path);
    Ok(report)
}

/// What bounds a capped goal, measured in the same run: the limit of a cache behind `pread`
/// against the kernel and against RocksDB's mmap reads, and `system`'s share of it (medians
/// of per-repetition ratios). Empty when the limit was not measured.
fn limit_text(report: &Report, case: &str, system: &str) -> String {
    let median = |a: &str, b: &str| report.paired_ratio(case, a, b).map(|f| f.median);
    let (Some(limit), Some(of_mmap), Some(share)) = (
        median(PREAD_LIMIT, KERNEL),
        median(system, MMAP)
            .zip(median(system, PREAD_LIMIT))
            .map(|(m, l)| m / l),
        median(system, PREAD_LIMIT),
    ) else {
        return String::new();
    };
    format!(
        "; what bounds it: RocksDB served by a copy out of memory, a pread that costs \
         nothing but the copy ({PREAD_LIMIT}), read at {limit:.2}× the kernel, about \
         {:.0}% of its mmap reads; {system} read at {:.0}% of that limit",
        of_mmap * 100.0,
        share * 100.0
    )
}

/// A goal of the suite: `system` over the kernel on `case`, at least `ratio`, or 90% of the
/// zero-copy limit when `capped` and that limit is lower.
struct Goal {
    case: &'static str,
    system: &'static str,
    ratio: f64,
    capped: bool,
}

impl Goal {
    /// The ratio to reach, and the mmap limit when it set it.
    fn at_least(&self, mmap: &dyn Fn(&str) -> f64) -> (f64, Option<f64>) {
        let limit = mmap(self.case);
        if self.capped && limit.is_finite() && 0.9 * limit < self.ratio {
            (0.9 * limit, Some(limit))
        } else {
            (self.ratio, None)
        }
    }
}

/// The goals: across processes for the shared cache (issue 26), within one process for the
/// private cache (issue 28), cold for both.
const GOALS: [Goal; 6] = [
    Goal {
        case: "readseq/cold",
        system: SHARED,
        ratio: 1.0,
        capped: false,
    },
    Goal {
        case: "readseq/warm",
        system: SHARED,
        ratio: 1.0,
        capped: false,
    },
    Goal {
        case: "readrandom/warm",
        system: SHARED,
        ratio: 1.5,
        capped: true,
    },
    Goal {
        case: "readseq/cold",
        system: PRIVATE,
        ratio: 1.0,
        capped: false,
    },
    Goal {
        case: "readseq/warm-in-process",
        system: PRIVATE,
        ratio: 1.0,
        capped: false,
    },
    Goal {
        case: "readrandom/warm-in-process",
        system: PRIVATE,
        ratio: 1.5,
        capped: true,
    },
];

/// The summary's rows (seed 000 with the real program): db_bench through the preload library,
/// on the private and on the shared cache, against the kernel per case, as medians of
/// per-repetition ratios; the zero-copy limit beside each capped goal.
pub(crate) fn summary(report: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    let mmap = |case: &str| {
        report
            .paired_ratio(case, MMAP, KERNEL)
            .map_or(f64::NAN, |f| f.median)
    };
    for workload in WORKLOADS {
        for case in CASES {
            let case = format!("{workload}/{}", case.label());
            let ops = |s: &str| report.figure(&case, s, "ops/s");
            for system in [PRIVATE, SHARED] {
                let Some(p) = report.paired_ratio(&case, system, KERNEL) else {
                    continue;
                };
                let mut row = Row::new("000", format!("db_bench {case}, {system} (k ops/s)"))
                    .after(value(ops(system), 1e-3, ""))
                    .kernel(value(ops(KERNEL), 1e-3, ""))
                    // mmap is the limit of a warm cache only (cold, it faults page by page).
                    .limit(if case.ends_with("cold") {
                        None
                    } else {
                        value(ops(MMAP), 1e-3, "mmap")
                    })
                    .ratio(Spread::of(p, Unit::Times))
                    .busy_from(&[Some(p), ops(system), ops(KERNEL)]);
                if let Some(goal) = GOALS.iter().find(|g| g.case == case && g.system == system) {
                    row = match goal.at_least(&mmap) {
                        (at_least, None) => row.at_least(at_least),
                        (at_least, Some(limit)) => row.goal(
                            format!("≥ {at_least:.2}× (0.9 × mmap {limit:.2}×)"),
                            p.median >= at_least,
                        ),
                    };
                }
                rows.push(row);
            }
            // Placement by offset against the private cache without it, in the same runs.
            if let Some(p) = report.paired_ratio(&case, PRIVATE_PLACED, PRIVATE) {
                rows.push(
                    Row::new("000", format!("db_bench {case}, private: placed vs not"))
                        .before(value(ops(PRIVATE), 1e-3, ""))
                        .after(value(ops(PRIVATE_PLACED), 1e-3, ""))
                        .ratio(Spread::of(p, Unit::Times))
                        .busy_from(&[Some(p), ops(PRIVATE_PLACED), ops(PRIVATE)]),
                );
            }
            // The ceilings of a capped goal's case: what no cache behind pread can pass (mmap),
            // and what a pread costing only its copy reaches.
            if GOALS.iter().any(|g| g.capped && g.case == case) {
                for (limit, what) in [(MMAP, "mmap"), (PREAD_LIMIT, "pread limit")] {
                    if let Some(ratio) = report.paired_ratio(&case, limit, KERNEL) {
                        rows.push(
                            Row::new("000", format!("db_bench {case}: {what} vs kernel"))
                                .kernel(value(ops(KERNEL), 1e-3, ""))
                                .limit(value(ops(limit), 1e-3, what))
                                .ratio(Spread::of(ratio, Unit::Times))
                                .busy_from(&[Some(ratio), ops(limit), ops(KERNEL)]),
                        );
                    }
                }
                for system in [PRIVATE, PRIVATE_PLACED, SHARED] {
                    if let Some(share) = report.paired_ratio(&case, system, PREAD_LIMIT) {
                        rows.push(
                            Row::new(
                                "000",
                                format!("db_bench {case}, {system}: of the pread limit"),
                            )
                            .after(value(ops(system), 1e-3, ""))
                            .limit(value(ops(PREAD_LIMIT), 1e-3, "pread limit"))
                            .ratio(Spread::of(share, Unit::Percent))
                            .busy_from(&[
                                Some(share),
                                ops(system),
                                ops(PREAD_LIMIT),
                            ]),
                        );
                    }
                }
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::{PreadLimit, System, is_result, outcome};
    use std::process::Command;

    /// The pread limit serves a table file's reads from its copy with the bytes the file
    /// has (at the end, across it, past it), passes other files through, and counts what it
    /// served. A limit that answered wrong would inflate the figure it sets.
    #[test]
    fn the_pread_limit_serves_table_files_with_their_bytes() {
        let dir =
            std::env::temp_dir().join(format!("fcache-pread-limit-test-{}", std::process::id()));
        let _clean = super::TempDir(dir.clone());
        let limit = PreadLimit::build(&dir.join("lib")).expect("cc or gcc builds pread_limit.c");
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.join("000001.sst"), &bytes).unwrap();
        std::fs::write(dir.join("OTHER"), &bytes).unwrap();
        let script = r#"
import os, sys, hashlib
out = []
for name in sys.argv[1:]:
    fd = os.open(name, os.O_RDONLY)
    for at, n in [(0, 4096), (5000, 100), (9990, 100), (10000, 10), (20000, 1)]:
        out.append(hashlib.sha256(os.pread(fd, n, at)).hexdigest())
    os.close(fd)
print(" ".join(out))
"#;
        let run = |preload: bool, files: &[&str]| {
            limit.before_run();
            let mut command = Command::new("python3");
            command
                .arg("-c")
                .arg(script)
                .args(files.iter().map(|f| dir.join(f)));
            if preload {
                command.envs(limit.env().iter().map(|(k, v)| (k.as_str(), v.as_str())));
            }
            let out = command.output().expect("python3 runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        };
        let both = ["000001.sst", "OTHER"];
        let kernel = run(false, &both);
        assert_eq!(
            run(true, &both),
            kernel,
            "the same bytes as the kernel's pread"
        );
        // One table file mapped; its five preads served (the other file's passed through).
        assert_eq!(limit.served(), Some((1, 5)));
        assert!(limit.check().is_ok());
        run(true, &["OTHER"]);
        assert_eq!(limit.served(), Some((0, 0)));
        assert!(
            limit.check().is_err(),
            "a limit that served nothing is refused"
        );
    }

    #[test]
    fn an_outcome_keeps_what_was_done_and_drops_the_timings() {
        let line = "readrandom   :       5.005 micros/op 397998 ops/sec 0.251 seconds 100000 \
                    operations;  394.7 MB/s (50000 of 50000 found)";
        assert!(is_result(line));
        assert_eq!(
            outcome(line),
            "readrandom: 100000 operations (50000 of 50000 found)"
        );
        let line = "readseq      :       2.383 micros/op 838778 ops/sec 0.119 seconds 100000 \
                    operations;  831.9 MB/s";
        assert_eq!(outcome(line), "readseq: 100000 operations");
        assert!(!is_result("Read rate: 0 ops/second"));
    }
}
