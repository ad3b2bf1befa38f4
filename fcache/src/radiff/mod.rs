//! `fcache ra-diff`: the same access trace through the running kernel's page cache and through
//! foliocache, page sets compared step by step.
//!
//! Three ways to run it:
//!
//! - `fcache ra-diff FILE [TRACE]`: one trace on one data file (on a disk file system).
//! - `fcache ra-diff --set DIR DATA_DIR`: every `*.trace` in `DIR`, each on a data file of the
//!   size its `file-size` line asks for, created in `DATA_DIR`; `--record PATH` keeps the
//!   kernel's results (every run) as JSON.
//! - `fcache ra-diff --check RECORDING`: foliocache alone against a recording, with no kernel and
//!   no disk (a synthetic file of the recorded size): what `cargo test` runs.
//!
//! The kernel side is recorded `--runs` times (the kernel is not fully deterministic: I/O
//! completes when it completes, and this VM reclaims idle page cache); foliocache is judged
//! against the kernel's majority (the pages more than half the runs held after each step), and
//! the kernel's own runs against the same majority tell how far it agrees with itself.

mod folio;
pub(crate) mod kernel;
pub(crate) mod pages;

use crate::trace::{self, Line, Op, Trace};
use clap::Args;
use pages::{PageSet, majority};
use serde_json::{Value, json};
use std::io::Write as _;
use std::path::{Path, PathBuf};

const PAGE: u64 = 4096;

#[derive(Debug, Args)]
pub(crate) struct RaDiffArgs {
    /// The data file (on a disk file system); with `--set`, the directory to create the data
    /// files in.
    #[arg(required_unless_present = "check")]
    file: Option<PathBuf>,
    /// The trace (see `fcache/traces/README.md`); `-` or nothing: standard input.
    #[arg(conflicts_with_all = ["set", "check"])]
    trace: Option<PathBuf>,
    /// Run every `*.trace` in this directory.
    #[arg(long, value_name = "DIR", conflicts_with = "check")]
    set: Option<PathBuf>,
    /// With `--set` or `--check`: only these traces (names without `.trace`).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Compare foliocache with this recording of the kernel (no kernel or disk needed). With
    /// `--set DIR`, also check that the recording was made from the traces in DIR.
    #[arg(long, value_name = "RECORDING")]
    check: Option<PathBuf>,
    /// Traces to check a recording against (with `--check`).
    #[arg(long, value_name = "DIR", requires = "check")]
    traces: Option<PathBuf>,
    /// Kernel runs per trace.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=99))]
    runs: u32,
    /// foliocache's maximum window in KiB (default: the device's `read_ahead_kb`, the kernel's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=1048576))]
    ra_kb: Option<u64>,
    /// foliocache's largest folio order (ext4 on x86-64: 9, since 6.16).
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u8).range(0..=9))]
    max_order: u8,
    /// Write the kernel's runs as a recording (with `--set` or one trace).
    #[arg(long, value_name = "PATH", conflicts_with = "check")]
    record: Option<PathBuf>,
    /// One JSON document on standard output instead of text.
    #[arg(long)]
    json: bool,
    /// Text: only the summaries and the steps that differ.
    #[arg(long)]
    brief: bool,
}

/// One trace's results: the kernel's runs and foliocache's steps.
#[derive(Debug, Clone)]
struct Outcome {
    name: String,
    file_size: u64,
    ops: Vec<Op>,
    /// `kernel[run][step]`.
    kernel: Vec<Vec<PageSet>>,
    foliocache: Vec<PageSet>,
    unsettled: usize,
}

/// What a comparison counts (summed over traces).
#[derive(Debug, Clone, Copy, Default)]
struct Score {
    steps: u64,
    identical: u64,
    jaccard: f64,
    kernel_read: u64,
    folio_read: u64,
    /// Kernel runs equal to the majority (over all steps and runs), and their Jaccard sum.
    self_identical: u64,
    self_jaccard: f64,
    self_samples: u64,
    /// Steps where every kernel run agreed.
    unanimous: u64,
}

impl Score {
    fn add(&mut self, o: &Self) {
        self.steps += o.steps;
        self.identical += o.identical;
        self.jaccard += o.jaccard;
        self.kernel_read += o.kernel_read;
        self.folio_read += o.folio_read;
        self.self_identical += o.self_identical;
        self.self_jaccard += o.self_jaccard;
        self.self_samples += o.self_samples;
        self.unanimous += o.unanimous;
    }

    fn pct(part: u64, whole: u64) -> f64 {
        if whole == 0 {
            100.0
        } else {
            100.0 * part as f64 / whole as f64
        }
    }

    fn identical_pct(&self) -> f64 {
        Self::pct(self.identical, self.steps)
    }

    fn mean_jaccard(&self) -> f64 {
        if self.steps == 0 {
            1.0
        } else {
            self.jaccard / self.steps as f64
        }
    }

    fn self_identical_pct(&self) -> f64 {
        Self::pct(self.self_identical, self.self_samples)
    }

    fn self_mean_jaccard(&self) -> f64 {
        if self.self_samples == 0 {
            1.0
        } else {
            self.self_jaccard / self.self_samples as f64
        }
    }

    fn json(&self) -> Value {
        json!({
            "steps": self.steps,
            "identical": self.identical,
            "identical_pct": round(self.identical_pct(), 2),
            "mean_jaccard": round(self.mean_jaccard(), 4),
            "kernel_pages_read": self.kernel_read,
            "foliocache_pages_read": self.folio_read,
            "kernel_self_identical_pct": round(self.self_identical_pct(), 2),
            "kernel_self_mean_jaccard": round(self.self_mean_jaccard(), 4),
            "kernel_unanimous_steps_pct": round(Score::pct(self.unanimous, self.steps), 2),
        })
    }

    fn text(&self) -> String {
        format!(
            "identical {}/{} steps ({:.1}%), mean Jaccard {:.4}; pages read: kernel {}, \
             foliocache {}; kernel self-agreement: runs equal to the majority {:.1}% \
             (mean Jaccard {:.4}), all runs equal on {:.1}% of steps",
            self.identical,
            self.steps,
            self.identical_pct(),
            self.mean_jaccard(),
            self.kernel_read,
            self.folio_read,
            self.self_identical_pct(),
            self.self_mean_jaccard(),
            Score::pct(self.unanimous, self.steps)
        )
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// Pages that became resident at each step, summed (what was read, re-reads included).
fn pages_read(steps: &[PageSet]) -> u64 {
    let mut before = PageSet::new();
    let mut total = 0;
    for set in steps {
        total += set.minus(&before).len();
        before = set.clone();
    }
    total
}

/// One step compared.
struct Step {
    majority: PageSet,
    agreeing: usize,
    identical: bool,
    jaccard: f64,
}

impl Outcome {
    fn steps(&self) -> Vec<Step> {
        (0..self.ops.len())
            .map(|k| {
                let runs: Vec<PageSet> = self.kernel.iter().map(|r| r[k].clone()).collect();
                let majority = majority(&runs);
                let agreeing = runs.iter().filter(|r| r.same(&majority)).count();
                let ours = &self.foliocache[k];
                Step {
                    identical: ours.same(&majority),
                    jaccard: ours.jaccard(&majority),
                    agreeing,
                    majority,
                }
            })
            .collect()
    }

    fn score(&self, steps: &[Step]) -> Score {
        let mut score = Score::default();
        for (k, step) in steps.iter().enumerate() {
            score.steps += 1;
            score.identical += u64::from(step.identical);
            score.jaccard += step.jaccard;
            score.self_identical += step.agreeing as u64;
            score.unanimous += u64::from(step.agreeing == self.kernel.len());
            for run in &self.kernel {
                score.self_jaccard += run[k].jaccard(&step.majority);
                score.self_samples += 1;
            }
        }
        let majorities: Vec<PageSet> = steps.iter().map(|s| s.majority.clone()).collect();
        score.kernel_read = pages_read(&majorities);
        score.folio_read = pages_read(&self.foliocache);
        score
    }
}

/// The settings a comparison ran under, for the report.
#[derive(Debug, Clone)]
struct Settings {
    kernel: Value,
    foliocache: folio::Setting,
    runs: usize,
}

impl Settings {
    fn json(&self) -> Value {
        json!({
            "kernel": self.kernel,
            "foliocache": {
                "ra_kb": self.foliocache.ra_kb,
                "io_kb": self.foliocache.io_kb,
                "max_order": self.foliocache.max_order,
            },
            "kernel_runs": self.runs,
        })
    }

    fn text(&self) -> String {
        let k = &self.kernel;
        format!(
            "kernel {} ({} on {}, read_ahead_kb {}, max_sectors_kb {}), {} run(s) per trace; \
             foliocache: window {} KiB, largest request {} KiB, folios up to order {}",
            k["release"].as_str().unwrap_or("?"),
            k["fs"].as_str().unwrap_or("?"),
            k["device"].as_str().unwrap_or("?"),
            k["read_ahead_kb"],
            k["max_sectors_kb"],
            self.runs,
            self.foliocache.ra_kb,
            self.foliocache.io_kb,
            self.foliocache.max_order
        )
    }
}

fn kernel_json(setting: &kernel::Setting) -> Value {
    json!({
        "release": setting.kernel,
        "fs": setting.fs,
        "device": setting.device.name,
        "read_ahead_kb": setting.device.read_ahead_kb,
        "max_sectors_kb": setting.device.max_sectors_kb,
    })
}

pub(crate) fn run(args: &RaDiffArgs) -> Result<(), String> {
    if let Some(recording) = &args.check {
        return check(args, recording);
    }
    let file = args
        .file
        .as_deref()
        .ok_or("a data file (or with --set, a data directory) is needed")?;
    let traces = match &args.set {
        Some(dir) => load_set(dir, args.only.as_deref())?,
        None => vec![read_trace(args.trace.as_deref())?],
    };
    let setting = match &args.set {
        Some(_) => {
            std::fs::create_dir_all(file)
                .map_err(|e| format!("cannot create {}: {e}", file.display()))?;
            // The device is the data directory's: probe it with a small file.
            let probe = data_file(file, PAGE)?;
            kernel::Setting::of(&probe)?
        }
        None => kernel::Setting::of(file)?,
    };
    let folio_setting = folio::Setting {
        ra_kb: args.ra_kb.unwrap_or(setting.device.read_ahead_kb),
        io_kb: setting.device.max_sectors_kb,
        max_order: args.max_order,
    };
    let settings = Settings {
        kernel: kernel_json(&setting),
        foliocache: folio_setting,
        runs: args.runs as usize,
    };
    if folio_setting.ra_kb != setting.device.read_ahead_kb {
        eprintln!(
            "fcache ra-diff: note: foliocache's window ({} KiB) is not the kernel's ({} KiB, \
             the device's read_ahead_kb): the two are not compared like for like",
            folio_setting.ra_kb, setting.device.read_ahead_kb
        );
    }
    let progress = !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut outcomes = Vec::new();
    for (k, trace) in traces.iter().enumerate() {
        if progress {
            eprint!("\r[{}/{}] {:<40}", k + 1, traces.len(), trace.name);
        }
        let path = match &args.set {
            Some(_) => data_file(file, trace.file_size.unwrap_or(8 << 20))?,
            None => {
                if let Some(size) = trace.file_size {
                    let actual = std::fs::metadata(file).map_err(|e| e.to_string())?.len();
                    if actual != size {
                        eprintln!(
                            "fcache ra-diff: note: the trace was written for a file of {size} \
                             bytes; {} has {actual}",
                            file.display()
                        );
                    }
                }
                file.to_path_buf()
            }
        };
        outcomes.push(compare_live(&path, trace, folio_setting, args.runs)?);
    }
    if progress {
        eprint!("\r{:<60}\r", "");
    }
    if let Some(out) = &args.record {
        write_recording(out, &settings, &outcomes)?;
    }
    report(args, &settings, &outcomes)
}

/// Kernel runs, then foliocache on the same file.
fn compare_live(
    path: &Path,
    trace: &Trace,
    setting: folio::Setting,
    runs: u32,
) -> Result<Outcome, String> {
    let mut kernel_runs = Vec::new();
    let mut unsettled = 0;
    for _ in 0..runs {
        let run = kernel::run(path, &trace.ops)?;
        unsettled += run.unsettled;
        kernel_runs.push(run.steps);
    }
    let foliocache = folio::run(folio::Source::Disk(path), &trace.ops, setting)?;
    Ok(Outcome {
        name: trace.name.clone(),
        file_size: std::fs::metadata(path).map_err(|e| e.to_string())?.len(),
        ops: trace.ops.clone(),
        kernel: kernel_runs,
        foliocache,
        unsettled,
    })
}

fn read_trace(path: Option<&Path>) -> Result<Trace, String> {
    match path {
        Some(path) if path.as_os_str() != "-" => trace::load(path),
        _ => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)
                .map_err(|e| format!("cannot read the trace: {e}"))?;
            trace::parse("stdin", &text)
        }
    }
}

/// Every `*.trace` in `dir`, by name (only `only`'s, if given).
fn load_set(dir: &Path, only: Option<&[String]>) -> Result<Vec<Trace>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    paths.sort();
    let mut traces = Vec::new();
    for path in paths {
        let trace = trace::load(&path)?;
        if only.is_none_or(|names| names.contains(&trace.name)) {
            traces.push(trace);
        }
    }
    if let Some(names) = only
        && let Some(missing) = names.iter().find(|n| !traces.iter().any(|t| t.name == **n))
    {
        return Err(format!("no trace {missing:?} in {}", dir.display()));
    }
    if traces.is_empty() {
        return Err(format!("no *.trace files in {}", dir.display()));
    }
    Ok(traces)
}

/// The data file of `size` bytes in `dir` (`ra-diff-SIZE.dat`), created if missing: bytes that
/// are not zero (no block is left unwritten), synced to the disk.
fn data_file(dir: &Path, size: u64) -> Result<PathBuf, String> {
    let path = dir.join(format!("ra-diff-{size}.dat"));
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == size) {
        return Ok(path);
    }
    let tmp = dir.join(format!("ra-diff-{size}.dat.tmp"));
    let write = || -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        let chunk: Vec<u8> = (0..1 << 20).map(|k: u32| (k % 251 + 1) as u8).collect();
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            out.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        let file = out
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| format!("cannot create the data file {}: {e}", path.display()))?;
    Ok(path)
}

/// The recording's format name (a reader refuses any other).
const FORMAT: &str = "fcache ra-diff recording 1";

fn write_recording(path: &Path, settings: &Settings, outcomes: &[Outcome]) -> Result<(), String> {
    let traces: Vec<Value> = outcomes
        .iter()
        .map(|o| {
            let steps: Vec<Value> = (0..o.ops.len())
                .map(|k| {
                    // The distinct page sets the runs saw at this step, with how many saw each.
                    let mut seen: Vec<(PageSet, u32)> = Vec::new();
                    for run in &o.kernel {
                        match seen.iter_mut().find(|(s, _)| s.same(&run[k])) {
                            Some((_, n)) => *n += 1,
                            None => seen.push((run[k].clone(), 1)),
                        }
                    }
                    json!(
                        seen.iter()
                            .map(|(s, n)| json!({"runs": n, "pages": s.to_json()}))
                            .collect::<Vec<_>>()
                    )
                })
                .collect();
            json!({
                "name": o.name,
                "file_size": o.file_size,
                "ops": o.ops.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "unsettled_steps": o.unsettled,
                "kernel": steps,
            })
        })
        .collect();
    let document = json!({
        "format": FORMAT,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "recorded_unix": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "settings": settings.json(),
        "traces": traces,
    });
    // One line per trace, so that a new recording's diff shows which traces changed.
    let mut text = String::from("{\n");
    for key in ["format", "command", "recorded_unix", "settings"] {
        text += &format!("  {:?}: {},\n", key, document[key]);
    }
    text += "  \"traces\": [\n";
    let traces = document["traces"].as_array().map_or(&[][..], Vec::as_slice);
    for (k, trace) in traces.iter().enumerate() {
        let comma = if k + 1 < traces.len() { "," } else { "" };
        text += &format!("    {trace}{comma}\n");
    }
    text += "  ]\n}\n";
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Reads a recording back: the settings and each trace's kernel runs.
fn read_recording(path: &Path) -> Result<(Settings, Vec<Outcome>), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let doc: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let bad = |what: &str| format!("{}: not a ra-diff recording ({what})", path.display());
    if doc["format"] != FORMAT {
        return Err(bad("format"));
    }
    let s = &doc["settings"];
    let number = |v: &Value, what: &str| v.as_u64().ok_or_else(|| bad(what));
    let foliocache = folio::Setting {
        ra_kb: number(&s["foliocache"]["ra_kb"], "ra_kb")?,
        io_kb: number(&s["foliocache"]["io_kb"], "io_kb")?,
        max_order: u8::try_from(number(&s["foliocache"]["max_order"], "max_order")?)
            .map_err(|_| bad("max_order"))?,
    };
    let settings = Settings {
        kernel: s["kernel"].clone(),
        foliocache,
        runs: number(&s["kernel_runs"], "kernel_runs")? as usize,
    };
    let mut outcomes = Vec::new();
    for t in doc["traces"].as_array().ok_or_else(|| bad("traces"))? {
        let name = t["name"].as_str().ok_or_else(|| bad("name"))?.to_string();
        let mut ops = Vec::new();
        for (k, line) in t["ops"]
            .as_array()
            .ok_or_else(|| bad("ops"))?
            .iter()
            .enumerate()
        {
            let line = line.as_str().ok_or_else(|| bad("ops"))?;
            match trace::parse_line(line, k + 1).map_err(|e| format!("{name}: {e}"))? {
                Some(Line::Op(op)) => ops.push(op),
                _ => return Err(bad("ops")),
            }
        }
        let steps = t["kernel"].as_array().ok_or_else(|| bad("kernel"))?;
        if steps.len() != ops.len() {
            return Err(bad("one kernel result per operation"));
        }
        let mut kernel = vec![Vec::with_capacity(ops.len()); settings.runs];
        for step in steps {
            let mut run = 0;
            for seen in step.as_array().ok_or_else(|| bad("kernel"))? {
                let pages = PageSet::from_json(&seen["pages"])?;
                for _ in 0..number(&seen["runs"], "runs")? {
                    let slot: &mut Vec<PageSet> = kernel
                        .get_mut(run)
                        .ok_or_else(|| bad("more runs than recorded"))?;
                    slot.push(pages.clone());
                    run += 1;
                }
            }
            if run != settings.runs {
                return Err(bad("runs per step"));
            }
        }
        outcomes.push(Outcome {
            name,
            file_size: number(&t["file_size"], "file_size")?,
            ops,
            kernel,
            foliocache: Vec::new(),
            unsettled: number(&t["unsettled_steps"], "unsettled_steps")? as usize,
        });
    }
    Ok((settings, outcomes))
}

/// foliocache alone, against a recording.
fn check(args: &RaDiffArgs, recording: &Path) -> Result<(), String> {
    let (mut settings, mut outcomes) = read_recording(recording)?;
    if let Some(names) = &args.only {
        outcomes.retain(|o| names.contains(&o.name));
    }
    if let Some(dir) = &args.traces {
        // The recording must be of these traces, as they are now.
        for trace in load_set(dir, None)? {
            match outcomes.iter().find(|o| o.name == trace.name) {
                Some(o) if o.ops == trace.ops => {}
                Some(_) if args.only.is_none() => {
                    return Err(format!(
                        "trace {} changed since {} was recorded: record it again",
                        trace.name,
                        recording.display()
                    ));
                }
                None if args.only.is_none() => {
                    return Err(format!(
                        "trace {} is not in {}: record it",
                        trace.name,
                        recording.display()
                    ));
                }
                _ => {}
            }
        }
    }
    if let Some(ra_kb) = args.ra_kb {
        settings.foliocache.ra_kb = ra_kb;
    }
    settings.foliocache.max_order = args.max_order;
    for outcome in &mut outcomes {
        outcome.foliocache = folio::run(
            folio::Source::Synthetic(outcome.file_size),
            &outcome.ops,
            settings.foliocache,
        )?;
    }
    report(args, &settings, &outcomes)
}

fn report(args: &RaDiffArgs, settings: &Settings, outcomes: &[Outcome]) -> Result<(), String> {
    let mut total = Score::default();
    let mut out = std::io::stdout().lock();
    let mut traces_json = Vec::new();
    let mut lines = Vec::new();
    for outcome in outcomes {
        let steps = outcome.steps();
        let score = outcome.score(&steps);
        total.add(&score);
        if args.json {
            let steps_json: Vec<Value> = steps
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let ours = &outcome.foliocache[k];
                    json!({
                        "op": outcome.ops[k].to_string(),
                        "kernel": s.majority.to_json(),
                        "kernel_runs_agreeing": s.agreeing,
                        "foliocache": ours.to_json(),
                        "identical": s.identical,
                        "jaccard": round(s.jaccard, 4),
                        "missing": s.majority.minus(ours).to_json(),
                        "extra": ours.minus(&s.majority).to_json(),
                    })
                })
                .collect();
            traces_json.push(json!({
                "name": outcome.name,
                "file_size": outcome.file_size,
                "unsettled_kernel_steps": outcome.unsettled,
                "summary": score.json(),
                "steps": steps_json,
            }));
            continue;
        }
        lines.push(format!(
            "== {} ({} bytes, {} pages, {} steps) ==",
            outcome.name,
            outcome.file_size,
            outcome.file_size.div_ceil(PAGE),
            steps.len()
        ));
        for (k, s) in steps.iter().enumerate() {
            let ours = &outcome.foliocache[k];
            if args.brief && s.identical {
                continue;
            }
            let verdict = if s.identical {
                "same".to_string()
            } else {
                format!(
                    "J {:.3}  missing {}  extra {}",
                    s.jaccard,
                    s.majority.minus(ours).describe(6),
                    ours.minus(&s.majority).describe(6)
                )
            };
            lines.push(format!(
                "{:>4} {:<28} kernel [{}/{}] {}\n{:<33} foliocache {}  {}",
                k + 1,
                outcome.ops[k].to_string(),
                s.agreeing,
                outcome.kernel.len(),
                s.majority.describe(8),
                "",
                ours.describe(8),
                verdict
            ));
        }
        if outcome.unsettled > 0 {
            lines.push(format!(
                "     ({} kernel steps did not settle within 2 s)",
                outcome.unsettled
            ));
        }
        lines.push(format!("     {}", score.text()));
    }
    let written = if args.json {
        let doc = json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "settings": settings.json(),
            "traces": traces_json,
            "summary": total.json(),
        });
        writeln!(out, "{doc}")
    } else {
        lines.push(format!("compared: {}", settings.text()));
        lines.push(format!(
            "total over {} trace(s): {}",
            outcomes.len(),
            total.text()
        ));
        writeln!(out, "{}", lines.join("\n"))
    };
    // A closed stdout (a pager quit) is no error of ours.
    let _ = written;
    Ok(())
}
