//! `fcache bench writeseq`: the write path against the kernel's and the device's.
//!
//! Cases (as `docs/BENCHMARKS.md` names them):
//! * `seq-1M`: 1 MiB writes filling a 256 MiB file from empty, then `fsync`;
//! * `rand-4k`: 4 KiB overwrites at random page offsets of an existing file (64 MiB; 16 MiB
//!   written), then `fsync`;
//! * `append-4k`: 4 KiB appends to an empty file (16 MiB), `fdatasync` after every 64.
//!
//! Systems, interleaved in every repetition:
//! * `foliocache`: the cache (2 GiB: its dirty limit, 20%, holds the 256 MiB case, and its
//!   background threshold, 10%, is crossed near the end), the file opened for writing through
//!   it, O_DIRECT writeback through the cache's engine, write-behind on (the default);
//! * `kernel`: buffered `pwrite` and `fsync`/`fdatasync` on the same file system (its page
//!   cache dropped after each repetition, so every repetition writes from clean);
//! * `no-write-behind`: foliocache with write-behind off (the kernel's policy: a stream's
//!   data waits for the sync, the background threshold or the expiry), the "before";
//! * `device`: O_DIRECT writes with no cache at all through io_uring (`raw::probe::write_blocks`:
//!   1 MiB at depth 8, 4 KiB at depth 32, appends at depth 1 with `fdatasync` every 64): the
//!   ceiling.
//!
//! The metric is `MiB/s` of data written, from the first write to the last sync's return. After
//! each foliocache and kernel run the file is read back (without the cache) and compared, so a
//! figure is never for bytes that did not arrive.

use super::BenchArgs;
use super::files::data_dir;
use super::measure::interleaved;
use super::report::{Plot, Report};
use super::rng::Rng;
use super::summary::{Row, Spread, Unit, value};
use foliocache::raw::probe::write_blocks;
use foliocache::{Cache, OpenOptions};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

const CASES: [&str; 3] = ["seq-1M", "rand-4k", "append-4k"];

/// One case's shape.
#[derive(Debug, Clone)]
struct Workload {
    name: &'static str,
    /// Write size.
    block: usize,
    /// Byte offsets of the writes, in order.
    offsets: Vec<u64>,
    /// Sync after this many writes (0: once at the end).
    sync_every: usize,
    /// Use fdatasync (else fsync) for the syncs.
    data_only: bool,
    /// The file's size before the case (an existing file is overwritten; 0: written from
    /// empty).
    existing: u64,
    /// The device's queue depth.
    depth: usize,
}

impl Workload {
    fn bytes(&self) -> u64 {
        self.offsets.len() as u64 * self.block as u64
    }
}

fn workloads() -> Vec<Workload> {
    let seq_bytes: u64 = 256 << 20;
    let existing: u64 = 64 << 20;
    let small: u64 = 16 << 20;
    let mut rng = Rng(0x5EED_0000_0000_0001);
    vec![
        Workload {
            name: "seq-1M",
            block: 1 << 20,
            offsets: (0..seq_bytes >> 20).map(|k| k << 20).collect(),
            sync_every: 0,
            data_only: false,
            existing: 0,
            depth: 8,
        },
        Workload {
            name: "rand-4k",
            block: 4096,
            offsets: (0..small / 4096)
                .map(|_| rng.below(existing / 4096) * 4096)
                .collect(),
            sync_every: 0,
            data_only: false,
            existing,
            depth: 32,
        },
        Workload {
            name: "append-4k",
            block: 4096,
            offsets: (0..small / 4096).map(|k| k * 4096).collect(),
            sync_every: 64,
            data_only: true,
            existing: 0,
            depth: 1,
        },
    ]
}

/// The bytes of write `k` (they differ from write to write, so a misplaced write shows).
fn block_bytes(k: usize, block: usize) -> Vec<u8> {
    (0..block)
        .map(|i| (k as u8).wrapping_mul(29) ^ (i as u8).wrapping_mul(13) ^ 0x3C)
        .collect()
}

/// Lays out the file the case starts from: empty, or `existing` bytes of a pattern.
fn prepare(path: &Path, existing: u64) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if existing > 0 {
        let chunk = vec![0xA5u8; 1 << 20];
        let mut at = 0;
        while at < existing {
            file.write_all_at(&chunk, at).map_err(|e| e.to_string())?;
            at += chunk.len() as u64;
        }
        file.sync_all().map_err(|e| e.to_string())?;
    }
    // Nothing of the file in the kernel's cache: every system starts from clean.
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).map_err(|e| e.to_string())?;
    Ok(())
}

/// What the file must hold after the case: its layout with every write applied.
fn check(path: &Path, load: &Workload, blocks: &[Vec<u8>]) -> Result<(), String> {
    let data = std::fs::read(path).map_err(|e| e.to_string())?;
    let end = load
        .offsets
        .iter()
        .map(|&o| o + load.block as u64)
        .max()
        .unwrap_or(0)
        .max(load.existing);
    if data.len() as u64 != end {
        return Err(format!(
            "{}: the file has {} bytes, the writes make {end}",
            load.name,
            data.len()
        ));
    }
    // The last write to each offset wins.
    let mut last = std::collections::HashMap::new();
    for (k, &offset) in load.offsets.iter().enumerate() {
        last.insert(offset, k);
    }
    for (&offset, &k) in &last {
        let at = offset as usize;
        if data[at..at + load.block] != blocks[k % blocks.len()][..] {
            return Err(format!(
                "{}: write {k} at {offset} is not in the file",
                load.name
            ));
        }
    }
    Ok(())
}

/// A system writeseq measures: what it is called, and one case's writes and syncs.
trait Writer {
    /// The system's name in the figures.
    fn name(&self) -> &'static str;

    /// Writes the case to the file at `path` (laid out afresh for it) and syncs; returns MiB/s.
    fn write(&self, path: &Path, load: &Workload, blocks: &[Vec<u8>]) -> Result<f64, String>;

    /// Whether the file is read back and checked afterwards (not after the device, which
    /// writes bytes of its own).
    fn checked(&self) -> bool {
        true
    }
}

/// foliocache: the file opened for writing through a cache (write-behind on or off).
struct Foliocache<'a> {
    name: &'static str,
    cache: &'a Cache,
}

impl Writer for Foliocache<'_> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn write(&self, path: &Path, load: &Workload, blocks: &[Vec<u8>]) -> Result<f64, String> {
        let start = Instant::now();
        let file = self
            .cache
            .open_with(path, OpenOptions::new().write(true))
            .map_err(|e| e.to_string())?;
        let mut handle = file.handle();
        for (k, &offset) in load.offsets.iter().enumerate() {
            handle
                .write_at(&blocks[k % blocks.len()], offset)
                .map_err(|e| e.to_string())?;
            if load.sync_every > 0 && (k + 1) % load.sync_every == 0 {
                handle.sync_data().map_err(|e| e.to_string())?;
            }
        }
        if load.data_only {
            handle.sync_data()
        } else {
            handle.sync_all()
        }
        .map_err(|e| e.to_string())?;
        let elapsed = start.elapsed();
        // Leave nothing cached for the next repetition.
        drop(handle);
        drop(file);
        Ok(load.bytes() as f64 / (1u64 << 20) as f64 / elapsed.as_secs_f64())
    }
}

/// The kernel: buffered `pwrite` and `fsync`/`fdatasync`, its cache of the file dropped after.
struct Kernel;

impl Writer for Kernel {
    fn name(&self) -> &'static str {
        "kernel"
    }

    fn write(&self, path: &Path, load: &Workload, blocks: &[Vec<u8>]) -> Result<f64, String> {
        let start = Instant::now();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| e.to_string())?;
        for (k, &offset) in load.offsets.iter().enumerate() {
            file.write_all_at(&blocks[k % blocks.len()], offset)
                .map_err(|e| e.to_string())?;
            if load.sync_every > 0 && (k + 1) % load.sync_every == 0 {
                file.sync_data().map_err(|e| e.to_string())?;
            }
        }
        if load.data_only {
            file.sync_data()
        } else {
            file.sync_all()
        }
        .map_err(|e| e.to_string())?;
        let elapsed = start.elapsed();
        rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(|e| e.to_string())?;
        Ok(load.bytes() as f64 / (1u64 << 20) as f64 / elapsed.as_secs_f64())
    }
}

/// The device: O_DIRECT writes through io_uring, no cache at all (the ceiling).
struct Device;

impl Writer for Device {
    fn name(&self) -> &'static str {
        "device"
    }

    fn write(&self, path: &Path, load: &Workload, _blocks: &[Vec<u8>]) -> Result<f64, String> {
        let elapsed = write_blocks(path, &load.offsets, load.block, load.depth, load.sync_every)
            .map_err(|e| e.to_string())?;
        Ok(load.bytes() as f64 / (1u64 << 20) as f64 / elapsed.as_secs_f64())
    }

    fn checked(&self) -> bool {
        false
    }
}

/// The measuring body: one case, `systems` in rotation, each writing the file at `path` laid
/// out afresh, checked after. Records each system's MiB/s and the per-round ratio of the first
/// (foliocache) over each other one.
fn measure_case(
    report: &mut Report,
    load: &Workload,
    systems: &[Box<dyn Writer + '_>],
    path: &Path,
    (reps, bar): (usize, &ProgressBar),
) -> Result<(), String> {
    let blocks: Vec<Vec<u8>> = (0..64).map(|k| block_bytes(k, load.block)).collect();
    let rounds = interleaved(reps, systems.len(), bar, |k| {
        prepare(path, load.existing)?;
        let speed = systems[k].write(path, load, &blocks)?;
        if systems[k].checked() {
            check(path, load, &blocks)?;
        }
        Ok(speed)
    })?;
    let names: Vec<&str> = systems.iter().map(|s| s.name()).collect();
    rounds.record_against_first(report, load.name, &names, "MiB/s");
    Ok(())
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let dir = data_dir(args)?;
    let loads = workloads();
    let reps = args.reps();
    let path: PathBuf = dir.join(format!("fcache-writeseq-{}", std::process::id()));
    struct Remove<'a>(&'a Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _remove = Remove(&path);
    let cache = Cache::builder()
        .capacity(2 << 30)
        .build()
        .map_err(|e| e.to_string())?;
    let before = Cache::builder()
        .capacity(2 << 30)
        .write_behind_bytes(0)
        .build()
        .map_err(|e| e.to_string())?;
    let systems: Vec<Box<dyn Writer + '_>> = vec![
        Box::new(Foliocache {
            name: "foliocache",
            cache: &cache,
        }),
        Box::new(Kernel),
        Box::new(Device),
        Box::new(Foliocache {
            name: "no-write-behind",
            cache: &before,
        }),
    ];
    let mut report = Report::new(
        "writeseq",
        json!({
            "cases": loads.iter().map(|l| json!({
                "case": l.name, "block": l.block, "writes": l.offsets.len(),
                "bytes": l.bytes(), "existing_file": l.existing, "sync_every": l.sync_every,
                "device_depth": l.depth,
            })).collect::<Vec<_>>(),
            "reps": reps, "cache_capacity": 2u64 << 30,
            "dir": dir.display().to_string(),
        }),
    );
    let bar = ProgressBar::new((loads.len() * systems.len() * reps) as u64).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("writeseq");
    let mut groups = Vec::new();
    for load in &loads {
        bar.set_message(load.name);
        measure_case(&mut report, load, &systems, &path, (reps, &bar))?;
        groups.push((
            load.name.to_string(),
            systems
                .iter()
                .filter_map(|s| {
                    report
                        .figure(load.name, s.name(), "MiB/s")
                        .map(|f| (s.name().to_string(), f.median))
                })
                .collect(),
        ));
    }
    bar.finish_and_clear();
    let stats = cache.stats();
    report.counters = json!({
        "foliocache_written_back_pages": stats.dirty.written_pages,
        "dirty_limit_pages": stats.dirty.limit_pages,
        "dirty_background_pages": stats.dirty.background_pages,
    });
    report.plots.push(Plot {
        file: "writeseq.svg".into(),
        title: "Writes then sync: foliocache, the kernel's page cache, the device".into(),
        unit: "MiB/s".into(),
        groups,
    });
    report.notes.push(
        "writeseq: MiB/s from the first write to the last sync's return; the file is read back \
         and checked after every foliocache and kernel run."
            .into(),
    );
    Ok(report)
}

/// The summary's rows: foliocache against the kernel on every case (goal ≥ 1.0×), and
/// seq-1M against the device (goal ≥ 90%).
pub(crate) fn summary(report: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    for case in CASES {
        let mib = |s: &str| report.figure(case, s, "MiB/s");
        if let Some(p) = report.paired_ratio(case, "foliocache", "kernel") {
            rows.push(
                Row::new("writes", format!("{case} vs kernel (MiB/s)"))
                    .after(value(mib("foliocache"), 1.0, ""))
                    .kernel(value(mib("kernel"), 1.0, ""))
                    .limit(value(mib("device"), 1.0, ""))
                    .ratio(Spread::of(p, Unit::Times))
                    .busy_from(&[Some(p), mib("foliocache"), mib("kernel")])
                    .at_least(1.0),
            );
        }
        if case == "seq-1M"
            && let Some(p) = report.paired_ratio(case, "foliocache", "no-write-behind")
        {
            rows.push(
                Row::new("writes", "seq-1M write-behind on vs off")
                    .before(value(mib("no-write-behind"), 1.0, ""))
                    .after(value(mib("foliocache"), 1.0, ""))
                    .kernel(value(mib("kernel"), 1.0, ""))
                    .limit(value(mib("device"), 1.0, ""))
                    .ratio(Spread::of(p, Unit::Times))
                    .busy_from(&[Some(p), mib("foliocache"), mib("no-write-behind")]),
            );
        }
        if case == "seq-1M"
            && let Some(p) = report.paired_ratio(case, "foliocache", "device")
        {
            rows.push(
                Row::new("writes", "seq-1M share of the device")
                    .after(value(mib("foliocache"), 1.0, ""))
                    .limit(value(mib("device"), 1.0, ""))
                    .ratio(Spread::of(p, Unit::Percent))
                    .busy_from(&[Some(p), mib("foliocache"), mib("device")])
                    .at_least(0.9),
            );
        }
    }
    rows
}
