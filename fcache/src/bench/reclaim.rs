//! `fcache bench reclaim`: eviction order and workingset detection, as hit ratios.
//!
//! The files come from a synthetic backend (each 8-byte word holds its own file offset, filled
//! when a request is served), so the cases measure the cache's choices, not a device: a miss is
//! a page the backend had to serve. Every read's first word is checked.
//!
//! Cases (quick: a 64 MiB budget; full: 256 MiB):
//! * **hot+scan**: a hot set of 40% of the arena is read twice, every page, in a shuffled
//!   order (warm), then a sequential scan
//!   of 4× the budget in 64 KiB reads runs with 4 random 4 KiB reads of the hot set after each
//!   scan read. Metric: the hot reads' hit ratio during the scan. A page of the hot set is read
//!   again after about 1.6× the arena's worth of scanned pages, on average: an LRU forgets it
//!   first.
//! * **shift**: a stale set of 45% of the arena is read twice (it holds the active list and is
//!   never read again), then a new set of 60% is read in a fixed shuffled loop, 8 times. Each
//!   new page comes back after more insertions than the inactive list holds, so without
//!   workingset detection it is evicted before its second access, loop after loop; refault
//!   distances show it would fit if the stale active pages gave way. Metric: the new set's hit
//!   ratio after its first loop.
//! * **zipf**: 4 KiB reads of pages drawn from a Zipf distribution (s = 0.9, 1.0) over a file of
//!   4× the budget, in a shuffled page order. Reported next to policies simulated on the same
//!   trace (`policies.rs`): an exact LRU, the offline optimum (Belady), and today's best online
//!   policies, ARC, S3-FIFO and SIEVE, each holding as many pages as the real cache held for
//!   folios on average over its runs (sampled every 1024 reads; the arena minus the index
//!   reserve, which grows as the index does).
//!
//! Systems: `workingset` (the default policy), `two-lists` (same lists, no shadows), `clock`
//! (one list with a second chance: the plain LRU approximation). The hot+scan and shift cases
//! also run `workingset, placed` and `clock, placed`: the same policies with small fills'
//! pages placed by their file offset (`CacheBuilder::place_by_offset`), which changes where
//! in the arena evictions free memory, and so what the scan's large folios find. For each run, the process's
//! resident memory is measured before the cache is built, and its peak (`VmHWM`) at the end:
//! the peak is reset first (`/proc/self/clear_refs` "5") where the kernel allows it, so the
//! growth over the budget is the run's own peak, not what is left resident at the end.

use super::report::{Figure, Plot, Report};
use super::rng::Rng;
use super::summary::{Row, Spread, Unit};
use super::{BenchArgs, policies};
use foliocache::ReclaimPolicy;
use foliocache::{Advice, Backend, Cache, File, Policy, ReadRequest};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const PAGE: u64 = 4096;
const POLICIES: [(&str, ReclaimPolicy); 3] = [
    ("workingset", ReclaimPolicy::Workingset),
    ("two-lists", ReclaimPolicy::TwoLists),
    ("clock", ReclaimPolicy::Clock),
];
/// The systems of the hot+scan and shift cases: a policy, and whether small fills are placed
/// by their offset.
const SYSTEMS: [(&str, ReclaimPolicy, bool); 5] = [
    ("workingset", ReclaimPolicy::Workingset, false),
    ("two-lists", ReclaimPolicy::TwoLists, false),
    ("clock", ReclaimPolicy::Clock, false),
    ("workingset, placed", ReclaimPolicy::Workingset, true),
    ("clock, placed", ReclaimPolicy::Clock, true),
];
const HOT_READS_PER_SCAN_READ: usize = 4;
const SCAN_READ: usize = 64 << 10;
/// The metric of the hot+scan and shift cases.
const HOT_METRIC: &str = "hit ratio % (hot set)";
const SHIFT_LOOPS: u64 = 8;
/// The fixed overhead the README states beyond the budget: the process's own heap for the
/// files, handles, read buffers and allocator slack, which does not grow with the cache.
const RSS_OVERHEAD: u64 = 1 << 20;
const ZIPF_EXPONENTS: [f64; 2] = [0.9, 1.0];

/// A file whose every 8-byte word holds `tag << 48 | offset`.
#[derive(Debug)]
struct Synthetic {
    size: u64,
    tag: u64,
    pages_served: AtomicU64,
}

impl Synthetic {
    fn new(size: u64, tag: u64) -> Arc<Self> {
        Arc::new(Self {
            size,
            tag,
            pages_served: AtomicU64::new(0),
        })
    }

    fn word(&self, offset: u64) -> u64 {
        (self.tag << 48) | offset
    }
}

impl Backend for Synthetic {
    fn size(&self) -> u64 {
        self.size
    }

    fn submit(&self, requests: Vec<ReadRequest>) {
        for mut request in requests {
            let len = request.len();
            self.pages_served
                .fetch_add(len as u64 / PAGE, Ordering::Relaxed);
            for (offset, bytes) in request.targets() {
                for (k, chunk) in bytes.chunks_exact_mut(8).enumerate() {
                    chunk.copy_from_slice(&self.word(offset + 8 * k as u64).to_le_bytes());
                }
            }
            let n = self.size.saturating_sub(request.offset()).min(len as u64) as usize;
            request.complete(Ok(n));
        }
    }

    fn describe(&self) -> String {
        "synthetic".into()
    }
}

/// A `/proc/self/status` field in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.split(':').next() == Some(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb << 10)
}

/// Resets the process's peak resident memory (`VmHWM`) to its current RSS; false where the
/// kernel does not allow it (the peak then runs from the process's start).
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Memory measured around one run: RSS before the cache, the peak after the run.
struct Rss {
    before: u64,
    reset: bool,
}

impl Rss {
    fn start() -> Self {
        let reset = reset_peak();
        Self {
            before: status_bytes("VmRSS"),
            reset,
        }
    }

    /// The peak's growth over the RSS before the run.
    fn growth(&self) -> i64 {
        status_bytes("VmHWM") as i64 - self.before as i64
    }
}

struct Run {
    hit_ratio: f64,
    rss_delta: i64,
    peak_reset: bool,
    /// Pages the cache held for folios (arena minus the index reserve), averaged over the run.
    folio_pages: f64,
    counters: foliocache::ReclaimStats,
    /// What the scan's readahead did, and the memory left free at the end (hot+scan only).
    scan: Option<String>,
}

/// The pages a cache holds for folios now.
fn folio_pages(cache: &Cache) -> u64 {
    let stats = cache.stats();
    stats.total_pages - stats.index_reserve_pages
}

fn build(budget: u64, policy: ReclaimPolicy) -> Result<Cache, String> {
    build_placed(budget, policy, false)
}

fn build_placed(budget: u64, policy: ReclaimPolicy, placed: bool) -> Result<Cache, String> {
    Cache::builder()
        .capacity(budget)
        .policy(Policy {
            reclaim: policy,
            ..Policy::default()
        })
        .place_by_offset(placed)
        .build()
        .map_err(|e| e.to_string())
}

fn open(cache: &Cache, backend: &Arc<Synthetic>) -> Result<File, String> {
    cache
        .open_backend(backend.clone(), None)
        .map_err(|e| e.to_string())
}

fn check(buf: &[u8], backend: &Synthetic, pos: u64) -> Result<(), String> {
    let word = u64::from_le_bytes(buf[..8].try_into().map_err(|_| "short read")?);
    if word == backend.word(pos) {
        Ok(())
    } else {
        Err(format!(
            "wrong bytes at {pos} of file {}: {word:#x}",
            backend.tag
        ))
    }
}

/// Reads every page of `file` twice, each time in a shuffled order (4 KiB reads, no
/// readahead): afterwards the set is on the lists with two accesses each.
fn warm(file: &File, backend: &Synthetic, rng: &mut Rng) -> Result<(), String> {
    let mut handle = file.handle();
    handle.advise(Advice::Random).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; PAGE as usize];
    for _ in 0..2 {
        for page in rng.permutation(file.size() / PAGE) {
            handle
                .read_at(&mut buf, page * PAGE)
                .map_err(|e| e.to_string())?;
            check(&buf, backend, page * PAGE)?;
        }
    }
    Ok(())
}

/// One hot+scan run.
fn hot_scan(budget: u64, policy: ReclaimPolicy, placed: bool, seed: u64) -> Result<Run, String> {
    let rss = Rss::start();
    let cache = build_placed(budget, policy, placed)?;
    let arena = cache.stats().total_pages;
    let hot_pages = arena * 2 / 5;
    let hot_backend = Synthetic::new(hot_pages * PAGE, 1);
    let scan_backend = Synthetic::new(4 * budget, 3);
    let hot = open(&cache, &hot_backend)?;
    let scan = open(&cache, &scan_backend)?;
    let mut rng = Rng(seed | 1);
    warm(&hot, &hot_backend, &mut rng)?;
    let mut buf = vec![0u8; SCAN_READ];
    let mut hot_handle = hot.handle();
    hot_handle
        .advise(Advice::Random)
        .map_err(|e| e.to_string())?;
    let served_before = hot_backend.pages_served.load(Ordering::Relaxed);
    let mut hot_reads = 0u64;
    let mut scan_handle = scan.handle();
    let mut pos = 0;
    while pos < scan.size() {
        let n = scan_handle
            .read_at(&mut buf, pos)
            .map_err(|e| e.to_string())?;
        check(&buf, &scan_backend, pos)?;
        pos += n as u64;
        for _ in 0..HOT_READS_PER_SCAN_READ {
            let at = rng.below(hot_pages) * PAGE;
            hot_handle
                .read_at(&mut buf[..PAGE as usize], at)
                .map_err(|e| e.to_string())?;
            check(&buf, &hot_backend, at)?;
            hot_reads += 1;
        }
    }
    let misses = hot_backend.pages_served.load(Ordering::Relaxed) - served_before;
    let rss_delta = rss.growth();
    let ra = scan.readahead_stats();
    let stats = cache.stats();
    Ok(Run {
        hit_ratio: 1.0 - misses as f64 / hot_reads as f64,
        rss_delta,
        peak_reset: rss.reset,
        folio_pages: folio_pages(&cache) as f64,
        counters: cache.reclaim_stats(),
        scan: Some(format!(
            "scan: {} pages in {} folios, {} windows finished in pages, {} cut short for \
             memory; {} of {} pages free at the end",
            ra.pages,
            ra.folios,
            ra.order_fallbacks,
            ra.out_of_memory,
            stats.free_pages,
            stats.total_pages,
        )),
    })
}

/// One shift run: a stale set of 45% of the arena is warmed (and holds the active list), then
/// a new set of 60% is read in a fixed shuffled loop, `SHIFT_LOOPS` times. Metric: the new
/// set's hit ratio after its first loop.
fn shift(budget: u64, policy: ReclaimPolicy, placed: bool, seed: u64) -> Result<Run, String> {
    let rss = Rss::start();
    let cache = build_placed(budget, policy, placed)?;
    let arena = cache.stats().total_pages;
    let stale_backend = Synthetic::new(arena * 9 / 20 * PAGE, 2);
    let new_backend = Synthetic::new(arena * 3 / 5 * PAGE, 5);
    let stale = open(&cache, &stale_backend)?;
    let new = open(&cache, &new_backend)?;
    let mut rng = Rng(seed | 1);
    warm(&stale, &stale_backend, &mut rng)?;
    let order = rng.permutation(new.size() / PAGE);
    let mut handle = new.handle();
    handle.advise(Advice::Random).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; PAGE as usize];
    let mut served_after_first = 0;
    for round in 0..SHIFT_LOOPS {
        if round == 1 {
            served_after_first = new_backend.pages_served.load(Ordering::Relaxed);
        }
        for &page in &order {
            handle
                .read_at(&mut buf, page * PAGE)
                .map_err(|e| e.to_string())?;
            check(&buf, &new_backend, page * PAGE)?;
        }
    }
    let misses = new_backend.pages_served.load(Ordering::Relaxed) - served_after_first;
    let reads = order.len() as u64 * (SHIFT_LOOPS - 1);
    let rss_delta = rss.growth();
    Ok(Run {
        hit_ratio: 1.0 - misses as f64 / reads as f64,
        rss_delta,
        peak_reset: rss.reset,
        folio_pages: folio_pages(&cache) as f64,
        counters: cache.reclaim_stats(),
        scan: None,
    })
}

/// A Zipf trace of `len` page numbers over `pages` pages (rank r has weight 1/r^s), the ranks
/// scattered over the file by a seeded shuffle.
fn zipf_trace(pages: u64, s: f64, len: usize, seed: u64) -> Vec<u64> {
    let mut cdf = Vec::with_capacity(pages as usize);
    let mut total = 0.0;
    for rank in 1..=pages {
        total += 1.0 / (rank as f64).powf(s);
        cdf.push(total);
    }
    let mut rng = Rng(seed | 1);
    let place = rng.permutation(pages);
    (0..len)
        .map(|_| {
            let x = rng.unit() * total;
            let rank = cdf.partition_point(|&c| c < x).min(pages as usize - 1);
            place[rank]
        })
        .collect()
}

fn zipf_run(budget: u64, policy: ReclaimPolicy, trace: &[u64], pages: u64) -> Result<Run, String> {
    let rss = Rss::start();
    let cache = build(budget, policy)?;
    let backend = Synthetic::new(pages * PAGE, 4);
    let file = open(&cache, &backend)?;
    let mut handle = file.handle();
    handle.advise(Advice::Random).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; PAGE as usize];
    let (mut sampled, mut samples) = (0u64, 0u64);
    for (k, &page) in trace.iter().enumerate() {
        handle
            .read_at(&mut buf, page * PAGE)
            .map_err(|e| e.to_string())?;
        check(&buf, &backend, page * PAGE)?;
        if k % 1024 == 0 {
            sampled += folio_pages(&cache);
            samples += 1;
        }
    }
    let misses = backend.pages_served.load(Ordering::Relaxed);
    let rss_delta = rss.growth();
    Ok(Run {
        hit_ratio: 1.0 - misses as f64 / trace.len() as f64,
        rss_delta,
        peak_reset: rss.reset,
        folio_pages: sampled as f64 / samples.max(1) as f64,
        counters: cache.reclaim_stats(),
        scan: None,
    })
}

/// The simulated policies set beside the real cache on the Zipf traces.
const SIMULATED: [&str; 5] = [
    "lru (simulated)",
    "arc (simulated)",
    "s3-fifo (simulated)",
    "sieve (simulated)",
    "belady (simulated)",
];

fn simulate(name: &str, trace: &[u64], capacity: usize) -> f64 {
    match name {
        "lru (simulated)" => policies::hit_ratio(&mut policies::Lru::new(capacity), trace),
        "arc (simulated)" => policies::hit_ratio(&mut policies::Arc::new(capacity), trace),
        "s3-fifo (simulated)" => policies::hit_ratio(&mut policies::S3Fifo::new(capacity), trace),
        "sieve (simulated)" => policies::hit_ratio(&mut policies::Sieve::new(capacity), trace),
        _ => policies::belady_hit_ratio(trace, capacity),
    }
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let budget: u64 = if args.full { 256 << 20 } else { 64 << 20 };
    let reps = args.reps().min(if args.full { 5 } else { 3 });
    let zipf_len_per_page = if args.full { 20 } else { 10 };
    let mut report = Report::new(
        "reclaim",
        json!({
            "budget_mib": budget >> 20,
            "hot_set": "40% of the arena",
            "scan": "4x the budget, 64 KiB reads",
            "hot_reads_per_scan_read": HOT_READS_PER_SCAN_READ,
            "zipf_file": "4x the budget",
            "zipf_reads": format!("{zipf_len_per_page}x the arena's pages"),
            "simulated_capacity": "the real cache's folio pages, averaged over its Zipf runs",
            "reps": reps,
        }),
    );
    let cases =
        2 * SYSTEMS.len() * reps + ZIPF_EXPONENTS.len() * (POLICIES.len() * reps + SIMULATED.len());
    let bar = ProgressBar::new(cases as u64).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("reclaim");
    let mut counters = serde_json::Map::new();
    let mut rss: Vec<(String, i64)> = Vec::new();
    let mut peak_reset = true;
    let mut plot_groups = Vec::new();
    for case in ["hot+scan", "shift"] {
        let mut group = Vec::new();
        for (name, policy, placed) in SYSTEMS {
            let mut ratios = Vec::new();
            let mut last = None;
            for rep in 0..reps {
                bar.set_message(format!("{case} {name}"));
                let seed = 0x5EED + rep as u64;
                let run = if case == "shift" {
                    shift(budget, policy, placed, seed)?
                } else {
                    hot_scan(budget, policy, placed, seed)?
                };
                ratios.push(100.0 * run.hit_ratio);
                rss.push((format!("{case} {name}"), run.rss_delta));
                peak_reset &= run.peak_reset;
                last = Some(run);
                bar.inc(1);
            }
            let figure = Figure::new(case, name, HOT_METRIC, &ratios, 0);
            group.push((name.to_string(), figure.median));
            report.results.push(figure);
            if let Some(run) = last {
                let mut text = format!("{:?}", run.counters);
                if let Some(scan) = &run.scan {
                    text = format!("{text}; {scan}");
                }
                counters.insert(format!("{case} {name}"), json!(text));
            }
        }
        plot_groups.push((case.to_string(), group));
    }
    for s in ZIPF_EXPONENTS {
        let case = format!("zipf s={s}");
        let mut group = Vec::new();
        let mut capacities = Vec::new();
        let mut traces = Vec::new();
        // The arena's pages, from a cache like the runs' (the trace length scales with them).
        let arena = build(budget, ReclaimPolicy::Workingset)?
            .stats()
            .total_pages;
        let file_pages = 4 * budget / PAGE;
        for rep in 0..reps {
            traces.push(zipf_trace(
                file_pages,
                s,
                (arena * zipf_len_per_page) as usize,
                0xC0FFEE + rep as u64,
            ));
        }
        for (name, policy) in POLICIES {
            let mut ratios = Vec::new();
            for trace in &traces {
                bar.set_message(format!("{case} {name}"));
                let run = zipf_run(budget, policy, trace, file_pages)?;
                ratios.push(100.0 * run.hit_ratio);
                capacities.push(run.folio_pages);
                rss.push((format!("{case} {name}"), run.rss_delta));
                peak_reset &= run.peak_reset;
                bar.inc(1);
            }
            let figure = Figure::new(&case, name, "hit ratio %", &ratios, 0);
            group.push((name.to_string(), figure.median));
            report.results.push(figure);
        }
        let capacity =
            (capacities.iter().sum::<f64>() / capacities.len().max(1) as f64).round() as usize;
        let (low, high) = capacities
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &c| (l.min(c), h.max(c)));
        for name in SIMULATED {
            bar.set_message(format!("{case} {name}"));
            let values: Vec<f64> = traces
                .iter()
                .map(|t| 100.0 * simulate(name, t, capacity))
                .collect();
            let figure = Figure::new(&case, name, "hit ratio %", &values, 0);
            group.push((name.to_string(), figure.median));
            report.results.push(figure);
            bar.inc(1);
        }
        for name in SIMULATED {
            report.ratio(&case, "hit ratio %", "workingset", name);
        }
        report.notes.push(format!(
            "{case}: the simulated policies hold {capacity} pages, the real cache's folio pages \
             averaged over its runs (each run's average over time ranged {low:.0}–{high:.0}; \
             arena minus the index reserve)."
        ));
        plot_groups.push((case, group));
    }
    bar.finish_and_clear();
    for case in ["hot+scan", "shift"] {
        report.ratio(case, HOT_METRIC, "workingset", "clock");
        report.ratio(case, HOT_METRIC, "workingset", "two-lists");
        report.ratio(case, HOT_METRIC, "workingset, placed", "workingset");
        report.ratio(case, HOT_METRIC, "clock, placed", "clock");
    }
    let worst = rss.iter().max_by_key(|(_, d)| *d).cloned();
    if let Some((run, delta)) = worst {
        let over = delta - budget as i64;
        report.results.push(Figure::new(
            "memory",
            "peak RSS growth",
            "MiB",
            &[delta as f64 / f64::from(1 << 20)],
            0,
        ));
        report.notes.push(format!(
            "resident memory: the largest growth of the process's peak RSS (VmHWM{}) over the \
             RSS before a run was {:.1} MiB ({run}) against a budget of {} MiB: {} by \
             {:.1} MiB; the README's bound is the budget plus {} MiB of fixed overhead: {}.",
            if peak_reset {
                ", reset before each run"
            } else {
                ": the kernel would not reset it, so it is the process's peak since its start"
            },
            delta as f64 / f64::from(1 << 20),
            budget >> 20,
            if over <= 0 { "under" } else { "over" },
            over.unsigned_abs() as f64 / f64::from(1 << 20),
            RSS_OVERHEAD >> 20,
            if over <= RSS_OVERHEAD as i64 {
                "met"
            } else {
                "NOT met"
            },
        ));
        counters.insert("peak_rss_growth_bytes".into(), json!(delta));
        counters.insert("peak_reset_per_run".into(), json!(peak_reset));
        counters.insert("budget_bytes".into(), json!(budget));
    }
    report.counters = serde_json::Value::Object(counters);
    report.plots.push(Plot {
        file: "reclaim.svg".into(),
        title: format!("reclaim: hit ratios, {} MiB budget", budget >> 20),
        unit: "hit ratio %".into(),
        groups: plot_groups,
    });
    Ok(report)
}

/// The summary's rows (reclaim): the hot set during a scan, the shifted working set, and the
/// Zipf hit ratios against the simulated policies; the memory peak against the budget.
pub(crate) fn summary(report: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    let pct = |f: Option<&Figure>| f.map(|f| format!("{:.1}%", f.median));
    for (case, set, goal) in [
        ("hot+scan", "hot-set", Some(90.0)),
        ("shift", "new-set", None),
    ] {
        let Some(ws) = report.figure(case, "workingset", HOT_METRIC) else {
            continue;
        };
        let mut row = Row::new("reclaim", format!("{case}: {set} hits, clock → workingset"))
            .before(pct(report.figure(case, "clock", HOT_METRIC)))
            .after(pct(Some(ws)))
            .ratio(Spread::of(ws, Unit::Points));
        if let Some(goal) = goal {
            row = row.at_least(goal);
        }
        rows.push(row);
    }
    for s in ZIPF_EXPONENTS {
        let case = format!("zipf s={s}");
        let Some(ws) = report.figure(&case, "workingset", "hit ratio %") else {
            continue;
        };
        let sim = |name: &str| report.figure(&case, name, "hit ratio %");
        let best = [
            "arc (simulated)",
            "s3-fifo (simulated)",
            "sieve (simulated)",
        ]
        .into_iter()
        .filter_map(|n| sim(n).map(|f| (n, f.median)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some(lru) = sim("lru (simulated)") {
            rows.push(
                Row::new("reclaim", format!("{case}: LRU (sim.) → workingset"))
                    .before(pct(Some(lru)))
                    .after(pct(Some(ws)))
                    .limit(pct(sim("belady (simulated)")).map(|b| format!("{b} opt")))
                    .ratio(Spread::single(ws.median / lru.median, Unit::Times))
                    .at_least(1.0),
            );
        }
        if let Some((name, best)) = best {
            rows.push(
                Row::new(
                    "reclaim",
                    format!(
                        "{case}: best sim. ({}) → workingset",
                        name.trim_end_matches(" (simulated)")
                    ),
                )
                .before(Some(format!("{best:.1}%")))
                .after(pct(Some(ws)))
                .ratio(Spread::single(ws.median / best, Unit::Times)),
            );
        }
    }
    if let (Some(peak), Some(budget)) = (
        report.figure("memory", "peak RSS growth", "MiB"),
        report
            .counters
            .get("budget_bytes")
            .and_then(serde_json::Value::as_u64),
    ) {
        let limit = (budget + RSS_OVERHEAD) as f64 / f64::from(1 << 20);
        rows.push(
            Row::new("reclaim", "peak RSS growth of a run vs the budget")
                .after(Some(format!("{:.1} MiB", peak.median)))
                .limit(Some(format!("{limit:.0} MiB")))
                .goal(
                    format!("≤ budget + {} MiB", RSS_OVERHEAD >> 20),
                    peak.median <= limit,
                ),
        );
    }
    rows
}
