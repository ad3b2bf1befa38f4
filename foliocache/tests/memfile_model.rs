//! Memory files against a `Vec<u8>` model: random write / fallocate / punch_hole / set_len,
//! checked after every step by whole-file reads with both read policies and the zero-copy
//! path, over both folio-order settings (4 KiB only, and up to 2 MiB), with capacities small
//! enough that changes run out of space (they must then leave the file unchanged).

use foliocache::{Cache, Error, File, PAGE_SIZE, Policy, ReadPolicy};
use proptest::prelude::*;

const SPAN: u64 = 3 << 20; // offsets used: the first 3 MiB

#[derive(Debug, Clone)]
enum Op {
    Write { pos: u64, len: usize, seed: u8 },
    Fallocate { pos: u64, len: u64 },
    Punch { pos: u64, len: u64 },
    SetLen { len: u64 },
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0..SPAN,
        1 => (0..SPAN / PAGE_SIZE as u64).prop_map(|p| p * PAGE_SIZE as u64),
        1 => (0u64..2).prop_map(|k| k * (2 << 20)),
    ]
}

fn length() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 1u64..9000, 2 => 1u64..200_000, 1 => Just(2u64 << 20)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (offset(), length(), any::<u8>()).prop_map(|(pos, len, seed)| Op::Write { pos, len: len as usize, seed }),
        2 => (offset(), length()).prop_map(|(pos, len)| Op::Fallocate { pos, len }),
        2 => (offset(), length()).prop_map(|(pos, len)| Op::Punch { pos, len }),
        2 => offset().prop_map(|len| Op::SetLen { len }),
    ]
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i * 7 + i / 4096) as u8) | 1)
        .collect()
}

/// Applies `op` to `file`; on success also to `model`. Running out of space must leave the
/// file unchanged (checked by the caller's comparison with the unchanged model).
fn apply(file: &File, model: &mut Vec<u8>, op: &Op) {
    let result = match *op {
        Op::Write { pos, len, seed } => {
            let data = pattern(seed, len);
            file.write_at(&data, pos).map(|n| {
                assert_eq!(n, len);
                let end = pos as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[pos as usize..end].copy_from_slice(&data);
            })
        }
        Op::Fallocate { pos, len } => file.fallocate(pos, len).map(|()| {
            let end = (pos + len) as usize;
            if model.len() < end {
                model.resize(end, 0);
            }
        }),
        Op::Punch { pos, len } => file.punch_hole(pos, len).map(|()| {
            let lo = (pos as usize).min(model.len());
            let hi = ((pos + len) as usize).min(model.len());
            model[lo..hi].fill(0);
        }),
        Op::SetLen { len } => file.set_len(len).map(|()| model.resize(len as usize, 0)),
    };
    match result {
        Ok(()) | Err(Error::NoSpace { .. }) => {}
        Err(other) => panic!("{op:?}: {other}"),
    }
}

fn check(file: &File, model: &[u8], context: &str) {
    assert_eq!(file.size(), model.len() as u64, "{context}: size");
    let mut handle = file.handle();
    let mut whole = vec![0xEE; model.len() + 100];
    let n = handle.read_at(&mut whole, 0).unwrap();
    assert_eq!(n, model.len(), "{context}: short read");
    if whole[..n] != *model {
        let at = whole.iter().zip(model).position(|(a, b)| a != b).unwrap();
        panic!(
            "{context}: first difference at byte {at}: {} vs model {}",
            whole[at], model[at]
        );
    }
    assert!(
        whole[n..].iter().all(|&b| b == 0xEE),
        "{context}: wrote past the short read"
    );
    // The zero-copy path sees the same bytes.
    let run = handle.read_folios(0, model.len() + 100).unwrap();
    assert_eq!(run.len(), model.len());
    assert!(run.to_vec() == model, "{context}: read_folios differs");
}

/// Where the small-read probes read (64 bytes each): page 0, inside the first large folio,
/// and further out.
const PROBES: [u64; 4] = [0, 100, 3 * 4096 + 10, (1 << 20) + 4000];

/// Small reads through handles kept across changes, one per probe position: each read after
/// the first may start from the folio its handle read last (the handle's recent folio), which
/// the change may have replaced, punched or truncated. Every read must match the model.
fn check_probes(probes: &mut [foliocache::Handle], model: &[u8], context: &str) {
    for (handle, &pos) in probes.iter_mut().zip(&PROBES) {
        // Twice: the second read of an unchanged folio starts from it.
        for _ in 0..2 {
            let mut buf = [0xEEu8; 64];
            let n = handle.read_at(&mut buf, pos).unwrap();
            let want = model
                .get(pos as usize..)
                .map_or(&[][..], |rest| &rest[..rest.len().min(64)]);
            assert_eq!(&buf[..n], want, "{context}: 64 bytes at {pos}");
        }
    }
}

fn build(max_order: u8, pages: u64, read: ReadPolicy) -> (Cache, File) {
    let cache = Cache::builder()
        .arena_pages(pages as usize)
        .policy(Policy {
            read,
            ..Policy::default()
        })
        .build()
        .unwrap();
    let file = cache.create_memory_file(max_order).unwrap();
    (cache, file)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn memory_file_matches_a_vec(
        ops in prop::collection::vec(op(), 1..30),
        huge in any::<bool>(),
        room in 0..3usize,
        reads in prop::collection::vec((0..SPAN + 8192, 0usize..300_000), 6),
    ) {
        let max_order = if huge { 9 } else { 0 };
        // A tight cache makes changes run out of space (and must then change nothing); a
        // 160 MiB one has its folio table in huge pages of its own.
        let pages = [700, 8192, 40960][room];
        let (_batched_cache, batched) = build(max_order, pages, ReadPolicy::Batched);
        let (_per_folio_cache, per_folio) = build(max_order, pages, ReadPolicy::PerFolio);
        let mut model = Vec::new();
        let mut model2 = Vec::new();
        let mut probes: Vec<_> = PROBES.iter().map(|_| batched.handle()).collect();
        for (k, op) in ops.iter().enumerate() {
            apply(&batched, &mut model, op);
            apply(&per_folio, &mut model2, op);
            check(&batched, &model, &format!("batched, op {k} {op:?}"));
            check(&per_folio, &model2, &format!("per-folio, op {k} {op:?}"));
            check_probes(&mut probes, &model, &format!("probes, op {k} {op:?}"));
        }
        // Random reads: both policies agree byte for byte, with each other and the model.
        for (pos, len) in reads {
            let mut a = vec![1u8; len];
            let mut b = vec![2u8; len];
            let na = batched.read_at(&mut a, pos).unwrap();
            let nb = per_folio.read_at(&mut b, pos).unwrap();
            let want = model.get(pos as usize..).map_or(0, |rest| rest.len().min(len));
            prop_assert_eq!(na, want);
            if model == model2 {
                prop_assert_eq!(nb, want);
                prop_assert!(a[..na] == b[..nb], "policies differ at {}..+{}", pos, len);
            }
            if na > 0 {
                prop_assert!(a[..na] == model[pos as usize..pos as usize + na]);
            }
        }
    }
}

#[test]
fn reads_at_and_past_end_of_file_and_zero_length() {
    let (_cache, file) = build(0, 64, ReadPolicy::Batched);
    file.write_at(b"hello", 4090).unwrap();
    assert_eq!(file.size(), 4095);
    let mut buf = [9u8; 16];
    assert_eq!(file.read_at(&mut buf, 4095).unwrap(), 0, "at EOF");
    assert_eq!(file.read_at(&mut buf, 1 << 40).unwrap(), 0, "past EOF");
    assert_eq!(file.read_at(&mut [], 0).unwrap(), 0, "zero length");
    assert_eq!(
        file.read_at(&mut buf, 4088).unwrap(),
        7,
        "short read at EOF"
    );
    assert_eq!(&buf[..7], b"\0\0hello");
    assert_eq!(buf[7], 9, "nothing written past the short read");
    assert_eq!(file.read_at(&mut buf, 0).unwrap(), 16);
    assert_eq!(buf, [0; 16], "the hole before the data reads as zeros");
}

#[test]
fn holes_allocate_nothing_and_large_folios_are_used() {
    let (cache, file) = build(9, 4096, ReadPolicy::Batched);
    let free = cache.stats().free_pages;
    file.set_len(1 << 30).unwrap();
    assert_eq!(
        cache.stats().free_pages,
        free,
        "a 1 GiB hole costs no memory"
    );
    file.write_at(&[7; 100], 5 << 20).unwrap();
    let folio = foliocache::raw::mapping(&file)
        .lookup((5 << 20) / 4096)
        .unwrap();
    assert_eq!(folio.order(), 9, "huge=always: a 2 MiB folio");
    drop(folio);
    assert_eq!(free - cache.stats().free_pages, 512);
    file.fallocate(0, 8192).unwrap();
    assert_eq!(
        free - cache.stats().free_pages,
        1024,
        "fallocate allocates (one 2 MiB block)"
    );
}

#[test]
fn out_of_space_leaves_the_file_unchanged() {
    let (cache, file) = build(0, 16, ReadPolicy::Batched);
    file.write_at(&[1; 8 * 4096], 0).unwrap();
    let before = cache.stats().free_pages;
    // 12 pages needed (4 copies + 8 new), 8 free: nothing may change.
    let err = file.write_at(&[2; 12 * 4096], 4 * 4096).unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert_eq!(file.size(), 8 * 4096);
    let mut buf = vec![0; 8 * 4096];
    file.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 1));
    assert_eq!(
        cache.stats().free_pages,
        before,
        "the planned folios were given back"
    );
    assert!(err.to_string().contains("unchanged"));
}

#[test]
fn bad_input_is_an_error() {
    let (cache, file) = build(0, 16, ReadPolicy::Batched);
    assert!(matches!(
        file.write_at(b"x", u64::MAX),
        Err(Error::FileTooLarge { .. })
    ));
    assert!(matches!(
        file.set_len(u64::MAX),
        Err(Error::FileTooLarge { .. })
    ));
    assert!(matches!(
        file.fallocate(1 << 62, 1 << 62),
        Err(Error::FileTooLarge { .. })
    ));
    assert!(matches!(
        file.punch_hole(u64::MAX, 2),
        Err(Error::FileTooLarge { .. })
    ));
    assert!(matches!(
        cache.create_memory_file(10),
        Err(Error::OrderTooLarge { .. })
    ));
    assert_eq!(file.write_at(&[], 123).unwrap(), 0);
    assert_eq!(file.size(), 0, "an empty write does not extend the file");
}

/// A handle's small reads inside the folio its last one copied from skip the index walk (the
/// handle's recent folio), and every change to that folio is seen by the next read: a write
/// (a new folio in its place), a hole, a truncation, the page written again, a block reused by
/// another file.
#[test]
fn small_reads_start_from_the_recent_folio_and_see_every_change() {
    for max_order in [0u8, 9] {
        let (cache, file) = build(max_order, 2048, ReadPolicy::Batched);
        let other = cache.create_memory_file(0).unwrap();
        let page = |seed: u8| vec![seed; 8192];
        file.write_at(&page(1), 0).unwrap();
        let mut handle = file.handle();
        let read = |handle: &mut foliocache::Handle, pos: u64| {
            let mut buf = [0xEEu8; 64];
            let n = handle.read_at(&mut buf, pos).unwrap();
            buf[..n].to_vec()
        };
        assert_eq!(read(&mut handle, 10), vec![1; 64]);
        let walks = file.mapping_stats().index_walks;
        let hits = file.mapping_stats().recent_hits;
        assert_eq!(read(&mut handle, 200), vec![1; 64]);
        assert_eq!(read(&mut handle, 4000), vec![1; 64]);
        assert_eq!(file.mapping_stats().index_walks, walks, "order {max_order}");
        assert_eq!(file.mapping_stats().recent_hits - hits, 2);
        // Page 1: the same folio only if folios are large.
        assert_eq!(read(&mut handle, 4096 + 8), vec![1; 64]);
        let walked = file.mapping_stats().index_walks - walks;
        assert_eq!(walked, u64::from(max_order == 0), "order {max_order}");

        let steps: [(&str, &dyn Fn(), u8); 5] = [
            (
                "a write",
                &|| assert_eq!(file.write_at(&[2; 100], 4096).unwrap(), 100),
                2,
            ),
            ("a hole", &|| file.punch_hole(4096, 4096).unwrap(), 0),
            (
                "the page written again",
                &|| assert_eq!(file.write_at(&page(3)[..4096], 4096).unwrap(), 4096),
                3,
            ),
            (
                "the block reused by another file",
                &|| {
                    file.punch_hole(0, 8192).unwrap();
                    other.write_at(&page(9), 0).unwrap();
                },
                0,
            ),
            (
                "the file written again",
                &|| assert_eq!(file.write_at(&page(4), 0).unwrap(), 8192),
                4,
            ),
        ];
        for (what, change, want) in steps {
            // Read once more, so the handle's recent folio is the one at page 1.
            read(&mut handle, 4096 + 8);
            let hits = file.mapping_stats().recent_hits;
            change();
            assert_eq!(
                read(&mut handle, 4096 + 8),
                vec![want; 64],
                "after {what}, order {max_order}"
            );
            assert_eq!(
                file.mapping_stats().recent_hits,
                hits,
                "a changed folio is not read again"
            );
        }
        file.set_len(4096 + 4).unwrap();
        assert_eq!(read(&mut handle, 4096), vec![4; 4], "after a truncation");
        file.set_len(0).unwrap();
        assert_eq!(read(&mut handle, 4096), Vec::<u8>::new(), "past the end");
    }
}
