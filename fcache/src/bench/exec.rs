//! `fcache bench exec`: seed 001's folio-size table, on this machine.
//!
//! Takes a real ELF executable (default: this `fcache` binary, and the Rust toolchain's
//! `librustc_driver` when one is found, cases `rustc_driver/...`; `--elf PATH` for another),
//! finds its executable segments from the program headers, and faults seeded random pages
//! inside them (half as many faults as text pages, so about 40% of the text is touched;
//! three seeds, figures are medians over them) through an `Exec` region of a fresh cache,
//! once with `exec_order` 0 (the behaviour before the seed: plain read-around) and once with
//! `exec_order` 4 (64 KiB folios, the seed). Reported for each: the share of the cached text by folio size, bytes read from
//! the device, I/O count, read amplification (bytes read over the bytes of distinct pages
//! faulted), index metadata, and the cost of a fault that hits (interleaved repetitions).

use super::BenchArgs;
use super::measure::interleaved;
use super::report::{Figure, Plot, Ratio, RatioKind, Report, fmt, median};
use super::rng::Rng;
use super::summary::{Row, Spread, Unit};
use foliocache::{Cache, File, OpenOptions, Policy, Region, RegionHint};
use indicatif::{ProgressBar, ProgressStyle};
use object::read::elf::{ElfFile64, ProgramHeader};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

const ORDERS: [u8; 2] = [0, 4];
/// Folio-size classes of cached text, in table order.
const CLASSES: [&str; 8] = [
    "4K",
    "8K",
    "16K",
    "32K",
    "64K aligned",
    "128K+",
    "unaligned",
    "partial",
];

/// An executable segment: its file range and where it is mapped.
#[derive(Debug, Clone, Copy)]
struct Text {
    offset: u64,
    len: u64,
    vaddr: u64,
}

fn text_segments(path: &Path) -> Result<Vec<Text>, String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let elf = ElfFile64::<object::Endianness>::parse(&*data)
        .map_err(|e| format!("{} is not a 64-bit ELF file: {e}", path.display()))?;
    let endian = elf.endian();
    let texts: Vec<Text> = elf
        .elf_program_headers()
        .iter()
        .filter(|ph| {
            ph.p_type(endian) == object::elf::PT_LOAD
                && ph.p_flags(endian) & object::elf::PF_X != 0
                && ph.p_filesz(endian) > 0
        })
        .map(|ph| Text {
            offset: ph.p_offset(endian),
            len: ph.p_filesz(endian),
            vaddr: ph.p_vaddr(endian),
        })
        .collect();
    if texts.is_empty() {
        return Err(format!("{} has no executable segment", path.display()));
    }
    Ok(texts)
}

/// One system: a cache with an exec order, its regions, and what the faults saw.
struct Side {
    cache: Cache,
    file: File,
    regions: Vec<Region>,
    faulted: BTreeSet<u64>,
}

fn open_side(path: &Path, texts: &[Text], exec_order: u8) -> Result<(Side, bool), String> {
    let cache = Cache::builder()
        .capacity(256 << 20)
        .policy(Policy {
            exec_order,
            ..Policy::default()
        })
        .build()
        .map_err(|e| e.to_string())?;
    let (file, buffered) = match cache.open(path) {
        Ok(file) => (file, false),
        Err(foliocache::Error::NoDirectIo { .. }) => (
            cache
                .open_with(path, OpenOptions::new().buffered_fallback(true))
                .map_err(|e| e.to_string())?,
            true,
        ),
        Err(e) => return Err(e.to_string()),
    };
    let regions = texts
        .iter()
        .map(|t| file.region(t.offset, t.len, RegionHint::Exec))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    Ok((
        Side {
            cache,
            file,
            regions,
            faulted: BTreeSet::new(),
        },
        buffered,
    ))
}

/// The text page of fault number `k`: a region chosen by size, a page in it.
fn pick(rng: &mut Rng, regions: &[(u64, u64)], total: u64) -> (usize, u64) {
    let mut at = rng.next() % total;
    for (k, &(first, end)) in regions.iter().enumerate() {
        if at < end - first {
            return (k, first + at);
        }
        at -= end - first;
    }
    (0, regions[0].0)
}

/// Pages of cached text by class for one side, and the pages in 64 KiB-or-larger folios that
/// also sit at 64 KiB-aligned virtual addresses once mapped (what arm64's contpte could map
/// with one TLB entry).
fn classify(side: &Side, texts: &[Text]) -> ([u64; 8], u64) {
    let mut pages = [0u64; 8];
    let mut va_aligned = 0;
    let mapping = foliocache::raw::mapping(&side.file);
    for (text, region) in texts.iter().zip(&side.regions) {
        let (first, end) = region.pages();
        // Where a file page lands in memory.
        let shift = text.vaddr.wrapping_sub(text.offset);
        let mut i = first;
        while i < end {
            let Some(folio) = mapping.lookup(i) else {
                i += 1;
                continue;
            };
            let (start, nr) = (folio.index(), folio.nr_pages() as u64);
            let inside = (start.max(first)..(start + nr).min(end)).count() as u64;
            let class = if start < first || start + nr > end {
                7 // partial: the folio spills out of the segment
            } else if start % nr != 0 {
                6 // unaligned in the file (folios here never are)
            } else {
                match folio.order() {
                    0..=3 => usize::from(folio.order()),
                    4 => 4,
                    _ => 5,
                }
            };
            if (4..=5).contains(&class) && (start << 12).wrapping_add(shift) % (16 << 12) == 0 {
                va_aligned += inside;
            }
            pages[class] += inside;
            i = start + nr;
        }
    }
    (pages, va_aligned)
}

/// The Rust toolchain's compiler driver library (`librustc_driver-*.so` under `rustc --print
/// sysroot`/lib): a large real ELF (about 100 MiB of text) on any machine that builds this
/// project.
fn rustc_driver() -> Option<PathBuf> {
    let out = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let sysroot = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    let mut found: Vec<PathBuf> = std::fs::read_dir(sysroot.join("lib"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("librustc_driver-") && n.ends_with(".so"))
        })
        .collect();
    found.sort();
    found.pop()
}

/// Fault-pattern seeds: each gives its own random pages; figures are medians over them.
const SEEDS: [u64; 3] = [42, 1042, 2042];

/// One ELF measured: its cases are `{prefix}exec_order={K}`.
struct Elf {
    path: PathBuf,
    prefix: &'static str,
    texts: Vec<Text>,
    text_pages: u64,
}

impl Elf {
    fn new(path: PathBuf, prefix: &'static str) -> Result<Self, String> {
        let texts = text_segments(&path)?;
        let text_pages = texts
            .iter()
            .map(|t| (t.offset + t.len).div_ceil(4096) - t.offset / 4096)
            .sum();
        Ok(Self {
            path,
            prefix,
            texts,
            text_pages,
        })
    }
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let mut elfs = vec![Elf::new(
        match &args.elf {
            Some(path) => path.clone(),
            None => std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?,
        },
        "",
    )?];
    if args.elf.is_none()
        && let Some(path) = rustc_driver()
    {
        elfs.push(Elf::new(path, "rustc_driver/")?);
    }
    // Faults per text page: at 0.5 (quick) about 40% of the pages are touched, at 1 (full)
    // about 63%: a program touches part of its text, and read-around's spill and the exec
    // windows' alignment show only when some of it is left untouched.
    let per_page = if args.full { 1.0 } else { 0.5 };
    let reps = args.reps();
    let hit_faults = 200_000u64;
    let mut report = Report::new(
        "exec",
        json!({
            "elfs": elfs.iter().map(|e| json!({
                "path": e.path.display().to_string(),
                "case_prefix": e.prefix,
                "text_segments": e.texts.iter().map(|t| json!({"offset": t.offset, "bytes": t.len, "vaddr": t.vaddr})).collect::<Vec<_>>(),
                "text_pages": e.text_pages,
            })).collect::<Vec<_>>(),
            "faults_per_text_page": per_page,
            "seeds": SEEDS,
            "readahead_window_pages": 32,
            "hit_faults_per_measurement": hit_faults,
            "reps": reps,
        }),
    );
    let total_faults: u64 = elfs
        .iter()
        .map(|e| (e.text_pages as f64 * per_page) as u64 * (SEEDS.len() * ORDERS.len()) as u64)
        .sum();
    let bar = ProgressBar::new(total_faults + (reps as u64 + 1) * 2 * elfs.len() as u64)
        .with_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                .map_err(|e| e.to_string())?
                .progress_chars("=> "),
        );
    bar.set_prefix("exec");
    let mut plots = Vec::new();
    for elf in &elfs {
        let shares = measure(&mut report, elf, per_page, reps, hit_faults, &bar)?;
        plots.push((elf.prefix, shares));
    }
    bar.finish_and_clear();
    for (prefix, shares) in plots {
        let name = if prefix.is_empty() {
            "exec".to_string()
        } else {
            format!("exec-{}", prefix.trim_end_matches('/'))
        };
        report.plots.push(Plot {
            file: format!("{name}.svg"),
            title: format!(
                "{name}: share of cached text by folio size (median over {} seeds)",
                SEEDS.len()
            ),
            unit: "% of cached text pages".into(),
            groups: CLASSES
                .iter()
                .enumerate()
                .map(|(c, class)| {
                    (
                        (*class).to_string(),
                        ORDERS
                            .iter()
                            .enumerate()
                            .map(|(k, order)| (format!("exec_order={order}"), 100.0 * shares[k][c]))
                            .collect(),
                    )
                })
                .collect(),
        });
    }
    Ok(report)
}

/// Faults one ELF's text with every seed and both orders, then times hit faults (first seed,
/// both orders interleaved). Returns the median share of each folio class per order.
fn measure(
    report: &mut Report,
    elf: &Elf,
    per_page: f64,
    reps: usize,
    hit_faults: u64,
    bar: &ProgressBar,
) -> Result<Vec<Vec<f64>>, String> {
    let texts = &elf.texts;
    let faults = ((elf.text_pages as f64 * per_page) as u64).max(1);
    // [order][seed] -> figures.
    let mut per_order: Vec<Vec<Side>> = vec![Vec::new(), Vec::new()];
    let mut buffered_any = false;
    for &seed in &SEEDS {
        for (k, &order) in ORDERS.iter().enumerate() {
            bar.set_message(format!("{}exec_order={order}: seed {seed}", elf.prefix));
            let (mut side, buffered) = open_side(&elf.path, texts, order)?;
            buffered_any |= buffered;
            let bounds: Vec<(u64, u64)> = side.regions.iter().map(Region::pages).collect();
            let mut rng = Rng(seed);
            for _ in 0..faults {
                let (r, page) = pick(&mut rng, &bounds, elf.text_pages);
                side.regions[r].fault(page).map_err(|e| e.to_string())?;
                side.faulted.insert(page);
                bar.inc(1);
            }
            per_order[k].push(side);
        }
    }
    // Hit-fault cost on the first seed's sides, interleaved.
    let mut first: Vec<Side> = per_order.iter_mut().map(|sides| sides.remove(0)).collect();
    let hit_pages: Vec<Vec<(usize, u64)>> = first
        .iter()
        .map(|side| {
            let bounds: Vec<(u64, u64)> = side.regions.iter().map(Region::pages).collect();
            let mut rng = Rng(7);
            let pages: Vec<(usize, u64)> = (0..16384)
                .map(|_| pick(&mut rng, &bounds, elf.text_pages))
                .filter(|&(_, p)| side.faulted.contains(&p))
                .collect();
            pages
        })
        .collect();
    bar.set_message(format!("{}hit-fault cost", elf.prefix));
    let rounds = interleaved(reps, first.len(), bar, |which| {
        let side = &mut first[which];
        let pages = &hit_pages[which];
        if pages.is_empty() {
            return Ok(f64::NAN);
        }
        let start = Instant::now();
        for k in 0..hit_faults {
            let (r, page) = pages[k as usize % pages.len()];
            let fault = side.regions[r].fault(page).map_err(|e| e.to_string())?;
            std::hint::black_box(&fault.folio);
        }
        Ok(start.elapsed().as_nanos() as f64 / hit_faults as f64)
    })?;
    for (k, side) in first.into_iter().enumerate() {
        per_order[k].insert(0, side);
    }

    let mut shares_by_order = Vec::new();
    for (k, sides) in per_order.iter().enumerate() {
        let case = format!("{}exec_order={}", elf.prefix, ORDERS[k]);
        let mut per_seed: Vec<BTreeMap<String, f64>> = Vec::new();
        let mut class_shares: Vec<Vec<f64>> = vec![Vec::new(); CLASSES.len()];
        for side in sides {
            let (pages, va_aligned) = classify(side, texts);
            let total: u64 = pages.iter().sum::<u64>().max(1);
            let mut m = BTreeMap::new();
            m.insert(
                "share_64k_va_aligned".to_string(),
                va_aligned as f64 / total as f64,
            );
            for (c, class) in CLASSES.iter().enumerate() {
                let share = pages[c] as f64 / total as f64;
                class_shares[c].push(share);
                let metric = format!(
                    "share_{}",
                    class.to_lowercase().replace(' ', "_").replace('+', "_plus")
                );
                m.insert(metric, share);
            }
            let io = side.file.io_stats();
            let distinct = side.faulted.len() as f64 * 4096.0;
            let stats = side.file.mapping_stats();
            m.insert("bytes_read".into(), io.bytes as f64);
            m.insert("io_requests".into(), io.requests as f64);
            m.insert("read_amplification".into(), io.bytes as f64 / distinct);
            m.insert("index_bytes".into(), stats.index_bytes as f64);
            m.insert("cached_pages".into(), stats.cached_pages as f64);
            m.insert(
                "text_coverage".into(),
                side.faulted.len() as f64 / elf.text_pages as f64,
            );
            per_seed.push(m);
        }
        for metric in per_seed[0].keys() {
            let values: Vec<f64> = per_seed.iter().map(|m| m[metric]).collect();
            report
                .results
                .push(Figure::new(&case, "foliocache", metric, &values, 0));
        }
        report.results.push(Figure::new(
            &case,
            "foliocache",
            "hit_fault_ns",
            &rounds.samples[k],
            rounds.busy_count(k),
        ));
        let ra = sides[0].file.readahead_stats();
        report.notes.push(format!(
            "{case} (seed {}): {} read-around windows, {} exec windows, {} gave up on misses; cache {} MiB free of {}",
            SEEDS[0],
            ra.read_around,
            ra.exec_windows,
            ra.mmap_gave_up,
            (sides[0].cache.stats().free_pages * 4096) >> 20,
            (sides[0].cache.stats().total_pages * 4096) >> 20,
        ));
        shares_by_order.push(class_shares.iter().map(|v| median(v)).collect::<Vec<f64>>());
    }
    let (after, before) = (
        format!("{}exec_order=4", elf.prefix),
        format!("{}exec_order=0", elf.prefix),
    );
    for metric in [
        "bytes_read",
        "io_requests",
        "read_amplification",
        "index_bytes",
        "hit_fault_ns",
    ] {
        if let (Some(a), Some(b)) = (
            report
                .figure(&after, "foliocache", metric)
                .map(|f| f.median),
            report
                .figure(&before, "foliocache", metric)
                .map(|f| f.median),
        ) {
            report.ratios.push(Ratio {
                case: format!("{after} / {before}"),
                what: format!("{metric} (median over seeds)"),
                ratio: a / b,
                kind: RatioKind::RatioOfMedians,
                min: None,
                max: None,
            });
        }
    }
    // The seed's table: share of cached text by folio size, before and after.
    let mut table = format!(
        "{}: share of cached text by folio size (seed 001's table; median over {} fault seeds, \
         {:.0}% of the {} text pages touched):\n\n| folio size | exec_order=0 (before) | exec_order=4 (after) |\n|---|---:|---:|\n",
        elf.path.display(),
        SEEDS.len(),
        report
            .figure(&before, "foliocache", "text_coverage")
            .map_or(0.0, |f| f.median * 100.0),
        elf.text_pages,
    );
    for (c, class) in CLASSES.iter().enumerate() {
        table.push_str(&format!(
            "| {class} | {:.1}% | {:.1}% |\n",
            100.0 * shares_by_order[0][c],
            100.0 * shares_by_order[1][c]
        ));
    }
    report.notes.insert(0, table);
    let shifts: Vec<String> = texts
        .iter()
        .map(|t| format!("{:#x}", t.vaddr.wrapping_sub(t.offset) % (64 << 10)))
        .collect();
    report.notes.push(format!(
        "{}: folios are naturally aligned in the file (\"64K aligned\" counts 64 KiB folios). \
         Whether one maps at a 64 KiB-aligned address also depends on the ELF layout: here \
         virtual address minus file offset is {} modulo 64 KiB for the executable segment(s) \
         (share_64k_va_aligned is what arm64's contpte could map with one TLB entry; seed \
         001's follow-ups align file mappings to the exec folio size for this reason).",
        elf.path.display(),
        shifts.join(", ")
    ));
    if buffered_any {
        report.notes.push(format!(
            "{} is on a file system without direct I/O: it was read through the kernel's page cache (buffered_fallback); the folio layout is the same",
            elf.path.display()
        ));
    }
    Ok(shares_by_order)
}

/// The summary's rows (seed 001): the share of text in aligned 64 KiB folios before and
/// after, for each ELF, over the fault seeds.
pub(crate) fn summary(report: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    for (prefix, name) in [("", "this binary"), ("rustc_driver/", "librustc_driver")] {
        let (before, after) = (
            report.figure(
                &format!("{prefix}exec_order=0"),
                "foliocache",
                "share_64k_aligned",
            ),
            report.figure(
                &format!("{prefix}exec_order=4"),
                "foliocache",
                "share_64k_aligned",
            ),
        );
        let Some(a) = after else { continue };
        let pct = |f: Option<&Figure>| f.map(|f| format!("{:.1}%", f.median * 100.0));
        rows.push(
            Row::new("001", format!("{name}: text in aligned 64K folios"))
                .before(pct(before))
                .after(pct(after))
                .ratio(Spread::of(a, Unit::Percent))
                .at_least(0.6),
        );
        let io = |order: u8| {
            report.figure(
                &format!("{prefix}exec_order={order}"),
                "foliocache",
                "io_requests",
            )
        };
        if !prefix.is_empty()
            && let (Some(b), Some(a)) = (io(0), io(4))
        {
            rows.push(
                Row::new("001", format!("{name}: I/O requests"))
                    .before(Some(fmt(b.median)))
                    .after(Some(fmt(a.median)))
                    .ratio(Spread::single(a.median / b.median, Unit::Times)),
            );
        }
    }
    rows
}
