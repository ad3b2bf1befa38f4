//! `fcache bench multiproc`: several processes reading the same files, through the kernel's
//! page cache, through one private foliocache per process, and through one shared cache
//! (`docs/SHARED.md`).
//!
//! Every process is a worker: this `fcache` started again as `fcache multiproc-worker`, which
//! attaches or opens, says `ready`, and then runs one pass over the data each time the suite
//! says `go`, answering with the bytes it read and the time it took; `mem` asks for its
//! memory (`/proc/self/status`). Every 4 KiB page read is checked against the file's pattern,
//! so a system that returns wrong bytes fails the suite.
//!
//! Per pattern (sequential records; random 4 KiB reads, each page of the data once per pass in
//! an order of the pass's own) and per system, in every repetition
//! (systems rotated):
//! 1. the system starts empty: the files' pages dropped from the kernel's cache, a fresh
//!    shared cache;
//! 2. process A reads the data: once `cold`, then four times `warm-self` (warm within one
//!    process);
//! 3. process B, started after A exited, reads it four times: `second-process`, which for the
//!    kernel and the shared cache is served from memory A filled (its first touch of each page
//!    of the mapping included), and for a private cache is cold once, then warm;
//! 4. N processes (1, 2, 4, or `--threads`) read it at once: their total throughput, and the
//!    memory they use together: every worker's RSS without shared memory, plus, once, the
//!    shared cache's mapping (reserved whole when it is made) and its owner's own memory, or
//!    the kernel's page cache pages of the files (`mincore`).
//!
//! The ratios are medians of per-repetition ratios: the shared cache's second process against
//! its warm first process (goal ≥ 0.9×), its memory with 4 processes against 1 (≤ 1.1×,
//! private caches about 4×), its warm random 4 KiB reads against a private cache's (the hit
//! cost, ≥ 0.9×), and each system against the kernel. The hit cost has a bound measured in the
//! same run where the shared cache's mapping has small pages: the same copies out of resident
//! memory with huge pages (a private arena) and with a memfd's 4 KiB pages, whose ratio is
//! what the TLB alone costs. The owner asks for huge pages (`MADV_COLLAPSE`); where it got
//! them, as on most machines, the row says so and that bound does not apply.

use super::BenchArgs;
use super::files::data_dir;
use super::measure::wait_for_idle;
use super::memory::Mapping;
use super::report::{Plot, Report};
use super::rng::Rng;
use super::summary::{Row, Spread, Unit, value};
use foliocache::{Cache, CacheCommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const KERNEL: &str = "kernel";
const PRIVATE: &str = "private";
const SHARED: &str = "shared";
const SYSTEMS: [&str; 3] = [KERNEL, PRIVATE, SHARED];
/// The copy ceilings ([`copy_ceilings`]).
const COPY_HUGE: &str = "copy/anon-huge";
const COPY_SHMEM: &str = "copy/memfd";
const PATTERNS: [&str; 2] = ["seq", "rand4k"];
const PAGE: u64 = 4096;
/// Passes behind one warm figure (a warm pass over the quick size takes tens of
/// milliseconds: one alone is mostly noise). A second process's figure includes its first
/// touch of every page of the mapping.
const WARM_PASSES: u32 = 4;
/// The owner program's file name (a binary of the `foliocache` crate).
const OWNER: &str = "foliocache-owner";

/// The word at byte `offset` of file `file`: every 8-byte word says where it is.
fn pattern_word(file: usize, offset: u64) -> u64 {
    (file as u64) << 48 | offset
}

struct Sizes {
    files: usize,
    file_bytes: u64,
    record: u64,
    /// Pages the random pattern reads, each once per pass (from the start of the data).
    random_pages: u64,
}

/// Where the owner program is: next to this fcache (cargo builds both into `target/<profile>/`),
/// built there first (or again, if older than its sources) when this fcache runs from its
/// checkout, or `$FOLIOCACHE_OWNER`.
pub(crate) fn prerequisites() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("FOLIOCACHE_OWNER").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "FOLIOCACHE_OWNER={} does not exist",
                path.display()
            ))
        };
    }
    let wanted = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name(OWNER);
    crate::run::ensure_built(&wanted, &["-p", "foliocache", "--bin", OWNER]);
    if wanted.is_file() {
        Ok(wanted)
    } else {
        Err(format!(
            "{} not found; build it with `cargo build --release -p foliocache --bin {OWNER}`, \
             or set FOLIOCACHE_OWNER",
            wanted.display()
        ))
    }
}

/// What one worker process is told to do (its command line).
#[derive(Debug, clap::Args)]
pub(crate) struct WorkerArgs {
    /// `kernel`, `private` or `shared`.
    #[arg(long)]
    system: String,
    /// `seq` or `rand4k`.
    #[arg(long)]
    pattern: String,
    /// The data files, comma-separated.
    #[arg(long, value_delimiter = ',')]
    files: Vec<PathBuf>,
    /// Bytes per sequential read.
    #[arg(long)]
    record: u64,
    /// The random pattern's pages (from the first file's start on): each pass reads each of
    /// them once, in a random order.
    #[arg(long)]
    random_pages: u64,
    /// The cache's capacity in bytes (private and shared).
    #[arg(long)]
    capacity: u64,
    /// The shared cache's name.
    #[arg(long, default_value = "")]
    name: String,
    /// The owner program.
    #[arg(long)]
    owner: Option<PathBuf>,
    /// The random stream's seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// A source the worker reads from.
enum Source {
    Kernel(Vec<std::fs::File>),
    Cache(Vec<foliocache::Handle>),
}

impl Source {
    fn read_at(&mut self, file: usize, buf: &mut [u8], offset: u64) -> Result<usize, String> {
        match self {
            Source::Kernel(files) => files[file].read_at(buf, offset).map_err(|e| e.to_string()),
            Source::Cache(handles) => handles[file]
                .read_at(buf, offset)
                .map_err(|e| e.to_string()),
        }
    }
}

/// `fcache multiproc-worker`: runs passes when told, on stdin, answering on stdout.
pub(crate) fn worker(args: &WorkerArgs) -> Result<(), String> {
    let file_bytes = args
        .files
        .first()
        .ok_or("no files")?
        .metadata()
        .map_err(|e| e.to_string())?
        .len();
    // Kept alive for the worker's life: the handles read through it.
    let mut cache = None;
    let mut source = match args.system.as_str() {
        KERNEL => Source::Kernel(
            args.files
                .iter()
                .map(|p| std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display())))
                .collect::<Result<_, _>>()?,
        ),
        PRIVATE | SHARED => {
            let mut builder = Cache::builder().capacity(args.capacity);
            if args.system == SHARED {
                builder = builder
                    .shared(args.name.clone())
                    .idle_timeout(Duration::from_secs(60));
                if let Some(owner) = &args.owner {
                    builder = builder.owner_program(owner);
                }
            }
            let built = cache.insert(builder.build().map_err(|e| e.to_string())?);
            let mut handles = Vec::new();
            for path in &args.files {
                let file = built
                    .open(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                handles.push(file.handle());
            }
            Source::Cache(handles)
        }
        other => return Err(format!("unknown system {other}")),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    let mut rng = Rng(args.seed | 1);
    let mut buf = vec![0u8; args.record.max(PAGE) as usize];
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        match line.trim() {
            go if go.starts_with("go") => {
                let times: u64 = go[2..].trim().parse().unwrap_or(1).max(1);
                let start = Instant::now();
                let mut bytes = 0;
                for _ in 0..times {
                    bytes += match args.pattern.as_str() {
                        "seq" => {
                            let mut bytes = 0;
                            for file in 0..args.files.len() {
                                let mut offset = 0;
                                while offset < file_bytes {
                                    let want = args.record.min(file_bytes - offset) as usize;
                                    let n = source.read_at(file, &mut buf[..want], offset)?;
                                    check(&buf[..n], file, offset)?;
                                    if n == 0 {
                                        return Err(format!("short read at {offset}"));
                                    }
                                    offset += n as u64;
                                    bytes += n as u64;
                                }
                            }
                            bytes
                        }
                        _ => {
                            // Every page of the first `random_pages` once, in an order of this
                            // pass's own: a second pass reads the same pages (all warm).
                            let per_file = file_bytes / PAGE;
                            let pages = args.random_pages.min(per_file * args.files.len() as u64);
                            for page in rng.permutation(pages) {
                                let file = (page / per_file) as usize;
                                let offset = page % per_file * PAGE;
                                let n = source.read_at(file, &mut buf[..PAGE as usize], offset)?;
                                if n as u64 != PAGE {
                                    return Err(format!("short read at {offset}"));
                                }
                                check(&buf[..n], file, offset)?;
                            }
                            pages * PAGE
                        }
                    };
                }
                let nanos = start.elapsed().as_nanos();
                writeln!(out, "done {bytes} {nanos}").map_err(|e| e.to_string())?;
            }
            "mem" => {
                let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
                writeln!(
                    out,
                    "mem {} {} {}",
                    status_kb(&status, "RssAnon:"),
                    status_kb(&status, "RssFile:"),
                    status_kb(&status, "RssShmem:")
                )
                .map_err(|e| e.to_string())?;
            }
            other => return Err(format!("unknown request {other:?}")),
        }
        out.flush().map_err(|e| e.to_string())?;
    }
    drop(source);
    drop(cache);
    Ok(())
}

/// Checks the first word of every 4 KiB page of `bytes`, read at `offset` of file `file`.
fn check(bytes: &[u8], file: usize, offset: u64) -> Result<(), String> {
    for (i, page) in bytes.chunks(PAGE as usize).enumerate() {
        if page.len() < 8 {
            continue;
        }
        let at = offset + i as u64 * PAGE;
        let word = u64::from_le_bytes(page[..8].try_into().expect("8 bytes"));
        if word != pattern_word(file, at) {
            return Err(format!(
                "wrong bytes: file {file} offset {at} holds {word:#x}, not {:#x}",
                pattern_word(file, at)
            ));
        }
    }
    Ok(())
}

/// A `/proc/PID/status` field in KiB.
fn status_kb(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A worker process as the suite sees it.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(
        exe: &Path,
        setting: &Setting,
        system: &str,
        pattern: &str,
        seed: u64,
    ) -> Result<Self, String> {
        let files: Vec<String> = setting
            .files
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let mut command = Command::new(exe);
        command
            .arg("multiproc-worker")
            .args(["--system", system, "--pattern", pattern])
            .args(["--files", &files.join(",")])
            .args(["--record", &setting.sizes.record.to_string()])
            .args(["--random-pages", &setting.sizes.random_pages.to_string()])
            .args(["--capacity", &setting.capacity.to_string()])
            .args(["--name", &setting.name])
            .args(["--seed", &seed.to_string()])
            .arg("--owner")
            .arg(&setting.owner)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut worker = Self {
            child,
            stdin,
            stdout,
        };
        let ready = worker.line()?;
        if ready != "ready" {
            return Err(format!("a {system} worker said {ready:?}"));
        }
        Ok(worker)
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if line.is_empty() {
            let status = self.child.wait().map_err(|e| e.to_string())?;
            return Err(format!("a worker ended ({status}); its error is above"));
        }
        Ok(line.trim().to_owned())
    }

    fn send(&mut self, what: &str) -> Result<(), String> {
        writeln!(self.stdin, "{what}").map_err(|e| format!("a worker is gone: {e}"))
    }

    /// Its answer to `go`: bytes and seconds.
    fn done(&mut self) -> Result<(u64, f64), String> {
        let line = self.line()?;
        let mut words = line.split_whitespace().skip(1);
        let bytes = words.next().and_then(|w| w.parse().ok());
        let nanos: Option<u128> = words.next().and_then(|w| w.parse().ok());
        match (bytes, nanos) {
            (Some(b), Some(n)) => Ok((b, n as f64 / 1e9)),
            _ => Err(format!("a worker answered {line:?}")),
        }
    }

    /// Its memory without shared memory, in bytes.
    fn private_memory(&mut self) -> Result<u64, String> {
        self.send("mem")?;
        let line = self.line()?;
        let words: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|w| w.parse().ok())
            .collect();
        match words.as_slice() {
            [anon, file, _shmem] => Ok((anon + file) << 10),
            _ => Err(format!("a worker answered {line:?}")),
        }
    }

    fn finish(mut self) -> Result<(), String> {
        drop(self.stdin);
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("a worker failed: {status}"))
        }
    }
}

/// Runs `times` passes in every worker at once; returns the total MiB/s (bytes over the
/// slowest).
fn pass(workers: &mut [Worker], times: u32) -> Result<f64, String> {
    for w in workers.iter_mut() {
        w.send(&format!("go {times}"))?;
    }
    let mut bytes = 0;
    let mut slowest: f64 = 0.0;
    for w in workers.iter_mut() {
        let (b, secs) = w.done()?;
        bytes += b;
        slowest = slowest.max(secs);
    }
    Ok(bytes as f64 / f64::from(1 << 20) / slowest.max(1e-9))
}

/// What every worker of a run shares.
struct Setting {
    sizes: Sizes,
    files: Vec<PathBuf>,
    capacity: u64,
    name: String,
    owner: PathBuf,
}

impl Setting {
    fn shared_command(&self, command: CacheCommand) -> Result<String, String> {
        foliocache::cache_command(&self.name, command).map_err(|e| e.to_string())
    }

    /// The system starts empty: the kernel's pages of the files dropped (they are clean), the
    /// shared cache ended (the next worker starts a new one). A private cache starts empty in
    /// every new process.
    fn reset(&self, system: &str) -> Result<(), String> {
        match system {
            KERNEL => {
                for path in &self.files {
                    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
                    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            SHARED => {
                // No cache yet is fine; a cache that would not end is not.
                if self.shared_command(CacheCommand::Status).is_ok() {
                    self.shared_command(CacheCommand::Destroy { force: true })?;
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while self.shared_command(CacheCommand::Status).is_ok() {
                        if Instant::now() > deadline {
                            return Err("the shared cache did not end".into());
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The shared cache's bytes in huge pages and its mapping's bytes, from its status.
    fn huge_share(&self) -> Option<(u64, u64)> {
        let status = self.shared_command(CacheCommand::Status).ok()?;
        let v: serde_json::Value = serde_json::from_str(&status).ok()?;
        Some((v["huge_page_bytes"].as_u64()?, v["mapping_bytes"].as_u64()?))
    }

    /// Memory that is not any worker's own: the kernel's page cache pages of the files, or
    /// the shared cache's mapping (reserved whole when made) and its owner's private memory.
    fn system_memory(&self, system: &str) -> Result<u64, String> {
        match system {
            KERNEL => {
                let mut pages = 0;
                for path in &self.files {
                    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
                    let map = Mapping::file(&file, self.sizes.file_bytes as usize)
                        .map_err(|e| e.to_string())?;
                    pages += map.resident_pages().map_err(|e| e.to_string())?;
                }
                Ok(pages * PAGE)
            }
            SHARED => {
                let status = self.shared_command(CacheCommand::Status)?;
                let v: serde_json::Value =
                    serde_json::from_str(&status).map_err(|e| e.to_string())?;
                let mapping = v["mapping_bytes"].as_u64().unwrap_or(0);
                let owner = v["owner_pid"].as_u64().unwrap_or(0);
                let proc =
                    std::fs::read_to_string(format!("/proc/{owner}/status")).unwrap_or_default();
                let own = (status_kb(&proc, "RssAnon:") + status_kb(&proc, "RssFile:")) << 10;
                Ok(mapping + own)
            }
            _ => Ok(0),
        }
    }
}

/// The copy ceilings a cache's hits can reach on this machine: the pattern's copies (the same
/// records, the same order) out of memory already resident, from an anonymous mapping with
/// transparent huge pages (what a private cache's arena is) and from a memfd in 4 KiB pages
/// (a shared cache's mapping where the kernel gave it no huge pages). Their ratio bounds such
/// a shared cache's hits against a private cache's: both copy the same bytes, and the
/// difference is the TLB's reach. MiB/s each.
fn copy_ceilings(bytes: usize, pattern: &str, seed: u64) -> Result<(f64, f64), String> {
    let mut huge = Mapping::anonymous(bytes).map_err(|e| e.to_string())?;
    huge.advise_huge();
    huge.bytes_mut().fill(1);
    let memfd = rustix::fs::memfd_create("fcache-multiproc", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| e.to_string())?;
    let memfd = std::fs::File::from(memfd);
    let chunk = vec![1u8; 1 << 20];
    for _ in 0..bytes.div_ceil(chunk.len()) {
        (&memfd).write_all(&chunk).map_err(|e| e.to_string())?;
    }
    let shared = Mapping::file(&memfd, bytes).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 128 << 10];
    let mut time = |src: &[u8]| {
        let pages = src.len() / PAGE as usize;
        let order = Rng(seed | 1).permutation(pages as u64);
        // One untimed pass maps every page in this process, as a cache's warm pass finds it.
        for pass in 0..2 {
            let start = Instant::now();
            if pattern == "seq" {
                for record in src.chunks(buf.len()) {
                    buf[..record.len()].copy_from_slice(record);
                    std::hint::black_box(&buf);
                }
            } else {
                for &page in &order {
                    let at = page as usize * PAGE as usize;
                    buf[..PAGE as usize].copy_from_slice(&src[at..at + PAGE as usize]);
                    std::hint::black_box(&buf);
                }
            }
            if pass == 1 {
                return src.len() as f64 / f64::from(1 << 20) / start.elapsed().as_secs_f64();
            }
        }
        unreachable!("two passes")
    };
    let huge_mibs = time(huge.bytes());
    let shared_mibs = time(shared.bytes());
    Ok((huge_mibs, shared_mibs))
}

/// One repetition's figures of one system on one pattern.
#[derive(Default, Clone)]
struct Sample {
    cold: f64,
    warm_self: f64,
    second: f64,
    /// Per process count: (MiB/s, bytes of memory).
    many: Vec<(f64, f64)>,
}

fn measure(
    exe: &Path,
    setting: &Setting,
    system: &str,
    pattern: &str,
    counts: &[usize],
    seed: u64,
    bar: &ProgressBar,
) -> Result<Sample, String> {
    setting.reset(system)?;
    let mut sample = Sample::default();
    let mut a = vec![Worker::spawn(exe, setting, system, pattern, seed)?];
    sample.cold = pass(&mut a, 1)?;
    sample.warm_self = pass(&mut a, WARM_PASSES)?;
    a.pop().expect("one worker").finish()?;
    let mut b = vec![Worker::spawn(exe, setting, system, pattern, seed + 1)?];
    sample.second = pass(&mut b, WARM_PASSES)?;
    b.pop().expect("one worker").finish()?;
    bar.inc(1);
    for &n in counts {
        let mut workers = (0..n)
            .map(|i| Worker::spawn(exe, setting, system, pattern, seed + 2 + i as u64))
            .collect::<Result<Vec<_>, _>>()?;
        let mibs = pass(&mut workers, 1)?;
        let mut memory = setting.system_memory(system)?;
        for w in &mut workers {
            memory += w.private_memory()?;
        }
        for w in workers {
            w.finish()?;
        }
        sample.many.push((mibs, memory as f64));
        bar.inc(1);
    }
    Ok(sample)
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let owner = prerequisites()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let sizes = if args.full {
        Sizes {
            files: 4,
            file_bytes: 256 << 20,
            record: args.request_kb.unwrap_or(128) << 10,
            random_pages: (256 << 20) / PAGE,
        }
    } else {
        Sizes {
            files: 4,
            file_bytes: 32 << 20,
            record: args.request_kb.unwrap_or(128) << 10,
            random_pages: (128 << 20) / PAGE,
        }
    };
    let counts: Vec<usize> = args.threads.as_ref().map_or_else(
        || vec![1, 2, 4],
        |t| t.iter().map(|&n| n as usize).collect(),
    );
    let reps = args.reps();
    let dir = data_dir(args)?.join(format!("fcache-multiproc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let cleanup = Cleanup(dir.clone());
    let files = write_files(&dir, &sizes)?;
    let data = sizes.files as u64 * sizes.file_bytes;
    let setting = Setting {
        // Room for all the data in both caches: a private cache of 1.25× the data evicts part
        // of it on the way (its readahead runs ahead of its reclaim); at 1.5× both keep all.
        capacity: data + data / 2 + (16 << 20),
        name: format!("fcache-multiproc-{}", std::process::id()),
        owner,
        files,
        sizes,
    };
    let mut report = Report::new(
        "multiproc",
        json!({
            "files": setting.sizes.files,
            "file_bytes": setting.sizes.file_bytes,
            "record_bytes": setting.sizes.record,
            "random_pages": setting.sizes.random_pages,
            "processes": counts,
            "capacity_bytes": setting.capacity,
            "reps": reps,
            "shmem_huge_pages": shmem_huge_pages(),
            "page_size": PAGE,
        }),
    );
    report.notes.push(format!(
        "the shared cache's mapping is reserved whole when it is made, so its memory is its \
         capacity ({} MiB) from the first process on",
        setting.capacity >> 20
    ));
    let bar = ProgressBar::new((reps * PATTERNS.len() * SYSTEMS.len() * (1 + counts.len())) as u64)
        .with_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                .map_err(|e| e.to_string())?
                .progress_chars("=> "),
        );
    bar.set_prefix("multiproc");
    let mut samples: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); SYSTEMS.len()]; PATTERNS.len()];
    // The idle guard cannot judge these samples (the workers are other processes, which it
    // counts as other work): each sample starts on a quiet machine instead.
    let mut busy = 0;
    let mut ceilings: Vec<Vec<(f64, f64)>> = vec![Vec::new(); PATTERNS.len()];
    for rep in 0..reps {
        for (p, pattern) in PATTERNS.iter().enumerate() {
            let copied = match *pattern {
                "seq" => data,
                _ => setting.sizes.random_pages * PAGE,
            };
            ceilings[p].push(copy_ceilings(copied as usize, pattern, rep as u64 + 7)?);
            for k in 0..SYSTEMS.len() {
                let s = (k + rep) % SYSTEMS.len();
                bar.set_message(format!("{pattern} {}", SYSTEMS[s]));
                busy += usize::from(wait_for_idle(Duration::from_secs(2)));
                let sample = measure(
                    &exe,
                    &setting,
                    SYSTEMS[s],
                    pattern,
                    &counts,
                    rep as u64 * 1000 + 1,
                    &bar,
                )?;
                samples[p][s].push(sample);
            }
        }
    }
    bar.finish_and_clear();
    // The last shared cache of the run (the next reset would have ended it): how much of its
    // mapping the kernel backed with huge pages, which decides what bounds its hits.
    let huge = setting.huge_share();
    let _ = setting.reset(SHARED);
    drop(cleanup);
    report.notes.push(match huge {
        Some((huge, mapping)) => format!(
            "the shared cache's mapping: {} of {} MiB in huge pages (shmem_enabled: {}; the \
             owner asks for them with MADV_COLLAPSE)",
            huge >> 20,
            mapping >> 20,
            shmem_huge_pages()
        ),
        None => "the shared cache's huge pages: unknown (no status at the end)".into(),
    });
    if let Some((huge, mapping)) = huge
        && let Some(sizes) = report.sizes.as_object_mut()
    {
        sizes.insert("shared_huge_page_bytes".into(), json!(huge));
        sizes.insert("shared_mapping_bytes".into(), json!(mapping));
    }
    record(&mut report, &samples, &ceilings, &counts, busy);
    Ok(report)
}

fn record(
    report: &mut Report,
    samples: &[Vec<Vec<Sample>>],
    ceilings: &[Vec<(f64, f64)>],
    counts: &[usize],
    busy: usize,
) {
    use super::report::Figure;
    let busy = usize::from(busy > 0);
    for (p, pattern) in PATTERNS.iter().enumerate() {
        let series = |s: usize, f: &dyn Fn(&Sample) -> f64| -> Vec<f64> {
            samples[p][s].iter().map(f).collect()
        };
        let mut plot_groups = Vec::new();
        for (s, system) in SYSTEMS.iter().enumerate() {
            for (phase, f) in [
                ("cold", (|x: &Sample| x.cold) as fn(&Sample) -> f64),
                ("warm-self", |x: &Sample| x.warm_self),
                ("second-process", |x: &Sample| x.second),
            ] {
                let case = format!("{pattern}/{phase}");
                report
                    .results
                    .push(Figure::new(&case, system, "MiB/s", &series(s, &f), busy));
            }
            for (i, n) in counts.iter().enumerate() {
                let case = format!("{pattern}/{n}-proc");
                let mibs = series(s, &|x: &Sample| x.many[i].0);
                let mem = series(s, &|x: &Sample| x.many[i].1 / f64::from(1 << 20));
                report
                    .results
                    .push(Figure::new(&case, system, "MiB/s", &mibs, busy));
                report
                    .results
                    .push(Figure::new(&case, system, "memory MiB", &mem, busy));
            }
        }
        // The shared cache: a second process against the first one's warm pass.
        report.paired(
            &format!("{pattern}/second-process"),
            ("shared", &series(2, &|x: &Sample| x.second)),
            ("shared/warm-self", &series(2, &|x: &Sample| x.warm_self)),
            busy,
        );
        // The copy ceilings, and the bound their ratio sets on the hit cost below.
        let huge: Vec<f64> = ceilings[p].iter().map(|c| c.0).collect();
        let small: Vec<f64> = ceilings[p].iter().map(|c| c.1).collect();
        let warm = format!("{pattern}/warm-self");
        report
            .results
            .push(Figure::new(&warm, COPY_HUGE, "MiB/s", &huge, busy));
        report
            .results
            .push(Figure::new(&warm, COPY_SHMEM, "MiB/s", &small, busy));
        report.paired(&warm, (COPY_SHMEM, &small), (COPY_HUGE, &huge), busy);
        // The hit cost: warm within one process, shared against private.
        report.paired(
            &format!("{pattern}/warm-self"),
            ("shared", &series(2, &|x: &Sample| x.warm_self)),
            ("private", &series(1, &|x: &Sample| x.warm_self)),
            busy,
        );
        for (s, system) in SYSTEMS.iter().enumerate().skip(1) {
            report.paired(
                &format!("{pattern}/second-process"),
                (system, &series(s, &|x: &Sample| x.second)),
                ("kernel", &series(0, &|x: &Sample| x.second)),
                busy,
            );
        }
        if let (Some(first), Some(last)) = (counts.first(), counts.last())
            && last > first
        {
            let (i0, i1) = (0, counts.len() - 1);
            for (s, system) in SYSTEMS.iter().enumerate() {
                report.paired(
                    &format!("{pattern}/memory {last} vs {first}"),
                    (system, &series(s, &|x: &Sample| x.many[i1].1)),
                    (
                        &format!("{system}/{first}-proc"),
                        &series(s, &|x: &Sample| x.many[i0].1),
                    ),
                    busy,
                );
            }
            for (s, system) in SYSTEMS.iter().enumerate().skip(1) {
                report.paired(
                    &format!("{pattern}/{last}-proc"),
                    (system, &series(s, &|x: &Sample| x.many[i1].0)),
                    ("kernel", &series(0, &|x: &Sample| x.many[i1].0)),
                    busy,
                );
            }
        }
        for (i, n) in counts.iter().enumerate() {
            let group = SYSTEMS
                .iter()
                .enumerate()
                .map(|(s, system)| {
                    let v = series(s, &|x: &Sample| x.many[i].0);
                    ((*system).to_owned(), super::report::median(&v))
                })
                .collect();
            plot_groups.push((format!("{n} proc"), group));
        }
        report.plots.push(Plot {
            file: format!("multiproc-{pattern}.svg"),
            title: format!("{pattern}: N processes reading the same files"),
            unit: "MiB/s".into(),
            groups: plot_groups,
        });
    }
}

pub(crate) fn summary(report: &Report) -> Vec<Row> {
    // Whether the shared cache's mapping was mostly in 4 KiB pages (unknown: as if it were).
    let small_pages = match (
        report.sizes["shared_huge_page_bytes"].as_u64(),
        report.sizes["shared_mapping_bytes"].as_u64(),
    ) {
        (Some(huge), Some(mapping)) => huge < mapping / 2,
        _ => true,
    };
    let mut rows = Vec::new();
    let counts: Vec<u64> = report.sizes["processes"]
        .as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default();
    for pattern in PATTERNS {
        let mib = |case: &str, s: &str| report.figure(case, s, "MiB/s");
        let second = format!("{pattern}/second-process");
        let warm = format!("{pattern}/warm-self");
        if let Some(p) = report.paired_ratio(&second, "shared", "shared/warm-self") {
            rows.push(
                Row::new(
                    "multiproc",
                    format!("{pattern} second process, shared cache (MiB/s)"),
                )
                .before(value(mib(&warm, SHARED), 1.0, ""))
                .after(value(mib(&second, SHARED), 1.0, ""))
                .kernel(value(mib(&second, KERNEL), 1.0, ""))
                .ratio(Spread::of(p, Unit::Times))
                .busy_from(&[Some(p)])
                .at_least(0.9),
            );
        }
        if let Some(p) = report.paired_ratio(&warm, "shared", "private") {
            rows.push(
                Row::new(
                    "multiproc",
                    format!("{pattern} hits, shared vs private (MiB/s)"),
                )
                .before(value(mib(&warm, PRIVATE), 1.0, ""))
                .after(value(mib(&warm, SHARED), 1.0, ""))
                .kernel(value(mib(&warm, KERNEL), 1.0, ""))
                .limit(report.paired_ratio(&warm, COPY_SHMEM, COPY_HUGE).map(|b| {
                    if small_pages {
                        format!("copy bound {:.2}×", b.median)
                    } else {
                        // Both caches in huge pages: the 4 KiB pages' bound does
                        // not apply, it says what they would cost.
                        format!("huge pages (4 KiB: {:.2}×)", b.median)
                    }
                }))
                .ratio(Spread::of(p, Unit::Times))
                .busy_from(&[Some(p)])
                .at_least(0.9),
            );
        }
        if let (Some(first), Some(last)) = (counts.first(), counts.last())
            && last > first
        {
            let case = format!("{pattern}/memory {last} vs {first}");
            let many = format!("{pattern}/{last}-proc");
            let mem = |s: &str| report.figure(&many, s, "memory MiB");
            if let Some(p) = report.paired_ratio(&case, SHARED, &format!("{SHARED}/{first}-proc")) {
                let private = report
                    .paired_ratio(&case, PRIVATE, &format!("{PRIVATE}/{first}-proc"))
                    .map(|f| format!("private {:.2}×", f.median));
                rows.push(
                    Row::new(
                        "multiproc",
                        format!("{pattern} memory, {last} processes vs {first} (MiB)"),
                    )
                    .before(value(mem(PRIVATE), 1.0, ""))
                    .after(value(mem(SHARED), 1.0, ""))
                    .kernel(value(mem(KERNEL), 1.0, ""))
                    .limit(private)
                    .ratio(Spread::of(p, Unit::Times))
                    .busy_from(&[Some(p)])
                    .goal("≤ 1.10×", p.median <= 1.1),
                );
            }
            if let Some(p) = report.paired_ratio(&many, SHARED, KERNEL) {
                rows.push(
                    Row::new(
                        "multiproc",
                        format!("{pattern} {last} processes vs kernel (MiB/s)"),
                    )
                    .before(value(mib(&many, PRIVATE), 1.0, ""))
                    .after(value(mib(&many, SHARED), 1.0, ""))
                    .kernel(value(mib(&many, KERNEL), 1.0, ""))
                    .ratio(Spread::of(p, Unit::Times))
                    .busy_from(&[Some(p)]),
                );
            }
        }
    }
    rows
}

/// Writes the data files, each 8-byte word its own position ([`pattern_word`]).
fn write_files(dir: &Path, sizes: &Sizes) -> Result<Vec<PathBuf>, String> {
    let mut paths = Vec::new();
    let chunk = 1 << 20;
    for file in 0..sizes.files {
        let path = dir.join(format!("data-{file}"));
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?,
        );
        let mut buf = Vec::with_capacity(chunk);
        let mut offset = 0;
        while offset < sizes.file_bytes {
            buf.clear();
            for w in 0..(chunk as u64 / 8) {
                buf.extend_from_slice(&pattern_word(file, offset + w * 8).to_le_bytes());
            }
            out.write_all(&buf).map_err(|e| e.to_string())?;
            offset += chunk as u64;
        }
        let f = out.into_inner().map_err(|e| e.to_string())?;
        f.sync_all().map_err(|e| e.to_string())?;
        paths.push(std::fs::canonicalize(&path).map_err(|e| e.to_string())?);
    }
    Ok(paths)
}

fn shmem_huge_pages() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .ok()
        .and_then(|t| {
            let start = t.find('[')?;
            let end = t[start..].find(']')?;
            Some(t[start + 1..start + end].to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Removes the data directory when the suite ends, however it ends.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
