//! Mapped access: fault windows for each hint against hand-computed expectations
//! (docs/KERNEL.md, "Page faults: read-around and the exec folio order"), the exec folio
//! order's alignment and region bounds, edges, and concurrent faults.

mod common;

use common::{MemBackend, byte_at, pattern};
use foliocache::raw::flag;
use foliocache::{Cache, Error, File, Policy, RegionHint};
use std::sync::Arc;

const PAGE: u64 = 4096;

fn file_with(
    policy: Policy,
    pages: u64,
    delay: Option<std::time::Duration>,
) -> (Cache, File, Arc<MemBackend>) {
    let cache = Cache::builder()
        .capacity(16 << 20)
        .policy(policy)
        .build()
        .unwrap();
    let mut backend = MemBackend::new(pattern(pages * PAGE));
    backend.delay = delay;
    let backend = Arc::new(backend);
    let file = cache.open_backend(backend.clone(), None).unwrap();
    (cache, file, backend)
}

/// The cached folios as (index, order), and the pages carrying a mark.
fn layout(file: &File) -> (Vec<(u64, u8)>, Vec<u64>) {
    let mut folios = Vec::new();
    let mut marks = Vec::new();
    let mapping = foliocache::raw::mapping(file);
    let mut i = 0;
    while let Some(next) = mapping.index().next_present(i, u64::MAX) {
        let folio = mapping.lookup(next).unwrap();
        folios.push((folio.index(), folio.order()));
        if folio.test(flag::READAHEAD) {
            marks.push(folio.index());
        }
        i = folio.index() + folio.nr_pages() as u64;
    }
    (folios, marks)
}

fn pages(range: std::ops::Range<u64>) -> Vec<(u64, u8)> {
    range.map(|i| (i, 0)).collect()
}

#[test]
fn exec_windows_are_aligned_to_the_exec_order_and_stay_in_the_region() {
    // Region: pages 10..200 of a 256-page file; window 32 pages; exec order 4 (64 KiB).
    let cases: [(u64, Vec<(u64, u8)>); 3] = [
        // Mid-region: [32, 64) in two 64 KiB folios.
        (37, vec![(32, 4), (48, 4)]),
        // Near the start: raised to the region's first page, smaller folios up to alignment.
        (11, vec![(10, 1), (12, 2), (16, 4), (32, 4)]),
        // Near the end: lowered to the region's end.
        (195, vec![(192, 3)]),
    ];
    for (fault, expected) in cases {
        let (_cache, file, _) = file_with(Policy::default(), 256, None);
        let mut region = file
            .region(10 * PAGE, 190 * PAGE, RegionHint::Exec)
            .unwrap();
        let got = region.fault(fault).unwrap();
        assert!(got.major);
        let at = ((fault - got.folio.index()) * PAGE) as usize;
        assert_eq!(got.folio.bytes().unwrap()[at], byte_at(fault * PAGE));
        drop(got);
        let (folios, marks) = layout(&file);
        assert_eq!(folios, expected, "fault at {fault}");
        assert!(marks.is_empty(), "exec windows set no mark");
        assert_eq!(file.readahead_stats().exec_windows, 1);
        let ra = region.ra_state();
        assert_eq!(ra.async_size, 0);
    }
}

#[test]
fn read_around_is_centred_on_the_fault() {
    for policy in [
        Policy::default(),
        // Exec with order 0: the behaviour before seed 001, plain read-around.
        Policy {
            exec_order: 0,
            ..Policy::default()
        },
    ] {
        let hint = if policy.exec_order == 0 {
            RegionHint::Exec
        } else {
            RegionHint::Normal
        };
        let (_cache, file, _) = file_with(policy, 256, None);
        let mut region = file.region(0, 256 * PAGE, hint).unwrap();
        region.fault(100).unwrap();
        let (folios, marks) = layout(&file);
        // start = 100 - 32/2, 32 pages, the last quarter speculative: mark at 84 + 32 - 8.
        assert_eq!(folios, pages(84..116));
        assert_eq!(marks, [108]);
        // Reaching the mark reads the next window ahead (async), as a stream would.
        assert!(!region.fault(108).unwrap().major);
        assert_eq!(file.readahead_stats().async_pipelined, 1);
        assert!(file.mapping_stats().cached_pages > 32);
    }
}

#[test]
fn random_reads_only_the_page_and_sequential_streams() {
    let (_cache, file, _) = file_with(Policy::default(), 256, None);
    let mut region = file.region(0, 256 * PAGE, RegionHint::Random).unwrap();
    region.fault(77).unwrap();
    assert_eq!(layout(&file).0, [(77, 0)]);

    let (_cache, file, _) = file_with(Policy::default(), 256, None);
    let mut region = file.region(0, 256 * PAGE, RegionHint::Sequential).unwrap();
    region.fault(0).unwrap();
    // A fresh stream asking for the whole 32-page window: [0, 32), mark halfway.
    let (folios, marks) = layout(&file);
    assert_eq!(folios, pages(0..32));
    assert_eq!(marks, [16]);
}

#[test]
fn too_many_misses_stop_read_around() {
    let (_cache, file, _) = file_with(Policy::default(), 64 * 1024, None);
    let mut region = file
        .region(0, 64 * 1024 * PAGE, RegionHint::Normal)
        .unwrap();
    // Faults 100 pages apart, never hitting what was read around.
    for k in 0..150 {
        region.fault(k * 100 + 50).unwrap();
    }
    let stats = file.readahead_stats();
    assert_eq!(stats.read_around, 100, "{stats:?}");
    assert_eq!(stats.mmap_gave_up, 50);
    assert_eq!(region.mmap_miss(), 150);
    // Hits bring it back down.
    for _ in 0..60 {
        region.fault(50).unwrap();
    }
    assert_eq!(region.mmap_miss(), 90);
}

#[test]
fn faults_at_the_edges_and_outside() {
    // A region that is not a multiple of 64 KiB, ending at a file end off a page boundary.
    let cache = Cache::builder().capacity(16 << 20).build().unwrap();
    let size = 37 * PAGE + 100;
    let backend = Arc::new(MemBackend::new(pattern(size)));
    let file = cache.open_backend(backend, None).unwrap();
    let mut region = file
        .region(3 * PAGE, size - 3 * PAGE, RegionHint::Exec)
        .unwrap();
    assert_eq!(region.pages(), (3, 38));
    for fault in [3, 37] {
        let got = region.fault(fault).unwrap();
        let at = ((fault - got.folio.index()) * PAGE) as usize;
        assert_eq!(got.folio.bytes().unwrap()[at], byte_at(fault * PAGE));
    }
    let (folios, _) = layout(&file);
    for &(index, order) in &folios {
        assert!(index >= 3 && index + (1 << order) <= 38, "{folios:?}");
        assert_eq!(index % (1 << order), 0, "naturally aligned: {folios:?}");
    }
    for outside in [2, 38, 1000] {
        assert!(matches!(
            region.fault(outside),
            Err(Error::FaultOutOfRange { .. })
        ));
    }
    assert!(matches!(
        file.region(0, 0, RegionHint::Normal),
        Err(Error::EmptyRegion)
    ));
    let memory = cache.create_memory_file(0).unwrap();
    memory.write_at(b"x", 0).unwrap();
    let mut region = memory.region(0, 1, RegionHint::Normal).unwrap();
    assert!(matches!(region.fault(0), Err(Error::NotADiskFile)));
}

#[test]
fn concurrent_faults_on_one_page_read_it_once() {
    for hint in [RegionHint::Random, RegionHint::Exec, RegionHint::Normal] {
        let (_cache, file, backend) = file_with(
            Policy::default(),
            256,
            Some(std::time::Duration::from_millis(5)),
        );
        std::thread::scope(|s| {
            for _ in 0..4 {
                let file = file.clone();
                s.spawn(move || {
                    let mut region = file.region(0, 256 * PAGE, hint).unwrap();
                    let got = region.fault(40).unwrap();
                    let at = ((40 - got.folio.index()) * PAGE) as usize;
                    assert_eq!(got.folio.bytes().unwrap()[at + 9], byte_at(40 * PAGE + 9));
                });
            }
        });
        let reads_of_40 = backend
            .requests()
            .iter()
            .filter(|&&(offset, len)| offset <= 40 * PAGE && 40 * PAGE < offset + len as u64)
            .count();
        assert_eq!(reads_of_40, 1, "{hint:?}: {:?}", backend.requests());
    }
}
