//! `fcache bench readseq`: seed 000's db_bench readseq, scaled to this machine.
//!
//! T threads (default 2), each reading its own file on disk sequentially in 8 KiB records,
//! from a cold cache every repetition. Systems, interleaved in every repetition:
//! * `foliocache/batched` and `foliocache/single`: the cache with batched insertion (seeds
//!   000/003) and with the loop before them, in 4 KiB folios (the path seed 000 batches),
//!   O_DIRECT through the cache's I/O engine, cache emptied (`drop_cached`) before each
//!   repetition;
//! * `foliocache/large-folios`: batched insertion with the folio-order ramp up to 2 MiB folios
//!   (the cache's default), which is what the kernel does on ext4 since 6.16: the like-for-like
//!   comparison with `kernel` there;
//! * `kernel`: buffered `pread` of the same files, their page cache dropped
//!   (`POSIX_FADV_DONTNEED`) before each repetition, and memory the size of the data set
//!   touched and freed right before, so that the kernel is measured and not the hypervisor
//!   handing back idle memory (`docs/BENCHMARKS.md`);
//! * `device`: the ceiling, O_DIRECT sequential reads of the same files through io_uring, no
//!   cache, at the best request size and queue depth of a sweep run first (128 KiB to 4 MiB,
//!   depth 8 and 32: the kernel issues requests up to its window); the files are read at once,
//!   one ring each (the depth split between them), as the readers stream them, into huge-page
//!   memory that keeps every byte (as a cache must);
//! * `device+copy`: the bound for a cache that copies: each reader streams its own file at the
//!   device's best shape, submitting and reaping the requests on its own thread, and copies
//!   every record out of memory that keeps every byte (`DirectStream`: no lookup, no lock, no
//!   other thread). What the device allows a reader, against which the cache's own cost shows;
//! * `device+copy/kernel-windows`: the same readers, reading ahead as the kernel's readahead does
//!   on a sequential stream: windows of the readahead size in requests of the cache's request
//!   size, the next window issued when the reader reaches the start of the one before it (two
//!   in flight at most, none issued while the reader copies out of the older one). What the
//!   device allows any cache that reads ahead like the kernel: the readahead's own bound;
//! * `device/reused`: the same as `device` into 128 KiB buffers reused as reads complete (they stay in the
//!   CPU caches, which this VM's disk, a host copy into guest memory, rewards);
//! * `device/reused-4k-pages`: reused buffers of 4 KiB pages, one segment per page (what fio's
//!   `malloc`ed buffers get, and what the baselines in `docs/BENCHMARKS.md` measured).
//!
//! The files hold their own byte offsets, so every record a system returns is checked. Every
//! pass starts from a cold cache, and this is checked, not assumed: foliocache's files hold no
//! page and the kernel's `mincore` and `cachestat` show none, or the run fails. Every pass
//! also records the process's CPU time per GiB read: when all systems reach the device, CPU is
//! what differs. And what the device saw of each pass, from its counters in sysfs (`stat` of
//! the disk holding the files): the share of the pass with a read in flight, the mean request
//! after the block layer merged them, and the mean number in flight. Those say whether a
//! system left the device idle or gave it too little to do at once. A second case runs the cache with a quarter of the data set as capacity
//! (eviction on).

use super::BenchArgs;
use super::files::data_dir;
use super::measure::{interleaved, process_cpu, settle, thread_cpu};
use super::memory::warm_guest_memory;
use super::report::{Figure, Plot, Report};
use super::summary::{Row, Spread, Unit, value};
use foliocache::raw::probe::{Buffers, DirectStream, Probe};
use foliocache::{Cache, InsertPolicy};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

const RECORD: usize = 8192;
/// The systems' names in the figures.
const BATCHED: &str = "foliocache/batched";
const SINGLE: &str = "foliocache/single";
const LARGE: &str = "foliocache/large-folios";
const KERNEL: &str = "kernel";
const DEVICE: &str = "device";
const COPIED: &str = "device+copy";
const WINDOWED: &str = "device+copy/kernel-windows";
const REUSED: &str = "device/reused";
const REUSED_4K: &str = "device/reused-4k-pages";
/// Every system, in rotation order (and the plots' bar order).
const SYSTEMS: [&str; 9] = [
    BATCHED, SINGLE, LARGE, KERNEL, DEVICE, COPIED, WINDOWED, REUSED, REUSED_4K,
];
/// The foliocache systems: (name, insertion policy, largest folio order, name in the counters).
const FOLIOCACHE: [(&str, InsertPolicy, Option<u8>, &str); 3] = [
    (BATCHED, InsertPolicy::Batched, Some(0), "batched"),
    (SINGLE, InsertPolicy::Single, Some(0), "single"),
    (LARGE, InsertPolicy::Batched, None, "large-folios"),
];

struct Sizes {
    file: u64,
    ra_bytes: u64,
    request_bytes: usize,
}

/// The sysfs directory of the block device holding `dir` (`/sys/dev/block/MAJOR:MINOR`).
fn block_dev_dir(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    Some(PathBuf::from(format!("/sys/dev/block/{major}:{minor}")))
}

/// The kernel's maximum readahead window for the disk holding `dir`, in KiB (its
/// `read_ahead_kb`), when sysfs tells.
fn kernel_read_ahead_kb(dir: &Path) -> Option<u64> {
    let base = block_dev_dir(dir)?.display().to_string();
    // A partition's queue settings are its disk's.
    [
        format!("{base}/queue/read_ahead_kb"),
        format!("{base}/../queue/read_ahead_kb"),
    ]
    .iter()
    .find_map(|path| std::fs::read_to_string(path).ok()?.trim().parse().ok())
}

/// The block device's read counters (`/sys/dev/block/M:m/stat`, the kernel's
/// `Documentation/block/stat.rst`): what the device saw of a pass, whichever system issued it.
#[derive(Debug, Clone, Copy)]
struct DiskCounters {
    /// Read requests completed, sectors read, and milliseconds reads spent in flight (summed
    /// over requests: divided by the wall time, the mean number of reads in flight).
    reads: u64,
    sectors: u64,
    read_ms: u64,
    /// Milliseconds with at least one request in flight.
    busy_ms: u64,
}

impl DiskCounters {
    /// The counters now; `None` when the file is missing or not in the documented format.
    fn read(stat: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(stat).ok()?;
        let fields: Vec<u64> = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        // reads, merges, sectors, read ticks, writes, merges, sectors, write ticks, in flight,
        // io ticks, ...
        (fields.len() >= 11).then(|| Self {
            reads: fields[0],
            sectors: fields[2],
            read_ms: fields[3],
            busy_ms: fields[9],
        })
    }

    /// What the device did between `self` and `later`, over a pass that read for `secs`
    /// seconds. `None` when nothing was read (or the counters went back: a device reset).
    fn during(self, later: Self, secs: f64) -> Option<DiskPass> {
        let reads = later.reads.checked_sub(self.reads)?;
        let sectors = later.sectors.checked_sub(self.sectors)?;
        let read_ms = later.read_ms.checked_sub(self.read_ms)?;
        let busy_ms = later.busy_ms.checked_sub(self.busy_ms)?;
        if reads == 0 || secs <= 0.0 {
            return None;
        }
        let ms = secs * 1e3;
        Some(DiskPass {
            // The counters tick in whole milliseconds: a pass a little shorter than its
            // busy time reads as 100%.
            busy: (busy_ms as f64 / ms).min(1.0),
            request_kib: sectors as f64 * 512.0 / 1024.0 / reads as f64,
            in_flight: read_ms as f64 / ms,
        })
    }
}

/// What the device saw of one pass.
#[derive(Debug, Clone, Copy, PartialEq)]
struct DiskPass {
    /// The share of the pass's time with a request in flight.
    busy: f64,
    /// The mean read request, in KiB (after the block layer merged and split them).
    request_kib: f64,
    /// The mean number of reads in flight.
    in_flight: f64,
}

/// The data files (deleted on drop).
struct DataFiles {
    paths: Vec<PathBuf>,
}

impl DataFiles {
    fn create(dir: &Path, count: usize, size: u64, bar: &ProgressBar) -> Result<Self, String> {
        let mut files = Self { paths: Vec::new() };
        for k in 0..count {
            let path = dir.join(format!("fcache-readseq-{}-{k}.dat", std::process::id()));
            bar.set_message(format!("writing {}", path.display()));
            let mut file = std::fs::File::create(&path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            files.paths.push(path.clone());
            let mut chunk = vec![0u8; 1 << 20];
            for at in (0..size).step_by(chunk.len()) {
                fill_offsets(&mut chunk, at);
                file.write_all(&chunk)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
            file.sync_all()
                .map_err(|e| format!("cannot sync {}: {e}", path.display()))?;
        }
        Ok(files)
    }
}

impl Drop for DataFiles {
    fn drop(&mut self) {
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Every 8-byte word holds its own file offset.
fn fill_offsets(buf: &mut [u8], at: u64) {
    for (k, word) in buf.chunks_exact_mut(8).enumerate() {
        word.copy_from_slice(&(at + 8 * k as u64).to_le_bytes());
    }
}

fn check_record(buf: &[u8], at: u64) -> Result<(), String> {
    for probe in [0usize, (buf.len() / 2) & !7, buf.len() - 8] {
        let got = u64::from_le_bytes(buf[probe..probe + 8].try_into().unwrap_or([0; 8]));
        if got != at + probe as u64 {
            return Err(format!(
                "wrong bytes at offset {}: read {got:#x}",
                at + probe as u64
            ));
        }
    }
    Ok(())
}

/// One timed pass: total records per second and the merged latency histogram (ns).
struct Pass {
    ops_per_sec: f64,
    bytes_per_sec: f64,
    latency: Histogram<u64>,
}

/// Reads one record: `(thread, offset, buffer)` → bytes read.
type ReadRecord<'a> = &'a (dyn Fn(usize, u64, &mut [u8]) -> Result<usize, String> + Sync);

/// Runs `read(thread, offset, buf)` for every record of every thread's file, threads released
/// together.
fn pass(threads: usize, file_size: u64, read: ReadRecord<'_>) -> Result<Pass, String> {
    let start_line = std::sync::Barrier::new(threads + 1);
    let (results, elapsed) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let start_line = &start_line;
                s.spawn(move || -> Result<Histogram<u64>, String> {
                    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
                        .map_err(|e| e.to_string())?;
                    let mut buf = vec![0u8; RECORD];
                    start_line.wait();
                    let mut at = 0u64;
                    while at < file_size {
                        let t0 = Instant::now();
                        let n = read(t, at, &mut buf)?;
                        let ns = t0.elapsed().as_nanos() as u64;
                        if n != RECORD {
                            return Err(format!("short read at {at}: {n} bytes"));
                        }
                        check_record(&buf, at)?;
                        let _ = hist.record(ns.max(1));
                        at += RECORD as u64;
                    }
                    Ok(hist)
                })
            })
            .collect();
        start_line.wait();
        let start = Instant::now();
        let results: Vec<_> = workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err("a reader panicked".into())))
            .collect();
        (results, start.elapsed())
    });
    let mut latency =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
    for hist in results {
        latency.add(hist?).map_err(|e| e.to_string())?;
    }
    let bytes = threads as f64 * file_size as f64;
    Ok(Pass {
        ops_per_sec: bytes / RECORD as f64 / elapsed.as_secs_f64(),
        bytes_per_sec: bytes / elapsed.as_secs_f64(),
        latency,
    })
}

fn drop_kernel_cache(paths: &[PathBuf]) -> Result<(), String> {
    for path in paths {
        let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(|e| format!("fadvise {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Drops the kernel's cache of `paths` and checks it is gone: `mincore` shows no page and
/// `cachestat` (where the kernel has it) counts none. A pass that would start warm fails.
fn make_kernel_cold(paths: &[PathBuf]) -> Result<(), String> {
    let mut left = Vec::new();
    for attempt in 0..3 {
        drop_kernel_cache(paths)?;
        left.clear();
        for path in paths {
            let (resident, cached) = crate::radiff::kernel::cached_pages(path)?;
            let pages = resident.max(cached.unwrap_or(0));
            if pages > 0 {
                left.push(format!("{}: {pages} pages", path.display()));
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        // Pages under writeback or still referenced go a moment later.
        std::thread::sleep(std::time::Duration::from_millis(20 << attempt));
    }
    Err(format!(
        "readseq: the kernel still caches the data files after POSIX_FADV_DONTNEED ({}); \
         the kernel pass would not start cold",
        left.join(", ")
    ))
}

/// Empties foliocache of every file of the run and checks the pass's `files` hold no page.
fn make_cache_cold(
    all: &[Vec<foliocache::File>],
    files: &[foliocache::File],
    paths: &[PathBuf],
) -> Result<(), String> {
    for attempt in 0..3 {
        for file in all.iter().flatten() {
            file.drop_cached(0, 0);
        }
        let left: Vec<String> = files
            .iter()
            .zip(paths)
            .filter_map(|(f, p)| {
                let pages: u64 = f.cached_ranges().iter().map(|r| r.pages).sum();
                (pages > 0).then(|| format!("{}: {pages} pages", p.display()))
            })
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if attempt == 2 {
            return Err(format!(
                "readseq: foliocache still holds pages of the data files after drop_cached ({}); \
                 the pass would not start cold",
                left.join(", ")
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// One measurement of one system.
#[derive(Debug, Clone, Copy)]
struct Sample {
    ops_per_sec: f64,
    mib_per_sec: f64,
    /// p50, p75, p99 in µs (not for the device).
    latency_us: [f64; 3],
    /// CPU seconds the process used per GiB read.
    cpu_s_per_gib: f64,
    /// What the device saw (when its counters can be read).
    disk: Option<DiskPass>,
}

impl Sample {
    /// A pass read record by record, which took `cpu` CPU seconds over `gib` GiB.
    fn of_pass(done: &Pass, cpu: f64, gib: f64) -> Self {
        let q = |p: f64| done.latency.value_at_quantile(p) as f64 / 1000.0;
        Self {
            ops_per_sec: done.ops_per_sec,
            mib_per_sec: done.bytes_per_sec / f64::from(1 << 20),
            latency_us: [q(0.50), q(0.75), q(0.99)],
            cpu_s_per_gib: cpu / gib,
            disk: None,
        }
    }
}

/// A device request shape: request bytes and queue depth in all (split between the files).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    block: usize,
    depth: usize,
}

impl Shape {
    fn name(self) -> String {
        format!("{}k-qd{}", self.block >> 10, self.depth)
    }
}

/// What a pass reads: each thread's own file, whole.
struct Data<'a> {
    /// One file per thread.
    paths: &'a [PathBuf],
    file_size: u64,
    /// The counters of the device holding the files (`/sys/dev/block/M:m/stat`), when sysfs
    /// has them.
    disk_stat: Option<PathBuf>,
}

impl Data<'_> {
    fn threads(&self) -> usize {
        self.paths.len()
    }

    fn bytes(&self) -> u64 {
        self.threads() as u64 * self.file_size
    }

    fn gib(&self) -> f64 {
        self.bytes() as f64 / f64::from(1u32 << 30)
    }
}

/// A system readseq measures: what it is called, and one pass over the data from cold.
trait System {
    /// The system's name in the figures.
    fn name(&self) -> &'static str;

    /// Makes the system's cache of the data cold and checks it is, then reads every thread's
    /// file once.
    fn pass(&mut self, data: &Data<'_>) -> Result<Sample, String>;

    /// Whether it reads record by record, so that ops/s and latencies are its figures too (the
    /// device reads whole files in large requests).
    fn records(&self) -> bool {
        true
    }

    /// How many of its passes were checked to start cold.
    fn cold_checks(&self) -> usize {
        0
    }

    /// Its counters for the case, under its name in them (foliocache's).
    fn counters(&self) -> Option<(&'static str, serde_json::Value)> {
        None
    }
}

/// foliocache: one file per thread, opened with the system's insertion policy and folio
/// sizes, in the cache every foliocache system of the case shares.
struct Foliocache<'a> {
    name: &'static str,
    /// Its name in the counters.
    counter: &'static str,
    cache: &'a Cache,
    /// Every foliocache system's files (emptied before each pass, whichever runs).
    all: &'a [Vec<foliocache::File>],
    files: &'a [foliocache::File],
    /// Mapping lock acquisitions and readahead windows over its passes.
    windows: (u64, u64),
    cold_checks: usize,
}

impl System for Foliocache<'_> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn pass(&mut self, data: &Data<'_>) -> Result<Sample, String> {
        let files = self.files;
        make_cache_cold(self.all, files, data.paths)?;
        self.cold_checks += 1;
        foliocache::raw::drain_cpu_caches(self.cache);
        let locks0: u64 = files
            .iter()
            .map(|f| f.mapping_stats().lock_acquisitions)
            .sum();
        let win0: u64 = files.iter().map(|f| f.readahead_stats().windows).sum();
        let handles: Vec<std::sync::Mutex<foliocache::Handle>> = files
            .iter()
            .map(|f| std::sync::Mutex::new(f.handle()))
            .collect();
        let cpu0 = process_cpu();
        let done = pass(data.threads(), data.file_size, &|t, at, buf| {
            let mut handle = handle_of(&handles, t)?;
            handle.read_at(buf, at).map_err(|e| e.to_string())
        })?;
        let cpu = process_cpu() - cpu0;
        let locks1: u64 = files
            .iter()
            .map(|f| f.mapping_stats().lock_acquisitions)
            .sum();
        let win1: u64 = files.iter().map(|f| f.readahead_stats().windows).sum();
        self.windows.0 += locks1 - locks0;
        self.windows.1 += win1 - win0;
        Ok(Sample::of_pass(&done, cpu, data.gib()))
    }

    fn cold_checks(&self) -> usize {
        self.cold_checks
    }

    fn counters(&self) -> Option<(&'static str, serde_json::Value)> {
        let ra = self
            .files
            .iter()
            .map(foliocache::File::readahead_stats)
            .fold(foliocache::RaStats::default(), |a, b| a + b);
        let io = self
            .files
            .iter()
            .map(foliocache::File::io_stats)
            .fold(foliocache::IoStats::default(), |a, b| a + b);
        let (locks, wins) = self.windows;
        Some((
            self.counter,
            json!({
                "mapping_lock_acquisitions_per_window (insertions, and evictions when over capacity)": locks as f64 / wins.max(1) as f64,
                "readahead": format!("{ra:?}"),
                "io": format!("{io:?}"),
                "engine": self.cache.io_engine(),
            }),
        ))
    }
}

/// The kernel: buffered `pread` of the same files, their page cache dropped before each pass.
struct Kernel {
    /// One descriptor per thread.
    files: Vec<std::fs::File>,
    cold_checks: usize,
}

impl System for Kernel {
    fn name(&self) -> &'static str {
        KERNEL
    }

    fn pass(&mut self, data: &Data<'_>) -> Result<Sample, String> {
        make_kernel_cold(data.paths)?;
        self.cold_checks += 1;
        // Touch and free memory the size of the data set, so the kernel's fill finds
        // host-resident memory (`docs/BENCHMARKS.md`).
        warm_guest_memory(data.bytes() as usize);
        let cpu0 = process_cpu();
        let done = pass(data.threads(), data.file_size, &|t, at, buf| {
            self.files[t].read_at(buf, at).map_err(|e| e.to_string())
        })?;
        Ok(Sample::of_pass(&done, process_cpu() - cpu0, data.gib()))
    }

    fn cold_checks(&self) -> usize {
        self.cold_checks
    }
}

/// The device: O_DIRECT reads of the same files with no cache, at the sweep's best shape, into
/// buffers of one kind.
struct Device {
    name: &'static str,
    shape: Shape,
    buffers: Buffers,
}

impl System for Device {
    fn name(&self) -> &'static str {
        self.name
    }

    fn pass(&mut self, data: &Data<'_>) -> Result<Sample, String> {
        let (rate, cpu) = device_read(data.paths, self.shape, self.buffers)?;
        Ok(Sample {
            ops_per_sec: rate / RECORD as f64,
            mib_per_sec: rate / f64::from(1 << 20),
            latency_us: [f64::NAN; 3],
            cpu_s_per_gib: cpu / data.gib(),
            disk: None,
        })
    }

    fn records(&self) -> bool {
        false
    }
}

/// The device read by the readers themselves ([`DirectStream`]): each thread streams its own
/// file at the device's best shape (its share of the depth), submitting and reaping the
/// requests on its own thread, and copies each record out.
struct DeviceCopy {
    shape: Shape,
}

impl System for DeviceCopy {
    fn name(&self) -> &'static str {
        COPIED
    }

    fn pass(&mut self, data: &Data<'_>) -> Result<Sample, String> {
        let depth = (self.shape.depth / data.threads()).max(1);
        stream_pass(data, |path| {
            DirectStream::prepare(path, self.shape.block, depth)
        })
    }
}

/// One pass of readers that each stream their own file through a [`DirectStream`] made by
/// `prepare` (opened and faulted in before the clock starts, as the device's buffers are).
fn stream_pass(
    data: &Data<'_>,
    prepare: impl Fn(&Path) -> Result<DirectStream, foliocache::Error>,
) -> Result<Sample, String> {
    let streams: Vec<std::sync::Mutex<DirectStream>> = data
        .paths
        .iter()
        .map(|p| prepare(p).map(std::sync::Mutex::new))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let cpu0 = process_cpu();
    let done = pass(data.threads(), data.file_size, &|t, at, buf| {
        let mut stream = streams[t].lock().map_err(|e| e.to_string())?;
        stream.read_at(buf, at).map_err(|e| e.to_string())
    })?;
    Ok(Sample::of_pass(&done, process_cpu() - cpu0, data.gib()))
}

/// The device read by readers that copy, reading ahead as the kernel's readahead does on a
/// sequential stream ([`DirectStream::prepare_windowed`]): windows of the readahead size (in
/// whole requests) in requests of the cache's request size, the next window issued when the reader reaches the
/// start of the one before it (two in flight at most). What the device allows any cache that
/// reads ahead like the kernel, with no cost of its own: the readahead's own bound.
struct DeviceWindows {
    request_bytes: usize,
    window_bytes: usize,
}

impl DeviceWindows {
    /// The shape for a cache's request size and readahead window, in the units O_DIRECT
    /// takes: requests rounded up to whole pages, the window up to whole requests (as the
    /// cache's last request of a window is a short one), between 1 and 2048 of them.
    fn new(request_bytes: usize, ra_bytes: u64) -> Self {
        let request_bytes = request_bytes.max(1).next_multiple_of(4096);
        let requests = usize::try_from(ra_bytes.div_ceil(request_bytes as u64))
            .unwrap_or(usize::MAX)
            .clamp(1, 2048);
        Self {
            request_bytes,
            window_bytes: requests * request_bytes,
        }
    }
}

impl System for DeviceWindows {
    fn name(&self) -> &'static str {
        WINDOWED
    }

    fn pass(&mut self, data: &Data<'_>) -> Result<Sample, String> {
        stream_pass(data, |path| {
            DirectStream::prepare_windowed(path, self.request_bytes, self.window_bytes)
        })
    }
}

/// The measuring body: one case's `systems` in rotation, each pass after a moment of busy
/// CPUs. Records every system's MiB/s and CPU time per GiB, and for those that read record by
/// record their ops/s and latencies; then the per-round ratio of ops/s of each pair in
/// `paired` (each round's own pair was measured minutes apart at most: the median of these
/// ratios is steadier than a ratio of medians when the disk's speed drifts).
fn measure_case(
    report: &mut Report,
    case: &str,
    systems: &mut [Box<dyn System + '_>],
    data: &Data<'_>,
    paired: &[(&str, &str)],
    (reps, bar): (usize, &ProgressBar),
) -> Result<(), String> {
    let rounds = interleaved(reps, systems.len(), bar, |k| {
        settle();
        let before = data.disk_stat.as_deref().and_then(DiskCounters::read);
        let mut sample = systems[k].pass(data)?;
        let after = data.disk_stat.as_deref().and_then(DiskCounters::read);
        // The read phase's length, from the pass's own rate (the pass's preparation, making
        // the system cold, reads nothing from the device).
        let secs = data.bytes() as f64 / (sample.mib_per_sec * f64::from(1 << 20));
        sample.disk = before.zip(after).and_then(|(b, a)| b.during(a, secs));
        Ok(sample)
    })?;
    for (k, system) in systems.iter().enumerate() {
        let name = system.name();
        let mut push = |metric: &str, f: &dyn Fn(&Sample) -> f64| {
            report
                .results
                .push(rounds.figure(case, (k, name), metric, f));
        };
        push("MiB/s", &|s| s.mib_per_sec);
        push("cpu_s_per_GiB", &|s| s.cpu_s_per_gib);
        if rounds.samples[k].iter().all(|s| s.disk.is_some()) {
            // Every sample has counters here, so the NaN of `map_or` is never reported.
            let disk = |s: &Sample, f: fn(&DiskPass) -> f64| s.disk.as_ref().map_or(f64::NAN, f);
            push("disk_busy_%", &|s| disk(s, |d| d.busy * 100.0));
            push("disk_request_KiB", &|s| disk(s, |d| d.request_kib));
            push("disk_reads_in_flight", &|s| disk(s, |d| d.in_flight));
        }
        if !system.records() {
            continue;
        }
        push("ops/s", &|s| s.ops_per_sec);
        push("p50_us", &|s| s.latency_us[0]);
        push("p75_us", &|s| s.latency_us[1]);
        push("p99_us", &|s| s.latency_us[2]);
    }
    let at = |name: &str| systems.iter().position(|s| s.name() == name);
    for &(a, b) in paired {
        if let (Some(ia), Some(ib)) = (at(a), at(b)) {
            rounds.paired(report, case, (ia, a), (ib, b), |s| s.ops_per_sec);
        }
    }
    Ok(())
}

/// The device sweep of one thread count: every request shape once, each after a moment of busy
/// CPUs, its figures recorded in the `device-sweep` case. Returns the shape with the most MiB/s.
fn sweep_device(
    report: &mut Report,
    data: &Data<'_>,
    sweep: &[Shape],
    bar: &ProgressBar,
) -> Result<Shape, String> {
    let case = format!("threads={}/device-sweep", data.threads());
    let mut best: Option<(Shape, f64)> = None;
    for &shape in sweep {
        settle();
        let (rate, cpu) = device_read(data.paths, shape, Buffers::Keep)?;
        let mibs = rate / f64::from(1 << 20);
        report.results.push(Figure::new(
            &case,
            &format!("device/{}", shape.name()),
            "MiB/s",
            &[mibs],
            0,
        ));
        report.results.push(Figure::new(
            &case,
            &format!("device/{}", shape.name()),
            "cpu_s_per_GiB",
            &[cpu / data.gib()],
            0,
        ));
        if best.is_none_or(|(_, b)| mibs > b) {
            best = Some((shape, mibs));
        }
        bar.inc(1);
    }
    Ok(best.map_or(
        Shape {
            block: 128 << 10,
            depth: 32,
        },
        |(s, _)| s,
    ))
}

/// Opens each path once per foliocache system, with its insertion policy and folio sizes: each
/// system its own files on the same memory (a file opened apart).
fn open_files(cache: &Cache, paths: &[PathBuf]) -> Result<Vec<Vec<foliocache::File>>, String> {
    FOLIOCACHE
        .iter()
        .map(|&(_, insert, max_order, _)| {
            paths
                .iter()
                .map(|p| {
                    let mut options = foliocache::OpenOptions::new()
                        .shared(false)
                        .insert_policy(insert);
                    if let Some(order) = max_order {
                        options = options.max_order(order);
                    }
                    cache.open_with(p, options)
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()
        .map_err(|e| match e {
            foliocache::Error::NoDirectIo { .. } => {
                format!("{e}\n(readseq needs a disk file system: pass --dir DIR on one)")
            }
            other => other.to_string(),
        })
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let dir = data_dir(args)?;
    let disk_stat = block_dev_dir(&dir)
        .map(|d| d.join("stat"))
        .filter(|stat| DiskCounters::read(stat).is_some());
    // The same maximum window as the kernel uses on that disk, unless asked otherwise.
    let kernel_ra_kb = kernel_read_ahead_kb(&dir);
    let ra_kb = args.ra_kb.or(kernel_ra_kb).unwrap_or(2048);
    let sizes = Sizes {
        file: if args.full { 1 << 30 } else { 256 << 20 },
        ra_bytes: ra_kb << 10,
        request_bytes: args
            .request_kb
            .map_or(foliocache::raw::DEFAULT_REQUEST_BYTES, |kb| {
                (kb << 10) as usize
            }),
    };
    let threads_list: Vec<usize> = args
        .threads
        .clone()
        .unwrap_or_else(|| vec![2])
        .into_iter()
        .map(|t| t as usize)
        .collect();
    if let Some(&big) = threads_list.iter().find(|&&t| t > 32) {
        return Err(format!("readseq runs at most 32 threads (asked {big})"));
    }
    // Keep the data set (and the two caches holding it) within a few GiB however many threads.
    let max_threads = threads_list.iter().copied().max().unwrap_or(1) as u64;
    let sizes = Sizes {
        file: sizes.file.min(((2u64 << 30) / max_threads).max(64 << 20)) & !((1 << 20) - 1),
        ..sizes
    };
    let reps = args.reps();
    let max_threads = max_threads as usize;
    // The device sweep: request sizes up to 4 MiB (the kernel issues requests up to its
    // window, and this disk's max_sectors_kb is 4096) at two depths.
    let sweep: Vec<Shape> = {
        let blocks: &[usize] = if args.full {
            &[128, 256, 512, 1024, 2048, 4096]
        } else {
            &[128, 512, 1024, 4096]
        };
        blocks
            .iter()
            .flat_map(|&kb| {
                [8, 32].map(|depth| Shape {
                    block: kb << 10,
                    depth,
                })
            })
            .collect()
    };
    let mut report = Report::new(
        "readseq",
        json!({
            "record_bytes": RECORD,
            "file_bytes_per_thread": sizes.file,
            "threads": threads_list,
            "reps": reps,
            "readahead_max_bytes": sizes.ra_bytes,
            "readahead_max_from": if args.ra_kb.is_some() { "--ra-kb" } else if kernel_ra_kb.is_some() { "the disk's read_ahead_kb" } else { "default 2048 KiB (read_ahead_kb unknown)" },
            "kernel_read_ahead_kb": kernel_ra_kb,
            "request_bytes": sizes.request_bytes,
            "device_sweep": sweep.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "folio_order": "0 (batched, single); ramp up to 9 (large-folios)",
            "dir": dir.display().to_string(),
        }),
    );
    let steps = threads_list.len() * ((SYSTEMS.len() + 2) * reps + sweep.len());
    let bar = ProgressBar::new(steps as u64).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("readseq");
    let files = DataFiles::create(&dir, max_threads, sizes.file, &bar)?;
    let mut counters = serde_json::Map::new();
    let mut cold_checks = 0usize;
    for &threads in &threads_list {
        let data = Data {
            paths: &files.paths[..threads],
            file_size: sizes.file,
            disk_stat: disk_stat.clone(),
        };
        // The device's best shape, swept once per thread count; the rotation then measures it
        // in every round beside the systems.
        bar.set_message(format!("threads={threads}: device sweep"));
        let device_shape = sweep_device(&mut report, &data, &sweep, &bar)?;
        for over in [false, true] {
            let case = if over {
                format!("threads={threads}/over-capacity")
            } else {
                format!("threads={threads}")
            };
            bar.set_message(case.clone());
            let capacity = if over {
                data.bytes() / 4
            } else {
                data.bytes() + (64 << 20)
            };
            // One cache for every foliocache system: a file per path and system, each with its
            // insertion policy and folio sizes, on the same memory. (Two caches built one after
            // the other gave the first-built one 20-30% less throughput with the very same
            // policy: this VM's memory is not uniformly fast.)
            let cache = build_cache(capacity, sizes.ra_bytes, sizes.request_bytes)?;
            let opened = open_files(&cache, data.paths)?;
            let windows = DeviceWindows::new(sizes.request_bytes, sizes.ra_bytes);
            let mut systems = systems(&cache, &opened, data.paths, device_shape, windows, over)?;
            let mut paired = vec![(BATCHED, SINGLE)];
            if !over {
                paired.extend([
                    (BATCHED, KERNEL),
                    (LARGE, KERNEL),
                    (BATCHED, DEVICE),
                    (LARGE, DEVICE),
                    (KERNEL, DEVICE),
                    (COPIED, DEVICE),
                    (WINDOWED, DEVICE),
                    (BATCHED, WINDOWED),
                    (KERNEL, WINDOWED),
                    (BATCHED, COPIED),
                    (LARGE, COPIED),
                    (KERNEL, COPIED),
                ]);
            }
            measure_case(
                &mut report,
                &case,
                &mut systems,
                &data,
                &paired,
                (reps, &bar),
            )?;
            if !over {
                // The buffer variants against the ceiling: ratios of medians (informative only).
                for (a, b) in [(REUSED, DEVICE), (REUSED, REUSED_4K)] {
                    report.ratio(&case, "MiB/s", a, b);
                }
            }
            let mut per_case = serde_json::Map::new();
            for system in &systems {
                if let Some((name, value)) = system.counters() {
                    per_case.insert(name.into(), value);
                }
                cold_checks += system.cold_checks();
            }
            per_case.insert(
                "reclaim (all)".into(),
                json!(format!("{:?}", cache.reclaim_stats())),
            );
            if !over {
                per_case.insert("device_shape".into(), json!(device_shape.name()));
            }
            counters.insert(case.clone(), serde_json::Value::Object(per_case));
        }
    }
    bar.finish_and_clear();
    drop(files);
    counters.insert("cold_checks_passed".into(), json!(cold_checks));
    report.counters = serde_json::Value::Object(counters);
    report.notes.push(format!(
        "Readahead: at most {} KiB per window ({}); batched and single read in 4 KiB folios (a \
         mapping without large folios, the path seed 000 batches), large-folios ramps the folio \
         order up to 2 MiB as the kernel does on ext4 since 6.16 (so large-folios / kernel is \
         the like-for-like ratio there); requests of at most {} KiB. The kernel side uses this \
         disk's own read_ahead_kb ({}). Every pass starts cold, checked: foliocache's files \
         hold no page (`cached_ranges` empty) and the kernel's show none in `mincore` nor \
         `cachestat` ({cold_checks} checks passed). The over-capacity case gives the cache a \
         quarter of the data set: eviction runs all along. device: O_DIRECT reads at the best \
         request size and depth of a sweep (128 KiB to 4 MiB, depth 8 and 32; the sweep's own \
         figures are the `device-sweep` case) into huge-page memory that keeps every byte (the \
         ceiling for a cache); device+copy: each reader streams its own file at that shape, \
         submitting and reaping its requests itself, and copies every record out (a cache with \
         no lookup, no lock and no thread of its own: the bound for a cache that copies); \
         device+copy/kernel-windows: the same, reading ahead as the kernel does (windows of \
         the readahead size in requests of the cache's size, the next issued when the reader \
         reaches the start of the one before it: the bound for a cache that reads ahead like \
         the kernel); \
         device/reused into a few reused buffers that stay in the CPU \
         caches (no cache can read that way); device/reused-4k-pages the same in 4 KiB pages. \
         cpu_s_per_GiB: the process's CPU time over the pass (all threads, including the \
         cache's completion thread) per GiB read; for the device, its reader threads' own; \
         the summary's CPU rows give device+copy's as their limit. \
         Ratios between systems are medians of per-round ratios (both in the same round) \
         unless marked as ratios of medians.",
        sizes.ra_bytes >> 10,
        if args.ra_kb.is_some() {
            "--ra-kb"
        } else {
            "the disk's read_ahead_kb"
        },
        sizes.request_bytes >> 10,
        kernel_ra_kb.map_or_else(|| "unknown".to_string(), |kb| format!("{kb} KiB"))
    ));
    plots(&mut report);
    Ok(report)
}

/// A case's systems, in rotation order: the foliocache ones (on `opened`, each system's files
/// in `cache`), the kernel and the device's four. The over-capacity case has only batched and
/// single: it compares the two insertion policies under eviction, and the kernel and the device
/// have no such limit (they are measured in the first case).
fn systems<'a>(
    cache: &'a Cache,
    opened: &'a [Vec<foliocache::File>],
    paths: &[PathBuf],
    device_shape: Shape,
    windows: DeviceWindows,
    over: bool,
) -> Result<Vec<Box<dyn System + 'a>>, String> {
    let mut windows = Some(windows);
    let kernel_files: Vec<std::fs::File> = paths
        .iter()
        .map(std::fs::File::open)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut systems: Vec<Box<dyn System + 'a>> = Vec::new();
    for (&(name, _, _, counter), files) in FOLIOCACHE.iter().zip(opened) {
        systems.push(Box::new(Foliocache {
            name,
            counter,
            cache,
            all: opened,
            files,
            windows: (0, 0),
            cold_checks: 0,
        }));
    }
    systems.push(Box::new(Kernel {
        files: kernel_files,
        cold_checks: 0,
    }));
    for (name, buffers) in [
        (DEVICE, Buffers::Keep),
        (REUSED, Buffers::Reused),
        (REUSED_4K, Buffers::ReusedSmallPages),
    ] {
        systems.push(Box::new(Device {
            name,
            shape: device_shape,
            buffers,
        }));
        if name == DEVICE {
            systems.push(Box::new(DeviceCopy {
                shape: device_shape,
            }));
        }
        if name == DEVICE
            && let Some(windows) = windows.take()
        {
            systems.push(Box::new(windows));
        }
    }
    if over {
        systems.truncate(2);
    }
    Ok(systems)
}

/// The plots: every case but the sweep, one plot per metric (ops/s, MiB/s, CPU per GiB).
fn plots(report: &mut Report) {
    for metric in [
        "ops/s",
        "MiB/s",
        "cpu_s_per_GiB",
        "disk_busy_%",
        "disk_reads_in_flight",
    ] {
        let cases: Vec<String> = report
            .results
            .iter()
            .filter(|f| f.metric == metric && !f.case.ends_with("device-sweep"))
            .map(|f| f.case.clone())
            .fold(Vec::new(), |mut v, c| {
                if !v.contains(&c) {
                    v.push(c);
                }
                v
            });
        let (file, unit, scale) = match metric {
            "ops/s" => (
                "readseq-ops.svg",
                "thousand 8 KiB reads/s (all threads)",
                1e3,
            ),
            "MiB/s" => ("readseq-mibs.svg", "MiB/s (all threads)", 1.0),
            "disk_busy_%" => (
                "readseq-disk-busy.svg",
                "% of the pass with a read in flight at the device",
                1.0,
            ),
            "disk_reads_in_flight" => (
                "readseq-disk-depth.svg",
                "mean reads in flight at the device (merged requests)",
                1.0,
            ),
            _ => ("readseq-cpu.svg", "CPU seconds per GiB read", 1.0),
        };
        if cases.is_empty() {
            // The device's counters were not readable: no figures, no plot.
            continue;
        }
        let groups = cases
            .iter()
            .map(|case| {
                let bars = SYSTEMS
                    .iter()
                    .filter_map(|s| {
                        report
                            .figure(case, s, metric)
                            .map(|f| ((*s).to_string(), f.median / scale))
                    })
                    .collect();
                (case.clone(), bars)
            })
            .collect();
        report.plots.push(Plot {
            file: file.into(),
            title: format!("readseq: cold sequential 8 KiB reads from disk, {metric}"),
            unit: unit.into(),
            groups,
        });
    }
}

fn handle_of(
    handles: &[std::sync::Mutex<foliocache::Handle>],
    t: usize,
) -> Result<std::sync::MutexGuard<'_, foliocache::Handle>, String> {
    handles[t].lock().map_err(|e| e.to_string())
}

/// The device: every file read at once, one thread and ring per file, O_DIRECT requests of
/// `shape.block` bytes, `shape.depth` in flight in all (split between the files), as the
/// readers stream them. The buffers are mapped and faulted in before the threads start
/// together. Returns bytes per second and the reader threads' CPU seconds.
fn device_read(paths: &[PathBuf], shape: Shape, buffers: Buffers) -> Result<(f64, f64), String> {
    let depth = (shape.depth / paths.len()).max(1);
    let start_line = std::sync::Barrier::new(paths.len() + 1);
    let (results, elapsed) = std::thread::scope(|s| {
        let workers: Vec<_> = paths
            .iter()
            .map(|path| {
                let start_line = &start_line;
                s.spawn(move || {
                    let probe = Probe::prepare(&[path.as_path()], shape.block, depth, buffers);
                    // Wait even on failure, so the others are not left at the line.
                    start_line.wait();
                    let cpu0 = thread_cpu();
                    let read = probe.and_then(Probe::run);
                    read.map(|r| (r.bytes, thread_cpu() - cpu0))
                })
            })
            .collect();
        start_line.wait();
        let start = Instant::now();
        let results: Vec<_> = workers
            .into_iter()
            .map(|w| w.join().unwrap_or(Err(foliocache::Error::NotADiskFile)))
            .collect();
        (results, start.elapsed())
    });
    let (mut bytes, mut cpu) = (0u64, 0.0);
    for r in results {
        let (b, c) = r.map_err(|e| e.to_string())?;
        bytes += b;
        cpu += c;
    }
    Ok((bytes as f64 / elapsed.as_secs_f64(), cpu))
}

fn build_cache(capacity: u64, ra_bytes: u64, request_bytes: usize) -> Result<Cache, String> {
    Cache::builder()
        .io_request_bytes(request_bytes)
        .capacity(capacity.div_ceil(2 << 20) * (2 << 20))
        .prefault(true)
        .readahead_bytes(ra_bytes)
        .build()
        .map_err(|e| e.to_string())
}

/// The summary's rows (seed 000), from the first thread count's case (`threads=2` by
/// default).
pub(crate) fn summary(report: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    let Some(case) = report
        .results
        .iter()
        .map(|f| f.case.as_str())
        .find(|c| c.starts_with("threads=") && !c.contains('/'))
    else {
        return rows;
    };
    let mibs = |s: &str| report.figure(case, s, "MiB/s");
    let paired = |a: &str, b: &str| report.paired_ratio(case, a, b);
    let cpu = |s: &str| value(report.figure(case, s, "cpu_s_per_GiB"), 1.0, "s/GiB");
    if let Some(p) = paired(BATCHED, SINGLE) {
        rows.push(
            Row::new("000", "batched vs single insertion (MiB/s)")
                .before(value(mibs(SINGLE), 1.0, ""))
                .after(value(mibs(BATCHED), 1.0, ""))
                .kernel(value(mibs(KERNEL), 1.0, ""))
                .limit(value(mibs(DEVICE), 1.0, "device"))
                .ratio(Spread::of(p, Unit::Times))
                .at_least(1.0)
                .busy_from(&[Some(p)]),
        );
    }
    for (a, name, goal) in [
        (BATCHED, "batched (4 KiB folios) vs kernel", 1.0),
        (LARGE, "large folios vs kernel (like for like)", 1.0),
    ] {
        if let Some(p) = paired(a, KERNEL) {
            rows.push(
                Row::new("000", name)
                    .after(value(mibs(a), 1.0, "MiB/s"))
                    .kernel(value(mibs(KERNEL), 1.0, "MiB/s"))
                    .ratio(Spread::of(p, Unit::Times))
                    .at_least(goal)
                    .busy_from(&[Some(p)]),
            );
        }
    }
    if let Some(p) = paired(BATCHED, DEVICE) {
        rows.push(
            Row::new("000", "batched: share of the device")
                .after(value(mibs(BATCHED), 1.0, "MiB/s"))
                .kernel(value(mibs(KERNEL), 1.0, "MiB/s"))
                .limit(value(mibs(DEVICE), 1.0, "MiB/s"))
                .ratio(Spread::of(p, Unit::Percent))
                .at_least(0.9)
                .busy_from(&[Some(p)]),
        );
    }
    // What bounds that share: the device read by readers that copy, with nothing else, and
    // the same reading ahead in the kernel's windows (the readahead's own bound).
    for (a, b, name) in [
        (COPIED, DEVICE, "bound: device+copy's share of the device"),
        (
            WINDOWED,
            DEVICE,
            "bound: kernel-windows copy, share of device",
        ),
        (KERNEL, DEVICE, "kernel's share of the device"),
        (BATCHED, COPIED, "batched: share of device+copy"),
        (BATCHED, WINDOWED, "batched: share of kernel-windows copy"),
        (KERNEL, WINDOWED, "kernel: share of kernel-windows copy"),
    ] {
        if let Some(p) = paired(a, b) {
            rows.push(
                Row::new("000", name)
                    .after(value(mibs(a), 1.0, "MiB/s"))
                    .limit(value(mibs(b), 1.0, "MiB/s"))
                    .ratio(Spread::of(p, Unit::Percent))
                    .busy_from(&[Some(p)]),
            );
        }
    }
    // What the device saw: the mean number of reads in flight (merged requests), which a
    // cache reading ahead in the kernel's windows keeps at about two windows per reader, where
    // the device's ceiling keeps its whole depth out.
    let depth = |s: &str| report.figure(case, s, "disk_reads_in_flight");
    if let (Some(x), Some(w)) = (depth(BATCHED), depth(WINDOWED)) {
        let shown = |s: &str| value(depth(s), 1.0, "");
        rows.push(
            Row::new(
                "000",
                "device's reads in flight: batched vs kernel-windows copy",
            )
            .after(shown(BATCHED))
            .kernel(shown(KERNEL))
            .limit(value(depth(DEVICE), 1.0, "device"))
            .ratio(Spread::single(x.median / w.median, Unit::Times))
            .busy_from(&[Some(x), Some(w)]),
        );
    }
    // CPU per GiB, ratios of medians; the limit is device+copy's (the copy and the waits, no
    // cache at all).
    for (a, name) in [
        (BATCHED, "CPU s per GiB: batched vs kernel"),
        (LARGE, "CPU s per GiB: large folios vs kernel"),
    ] {
        if let (Some(x), Some(k)) = (
            report.figure(case, a, "cpu_s_per_GiB"),
            report.figure(case, KERNEL, "cpu_s_per_GiB"),
        ) {
            let ratio = x.median / k.median;
            rows.push(
                Row::new("000", name)
                    .before(if a == BATCHED { cpu(SINGLE) } else { None })
                    .after(cpu(a))
                    .kernel(cpu(KERNEL))
                    .limit(cpu(COPIED))
                    .ratio(Spread::single(ratio, Unit::Times))
                    .goal("≤ 1.00×", ratio <= 1.0)
                    .busy_from(&[Some(x), Some(k)]),
            );
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::{DeviceWindows, DiskCounters};

    /// The device's counters as sysfs prints them, and what a pass reads from two of them:
    /// a missing or malformed file gives none, counters that went back or read nothing give no
    /// figures.
    #[test]
    fn disk_counters_read_sysfs_stat_and_give_a_pass_its_figures() {
        let dir = std::env::temp_dir().join(format!("fcache-disk-stat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stat = dir.join("stat");
        let line = |reads: u64, sectors: u64, read_ms: u64, busy_ms: u64| {
            format!(
                "{reads:>8} 12 {sectors:>8} {read_ms:>8} 40 0 320 9 0 {busy_ms:>8} 999 0 0 0 0 3 1\n"
            )
        };
        std::fs::write(&stat, line(100, 8_000, 50, 40)).unwrap();
        let before = DiskCounters::read(&stat).unwrap();
        // 64 requests of 4 MiB (8192 sectors each) in 0.1 s, 700 ms in flight in all, busy
        // 95 ms of the 100.
        std::fs::write(&stat, line(164, 8_000 + 64 * 8192, 750, 135)).unwrap();
        let after = DiskCounters::read(&stat).unwrap();
        let pass = before.during(after, 0.1).unwrap();
        assert!((pass.busy - 0.95).abs() < 1e-9, "{pass:?}");
        assert!((pass.request_kib - 4096.0).abs() < 1e-9, "{pass:?}");
        assert!((pass.in_flight - 7.0).abs() < 1e-9, "{pass:?}");
        // Busy longer than the pass (millisecond ticks) reads as 100%.
        assert_eq!(before.during(after, 0.05).unwrap().busy, 1.0);
        // Nothing read, counters that went back (a device reset), no time: no figures.
        assert!(before.during(before, 0.1).is_none());
        assert!(after.during(before, 0.1).is_none());
        assert!(before.during(after, 0.0).is_none());
        // Not the format: too few fields, or not numbers.
        std::fs::write(&stat, "1 2 3\n").unwrap();
        assert!(DiskCounters::read(&stat).is_none());
        std::fs::write(&stat, line(1, 2, 3, 4).replace("12", "x")).unwrap();
        assert!(DiskCounters::read(&stat).is_none());
        assert!(DiskCounters::read(&dir.join("missing")).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Any request size and window the suite may be given become a shape O_DIRECT and
    /// `DirectStream::prepare_windowed` take: whole pages, a window of whole requests, 1 to
    /// 2048 of them.
    #[test]
    fn the_kernel_windows_shape_is_always_one_a_stream_takes() {
        for (request, ra, want) in [
            (512 << 10, 8 << 20, (512 << 10, 8 << 20)),
            (768 << 10, 8 << 20, (768 << 10, 11 * (768 << 10))),
            (1000, 8 << 20, (4096, 8 << 20)),
            (512 << 10, 100, (512 << 10, 512 << 10)),
            (4096, 1 << 40, (4096, 2048 * 4096)),
            (0, 0, (4096, 4096)),
        ] {
            let shape = DeviceWindows::new(request, ra);
            assert_eq!(
                (shape.request_bytes, shape.window_bytes),
                want,
                "request {request}, readahead {ra}"
            );
            assert!(shape.request_bytes.is_multiple_of(4096));
            assert!(shape.window_bytes.is_multiple_of(shape.request_bytes));
            assert!((1..=2048).contains(&(shape.window_bytes / shape.request_bytes)));
        }
    }
}
