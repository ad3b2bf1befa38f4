//! `fcache bench smallread`: seed 002's will-it-scale benchmark, on this machine.
//!
//! N threads (pinned to CPUs round robin), each with its own handle on one shared file, loop
//! `read_at(64 bytes, offset 0)` for a fixed time: every read hits the same folio, so the cost
//! of taking a reference on it (its count's cache line moving between cores) is what is
//! measured. Systems, interleaved in every repetition:
//! * `foliocache/optimistic`: the read takes no reference (`SmallReadPolicy::Optimistic`);
//! * `foliocache/frozen-bit`: a referenced read, `try_get` one `fetch_add` (seed 002, after);
//! * `foliocache/cas`: a referenced read, `try_get` a CAS loop (seed 002, before);
//! * `kernel`: `pread` of 64 bytes at offset 0 of one tmpfs file (`/dev/shm`);
//! * `ceiling`: each thread increments a private counter: what N threads can do here when they
//!   share nothing.

use super::BenchArgs;
use super::report::{Figure, Placement, Plot, Report, fmt, interleaved, run_threads};
use foliocache::{Cache, File, Policy, RefcountPolicy, SmallReadPolicy};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::fmt::Write as _;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const SYSTEMS: [&str; 5] = [
    "foliocache/optimistic",
    "foliocache/frozen-bit",
    "foliocache/cas",
    "kernel",
    "ceiling",
];

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
        Duration::from_millis(200)
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
    let (samples, busy) = interleaved(reps, pairs.len(), &bar, |which| {
        let (t, system) = pairs[which];
        let work = |stop: &AtomicBool| -> u64 {
            match system {
                0 => read_loop(&frozen, SmallReadPolicy::Optimistic, stop),
                1 => read_loop(&frozen, SmallReadPolicy::Refcounted, stop),
                2 => read_loop(&cas, SmallReadPolicy::Refcounted, stop),
                3 => {
                    let mut buf = [0u8; 64];
                    let mut ops = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..16 {
                            black_box(kernel.read_at(&mut buf, 0).unwrap_or(0));
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
    for (which, &(t, system)) in pairs.iter().enumerate() {
        let n = threads[t];
        let case = format!("threads={n}");
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
    }
    for &n in &threads {
        let case = format!("threads={n}");
        report.ratio(&case, "ops/s", SYSTEMS[1], SYSTEMS[2]);
        report.ratio(&case, "ops/s", SYSTEMS[0], SYSTEMS[1]);
        report.ratio(&case, "ops/s", SYSTEMS[0], SYSTEMS[3]);
    }
    // Scaling from 1 to 2 threads as a share of the ceiling's, per round.
    let at = |n: usize, system: usize| {
        threads
            .iter()
            .position(|&m| m == n)
            .and_then(|t| pairs.iter().position(|&p| p == (t, system)))
    };
    if let (Some(o1), Some(o2), Some(c1), Some(c2)) = (at(1, 0), at(2, 0), at(1, 4), at(2, 4)) {
        let shares: Vec<f64> = (0..reps)
            .map(|r| (samples[o2][r] / samples[o1][r]) / (samples[c2][r] / samples[c1][r]))
            .collect();
        report.results.push(Figure::new(
            "scaling/2-vs-1-thread",
            "foliocache/optimistic÷ceiling",
            "paired_share",
            &shares,
            busy,
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

fn median(report: &Report, threads: usize, system: &str) -> Option<f64> {
    report
        .figure(&format!("threads={threads}"), system, "ops/s")
        .map(|f| f.median)
}

/// Seed 002's table (#threads, before, after, boost %), plus the optimistic read, the kernel
/// and the ceiling, in millions of reads per second.
fn seed_table(report: &Report, threads: &[usize]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| #threads | cas (before) | frozen-bit (after) | boost | optimistic | kernel pread | ceiling |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|");
    for &n in threads {
        let m = |s: &str| median(report, n, s).unwrap_or(f64::NAN);
        let (cas, frozen) = (m(SYSTEMS[2]), m(SYSTEMS[1]));
        let _ = writeln!(
            out,
            "| {n} | {} M/s | {} M/s | {:+.1}% | {} M/s | {} M/s | {} M/s |",
            fmt(cas / 1e6),
            fmt(frozen / 1e6),
            (frozen / cas - 1.0) * 100.0,
            fmt(m(SYSTEMS[0]) / 1e6),
            fmt(m(SYSTEMS[3]) / 1e6),
            fmt(m(SYSTEMS[4]) / 1e6),
        );
    }
    out
}

/// The bars, checked against this run's medians.
fn bars(report: &Report, threads: &[usize]) -> String {
    let mut lines = Vec::new();
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    if let (Some(best), Some(kernel)) =
        (median(report, 1, SYSTEMS[0]), median(report, 1, SYSTEMS[3]))
    {
        lines.push(format!(
            "- {} 1 thread: foliocache ≥ 10× kernel pread: {:.1}×",
            mark(best >= 10.0 * kernel),
            best / kernel
        ));
    }
    if threads.contains(&2) {
        if let (Some(frozen), Some(cas)) =
            (median(report, 2, SYSTEMS[1]), median(report, 2, SYSTEMS[2]))
        {
            lines.push(format!(
                "- {} 2 threads: frozen-bit ≥ cas: {:.2}×",
                mark(frozen >= cas),
                frozen / cas
            ));
        }
        if let (Some(opt), Some(frozen)) =
            (median(report, 2, SYSTEMS[0]), median(report, 2, SYSTEMS[1]))
        {
            lines.push(format!(
                "- {} 2 threads: optimistic ≥ 1.5× frozen-bit: {:.2}×",
                mark(opt >= 1.5 * frozen),
                opt / frozen
            ));
        }
        if let (Some(o1), Some(o2), Some(c1), Some(c2)) = (
            median(report, 1, SYSTEMS[0]),
            median(report, 2, SYSTEMS[0]),
            median(report, 1, SYSTEMS[4]),
            median(report, 2, SYSTEMS[4]),
        ) {
            let (scale, ceiling) = (o2 / o1, c2 / c1);
            // Judged on the per-round paired share when measured (both thread counts of the
            // same round); the ratio of medians is shown beside it.
            let share = report
                .figure(
                    "scaling/2-vs-1-thread",
                    "foliocache/optimistic÷ceiling",
                    "paired_share",
                )
                .map_or(scale / ceiling, |f| f.median);
            lines.push(format!(
                "- {} scaling: optimistic 2/1 threads {scale:.2}× vs the ceiling's {ceiling:.2}× ({:.0}% from medians), paired per round {:.0}% ≥ 90%",
                mark(share >= 0.9),
                scale / ceiling * 100.0,
                share * 100.0
            ));
        }
    }
    format!(
        "Bars (issue #5), from this run's medians:\n\n{}",
        lines.join("\n")
    )
}
