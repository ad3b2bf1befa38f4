//! `fcache bench smallread`: seed 002's will-it-scale benchmark, on this machine.
//!
//! N threads (pinned to CPUs round robin), each with its own handle on one shared file, loop
//! `read_at(64 bytes, offset 0)` for a fixed time: every read hits the same folio, so the cost
//! of taking a reference on it (its count's cache line moving between cores) is what is
//! measured. Systems, interleaved in every repetition:
//! * `foliocache/optimistic`: the read takes no reference (`SmallReadPolicy::Optimistic`);
//! * `foliocache/frozen-bit`: a referenced read, `try_get` one `fetch_add` (seed 002, after);
//! * `foliocache/cas`: a referenced read, `try_get` a CAS loop (seed 002, before);
//! * `kernel`: `pread` of 64 bytes at offset 0 of one tmpfs file (`/dev/shm`), each thread
//!   with its own file descriptor (will-it-scale opens the file in each thread: a shared
//!   `struct file` would add a contended cache line the seed does not have);
//! * `syscall`: a `getppid` loop, the cheapest system call: the floor under any kernel figure
//!   on this host (its CPU and mitigations set it: about 75 ns on one host of this VM's kind,
//!   167 ns on another), so the report also states each kernel figure's cost above it;
//! * `ceiling`: each thread increments a private counter: what N threads can do here when they
//!   share nothing.
//!
//! Every round measures every (threads, system) pair; the comparisons between systems are
//! medians of per-round ratios with their spread.

use super::BenchArgs;
use super::measure::{Placement, interleaved, run_threads};
use super::report::{Figure, Plot, Report, fmt};
use super::summary::{Row, Spread, Unit, value};
use foliocache::{Cache, File, Policy, RefcountPolicy, SmallReadPolicy};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::fmt::Write as _;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const SYSTEMS: [&str; 6] = [
    "foliocache/optimistic",
    "foliocache/frozen-bit",
    "foliocache/cas",
    "kernel",
    "ceiling",
    "syscall",
];
/// Indexes into [`SYSTEMS`].
const OPTIMISTIC: usize = 0;
const FROZEN: usize = 1;
const CAS: usize = 2;
const KERNEL: usize = 3;
const CEILING: usize = 4;
const SYSCALL: usize = 5;

fn read_loop(file: &File, small_read: SmallReadPolicy, stop: &AtomicBool) -> u64 {
    let mut handle = file.handle();
    handle.set_small_read_policy(small_read);
    let mut buf = [0u8; 64];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..64 {
            let got = handle.read_at(&mut buf, 0).unwrap_or(0);
            black_box((got, &buf));
        }
        n += 64;
    }
    n
}

fn memory_file(refcount: RefcountPolicy) -> Result<(Cache, File), String> {
    let cache = Cache::builder()
        .capacity(4 << 20)
        .prefault(true)
        .policy(Policy {
            refcount,
            ..Policy::default()
        })
        .build()
        .map_err(|e| e.to_string())?;
    let file = cache.create_memory_file(0).map_err(|e| e.to_string())?;
    file.write_at(&[0x5A; 4096], 0).map_err(|e| e.to_string())?;
    Ok((cache, file))
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let time = if args.full {
        Duration::from_millis(1000)
    } else {
        Duration::from_millis(120)
    };
    let reps = args.reps();
    let threads: Vec<usize> = args.threads.clone().map_or_else(
        || vec![1, 2, 4],
        |t| t.into_iter().map(|n| n as usize).collect(),
    );
    let mut report = Report::new(
        "smallread",
        json!({
            "read_bytes": 64,
            "seconds_per_measurement": time.as_secs_f64(),
            "reps": reps,
            "threads": threads,
        }),
    );
    let bar = ProgressBar::new((threads.len() * SYSTEMS.len() * (reps + 1)) as u64).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("smallread");

    let (_frozen_cache, frozen) = memory_file(RefcountPolicy::FrozenBit)?;
    let (_cas_cache, cas) = memory_file(RefcountPolicy::Cas)?;
    let kernel_path = std::path::PathBuf::from("/dev/shm")
        .join(format!("fcache-smallread-{}", std::process::id()));
    let kernel = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&kernel_path)
        .map_err(|e| format!("cannot create {}: {e}", kernel_path.display()))?;
    kernel
        .write_all_at(&[0x5A; 4096], 0)
        .map_err(|e| e.to_string())?;
    // One descriptor per thread, opened before the clock starts.
    let max_threads = threads.iter().copied().max().unwrap_or(1);
    let kernel_fds: Vec<std::fs::File> = (0..max_threads)
        .map(|_| std::fs::File::open(&kernel_path))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot open {}: {e}", kernel_path.display()))?;
    let mut all_pinned = true;
    let mut retries = Vec::new();

    // Every round measures every (threads, system) pair, rotating: the 1-thread and 2-thread
    // figures of one round are taken minutes apart at most, so the per-round scaling ratio is
    // not skewed by the machine drifting between a "1 thread" phase and a "2 threads" phase.
    let pairs: Vec<(usize, usize)> = (0..threads.len())
        .flat_map(|t| (0..SYSTEMS.len()).map(move |k| (t, k)))
        .collect();
    bar.set_message("all thread counts, interleaved");
    let before = frozen.mapping_stats().optimistic_retries;
    let rounds = interleaved(reps, pairs.len(), &bar, |which| {
        let (t, system) = pairs[which];
        let work = |thread: usize, stop: &AtomicBool| -> u64 {
            match system {
                OPTIMISTIC => read_loop(&frozen, SmallReadPolicy::Optimistic, stop),
                FROZEN => read_loop(&frozen, SmallReadPolicy::Refcounted, stop),
                CAS => read_loop(&cas, SmallReadPolicy::Refcounted, stop),
                KERNEL => {
                    let fd = &kernel_fds[thread];
                    let mut buf = [0u8; 64];
                    let mut ops = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..16 {
                            black_box(fd.read_at(&mut buf, 0).unwrap_or(0));
                        }
                        ops += 16;
                    }
                    ops
                }
                SYSCALL => {
                    let mut ops = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..16 {
                            black_box(rustix::process::getppid());
                        }
                        ops += 16;
                    }
                    ops
                }
                _ => {
                    // Share nothing: a counter on this thread's own cache line.
                    let private = crossbeam_utils::CachePadded::new(AtomicU64::new(0));
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            private.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    private.load(Ordering::Relaxed)
                }
            }
        };
        let (ops, pinned) = run_threads(threads[t], time, Placement::Pinned, &work);
        all_pinned &= pinned;
        Ok(ops)
    })?;
    retries.push(json!({"optimistic_retries": frozen.mapping_stats().optimistic_retries - before}));
    let samples = &rounds.samples;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    for (which, &(t, system)) in pairs.iter().enumerate() {
        let n = threads[t];
        let case = format!("threads={n}");
        let busy = rounds.busy_count(which);
        report.results.push(Figure::new(
            &case,
            SYSTEMS[system],
            "ops/s",
            &samples[which],
            busy,
        ));
        let per_thread: Vec<f64> = samples[which].iter().map(|v| v / n as f64).collect();
        report.results.push(Figure::new(
            &case,
            SYSTEMS[system],
            "ops/s/thread",
            &per_thread,
            busy,
        ));
        if system == KERNEL || system == SYSCALL {
            // The time per operation on a CPU: threads beyond the CPUs only share them.
            let busy_cpus = n.min(cpus) as f64;
            let ns: Vec<f64> = samples[which].iter().map(|v| busy_cpus / v * 1e9).collect();
            report
                .results
                .push(Figure::new(&case, SYSTEMS[system], "ns/op", &ns, busy));
        }
    }
    let index = |t: usize, system: usize| {
        pairs
            .iter()
            .position(|&p| p == (t, system))
            .unwrap_or_default()
    };
    for (t, &n) in threads.iter().enumerate() {
        let case = format!("threads={n}");
        for (a, b) in [(FROZEN, CAS), (OPTIMISTIC, FROZEN), (OPTIMISTIC, KERNEL)] {
            let (ia, ib) = (index(t, a), index(t, b));
            report.paired(
                &case,
                (SYSTEMS[a], &samples[ia]),
                (SYSTEMS[b], &samples[ib]),
                rounds.busy_rounds(&[ia, ib]),
            );
        }
        // The kernel's cost above the syscall floor, per round (ns per read per thread).
        let (k, f) = (index(t, KERNEL), index(t, SYSCALL));
        let above: Vec<f64> = samples[k]
            .iter()
            .zip(&samples[f])
            .map(|(kernel, floor)| n.min(cpus) as f64 * 1e9 * (1.0 / kernel - 1.0 / floor))
            .collect();
        report.results.push(Figure::new(
            &case,
            "kernel",
            "ns_above_syscall",
            &above,
            rounds.busy_rounds(&[k, f]),
        ));
    }
    // Scaling from 1 to 2 threads as a share of the ceiling's, per round.
    let at = |n: usize, system: usize| {
        threads
            .iter()
            .position(|&m| m == n)
            .and_then(|t| pairs.iter().position(|&p| p == (t, system)))
    };
    if let (Some(o1), Some(o2), Some(c1), Some(c2)) = (
        at(1, OPTIMISTIC),
        at(2, OPTIMISTIC),
        at(1, CEILING),
        at(2, CEILING),
    ) {
        let shares: Vec<f64> = (0..reps)
            .map(|r| (samples[o2][r] / samples[o1][r]) / (samples[c2][r] / samples[c1][r]))
            .collect();
        report.results.push(Figure::new(
            "scaling/2-vs-1-thread",
            "foliocache/optimistic÷ceiling",
            "paired_share",
            &shares,
            rounds.busy_rounds(&[o1, o2, c1, c2]),
        ));
    }
    bar.finish_and_clear();
    let _ = std::fs::remove_file(&kernel_path);
    report.counters = json!({
        "threads_pinned": all_pinned,
        "optimistic_retries": retries,
        "frozen_bit_file": frozen.mapping_stats().lookups,
    });
    report.notes.push(seed_table(&report, &threads));
    report.notes.push(bars(&report, &threads));
    if !all_pinned {
        report
            .notes
            .push("Threads could not all be pinned to CPUs on this machine.".into());
    }
    report.notes.push(
        "Ratios between systems are medians of per-round ratios (both measured in the same \
         round), with their min–max; `ns_above_syscall` is the kernel's time per read minus a \
         getppid's, per round (CPU time: with more threads than CPUs, the threads share them): \
         what the page cache costs beyond entering the kernel on this host."
            .into(),
    );
    report.plots.push(Plot {
        file: "smallread.svg".into(),
        title: "64-byte reads of one shared page: total ops/s by threads".into(),
        unit: "million reads/s (all threads)".into(),
        groups: threads
            .iter()
            .map(|n| {
                let case = format!("threads={n}");
                let bars = SYSTEMS[..4]
                    .iter()
                    .filter_map(|s| {
                        report
                            .figure(&case, s, "ops/s")
                            .map(|f| ((*s).to_string(), f.median / 1e6))
                    })
                    .collect();
                (format!("{n} thread(s)"), bars)
            })
            .collect(),
    });
    Ok(report)
}

fn ops(report: &Report, threads: usize, system: &str) -> Option<f64> {
    report
        .figure(&format!("threads={threads}"), system, "ops/s")
        .map(|f| f.median)
}

/// The per-round paired ratio `a ÷ b` at `threads`.
fn paired(report: &Report, threads: usize, a: usize, b: usize) -> Option<&Figure> {
    report.paired_ratio(&format!("threads={threads}"), SYSTEMS[a], SYSTEMS[b])
}

fn spread(f: &Figure) -> String {
    format!("{:.2}× ({:.2}–{:.2})", f.median, f.min, f.max)
}

/// Seed 002's table (#threads, before, after, boost), plus the optimistic read, the kernel,
/// the syscall floor and the ceiling, in millions of reads per second.
fn seed_table(report: &Report, threads: &[usize]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| #threads | cas (before) | frozen-bit (after) | boost, per round (min–max) | optimistic | kernel pread | getppid | kernel above the floor | ceiling |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in threads {
        let m = |s: usize| ops(report, n, SYSTEMS[s]).unwrap_or(f64::NAN);
        let boost = paired(report, n, FROZEN, CAS).map_or_else(
            || "–".into(),
            |f| {
                format!(
                    "{:+.1}% ({:+.1}–{:+.1})",
                    (f.median - 1.0) * 100.0,
                    (f.min - 1.0) * 100.0,
                    (f.max - 1.0) * 100.0
                )
            },
        );
        let above = report
            .figure(&format!("threads={n}"), "kernel", "ns_above_syscall")
            .map_or_else(|| "–".into(), |f| format!("{} ns", fmt(f.median)));
        let _ = writeln!(
            out,
            "| {n} | {} M/s | {} M/s | {boost} | {} M/s | {} M/s | {} M/s | {above} | {} M/s |",
            fmt(m(CAS) / 1e6),
            fmt(m(FROZEN) / 1e6),
            fmt(m(OPTIMISTIC) / 1e6),
            fmt(m(KERNEL) / 1e6),
            fmt(m(SYSCALL) / 1e6),
            fmt(m(CEILING) / 1e6),
        );
    }
    out
}

/// The bars, checked against this run: comparisons between systems on the median of
/// per-round ratios (shown with their spread).
fn bars(report: &Report, threads: &[usize]) -> String {
    let mut lines = Vec::new();
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    if let Some(f) = paired(report, 1, OPTIMISTIC, KERNEL) {
        lines.push(format!(
            "- {} 1 thread: foliocache ≥ 10× kernel pread: {}",
            mark(f.median >= 10.0),
            spread(f)
        ));
    }
    if threads.contains(&2) {
        if let Some(f) = paired(report, 2, FROZEN, CAS) {
            lines.push(format!(
                "- {} 2 threads: frozen-bit ≥ cas: {}",
                mark(f.median >= 1.0),
                spread(f)
            ));
        }
        if let Some(f) = paired(report, 2, OPTIMISTIC, FROZEN) {
            lines.push(format!(
                "- {} 2 threads: optimistic ≥ 1.5× frozen-bit: {}",
                mark(f.median >= 1.5),
                spread(f)
            ));
        }
        if let (Some(o1), Some(o2), Some(c1), Some(c2)) = (
            ops(report, 1, SYSTEMS[OPTIMISTIC]),
            ops(report, 2, SYSTEMS[OPTIMISTIC]),
            ops(report, 1, SYSTEMS[CEILING]),
            ops(report, 2, SYSTEMS[CEILING]),
        ) {
            let (scale, ceiling) = (o2 / o1, c2 / c1);
            if let Some(share) = report.figure(
                "scaling/2-vs-1-thread",
                "foliocache/optimistic÷ceiling",
                "paired_share",
            ) {
                lines.push(format!(
                    "- {} scaling: optimistic 2/1 threads {scale:.2}× vs the ceiling's {ceiling:.2}× ({:.0}% from medians), per round {:.0}% ({:.0}–{:.0}%) ≥ 90%",
                    mark(share.median >= 0.9),
                    scale / ceiling * 100.0,
                    share.median * 100.0,
                    share.min * 100.0,
                    share.max * 100.0
                ));
            }
        }
    }
    format!(
        "Bars (issue #5), from this run (medians of per-round ratios, min–max):\n\n{}",
        lines.join("\n")
    )
}

/// The summary's rows (seed 002).
pub(crate) fn summary(report: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    let fig = |n: usize, s: usize| report.figure(&format!("threads={n}"), SYSTEMS[s], "ops/s");
    if let Some(f) = paired(report, 1, OPTIMISTIC, KERNEL) {
        let above = report.figure("threads=1", "kernel", "ns_above_syscall");
        rows.push(
            Row::new("002", "1 thread: vs kernel pread (M reads/s)")
                .after(value(fig(1, OPTIMISTIC), 1e-6, ""))
                .kernel(value(fig(1, KERNEL), 1e-6, ""))
                .limit(value(fig(1, SYSCALL), 1e-6, "getppid"))
                .ratio(Spread::of(f, Unit::Times))
                .at_least(10.0)
                .busy_from(&[Some(f), above]),
        );
        if let (Some(above), Some(floor)) = (above, report.figure("threads=1", "syscall", "ns/op"))
        {
            rows.push(
                Row::new("002", "kernel pread above the getppid floor")
                    .after(Some(format!(
                        "+{} ns ({}–{})",
                        fmt(above.median),
                        fmt(above.min),
                        fmt(above.max)
                    )))
                    .kernel(value(
                        report.figure("threads=1", "kernel", "ns/op"),
                        1.0,
                        "ns",
                    ))
                    .limit(value(Some(floor), 1.0, "ns"))
                    .busy_from(&[Some(above)]),
            );
        }
    }
    if let Some(f) = paired(report, 2, FROZEN, CAS) {
        rows.push(
            Row::new("002", "2 threads: frozen-bit vs cas (M/s)")
                .before(value(fig(2, CAS), 1e-6, ""))
                .after(value(fig(2, FROZEN), 1e-6, ""))
                .kernel(value(fig(2, KERNEL), 1e-6, ""))
                .ratio(Spread::of(f, Unit::Times))
                .at_least(1.0)
                .busy_from(&[Some(f)]),
        );
    }
    if let Some(f) = paired(report, 2, OPTIMISTIC, FROZEN) {
        rows.push(
            Row::new("002", "2 threads: optimistic vs frozen-bit")
                .before(value(fig(2, FROZEN), 1e-6, ""))
                .after(value(fig(2, OPTIMISTIC), 1e-6, ""))
                .limit(value(fig(2, CEILING), 1e-6, ""))
                .ratio(Spread::of(f, Unit::Times))
                .at_least(1.5)
                .busy_from(&[Some(f)]),
        );
    }
    if let Some(f) = report.figure(
        "scaling/2-vs-1-thread",
        "foliocache/optimistic÷ceiling",
        "paired_share",
    ) {
        rows.push(
            Row::new("002", "1→2 threads: share of the machine's scaling")
                .ratio(Spread::of(f, Unit::Percent))
                .at_least(0.9)
                .busy_from(&[Some(f)]),
        );
    }
    rows
}
