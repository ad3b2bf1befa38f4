//! The one-screen summary that ends every `fcache bench` run (issue 18): one row per headline
//! figure of each seed, with before, after, the kernel, the machine's limit, the ratio with its
//! spread, and the goal it is checked against.
//!
//! Each suite contributes its rows with one function, `fn summary(&Report) -> Vec<Row>`, listed
//! once in [`super::SUITES`]; a new suite adds its function and one line there. Rows are built
//! from the suite's own figures (names as in `docs/BENCHMARKS.md`), so a row whose figures
//! are missing (a kernel side that could not be mounted, a thread count not asked for) is
//! simply left out.
//!
//! A goal is checked on the median (the protocol's figure); the spread beside it shows how far
//! the rounds went, so a goal met by a hair with a wide spread is visible as such.

use super::report::{Figure, fmt};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// How a ratio is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Unit {
    /// `1.23×`
    Times,
    /// `95%` (the value is a fraction: 0.95)
    Percent,
    /// Percentage points (the value is already in %: 95.0 → `95.0%`)
    Points,
}

/// A ratio (or share) with the spread over rounds when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Spread {
    pub(crate) value: f64,
    pub(crate) min: Option<f64>,
    pub(crate) max: Option<f64>,
    pub(crate) unit: Unit,
    /// One more digit than usual: the value rounds onto a goal it misses (89.6% against
    /// ≥ 90% would read "90% ✗").
    #[serde(default)]
    pub(crate) fine: bool,
}

impl Spread {
    /// A single value, no spread (a ratio of medians, or a deterministic figure).
    pub(crate) fn single(value: f64, unit: Unit) -> Self {
        Self {
            value,
            min: None,
            max: None,
            unit,
            fine: false,
        }
    }

    /// A figure's median with its min-max (a paired ratio, a share per round).
    pub(crate) fn of(figure: &Figure, unit: Unit) -> Self {
        Self {
            value: figure.median,
            min: (figure.runs > 1).then_some(figure.min),
            max: (figure.runs > 1).then_some(figure.max),
            unit,
            fine: false,
        }
    }

    fn show(self, x: f64) -> String {
        let extra = usize::from(self.fine);
        match self.unit {
            Unit::Times => format!("{x:.*}×", 2 + extra),
            Unit::Percent => format!("{:.*}%", extra, x * 100.0),
            Unit::Points => format!("{x:.*}%", 1 + extra),
        }
    }

    fn show_bare(self, x: f64) -> String {
        match self.unit {
            Unit::Times => format!("{x:.2}"),
            Unit::Percent => format!("{:.0}", x * 100.0),
            Unit::Points => format!("{x:.1}"),
        }
    }

    /// `1.23× (1.10–1.40)`.
    pub(crate) fn text(self) -> String {
        match (self.min, self.max) {
            (Some(lo), Some(hi)) => format!(
                "{} ({}–{})",
                self.show(self.value),
                self.show_bare(lo),
                self.show_bare(hi)
            ),
            _ => self.show(self.value),
        }
    }
}

/// The goal a row is checked against, and whether the median meets it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Goal {
    pub(crate) text: String,
    pub(crate) met: bool,
}

/// One headline figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Row {
    /// The seed (`000`, `001`, `002`, `004`) or the suite (`reclaim`, `writeseq`, ...).
    pub(crate) seed: String,
    pub(crate) figure: String,
    pub(crate) before: Option<String>,
    pub(crate) after: Option<String>,
    pub(crate) kernel: Option<String>,
    pub(crate) limit: Option<String>,
    pub(crate) ratio: Option<Spread>,
    pub(crate) goal: Option<Goal>,
    /// Some sample behind the row was taken on a busy machine.
    pub(crate) busy: bool,
}

impl Row {
    pub(crate) fn new(seed: &str, figure: impl Into<String>) -> Self {
        Self {
            seed: seed.into(),
            figure: figure.into(),
            before: None,
            after: None,
            kernel: None,
            limit: None,
            ratio: None,
            goal: None,
            busy: false,
        }
    }

    pub(crate) fn before(mut self, value: Option<String>) -> Self {
        self.before = value;
        self
    }

    pub(crate) fn after(mut self, value: Option<String>) -> Self {
        self.after = value;
        self
    }

    pub(crate) fn kernel(mut self, value: Option<String>) -> Self {
        self.kernel = value;
        self
    }

    pub(crate) fn limit(mut self, value: Option<String>) -> Self {
        self.limit = value;
        self
    }

    pub(crate) fn ratio(mut self, ratio: Spread) -> Self {
        self.ratio = Some(ratio);
        self
    }

    /// Checks the ratio's median against `at_least` (in the ratio's own unit: 0.9 for 90%).
    pub(crate) fn at_least(mut self, at_least: f64) -> Self {
        if let Some(r) = self.ratio.as_mut() {
            let met = r.value >= at_least;
            self.goal = Some(Goal {
                text: format!("≥ {}", r.show(at_least)),
                met,
            });
            // A miss must not print as the goal itself.
            r.fine = !met && r.show(r.value) == r.show(at_least);
        }
        self
    }

    /// A goal checked elsewhere (counts of rows, several conditions).
    pub(crate) fn goal(mut self, text: impl Into<String>, met: bool) -> Self {
        self.goal = Some(Goal {
            text: text.into(),
            met,
        });
        self
    }

    /// Marks the row busy when any of `figures` had a busy sample.
    pub(crate) fn busy_from(mut self, figures: &[Option<&Figure>]) -> Self {
        self.busy |= figures.iter().flatten().any(|f| f.busy);
        self
    }
}

/// A figure's median with its unit, e.g. `21.0 GiB/s`, scaled by `scale` first.
pub(crate) fn value(figure: Option<&Figure>, scale: f64, unit: &str) -> Option<String> {
    figure.map(|f| {
        if unit.is_empty() {
            fmt(f.median * scale)
        } else {
            format!("{} {unit}", fmt(f.median * scale))
        }
    })
}

/// Colours for a terminal, or none.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Style {
    pub(crate) colour: bool,
}

impl Style {
    /// Colour when stdout is a terminal and `NO_COLOR` is not set.
    pub(crate) fn for_stdout() -> Self {
        use std::io::IsTerminal;
        Self {
            colour: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

const HEADERS: [&str; 8] = [
    "seed",
    "figure",
    "before",
    "after",
    "kernel",
    "limit",
    "ratio (min–max)",
    "goal",
];
/// The widest a figure's name is shown on the terminal (the files keep it whole).
const FIGURE_WIDTH: usize = 44;

/// `name` in at most [`FIGURE_WIDTH`] characters: a longer one loses its middle, so that both
/// what is measured (its start) and of which system or against what (its end) stay.
fn shortened(name: &str) -> String {
    let count = name.chars().count();
    if count <= FIGURE_WIDTH {
        return name.to_owned();
    }
    let head = (FIGURE_WIDTH - 1) / 2;
    let tail = FIGURE_WIDTH - 1 - head;
    let start: String = name.chars().take(head).collect();
    let end: String = name.chars().skip(count - tail).collect();
    format!("{start}…{end}")
}

/// The name each row is shown with: [`shortened`], unless two different names would then read
/// the same, in which case those rows keep their whole names.
fn shown_names(rows: &[Row]) -> Vec<String> {
    let short: Vec<String> = rows.iter().map(|r| shortened(&r.figure)).collect();
    rows.iter()
        .zip(&short)
        .map(|(row, name)| {
            let clash = rows
                .iter()
                .zip(&short)
                .any(|(other, theirs)| theirs == name && other.figure != row.figure);
            if clash {
                row.figure.clone()
            } else {
                name.clone()
            }
        })
        .collect()
}

fn cells(row: &Row, name: &str) -> [String; 8] {
    let dash = || "–".to_string();
    let goal = row.goal.as_ref().map_or_else(dash, |g| {
        format!("{} {}", g.text, if g.met { "✓" } else { "✗" })
    });
    let mut figure = name.to_owned();
    if row.busy {
        figure.push_str(" ⚠");
    }
    [
        row.seed.clone(),
        figure,
        row.before.clone().unwrap_or_else(dash),
        row.after.clone().unwrap_or_else(dash),
        row.kernel.clone().unwrap_or_else(dash),
        row.limit.clone().unwrap_or_else(dash),
        row.ratio.map_or_else(dash, Spread::text),
        goal,
    ]
}

/// The summary as aligned text for a terminal (or plain when piped).
pub(crate) fn render(rows: &[Row], style: Style) -> String {
    let mut out = String::new();
    let names = shown_names(rows);
    let table: Vec<[String; 8]> = rows.iter().zip(&names).map(|(r, n)| cells(r, n)).collect();
    let mut widths = HEADERS.map(|h| h.chars().count());
    for cells in &table {
        for (w, c) in widths.iter_mut().zip(cells) {
            *w = (*w).max(c.chars().count());
        }
    }
    let pad = |text: &str, width: usize, right: bool| {
        let n = width.saturating_sub(text.chars().count());
        if right {
            format!("{}{text}", " ".repeat(n))
        } else {
            format!("{text}{}", " ".repeat(n))
        }
    };
    // Numbers right-aligned; seed, figure and goal left.
    let right = [false, false, true, true, true, true, true, false];
    let header: Vec<String> = HEADERS
        .iter()
        .zip(widths)
        .zip(right)
        .map(|((h, w), r)| pad(h, w, r))
        .collect();
    let _ = writeln!(out, "{}", style.paint("1", header.join("  ").trim_end()));
    let mut last_seed = String::new();
    for (row, cells) in rows.iter().zip(&table) {
        let mut line: Vec<String> = Vec::new();
        for (k, cell) in cells.iter().enumerate() {
            let shown = if k == 0 && row.seed == last_seed {
                String::new()
            } else {
                cell.clone()
            };
            let padded = pad(&shown, widths[k], right[k]);
            line.push(match k {
                1 if row.busy => style.paint("33", &padded),
                7 => match &row.goal {
                    Some(g) if g.met => style.paint("32", &padded),
                    Some(_) => style.paint("31;1", &padded),
                    None => padded,
                },
                _ => padded,
            });
        }
        last_seed.clone_from(&row.seed);
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    let met = rows
        .iter()
        .filter(|r| r.goal.as_ref().is_some_and(|g| g.met))
        .count();
    let goals = rows.iter().filter(|r| r.goal.is_some()).count();
    let busy = rows.iter().filter(|r| r.busy).count();
    let _ = write!(out, "{met} of {goals} goals met");
    if busy > 0 {
        let _ = write!(
            out,
            "; {} ({busy} rows) include samples taken while other work used the machine",
            style.paint("33", "⚠")
        );
    }
    out.push('\n');
    out
}

/// The summary as a Markdown table (for the files and the HTML page).
pub(crate) fn markdown(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", HEADERS.join(" | "));
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---|");
    for row in rows {
        let c = cells(row, &row.figure);
        let _ = writeln!(out, "| {} |", c.join(" | "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Row> {
        let paired = Figure::new("c", "a÷b", "paired_ratio", &[1.2, 1.1, 1.5], 0);
        vec![
            Row::new("004", "fallocated 1M: batched vs per-folio")
                .before(Some("50.0 GiB/s".into()))
                .after(Some("60.0 GiB/s".into()))
                .ratio(Spread::of(&paired, Unit::Times))
                .at_least(1.2),
            Row::new("004", "fallocated 1M: % of memset")
                .ratio(Spread::single(0.85, Unit::Percent))
                .at_least(0.9),
            Row::new("reclaim", "hot set during a scan")
                .after(Some("100%".into()))
                .busy_from(&[Some(&Figure::new("c", "s", "m", &[1.0, 2.0], 1))]),
        ]
    }

    #[test]
    fn goals_are_checked_on_the_median_with_spread_shown() {
        let rows = rows();
        let goal = rows[0].goal.as_ref().unwrap();
        assert!(goal.met, "median 1.2 meets ≥ 1.20×");
        assert_eq!(goal.text, "≥ 1.20×");
        assert_eq!(rows[0].ratio.unwrap().text(), "1.20× (1.10–1.50)");
        let goal = rows[1].goal.as_ref().unwrap();
        assert!(!goal.met);
        assert_eq!(goal.text, "≥ 90%");
        assert!(rows[2].busy);
    }

    #[test]
    fn a_miss_that_rounds_onto_its_goal_shows_one_more_digit() {
        let row = Row::new("000", "share")
            .ratio(Spread::single(0.8962, Unit::Percent))
            .at_least(0.9);
        assert!(!row.goal.as_ref().unwrap().met);
        assert_eq!(row.goal.as_ref().unwrap().text, "≥ 90%");
        assert_eq!(row.ratio.unwrap().text(), "89.6%");
        let row = Row::new("000", "ratio")
            .ratio(Spread::single(0.9962, Unit::Times))
            .at_least(1.0);
        assert_eq!(row.ratio.unwrap().text(), "0.996×");
        // A miss that already reads as one, and a value that meets its goal, keep their digits.
        let row = Row::new("000", "ratio")
            .ratio(Spread::single(0.95, Unit::Times))
            .at_least(1.0);
        assert_eq!(row.ratio.unwrap().text(), "0.95×");
        let row = Row::new("000", "ratio")
            .ratio(Spread::single(1.004, Unit::Times))
            .at_least(1.0);
        assert_eq!(row.ratio.unwrap().text(), "1.00×");
    }

    #[test]
    fn plain_output_has_no_escape_codes_and_counts_goals() {
        let text = render(&rows(), Style { colour: false });
        assert!(!text.contains('\x1b'));
        assert!(text.contains("1 of 2 goals met"));
        assert!(text.contains("✓") && text.contains("✗"));
        assert!(text.contains("⚠"));
        // The seed is printed once per group.
        assert_eq!(text.matches("004").count(), 1);
        // One line per row, a header and the count.
        assert_eq!(text.lines().count(), 5);
        let coloured = render(&rows(), Style { colour: true });
        assert!(coloured.contains("\x1b[32m") && coloured.contains("\x1b[31;1m"));
    }

    #[test]
    fn markdown_keeps_whole_names() {
        let mut long = rows();
        long[0].figure = "x".repeat(80);
        let md = markdown(&long);
        assert!(md.contains(&"x".repeat(80)));
        assert_eq!(md.lines().count(), 2 + long.len());
        assert!(render(&long, Style { colour: false }).contains('…'));
    }

    /// A long name loses its middle, not its end; two long names that would then read the
    /// same are shown whole.
    #[test]
    fn long_names_stay_apart() {
        let start = "db_bench readrandom/warm-in-process, private";
        let name = format!("{start}: of the pread limit");
        let short = shortened(&name);
        assert_eq!(short.chars().count(), FIGURE_WIDTH);
        assert!(short.starts_with("db_bench readrandom/") && short.ends_with("of the pread limit"));
        assert_eq!(shortened("short"), "short");

        let mut two = rows();
        two[0].figure = format!("{start} one long middle part: of the pread limit");
        two[1].figure = format!("{start} another middle part: of the pread limit");
        let text = render(&two, Style { colour: false });
        assert!(text.contains(&two[0].figure) && text.contains(&two[1].figure));
        let mut apart = rows();
        apart[0].figure = name.clone();
        apart[1].figure = format!("{start}, placed: of the pread limit");
        let text = render(&apart, Style { colour: false });
        assert!(text.contains(&short));
        assert!(text.contains(&shortened(&apart[1].figure)));
        assert_ne!(short, shortened(&apart[1].figure));
    }
}
