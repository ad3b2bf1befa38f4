//! Index nodes and the encoding of their slots.
//!
//! A slot is one machine word:
//!
//! | bits            | meaning |
//! |-----------------|---------|
//! | `0`             | empty |
//! | `…00` (nonzero) | pointer to a child [`Node`] (nodes are 64-byte aligned) |
//! | `…01`           | value entry: `value << 8 \| order << 2 \| 01` |
//! | `…10`           | folio entry: `zeros << 63 \| id << 8 \| order << 2 \| 10` |
//!
//! An entry of order `k` covers the `2^k` naturally aligned indexes around it. It lives in the
//! node whose `shift` is `k` rounded down to a multiple of 6 and fills `2^(k mod 6)` consecutive
//! slots there. Unlike the kernel's xarray, which writes the entry once and fills the other
//! slots with sibling pointers to it, every slot holds the entry itself: the order is part of
//! the word, so a lookup anywhere in the range needs one load, and a reader's `reload` re-reads
//! the very slot it loaded.

use crate::sync::AtomicUsize;
use crate::sync::unmodelled::{AtomicU16, AtomicU64};

pub(crate) const CHUNK_SHIFT: u32 = 6;
pub(crate) const CHUNK: usize = 1 << CHUNK_SHIFT;

const TAG_MASK: usize = 0b11;
const TAG_VALUE: usize = 0b01;
const TAG_FOLIO: usize = 0b10;

/// Largest value a value (shadow) entry can hold.
pub const MAX_VALUE: u64 = (1 << 56) - 1;

/// What the index maps an index to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Entry {
    /// A folio: its id (first page number in the arena) and order.
    Folio {
        /// The folio's id.
        id: u32,
        /// log2 of its number of pages.
        order: u8,
        /// A flag the index stores with the entry and never interprets. Memory files set it on
        /// folios that read as zeros for as long as they are in the index (fallocated, never
        /// written), so a reader learns that from the entry word itself and need not touch the
        /// folio at all.
        zeros: bool,
    },
    /// A value (a shadow entry left by eviction): at most [`MAX_VALUE`].
    Value {
        /// The value.
        value: u64,
        /// log2 of the number of indexes it covers.
        order: u8,
    },
}

impl Entry {
    /// log2 of the number of indexes the entry covers.
    pub fn order(self) -> u8 {
        match self {
            Self::Folio { order, .. } | Self::Value { order, .. } => order,
        }
    }

    /// Whether this is a folio entry.
    pub fn is_folio(self) -> bool {
        matches!(self, Self::Folio { .. })
    }

    pub(crate) fn encode(self) -> usize {
        match self {
            Self::Folio { id, order, zeros } => {
                (usize::from(zeros) << 63)
                    | ((id as usize) << 8)
                    | ((order as usize) << 2)
                    | TAG_FOLIO
            }
            Self::Value { value, order } => {
                debug_assert!(value <= MAX_VALUE);
                ((value as usize) << 8) | ((order as usize) << 2) | TAG_VALUE
            }
        }
    }

    pub(crate) fn decode(word: usize) -> Option<Self> {
        let order = ((word >> 2) & 63) as u8;
        match word & TAG_MASK {
            TAG_FOLIO => Some(Self::Folio {
                id: (word >> 8) as u32,
                order,
                zeros: word >> 63 == 1,
            }),
            TAG_VALUE => Some(Self::Value {
                value: (word >> 8) as u64,
                order,
            }),
            _ => None,
        }
    }
}

/// Whether a slot word is a child pointer.
pub(crate) fn is_node(word: usize) -> bool {
    word != 0 && word & TAG_MASK == 0
}

/// How many kinds of mark an entry can carry (the kernel's `XA_MAX_MARKS`).
pub(crate) const MARKS: usize = 3;

/// A 64-way radix node (576 bytes, like the kernel's `xa_node`).
#[repr(C, align(64))]
pub(crate) struct Node {
    pub(crate) slots: [AtomicUsize; CHUNK],
    /// Per mark, a bit per slot: set when the slot holds an entry carrying the mark (its first
    /// slot, for an entry spanning several), or a child with any slot so marked. Only touched
    /// under the writer lock.
    pub(crate) marks: [AtomicU64; MARKS],
    /// How many index bits lie below this node: 0 for leaves, then 6, 12, …
    pub(crate) shift: u8,
    /// Non-empty slots. Only touched under the writer lock.
    pub(crate) count: AtomicU16,
}

impl Node {
    pub(crate) fn new(shift: u8) -> Self {
        Self {
            slots: std::array::from_fn(|_| AtomicUsize::new(0)),
            marks: std::array::from_fn(|_| AtomicU64::new(0)),
            shift,
            count: AtomicU16::new(0),
        }
    }

    /// Mark `mark`'s bits of this node (under the writer lock).
    pub(crate) fn mark_bits(&self, mark: usize) -> u64 {
        self.marks[mark].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets or clears mark `mark` at slot `offset`; returns the node's bits before.
    pub(crate) fn set_mark_bit(&self, mark: usize, offset: usize, on: bool) -> u64 {
        let bit = 1u64 << offset;
        let before = self.mark_bits(mark);
        let after = if on { before | bit } else { before & !bit };
        self.marks[mark].store(after, std::sync::atomic::Ordering::Relaxed);
        before
    }

    /// Clears every mark at slot `offset`; returns which marks were set there.
    pub(crate) fn clear_slot_marks(&self, offset: usize) -> [bool; MARKS] {
        std::array::from_fn(|m| self.set_mark_bit(m, offset, false) & (1 << offset) != 0)
    }

    /// The slot of `index` in this node.
    pub(crate) fn offset(&self, index: u64) -> usize {
        ((index >> self.shift) as usize) & (CHUNK - 1)
    }
}
