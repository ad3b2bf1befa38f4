//! Property tests of the index against a simple model: a `HashMap` from every page index to
//! what covers it.
//!
//! Random runs of insert, insert_range, remove, truncate over mixed orders (0..=9 plus a few
//! large value entries) at several distant bases (so the tree grows and shrinks by levels),
//! checked after every step by loads, batches, next/prev misses and a full listing.

use foliocache::Error;
use foliocache::raw::{Entry, Index, Mark, RangeStop};

const MARKS: [Mark; 3] = [Mark::Dirty, Mark::ToWrite, Mark::Writeback];
use proptest::prelude::*;
use std::collections::HashMap;

/// A folio entry; some carry the `zeros` flag, which the index must store and return as is.
fn fe(id: u32, order: u8) -> Entry {
    Entry::Folio {
        id,
        order,
        zeros: id.is_multiple_of(3),
    }
}

/// Bases far apart, so the tree needs several levels and the top of the index space is used.
const BASES: [u64; 3] = [0, 1 << 36, u64::MAX - 4095];
/// Indexes used past each base.
const SPAN: u64 = 2048;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    Folio { id: u32, order: u8, first: u64 },
    Value(u64),
}

#[derive(Default)]
struct Model {
    cells: HashMap<u64, Cell>,
    /// Marks of the folios, by first index.
    marks: HashMap<u64, [bool; 3]>,
}

impl Model {
    fn folio_in(&self, first: u64, order: u8) -> Option<u64> {
        (first..=first + ((1u64 << order) - 1))
            .filter_map(|i| match self.cells.get(&i) {
                Some(Cell::Folio { first, .. }) => Some(*first),
                _ => None,
            })
            .min()
    }

    fn first_value_in(&self, first: u64, order: u8) -> Option<u64> {
        (first..=first + ((1u64 << order) - 1)).find_map(|i| match self.cells.get(&i) {
            Some(Cell::Value(v)) => Some(*v),
            _ => None,
        })
    }

    fn fill(&mut self, first: u64, order: u8, cell: Option<Cell>) {
        for i in first..=first + ((1u64 << order) - 1) {
            match cell {
                Some(c) => self.cells.insert(i, c),
                None => self.cells.remove(&i),
            };
        }
    }

    fn is_folio(&self, i: u64) -> bool {
        matches!(self.cells.get(&i), Some(Cell::Folio { .. }))
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert {
        base: usize,
        slot: u64,
        order: u8,
        value: Option<u64>,
    },
    InsertRange {
        base: usize,
        slot: u64,
        orders: Vec<u8>,
    },
    Remove {
        base: usize,
        at: u64,
        shadow: Option<u64>,
    },
    Truncate {
        base: usize,
        start: u64,
        len: u64,
    },
    BigValue {
        base: usize,
        order: u8,
        value: u64,
    },
    Mark {
        base: usize,
        at: u64,
        mark: usize,
        on: bool,
    },
}

fn order() -> impl Strategy<Value = u8> {
    prop_oneof![4 => 0u8..=2, 2 => 3u8..=6, 1 => 7u8..=9]
}

fn op() -> impl Strategy<Value = Op> {
    let base = 0..BASES.len();
    prop_oneof![
        6 => (base.clone(), 0..SPAN, order(), prop::option::weighted(0.25, 1u64..1000))
            .prop_map(|(base, slot, order, value)| Op::Insert { base, slot, order, value }),
        3 => (base.clone(), 0..SPAN, prop::collection::vec(0u8..=3, 1..12))
            .prop_map(|(base, slot, orders)| Op::InsertRange { base, slot, orders }),
        4 => (base.clone(), 0..SPAN, prop::option::weighted(0.5, 1u64..1000))
            .prop_map(|(base, at, shadow)| Op::Remove { base, at, shadow }),
        2 => (base.clone(), 0..SPAN, 1..SPAN)
            .prop_map(|(base, start, len)| Op::Truncate { base, start, len }),
        1 => (base.clone(), 10u8..=11, 1u64..1000)
            .prop_map(|(base, order, value)| Op::BigValue { base, order, value }),
        5 => (base, 0..SPAN, 0usize..3, prop::bool::weighted(0.7))
            .prop_map(|(base, at, mark, on)| Op::Mark { base, at, mark, on }),
    ]
}

struct Harness {
    index: Index,
    model: Model,
    next_id: u32,
    /// The index's node limit, if any: an insert may then fail (or a run stop) for lack of
    /// nodes, and must leave the index exactly as before.
    limit: Option<usize>,
}

impl Harness {
    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Insert {
                base,
                slot,
                order,
                value,
            } => {
                let first = BASES[base] + (slot & !((1u64 << order) - 1));
                let entry = match value {
                    Some(value) => Entry::Value { value, order },
                    None => {
                        self.next_id += 1;
                        fe(self.next_id, order)
                    }
                };
                self.insert_one(first, entry);
            }
            Op::BigValue { base, order, value } => {
                let first = BASES[base];
                self.insert_one(first, Entry::Value { value, order });
            }
            Op::InsertRange {
                base,
                slot,
                ref orders,
            } => {
                // Align the start to the first order; later entries must be aligned too, so
                // build the run as the implementation requires and expect an error otherwise.
                let start = BASES[base] + (slot & !((1u64 << orders[0]) - 1));
                let mut entries = Vec::new();
                for &order in orders {
                    self.next_id += 1;
                    entries.push(fe(self.next_id, order));
                }
                let mut aligned = true;
                let mut at = start;
                for e in &entries {
                    if !at.is_multiple_of(1u64 << e.order()) {
                        aligned = false;
                    }
                    at = at.wrapping_add(1u64 << e.order());
                }
                let span_ok =
                    entries.iter().map(|e| 1u64 << e.order()).sum::<u64>() <= u64::MAX - start;
                let result = self.index.lock().insert_range(start, &entries);
                if !aligned {
                    assert!(
                        matches!(result, Err(Error::Misaligned { .. })),
                        "{result:?}"
                    );
                    return;
                }
                if !span_ok {
                    assert!(result.is_err(), "{result:?}");
                    return;
                }
                let result = result.expect("aligned run");
                let out_of_nodes = result.stopped == Some(RangeStop::NoMemory);
                assert!(!out_of_nodes || self.limit.is_some());
                let mut at = start;
                let mut inserted = 0;
                let mut stopped = None;
                for e in &entries {
                    if out_of_nodes && inserted == result.inserted {
                        stopped = result.stopped;
                        break;
                    }
                    let order = e.order();
                    if let Some(conflict) = self.model.folio_in(at, order) {
                        stopped = Some(RangeStop::Present(conflict));
                        break;
                    }
                    let Entry::Folio { id, .. } = *e else {
                        unreachable!()
                    };
                    let shadow = self.model.first_value_in(at, order);
                    assert_eq!(result.shadows.get(inserted).copied().flatten(), shadow);
                    self.model.fill(
                        at,
                        order,
                        Some(Cell::Folio {
                            id,
                            order,
                            first: at,
                        }),
                    );
                    inserted += 1;
                    at += 1u64 << order;
                }
                assert_eq!(result.inserted, inserted);
                assert_eq!(result.stopped, stopped);
            }
            Op::Remove { base, at, shadow } => {
                let at = BASES[base] + at;
                let found = self.model.cells.get(&at).copied();
                match found {
                    Some(Cell::Folio { id, order, first }) => {
                        // A wrong `expected` removes nothing.
                        let wrong = fe(id + 1_000_000, order);
                        assert_eq!(
                            self.index.lock().remove(at, Some(wrong), None).unwrap(),
                            None
                        );
                        let entry = fe(id, order);
                        let got = self.index.lock().remove(at, Some(entry), shadow).unwrap();
                        assert_eq!(got, Some(entry));
                        self.model.fill(first, order, shadow.map(Cell::Value));
                        self.model.marks.remove(&first);
                    }
                    None => {
                        assert_eq!(self.index.lock().remove(at, None, shadow).unwrap(), None);
                    }
                    Some(Cell::Value(_)) => {} // value extents are the index's business
                }
            }
            Op::Mark { base, at, mark, on } => {
                let at = BASES[base] + at;
                let which = MARKS[mark];
                let folio = match self.model.cells.get(&at) {
                    Some(Cell::Folio { first, .. }) => Some(*first),
                    _ => None,
                };
                let mut writer = self.index.lock();
                let done = if on {
                    writer.set_mark(at, which)
                } else {
                    writer.clear_mark(at, which)
                };
                drop(writer);
                match folio {
                    Some(first) => {
                        let marks = self.model.marks.entry(first).or_default();
                        if on {
                            assert!(done, "set_mark on a folio at {at}");
                        } else {
                            assert_eq!(done, marks[mark], "clear_mark reports what was set");
                        }
                        marks[mark] = on;
                    }
                    None => assert!(!done, "a mark at {at}, where no folio is"),
                }
            }
            Op::Truncate { base, start, len } => {
                let first = BASES[base] + start;
                let last = first + (len - 1).min(SPAN - 1 - start);
                // The value entries before, with their extents (the index's business: values
                // are split as folios go in among them), so the truncation can be checked
                // exactly: values wholly inside the range go, straddlers stay unchanged.
                let values_before: Vec<(u64, u64, u8)> = self
                    .index
                    .entries()
                    .into_iter()
                    .filter_map(|(at, e)| match e {
                        Entry::Value { value, order } => Some((at, value, order)),
                        Entry::Folio { .. } => None,
                    })
                    .filter(|&(at, _, order)| at <= last && at + (1u64 << order) > first)
                    .collect();
                let removed = self.index.lock().truncate(first..=last);
                let mut removed_folios: Vec<(u64, u32)> = removed
                    .iter()
                    .filter_map(|(at, e)| match e {
                        Entry::Folio { id, .. } => Some((*at, *id)),
                        Entry::Value { .. } => None,
                    })
                    .collect();
                removed_folios.sort_unstable();
                // Model: folios entirely inside go; straddlers stay.
                let mut expect: Vec<(u64, u32)> = Vec::new();
                for i in first..=last {
                    if let Some(Cell::Folio {
                        id,
                        order,
                        first: f,
                    }) = self.model.cells.get(&i).copied()
                    {
                        let end = f + (1u64 << order) - 1;
                        if f >= first && end <= last && f == i {
                            expect.push((f, id));
                        }
                    }
                }
                assert_eq!(removed_folios, expect);
                for (f, _) in expect {
                    let Some(Cell::Folio { order, .. }) = self.model.cells.get(&f).copied() else {
                        unreachable!()
                    };
                    self.model.fill(f, order, None);
                    self.model.marks.remove(&f);
                }
                let mut removed_values: Vec<(u64, u64, u8)> = removed
                    .iter()
                    .filter_map(|(at, e)| match e {
                        Entry::Value { value, order } => Some((*at, *value, *order)),
                        Entry::Folio { .. } => None,
                    })
                    .collect();
                removed_values.sort_unstable();
                let mut inside = Vec::new();
                for &(at, value, order) in &values_before {
                    let end = at + (1u64 << order) - 1;
                    let wholly_inside = at >= first && end <= last;
                    // Check (and update the model at) the indexes the harness uses.
                    for i in at.max(first.saturating_sub(SPAN))..=end.min(last + SPAN) {
                        let got = self.index.load(i);
                        if wholly_inside {
                            assert_eq!(
                                got, None,
                                "index {i}: value {value} inside the range stayed"
                            );
                            self.model.cells.remove(&i);
                        } else {
                            assert_eq!(
                                got,
                                Some(Entry::Value { value, order }),
                                "index {i}: a value straddling the range changed"
                            );
                        }
                    }
                    if wholly_inside {
                        inside.push((at, value, order));
                    }
                }
                assert_eq!(removed_values, inside, "the values reported removed");
            }
        }
    }

    fn insert_one(&mut self, first: u64, entry: Entry) {
        let order = entry.order();
        let result = self.index.lock().insert(first, entry);
        if let Err(Error::IndexNoMemory) = result {
            assert!(self.limit.is_some(), "no node limit, yet out of nodes");
            return;
        }
        if let Some(conflict) = self.model.folio_in(first, order) {
            match result {
                Err(Error::Exists { index }) => assert_eq!(index, conflict),
                other => panic!("insert at {first} over folio at {conflict}: {other:?}"),
            }
            return;
        }
        let shadow = self.model.first_value_in(first, order);
        assert_eq!(result.expect("no conflict"), shadow, "shadow at {first}");
        let cell = match entry {
            Entry::Folio { id, order, .. } => Cell::Folio { id, order, first },
            Entry::Value { value, .. } => Cell::Value(value),
        };
        self.model.fill(first, order, Some(cell));
    }

    fn check_index(&self, i: u64) {
        let got = self.index.load(i);
        match (self.model.cells.get(&i), got) {
            (None, None) => {}
            (
                Some(Cell::Folio { id, order, .. }),
                Some(Entry::Folio {
                    id: gid,
                    order: gorder,
                    zeros,
                }),
            ) => {
                assert_eq!((*id, *order), (gid, gorder), "index {i}");
                assert_eq!(
                    zeros,
                    gid % 3 == 0,
                    "index {i}: the zeros flag came back changed"
                );
            }
            (Some(Cell::Value(v)), Some(Entry::Value { value, .. })) => {
                assert_eq!(*v, value, "index {i}");
            }
            (want, got) => panic!("index {i}: model {want:?}, index {got:?}"),
        }
    }

    fn check_around(&self, base: usize, lo: u64, hi: u64) {
        for i in lo..hi.min(SPAN) {
            self.check_index(BASES[base] + i);
        }
    }

    fn check_all(&self) {
        for base in 0..BASES.len() {
            self.check_around(base, 0, SPAN);
        }
        // Marks: the marked entries, found through the nodes' marks, are the model's.
        let writer = self.index.lock();
        if let Err(broken) = writer.check_invariants() {
            panic!("index bookkeeping: {broken}");
        }
        for (m, mark) in MARKS.iter().enumerate() {
            let mut want: Vec<u64> = self
                .model
                .marks
                .iter()
                .filter(|(_, marks)| marks[m])
                .map(|(first, _)| *first)
                .collect();
            want.sort_unstable();
            let mut got = Vec::new();
            let mut from = 0u64;
            while let Some((first, entry)) = writer.next_marked(from, u64::MAX, *mark) {
                assert!(entry.is_folio());
                got.push(first);
                match first.checked_add(1u64 << entry.order()) {
                    Some(next) => from = next,
                    None => break,
                }
            }
            assert_eq!(got, want, "entries carrying {mark:?}");
            for &first in &want {
                assert!(writer.get_mark(first, *mark));
            }
            // From inside a marked entry, the search finds that entry.
            if let Some(&first) = want.first()
                && let Some(Cell::Folio { order, .. }) = self.model.cells.get(&first)
            {
                let inside = first + ((1u64 << order) - 1);
                assert_eq!(
                    writer.next_marked(inside, u64::MAX, *mark).map(|e| e.0),
                    Some(first)
                );
            }
        }
        drop(writer);
        // A listing matches the model and is sorted and non-overlapping.
        let entries = self.index.entries();
        let mut end: Option<u64> = None;
        let mut listed_pages: u64 = 0;
        for (first, entry) in &entries {
            if let Some(end) = end {
                assert!(*first >= end, "overlap at {first}");
            }
            let pages = 1u64 << entry.order();
            end = first.checked_add(pages);
            if entry.is_folio() {
                listed_pages += pages;
            }
            self.check_index(*first);
        }
        let model_pages = self
            .model
            .cells
            .values()
            .filter(|c| matches!(c, Cell::Folio { .. }))
            .count() as u64;
        assert_eq!(listed_pages, model_pages);
        if self.model.cells.is_empty() {
            assert_eq!(
                self.index.node_count(),
                0,
                "an empty index frees all its nodes"
            );
        }
    }

    fn check_queries(&self, base: usize, at: u64, max: u64) {
        let at = BASES[base] + at;
        // get_batch: contiguous folios from `at`.
        let mut batch = Vec::new();
        self.index.get_batch(at, max as usize, &mut batch);
        let mut expect = Vec::new();
        let mut pos = at;
        while expect.len() < max as usize {
            match self.model.cells.get(&pos) {
                Some(Cell::Folio { id, order, first }) => {
                    expect.push((*first, fe(*id, *order)));
                    match first.checked_add(1u64 << order) {
                        Some(next) => pos = next,
                        None => break,
                    }
                }
                _ => break,
            }
        }
        assert_eq!(batch, expect, "get_batch({at}, {max})");
        // next_miss / prev_miss with the kernel's conventions.
        let next = self.index.next_miss(at, max);
        let want_next = (0..max)
            .map_while(|k| at.checked_add(k))
            .find(|&i| !self.model.is_folio(i))
            .unwrap_or_else(|| at.checked_add(max).unwrap_or(0));
        assert_eq!(next, want_next, "next_miss({at}, {max})");
        let prev = self.index.prev_miss(at, max);
        let want_prev = (0..max)
            .map_while(|k| at.checked_sub(k))
            .find(|&i| !self.model.is_folio(i))
            .unwrap_or_else(|| at.checked_sub(max).unwrap_or(u64::MAX));
        assert_eq!(prev, want_prev, "prev_miss({at}, {max})");
        // seek: from the entry (or hole) at `at`, the first folio without the zeros flag that
        // starts after it, up to `last`.
        let last = at.saturating_add(max);
        let data = |e: Entry| matches!(e, Entry::Folio { zeros: false, .. });
        let mut cursor = self.index.cursor();
        cursor.load(at);
        let got = cursor.seek(last, data);
        let want = self
            .model
            .cells
            .values()
            .filter_map(|c| match *c {
                Cell::Folio { id, order, first } if data(fe(id, order)) => Some(first),
                _ => None,
            })
            .filter(|&first| first > at && first <= last)
            .min();
        assert_eq!(got, want, "seek after {at} up to {last}");
        if let Some(first) = got {
            assert_eq!(cursor.first(), first);
            assert!(
                cursor.reload().is_some_and(data),
                "the cursor is left on the entry"
            );
        }
    }
}

fn op_region(op: &Op) -> (usize, u64, u64) {
    match *op {
        Op::Insert { base, slot, .. } | Op::InsertRange { base, slot, .. } => {
            (base, slot.saturating_sub(600), slot + 1200)
        }
        Op::Remove { base, at, .. } => (base, at.saturating_sub(600), at + 600),
        Op::Truncate { base, start, len } => (base, start.saturating_sub(600), start + len + 600),
        Op::BigValue { base, .. } => (base, 0, SPAN),
        Op::Mark { base, at, .. } => (base, at.saturating_sub(2), at + 2),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn index_matches_model(
        ops in prop::collection::vec(op(), 1..80),
        queries in prop::collection::vec((0..BASES.len(), 0..SPAN, 1u64..80), 8),
        limit in prop::option::weighted(0.3, 1usize..24),
    ) {
        let index = limit.map_or_else(Index::new, Index::with_node_limit);
        let mut h = Harness { index, model: Model::default(), next_id: 0, limit };
        for op in &ops {
            h.apply(op);
            if let Some(limit) = limit {
                prop_assert!(h.index.node_count() <= limit);
            }
            let (base, lo, hi) = op_region(op);
            h.check_around(base, lo, hi);
            if let Err(broken) = h.index.lock().check_invariants() {
                panic!("after {op:?}: {broken}");
            }
        }
        h.check_all();
        for (base, at, max) in queries {
            h.check_queries(base, at, max);
        }
        // Truncating everything empties the tree and frees every node.
        let removed = h.index.lock().truncate(..);
        let _ = removed;
        prop_assert_eq!(h.index.node_count(), 0);
        prop_assert!(h.index.entries().is_empty());
    }
}

#[test]
fn node_limit_stops_insert_range_with_no_memory() {
    let index = Index::with_node_limit(1);
    let entries: Vec<Entry> = (0..100).map(|id| fe(id, 0)).collect();
    let result = index.lock().insert_range(0, &entries).unwrap();
    // One leaf holds 64 entries; the 65th needs a second leaf and a new root.
    assert_eq!(result.inserted, 64);
    assert_eq!(result.stopped, Some(RangeStop::NoMemory));
    assert_eq!(index.load(63), Some(fe(63, 0)));
    assert_eq!(index.load(64), None);
}

#[test]
fn present_folio_stops_insert_range() {
    let index = Index::new();
    index.lock().insert(5, fe(99, 0)).unwrap();
    let entries: Vec<Entry> = (0..8).map(|id| fe(id, 0)).collect();
    let result = index.lock().insert_range(0, &entries).unwrap();
    assert_eq!(result.inserted, 5);
    assert_eq!(result.stopped, Some(RangeStop::Present(5)));
}

#[test]
fn bad_input_is_an_error() {
    let index = Index::new();
    let mut w = index.lock();
    assert!(matches!(
        w.insert(3, fe(1, 2)),
        Err(Error::Misaligned { index: 3, order: 2 })
    ));
    assert!(matches!(
        w.insert(0, fe(1, 64)),
        Err(Error::OrderTooLarge { .. })
    ));
    assert!(matches!(
        w.insert(
            0,
            Entry::Value {
                value: 1 << 60,
                order: 0
            }
        ),
        Err(Error::ValueTooLarge { .. })
    ));
    // A run that would run past the largest index.
    let run = [fe(1, 0), fe(2, 0)];
    assert!(matches!(
        w.insert_range(u64::MAX, &run),
        Err(Error::IndexOverflow { .. })
    ));
    // The last index itself is fine.
    assert_eq!(w.insert(u64::MAX, fe(3, 0)).unwrap(), None);
    drop(w);
    assert_eq!(index.load(u64::MAX), Some(fe(3, 0)));
    assert_eq!(index.next_miss(u64::MAX, 10), 0, "wraps");
}

#[test]
fn next_miss_at_the_top_of_the_index_space() {
    let index = Index::new();
    index.lock().insert(u64::MAX - 1, fe(1, 1)).unwrap();
    assert_eq!(
        index.next_miss(u64::MAX - 1, 1),
        u64::MAX,
        "one past the scanned range"
    );
    assert_eq!(index.next_miss(u64::MAX - 1, 2), 0, "the range wraps");
    assert_eq!(index.prev_miss(u64::MAX, 2), u64::MAX - 2);
}

#[test]
fn a_bad_value_anywhere_in_a_run_inserts_nothing() {
    let index = Index::new();
    let run = [
        Entry::Value { value: 1, order: 0 },
        Entry::Value {
            value: 1 << 60,
            order: 0,
        },
    ];
    assert!(matches!(
        index.lock().insert_range(0, &run),
        Err(Error::ValueTooLarge { .. })
    ));
    assert!(index.entries().is_empty());
}

#[test]
fn multi_order_entry_is_found_anywhere_in_its_range() {
    let index = Index::new();
    let folio = fe(7, 9);
    index.lock().insert(1024, folio).unwrap();
    for i in 1024..1536 {
        assert_eq!(index.load(i), Some(folio));
    }
    assert_eq!(index.load(1023), None);
    assert_eq!(index.load(1536), None);
    assert_eq!(index.next_miss(1024, 1000), 1536);
    assert_eq!(index.prev_miss(1535, 1000), 1023);
}

/// Marks through every structural change, densely: folios of several orders marked, then
/// truncated, removed (with and without shadows), re-inserted where marked ones were (a new
/// entry must start unmarked), and the tree grown past the old root.
#[test]
fn marks_follow_removal_truncation_and_growth() {
    for order in [0u8, 3, 6, 7] {
        let index = Index::new();
        let size = 1u64 << order;
        let count = 96u64;
        let mut w = index.lock();
        for k in 0..count {
            w.insert(k * size, fe(k as u32, order)).unwrap();
        }
        for k in (0..count).step_by(2) {
            for mark in MARKS {
                assert!(w.set_mark(k * size + size / 2, mark));
            }
        }
        w.check_invariants().unwrap();
        let marked = |w: &foliocache::raw::IndexWriter<'_>, mark| {
            let mut out = Vec::new();
            let mut from = 0;
            while let Some((first, _)) = w.next_marked(from, u64::MAX, mark) {
                out.push(first / size);
                from = first + size;
            }
            out
        };
        let evens: Vec<u64> = (0..count).step_by(2).collect();
        assert_eq!(marked(&w, Mark::Dirty), evens);
        // Truncate the middle third, remove two more (one leaving a shadow), clear a mark.
        w.truncate(32 * size..64 * size);
        w.remove(2 * size, None, None).unwrap();
        w.remove(4 * size, None, Some(9)).unwrap();
        assert!(w.clear_mark(6 * size, Mark::ToWrite));
        assert!(!w.clear_mark(6 * size, Mark::ToWrite), "already clear");
        w.check_invariants().unwrap();
        let left: Vec<u64> = evens
            .iter()
            .copied()
            .filter(|&k| !(32..64).contains(&k) && k != 2 && k != 4)
            .collect();
        assert_eq!(marked(&w, Mark::Dirty), left);
        assert_eq!(
            marked(&w, Mark::ToWrite),
            left.iter().copied().filter(|&k| k != 6).collect::<Vec<_>>()
        );
        // New folios where marked ones were carry no mark.
        for k in [2u64, 4, 32, 34, 40] {
            w.insert(k * size, fe(1000 + k as u32, order)).unwrap();
            assert!(!w.get_mark(k * size, Mark::Dirty), "order {order} page {k}");
        }
        w.check_invariants().unwrap();
        // Growing the tree keeps the marks reachable from the new root.
        w.insert(1 << 40, fe(5000, 0)).unwrap();
        assert!(w.set_mark(1 << 40, Mark::Writeback));
        w.check_invariants().unwrap();
        assert_eq!(
            w.next_marked(0, u64::MAX, Mark::Writeback)
                .map(|e| e.0 / size),
            Some(0)
        );
        let mut all = marked(&w, Mark::Writeback);
        all.retain(|&k| k != (1 << 40) / size);
        assert_eq!(all, left);
        // Emptying everything leaves no mark behind.
        w.truncate(..);
        w.check_invariants().unwrap();
        assert_eq!(w.next_marked(0, u64::MAX, Mark::Dirty), None);
    }
}

#[test]
fn seek_passes_over_zeros_folios_across_leaves() {
    let index = Index::new();
    let zeros = |id| Entry::Folio {
        id,
        order: 0,
        zeros: true,
    };
    let data = |id| Entry::Folio {
        id,
        order: 0,
        zeros: false,
    };
    let mut w = index.lock();
    // Zeros folios 0..200 (over three leaf boundaries), a data folio at 200, zeros again at
    // 201, a shadow value at 202, data at 203 and an order-2 data folio at 204..208.
    for i in 0..200 {
        w.insert(i, zeros(i as u32)).unwrap();
    }
    w.insert(200, data(500)).unwrap();
    w.insert(201, zeros(501)).unwrap();
    w.insert(202, Entry::Value { value: 9, order: 0 }).unwrap();
    w.insert(203, data(502)).unwrap();
    w.insert(
        204,
        Entry::Folio {
            id: 504,
            order: 2,
            zeros: false,
        },
    )
    .unwrap();
    // Zeros to the end of that leaf, and data at the first index of the next one.
    for i in 208..256 {
        w.insert(i, zeros(i as u32)).unwrap();
    }
    w.insert(256, data(600)).unwrap();
    drop(w);
    let wanted = |e: Entry| matches!(e, Entry::Folio { zeros: false, .. });
    let mut cursor = index.cursor();
    cursor.load(0);
    assert_eq!(cursor.seek(199, wanted), None, "the gap runs to the bound");
    cursor.load(0);
    assert_eq!(cursor.seek(1000, wanted), Some(200));
    assert_eq!(
        cursor.seek(1000, wanted),
        Some(203),
        "past zeros and a value"
    );
    assert_eq!(cursor.seek(1000, wanted), Some(204));
    assert_eq!(cursor.reload(), index.load(206));
    assert_eq!(cursor.seek(255, wanted), None);
    cursor.load(204);
    assert_eq!(cursor.seek(1000, wanted), Some(256), "a leaf's first index");
    assert_eq!(cursor.seek(1000, wanted), None);
    cursor.load(130);
    assert_eq!(
        cursor.seek(200, wanted),
        Some(200),
        "the bound is inclusive"
    );
}
