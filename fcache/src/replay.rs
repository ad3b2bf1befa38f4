//! `fcache replay`: replays an access trace on one handle of a fresh cache over a file, and
//! after each read (once its I/O has settled) shows what is cached, as `fincore`/`vmtouch`
//! would for the kernel. How a user sees what readahead does with their access pattern.

use crate::trace::{self, Line, Op};
use clap::Args;
use foliocache::{Advice, Cache, CachedRange, File, OpenOptions, PageState};
use serde_json::json;
use std::io::{BufRead, Write as _};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// The file to read (on a disk file system: it is read with O_DIRECT), or an object
    /// `s3://bucket/key` (the store from the environment, as `fcache cat` says).
    file: PathBuf,
    /// The trace: one `offset length` read per line (decimal or 0x hex; `#` starts a comment),
    /// or `read`/`willneed`/`dontneed offset length` (see `fcache/traces/README.md`). `-` or
    /// nothing: standard input.
    trace: Option<PathBuf>,
    /// Maximum readahead window in KiB (the kernel's default is 128).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(0..=1048576))]
    ra_kb: u64,
    /// Cache capacity in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1048576))]
    capacity_mib: u64,
    /// Largest folio order readahead may use (0: 4 KiB folios only; 9: up to 2 MiB).
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u8).range(0..=9))]
    max_order: u8,
    /// Read through the kernel's page cache when the file system has no direct I/O (tmpfs).
    #[arg(long)]
    buffered: bool,
    /// One JSON object per read instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &ReplayArgs) -> Result<(), String> {
    let cache = Cache::builder()
        .capacity(args.capacity_mib << 20)
        .readahead_bytes(args.ra_kb << 10)
        .build()
        .map_err(|e| e.to_string())?;
    let options = OpenOptions::new()
        .max_order(args.max_order)
        .buffered_fallback(args.buffered);
    let name = args.file.to_string_lossy();
    let object = if foliocache_object::ObjectUrl::is_object_url(&name) {
        use foliocache_object::ObjectCache as _;
        let options = foliocache_object::ObjectOptions {
            readahead_bytes: args.ra_kb << 10,
            ..foliocache_object::ObjectOptions::default()
        };
        Some(
            cache
                .open_object_with(&name, &options)
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    let file = match &object {
        Some(object) => object.file().clone(),
        None => cache
            .open_with(&args.file, options)
            .map_err(|e| e.to_string())?,
    };
    let reader: Box<dyn BufRead> = match &args.trace {
        None => Box::new(std::io::stdin().lock()),
        Some(path) if path.as_os_str() == "-" => Box::new(std::io::stdin().lock()),
        Some(path) => Box::new(std::io::BufReader::new(
            std::fs::File::open(path)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))?,
        )),
    };
    let mut handle = file.handle();
    let mut out = std::io::stdout().lock();
    if !args.json {
        let _ = writeln!(
            out,
            "# {} ({} bytes), {}, max window {} KiB, folios up to order {}",
            args.file.display(),
            file.size(),
            file.backend_description().unwrap_or_default(),
            args.ra_kb,
            args.max_order
        );
        let _ = writeln!(
            out,
            "# pages are 4 KiB; ranges are first-last page; * marks a READAHEAD mark"
        );
    }
    let mut buf = Vec::new();
    for (k, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| format!("cannot read the trace: {e}"))?;
        let Some(Line::Op(op)) = trace::parse_line(&line, k + 1)? else {
            continue;
        };
        let (offset, len, result) = match op {
            Op::Read { offset, len } => {
                buf.resize(len as usize, 0);
                (offset, len, handle.read_at(&mut buf, offset))
            }
            Op::WillNeed { offset, len } => (
                offset,
                len,
                handle.advise(Advice::WillNeed { offset, len }).map(|()| 0),
            ),
            Op::DontNeed { offset, len } => (
                offset,
                len,
                handle.advise(Advice::DontNeed { offset, len }).map(|()| 0),
            ),
        };
        file.wait_for_io();
        let ranges = file.cached_ranges();
        let ra = handle.ra_state();
        let io = file.io_stats();
        let gets = object.as_ref().map(|o| o.backend().stats());
        let line = if args.json {
            json!({
                "op": op.to_string(),
                "offset": offset,
                "len": len,
                "read": result.as_ref().ok(),
                "error": result.as_ref().err().map(ToString::to_string),
                "ra": {"start": ra.start, "size": ra.size, "async_size": ra.async_size,
                       "order": ra.order, "max_pages": ra.ra_pages},
                "io_requests": io.requests,
                "io_bytes": io.bytes,
                "gets": gets.map(|g| g.gets),
                "bytes_fetched": gets.map(|g| g.bytes_fetched),
                "cached": ranges.iter().map(range_json).collect::<Vec<_>>(),
            })
            .to_string()
        } else {
            let read = match &result {
                Ok(n) => format!("{n} bytes"),
                Err(e) => format!("error: {e}"),
            };
            let gets = gets.map_or(String::new(), |g| {
                format!(" ({} GETs, {} KiB fetched)", g.gets, g.bytes_fetched >> 10)
            });
            format!(
                "{} -> {read} | window [{}, {}) async {} order {} | io {} reqs {} KiB{gets} | cached {}",
                op,
                ra.start,
                ra.start + ra.size,
                ra.async_size,
                ra.order,
                io.requests,
                io.bytes >> 10,
                describe(&ranges, &file)
            )
        };
        if writeln!(out, "{line}").is_err() {
            break; // stdout closed (a pager quit): stop quietly
        }
    }
    Ok(())
}

fn range_json(range: &CachedRange) -> serde_json::Value {
    json!({
        "first_page": range.first,
        "pages": range.pages,
        "folios": range.folios,
        "largest_order": range.largest_order,
        "state": match range.state {
            PageState::Uptodate => "uptodate",
            PageState::Dirty => "dirty",
            PageState::Writeback => "writeback",
            PageState::Reading => "reading",
            PageState::Failed => "failed",
        },
        "marks": range.marks,
    })
}

fn describe(ranges: &[CachedRange], file: &File) -> String {
    if ranges.is_empty() {
        return "nothing".into();
    }
    let total: u64 = ranges.iter().map(|r| r.pages).sum();
    let file_pages = file.size().div_ceil(4096).max(1);
    let mut parts: Vec<String> = ranges
        .iter()
        .map(|r| {
            let state = match r.state {
                PageState::Uptodate => "",
                PageState::Dirty => " (DIRTY)",
                PageState::Writeback => " (WRITEBACK)",
                PageState::Reading => " (reading)",
                PageState::Failed => " (FAILED)",
            };
            let marks: String = r.marks.iter().map(|m| format!(" *{m}")).collect();
            format!("{}-{}{state}{marks}", r.first, r.first + r.pages - 1)
        })
        .collect();
    if parts.len() > 12 {
        let hidden = parts.len() - 12;
        parts.truncate(12);
        parts.push(format!("... {hidden} more ranges"));
    }
    format!(
        "{} ({total} of {file_pages} pages, {:.1}%)",
        parts.join(", "),
        100.0 * total as f64 / file_pages as f64
    )
}
