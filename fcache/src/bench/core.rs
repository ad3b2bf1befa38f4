//! `fcache bench core`: the foundation's figures.
//!
//! * `index-metadata/*`: bytes of index nodes per cached 4 KiB page, for dense files of several
//!   folio orders and for a sparse one (the bar: at most 1% of the data for dense files);
//! * `try_get+put/threads=N`: the refcount protocol alone, N threads on one folio's count,
//!   FrozenBit (seed 002) against Cas (before), interleaved;
//! * `lookup-hit`: a speculative lookup (walk, try_get, reload, put) of a cached page;
//! * `insert/32-folio-run`: 32 order-0 folios inserted one by one (32 lock holds) against one
//!   `add_folio_range` (one lock hold), in ns per folio.

use super::BenchArgs;
use super::measure::{Placement, interleaved, run_threads};
use super::report::{Figure, Plot, Report};
use super::summary::{Row, Spread, Unit, value};
use foliocache::raw::refcount::RefCount;
use foliocache::raw::{self, NewFolio};
use foliocache::{Cache, Policy, RefcountPolicy};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const POLICIES: [(&str, RefcountPolicy); 2] = [
    ("foliocache/frozen-bit", RefcountPolicy::FrozenBit),
    ("foliocache/cas", RefcountPolicy::Cas),
];

struct Sizes {
    dense_pages: u64,
    case_time: Duration,
    insert_runs: usize,
}

pub(crate) fn run(args: &BenchArgs) -> Result<Report, String> {
    let sizes = if args.full {
        Sizes {
            dense_pages: 262_144,
            case_time: Duration::from_millis(1000),
            insert_runs: 2000,
        }
    } else {
        Sizes {
            dense_pages: 16_384,
            case_time: Duration::from_millis(200),
            insert_runs: 300,
        }
    };
    let reps = args.reps();
    let threads: Vec<usize> = args.threads.clone().map_or_else(
        || vec![1, 2],
        |t| t.into_iter().map(|n| n as usize).collect(),
    );
    let mut report = Report::new(
        "core",
        json!({
            "dense_file_pages": sizes.dense_pages,
            "seconds_per_case": sizes.case_time.as_secs_f64(),
            "insert_runs_per_rep": sizes.insert_runs,
            "reps": reps,
            "threads": threads,
        }),
    );
    let steps = 5 + (threads.len() * 2 + 2 + 2) * reps;
    let bar = ProgressBar::new(steps as u64).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix("core");

    index_metadata(&mut report, &sizes, &bar)?;
    refcount(&mut report, &sizes, &threads, reps, &bar)?;
    lookup_hit(&mut report, &sizes, reps, &bar)?;
    insertion(&mut report, &sizes, reps, &bar)?;
    bar.finish_and_clear();

    for &t in &threads {
        report.ratio(
            &format!("try_get+put/threads={t}"),
            "Mops/s",
            POLICIES[0].0,
            POLICIES[1].0,
        );
    }
    report.ratio("lookup-hit", "ns/op", POLICIES[0].0, POLICIES[1].0);
    report.ratio(
        "insert/32-folio-run",
        "ns/folio",
        "foliocache/insert_range",
        "foliocache/one-by-one",
    );
    report.plots.push(Plot {
        file: "core-refcount.svg".into(),
        title: "try_get + put on one folio: FrozenBit (seed 002) vs Cas".into(),
        unit: "Mops/s (all threads)".into(),
        groups: threads
            .iter()
            .map(|t| {
                let case = format!("try_get+put/threads={t}");
                let bars = POLICIES
                    .iter()
                    .filter_map(|(name, _)| {
                        report
                            .figure(&case, name, "Mops/s")
                            .map(|f| ((*name).to_string(), f.median))
                    })
                    .collect();
                (format!("{t} thread(s)"), bars)
            })
            .collect(),
    });
    report.notes.push(
        "index-metadata: the sparse case (one cached page in every 64) needs a whole leaf per page, \
         as the kernel's xarray does; the 1% bar is for dense files."
            .into(),
    );
    Ok(report)
}

fn index_metadata(report: &mut Report, sizes: &Sizes, bar: &ProgressBar) -> Result<(), String> {
    let cache = Cache::builder()
        .arena_pages(sizes.dense_pages as usize)
        .build()
        .map_err(|e| e.to_string())?;
    let layouts: [(&str, u8, u64); 5] = [
        ("dense/order-0", 0, 1),
        ("dense/order-2", 2, 1),
        ("dense/order-4", 4, 1),
        ("dense/order-9", 9, 1),
        ("sparse-1-in-64/order-0", 0, 64),
    ];
    let mut counters = Vec::new();
    for (name, order, stride) in layouts {
        bar.set_message(format!("index metadata {name}"));
        let file = raw::new_mapping(&cache);
        let nr = 1u64 << order;
        let folios = sizes.dense_pages / nr / stride;
        let mut batch: Vec<NewFolio<'_>> = Vec::with_capacity(32);
        let mut index = 0;
        for _ in 0..folios {
            let folio = raw::alloc_folio(&cache, order).map_err(|e| e.to_string())?;
            if stride == 1 {
                batch.push(folio);
                if batch.len() == 32 {
                    file.add_folio_range(index, std::mem::take(&mut batch))
                        .map_err(|e| e.to_string())?;
                    index += 32 * nr;
                }
            } else {
                file.add_folio(folio, index).map_err(|e| e.to_string())?;
                index += stride * nr;
            }
        }
        file.add_folio_range(index, batch)
            .map_err(|e| e.to_string())?;
        let stats = file.stats();
        let per_page = stats.index_bytes as f64 / stats.cached_pages as f64;
        let case = format!("index-metadata/{name}");
        report.results.push(Figure::new(
            &case,
            "foliocache",
            "index_bytes_per_page",
            &[per_page],
            0,
        ));
        report.results.push(Figure::new(
            &case,
            "foliocache",
            "percent_of_data",
            &[per_page / 4096.0 * 100.0],
            0,
        ));
        counters.push(json!({"case": case, "cached_pages": stats.cached_pages, "index_nodes": stats.index_nodes}));
        bar.inc(1);
    }
    report.counters = json!({ "index_metadata": counters });
    Ok(())
}

/// `threads` threads run try_get + put on one count for `time`; returns total Mops/s.
fn try_get_put(policy: RefcountPolicy, threads: usize, time: Duration) -> f64 {
    let count = RefCount::new_free(policy);
    count.init();
    let work = |_thread: usize, stop: &AtomicBool| -> u64 {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..256 {
                let got = count.try_get(policy);
                debug_assert!(got);
                black_box(count.put(policy));
            }
            n += 256;
        }
        n
    };
    run_threads(threads, time, Placement::Free, &work).0 / 1e6
}

fn refcount(
    report: &mut Report,
    sizes: &Sizes,
    threads: &[usize],
    reps: usize,
    bar: &ProgressBar,
) -> Result<(), String> {
    for &t in threads {
        bar.set_message(format!("try_get+put, {t} thread(s)"));
        let rounds = interleaved(reps, 2, bar, |which| {
            Ok(try_get_put(POLICIES[which].1, t, sizes.case_time))
        })?;
        let case = format!("try_get+put/threads={t}");
        for (which, (name, _)) in POLICIES.iter().enumerate() {
            report.results.push(Figure::new(
                &case,
                name,
                "Mops/s",
                &rounds.samples[which],
                rounds.busy_count(which),
            ));
        }
        report.paired(
            &case,
            (POLICIES[0].0, &rounds.samples[0]),
            (POLICIES[1].0, &rounds.samples[1]),
            rounds.busy_rounds(&[0, 1]),
        );
    }
    Ok(())
}

fn lookup_hit(
    report: &mut Report,
    sizes: &Sizes,
    reps: usize,
    bar: &ProgressBar,
) -> Result<(), String> {
    bar.set_message("lookup hit");
    const PAGES: u64 = 4096;
    let caches: Vec<Cache> = POLICIES
        .iter()
        .map(|(_, refcount)| {
            Cache::builder()
                .arena_pages(PAGES as usize)
                .policy(Policy {
                    refcount: *refcount,
                    ..Policy::default()
                })
                .build()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let files: Vec<_> = caches.iter().map(raw::new_mapping).collect();
    for (cache, file) in caches.iter().zip(&files) {
        for k in 0..PAGES / 32 {
            let chunk: Vec<_> = (0..32)
                .map(|_| raw::alloc_folio(cache, 0))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            for locked in file
                .add_folio_range(k * 32, chunk)
                .map_err(|e| e.to_string())?
                .inserted
            {
                locked.end_read(true);
            }
        }
    }
    let rounds = interleaved(reps, 2, bar, |which| {
        let file = &files[which];
        let start = Instant::now();
        let mut n = 0u64;
        let mut i = 0u64;
        while start.elapsed() < sizes.case_time {
            for _ in 0..1024 {
                // A stride coprime with the file size visits every page.
                i = (i + 1553) % PAGES;
                black_box(file.lookup(black_box(i)));
            }
            n += 1024;
        }
        Ok(start.elapsed().as_nanos() as f64 / n as f64)
    })?;
    for (which, (name, _)) in POLICIES.iter().enumerate() {
        report.results.push(Figure::new(
            "lookup-hit",
            name,
            "ns/op",
            &rounds.samples[which],
            rounds.busy_count(which),
        ));
    }
    Ok(())
}

fn insertion(
    report: &mut Report,
    sizes: &Sizes,
    reps: usize,
    bar: &ProgressBar,
) -> Result<(), String> {
    bar.set_message("insert 32-folio runs");
    const RUN: usize = 32;
    let cache = Cache::builder()
        .capacity(16 << 20)
        .build()
        .map_err(|e| e.to_string())?;
    let variants = ["foliocache/insert_range", "foliocache/one-by-one"];
    let mut locks = [0u64; 2];
    let rounds = interleaved(reps, 2, bar, |which| {
        let mut timed = Duration::ZERO;
        for _ in 0..sizes.insert_runs {
            // Fresh folios every run (a folio that was cached cannot go in again); allocating
            // them is not timed.
            let folios: Vec<_> = (0..RUN)
                .map(|_| raw::alloc_folio(&cache, 0))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            let file = raw::new_mapping(&cache);
            // The lock guards are kept until after the clock stops (their unlocks are not
            // insertion work).
            let mut guards = Vec::with_capacity(RUN);
            let start = Instant::now();
            if which == 0 {
                let added = file.add_folio_range(0, folios).map_err(|e| e.to_string())?;
                guards.extend(added.inserted);
            } else {
                for (i, f) in folios.into_iter().enumerate() {
                    let (locked, _) = file.add_folio(f, i as u64).map_err(|e| e.to_string())?;
                    guards.push(locked);
                }
            }
            timed += start.elapsed();
            assert_eq!(guards.len(), RUN);
            locks[which] = file.stats().lock_acquisitions;
            drop(guards);
            drop(file);
        }
        Ok(timed.as_nanos() as f64 / (sizes.insert_runs * RUN) as f64)
    })?;
    for (which, name) in variants.iter().enumerate() {
        report.results.push(Figure::new(
            "insert/32-folio-run",
            name,
            "ns/folio",
            &rounds.samples[which],
            rounds.busy_count(which),
        ));
        report.results.push(Figure::new(
            "insert/32-folio-run",
            name,
            "locks_per_run",
            &[locks[which] as f64],
            0,
        ));
    }
    Ok(())
}

/// The summary's rows: the refcount protocol alone (seed 002's change without the read path
/// around it) and batched insertion's lock holds (seed 000's).
pub(crate) fn summary(report: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    let case = "try_get+put/threads=2";
    if let Some(paired) = report.paired_ratio(case, POLICIES[0].0, POLICIES[1].0) {
        let frozen = report.figure(case, POLICIES[0].0, "Mops/s");
        let cas = report.figure(case, POLICIES[1].0, "Mops/s");
        rows.push(
            Row::new("core", "try_get+put, 2 threads: frozen-bit vs cas")
                .before(value(cas, 1.0, "M/s"))
                .after(value(frozen, 1.0, "M/s"))
                .ratio(Spread::of(paired, Unit::Times))
                .at_least(1.0)
                .busy_from(&[frozen, cas]),
        );
    }
    let insert = "insert/32-folio-run";
    let (range, single) = (
        report.figure(insert, "foliocache/insert_range", "ns/folio"),
        report.figure(insert, "foliocache/one-by-one", "ns/folio"),
    );
    if let (Some(r), Some(s)) = (range, single) {
        rows.push(
            Row::new("core", "insert 32 folios: 1 lock hold vs 32 (ns)")
                .before(value(single, 1.0, "ns"))
                .after(value(range, 1.0, "ns"))
                .ratio(Spread::single(r.median / s.median, Unit::Times))
                .goal("≤ 1.00×", r.median <= s.median)
                .busy_from(&[range, single]),
        );
    }
    rows
}
