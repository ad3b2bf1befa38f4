//! `fcache cache {status,drop,sync,destroy} NAME`: a running shared cache, asked through its
//! owner's control socket (never starting one).

use foliocache::{CacheCommand, cache_command};

#[derive(clap::Args)]
pub(crate) struct CacheArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// What the cache holds: size, free, dirty, under writeback, attached processes, files
    /// and their resident ranges (`--json` for the owner's answer as it is).
    Status {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Drop every clean page (dirty pages and pages in use stay), like drop_caches.
    Drop { name: String },
    /// Write every dirty page back.
    Sync { name: String },
    /// Write back, then stop the owner (the memory is freed once no process holds it).
    Destroy {
        name: String,
        /// Even with processes attached.
        #[arg(long)]
        force: bool,
    },
}

pub(crate) fn run(args: &CacheArgs) -> Result<(), String> {
    let (name, command, json) = match &args.action {
        Action::Status { name, json } => (name, CacheCommand::Status, *json),
        Action::Drop { name } => (name, CacheCommand::Drop, false),
        Action::Sync { name } => (name, CacheCommand::Sync, false),
        Action::Destroy { name, force } => (name, CacheCommand::Destroy { force: *force }, false),
    };
    let answer = cache_command(name, command).map_err(|e| e.to_string())?;
    if command == CacheCommand::Status && !json {
        print_status(&answer)?;
    } else {
        emit(&format!("{answer}\n"))?;
    }
    Ok(())
}

/// Appends one formatted line to a `String`.
macro_rules! say {
    ($out:ident, $($arg:tt)*) => {{
        $out.push_str(&format!($($arg)*));
        $out.push('\n');
    }};
}

/// Writes `text` to stdout. A reader that went away (`fcache cache status | head`) ends the
/// output quietly, as it does for other command-line tools; other errors are reported.
fn emit(text: &str) -> Result<(), String> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}

fn print_status(json: &str) -> Result<(), String> {
    let mut out = String::new();
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("the owner's status is malformed: {e}"))?;
    let pages = |k: &str| v[k].as_u64().unwrap_or(0);
    let page = pages("page_size").max(1);
    let mib = |p: u64| p * page / (1 << 20);
    say!(
        out,
        "shared cache {}: owner pid {} (generation {}), mapping {} MiB ({} MiB in huge pages), \
         page {} KiB, shmem_enabled: {}",
        v["name"].as_str().unwrap_or("?"),
        v["owner_pid"],
        v["owner_generation"],
        pages("mapping_bytes") >> 20,
        pages("huge_page_bytes") >> 20,
        page >> 10,
        v["shmem_huge_pages"].as_str().unwrap_or("?")
    );
    say!(
        out,
        "  pages: {} total, {} free ({} MiB), {} dirty, {} under writeback",
        pages("total_pages"),
        pages("free_pages"),
        mib(pages("free_pages")),
        pages("dirty_pages"),
        pages("writeback_pages")
    );
    say!(out, "  attached processes: {}", v["processes"]);
    if pages("last_takeover_ns") > 0 {
        say!(
            out,
            "  last takeover of a dead owner: {:.1} ms, {} clean pages kept",
            pages("last_takeover_ns") as f64 / 1e6,
            pages("last_takeover_kept_pages")
        );
    }
    say!(
        out,
        "  writers outside the cache: {}",
        v["outside_writers"].as_str().unwrap_or("?")
    );
    if v.get("outside_opens_held").is_some() {
        let held = pages("outside_opens_held");
        say!(
            out,
            "    fanotify: {held} outside opens held until the cache stopped serving their file{}",
            if held > 0 {
                format!(
                    " ({:.2} ms each on average)",
                    pages("outside_opens_waited_ns") as f64 / held as f64 / 1e6
                )
            } else {
                String::new()
            }
        );
    }
    if v.get("outside_events").is_some() {
        say!(
            out,
            "    {} events, {} changes by other programs found, {} queue overflows",
            pages("outside_events"),
            pages("outside_changes"),
            pages("outside_overflows")
        );
    }
    let files = v["files"].as_array().cloned().unwrap_or_default();
    say!(out, "  {} files:", files.len());
    say!(
        out,
        "  {:>12} {:>10} {:>8}  path  (resident ranges: first page+pages)",
        "size",
        "cached",
        "dirty"
    );
    for f in files {
        let ranges: Vec<String> = f["ranges"]
            .as_array()
            .map(|r| r.iter().map(|p| format!("{}+{}", p[0], p[1])).collect())
            .unwrap_or_default();
        say!(
            out,
            "  {:>12} {:>10} {:>8}  {}  [{}]",
            f["size"],
            f["cached_pages"],
            f["dirty_pages"],
            f["path"].as_str().unwrap_or("?"),
            ranges.join(" ")
        );
    }
    emit(&out)
}
