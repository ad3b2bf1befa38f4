//! `fcache bench --compare OLD NEW`: what changed between two runs, figure by figure.
//!
//! OLD and NEW are each a suite's JSON file (`--json PATH`) or a results directory (every
//! suite's `*.json` in it). Figures are matched by suite, case, system and metric. A change is
//! called *beyond the spread* when the two runs' min-max ranges do not overlap: every sample of
//! one run is above every sample of the other. For two runs of 5 samples that is the most
//! extreme outcome of a Mann-Whitney U test (U = 0, two-sided p = 2/252 ≈ 0.008); with fewer
//! samples it is weaker, and with one sample per run there is no spread to judge, which the
//! output says. Whether a change is better or worse follows the metric (throughput up is
//! better, latency or CPU time up is worse); for metrics where neither holds it says up or down.

use super::report::{Figure, fmt};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A suite's result file, as far as the comparison needs it.
#[derive(Debug, Deserialize)]
pub(crate) struct ResultFile {
    pub(crate) suite: String,
    #[serde(default)]
    pub(crate) command: String,
    pub(crate) results: Vec<Figure>,
    /// The host, as far as the comparison names it.
    #[serde(default)]
    pub(crate) machine: Option<MachineBrief>,
}

/// What a comparison says of each side's host: how its epoch pins ordered themselves (a
/// setting, `FOLIOCACHE_EPOCH_BARRIER`, that changes every figure of a hit), and whether its
/// sequential readers prefetched (`FOLIOCACHE_SEQ_PREFETCH`).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct MachineBrief {
    #[serde(default)]
    pub(crate) epoch_barrier: String,
    /// Whether a sequential reader prefetched (`FOLIOCACHE_SEQ_PREFETCH`, by CPU by default).
    #[serde(default)]
    pub(crate) seq_prefetch: String,
}

/// Figures from one side, keyed by (suite, case, system, metric), in file order.
type Figures = Vec<((String, String, String, String), Figure)>;

fn parse(path: &Path, text: &str) -> Result<ResultFile, String> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
    if value.get("results").is_none() || value.get("suite").is_none() {
        return Err(format!(
            "{} is not a result file of `fcache bench` (no \"suite\" and \"results\")",
            path.display()
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| format!("{}: unexpected result format: {e}", path.display()))
}

/// Loads a result file, or every suite's result file in a directory.
pub(crate) fn load(path: &Path) -> Result<Vec<ResultFile>, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.is_dir() {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| format!("cannot list {}: {e}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        let mut files = Vec::new();
        for p in paths {
            let text = std::fs::read_to_string(&p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            // The directory's summary.json and other files are not suites: skip them; a file
            // that is not JSON at all is an error.
            match parse(&p, &text) {
                Ok(file) => files.push(file),
                Err(e) if e.contains("is not a result file") => {}
                Err(e) => return Err(e),
            }
        }
        if files.is_empty() {
            return Err(format!(
                "{} holds no result file of `fcache bench`",
                path.display()
            ));
        }
        Ok(files)
    } else {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(vec![parse(path, &text)?])
    }
}

fn figures(files: &[ResultFile]) -> Figures {
    files
        .iter()
        .flat_map(|file| {
            file.results.iter().map(|f| {
                (
                    (
                        file.suite.clone(),
                        f.case.clone(),
                        f.system.clone(),
                        f.metric.clone(),
                    ),
                    f.clone(),
                )
            })
        })
        .collect()
}

/// Whether a higher value of `metric` is better (`None`: neither, e.g. a byte count that is
/// a property of the workload).
pub(crate) fn higher_is_better(metric: &str) -> Option<bool> {
    let m = metric.to_ascii_lowercase();
    if m.contains("/s")
        || m.contains("hit ratio")
        || m.starts_with("share_64k")
        || m == "paired_ratio"
        || m == "paired_share"
    {
        Some(true)
    } else if m.ends_with("ns")
        || m.contains("_ns")
        || m.ends_with("_us")
        || m.contains("ns/")
        || m.contains("cpu_s")
        || m.contains("amplification")
        || m.contains("locks_per")
        || m.contains("index_bytes")
        || m.contains("percent_of_data")
        || m.contains("above")
    {
        Some(false)
    } else {
        None
    }
}

/// How a figure moved between the runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The ranges overlap.
    Within,
    /// Every new sample is above every old one.
    Up,
    /// Every new sample is below every old one.
    Down,
    /// One run or both have a single sample: no spread to judge by.
    NoSpread,
}

/// One figure present in both runs.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) suite: String,
    pub(crate) case: String,
    pub(crate) system: String,
    pub(crate) metric: String,
    pub(crate) old: Figure,
    pub(crate) new: Figure,
    pub(crate) verdict: Verdict,
}

impl Change {
    /// New median over old, minus one.
    pub(crate) fn change(&self) -> f64 {
        self.new.median / self.old.median - 1.0
    }

    /// "better", "worse", "up" or "down" for a change beyond the spread.
    pub(crate) fn direction(&self) -> &'static str {
        match (self.verdict, higher_is_better(&self.metric)) {
            (Verdict::Up, Some(true)) | (Verdict::Down, Some(false)) => "better",
            (Verdict::Up, Some(false)) | (Verdict::Down, Some(true)) => "worse",
            (Verdict::Up, None) => "up",
            (Verdict::Down, None) => "down",
            _ => "",
        }
    }
}

/// The comparison of two runs.
#[derive(Debug, Default)]
pub(crate) struct Comparison {
    pub(crate) changes: Vec<Change>,
    pub(crate) only_old: Vec<String>,
    pub(crate) only_new: Vec<String>,
}

pub(crate) fn verdict(old: &Figure, new: &Figure) -> Verdict {
    if old.runs < 2 || new.runs < 2 {
        Verdict::NoSpread
    } else if new.min > old.max {
        Verdict::Up
    } else if new.max < old.min {
        Verdict::Down
    } else {
        Verdict::Within
    }
}

fn key_text(k: &(String, String, String, String)) -> String {
    format!("{} {} {} {}", k.0, k.1, k.2, k.3)
}

pub(crate) fn compare(old: &[ResultFile], new: &[ResultFile]) -> Comparison {
    let old = figures(old);
    let new = figures(new);
    let new_by_key: BTreeMap<_, _> = new.iter().map(|(k, f)| (k.clone(), f)).collect();
    let old_by_key: BTreeMap<_, _> = old.iter().map(|(k, f)| (k.clone(), f)).collect();
    let mut out = Comparison::default();
    for (key, o) in &old {
        match new_by_key.get(key) {
            Some(n) => out.changes.push(Change {
                suite: key.0.clone(),
                case: key.1.clone(),
                system: key.2.clone(),
                metric: key.3.clone(),
                old: o.clone(),
                new: (*n).clone(),
                verdict: verdict(o, n),
            }),
            None => out.only_old.push(key_text(key)),
        }
    }
    for (key, _) in &new {
        if !old_by_key.contains_key(key) {
            out.only_new.push(key_text(key));
        }
    }
    out
}

fn range(f: &Figure) -> String {
    if f.runs > 1 {
        format!("{} ({}–{})", fmt(f.median), fmt(f.min), fmt(f.max))
    } else {
        fmt(f.median)
    }
}

/// The comparison as text: changes beyond the spread, single-run figures that moved by 5% or
/// more, and figures found in one run only; with `verbose`, every figure.
pub(crate) fn render(c: &Comparison, old_label: &str, new_label: &str, verbose: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "OLD: {old_label}\nNEW: {new_label}\n");
    let shown: Vec<&Change> = c
        .changes
        .iter()
        .filter(|ch| {
            verbose
                || matches!(ch.verdict, Verdict::Up | Verdict::Down)
                || (ch.verdict == Verdict::NoSpread
                    && (ch.change().abs() >= 0.05 || ch.change().is_nan()))
        })
        .collect();
    if !shown.is_empty() {
        let _ = writeln!(
            out,
            "| suite | case | system | metric | old median (min–max) | new median (min–max) | change | verdict |"
        );
        let _ = writeln!(out, "|---|---|---|---|---:|---:|---:|---|");
        for ch in &shown {
            let verdict = match ch.verdict {
                Verdict::Within => "within the spread".to_string(),
                Verdict::Up | Verdict::Down => format!("beyond the spread: {}", ch.direction()),
                Verdict::NoSpread => "one run: no spread to judge".to_string(),
            };
            let busy = if ch.old.busy || ch.new.busy {
                " ⚠ busy"
            } else {
                ""
            };
            let change = if ch.change().is_finite() {
                format!("{:+.1}%", ch.change() * 100.0)
            } else {
                "from 0".to_string()
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {change} | {verdict}{busy} |",
                ch.suite,
                ch.case,
                ch.system,
                ch.metric,
                range(&ch.old),
                range(&ch.new),
            );
        }
        out.push('\n');
    }
    let count = |v: Verdict| c.changes.iter().filter(|ch| ch.verdict == v).count();
    let better = c
        .changes
        .iter()
        .filter(|ch| ch.direction() == "better")
        .count();
    let worse = c
        .changes
        .iter()
        .filter(|ch| ch.direction() == "worse")
        .count();
    let _ = writeln!(
        out,
        "{} figures in both runs: {} beyond the spread ({better} better, {worse} worse), {} within it, {} with one run only{}",
        c.changes.len(),
        count(Verdict::Up) + count(Verdict::Down),
        count(Verdict::Within),
        count(Verdict::NoSpread),
        if verbose {
            ""
        } else {
            " (--verbose lists every figure)"
        }
    );
    for (label, list) in [("only in OLD", &c.only_old), ("only in NEW", &c.only_new)] {
        if !list.is_empty() {
            let _ = writeln!(out, "\n{} figures {label}:", list.len());
            for key in list {
                let _ = writeln!(out, "  {key}");
            }
        }
    }
    out
}

/// The values one host setting took over a side's result files, each once (`on and off`), or
/// empty when none recorded it.
fn host_setting(files: &[ResultFile], field: impl Fn(&MachineBrief) -> &String) -> String {
    let mut values: Vec<&str> = files
        .iter()
        .filter_map(|f| f.machine.as_ref())
        .map(|m| field(m).as_str())
        .filter(|v| !v.is_empty())
        .collect();
    values.sort_unstable();
    values.dedup();
    values.join(" and ")
}

/// Runs the comparison and prints it.
pub(crate) fn run(old: &Path, new: &Path, verbose: bool) -> Result<(), String> {
    let (a, b) = (load(old)?, load(new)?);
    let label = |path: &Path, files: &[ResultFile]| {
        let commands: Vec<&str> = files.iter().map(|f| f.command.as_str()).collect();
        let mut unique = commands.clone();
        unique.dedup();
        let settings = [
            ("epoch pins", host_setting(files, |m| &m.epoch_barrier)),
            (
                "sequential prefetch",
                host_setting(files, |m| &m.seq_prefetch),
            ),
        ];
        let barriers: String = settings
            .iter()
            .filter(|(_, values)| !values.is_empty())
            .map(|(name, values)| format!(", {name}: {values}"))
            .collect();
        format!("{} (`{}`{barriers})", path.display(), unique.join("`, `"))
    };
    let comparison = compare(&a, &b);
    print!(
        "{}",
        render(&comparison, &label(old, &a), &label(new, &b), verbose)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(suite: &str, figures: &[(&str, &str, &str, &[f64])]) -> String {
        let results: Vec<Figure> = figures
            .iter()
            .map(|(case, system, metric, samples)| Figure::new(case, system, metric, samples, 0))
            .collect();
        serde_json::json!({"suite": suite, "command": "fcache bench", "results": results})
            .to_string()
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("fcache-compare-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn changes_beyond_the_spread_are_called_and_directed() {
        let dir = temp_dir("calls");
        let old = write(
            &dir,
            "old.json",
            &file(
                "seqread",
                &[
                    ("normal/1M", "batched", "GiB/s", &[10.0, 11.0, 12.0]),
                    ("normal/1M", "kernel", "GiB/s", &[5.0, 6.0, 7.0]),
                    ("lookup", "frozen-bit", "ns/op", &[20.0, 21.0, 22.0]),
                    ("gone", "x", "GiB/s", &[1.0, 1.0]),
                    ("single", "x", "GiB/s", &[1.0]),
                ],
            ),
        );
        let new = write(
            &dir,
            "new.json",
            &file(
                "seqread",
                &[
                    ("normal/1M", "batched", "GiB/s", &[13.0, 14.0, 15.0]),
                    ("normal/1M", "kernel", "GiB/s", &[6.5, 6.0, 8.0]),
                    ("lookup", "frozen-bit", "ns/op", &[25.0, 26.0, 27.0]),
                    ("added", "y", "GiB/s", &[1.0, 1.0]),
                    ("single", "x", "GiB/s", &[2.0]),
                ],
            ),
        );
        let c = compare(&load(&old).unwrap(), &load(&new).unwrap());
        let find = |case: &str| c.changes.iter().find(|ch| ch.case == case).unwrap();
        let up = find("normal/1M");
        assert_eq!((up.verdict, up.direction()), (Verdict::Up, "better"));
        assert!((up.change() - (14.0 / 11.0 - 1.0)).abs() < 1e-12);
        assert_eq!(
            c.changes[1].verdict,
            Verdict::Within,
            "kernel ranges overlap"
        );
        let slower = find("lookup");
        assert_eq!((slower.verdict, slower.direction()), (Verdict::Up, "worse"));
        assert_eq!(find("single").verdict, Verdict::NoSpread);
        assert_eq!(c.only_old, vec!["seqread gone x GiB/s"]);
        assert_eq!(c.only_new, vec!["seqread added y GiB/s"]);
        let text = render(&c, "old", "new", false);
        assert!(text.contains("beyond the spread: better"));
        assert!(text.contains("beyond the spread: worse"));
        assert!(
            text.contains("one run: no spread to judge"),
            "a 100% move of one run"
        );
        assert!(
            !text.contains("within the spread"),
            "hidden unless --verbose"
        );
        assert!(text.contains("1 figures only in OLD") && text.contains("1 figures only in NEW"));
        assert!(render(&c, "old", "new", true).contains("within the spread"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn directories_compare_suite_by_suite_and_skip_the_summary() {
        let (a, b) = (temp_dir("dir-a"), temp_dir("dir-b"));
        for (dir, v) in [(&a, 1.0), (&b, 2.0)] {
            write(
                dir,
                "core.json",
                &file("core", &[("c", "s", "Mops/s", &[v, v])]),
            );
            write(dir, "summary.json", r#"{"rows": []}"#);
        }
        write(
            &b,
            "exec.json",
            &file("exec", &[("c", "s", "bytes_read", &[1.0, 1.0])]),
        );
        let c = compare(&load(&a).unwrap(), &load(&b).unwrap());
        assert_eq!(c.changes.len(), 1);
        assert_eq!(c.changes[0].verdict, Verdict::Up);
        assert_eq!(c.only_new, vec!["exec c s bytes_read"]);
        std::fs::remove_dir_all(a).unwrap();
        std::fs::remove_dir_all(b).unwrap();
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let dir = temp_dir("bad");
        let missing = load(&dir.join("nope.json")).unwrap_err();
        assert!(
            missing.contains("cannot read") && missing.contains("nope.json"),
            "{missing}"
        );
        let broken = write(&dir, "broken.json", "{ not json");
        assert!(load(&broken).unwrap_err().contains("is not valid JSON"));
        let other = write(&dir, "other.json", r#"{"name": 1}"#);
        assert!(load(&other).unwrap_err().contains("not a result file"));
        let wrong = write(
            &dir,
            "wrong.json",
            r#"{"suite": "x", "results": [{"case": 1}]}"#,
        );
        assert!(
            load(&wrong)
                .unwrap_err()
                .contains("unexpected result format")
        );
        std::fs::remove_file(&broken).unwrap();
        std::fs::remove_file(&other).unwrap();
        std::fs::remove_file(&wrong).unwrap();
        assert!(load(&dir).unwrap_err().contains("holds no result file"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn metric_directions() {
        assert_eq!(higher_is_better("GiB/s"), Some(true));
        assert_eq!(higher_is_better("hit ratio %"), Some(true));
        assert_eq!(higher_is_better("p99_us"), Some(false));
        assert_eq!(higher_is_better("hit_fault_ns"), Some(false));
        assert_eq!(higher_is_better("ns/op"), Some(false));
        assert_eq!(higher_is_better("cpu_s_per_GiB"), Some(false));
        assert_eq!(higher_is_better("bytes_read"), None);
        assert_eq!(higher_is_better("share_64k_aligned"), Some(true));
        assert_eq!(
            higher_is_better("share_4k"),
            None,
            "a small-folio share is no goal"
        );
    }
}
