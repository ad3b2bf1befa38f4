//! How samples are taken: systems measured in rotation, an idle guard around every sample
//! (`docs/BENCHMARKS.md`'s protocol), threads released together, and CPU time.

use super::report::{Figure, Report};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the idle guard saw over one suite's run.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(crate) struct GuardStats {
    /// Samples taken under the guard.
    pub(crate) samples: usize,
    /// Samples measured again because the machine was busy during them.
    pub(crate) reruns: usize,
    /// Samples kept although the machine was busy (flagged in the figures).
    pub(crate) busy: usize,
}

static GUARD_SAMPLES: AtomicUsize = AtomicUsize::new(0);
static GUARD_RERUNS: AtomicUsize = AtomicUsize::new(0);
static GUARD_BUSY: AtomicUsize = AtomicUsize::new(0);

/// The idle guard's counts since the process started.
pub(crate) fn guard_snapshot() -> GuardStats {
    GuardStats {
        samples: GUARD_SAMPLES.load(Ordering::Relaxed),
        reruns: GUARD_RERUNS.load(Ordering::Relaxed),
        busy: GUARD_BUSY.load(Ordering::Relaxed),
    }
}

/// CPU time counters: the whole machine's (`/proc/stat`) and this process's (all its threads,
/// `/proc/self/stat`), in clock ticks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuTicks {
    /// user + nice + system + steal of all CPUs: time not ours is someone else's (steal is the
    /// hypervisor running another guest on our vCPU).
    used: u64,
    /// Everything: used + idle + iowait + irq + softirq.
    total: u64,
    /// This process's user + system, its waited-for children's included.
    own: u64,
}

impl CpuTicks {
    pub(crate) fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let v: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let at = |k: usize| v.get(k).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal. Interrupts are left out of "used":
        // they are mostly our own I/O completing.
        let used = at(0) + at(1) + at(2) + at(7);
        let total = (0..8).map(at).sum();
        let own_stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let after = own_stat.rsplit(')').next()?;
        let f: Vec<&str> = after.split_whitespace().collect();
        // utime, stime, and cutime, cstime: children we waited for (a db_bench run) are ours.
        let own = (11..=14)
            .map(|k| f.get(k).and_then(|v| v.parse::<u64>().ok()))
            .sum::<Option<u64>>()?;
        Some(Self { used, total, own })
    }

    /// Since `self`: (this process's ticks, other processes' ticks, all ticks of all CPUs).
    pub(crate) fn shares_since(&self) -> Option<(u64, u64, u64)> {
        let now = Self::now()?;
        let used = now.used.saturating_sub(self.used);
        let own = now.own.saturating_sub(self.own);
        Some((
            own,
            used.saturating_sub(own),
            now.total.saturating_sub(self.total).max(1),
        ))
    }

    /// What other processes used since `self`: (their ticks, all ticks of all CPUs).
    pub(crate) fn others_since(&self) -> Option<(u64, u64)> {
        let now = Self::now()?;
        let used = now.used.saturating_sub(self.used);
        let own = now.own.saturating_sub(self.own);
        Some((
            used.saturating_sub(own),
            now.total.saturating_sub(self.total).max(1),
        ))
    }
}

/// Whether `others` ticks of foreign CPU time out of `total` make a sample busy: more than 5%
/// of the machine, and at least 2 ticks (a tick is 10 ms; the machine's and the process's
/// counters round differently, so one tick is noise).
pub(crate) fn is_busy(others: u64, total: u64) -> bool {
    others >= 2 && others as f64 > 0.05 * total as f64
}

/// Consecutive busy samples, over the whole run (see [`IdleGuard`]).
static BUSY_STREAK: AtomicUsize = AtomicUsize::new(0);

/// One sample under the idle guard: `measure` runs, and runs again (at most twice more) if
/// other processes used the machine meanwhile; the last one is kept and flagged when it was
/// still busy. After three busy samples in a row (over the whole run) the guard stops
/// re-running until a clean one comes: a machine busy for minutes gets flagged figures, not a
/// run that never ends.
pub(crate) struct IdleGuard;

impl IdleGuard {
    const RERUNS: usize = 2;
    const STREAK: usize = 3;

    pub(crate) fn new() -> Self {
        Self
    }

    /// Measures under the guard: the value and whether it was taken on a busy machine.
    pub(crate) fn sample<T>(
        &mut self,
        mut measure: impl FnMut() -> Result<T, String>,
    ) -> Result<(T, bool), String> {
        let mut attempt = 0;
        loop {
            let start = CpuTicks::now();
            let value = measure()?;
            let busy = start
                .and_then(|s| s.others_since())
                .is_some_and(|(others, total)| is_busy(others, total));
            GUARD_SAMPLES.fetch_add(1, Ordering::Relaxed);
            if !busy {
                BUSY_STREAK.store(0, Ordering::Relaxed);
                return Ok((value, false));
            }
            let streak = BUSY_STREAK.fetch_add(1, Ordering::Relaxed) + 1;
            if attempt == Self::RERUNS || streak > Self::STREAK {
                GUARD_BUSY.fetch_add(1, Ordering::Relaxed);
                return Ok((value, true));
            }
            attempt += 1;
            GUARD_RERUNS.fetch_add(1, Ordering::Relaxed);
            wait_for_idle(Duration::from_secs(1));
        }
    }
}

/// The samples of systems measured in rotation, `[system][round]`, and which were taken while
/// the machine was busy.
#[derive(Debug)]
pub(crate) struct Rounds<T> {
    pub(crate) samples: Vec<Vec<T>>,
    pub(crate) busy: Vec<Vec<bool>>,
}

impl<T> Rounds<T> {
    /// Samples of system `k` taken on a busy machine.
    pub(crate) fn busy_count(&self, k: usize) -> usize {
        self.busy[k].iter().filter(|&&b| b).count()
    }

    /// Rounds in which any of `systems` had a busy sample (for figures combining them).
    pub(crate) fn busy_rounds(&self, systems: &[usize]) -> usize {
        let rounds = self.busy.first().map_or(0, Vec::len);
        (0..rounds)
            .filter(|&r| systems.iter().any(|&k| self.busy[k][r]))
            .count()
    }

    /// One metric of system `k`'s samples.
    pub(crate) fn metric(&self, k: usize, f: impl Fn(&T) -> f64) -> Vec<f64> {
        self.samples[k].iter().map(f).collect()
    }

    /// System `k`'s figure on `case`, under its name `system`: `metric`, taken from each of its
    /// samples by `value`.
    pub(crate) fn figure(
        &self,
        case: &str,
        (k, system): (usize, &str),
        metric: &str,
        value: impl Fn(&T) -> f64,
    ) -> Figure {
        Figure::new(
            case,
            system,
            metric,
            &self.metric(k, value),
            self.busy_count(k),
        )
    }

    /// Records the per-round ratio of system `a` over system `b` on `case` (see
    /// [`Report::paired`]), of the metric `value` takes from each sample.
    pub(crate) fn paired(
        &self,
        report: &mut Report,
        case: &str,
        (a, a_name): (usize, &str),
        (b, b_name): (usize, &str),
        value: impl Fn(&T) -> f64,
    ) {
        report.paired(
            case,
            (a_name, &self.metric(a, &value)),
            (b_name, &self.metric(b, &value)),
            self.busy_rounds(&[a, b]),
        );
    }
}

impl Rounds<f64> {
    /// Records every system's figure of `metric` on `case` (system `k` is named `names[k]`),
    /// then the per-round ratio of the first system over each other one.
    pub(crate) fn record_against_first(
        &self,
        report: &mut Report,
        case: &str,
        names: &[&str],
        metric: &str,
    ) {
        for (k, name) in names.iter().enumerate() {
            report
                .results
                .push(self.figure(case, (k, name), metric, |v| *v));
        }
        for (k, name) in names.iter().enumerate().skip(1) {
            self.paired(report, case, (0, names[0]), (k, name), |v| *v);
        }
    }
}

/// Samples of `systems` systems measured in rotation, `reps` times each (`docs/BENCHMARKS.md`'s
/// protocol): first a wait for an idle machine, then one warm-up round that is thrown away (an idle
/// core is slow to come back to speed on this VM), then the timed rounds back to back, each sample
/// under the [`IdleGuard`]. The rotation alternates direction (A B C, C B A, B C A, A C B, ...), so
/// no system always runs right after the same other one and inherits its leftovers (a kernel
/// `pread` run leaves caches and TLBs in another state than a foliocache run). `measure(k)`
/// measures system `k` once.
pub(crate) fn interleaved<T>(
    reps: usize,
    systems: usize,
    bar: &indicatif::ProgressBar,
    mut measure: impl FnMut(usize) -> Result<T, String>,
) -> Result<Rounds<T>, String> {
    let mut samples: Vec<Vec<T>> = (0..systems).map(|_| Vec::with_capacity(reps)).collect();
    let mut busy = vec![Vec::with_capacity(reps); systems];
    // Up to 3 s for an idle machine, or a moment when it has been busy for a while already
    // (waiting before every case would then only stretch the run).
    let known_busy = BUSY_STREAK.load(Ordering::Relaxed) > IdleGuard::STREAK;
    wait_for_idle(Duration::from_millis(if known_busy { 300 } else { 3000 }));
    for k in 0..systems {
        measure(k)?;
    }
    let mut guard = IdleGuard::new();
    for rep in 0..reps {
        for k in 0..systems {
            let step = if rep % 2 == 0 { k } else { systems - 1 - k };
            let which = (step + rep / 2) % systems;
            let (value, was_busy) = guard.sample(|| measure(which))?;
            samples[which].push(value);
            busy[which].push(was_busy);
            bar.inc(1);
        }
    }
    Ok(Rounds { samples, busy })
}

/// Where the threads of [`run_threads`] run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Pinned to CPUs round robin (best effort).
    Pinned,
    /// Wherever the scheduler puts them.
    Free,
}

/// Pins the calling thread to `cpu` (best effort: not every machine allows it).
fn pin_to(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity only
    // read and write that local set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Runs `work` on `threads` threads, released together, for `time`; returns total operations
/// per second and whether every thread was pinned as asked. `work(thread, stop)` loops until
/// `stop` and returns how many operations it did.
pub(crate) fn run_threads(
    threads: usize,
    time: Duration,
    placement: Placement,
    work: &(dyn Fn(usize, &std::sync::atomic::AtomicBool) -> u64 + Sync),
) -> (f64, bool) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let stop = AtomicBool::new(false);
    let start_line = std::sync::Barrier::new(threads + 1);
    let pinned = AtomicU64::new(0);
    let (ops, elapsed) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, start_line, pinned) = (&stop, &start_line, &pinned);
                s.spawn(move || {
                    if placement == Placement::Pinned && pin_to(t % cpus) {
                        pinned.fetch_add(1, Ordering::Relaxed);
                    }
                    start_line.wait();
                    work(t, stop)
                })
            })
            .collect();
        start_line.wait();
        let start = Instant::now();
        std::thread::sleep(time);
        stop.store(true, Ordering::Relaxed);
        let ops: u64 = workers.into_iter().map(|w| w.join().unwrap_or(0)).sum();
        (ops, start.elapsed())
    });
    let all_pinned =
        placement == Placement::Free || pinned.load(Ordering::Relaxed) == threads as u64;
    (ops as f64 / elapsed.as_secs_f64(), all_pinned)
}

/// Waits (up to `patience`) for the machine to be idle apart from us. Returns whether it was
/// busy when we gave up (the figures measured next are then flagged).
pub(crate) fn wait_for_idle(patience: Duration) -> bool {
    let start = Instant::now();
    loop {
        let Some(ticks) = CpuTicks::now() else {
            return false;
        };
        std::thread::sleep(Duration::from_millis(100));
        match ticks.others_since() {
            None => return false,
            Some((others, total)) if !is_busy(others, total) => return false,
            Some(_) if start.elapsed() >= patience => return true,
            Some(_) => {}
        }
    }
}

/// Keeps every CPU busy for a moment before a timed pass. On this VM a vCPU that idled (the
/// device pass mostly waits) is slow for a while when work comes back, which showed as a 30%
/// advantage for whichever system ran after a busy one (measured: the same policy in two
/// positions of the rotation).
pub(crate) fn settle() {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    std::thread::scope(|s| {
        for _ in 0..cpus {
            s.spawn(|| {
                let start = Instant::now();
                let mut x = 0u64;
                while start.elapsed() < std::time::Duration::from_millis(150) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            });
        }
    });
}

/// CPU time of the whole process (all threads), in seconds.
pub(crate) fn process_cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// CPU time of the calling thread, in seconds.
pub(crate) fn thread_cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_system_is_paired_with_each_other_per_round() {
        let rounds = Rounds {
            samples: vec![vec![4.0, 6.0], vec![2.0, 2.0], vec![4.0, 3.0]],
            busy: vec![vec![false, true], vec![false, false], vec![false, false]],
        };
        let mut report = Report::new("core", serde_json::json!({}));
        rounds.record_against_first(&mut report, "c", &["a", "b", "c"], "GiB/s");
        let figure = report.figure("c", "a", "GiB/s").unwrap();
        assert_eq!((figure.median, figure.busy_samples), (5.0, 1));
        assert!(report.figure("c", "c", "GiB/s").is_some());
        assert_eq!(report.paired_ratio("c", "a", "b").unwrap().median, 2.5);
        assert_eq!(
            report.paired_ratio("c", "a", "c").unwrap().samples,
            vec![1.0, 2.0]
        );
        assert!(report.paired_ratio("c", "b", "c").is_none());
    }

    #[test]
    fn busy_needs_two_ticks_and_five_percent() {
        assert!(!is_busy(0, 20));
        assert!(!is_busy(1, 12), "one tick is rounding noise");
        assert!(is_busy(2, 12));
        assert!(!is_busy(2, 100), "2% of the machine is idle enough");
        assert!(is_busy(6, 100));
    }
}
