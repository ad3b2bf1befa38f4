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

use super::report::{Figure, Plot, Report, fmt, interleaved};
use super::{BenchArgs, touched_buffer};
use foliocache::{Cache, File, ReadPolicy};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::fmt::Write as _;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

struct Sizes {
    file: u64,
    time: Duration,
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
            time: Duration::from_millis(60),
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
        }),
    );
    let steps = (BLOCKS.len() * 2 + 2 * KINDS.len() * BLOCKS.len() * 3) * reps;
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
    ceilings(&mut report, &sizes, reps, &bar, buffer)?;
    let mut counters = Vec::new();
    let mut kernels = Vec::new();
    for large in [false, true] {
        let setting = if large { "large-on" } else { "large-off" };
        let tmpfs = Tmpfs::mount(
            if large { "always" } else { "never" },
            2 * sizes.file + (64 << 20),
        );
        let (kernel_name, tmpfs) = match tmpfs {
            Ok(t) => {
                kernels.push(format!("{setting}: kernel side on {}", t.label));
                (if large { "kernel-huge" } else { "kernel" }, Some(t))
            }
            Err(why) => {
                kernels.push(format!("{setting}: no kernel figures: {why}"));
                ("kernel-huge", None)
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
            let mut batched = file.handle();
            let mut per_folio = file.handle();
            per_folio.set_read_policy(ReadPolicy::PerFolio);
            for (bs, bs_name) in BLOCKS {
                let case = format!("{}/{bs_name}/{setting}", kind.name());
                bar.set_message(case.clone());
                let buf = &mut buffer[..bs];
                // Every measurement starts at offset 0, so all systems read the same regions of
                // their files (this VM's memory is not uniformly fast).
                let systems = if kernel.is_some() { 3 } else { 2 };
                let mut walks = [(0u64, 0u64); 2];
                let (samples, busy) = interleaved(reps, systems, &bar, |which| {
                    let mut pos = [0u64; 3];
                    let before = file.mapping_stats().index_walks;
                    let (gibs, reads) = match which {
                        0 => timed_reads(buf, sizes.file, &mut pos[0], sizes.time, |b, p| {
                            batched.read_at(b, p).map_err(|e| e.to_string())
                        })?,
                        1 => timed_reads(buf, sizes.file, &mut pos[1], sizes.time, |b, p| {
                            per_folio.read_at(b, p).map_err(|e| e.to_string())
                        })?,
                        _ => {
                            let kernel = kernel.as_ref().ok_or("no kernel file")?;
                            timed_reads(buf, sizes.file, &mut pos[2], sizes.time, |b, p| {
                                kernel.read_at(b, p).map_err(|e| e.to_string())
                            })?
                        }
                    };
                    if which < 2 {
                        walks[which].0 += file.mapping_stats().index_walks - before;
                        walks[which].1 += reads;
                    }
                    Ok(gibs)
                })?;
                let names = ["foliocache/batched", "foliocache/per-folio", kernel_name];
                for (k, s) in samples.iter().enumerate() {
                    report
                        .results
                        .push(Figure::new(&case, names[k], "GiB/s", s, busy));
                }
                report.ratio(&case, "GiB/s", names[0], names[1]);
                // Each round measures both policies back to back: the per-round ratio cancels
                // the machine's slow drift between rounds (BENCH.md: ratios from one run).
                let paired: Vec<f64> = samples[0]
                    .iter()
                    .zip(&samples[1])
                    .map(|(a, b)| a / b)
                    .collect();
                report.results.push(Figure::new(
                    &case,
                    "foliocache/batched÷per-folio",
                    "paired_ratio",
                    &paired,
                    busy,
                ));
                if systems == 3 {
                    report.ratio(&case, "GiB/s", names[0], names[2]);
                }
                counters.push(json!({
                    "case": case,
                    "index_walks_per_read_batched": walks[0].0 as f64 / walks[0].1.max(1) as f64,
                    "index_walks_per_read_per_folio": walks[1].0 as f64 / walks[1].1.max(1) as f64,
                }));
            }
            drop(kernel);
            if let Some(t) = &tmpfs {
                let _ = std::fs::remove_file(t.dir.join(kind.name()));
            }
        }
    }
    bar.finish_and_clear();
    report.counters = json!({ "per_case": counters, "kernel_side": kernels });
    let tables = seed_tables(&report);
    report.notes.push(tables);
    report.notes.push(bars(&report));
    report.notes.push(kernels.join("  \n"));
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
                        "foliocache/per-folio",
                        "foliocache/batched",
                        "kernel",
                        "kernel-huge",
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
    Ok(report)
}

/// An anonymous mapping advised to use transparent huge pages.
struct HugeBuffer {
    ptr: *mut u8,
    len: usize,
}

impl HugeBuffer {
    fn new(len: usize) -> Result<Self, String> {
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {len} bytes: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: advising our own mapping; failure only means small pages.
        unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) };
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes, readable and writable, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HugeBuffer {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping `new` made.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A buffer faulted in now (first touches are slow on this VM).
fn ceilings(
    report: &mut Report,
    sizes: &Sizes,
    reps: usize,
    bar: &ProgressBar,
    buffer: &mut [u8],
) -> Result<(), String> {
    bar.set_message("ceilings: memcpy and memset");
    // The source is backed by transparent huge pages, like the cache's arena: the ceiling must
    // not be lowered by TLB misses the cache does not suffer.
    let mut source = HugeBuffer::new(sizes.file as usize)?;
    for (i, byte) in source.bytes_mut().iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    let source = source.bytes_mut();
    for (bs, name) in BLOCKS {
        let buf = &mut buffer[..bs];
        let mut pos = 0usize;
        let (samples, busy) = interleaved(reps, 2, bar, |which| {
            let start = Instant::now();
            let mut bytes = 0u64;
            while start.elapsed() < sizes.time {
                for _ in 0..16 {
                    if which == 0 {
                        buf.copy_from_slice(&source[pos..pos + bs]);
                        pos = (pos + bs) % source.len();
                    } else {
                        buf.fill(0);
                    }
                    black_box(&mut *buf);
                    bytes += bs as u64;
                }
            }
            Ok(bytes as f64 / start.elapsed().as_secs_f64() / f64::from(1u32 << 30))
        })?;
        let case = format!("ceiling/{name}");
        report
            .results
            .push(Figure::new(&case, "memcpy", "GiB/s", &samples[0], busy));
        report
            .results
            .push(Figure::new(&case, "memset", "GiB/s", &samples[1], busy));
    }
    Ok(())
}

fn median(report: &Report, case: &str, system: &str) -> Option<f64> {
    report.figure(case, system, "GiB/s").map(|f| f.median)
}

/// The seed's table layout: per large-folio setting, before / after / Δ, plus the kernel.
fn seed_tables(report: &Report) -> String {
    let mut out = String::new();
    for (setting, title) in [
        ("large-off", "Large folios off (tmpfs huge=never)"),
        ("large-on", "Large folios on (tmpfs huge=always)"),
    ] {
        let _ = writeln!(out, "### {title}\n");
        let _ = writeln!(
            out,
            "| file, bs | per-folio (before) | batched (after) | Δ | kernel | batched / kernel |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
        for kind in KINDS {
            for (_, bs) in BLOCKS {
                let case = format!("{}/{bs}/{setting}", kind.name());
                let (Some(after), Some(before)) = (
                    median(report, &case, "foliocache/batched"),
                    median(report, &case, "foliocache/per-folio"),
                ) else {
                    continue;
                };
                let kernel = median(report, &case, "kernel")
                    .or_else(|| median(report, &case, "kernel-huge"));
                let _ = writeln!(
                    out,
                    "| {bs} {} | {} GiB/s | {} GiB/s | {:+.1}% | {} | {} |",
                    kind.name(),
                    fmt(before),
                    fmt(after),
                    (after / before - 1.0) * 100.0,
                    kernel.map_or_else(|| "–".into(), |k| format!("{} GiB/s", fmt(k))),
                    kernel.map_or_else(|| "–".into(), |k| format!("{:.2}×", after / k)),
                );
            }
        }
        out.push('\n');
    }
    let _ = writeln!(out, "| ceiling | 1M | 64k | 4k |\n|---|---:|---:|---:|");
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

/// The bars, checked against this run's medians. "Batched ≥ per-folio" is judged on
/// the median of the per-round paired ratios (each round measures both back to back). A row
/// whose paired median is below 1 by at most 3% while some round had batched ahead is
/// reported as a tie (≈), not a pass: the policies then do the same work within noise.
fn bars(report: &Report) -> String {
    let mut lines = Vec::new();
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    let paired = |case: &str| report.figure(case, "foliocache/batched÷per-folio", "paired_ratio");
    for setting in ["large-off", "large-on"] {
        for kind in KINDS {
            for (_, bs) in BLOCKS {
                let case = format!("{}/{bs}/{setting}", kind.name());
                let (Some(after), Some(before)) = (
                    median(report, &case, "foliocache/batched"),
                    median(report, &case, "foliocache/per-folio"),
                ) else {
                    continue;
                };
                let gain = (after / before - 1.0) * 100.0;
                let (pair, pair_max) =
                    paired(&case).map_or((after / before, after / before), |f| (f.median, f.max));
                let pair_gain = (pair - 1.0) * 100.0;
                if kind != Kind::Normal && bs == "1M" {
                    lines.push(format!(
                        "- {} {case}: batched ≥ per-folio + 20%: {gain:+.1}% (paired {pair_gain:+.1}%)",
                        mark(gain >= 20.0)
                    ));
                } else if (0.97..1.0).contains(&pair) && pair_max >= 1.0 {
                    lines.push(format!(
                        "- ≈ {case}: batched ≥ per-folio: {gain:+.1}% (paired {pair_gain:+.1}%), a tie"
                    ));
                } else {
                    lines.push(format!(
                        "- {} {case}: batched ≥ per-folio: {gain:+.1}% (paired {pair_gain:+.1}%)",
                        mark(pair >= 1.0)
                    ));
                }
                let kernel = median(report, &case, "kernel")
                    .or_else(|| median(report, &case, "kernel-huge"));
                if let Some(k) = kernel {
                    let need = if bs == "4k" { 2.0 } else { 1.0 };
                    lines.push(format!(
                        "- {} {case}: batched ≥ {need}× kernel: {:.2}×",
                        mark(after / k >= need),
                        after / k
                    ));
                }
                if bs == "1M" {
                    let ceiling = if kind == Kind::Normal {
                        "memcpy"
                    } else {
                        "memset"
                    };
                    if let Some(c) = median(report, "ceiling/1M", ceiling) {
                        lines.push(format!(
                            "- {} {case}: batched ≥ 80% of {ceiling}: {:.0}%",
                            mark(after / c >= 0.8),
                            after / c * 100.0
                        ));
                    }
                }
            }
        }
    }
    format!(
        "Bars (issue #3), from this run's medians:\n\n{}",
        lines.join("\n")
    )
}
