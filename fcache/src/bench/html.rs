//! `results/index.html`: one self-contained page of a run (issue 18) — the summary, each suite's
//! tables and notes, its plots as inline SVG, the machine and the exact command. No script, no
//! style sheet or font from elsewhere, no link out: it can be attached to an issue or a mail
//! and opened anywhere.

use super::report::{Report, esc, fmt};
use super::summary::Row;
use std::fmt::Write as _;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;\
padding:0 1em;color:#222}table{border-collapse:collapse;margin:.8em 0;font-size:13px}\
td,th{border:1px solid #ccc;padding:3px 7px;vertical-align:top}th{background:#f3f3f3}\
td.n{text-align:right;font-variant-numeric:tabular-nums}tr.busy td{background:#fff6d8}\
.ok{color:#17801d;font-weight:bold}.miss{color:#c0262d;font-weight:bold}\
code,pre{background:#f6f6f6;padding:1px 4px;font-size:12px}pre{padding:.6em;overflow:auto}\
details{margin:.6em 0}summary{cursor:pointer;font-weight:600}svg{max-width:100%;height:auto}\
nav a{margin-right:1em}";

/// Inline Markdown: `code`, **bold**; everything else escaped.
fn inline(text: &str) -> String {
    let mut out = String::new();
    for (k, part) in text.split('`').enumerate() {
        if k % 2 == 1 {
            let _ = write!(out, "<code>{}</code>", esc(part));
        } else {
            for (j, piece) in esc(part).split("**").enumerate() {
                if j % 2 == 1 {
                    let _ = write!(out, "<b>{piece}</b>");
                } else {
                    out.push_str(piece);
                }
            }
        }
    }
    out
}

fn is_number_cell(cell: &str) -> bool {
    cell.trim()
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '+' || c == '-' || c == '–')
}

/// The Markdown the suites write (headings, tables, lists, paragraphs) as HTML.
pub(crate) fn markdown_to_html(md: &str) -> String {
    let mut out = String::new();
    let mut lines = md.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_end();
        if t.trim().is_empty() {
            continue;
        }
        if let Some(level) = t
            .find(|c| c != '#')
            .filter(|&n| n > 0 && n <= 6 && t[n..].starts_with(' '))
        {
            let _ = writeln!(
                out,
                "<h{}>{}</h{}>",
                level + 1,
                inline(t[level..].trim()),
                level + 1
            );
        } else if t.starts_with('|') {
            let mut rows = vec![t.to_string()];
            while let Some(next) = lines.peek().filter(|l| l.trim_start().starts_with('|')) {
                rows.push(next.trim().to_string());
                lines.next();
            }
            out.push_str("<table>\n");
            for (k, row) in rows.iter().enumerate() {
                let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
                if cells.iter().all(|c| c.chars().all(|ch| "-: ".contains(ch))) {
                    continue; // the alignment row
                }
                let busy = row.contains('⚠');
                let _ = write!(out, "<tr{}>", if busy { " class=\"busy\"" } else { "" });
                for cell in cells {
                    if k == 0 {
                        let _ = write!(out, "<th>{}</th>", inline(cell));
                    } else {
                        let class = if is_number_cell(cell) {
                            " class=\"n\""
                        } else {
                            ""
                        };
                        let _ = write!(out, "<td{class}>{}</td>", inline(cell));
                    }
                }
                out.push_str("</tr>\n");
            }
            out.push_str("</table>\n");
        } else if t.trim_start().starts_with("- ") {
            out.push_str("<ul>\n");
            let mut item = Some(t.trim_start()[2..].to_string());
            while let Some(text) = item.take() {
                let _ = writeln!(out, "<li>{}</li>", inline(&text));
                if let Some(next) = lines.peek().filter(|l| l.trim_start().starts_with("- ")) {
                    item = Some(next.trim_start()[2..].to_string());
                    lines.next();
                }
            }
            out.push_str("</ul>\n");
        } else {
            let mut para = t.trim().to_string();
            while let Some(next) = lines.peek().filter(|l| {
                let l = l.trim();
                !l.is_empty() && !l.starts_with('|') && !l.starts_with('#') && !l.starts_with("- ")
            }) {
                para.push(' ');
                para.push_str(next.trim());
                lines.next();
            }
            let _ = writeln!(out, "<p>{}</p>", inline(&para));
        }
    }
    out
}

fn summary_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "<table>\n<tr><th>seed</th><th>figure</th><th>before</th><th>after</th><th>kernel</th>\
         <th>limit</th><th>ratio (min–max)</th><th>goal</th></tr>\n",
    );
    let cell = |v: &Option<String>| v.as_deref().map_or_else(|| "–".to_string(), esc);
    for row in rows {
        let goal = row.goal.as_ref().map_or_else(
            || "–".to_string(),
            |g| {
                let (class, mark) = if g.met {
                    ("ok", "✓")
                } else {
                    ("miss", "✗")
                };
                format!("{} <span class=\"{class}\">{mark}</span>", esc(&g.text))
            },
        );
        let _ = writeln!(
            out,
            "<tr{}><td>{}</td><td>{}{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{goal}</td></tr>",
            if row.busy { " class=\"busy\"" } else { "" },
            esc(&row.seed),
            esc(&row.figure),
            if row.busy { " ⚠" } else { "" },
            cell(&row.before),
            cell(&row.after),
            cell(&row.kernel),
            cell(&row.limit),
            row.ratio
                .map_or_else(|| "–".to_string(), |r| esc(&r.text())),
        );
    }
    out.push_str("</table>\n");
    out
}

/// The page for a run's reports and summary rows.
pub(crate) fn page(reports: &[Report], rows: &[Row], command: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>fcache bench: {}</title><style>{STYLE}</style></head><body>",
        esc(&reports
            .iter()
            .map(|r| r.suite)
            .collect::<Vec<_>>()
            .join(", "))
    );
    let _ = writeln!(
        out,
        "<h1>fcache bench</h1>\n<p><code>{}</code></p>",
        esc(command)
    );
    if let Some(first) = reports.first() {
        let m = &first.machine;
        let _ = writeln!(
            out,
            "<table><tr><th>CPU</th><td>{} × {} (microcode {})</td></tr>\
             <tr><th>kernel</th><td>{} {}</td></tr><tr><th>memory</th><td>{} GiB, THP {}</td></tr>\
             <tr><th>mitigations</th><td>{}</td></tr></table>",
            m.cpus,
            esc(&m.cpu_model),
            esc(&m.microcode),
            esc(&m.kernel),
            esc(&m.kernel_build),
            m.memory_gib,
            esc(&m.thp),
            esc(&m.mitigations()),
        );
        let _ = writeln!(
            out,
            "<details><summary>all of /sys/devices/system/cpu/vulnerabilities</summary><table>"
        );
        for (k, v) in &m.vulnerabilities {
            let _ = writeln!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
        }
        out.push_str("</table></details>\n");
    }
    let _ = write!(out, "<nav>");
    for r in reports {
        let _ = write!(out, "<a href=\"#{0}\">{0}</a>", r.suite);
    }
    out.push_str("</nav>\n<h2>Summary</h2>\n");
    out.push_str(&summary_table(rows));
    let met = rows
        .iter()
        .filter(|r| r.goal.as_ref().is_some_and(|g| g.met))
        .count();
    let goals = rows.iter().filter(|r| r.goal.is_some()).count();
    let _ = writeln!(
        out,
        "<p>{met} of {goals} goals met. Goals are checked on medians; ratios are medians of \
         per-round ratios (with min–max) where both sides ran in the same rounds. Rows marked ⚠ \
         include samples taken while other work used the machine.</p>"
    );
    for r in reports {
        let _ = writeln!(out, "<h2 id=\"{0}\">{0}</h2>", r.suite);
        let _ = writeln!(
            out,
            "<p><code>{}</code> — {:.0} s; idle guard: {} samples, {} re-run, {} kept busy</p>",
            esc(&r.command),
            r.seconds,
            r.idle_guard.samples,
            r.idle_guard.reruns,
            r.idle_guard.busy
        );
        for svg in r.inline_svgs() {
            out.push_str(&svg);
        }
        for note in &r.notes {
            out.push_str(&markdown_to_html(note));
        }
        let _ = writeln!(
            out,
            "<details><summary>all {} figures, ratios and counters</summary>",
            r.results.len()
        );
        let _ = writeln!(
            out,
            "<p>sizes: <code>{}</code></p>",
            esc(&r.sizes.to_string())
        );
        let mut table = String::from(
            "| case | system | metric | median | min – max | runs |\n|---|---|---|---:|---:|---:|\n",
        );
        for f in &r.results {
            let _ = writeln!(
                table,
                "| {} | {} | {} | {} | {} – {} | {}{} |",
                f.case,
                f.system,
                f.metric,
                fmt(f.median),
                fmt(f.min),
                fmt(f.max),
                f.runs,
                if f.busy {
                    format!(" ⚠ {} busy", f.busy_samples.max(1))
                } else {
                    String::new()
                }
            );
        }
        if !r.ratios.is_empty() {
            table.push_str(
                "\n| case | ratio | kind | value | min – max |\n|---|---|---|---:|---:|\n",
            );
            for q in &r.ratios {
                let spread = match (q.min, q.max) {
                    (Some(lo), Some(hi)) => format!("{lo:.2} – {hi:.2}"),
                    _ => String::new(),
                };
                let _ = writeln!(
                    table,
                    "| {} | {} | {} | {:.2}× | {spread} |",
                    q.case,
                    q.what,
                    q.kind.label(),
                    q.ratio
                );
            }
        }
        out.push_str(&markdown_to_html(&table));
        if !r.counters.is_null() {
            let pretty = serde_json::to_string_pretty(&r.counters).unwrap_or_default();
            let _ = writeln!(out, "<pre>{}</pre>", esc(&pretty));
        }
        out.push_str("</details>\n");
    }
    let _ = writeln!(
        out,
        "<p>The same figures are in each suite's JSON and Markdown beside this page; \
         <code>fcache bench --compare OLD NEW</code> compares two runs.</p>"
    );
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::super::report::{Figure, Plot};
    use super::super::summary::{Spread, Unit};
    use super::*;

    #[test]
    fn page_is_self_contained() {
        let mut report = Report::new("seqread", serde_json::json!({"file_bytes": 1}));
        report.results.push(Figure::new(
            "normal/1M",
            "kernel",
            "GiB/s",
            &[1.0, 2.0, 3.0],
            1,
        ));
        report.notes.push(
            "### A table\n\n| a | b |\n|---|---:|\n| x <y> | 1.5 |\n\n- one `code`\n- two **bold**\n\ntext"
                .into(),
        );
        report.plots.push(Plot {
            file: "p.svg".into(),
            title: "plot".into(),
            unit: "GiB/s".into(),
            groups: vec![("g".into(), vec![("s".into(), 1.0)])],
        });
        let rows = vec![
            Row::new("004", "normal 1M")
                .ratio(Spread::single(1.5, Unit::Times))
                .at_least(1.0),
        ];
        let html = page(&[report], &rows, "fcache bench & <more>");
        assert!(!html.contains("http"), "no reference out of the page");
        assert!(!html.contains("<script"));
        assert!(html.contains("<svg"), "plots inline");
        assert!(
            html.contains("fcache bench &amp; &lt;more&gt;"),
            "the command, escaped"
        );
        assert!(html.contains("x &lt;y&gt;"));
        assert!(html.contains("<code>code</code>") && html.contains("<b>bold</b>"));
        assert!(html.contains("<h4>A table</h4>"));
        assert!(html.contains("class=\"busy\""), "busy figures stand out");
        assert!(html.contains("class=\"ok\">✓"));
        assert!(html.contains("microcode"));
        assert_eq!(
            html.matches("<table>").count(),
            html.matches("</table>").count()
        );
    }
}
