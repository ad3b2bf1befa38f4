//! Results: figures with medians and spread, the machine they ran on, and their output as a
//! Markdown table, JSON and an SVG bar plot (`docs/BENCHMARKS.md`'s protocol).

use super::measure::{GuardStats, guard_snapshot};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// Figures keep their samples in the JSON when there are at most this many (enough for every
/// suite's repetitions; `--compare` and scripts read them).
const KEEP_SAMPLES: usize = 64;

/// One figure: a metric of one system on one case, over repetitions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Figure {
    pub(crate) case: String,
    pub(crate) system: String,
    pub(crate) metric: String,
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) runs: usize,
    /// Set when other work used the machine during at least one of the samples (the idle
    /// guard, `docs/BENCHMARKS.md`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) busy: bool,
    /// How many of the samples were taken while the machine was busy (after re-runs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) busy_samples: usize,
    /// The samples themselves, in round order (when more than one and at most 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) samples: Vec<f64>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Figure {
    /// A figure from its samples; `busy_samples` of them were taken on a busy machine.
    pub(crate) fn new(
        case: &str,
        system: &str,
        metric: &str,
        samples: &[f64],
        busy_samples: usize,
    ) -> Self {
        assert!(!samples.is_empty());
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        Self {
            case: case.into(),
            system: system.into(),
            metric: metric.into(),
            median: median_of_sorted(&sorted),
            min: sorted[0],
            max: sorted[n - 1],
            runs: n,
            busy: busy_samples > 0,
            busy_samples,
            samples: if (2..=KEEP_SAMPLES).contains(&n) {
                samples.to_vec()
            } else {
                Vec::new()
            },
        }
    }
}

fn median_of_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        f64::midpoint(sorted[n / 2 - 1], sorted[n / 2])
    }
}

/// The median of `values` (NaN when empty).
pub(crate) fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    median_of_sorted(&sorted)
}

/// The host: what the figures depend on besides the code. The CPU model, its microcode and the
/// kernel's mitigations change what a syscall costs several-fold between hosts of the same kind
/// (issue 17), so every report carries them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) cpu_model: String,
    #[serde(default)]
    pub(crate) microcode: String,
    pub(crate) kernel: String,
    /// `uname -v`: the build, e.g. `#1 SMP PREEMPT_DYNAMIC ...`.
    #[serde(default)]
    pub(crate) kernel_build: String,
    #[serde(default)]
    pub(crate) memory_gib: f64,
    /// `/sys/kernel/mm/transparent_hugepage/enabled`.
    #[serde(default)]
    pub(crate) thp: String,
    /// `/sys/devices/system/cpu/vulnerabilities/*`, by name.
    #[serde(default)]
    pub(crate) vulnerabilities: BTreeMap<String, String>,
    /// How the cache's epoch pins order themselves in this process (`symmetric` or
    /// `asymmetric`, see `FOLIOCACHE_EPOCH_BARRIER`); empty in results from before it was kept.
    #[serde(default)]
    pub(crate) epoch_barrier: String,
    /// Whether a sequential reader prefetches in this process (`on` or `off`, see
    /// `FOLIOCACHE_SEQ_PREFETCH`); empty in results from before it was kept.
    #[serde(default)]
    pub(crate) seq_prefetch: String,
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

impl Machine {
    pub(crate) fn probe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split_once(':'))
                .map_or_else(|| "unknown".to_string(), |(_, v)| v.trim().to_string())
        };
        let memory_gib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
            .map_or(0.0, |kb| (kb / f64::from(1 << 20) * 10.0).round() / 10.0);
        let mut vulnerabilities = BTreeMap::new();
        if let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/vulnerabilities") {
            for entry in dir.flatten() {
                if let Ok(text) = std::fs::read_to_string(entry.path()) {
                    vulnerabilities.insert(
                        entry.file_name().to_string_lossy().into_owned(),
                        text.trim().to_string(),
                    );
                }
            }
        }
        Self {
            cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            cpu_model: field("model name"),
            microcode: field("microcode"),
            kernel: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
            kernel_build: read_trimmed("/proc/sys/kernel/version").unwrap_or_default(),
            memory_gib,
            thp: read_trimmed("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default(),
            vulnerabilities,
            epoch_barrier: foliocache::epoch_barrier().name().to_string(),
            seq_prefetch: on_off(foliocache::sequential_prefetch()).into(),
        }
    }

    /// The mitigations in force, one short entry per vulnerability that is not "Not affected"
    /// (e.g. `spectre_v2: Retpolines`).
    pub(crate) fn mitigations(&self) -> String {
        let list: Vec<String> = self
            .vulnerabilities
            .iter()
            .filter(|(_, v)| !v.starts_with("Not affected"))
            .map(|(k, v)| {
                let short = v
                    .strip_prefix("Mitigation: ")
                    .unwrap_or(v)
                    .split([';', ',', '('])
                    .next()
                    .unwrap_or(v)
                    .trim();
                format!("{k}: {short}")
            })
            .collect();
        if list.is_empty() {
            "none reported".into()
        } else {
            list.join(", ")
        }
    }

    /// One line: CPUs, model, microcode, kernel, memory.
    pub(crate) fn line(&self) -> String {
        let settings: String = [
            ("epoch pins", &self.epoch_barrier),
            ("sequential prefetch", &self.seq_prefetch),
        ]
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| format!(", {name}: {value}"))
        .collect();
        format!(
            "{} CPUs, {} (microcode {}), kernel {}, {} GiB, THP {}{settings}",
            self.cpus, self.cpu_model, self.microcode, self.kernel, self.memory_gib, self.thp
        )
    }
}

/// How a ratio was formed. Both are honest; they answer different questions, and a table must
/// say which one it shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RatioKind {
    /// The median of A over the median of B (no spread: the two medians may come from
    /// different rounds).
    RatioOfMedians,
    /// The median of each round's own A / B, with the min-max over rounds: steadier when the
    /// machine drifts between rounds.
    MedianOfPairedRatios,
}

impl RatioKind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::RatioOfMedians => "ratio of medians",
            Self::MedianOfPairedRatios => "median of per-round ratios",
        }
    }
}

/// A ratio of two systems on one case, as the suites print it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Ratio {
    pub(crate) case: String,
    pub(crate) what: String,
    pub(crate) ratio: f64,
    #[serde(default = "default_kind")]
    pub(crate) kind: RatioKind,
    /// The spread over rounds (paired ratios only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max: Option<f64>,
}

fn default_kind() -> RatioKind {
    RatioKind::RatioOfMedians
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
    /// The idle guard over this suite's samples.
    pub(crate) idle_guard: GuardStats,
    /// Seconds the suite took.
    pub(crate) seconds: f64,
    #[serde(skip)]
    pub(crate) plots: Vec<Plot>,
    pub(crate) notes: Vec<String>,
    #[serde(skip)]
    guard_start: GuardStats,
    #[serde(skip)]
    started: Option<Instant>,
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
            idle_guard: GuardStats::default(),
            seconds: 0.0,
            plots: Vec::new(),
            notes: Vec::new(),
            guard_start: guard_snapshot(),
            started: Some(Instant::now()),
        }
    }

    pub(crate) fn figure(&self, case: &str, system: &str, metric: &str) -> Option<&Figure> {
        self.results
            .iter()
            .find(|f| f.case == case && f.system == system && f.metric == metric)
    }

    /// Records `a / b` of two systems' medians on one case and metric (a ratio of medians).
    pub(crate) fn ratio(&mut self, case: &str, metric: &str, a: &str, b: &str) {
        if let (Some(x), Some(y)) = (self.figure(case, a, metric), self.figure(case, b, metric)) {
            let ratio = x.median / y.median;
            self.ratios.push(Ratio {
                case: case.into(),
                what: format!("{a} / {b} ({metric})"),
                ratio,
                kind: RatioKind::RatioOfMedians,
                min: None,
                max: None,
            });
        }
    }

    /// Records each round's `a[r] / b[r]` as a figure (`{a}÷{b}`, metric `paired_ratio`) and
    /// their median with its spread as a ratio. `busy_rounds` of the rounds had a busy sample.
    /// Returns the figure's median.
    pub(crate) fn paired(
        &mut self,
        case: &str,
        (a, a_samples): (&str, &[f64]),
        (b, b_samples): (&str, &[f64]),
        busy_rounds: usize,
    ) -> f64 {
        let ratios: Vec<f64> = a_samples
            .iter()
            .zip(b_samples)
            .map(|(x, y)| x / y)
            .collect();
        if ratios.is_empty() {
            return f64::NAN;
        }
        let figure = Figure::new(
            case,
            &paired_system(a, b),
            "paired_ratio",
            &ratios,
            busy_rounds,
        );
        let median = figure.median;
        self.ratios.push(Ratio {
            case: case.into(),
            what: format!("{a} / {b}"),
            ratio: median,
            kind: RatioKind::MedianOfPairedRatios,
            min: Some(figure.min),
            max: Some(figure.max),
        });
        self.results.push(figure);
        median
    }

    /// The per-round ratio of `a` over `b` on `case` that [`Report::paired`] recorded.
    pub(crate) fn paired_ratio(&self, case: &str, a: &str, b: &str) -> Option<&Figure> {
        self.figure(case, &paired_system(a, b), "paired_ratio")
    }

    /// The Markdown the suite prints with `--verbose` and writes beside its JSON.
    pub(crate) fn markdown(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        let _ = writeln!(out, "## fcache bench {}\n", self.suite);
        let _ = writeln!(out, "`{}`  ", self.command);
        let _ = writeln!(out, "machine: {}  ", m.line());
        let _ = writeln!(out, "kernel build: {}  ", m.kernel_build);
        let _ = writeln!(out, "mitigations: {}  ", m.mitigations());
        let g = &self.idle_guard;
        let _ = writeln!(
            out,
            "idle guard: {} samples checked, {} re-run on a busy machine, {} kept busy (⚠ below)  ",
            g.samples, g.reruns, g.busy
        );
        let _ = writeln!(out, "sizes: {}\n", self.sizes);
        let _ = writeln!(
            out,
            "| case | system | metric | median | min – max | runs |"
        );
        let _ = writeln!(out, "|---|---|---|---:|---:|---:|");
        for f in &self.results {
            let flag = if f.busy {
                format!(" ⚠ {} busy", f.busy_samples.max(1))
            } else {
                String::new()
            };
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
            let _ = writeln!(out, "\n| case | ratio | kind | value | min – max |");
            let _ = writeln!(out, "|---|---|---|---:|---:|");
            for r in &self.ratios {
                let spread = match (r.min, r.max) {
                    (Some(lo), Some(hi)) => format!("{lo:.2} – {hi:.2}"),
                    _ => String::new(),
                };
                if r.ratio.is_finite() {
                    let _ = writeln!(
                        out,
                        "| {} | {} | {} | {:.2}× | {spread} |",
                        r.case,
                        r.what,
                        r.kind.label(),
                        r.ratio
                    );
                } else {
                    let _ = writeln!(
                        out,
                        "| {} | {} | {} | n/a (divisor is 0) | |",
                        r.case,
                        r.what,
                        r.kind.label()
                    );
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

    /// Closes the report: the idle guard's counts and the time taken since [`Report::new`].
    pub(crate) fn finish(&mut self) {
        let now = guard_snapshot();
        self.idle_guard = GuardStats {
            samples: now.samples - self.guard_start.samples,
            reruns: now.reruns - self.guard_start.reruns,
            busy: now.busy - self.guard_start.busy,
        };
        if let Some(started) = self.started.take() {
            self.seconds = started.elapsed().as_secs_f64();
        }
    }

    /// Writes the JSON, the Markdown beside it and the plots; prints the Markdown when
    /// `verbose`, else one line per file.
    pub(crate) fn write(&self, json: &Path, plot_dir: &Path, verbose: bool) -> Result<(), String> {
        let markdown = self.markdown();
        if verbose {
            println!("{markdown}");
        }
        if let Some(parent) = json.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(json, text).map_err(|e| format!("cannot write {}: {e}", json.display()))?;
        let md = json.with_extension("md");
        std::fs::write(&md, &markdown)
            .map_err(|e| format!("cannot write {}: {e}", md.display()))?;
        let mut plots = Vec::new();
        for plot in &self.plots {
            let path = plot_dir.join(&plot.file);
            std::fs::write(&path, svg_bars(plot, true))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            plots.push(path.display().to_string());
        }
        let busy = self.results.iter().filter(|f| f.busy).count();
        println!(
            "{}: {:.0} s, {} figures{} -> {}, {}{}{}",
            self.suite,
            self.seconds,
            self.results.len(),
            if busy > 0 {
                format!(" ({busy} with samples from a busy machine)")
            } else {
                String::new()
            },
            json.display(),
            md.display(),
            if plots.is_empty() { "" } else { ", " },
            plots.join(", ")
        );
        Ok(())
    }

    /// The plots as inline SVG (for the HTML page).
    pub(crate) fn inline_svgs(&self) -> Vec<String> {
        self.plots.iter().map(|p| svg_bars(p, false)).collect()
    }
}

/// The system name of a paired ratio's figure: `{a}÷{b}`.
fn paired_system(a: &str, b: &str) -> String {
    format!("{a}÷{b}")
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

/// A grouped bar chart as SVG: a standalone file (with its XML namespace), or an element to
/// inline in an HTML page (which needs none).
fn svg_bars(plot: &Plot, standalone: bool) -> String {
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
        r#"<svg{} width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#,
        if standalone {
            r#" xmlns="http://www.w3.org/2000/svg""#
        } else {
            ""
        }
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

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_takes_median_and_spread() {
        let odd = Figure::new("c", "s", "m", &[3.0, 1.0, 2.0], 0);
        assert_eq!((odd.median, odd.min, odd.max, odd.runs), (2.0, 1.0, 3.0, 3));
        assert_eq!(
            odd.samples,
            vec![3.0, 1.0, 2.0],
            "samples kept in round order"
        );
        let even = Figure::new("c", "s", "m", &[4.0, 1.0, 2.0, 3.0], 1);
        assert_eq!((even.median, even.min, even.max), (2.5, 1.0, 4.0));
        assert!(even.busy);
    }

    #[test]
    fn busy_samples_show_in_json_and_tables() {
        let mut report = Report::new("core", serde_json::json!({}));
        report
            .results
            .push(Figure::new("case", "a", "ops/s", &[2.0, 3.0, 4.0], 2));
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["results"][0]["busy"], true);
        assert_eq!(json["results"][0]["busy_samples"], 2);
        assert!(report.markdown().contains("| 3 ⚠ 2 busy |"));
    }

    #[test]
    fn paired_ratio_is_the_median_of_rounds_with_spread() {
        let mut report = Report::new("core", serde_json::json!({}));
        // Round ratios 2, 0.5, 1.5: median 1.5; the ratio of medians would be 3/3 = 1.
        let median = report.paired("c", ("a", &[2.0, 1.0, 3.0]), ("b", &[1.0, 2.0, 2.0]), 0);
        assert!((median - 1.5).abs() < 1e-12);
        let r = &report.ratios[0];
        assert_eq!(r.kind, RatioKind::MedianOfPairedRatios);
        assert_eq!((r.min, r.max), (Some(0.5), Some(2.0)));
        assert!(report.figure("c", "a÷b", "paired_ratio").is_some());
        assert_eq!(
            report.paired_ratio("c", "a", "b").map(|f| f.median),
            Some(median)
        );
        assert!(report.markdown().contains("median of per-round ratios"));
    }

    #[test]
    fn mitigations_list_what_is_in_force() {
        let mut m = Machine::probe();
        m.vulnerabilities = BTreeMap::from([
            ("meltdown".to_string(), "Not affected".to_string()),
            (
                "spectre_v2".to_string(),
                "Mitigation: Retpolines; IBPB: conditional".to_string(),
            ),
            ("retbleed".to_string(), "Vulnerable".to_string()),
        ]);
        assert_eq!(
            m.mitigations(),
            "retbleed: Vulnerable, spectre_v2: Retpolines"
        );
    }

    #[test]
    fn json_uses_the_protocol_field_names() {
        let mut report = Report::new("core", serde_json::json!({"pages": 1}));
        report
            .results
            .push(Figure::new("case", "a", "ops/s", &[2.0], 0));
        report
            .results
            .push(Figure::new("case", "b", "ops/s", &[1.0], 0));
        report.ratio("case", "ops/s", "a", "b");
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        for key in ["suite", "command", "machine", "results", "idle_guard"] {
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
        assert_eq!(json["ratios"][0]["kind"], "ratio-of-medians");
        for key in ["cpu_model", "microcode", "kernel", "vulnerabilities"] {
            assert!(json["machine"].get(key).is_some(), "missing machine.{key}");
        }
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
