//! Results: figures with medians and spread, the machine they ran on, and their output as a
//! Markdown table, JSON and an SVG bar plot.

use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// One figure: a metric of one system on one case, over repetitions.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Figure {
    pub(crate) case: String,
    pub(crate) system: String,
    pub(crate) metric: String,
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) runs: usize,
    /// Set when other work used the machine during a repetition (BENCH.md §7).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) busy: bool,
}

impl Figure {
    pub(crate) fn new(case: &str, system: &str, metric: &str, samples: &[f64], busy: bool) -> Self {
        assert!(!samples.is_empty());
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            f64::midpoint(sorted[n / 2 - 1], sorted[n / 2])
        };
        Self {
            case: case.into(),
            system: system.into(),
            metric: metric.into(),
            median,
            min: sorted[0],
            max: sorted[n - 1],
            runs: n,
            busy,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) cpu_model: String,
    pub(crate) kernel: String,
}

impl Machine {
    pub(crate) fn probe() -> Self {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".into(), |s| s.trim().to_string());
        Self {
            cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            cpu_model,
            kernel,
        }
    }
}

/// A ratio of two systems' medians, as the suites print it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Ratio {
    pub(crate) case: String,
    pub(crate) what: String,
    pub(crate) ratio: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) suite: &'static str,
    pub(crate) command: String,
    pub(crate) machine: Machine,
    pub(crate) sizes: serde_json::Value,
    pub(crate) results: Vec<Figure>,
    pub(crate) ratios: Vec<Ratio>,
    pub(crate) counters: serde_json::Value,
    #[serde(skip)]
    pub(crate) plots: Vec<Plot>,
    #[serde(skip)]
    pub(crate) notes: Vec<String>,
}

/// A grouped bar chart: groups along x, one bar per series in each group.
#[derive(Debug)]
pub(crate) struct Plot {
    pub(crate) file: String,
    pub(crate) title: String,
    pub(crate) unit: String,
    pub(crate) groups: Vec<(String, Vec<(String, f64)>)>,
}

impl Report {
    pub(crate) fn new(suite: &'static str, sizes: serde_json::Value) -> Self {
        Self {
            suite,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            machine: Machine::probe(),
            sizes,
            results: Vec::new(),
            ratios: Vec::new(),
            counters: serde_json::Value::Null,
            plots: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub(crate) fn figure(&self, case: &str, system: &str, metric: &str) -> Option<&Figure> {
        self.results
            .iter()
            .find(|f| f.case == case && f.system == system && f.metric == metric)
    }

    /// Records `a / b` of two systems' medians on one case and metric.
    pub(crate) fn ratio(&mut self, case: &str, metric: &str, a: &str, b: &str) {
        if let (Some(x), Some(y)) = (self.figure(case, a, metric), self.figure(case, b, metric)) {
            let ratio = x.median / y.median;
            self.ratios.push(Ratio {
                case: case.into(),
                what: format!("{a} / {b} ({metric})"),
                ratio,
            });
        }
    }

    /// The Markdown the suite prints.
    pub(crate) fn markdown(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        let _ = writeln!(out, "## fcache bench {}\n", self.suite);
        let _ = writeln!(out, "`{}`  ", self.command);
        let _ = writeln!(
            out,
            "machine: {} CPUs, {}, kernel {}  ",
            m.cpus, m.cpu_model, m.kernel
        );
        let _ = writeln!(out, "sizes: {}\n", self.sizes);
        let _ = writeln!(
            out,
            "| case | system | metric | median | min – max | runs |"
        );
        let _ = writeln!(out, "|---|---|---|---:|---:|---:|");
        for f in &self.results {
            let flag = if f.busy { " ⚠ busy" } else { "" };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} – {} | {}{} |",
                f.case,
                f.system,
                f.metric,
                fmt(f.median),
                fmt(f.min),
                fmt(f.max),
                f.runs,
                flag
            );
        }
        if !self.ratios.is_empty() {
            let _ = writeln!(out, "\n| case | ratio of medians | value |");
            let _ = writeln!(out, "|---|---|---:|");
            for r in &self.ratios {
                if r.ratio.is_finite() {
                    let _ = writeln!(out, "| {} | {} | {:.2}× |", r.case, r.what, r.ratio);
                } else {
                    let _ = writeln!(out, "| {} | {} | n/a (divisor is 0) |", r.case, r.what);
                }
            }
        }
        if !self.counters.is_null() {
            let _ = writeln!(out, "\ncounters: {}", self.counters);
        }
        for note in &self.notes {
            let _ = writeln!(out, "\n{note}");
        }
        out
    }

    /// Prints the table and writes the JSON and the plots.
    pub(crate) fn write(&self, json: &Path, plot_dir: &Path) -> Result<(), String> {
        println!("{}", self.markdown());
        if let Some(parent) = json.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(json, text).map_err(|e| format!("cannot write {}: {e}", json.display()))?;
        println!("JSON: {}", json.display());
        for plot in &self.plots {
            let path = plot_dir.join(&plot.file);
            std::fs::write(&path, svg_bars(plot))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            println!("plot: {}", path.display());
        }
        Ok(())
    }
}

/// Three significant digits, no exponent for the usual ranges.
pub(crate) fn fmt(x: f64) -> String {
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// A grouped bar chart as a standalone SVG.
fn svg_bars(plot: &Plot) -> String {
    const COLORS: [&str; 6] = [
        "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1",
    ];
    let series: Vec<String> = {
        let mut s: Vec<String> = Vec::new();
        for (_, bars) in &plot.groups {
            for (name, _) in bars {
                if !s.contains(name) {
                    s.push(name.clone());
                }
            }
        }
        s
    };
    let max = nice_ceiling(
        plot.groups
            .iter()
            .flat_map(|(_, b)| b.iter().map(|(_, v)| *v))
            .fold(0.0f64, f64::max),
    );
    let (left, top, plot_h, bar_w, gap) = (70.0, 50.0, 260.0, 28.0, 30.0);
    let group_w = bar_w * series.len() as f64 + gap;
    let width = (left + group_w * plot.groups.len() as f64 + 180.0)
        .max(left + 8.5 * plot.title.chars().count() as f64 + 20.0);
    let height = top + plot_h + 60.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="25" font-size="15" font-weight="bold">{}</text>"#,
        esc(&plot.title)
    );
    // Axis with 5 ticks.
    for k in 0..=5 {
        let v = max * f64::from(k) / 5.0;
        let y = top + plot_h - plot_h * f64::from(k) / 5.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/>"##,
            width - 170.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y + 4.0,
            fmt(v)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="15" y="{}" transform="rotate(-90 15 {})" text-anchor="middle">{}</text>"#,
        top + plot_h / 2.0,
        top + plot_h / 2.0,
        esc(&plot.unit)
    );
    for (g, (label, bars)) in plot.groups.iter().enumerate() {
        let x0 = left + gap / 2.0 + group_w * g as f64;
        for (name, value) in bars {
            let s = series.iter().position(|n| n == name).unwrap_or(0);
            let h = plot_h * value / max;
            let x = x0 + bar_w * s as f64;
            let _ = writeln!(
                svg,
                r#"<rect x="{x}" y="{}" width="{}" height="{h}" fill="{}"><title>{}: {}</title></rect>"#,
                top + plot_h - h,
                bar_w - 3.0,
                COLORS[s % COLORS.len()],
                esc(name),
                fmt(*value)
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            x0 + bar_w * series.len() as f64 / 2.0,
            top + plot_h + 18.0,
            esc(label)
        );
    }
    for (s, name) in series.iter().enumerate() {
        let y = top + 18.0 * s as f64;
        let x = width - 160.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="{y}" width="12" height="12" fill="{}"/>"#,
            COLORS[s % COLORS.len()]
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}">{}</text>"#,
            x + 18.0,
            y + 10.0,
            esc(name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The smallest round number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten) at or
/// above `x`: an axis maximum that wastes little height.
fn nice_ceiling(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 || x.is_infinite() {
        return 1.0;
    }
    let power = 10f64.powf(x.log10().floor());
    [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&v| v >= x)
        .unwrap_or(10.0 * power)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// CPU time used by other processes, as a share of the whole machine, over `window`.
/// `None` when /proc is unreadable.
pub(crate) fn others_busy(window: Duration) -> Option<f64> {
    fn total_and_idle() -> Option<(u64, u64)> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu = stat.lines().next()?;
        let v: Vec<u64> = cpu
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
        Some((v.iter().take(8).sum(), idle))
    }
    fn own() -> Option<u64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let after = stat.rsplit(')').next()?;
        let f: Vec<&str> = after.split_whitespace().collect();
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    }
    let (t0, i0) = total_and_idle()?;
    let o0 = own()?;
    std::thread::sleep(window);
    let (t1, i1) = total_and_idle()?;
    let o1 = own()?;
    let total = t1.saturating_sub(t0).max(1);
    let busy = total.saturating_sub(i1.saturating_sub(i0));
    let others = busy.saturating_sub(o1.saturating_sub(o0));
    Some(others as f64 / total as f64)
}

/// Samples of `systems` systems measured in rotation, `reps` times each (BENCH.md §1 and §7):
/// first a wait for an idle machine, then one warm-up round that is thrown away (an idle core
/// is slow to come back to speed on this VM), then the timed rounds back to back. The rotation
/// alternates direction (A B C, C B A, B C A, A C B, ...), so no system always runs right after
/// the same other one and inherits its leftovers (a kernel `pread` run leaves caches and TLBs
/// in another state than a foliocache run). `measure(k)` measures system `k` once. Returns
/// each system's samples (in round order) and whether the machine was busy.
pub(crate) fn interleaved(
    reps: usize,
    systems: usize,
    bar: &indicatif::ProgressBar,
    mut measure: impl FnMut(usize) -> Result<f64, String>,
) -> Result<(Vec<Vec<f64>>, bool), String> {
    let mut samples = vec![Vec::with_capacity(reps); systems];
    let busy = wait_for_idle(Duration::from_secs(3));
    for k in 0..systems {
        measure(k)?;
    }
    for rep in 0..reps {
        for k in 0..systems {
            let step = if rep % 2 == 0 { k } else { systems - 1 - k };
            let which = (step + rep / 2) % systems;
            samples[which].push(measure(which)?);
            bar.inc(1);
        }
    }
    Ok((samples, busy))
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
/// per second and whether every thread was pinned as asked. `work(stop)` loops until `stop` and
/// returns how many operations it did.
pub(crate) fn run_threads(
    threads: usize,
    time: Duration,
    placement: Placement,
    work: &(dyn Fn(&std::sync::atomic::AtomicBool) -> u64 + Sync),
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
                    work(stop)
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
        match others_busy(Duration::from_millis(100)) {
            None => return false,
            Some(share) if share <= 0.05 => return false,
            Some(_) if start.elapsed() >= patience => return true,
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_takes_median_and_spread() {
        let odd = Figure::new("c", "s", "m", &[3.0, 1.0, 2.0], false);
        assert_eq!((odd.median, odd.min, odd.max, odd.runs), (2.0, 1.0, 3.0, 3));
        let even = Figure::new("c", "s", "m", &[4.0, 1.0, 2.0, 3.0], true);
        assert_eq!((even.median, even.min, even.max), (2.5, 1.0, 4.0));
    }

    #[test]
    fn json_uses_the_protocol_field_names() {
        let mut report = Report::new("core", serde_json::json!({"pages": 1}));
        report
            .results
            .push(Figure::new("case", "a", "ops/s", &[2.0], false));
        report
            .results
            .push(Figure::new("case", "b", "ops/s", &[1.0], false));
        report.ratio("case", "ops/s", "a", "b");
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        for key in ["suite", "command", "machine", "results"] {
            assert!(json.get(key).is_some(), "missing {key}");
        }
        let figure = &json["results"][0];
        for key in ["case", "system", "metric", "median", "min", "max", "runs"] {
            assert!(figure.get(key).is_some(), "missing results[].{key}");
        }
        assert!(
            figure.get("busy").is_none(),
            "busy is only written when set"
        );
        assert_eq!(json["ratios"][0]["ratio"], 2.0);
        assert!(
            report
                .markdown()
                .contains("| case | a | ops/s | 2.00 | 2.00 – 2.00 | 1 |")
        );
    }

    #[test]
    fn axis_maximum_is_round() {
        assert_eq!(nice_ceiling(241.0), 250.0);
        assert_eq!(nice_ceiling(101.0), 120.0);
        assert!((nice_ceiling(0.29) - 0.3).abs() < 1e-12);
        assert_eq!(nice_ceiling(100.0), 100.0);
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(f64::NAN), 1.0);
    }
}
