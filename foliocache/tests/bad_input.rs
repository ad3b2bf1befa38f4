//! Bad input is an `Error` (or a documented clamp), never a panic, a wrap or an abort:
//! settings out of range, huge windows, huge sparse zero-copy reads, a backend larger than the
//! largest file, huge readahead requests, and the reference count's overflow guard.

mod common;

use common::MemBackend;
use foliocache::raw::refcount::{MAX_REFS, RefCount};
use foliocache::raw::{self, init_ra_size};
use foliocache::{
    Backend, Cache, Error, MAX_READ_RUN, MAX_READAHEAD_BYTES, Policy, ReadRequest, RefcountPolicy,
};
use std::sync::Arc;

/// A shared cache too small for its mapping's fixed part is refused before any owner starts
/// (so the name's cache is never created), with the floor named. (`tests/shared.rs` runs a
/// kill storm at the floor.)
#[test]
fn a_shared_cache_below_its_floor_names_the_floor() {
    let err = Cache::builder()
        .capacity(2 << 20)
        .shared("fc-bad-input-never-created")
        .build()
        .unwrap_err();
    let Error::SharedCapacityTooSmall {
        capacity,
        minimum,
        fixed,
    } = err
    else {
        panic!("{err}");
    };
    assert_eq!(capacity, 2 << 20);
    assert!(fixed < minimum && minimum > capacity, "{err}");
    assert_eq!(minimum % 4096, 0);
    assert!(err.to_string().contains(&minimum.to_string()), "{err}");
    // One page less than the floor is refused as well.
    let err = Cache::builder()
        .capacity(minimum - 4096)
        .shared("fc-bad-input-never-created")
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::SharedCapacityTooSmall { minimum: m, .. } if m == minimum),
        "{err}"
    );
}

#[test]
fn settings_out_of_range_are_refused_at_build() {
    let err = Cache::builder()
        .policy(Policy {
            exec_order: 10,
            ..Policy::default()
        })
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::OrderTooLarge { order: 10, .. }),
        "{err}"
    );
    let err = Cache::builder()
        .policy(Policy {
            exec_order: 255,
            ..Policy::default()
        })
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::OrderTooLarge { order: 255, .. }),
        "{err}"
    );
    for pages in [0, u32::MAX as usize, usize::MAX] {
        let err = Cache::builder().arena_pages(pages).build().unwrap_err();
        assert!(matches!(err, Error::InvalidCapacity(_)), "{pages}: {err}");
    }
    let err = Cache::builder()
        .readahead_bytes(MAX_READAHEAD_BYTES + 4096)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidSetting {
                name: "readahead_bytes",
                ..
            }
        ),
        "{err}"
    );
    let err = Cache::builder()
        .readahead_bytes(u64::MAX)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("readahead_bytes"), "{err}");
    let err = Cache::builder()
        .io_request_bytes(usize::MAX)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidSetting {
                name: "io_request_bytes",
                ..
            }
        ),
        "{err}"
    );
    let err = Cache::builder().max_io_bytes(1 << 40).build().unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidSetting {
                name: "max_io_bytes",
                ..
            }
        ),
        "{err}"
    );
    // The largest accepted values build.
    Cache::builder()
        .capacity(4 << 20)
        .readahead_bytes(MAX_READAHEAD_BYTES)
        .max_io_bytes(MAX_READAHEAD_BYTES)
        .io_request_bytes(64 << 20)
        .policy(Policy {
            exec_order: 9,
            ..Policy::default()
        })
        .build()
        .unwrap();
}

#[test]
fn a_handle_clamps_its_window() {
    let cache = Cache::builder().capacity(4 << 20).build().unwrap();
    let file = cache
        .open_backend(Arc::new(MemBackend::new(vec![1; 1 << 20])), None)
        .unwrap();
    let mut handle = file.handle();
    handle.set_ra_bytes(u64::MAX);
    assert_eq!(handle.ra_state().ra_pages, MAX_READAHEAD_BYTES / 4096);
    handle.advise(foliocache::Advice::Sequential).unwrap();
    // A huge window on a small cache still reads right (the window is bounded by the file).
    let mut buf = vec![0u8; 100_000];
    assert_eq!(handle.read_at(&mut buf, 12_345).unwrap(), buf.len());
    assert!(buf.iter().all(|&b| b == 1));
    let mut region = file
        .region(0, 1 << 20, foliocache::RegionHint::Normal)
        .unwrap();
    region.set_ra_bytes(u64::MAX);
    assert_eq!(region.ra_state().ra_pages, MAX_READAHEAD_BYTES / 4096);
    assert!(region.fault(200).unwrap().folio.is_uptodate());
}

#[test]
fn huge_readahead_requests_do_not_overflow() {
    assert_eq!(init_ra_size(u64::MAX, 32), 32);
    assert_eq!(init_ra_size((1 << 63) + 1, 512), 512);
    assert_eq!(init_ra_size(0, 32), 4);
    // A read and a readahead() of the whole largest range, on a small file.
    let cache = Cache::builder().capacity(4 << 20).build().unwrap();
    let file = cache
        .open_backend(Arc::new(MemBackend::new(vec![3; 10_000])), None)
        .unwrap();
    let mut handle = file.handle();
    handle.readahead(0, u64::MAX).unwrap();
    handle.readahead(u64::MAX - 10, u64::MAX).unwrap();
    file.wait_for_io();
    let mut buf = vec![0u8; 20_000];
    assert_eq!(handle.read_at(&mut buf, 0).unwrap(), 10_000);
    assert_eq!(handle.read_at(&mut buf, u64::MAX - 1).unwrap(), 0);
}

#[derive(Debug)]
struct HugeBackend;

impl Backend for HugeBackend {
    fn size(&self) -> u64 {
        u64::MAX
    }
    fn submit(&self, requests: Vec<ReadRequest>) {
        drop(requests);
    }
}

#[test]
fn a_backend_larger_than_the_largest_file_is_refused() {
    let cache = Cache::builder().capacity(1 << 20).build().unwrap();
    let err = cache.open_backend(Arc::new(HugeBackend), None).unwrap_err();
    assert!(matches!(err, Error::FileTooLarge { .. }), "{err}");
}

#[test]
fn a_huge_sparse_zero_copy_read_is_bounded() {
    let cache = Cache::builder().capacity(1 << 20).build().unwrap();
    let file = cache.create_memory_file(9).unwrap();
    file.set_len(1 << 40).unwrap();
    file.write_at(b"end", (1 << 40) - 3).unwrap();
    let mut handle = file.handle();
    let run = handle.read_folios(0, usize::MAX).unwrap();
    assert_eq!(run.len(), MAX_READ_RUN, "clipped to MAX_READ_RUN");
    assert!(
        run.slices().len() <= MAX_READ_RUN / (2 << 20),
        "{} slices for a hole",
        run.slices().len()
    );
    assert!(run.slices().iter().all(|s| s.iter().all(|&b| b == 0)));
    drop(run);
    let tail = handle.read_folios((1 << 40) - 3, 100).unwrap();
    assert_eq!(tail.to_vec(), b"end");
}

#[test]
fn the_reference_count_aborts_before_it_can_overflow() {
    // Only leaked references can get near the limit, so the tests set the count directly; an
    // abort ends the process, so each case runs in a child.
    const NAME: &str = "the_reference_count_aborts_before_it_can_overflow";
    match common::child_role().as_deref() {
        Some("get") => {
            RefCount::with_raw(MAX_REFS).get();
            unreachable!("get past MAX_REFS must abort");
        }
        Some("try_get") => {
            RefCount::with_raw(MAX_REFS).try_get(RefcountPolicy::FrozenBit);
            unreachable!("try_get past MAX_REFS must abort");
        }
        Some("try_get_cas") => {
            RefCount::with_raw(MAX_REFS).try_get(RefcountPolicy::Cas);
            unreachable!("try_get past MAX_REFS must abort");
        }
        Some("below") => {
            // Up to the limit itself is fine.
            let count = RefCount::with_raw(MAX_REFS - 2);
            count.get();
            assert!(count.try_get(RefcountPolicy::FrozenBit));
            assert_eq!(count.raw(), MAX_REFS);
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    use std::os::unix::process::ExitStatusExt;
    for role in ["get", "try_get", "try_get_cas"] {
        let status = common::run_child(NAME, role);
        assert_eq!(status.signal(), Some(libc::SIGABRT), "{role}: {status}");
    }
    assert!(common::run_child(NAME, "below").success());
}

#[test]
fn an_allocation_failure_is_an_error_a_reader_survives() {
    let cache = Cache::builder().capacity(4 << 20).build().unwrap();
    raw::injector(&cache).fail_allocations(3);
    for _ in 0..3 {
        assert!(matches!(
            raw::alloc_folio(&cache, 0),
            Err(Error::NoMemory { order: 0 })
        ));
    }
    assert!(raw::alloc_folio(&cache, 0).is_ok(), "only three were armed");
    // Readahead and reads fall back when allocations fail: the bytes still come.
    let file = cache
        .open_backend(Arc::new(MemBackend::new(common::pattern(1 << 20))), None)
        .unwrap();
    raw::injector(&cache).fail_allocations(40);
    let mut buf = vec![0u8; 200_000];
    let mut handle = file.handle();
    assert_eq!(handle.read_at(&mut buf, 5000).unwrap(), buf.len());
    assert_eq!(buf, common::pattern(205_000)[5000..]);
}
