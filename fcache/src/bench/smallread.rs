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
use super::measure::{Placement, Rounds, interleaved, run_threads};
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

/// The systems' names in the figures.
const OPTIMISTIC: &str = "foliocache/optimistic";
const FROZEN: &str = "foliocache/frozen-bit";
const CAS: &str = "foliocache/cas";
const KERNEL: &str = "kernel";
const CEILING: &str = "ceiling";
const SYSCALL: &str = "syscall";

/// A system smallread measures: what it is called, and the loop each of its threads runs.
trait Contender: Sync {
    /// The system's name in the figures.
    fn name(&self) -> &'static str;

    /// Thread `thread`'s loop, until `stop`; returns the operations it did.
    fn work(&self, thread: usize, stop: &AtomicBool) -> u64;

    /// Whether its time per operation is a figure too (`ns/op`): the kernel's and the syscall
    /// floor's, which the host's CPU and mitigations set.
    fn per_op_ns(&self) -> bool {
        false
    }
}

/// foliocache: 64-byte reads through a handle of its own per thread, on one of the two files
/// (FrozenBit or Cas refcounts), with or without a reference taken.
struct Foliocache<'a> {
    name: &'static str,
    file: &'a File,
    small_read: SmallReadPolicy,
}

impl Contender for Foliocache<'_> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn work(&self, _thread: usize, stop: &AtomicBool) -> u64 {
        read_loop(self.file, self.small_read, stop)
    }
}

/// The kernel: `pread` of 64 bytes at offset 0 of a tmpfs file, a descriptor per thread.
struct Kernel {
    fds: Vec<std::fs::File>,
}

impl Contender for Kernel {
    fn name(&self) -> &'static str {
        KERNEL
    }

    fn work(&self, thread: usize, stop: &AtomicBool) -> u64 {
        let fd = &self.fds[thread];
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

    fn per_op_ns(&self) -> bool {
        true
    }
}

/// The floor under any kernel figure: a `getppid` loop.
struct Syscall;

impl Contender for Syscall {
    fn name(&self) -> &'static str {
        SYSCALL
    }

    fn work(&self, _thread: usize, stop: &AtomicBool) -> u64 {
        let mut ops = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..16 {
                black_box(rustix::process::getppid());
            }
            ops += 16;
        }
        ops
    }

    fn per_op_ns(&self) -> bool {
        true
    }
}

/// The ceiling: each thread increments a counter of its own.
struct Ceiling;

impl Contender for Ceiling {
    fn name(&self) -> &'static str {
        CEILING
    }

    fn work(&self, _thread: usize, stop: &AtomicBool) -> u64 {
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

/// The case of a thread count.
fn case(threads: usize) -> String {
    format!("threads={threads}")
}

/// The rotation's samples: total ops/s of each (thread count index, system index) pair.
struct Measured {
    pairs: Vec<(usize, usize)>,
    /// The systems' names, by index.
    names: Vec<&'static str>,
    rounds: Rounds<f64>,
    /// Whether every thread could be pinned to its CPU.
    all_pinned: bool,
}

impl Measured {
    /// The rotation's index of `system` (by name) at the `t`-th thread count.
    fn at(&self, t: usize, system: &str) -> Option<usize> {
        self.pairs
            .iter()
            .position(|&(pt, s)| pt == t && self.names[s] == system)
    }

    /// Records the comparisons between systems, per round: at each thread count frozen-bit over
    /// cas, optimistic over frozen-bit and over the kernel, and the kernel's cost above the
    /// syscall floor; and the optimistic read's scaling from 1 to 2 threads as a share of the
    /// ceiling's.
    fn compare(&self, report: &mut Report, threads: &[usize], reps: usize) {
        let rounds = &self.rounds;
        let samples = &rounds.samples;
        let at = |t: usize, system: &str| self.at(t, system);
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        for (t, &n) in threads.iter().enumerate() {
            let case = case(n);
            for (a, b) in [(FROZEN, CAS), (OPTIMISTIC, FROZEN), (OPTIMISTIC, KERNEL)] {
                if let (Some(ia), Some(ib)) = (at(t, a), at(t, b)) {
                    rounds.paired(report, &case, (ia, a), (ib, b), |v| *v);
                }
            }
            // The kernel's cost above the syscall floor, per round (ns per read per thread).
            if let (Some(k), Some(f)) = (at(t, KERNEL), at(t, SYSCALL)) {
                let above: Vec<f64> = samples[k]
                    .iter()
                    .zip(&samples[f])
                    .map(|(kernel, floor)| n.min(cpus) as f64 * 1e9 * (1.0 / kernel - 1.0 / floor))
                    .collect();
                report.results.push(Figure::new(
                    &case,
                    KERNEL,
                    "ns_above_syscall",
                    &above,
                    rounds.busy_rounds(&[k, f]),
                ));
            }
        }
        // Scaling from 1 to 2 threads as a share of the ceiling's, per round.
        let at_n = |n: usize, system: &str| {
            threads
                .iter()
                .position(|&m| m == n)
                .and_then(|t| at(t, system))
        };
        if let (Some(o1), Some(o2), Some(c1), Some(c2)) = (
            at_n(1, OPTIMISTIC),
            at_n(2, OPTIMISTIC),
            at_n(1, CEILING),
            at_n(2, CEILING),
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
    }
}

/// The measuring body: every (thread count, system) pair in one rotation, each measurement
/// `threads[t]` pinned threads running the system's loop for `time`. Records each pair's
/// ops/s, ops/s per thread and, where the system has one, its ns/op.
///
/// Every round measures every pair: the 1-thread and 2-thread figures of one round are taken
/// minutes apart at most, so the per-round scaling ratio is not skewed by the machine
/// drifting between a "1 thread" phase and a "2 threads" phase.
fn measure(
    report: &mut Report,
    systems: &[Box<dyn Contender + '_>],
    threads: &[usize],
    (time, reps, bar): (Duration, usize, &ProgressBar),
) -> Result<Measured, String> {
    let pairs: Vec<(usize, usize)> = (0..threads.len())
        .flat_map(|t| (0..systems.len()).map(move |k| (t, k)))
        .collect();
    let mut all_pinned = true;
    let rounds = interleaved(reps, pairs.len(), bar, |which| {
        let (t, system) = pairs[which];
        let system = &systems[system];
        let work = |thread: usize, stop: &AtomicBool| system.work(thread, stop);
        let (ops, pinned) = run_threads(threads[t], time, Placement::Pinned, &work);
        all_pinned &= pinned;
        Ok(ops)
    })?;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    for (which, &(t, system)) in pairs.iter().enumerate() {
        let n = threads[t];
        let case = case(n);
        let system = &systems[system];
        let name = system.name();
        report
            .results
            .push(rounds.figure(&case, (which, name), "ops/s", |v| *v));
        report
            .results
            .push(rounds.figure(&case, (which, name), "ops/s/thread", |v| v / n as f64));
        if system.per_op_ns() {
            // The time per operation on a CPU: threads beyond the CPUs only share them.
            let busy_cpus = n.min(cpus) as f64;
            report
                .results
                .push(rounds.figure(&case, (which, name), "ns/op", |v| busy_cpus / v * 1e9));
        }
    }
    Ok(Measured {
        pairs,
        names: systems.iter().map(|s| s.name()).collect(),
        rounds,
        all_pinned,
    })
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
    let systems: Vec<Box<dyn Contender + '_>> = vec![
        Box::new(Foliocache {
            name: OPTIMISTIC,
            file: &frozen,
            small_read: SmallReadPolicy::Optimistic,
        }),
        Box::new(Foliocache {
            name: FROZEN,
            file: &frozen,
            small_read: SmallReadPolicy::Refcounted,
        }),
        Box::new(Foliocache {
            name: CAS,
            file: &cas,
            small_read: SmallReadPolicy::Refcounted,
        }),
        Box::new(Kernel { fds: kernel_fds }),
        Box::new(Ceiling),
        Box::new(Syscall),
    ];
    let bar = ProgressBar::new((threads.len() * systems.len() * (reps + 1)) as u64).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("smallread");
    bar.set_message("all thread counts, interleaved");
    let before = frozen.mapping_stats().optimistic_retries;
    let measured = measure(&mut report, &systems, &threads, (time, reps, &bar))?;
    let retries =
        vec![json!({"optimistic_retries": frozen.mapping_stats().optimistic_retries - before})];
    measured.compare(&mut report, &threads, reps);
    bar.finish_and_clear();
    let _ = std::fs::remove_file(&kernel_path);
    report.counters = json!({
        "threads_pinned": measured.all_pinned,
        "optimistic_retries": retries,
        "frozen_bit_file": frozen.mapping_stats().lookups,
    });
    report.notes.push(seed_table(&report, &threads));
    report.notes.push(bars(&report, &threads));
    if !measured.all_pinned {
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
    let plot = plot(&report, &threads);
    report.plots.push(plot);
    Ok(report)
}

/// The plot: total ops/s of the foliocache reads and the kernel, by thread count.
fn plot(report: &Report, threads: &[usize]) -> Plot {
    Plot {
        file: "smallread.svg".into(),
        title: "64-byte reads of one shared page: total ops/s by threads".into(),
        unit: "million reads/s (all threads)".into(),
        groups: threads
            .iter()
            .map(|&n| {
                let case = case(n);
                let bars = [OPTIMISTIC, FROZEN, CAS, KERNEL]
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
    }
}

fn ops(report: &Report, threads: usize, system: &str) -> Option<f64> {
    report
        .figure(&case(threads), system, "ops/s")
        .map(|f| f.median)
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
        let m = |s: &str| ops(report, n, s).unwrap_or(f64::NAN);
        let boost = report.paired_ratio(&case(n), FROZEN, CAS).map_or_else(
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
            .figure(&case(n), KERNEL, "ns_above_syscall")
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
    if let Some(f) = report.paired_ratio(&case(1), OPTIMISTIC, KERNEL) {
        lines.push(format!(
            "- {} 1 thread: foliocache ≥ 10× kernel pread: {}",
            mark(f.median >= 10.0),
            spread(f)
        ));
    }
    if threads.contains(&2) {
        if let Some(f) = report.paired_ratio(&case(2), FROZEN, CAS) {
            lines.push(format!(
                "- {} 2 threads: frozen-bit ≥ cas: {}",
                mark(f.median >= 1.0),
                spread(f)
            ));
        }
        if let Some(f) = report.paired_ratio(&case(2), OPTIMISTIC, FROZEN) {
            lines.push(format!(
                "- {} 2 threads: optimistic ≥ 1.5× frozen-bit: {}",
                mark(f.median >= 1.5),
                spread(f)
            ));
        }
        if let (Some(o1), Some(o2), Some(c1), Some(c2)) = (
            ops(report, 1, OPTIMISTIC),
            ops(report, 2, OPTIMISTIC),
            ops(report, 1, CEILING),
            ops(report, 2, CEILING),
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
    let fig = |n: usize, s: &str| report.figure(&case(n), s, "ops/s");
    if let Some(f) = report.paired_ratio(&case(1), OPTIMISTIC, KERNEL) {
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
    if let Some(f) = report.paired_ratio(&case(2), FROZEN, CAS) {
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
    if let Some(f) = report.paired_ratio(&case(2), OPTIMISTIC, FROZEN) {
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
