//! `fcache bench exec`: seed 001's folio-size table, on this machine.
//!
//! Takes a real ELF executable (default: this `fcache` binary; `--elf PATH` for another),
//! finds its executable segments from the program headers, and faults seeded random pages
//! inside them through an `Exec` region of a fresh cache, once with `exec_order` 0 (the
//! behaviour before the seed: plain read-around) and once with `exec_order` 4 (64 KiB folios,
//! the seed). Reported for each: the share of the cached text by folio size, bytes read from
//! the device, I/O count, read amplification (bytes read over the bytes of distinct pages
//! faulted), index metadata, and the cost of a fault that hits (interleaved repetitions).

use super::report::{Figure, Plot, Ratio, Report, interleaved};
use super::{BenchArgs, Rng};
use foliocache::{Cache, File, OpenOptions, Policy, Region, RegionHint};
use indicatif::{ProgressBar, ProgressStyle};
use object::read::elf::{ElfFile64, ProgramHeader};
use serde_json::json;
use std::collections::BTreeSet;
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

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let path: PathBuf = match &args.elf {
        Some(path) => path.clone(),
        None => std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?,
    };
    let texts = text_segments(&path)?;
    let text_pages: u64 = texts
        .iter()
        .map(|t| (t.offset + t.len).div_ceil(4096) - t.offset / 4096)
        .sum();
    let faults = if args.full {
        16 * text_pages
    } else {
        4 * text_pages
    }
    .min(2_000_000);
    let reps = args.reps();
    let hit_faults = 200_000u64;
    let mut report = Report::new(
        "exec",
        json!({
            "elf": path.display().to_string(),
            "text_segments": texts.iter().map(|t| json!({"offset": t.offset, "bytes": t.len, "vaddr": t.vaddr})).collect::<Vec<_>>(),
            "text_pages": text_pages,
            "faults": faults,
            "seed": 42,
            "readahead_window_pages": 32,
            "hit_faults_per_measurement": hit_faults,
            "reps": reps,
        }),
    );
    let bar = ProgressBar::new((ORDERS.len() as u64) * faults + (reps as u64 + 1) * 2).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("exec");
    let mut sides = Vec::new();
    let mut buffered_any = false;
    for &order in &ORDERS {
        bar.set_message(format!("exec_order={order}: faulting"));
        let (mut side, buffered) = open_side(&path, &texts, order)?;
        buffered_any |= buffered;
        let bounds: Vec<(u64, u64)> = side.regions.iter().map(Region::pages).collect();
        let mut rng = Rng(42);
        for _ in 0..faults {
            let (r, page) = pick(&mut rng, &bounds, text_pages);
            side.regions[r].fault(page).map_err(|e| e.to_string())?;
            side.faulted.insert(page);
            bar.inc(1);
        }
        sides.push(side);
    }
    // Hit-fault cost, both systems interleaved; faults on pages already cached.
    let hit_pages: Vec<Vec<(usize, u64)>> = sides
        .iter()
        .map(|side| {
            let bounds: Vec<(u64, u64)> = side.regions.iter().map(Region::pages).collect();
            let mut rng = Rng(7);
            (0..4096)
                .map(|_| pick(&mut rng, &bounds, text_pages))
                .filter(|&(_, p)| side.faulted.contains(&p))
                .collect()
        })
        .collect();
    bar.set_message("hit-fault cost");
    let (samples, busy) = interleaved(reps, sides.len(), &bar, |which| {
        let side = &mut sides[which];
        let pages = &hit_pages[which];
        let start = Instant::now();
        for k in 0..hit_faults {
            let (r, page) = pages[k as usize % pages.len()];
            let fault = side.regions[r].fault(page).map_err(|e| e.to_string())?;
            std::hint::black_box(&fault.folio);
        }
        Ok(start.elapsed().as_nanos() as f64 / hit_faults as f64)
    })?;
    bar.finish_and_clear();

    let mut shares_by_side = Vec::new();
    for (k, side) in sides.iter().enumerate() {
        let case = format!("exec_order={}", ORDERS[k]);
        let (pages, va_aligned) = classify(side, &texts);
        let total: u64 = pages.iter().sum::<u64>().max(1);
        report.results.push(Figure::new(
            &case,
            "foliocache",
            "share_64k_va_aligned",
            &[va_aligned as f64 / total as f64],
            false,
        ));
        let shares: Vec<f64> = pages.iter().map(|&p| p as f64 / total as f64).collect();
        for (class, share) in CLASSES.iter().zip(&shares) {
            let metric = format!(
                "share_{}",
                class.to_lowercase().replace(' ', "_").replace('+', "_plus")
            );
            report
                .results
                .push(Figure::new(&case, "foliocache", &metric, &[*share], false));
        }
        let io = side.file.io_stats();
        let distinct = side.faulted.len() as f64 * 4096.0;
        let stats = side.file.mapping_stats();
        let single = |metric: &str, v: f64| Figure::new(&case, "foliocache", metric, &[v], false);
        report.results.push(single("bytes_read", io.bytes as f64));
        report
            .results
            .push(single("io_requests", io.requests as f64));
        report
            .results
            .push(single("read_amplification", io.bytes as f64 / distinct));
        report
            .results
            .push(single("index_bytes", stats.index_bytes as f64));
        report
            .results
            .push(single("cached_pages", stats.cached_pages as f64));
        report.results.push(Figure::new(
            &case,
            "foliocache",
            "hit_fault_ns",
            &samples[k],
            busy,
        ));
        let ra = side.file.readahead_stats();
        report.notes.push(format!(
            "{case}: {} read-around windows, {} exec windows, {} gave up on misses; cache {} MiB free of {}",
            ra.read_around,
            ra.exec_windows,
            ra.mmap_gave_up,
            (side.cache.stats().free_pages * 4096) >> 20,
            (side.cache.stats().total_pages * 4096) >> 20,
        ));
        shares_by_side.push(shares);
    }
    for metric in [
        "bytes_read",
        "io_requests",
        "read_amplification",
        "index_bytes",
        "hit_fault_ns",
    ] {
        let after = report
            .figure("exec_order=4", "foliocache", metric)
            .map(|f| f.median);
        let before = report
            .figure("exec_order=0", "foliocache", metric)
            .map(|f| f.median);
        if let (Some(a), Some(b)) = (after, before) {
            report.ratios.push(Ratio {
                case: "exec_order=4 / exec_order=0".into(),
                what: metric.into(),
                ratio: a / b,
            });
        }
    }
    // The seed's table: share of cached text by folio size, before and after.
    let mut table = String::from(
        "Share of cached text by folio size (seed 001's table):\n\n| folio size | exec_order=0 (before) | exec_order=4 (after) |\n|---|---:|---:|\n",
    );
    for (c, class) in CLASSES.iter().enumerate() {
        table.push_str(&format!(
            "| {class} | {:.1}% | {:.1}% |\n",
            100.0 * shares_by_side[0][c],
            100.0 * shares_by_side[1][c]
        ));
    }
    report.notes.insert(0, table);
    let shifts: Vec<String> = texts
        .iter()
        .map(|t| format!("{:#x}", t.vaddr.wrapping_sub(t.offset) % (64 << 10)))
        .collect();
    report.notes.push(format!(
        "Folios are naturally aligned in the file (\"64K aligned\" counts 64 KiB folios). Whether \
         one maps at a 64 KiB-aligned address also depends on the ELF layout: here virtual \
         address minus file offset is {} modulo 64 KiB for the executable segment(s) \
         (share_64k_va_aligned is what arm64's contpte could map with one TLB entry; seed \
         001's follow-ups align file mappings to the exec folio size for this reason).",
        shifts.join(", ")
    ));
    if buffered_any {
        report.notes.push(format!(
            "{} is on a file system without direct I/O: it was read through the kernel's page cache (buffered_fallback); the folio layout is the same",
            path.display()
        ));
    }
    report.plots.push(Plot {
        file: "exec.svg".into(),
        title: "exec: share of cached text by folio size".into(),
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
                        .map(|(k, order)| {
                            (format!("exec_order={order}"), 100.0 * shares_by_side[k][c])
                        })
                        .collect(),
                )
            })
            .collect(),
    });
    Ok(report)
}
