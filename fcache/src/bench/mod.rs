//! Shared benchmark plumbing, following `shared/docs/BENCH.md`: both sides interleaved in one
//! run, medians with min-max over repetitions, ratios of medians, an idle-machine guard, and
//! results as a Markdown table, a JSON file and an SVG plot.

mod core;
mod dbbench;
mod exec;
mod readseq;
mod reclaim;
pub(crate) mod report;
mod seqread;
mod smallread;

use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// The suites that exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Suite {
    /// The core: index metadata per page, try_get+put FrozenBit vs Cas (1..N threads on one
    /// folio), lookup hit, insertion one by one vs one lock hold per run.
    Core,
    /// Seed 004's fio table: sequential reads of normal, fallocated and hole memory files,
    /// 4k / 64k / 1M, large folios off / on; batched vs per-folio vs the kernel's tmpfs, with
    /// memcpy and memset ceilings.
    Seqread,
    /// Seed 002's will-it-scale: N threads reading 64 bytes of one shared page; optimistic,
    /// frozen-bit and cas reads vs the kernel's pread, with a share-nothing ceiling.
    Smallread,
    /// Seed 000's db_bench readseq: T threads each reading its own disk file sequentially in
    /// 8 KiB records from a cold cache; batched vs single insertion vs the kernel's buffered
    /// reads, with the device's O_DIRECT ceiling.
    Readseq,
    /// Seed 001's folio-size table: random faults inside an ELF file's executable segments,
    /// exec_order 0 (plain read-around) vs 4 (64 KiB folios).
    Exec,
    /// Eviction order and workingset detection: a hot set's hit ratio beside a scan of 4× the
    /// budget, and Zipf hit ratios against a simulated LRU and Belady's optimum; RSS against
    /// the budget.
    Reclaim,
    /// Seed 000 with the real program: RocksDB's db_bench readseq and readrandom, cold and
    /// warm, through the kernel and through the preload library (needs rocksdb-tools and
    /// `cargo build --release -p foliocache-preload`).
    Dbbench,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// The suite to run; all suites when omitted.
    pub(crate) suite: Option<Suite>,
    /// Small sizes that finish in well under a minute (the default).
    #[arg(long, conflicts_with = "full")]
    pub(crate) quick: bool,
    /// The seeds' sizes and more repetitions.
    #[arg(long)]
    pub(crate) full: bool,
    /// Write the results as JSON here (one file per suite: `PATH` for one suite, else
    /// `PATH` with the suite name added before the extension).
    #[arg(long, value_name = "PATH")]
    pub(crate) json: Option<PathBuf>,
    /// Thread counts, e.g. `1,2,4` (where a suite uses threads).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) threads: Option<Vec<u32>>,
    /// Repetitions per case (default 5 quick, 9 full).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) reps: Option<u32>,
    /// Directory for the plots (and the JSON when --json is not given).
    #[arg(long, value_name = "DIR", default_value = "results")]
    pub(crate) out: PathBuf,
    /// Directory for the disk suites' data files, on a disk file system (default: the system
    /// temporary directory). The files are deleted at the end.
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
    /// Maximum readahead window in KiB for the disk suites (default 2048).
    #[arg(long, value_name = "KIB", value_parser = clap::value_parser!(u64).range(0..=1048576))]
    pub(crate) ra_kb: Option<u64>,
    /// Largest single read in KiB for the disk suites (default 128).
    #[arg(long, value_name = "KIB", value_parser = clap::value_parser!(u64).range(4..=65536))]
    pub(crate) request_kb: Option<u64>,
    /// The ELF executable for the exec suite (default: this fcache binary).
    #[arg(long, value_name = "PATH")]
    pub(crate) elf: Option<PathBuf>,
}

impl BenchArgs {
    pub(crate) fn reps(&self) -> usize {
        self.reps
            .map_or(if self.full { 9 } else { 5 }, |r| r as usize)
    }
}

/// Runs the asked suites.
pub(crate) fn run(args: &BenchArgs) -> Result<(), String> {
    let suites = match args.suite {
        Some(suite) => vec![suite],
        None => Suite::value_variants().to_vec(),
    };
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    for suite in &suites {
        // Run as part of every suite, dbbench needs what a fresh machine may lack: it says so
        // and the other suites go on. Asked for by name, a missing piece is an error.
        if *suite == Suite::Dbbench
            && args.suite.is_none()
            && let Err(missing) = dbbench::prerequisites()
        {
            println!("## fcache bench dbbench\n\nskipped: {missing}\n");
            continue;
        }
        let report = match suite {
            Suite::Core => core::run(args)?,
            Suite::Seqread => seqread::run(args)?,
            Suite::Smallread => smallread::run(args)?,
            Suite::Readseq => readseq::run(args)?,
            Suite::Exec => exec::run(args)?,
            Suite::Reclaim => reclaim::run(args)?,
            Suite::Dbbench => dbbench::run(args)?,
        };
        let json_path = match (&args.json, suites.len()) {
            (Some(path), 1) => path.clone(),
            (Some(path), _) => with_suffix(path, report.suite),
            (None, _) => args.out.join(format!("{}.json", report.suite)),
        };
        report.write(&json_path, &args.out)?;
    }
    Ok(())
}

/// A small seeded generator (xorshift64), so that every system of a suite sees the same
/// accesses.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is negligible for the sizes used).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `0..n` in a shuffled order (Fisher–Yates).
    pub(crate) fn permutation(&mut self, n: u64) -> Vec<u64> {
        let mut order: Vec<u64> = (0..n).collect();
        for i in (1..order.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        order
    }
}

/// A buffer of `bytes` whose every page was written (faulted in, host-resident).
pub(crate) fn touched_buffer(bytes: usize) -> Vec<u8> {
    let mut buffer = vec![0u8; bytes];
    buffer.fill(1);
    buffer
}

fn with_suffix(path: &std::path::Path, suite: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(|| "results".into(), |s| s.to_string_lossy().into_owned());
    let ext = path
        .extension()
        .map_or_else(|| "json".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}-{suite}.{ext}"))
}
