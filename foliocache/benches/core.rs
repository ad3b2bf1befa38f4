//! Micro-benchmarks of the core: lookup hit, the refcount protocol (FrozenBit vs Cas, one and
//! two threads on one folio), an epoch pin (one and two threads), insertion one by one vs a run under one lock hold, and a 64-byte
//! read optimistic (no reference) vs referenced, and a readahead window fill with batched vs
//! single insertion (seeds 000/003).
//!
//! `cargo bench -p foliocache --bench core` (add `-- --quick` for a shorter run).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use foliocache::raw::refcount::RefCount;
use foliocache::raw::{self, LockedFolio, NewFolio};
use foliocache::{Backend, Cache, InsertPolicy, Policy, ReadRequest, RefcountPolicy};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

const POLICIES: [(&str, RefcountPolicy); 2] = [
    ("frozen-bit", RefcountPolicy::FrozenBit),
    ("cas", RefcountPolicy::Cas),
];

fn lookup_hit(c: &mut Criterion) {
    let mut group = c.benchmark_group("lookup_hit");
    for (name, refcount) in POLICIES {
        let cache = Cache::builder()
            .capacity(64 << 20)
            .policy(Policy {
                refcount,
                ..Policy::default()
            })
            .build()
            .unwrap();
        let file = raw::new_mapping(&cache);
        let folios: Vec<_> = (0..4096)
            .map(|_| raw::alloc_folio(&cache, 0).unwrap())
            .collect();
        for locked in file.add_folio_range(0, folios).unwrap().inserted {
            locked.end_read(true);
        }
        let mut i = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) & 4095;
                black_box(file.lookup(black_box(i)))
            });
        });
    }
    group.finish();
}

/// Runs `per_thread(iters)` on this thread (`threads` = 1) or on `threads` threads at once, and
/// returns the wall time.
fn timed(threads: usize, iters: u64, per_thread: &(dyn Fn(u64) + Sync)) -> Duration {
    if threads == 1 {
        let start = Instant::now();
        per_thread(iters);
        start.elapsed()
    } else {
        concurrently(threads, iters, per_thread)
    }
}

/// Runs `per_thread(iters)` on `threads` threads at once and returns the wall time.
fn concurrently(threads: usize, iters: u64, per_thread: &(dyn Fn(u64) + Sync)) -> Duration {
    let barrier = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                per_thread(iters);
            });
        }
        barrier.wait();
        let start = Instant::now();
        // The scope joins every thread before returning.
        start
    })
    .elapsed()
}

fn refcount(c: &mut Criterion) {
    let mut group = c.benchmark_group("try_get_put");
    for threads in [1usize, 2] {
        for (name, policy) in POLICIES {
            let count = RefCount::new_free(policy);
            count.init();
            group.bench_with_input(
                BenchmarkId::new(name, format!("{threads}-thread")),
                &threads,
                |b, &threads| {
                    b.iter_custom(|iters| {
                        let work = |n: u64| {
                            for _ in 0..n {
                                assert!(count.try_get(policy));
                                black_box(count.put(policy));
                            }
                        };
                        timed(threads, iters, &work)
                    });
                },
            );
        }
    }
    group.finish();
}

/// An epoch pin and unpin (the read side of the crate's RCU), one and two threads: with two,
/// the time per pair should stay that of one thread, since a pin writes only its own line.
fn epoch_pin(c: &mut Criterion) {
    let mut group = c.benchmark_group("epoch_pin_unpin");
    for threads in [1usize, 2] {
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{threads}-thread")),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    let work = |n: u64| {
                        for _ in 0..n {
                            drop(black_box(foliocache::raw::epoch::pin()));
                        }
                    };
                    timed(threads, iters, &work)
                });
            },
        );
    }
    group.finish();
}

fn insertion(c: &mut Criterion) {
    const RUN: usize = 32;
    let cache = Cache::builder().capacity(16 << 20).build().unwrap();
    let fresh = || -> Vec<NewFolio<'_>> {
        (0..RUN)
            .map(|_| raw::alloc_folio(&cache, 0).unwrap())
            .collect()
    };
    // Lock acquisitions per 32-folio run, printed once.
    for (name, ranged) in [("one-by-one", false), ("insert_range", true)] {
        let file = raw::new_mapping(&cache);
        drop(insert(&file, fresh(), ranged));
        eprintln!(
            "insert {name}: {} lock acquisitions per {RUN}-folio run",
            file.stats().lock_acquisitions
        );
    }
    let mut group = c.benchmark_group("insert_32_folios");
    for (name, ranged) in [("one-by-one", false), ("insert_range", true)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    // Fresh folios each time (a folio that was cached cannot go in again);
                    // allocating them and dropping the mapping are not timed.
                    let folios = fresh();
                    let file = raw::new_mapping(&cache);
                    let start = Instant::now();
                    let guards = insert(&file, folios, ranged);
                    total += start.elapsed();
                    drop(guards);
                    drop(file);
                }
                total
            });
        });
    }
    group.finish();
}

/// Inserts the folios at pages 0.. and returns their lock guards (so that unlocking them is
/// not timed).
fn insert<'c>(
    file: &raw::Mapping,
    folios: Vec<NewFolio<'c>>,
    ranged: bool,
) -> Vec<LockedFolio<'c>> {
    let count = folios.len();
    let guards: Vec<_> = if ranged {
        file.add_folio_range(0, folios).unwrap().inserted
    } else {
        folios
            .into_iter()
            .enumerate()
            .map(|(i, f)| file.add_folio(f, i as u64).unwrap().0)
            .collect()
    };
    assert_eq!(guards.len(), count);
    guards
}

/// A 64-byte read of a cached page: optimistic (no reference) vs referenced (try_get + put).
fn small_read(c: &mut Criterion) {
    let cache = Cache::builder().capacity(4 << 20).build().unwrap();
    let file = cache.create_memory_file(0).unwrap();
    file.write_at(&[7u8; 4096], 0).unwrap();
    let mut group = c.benchmark_group("read_64B");
    for (name, policy) in [
        ("optimistic", foliocache::SmallReadPolicy::Optimistic),
        ("referenced", foliocache::SmallReadPolicy::Refcounted),
    ] {
        let mut handle = file.handle();
        handle.set_small_read_policy(policy);
        let mut buf = [0u8; 64];
        group.bench_function(name, |b| {
            b.iter(|| black_box(handle.read_at(&mut buf, black_box(128)).unwrap()));
        });
    }
    group.finish();
}

/// A backend whose reads complete at once without touching the folios: the fill benchmark
/// measures the cache's work (allocate, insert, build requests, complete), not a copy.
#[derive(Debug)]
struct NullBackend(u64);

impl Backend for NullBackend {
    fn size(&self) -> u64 {
        self.0
    }
    fn submit(&self, requests: Vec<ReadRequest>) {
        for request in requests {
            let len = request.len();
            request.complete(Ok(len));
        }
    }
}

/// One forced readahead window of order-0 pages from an empty file: 128 pages (512 KiB, one
/// request), the kernel's `page_cache_ra_unbounded` loop that seed 000 batches, and 2048
/// (8 MiB, readseq's window: sixteen requests). Per folio.
fn readahead_fill(c: &mut Criterion) {
    for pages in [128u64, 2048] {
        let mut group = c.benchmark_group(format!("readahead_fill_{pages}_pages"));
        for (name, insert) in [
            ("single", InsertPolicy::Single),
            ("batched", InsertPolicy::Batched),
        ] {
            let cache = Cache::builder()
                .capacity(64 << 20)
                .max_io_bytes(pages * 4096)
                .policy(Policy {
                    insert,
                    ..Policy::default()
                })
                .build()
                .unwrap();
            let backend: Arc<dyn Backend> = Arc::new(NullBackend(1 << 30));
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let file = cache.open_backend(Arc::clone(&backend), Some(0)).unwrap();
                        let mut handle = file.handle();
                        let start = Instant::now();
                        handle.readahead(0, pages * 4096).unwrap();
                        total += start.elapsed();
                        assert_eq!(file.mapping_stats().cached_pages, pages);
                        // Dropping the file (and freeing its folios) is not timed.
                        drop(handle);
                        drop(file);
                        cache.evict(0);
                    }
                    total / pages as u32
                });
            });
        }
        group.finish();
    }
}

criterion_group!(
    benches,
    lookup_hit,
    refcount,
    epoch_pin,
    insertion,
    small_read,
    readahead_fill
);
criterion_main!(benches);
