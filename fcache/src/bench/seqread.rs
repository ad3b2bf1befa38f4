//! `fcache bench seqread`: seed 004's fio table, on this machine.
//!
//! One thread reads a file sequentially in blocks of 4 KiB, 64 KiB or 1 MiB for a fixed time,
//! wrapping at end of file (fio's `--rw=read --time_based`). The file is *normal* (written),
//! *fallocated* (allocated, never written: reads as zeros) or a *hole* (sparse), with large
//! folios off or on. Systems, interleaved in every repetition:
//! * `foliocache/batched` (seed 004) and `foliocache/per-folio` (before it), two handles on the
//!   very same memory file;
//! * `kernel`: `pread` of the same-shaped file on a tmpfs mounted `huge=never`, and
//!   `kernel-huge`: on a tmpfs mounted `huge=always` (large folios on), when one can be mounted;
//! * ceilings: single-thread `memcpy` from a source as large as the file into a block-size
//!   buffer (the source is cold in CPU caches, as the cache's data is), and `memset` of a
//!   block-size buffer (what a hole read can at best do).

use super::BenchArgs;
use super::measure::interleaved;
use super::memory::{Mapping, touched_buffer};
use super::report::{Figure, Plot, Report, fmt};
use super::summary::{Row, Spread, Unit, value};
use foliocache::{Cache, File, Handle, ReadPolicy};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::fmt::Write as _;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The system every other one is compared with, per round: seed 004's batched reads.
const BATCHED: &str = "foliocache/batched";
/// The reads before seed 004, one folio at a time.
const PER_FOLIO: &str = "foliocache/per-folio";
const BLOCKS: [(usize, &str); 3] = [(1 << 20, "1M"), (64 << 10, "64k"), (4 << 10, "4k")];
const KINDS: [Kind; 3] = [Kind::Normal, Kind::Fallocated, Kind::Hole];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Normal,
    Fallocated,
    Hole,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Fallocated => "fallocated",
            Self::Hole => "hole",
        }
    }
}

/// A tmpfs this run mounted, unmounted (and its directory removed) on drop.
struct Tmpfs {
    dir: PathBuf,
    mounted: bool,
    label: String,
}

impl Tmpfs {
    /// Mounts a tmpfs with `huge=<huge>`; falls back to a directory in /dev/shm (whose huge
    /// setting is the system's) when mounting is not allowed, saying so in `label`.
    fn mount(huge: &str, bytes: u64) -> Result<Self, String> {
        let dir =
            std::env::temp_dir().join(format!("fcache-seqread-{}-{huge}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("huge={huge},size={bytes}"),
                "tmpfs",
            ])
            .arg(&dir)
            .stderr(std::process::Stdio::null())
            .status();
        if matches!(status, Ok(s) if s.success()) {
            return Ok(Self {
                dir,
                mounted: true,
                label: format!("tmpfs huge={huge}"),
            });
        }
        let _ = std::fs::remove_dir(&dir);
        if huge == "always" {
            return Err("a huge=always tmpfs could not be mounted (needs root)".into());
        }
        let dir = PathBuf::from("/dev/shm").join(format!("fcache-seqread-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Self {
            dir,
            mounted: false,
            label: "/dev/shm (could not mount a huge=never tmpfs; system default huge setting)"
                .into(),
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount").arg(&self.dir).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reads `size` bytes' worth of file sequentially in `buf`-sized blocks for `time`, wrapping
/// at end of file and continuing from `pos`; returns GiB/s and the number of reads.
fn timed_reads(
    buf: &mut [u8],
    size: u64,
    pos: &mut u64,
    time: Duration,
    mut read: impl FnMut(&mut [u8], u64) -> Result<usize, String>,
) -> Result<(f64, u64), String> {
    // A short untimed start, so what the previous measurement left in caches and TLBs is
    // paid for here and not in the timed part.
    let settle = Instant::now();
    while settle.elapsed() < time / 10 {
        let n = read(buf, *pos)?;
        *pos = if *pos + n as u64 >= size || n == 0 {
            0
        } else {
            *pos + n as u64
        };
    }
    let start = Instant::now();
    let (mut bytes, mut reads) = (0u64, 0u64);
    loop {
        for _ in 0..16 {
            let n = read(buf, *pos)?;
            black_box(&buf);
            bytes += n as u64;
            reads += 1;
            *pos += n as u64;
            if *pos >= size || n == 0 {
                *pos = 0;
            }
        }
        if start.elapsed() >= time {
            break;
        }
    }
    Ok((
        bytes as f64 / start.elapsed().as_secs_f64() / f64::from(1u32 << 30),
        reads,
    ))
}

fn make_memory_file(cache: &Cache, kind: Kind, size: u64, large: bool) -> Result<File, String> {
    let file = cache
        .create_memory_file(if large { 9 } else { 0 })
        .map_err(|e| e.to_string())?;
    match kind {
        Kind::Normal => {
            let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8 + 1).collect();
            for at in (0..size).step_by(chunk.len()) {
                file.write_at(&chunk, at).map_err(|e| e.to_string())?;
            }
        }
        Kind::Fallocated => file.fallocate(0, size).map_err(|e| e.to_string())?,
        Kind::Hole => file.set_len(size).map_err(|e| e.to_string())?,
    }
    Ok(file)
}

fn make_kernel_file(dir: &Path, kind: Kind, size: u64) -> Result<std::fs::File, String> {
    let path = dir.join(kind.name());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    match kind {
        Kind::Normal => {
            let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8 + 1).collect();
            for at in (0..size).step_by(chunk.len()) {
                file.write_all_at(&chunk, at).map_err(|e| e.to_string())?;
            }
        }
        Kind::Fallocated => {
            // SAFETY: fallocate on a file descriptor we own; no memory is passed.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
            if rc != 0 {
                return Err(format!("fallocate: {}", std::io::Error::last_os_error()));
            }
        }
        Kind::Hole => file.set_len(size).map_err(|e| e.to_string())?,
    }
    Ok(file)
}

/// The files' size and the time each measurement reads for.
struct Sizes {
    file: u64,
    time: Duration,
}

/// A system seqread measures: what it is called, and how it reads one block of its file.
trait Reader {
    /// The system's name in the figures.
    fn name(&self) -> &'static str;

    /// Reads `buf.len()` bytes at offset `at` and returns how many it read (a ceiling copies or
    /// fills the buffer instead).
    fn read(&mut self, buf: &mut [u8], at: u64) -> Result<usize, String>;

    /// For a foliocache system: its name in the counters and its file's index walks so far.
    fn index_walks(&self) -> Option<(&'static str, u64)> {
        None
    }

    /// Whether it is the case's ceiling, whose samples are also pooled by block size.
    fn is_ceiling(&self) -> bool {
        false
    }

    /// One measurement: reads in `buf`-sized blocks for `time` from offset 0, wrapping at
    /// `size`; returns GiB/s and the number of reads. Every measurement starts at offset 0, so
    /// all systems read the same regions of their files (this VM's memory is not uniformly
    /// fast).
    fn measure(&mut self, buf: &mut [u8], size: u64, time: Duration) -> Result<(f64, u64), String> {
        let mut pos = 0u64;
        timed_reads(buf, size, &mut pos, time, |b, at| self.read(b, at))
    }
}

/// foliocache: a handle on the memory file, reading batched (seed 004) or per folio (before
/// it).
struct Foliocache<'a> {
    name: &'static str,
    /// Its name in the counters.
    counter: &'static str,
    file: &'a File,
    handle: Handle,
}

impl Reader for Foliocache<'_> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn read(&mut self, buf: &mut [u8], at: u64) -> Result<usize, String> {
        self.handle.read_at(buf, at).map_err(|e| e.to_string())
    }

    fn index_walks(&self) -> Option<(&'static str, u64)> {
        Some((self.counter, self.file.mapping_stats().index_walks))
    }
}

/// The kernel: `pread` of the same-shaped file on a tmpfs.
struct Kernel {
    name: &'static str,
    file: std::fs::File,
}

impl Reader for Kernel {
    fn name(&self) -> &'static str {
        self.name
    }

    fn read(&mut self, buf: &mut [u8], at: u64) -> Result<usize, String> {
        self.file.read_at(buf, at).map_err(|e| e.to_string())
    }
}

/// The ceiling of a normal file: `memcpy` from a file-sized source.
struct Memcpy<'a> {
    source: &'a [u8],
}

impl Reader for Memcpy<'_> {
    fn name(&self) -> &'static str {
        "memcpy"
    }

    fn read(&mut self, buf: &mut [u8], at: u64) -> Result<usize, String> {
        let at = at as usize;
        buf.copy_from_slice(&self.source[at..at + buf.len()]);
        Ok(buf.len())
    }

    fn is_ceiling(&self) -> bool {
        true
    }
}

/// The ceiling of a fallocated or hole file: `memset` of the buffer.
struct Memset;

impl Reader for Memset {
    fn name(&self) -> &'static str {
        "memset"
    }

    fn read(&mut self, buf: &mut [u8], _at: u64) -> Result<usize, String> {
        buf.fill(0);
        Ok(buf.len())
    }

    fn is_ceiling(&self) -> bool {
        true
    }
}

/// The systems of one file, in rotation order: foliocache batched and per-folio (two handles
/// on `file`), the kernel (when a tmpfs could be mounted: its file there), and the ceiling of
/// the file's kind.
fn systems<'a>(
    file: &'a File,
    kernel: Option<std::fs::File>,
    kind: Kind,
    large: bool,
    source: &'a [u8],
) -> Vec<Box<dyn Reader + 'a>> {
    let batched = file.handle();
    let mut per_folio = file.handle();
    per_folio.set_read_policy(ReadPolicy::PerFolio);
    let mut systems: Vec<Box<dyn Reader + 'a>> = vec![
        Box::new(Foliocache {
            name: BATCHED,
            counter: "batched",
            file,
            handle: batched,
        }),
        Box::new(Foliocache {
            name: PER_FOLIO,
            counter: "per_folio",
            file,
            handle: per_folio,
        }),
    ];
    if let Some(file) = kernel {
        let name = if large { "kernel-huge" } else { "kernel" };
        systems.push(Box::new(Kernel { name, file }));
    }
    systems.push(if kind == Kind::Normal {
        Box::new(Memcpy { source })
    } else {
        Box::new(Memset)
    });
    systems
}

/// A ceiling's samples on one case, pooled by block size: (block size index, ceiling, samples,
/// busy samples).
type Pooled = (usize, &'static str, Vec<f64>, usize);

/// The measuring body: every block size of one file (`{file}/{bs}/{setting}`), its `systems`
/// in rotation, each system's GiB/s recorded and the per-round ratio of the first (batched)
/// over each other one. Adds each case's counters, and its ceiling's samples to `pooled`.
fn measure_file(
    report: &mut Report,
    (sizes, reps, bar): (&Sizes, usize, &ProgressBar),
    buffer: &mut [u8],
    systems: &mut [Box<dyn Reader + '_>],
    (file, setting): (&str, &str),
    pooled: &mut Vec<Pooled>,
    counters: &mut Vec<serde_json::Value>,
) -> Result<(), String> {
    for (b, (bs, bs_name)) in BLOCKS.into_iter().enumerate() {
        let case = format!("{file}/{bs_name}/{setting}");
        bar.set_message(case.clone());
        let buf = &mut buffer[..bs];
        // (index walks, reads) of each foliocache system over its measurements.
        let mut walks = vec![(0u64, 0u64); systems.len()];
        let rounds = interleaved(reps, systems.len(), bar, |k| {
            let system = &mut systems[k];
            let before = system.index_walks();
            let (gibs, reads) = system.measure(buf, sizes.file, sizes.time)?;
            if let (Some((_, before)), Some((_, after))) = (before, system.index_walks()) {
                walks[k].0 += after - before;
                walks[k].1 += reads;
            }
            Ok(gibs)
        })?;
        // Each round measures every system back to back: the per-round ratio cancels the
        // machine's slow drift between rounds (`docs/BENCHMARKS.md`: ratios from one run).
        let names: Vec<&str> = systems.iter().map(|s| s.name()).collect();
        rounds.record_against_first(report, &case, &names, "GiB/s");
        let mut per_case = serde_json::Map::new();
        per_case.insert("case".into(), json!(case));
        for (k, system) in systems.iter().enumerate() {
            if system.is_ceiling() {
                pooled.push((
                    b,
                    system.name(),
                    rounds.samples[k].clone(),
                    rounds.busy_count(k),
                ));
            }
            if let Some((counter, _)) = system.index_walks() {
                let (walked, reads) = walks[k];
                per_case.insert(
                    format!("index_walks_per_read_{counter}"),
                    json!(walked as f64 / reads.max(1) as f64),
                );
            }
        }
        counters.push(serde_json::Value::Object(per_case));
    }
    Ok(())
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let sizes = if args.full {
        Sizes {
            file: 1 << 30,
            time: Duration::from_millis(500),
        }
    } else {
        Sizes {
            file: 256 << 20,
            time: Duration::from_millis(40),
        }
    };
    let reps = args.reps();
    let mut report = Report::new(
        "seqread",
        json!({
            "file_bytes": sizes.file,
            "seconds_per_measurement": sizes.time.as_secs_f64(),
            "reps": reps,
            "block_sizes": ["4k", "64k", "1M"],
            "ceilings": "in each case's rotation: memcpy from a file-sized huge-page source (normal), memset (fallocated, hole)",
        }),
    );
    let steps = 2 * KINDS.len() * BLOCKS.len() * 4 * reps;
    let bar = ProgressBar::new(steps as u64).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("seqread");

    // One page-aligned destination buffer for every system and ceiling, as fio uses. (On this
    // machine's CPU, `rep movsb` - glibc's memcpy from 2 KiB to 1 MiB and the kernel's
    // copy_to_user - runs 2-3x slower when destination minus source is 16 mod 32, which is
    // where a plain 1 MiB `Vec` from glibc's allocator lands: every system would be slowed.)
    let mut backing = touched_buffer((1 << 20) + 4096);
    let align = backing.as_ptr().align_offset(4096);
    let buffer = &mut backing[align..align + (1 << 20)];
    // The memcpy ceiling's source is as large as the files and backed by transparent huge
    // pages, like the cache's arena: the ceiling must not be lowered by TLB misses the cache
    // does not suffer, nor raised by a source that fits in the CPU caches.
    bar.set_message("ceilings: preparing the memcpy source");
    let len = sizes.file as usize;
    let mut source = Mapping::anonymous(len).map_err(|e| format!("mmap of {len} bytes: {e}"))?;
    source.advise_huge();
    for (i, byte) in source.bytes_mut().iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    let source: &[u8] = source.bytes_mut();
    let mut counters = Vec::new();
    let mut kernels = Vec::new();
    let mut ceiling_samples: Vec<Pooled> = Vec::new();
    for large in [false, true] {
        let setting = if large { "large-on" } else { "large-off" };
        let tmpfs = Tmpfs::mount(
            if large { "always" } else { "never" },
            2 * sizes.file + (64 << 20),
        );
        let tmpfs = match tmpfs {
            Ok(t) => {
                kernels.push(format!("{setting}: kernel side on {}", t.label));
                Some(t)
            }
            Err(why) => {
                kernels.push(format!("{setting}: no kernel figures: {why}"));
                None
            }
        };
        let cache = Cache::builder()
            .capacity(2 * sizes.file + (16 << 20))
            .huge_pages(true)
            .prefault(true)
            .build()
            .map_err(|e| e.to_string())?;
        for kind in KINDS {
            bar.set_message(format!("{setting}: preparing {} files", kind.name()));
            let file = make_memory_file(&cache, kind, sizes.file, large)?;
            let kernel = match &tmpfs {
                Some(t) => Some(make_kernel_file(&t.dir, kind, sizes.file)?),
                None => None,
            };
            // Warm-up: one whole pass over each side's file (first touches are slow here).
            let mut warm = vec![0u8; 1 << 20];
            for at in (0..sizes.file).step_by(warm.len()) {
                file.read_at(&mut warm, at).map_err(|e| e.to_string())?;
                if let Some(k) = &kernel {
                    k.read_at(&mut warm, at).map_err(|e| e.to_string())?;
                }
            }
            let mut systems = systems(&file, kernel, kind, large, source);
            measure_file(
                &mut report,
                (&sizes, reps, &bar),
                buffer,
                &mut systems,
                (kind.name(), setting),
                &mut ceiling_samples,
                &mut counters,
            )?;
            // The kernel's file is closed before it is removed.
            drop(systems);
            if let Some(t) = &tmpfs {
                let _ = std::fs::remove_file(t.dir.join(kind.name()));
            }
        }
    }
    bar.finish_and_clear();
    // The ceilings over every case's rounds, by block size (`docs/BENCHMARKS.md`'s
    // `ceiling/{bs}`).
    for (b, (_, bs_name)) in BLOCKS.iter().enumerate() {
        for ceiling in ["memcpy", "memset"] {
            let (samples, busy) = ceiling_samples
                .iter()
                .filter(|(k, name, _, _)| *k == b && *name == ceiling)
                .fold((Vec::new(), 0), |(mut v, n), (_, _, s, busy)| {
                    v.extend_from_slice(s);
                    (v, n + busy)
                });
            if !samples.is_empty() {
                report.results.push(Figure::new(
                    &format!("ceiling/{bs_name}"),
                    ceiling,
                    "GiB/s",
                    &samples,
                    busy,
                ));
            }
        }
    }
    report.counters = json!({ "per_case": counters, "kernel_side": kernels });
    let tables = seed_tables(&report);
    report.notes.push(tables);
    report.notes.push(bars(&report));
    report.notes.push(kernels.join("  \n"));
    plots(&mut report);
    Ok(report)
}

/// The plots: one per large-folio setting, every file kind and block size, every system.
fn plots(report: &mut Report) {
    for (setting, title) in [
        ("large-off", "large folios off"),
        ("large-on", "large folios on"),
    ] {
        report.plots.push(Plot {
            file: format!("seqread-{setting}.svg"),
            title: format!("Sequential reads, {title}: foliocache vs kernel tmpfs"),
            unit: "GiB/s".into(),
            groups: KINDS
                .iter()
                .flat_map(|kind| BLOCKS.iter().map(move |(_, bs)| (*kind, *bs)))
                .map(|(kind, bs)| {
                    let case = format!("{}/{bs}/{setting}", kind.name());
                    let bars = [
                        PER_FOLIO,
                        BATCHED,
                        "kernel",
                        "kernel-huge",
                        "memcpy",
                        "memset",
                    ]
                    .iter()
                    .filter_map(|s| {
                        report
                            .figure(&case, s, "GiB/s")
                            .map(|f| ((*s).to_string(), f.median))
                    })
                    .collect();
                    (format!("{} {bs}", kind.name()), bars)
                })
                .collect(),
        });
    }
}

fn median(report: &Report, case: &str, system: &str) -> Option<f64> {
    report.figure(case, system, "GiB/s").map(|f| f.median)
}

/// The kernel system of a case: `kernel` (huge=never) or `kernel-huge` (huge=always).
fn kernel_of(report: &Report, case: &str) -> Option<&'static str> {
    ["kernel", "kernel-huge"]
        .into_iter()
        .find(|k| report.figure(case, k, "GiB/s").is_some())
}

fn ceiling_of(kind: Kind) -> &'static str {
    if kind == Kind::Normal {
        "memcpy"
    } else {
        "memset"
    }
}

fn pct_spread(f: &Figure) -> String {
    format!(
        "{:+.1}% ({:+.1}…{:+.1})",
        (f.median - 1.0) * 100.0,
        (f.min - 1.0) * 100.0,
        (f.max - 1.0) * 100.0
    )
}

/// The seed's table layout: per large-folio setting, before / after / Δ, plus the kernel and
/// the share of the case's own ceiling (measured in the same rounds). Δ and the shares are
/// medians of per-round ratios, with their min…max.
fn seed_tables(report: &Report) -> String {
    let mut out = String::new();
    for (setting, title) in [
        ("large-off", "Large folios off (tmpfs huge=never)"),
        ("large-on", "Large folios on (tmpfs huge=always)"),
    ] {
        let _ = writeln!(out, "### {title}\n");
        let _ = writeln!(
            out,
            "| file, bs | per-folio (before) | batched (after) | Δ per round (min…max) | kernel | batched / kernel | ceiling | % of ceiling (min–max) |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for kind in KINDS {
            for (_, bs) in BLOCKS {
                let case = format!("{}/{bs}/{setting}", kind.name());
                let (Some(after), Some(before)) = (
                    median(report, &case, BATCHED),
                    median(report, &case, PER_FOLIO),
                ) else {
                    continue;
                };
                let delta = report
                    .paired_ratio(&case, BATCHED, PER_FOLIO)
                    .map_or_else(|| "–".into(), pct_spread);
                let kernel = kernel_of(report, &case);
                let ceiling = ceiling_of(kind);
                let share = report.paired_ratio(&case, BATCHED, ceiling).map_or_else(
                    || "–".into(),
                    |f| {
                        format!(
                            "{:.0}% ({:.0}–{:.0})",
                            f.median * 100.0,
                            f.min * 100.0,
                            f.max * 100.0
                        )
                    },
                );
                let _ = writeln!(
                    out,
                    "| {bs} {} | {} GiB/s | {} GiB/s | {delta} | {} | {} | {ceiling} {} | {share} |",
                    kind.name(),
                    fmt(before),
                    fmt(after),
                    kernel
                        .and_then(|k| median(report, &case, k))
                        .map_or_else(|| "–".into(), |k| format!("{} GiB/s", fmt(k))),
                    kernel
                        .and_then(|k| report.paired_ratio(&case, BATCHED, k))
                        .map_or_else(|| "–".into(), |f| format!("{:.2}×", f.median)),
                    median(report, &case, ceiling).map_or_else(|| "–".into(), fmt),
                );
            }
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "| ceiling, over every case's rounds | 1M | 64k | 4k |\n|---|---:|---:|---:|"
    );
    for system in ["memcpy", "memset"] {
        let cells: Vec<String> = BLOCKS
            .iter()
            .map(|(_, bs)| {
                median(report, &format!("ceiling/{bs}"), system)
                    .map_or_else(|| "–".into(), |v| format!("{} GiB/s", fmt(v)))
            })
            .collect();
        let _ = writeln!(out, "| {system} | {} |", cells.join(" | "));
    }
    out
}

/// The bars, each judged on the median of per-round paired ratios (every round measures
/// all systems back to back) and shown with its spread. A median below the bar is a miss,
/// however close: the spread beside it says how close.
fn bars(report: &Report) -> String {
    let mut lines = Vec::new();
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    for setting in ["large-off", "large-on"] {
        for kind in KINDS {
            for (_, bs) in BLOCKS {
                let case = format!("{}/{bs}/{setting}", kind.name());
                let Some(pair) = report.paired_ratio(&case, BATCHED, PER_FOLIO) else {
                    continue;
                };
                let need = if kind != Kind::Normal && bs == "1M" {
                    1.2
                } else {
                    1.0
                };
                lines.push(format!(
                    "- {} {case}: batched ≥ per-folio{}: {}",
                    mark(pair.median >= need),
                    if need > 1.0 { " + 20%" } else { "" },
                    pct_spread(pair)
                ));
                if let Some(k) =
                    kernel_of(report, &case).and_then(|k| report.paired_ratio(&case, BATCHED, k))
                {
                    let need = if bs == "4k" { 2.0 } else { 1.0 };
                    lines.push(format!(
                        "- {} {case}: batched ≥ {need}× kernel: {:.2}× ({:.2}–{:.2})",
                        mark(k.median >= need),
                        k.median,
                        k.min,
                        k.max
                    ));
                }
                if bs == "1M" {
                    let ceiling = ceiling_of(kind);
                    let need = if kind == Kind::Fallocated { 0.9 } else { 0.8 };
                    if let Some(c) = report.paired_ratio(&case, BATCHED, ceiling) {
                        lines.push(format!(
                            "- {} {case}: batched ≥ {:.0}% of {ceiling}: {:.0}% ({:.0}–{:.0}%)",
                            mark(c.median >= need),
                            need * 100.0,
                            c.median * 100.0,
                            c.min * 100.0,
                            c.max * 100.0
                        ));
                    }
                }
            }
        }
    }
    format!(
        "Bars (issues #3 and #17), medians of per-round ratios (min–max):\n\n{}",
        lines.join("\n")
    )
}

/// The summary's rows (seed 004): the 1M rows with large folios off (batched vs per-folio with
/// the kernel's and the ceiling's figures beside, and the share of the ceiling), and every
/// row's bars counted (batched vs per-folio, and vs the kernel).
pub(crate) fn summary(report: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    let gib = |case: &str, s: &str| value(report.figure(case, s, "GiB/s"), 1.0, "GiB/s");
    for kind in KINDS {
        let case = format!("{}/1M/large-off", kind.name());
        let ceiling = ceiling_of(kind);
        let kernel = kernel_of(report, &case);
        let figs = [
            report.figure(&case, BATCHED, "GiB/s"),
            report.figure(&case, PER_FOLIO, "GiB/s"),
        ];
        if let Some(p) = report.paired_ratio(&case, BATCHED, PER_FOLIO) {
            let need = if kind == Kind::Normal { 1.0 } else { 1.2 };
            rows.push(
                Row::new("004", format!("{} 1M: batched vs per-folio", kind.name()))
                    .before(gib(&case, PER_FOLIO))
                    .after(gib(&case, BATCHED))
                    .kernel(kernel.and_then(|k| gib(&case, k)))
                    .limit(gib(&case, ceiling))
                    .ratio(Spread::of(p, Unit::Times))
                    .at_least(need)
                    .busy_from(&[figs[0], figs[1], Some(p)]),
            );
        }
        if let Some(c) = report.paired_ratio(&case, BATCHED, ceiling) {
            let need = if kind == Kind::Fallocated { 0.9 } else { 0.8 };
            rows.push(
                Row::new("004", format!("{} 1M: share of {ceiling}", kind.name()))
                    .ratio(Spread::of(c, Unit::Percent))
                    .at_least(need)
                    .busy_from(&[Some(c)]),
            );
        }
    }
    // Every row of both tables: the bars counted.
    let (mut met, mut all, mut kmet, mut kall) = (0, 0, 0, 0);
    let mut busy = false;
    for setting in ["large-off", "large-on"] {
        for kind in KINDS {
            for (_, bs) in BLOCKS {
                let case = format!("{}/{bs}/{setting}", kind.name());
                if let Some(p) = report.paired_ratio(&case, BATCHED, PER_FOLIO) {
                    let need = if kind != Kind::Normal && bs == "1M" {
                        1.2
                    } else {
                        1.0
                    };
                    all += 1;
                    met += usize::from(p.median >= need);
                    busy |= p.busy;
                }
                if let Some(k) =
                    kernel_of(report, &case).and_then(|k| report.paired_ratio(&case, BATCHED, k))
                {
                    let need = if bs == "4k" { 2.0 } else { 1.0 };
                    kall += 1;
                    kmet += usize::from(k.median >= need);
                    busy |= k.busy;
                }
            }
        }
    }
    if all > 0 {
        let mut row = Row::new("004", format!("all {all} rows: batched ≥ per-folio (+20%)"))
            .goal(format!("{met}/{all} rows"), met == all);
        row.busy = busy;
        rows.push(row);
    }
    if kall > 0 {
        let mut row = Row::new("004", format!("all {kall} rows: ≥ 1× kernel (4k: 2×)"))
            .goal(format!("{kmet}/{kall} rows"), kmet == kall);
        row.busy = busy;
        rows.push(row);
    }
    rows
}
