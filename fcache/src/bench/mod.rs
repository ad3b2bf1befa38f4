//! Shared benchmark plumbing, following `shared/docs/BENCH.md`: both sides interleaved in one
//! run, medians with min-max over repetitions, ratios of medians and of rounds, an idle guard
//! around every sample, and results as a Markdown table, a JSON file and an SVG plot per suite;
//! a one-screen summary at the end of every run, and one HTML page of it all.

mod compare;
mod core;
mod dbbench;
mod exec;
mod html;
mod memory;
mod policies;
mod readseq;
mod reclaim;
pub(crate) mod report;
mod seqread;
mod smallread;
pub(crate) mod summary;
mod writeseq;

use report::Report;
use summary::Row;

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
    /// The write path: sequential 1 MiB writes, random 4 KiB overwrites and 4 KiB appends with
    /// fdatasync, through foliocache, the kernel's page cache and straight to the device.
    Writeseq,
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
    /// Maximum readahead window in KiB for the disk suites (default: the disk's own
    /// `read_ahead_kb`, as the kernel uses it; 2048 when sysfs does not tell).
    #[arg(long, value_name = "KIB", value_parser = clap::value_parser!(u64).range(0..=1048576))]
    pub(crate) ra_kb: Option<u64>,
    /// Largest single read in KiB for the disk suites (default 128).
    #[arg(long, value_name = "KIB", value_parser = clap::value_parser!(u64).range(4..=65536))]
    pub(crate) request_kb: Option<u64>,
    /// The ELF executable for the exec suite (default: this fcache binary, and the Rust
    /// toolchain's `librustc_driver` when one is found).
    #[arg(long, value_name = "PATH")]
    pub(crate) elf: Option<PathBuf>,
    /// Print every suite's full tables (they are always written beside the JSON, as `.md`).
    #[arg(long, short)]
    pub(crate) verbose: bool,
    /// Compare two runs instead of running: each a suite's JSON file or a results directory.
    /// Shows each figure's change and whether it is beyond the runs' min-max spread.
    #[arg(long, num_args = 2, value_names = ["OLD", "NEW"])]
    pub(crate) compare: Option<Vec<PathBuf>>,
}

/// A suite: how it runs, and the rows it adds to the summary. A new suite is one line here.
struct SuiteDef {
    suite: Suite,
    name: &'static str,
    run: fn(&BenchArgs) -> Result<Report, String>,
    summary: fn(&Report) -> Vec<Row>,
    /// What the suite needs that a machine may lack (checked before running it with the
    /// others).
    prerequisites: Option<fn() -> Result<(), String>>,
}

const SUITES: &[SuiteDef] = &[
    SuiteDef {
        suite: Suite::Core,
        name: "core",
        run: core::run,
        summary: core::summary,
        prerequisites: None,
    },
    SuiteDef {
        suite: Suite::Seqread,
        name: "seqread",
        run: seqread::run,
        summary: seqread::summary,
        prerequisites: None,
    },
    SuiteDef {
        suite: Suite::Smallread,
        name: "smallread",
        run: smallread::run,
        summary: smallread::summary,
        prerequisites: None,
    },
    SuiteDef {
        suite: Suite::Readseq,
        name: "readseq",
        run: readseq::run,
        summary: readseq::summary,
        prerequisites: None,
    },
    SuiteDef {
        suite: Suite::Exec,
        name: "exec",
        run: exec::run,
        summary: exec::summary,
        prerequisites: None,
    },
    SuiteDef {
        suite: Suite::Reclaim,
        name: "reclaim",
        run: reclaim::run,
        summary: reclaim::summary,
        prerequisites: None,
    },
    SuiteDef {
        suite: Suite::Writeseq,
        name: "writeseq",
        run: writeseq::run,
        summary: writeseq::summary,
        prerequisites: None,
    },
    SuiteDef {
        suite: Suite::Dbbench,
        name: "dbbench",
        run: dbbench::run,
        summary: dbbench::summary,
        prerequisites: Some(|| dbbench::prerequisites().map(|_| ())),
    },
];

/// Rows in seed order (000, 001, ...), then the other suites' by name; a suite's own order is
/// kept.
fn seed_order(rows: &mut [Row]) {
    rows.sort_by_key(|r| (!r.seed.chars().all(|c| c.is_ascii_digit()), r.seed.clone()));
}

impl BenchArgs {
    pub(crate) fn reps(&self) -> usize {
        self.reps
            .map_or(if self.full { 9 } else { 5 }, |r| r as usize)
    }
}

/// Runs the asked suites (or the comparison), then prints the summary and writes
/// `summary.json` and `index.html` into the output directory.
pub(crate) fn run(args: &BenchArgs) -> Result<(), String> {
    if let Some(paths) = &args.compare {
        return compare::run(&paths[0], &paths[1], args.verbose);
    }
    let suites: Vec<&SuiteDef> = SUITES
        .iter()
        .filter(|d| args.suite.is_none_or(|s| s == d.suite))
        .collect();
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let mut reports = Vec::new();
    let mut rows = Vec::new();
    for def in &suites {
        // A suite that needs what a fresh machine may lack (dbbench) says so and the others go
        // on when every suite runs; asked for by name, a missing piece is an error.
        if let Some(prerequisites) = def.prerequisites
            && args.suite.is_none()
            && let Err(missing) = prerequisites()
        {
            println!("{}: skipped: {missing}", def.name);
            continue;
        }
        let mut report = (def.run)(args)?;
        report.finish();
        let json_path = match (&args.json, suites.len()) {
            (Some(path), 1) => path.clone(),
            (Some(path), _) => with_suffix(path, report.suite),
            (None, _) => args.out.join(format!("{}.json", report.suite)),
        };
        report.write(&json_path, &args.out, args.verbose)?;
        rows.extend((def.summary)(&report));
        reports.push(report);
    }
    seed_order(&mut rows);
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let summary_path = args.out.join("summary.json");
    let text = serde_json::to_string_pretty(&serde_json::json!({
        "command": command,
        "machine": reports.first().map(|r| &r.machine),
        "rows": rows,
    }))
    .map_err(|e| e.to_string())?;
    std::fs::write(&summary_path, text)
        .map_err(|e| format!("cannot write {}: {e}", summary_path.display()))?;
    let md_path = args.out.join("summary.md");
    std::fs::write(
        &md_path,
        format!(
            "# fcache bench: summary\n\n`{command}`\n\n{}",
            summary::markdown(&rows)
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", md_path.display()))?;
    let html_path = args.out.join("index.html");
    std::fs::write(&html_path, html::page(&reports, &rows, &command))
        .map_err(|e| format!("cannot write {}: {e}", html_path.display()))?;
    if let Some(first) = reports.first() {
        println!(
            "\nSummary: `{command}`\n{}; mitigations: {}",
            first.machine.line(),
            first.machine.mitigations()
        );
    }
    print!("{}", summary::render(&rows, summary::Style::for_stdout()));
    println!(
        "Full tables: --verbose, or the .md beside each JSON; all in one page: {}",
        html_path.display()
    );
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

fn with_suffix(path: &std::path::Path, suite: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(|| "results".into(), |s| s.to_string_lossy().into_owned());
    let ext = path
        .extension()
        .map_or_else(|| "json".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}-{suite}.{ext}"))
}
