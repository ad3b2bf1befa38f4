//! Who is reading the fd table: a record per thread, so that a read writes only its own
//! thread's cache lines (its record, and the stack line its fence locks).
//!
//! Every hook on a served fd loads the fd's description pointer from the table and uses it
//! for the whole call; a close (or a `dup2` over the fd) swaps the pointer out and must not
//! free the description while a thread still uses it. The table used to count its readers in
//! the fd's slot: two locked instructions per call, on a line that every thread reading the
//! same fd writes (db_bench's threads share one fd per table file, and with two of them the
//! line moved between their CPUs on every read).
//!
//! # The protocol
//! * Each thread claims a [`Record`] the first time it reads the table (a thread that finds
//!   none free, or a nested call, uses the fd's counter instead, below). The record's word is
//!   `generation << 32 | tag`, the tag 0 when the thread is in no section, else the fd's
//!   number plus one. Only its thread writes it (and a claimer taking over a dead thread's
//!   record, and a forked child resetting the records, when that thread cannot run).
//! * **Enter** ([`enter`], before loading the pointer): if the record's tag is 0, store the
//!   tag with the next generation (release), then a `SeqCst` fence, so that the pointer's load
//!   cannot be satisfied before the store is visible to a remover. The fence is a locked
//!   instruction too, but on the thread's own stack line: what cost the counter was its line
//!   moving between CPUs, not the instructions. An asymmetric fence (a compiler fence, the
//!   remover making the barrier with `membarrier`, as the epochs do) read no faster, and would
//!   cost every close a system call that interrupts the other CPUs (see docs/BENCHMARKS.md,
//!   "The fd table's readers").
//!
//!   If the tag is not 0 the thread is already inside a section (a signal handler that
//!   interrupted a hook, or the library calling a hook from one): it counts itself in the fd's
//!   counter instead (`fetch_add` and a fence, both `SeqCst`), as every reader did before.
//! * **Leave** (the [`Held`] dropped, after the last use of the pointer): store the tag 0 with
//!   the same generation (release), or take the count back.
//! * **Remove** (the caller, then [`Records::wait`]): swap the pointer (`SeqCst`), a `SeqCst`
//!   fence, then wait until the fd's counter is 0 and every record that shows the fd's tag has
//!   changed its word (acquire loads). Then no thread can still use the old pointer.
//!
//! Why that is enough: take a reader whose pointer load read the old value. Its tag store
//! precedes its fence, which precedes that load; the remover's swap precedes its own fence,
//! which precedes the scan. Had the remover's fence come first in the fences' total order,
//! the load would have seen the swap; so the reader's came first, and the scan reads the tag
//! store or a later value of the word (the counter and the records' count likewise). A later
//! value of the word is a later store of that thread, all release stores sequenced after its
//! leave, so the acquire load that reads one orders the reader's use of the pointer before the
//! free. A signal handler that enters between a thread's load of its word and its store of the
//! tag leaves its own section first (the handler returns before the thread goes on): the words
//! then repeat a generation, which only makes a remover wait longer, never shorter.
//!
//! Removers skip their own thread's record. A thread that still uses a description when it
//! removes one is a signal handler on top of a hook (the hooks give their reference back
//! before they close or install anything). `table` does not wait or free in that case, and
//! leaks the description, as for any remover nested in a hook: it sees it as the thread's own
//! record showing a section, or, for a count, a per-thread number of counted holds (taken
//! before the count, given back after it). So a remover that waits finds its own record
//! idle. A record whose thread died inside a section
//! (`pthread_exit` from a signal handler) would hold a remover forever: a remover that has
//! waited a while asks the kernel whether the record's thread still exists (it cannot tell a
//! thread group's leader that exited while the others run, which stays a zombie: that one is
//! waited for).
//!
//! A forked child keeps the forking thread's record and frees the others; the counters start
//! again at 0, and a count taken in the parent and given back in the child stops at 0.
//!
//! The loom model is `tests/loom_readers.rs` (this file, included as it is).

#[cfg(loom)]
use loom::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};

/// How many threads at once can read through records (others count in the fd's counter).
#[cfg(not(loom))]
pub(crate) const RECORDS: usize = 512;
/// In the model, few: each is two of loom's atomics.
#[cfg(loom)]
pub(crate) const RECORDS: usize = 2;

/// The low half of a record's word: the tag (0 outside a section).
const TAG: u64 = 0xffff_ffff;

/// One thread's record. Alone on its cache lines: its thread writes it on every read.
#[repr(align(128))]
pub(crate) struct Record {
    /// `generation << 32 | tag`.
    word: AtomicU64,
    /// The owning thread's kernel id, 0 while free.
    tid: AtomicI32,
}

impl Record {
    #[cfg(not(loom))]
    const fn new() -> Self {
        Self {
            word: AtomicU64::new(0),
            tid: AtomicI32::new(0),
        }
    }

    #[cfg(loom)]
    fn new() -> Self {
        Self {
            word: AtomicU64::new(0),
            tid: AtomicI32::new(0),
        }
    }
}

/// The records of a process.
pub(crate) struct Records {
    records: [Record; RECORDS],
    /// One past the highest record ever claimed (so scans stop early).
    high: AtomicUsize,
}

impl Records {
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        Self {
            records: [const { Record::new() }; RECORDS],
            high: AtomicUsize::new(0),
        }
    }

    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        Self {
            records: std::array::from_fn(|_| Record::new()),
            high: AtomicUsize::new(0),
        }
    }

    /// Whether record `index` shows a section (asked by its own thread, which alone writes
    /// it: a remover on top of its own section, see `table`).
    pub(crate) fn in_section(&self, index: usize) -> bool {
        self.records
            .get(index)
            .is_some_and(|record| record.word.load(Ordering::Relaxed) & TAG != 0)
    }

    /// Record `index` (claimed by [`Self::claim`]).
    pub(crate) fn get(&self, index: usize) -> Option<&Record> {
        self.records.get(index)
    }

    /// Claims a free record for the thread `tid`, else takes over one whose thread is gone
    /// (`dead`, asked only when none is free); `None` if every record is some live thread's.
    pub(crate) fn claim(&self, tid: i32, dead: impl Fn(i32) -> bool) -> Option<usize> {
        let take = |index: usize| {
            self.high.fetch_max(index + 1, Ordering::AcqRel);
            Some(index)
        };
        for (index, record) in self.records.iter().enumerate() {
            if record.tid.load(Ordering::Relaxed) == 0
                && record
                    .tid
                    .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return take(index);
            }
        }
        for (index, record) in self.records.iter().enumerate() {
            let owner = record.tid.load(Ordering::Acquire);
            if owner != 0
                && dead(owner)
                && record
                    .tid
                    .compare_exchange(owner, tid, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                // The dead thread may have died inside a section: leave it, keeping the
                // generation going (a remover waiting for the word to change goes on).
                let word = record.word.load(Ordering::Relaxed);
                record
                    .word
                    .store(((word >> 32) + 1) << 32, Ordering::Release);
                return take(index);
            }
        }
        None
    }

    /// In a forked child (one thread, the caller): every record is free again but the
    /// caller's own, `mine`, which it keeps under its new id `tid`.
    pub(crate) fn forget_all(&self, mine: Option<usize>, tid: i32) {
        for (index, record) in self.records.iter().enumerate() {
            if Some(index) == mine {
                record.tid.store(tid, Ordering::Relaxed);
            } else {
                record.word.store(0, Ordering::Relaxed);
                record.tid.store(0, Ordering::Relaxed);
            }
        }
        self.high
            .store(mine.map_or(0, |index| index + 1), Ordering::Relaxed);
    }

    /// The remover's wait, after it swapped the pointer of the fd tagged `tag` (`SeqCst`):
    /// returns once no thread can use the old pointer. `me` is the caller's own record; `alive` tells whether a thread still exists.
    pub(crate) fn wait(
        &self,
        counter: &AtomicU32,
        tag: u32,
        me: Option<usize>,
        alive: impl Fn(i32) -> bool,
    ) {
        // Pairs with the readers' fences (see the module documentation).
        fence(Ordering::SeqCst);
        let mut spins = 0u32;
        while counter.load(Ordering::SeqCst) != 0 {
            spin(&mut spins);
        }
        let high = self.high.load(Ordering::Acquire).min(RECORDS);
        for (index, record) in self.records.iter().enumerate().take(high) {
            if Some(index) == me {
                continue;
            }
            let seen = record.word.load(Ordering::Acquire);
            if seen & TAG != u64::from(tag) {
                continue;
            }
            let mut spins = 0u32;
            while record.word.load(Ordering::Acquire) == seen {
                spin(&mut spins);
                if spins.is_multiple_of(1024) && !alive(record.tid.load(Ordering::Relaxed)) {
                    break; // its thread died inside the section
                }
            }
        }
    }
}

/// A thread's hold on an fd's description pointer: its section, or its count.
pub(crate) enum Held<'a> {
    Section { record: &'a Record, entered: u64 },
    Counted(&'a AtomicU32),
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        match self {
            Held::Section { record, entered } => {
                record.word.store(*entered & !TAG, Ordering::Release);
            }
            Held::Counted(counter) => {
                // Never below 0: a forked child resets the counters, and a count taken in the
                // parent may be given back in the child (a fork from a signal handler).
                let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |count| {
                    count.checked_sub(1)
                });
            }
        }
    }
}

/// The reader's step before it loads the pointer of the fd tagged `tag` (not 0): a section
/// on its thread's `record`, else (no record, or the thread already in a section) a count on
/// the fd's `counter`, with `before_count` called first.
#[inline]
pub(crate) fn enter<'a>(
    record: Option<&'a Record>,
    counter: &'a AtomicU32,
    tag: u32,
    before_count: impl FnOnce(),
) -> Held<'a> {
    enter_fenced(record, counter, tag, true, before_count)
}

/// [`enter`], with the section's fence left out when `fenced` is false: only the model's
/// negative control does that (`tests/loom_readers.rs`), which the model must catch.
#[inline]
pub(crate) fn enter_fenced<'a>(
    record: Option<&'a Record>,
    counter: &'a AtomicU32,
    tag: u32,
    fenced: bool,
    before_count: impl FnOnce(),
) -> Held<'a> {
    if let Some(record) = record {
        // Only this thread writes the word (see the module documentation).
        let word = record.word.load(Ordering::Relaxed);
        if word & TAG == 0 {
            let entered = (((word >> 32) + 1) << 32) | u64::from(tag);
            record.word.store(entered, Ordering::Release);
            if fenced {
                fence(Ordering::SeqCst);
            }
            return Held::Section { record, entered };
        }
    }
    before_count();
    counter.fetch_add(1, Ordering::SeqCst);
    // Orders the count before the pointer's load against the remover's fence, in the
    // memory model's own terms (x86-64's locked add already does; this path is rare).
    fence(Ordering::SeqCst);
    Held::Counted(counter)
}

/// One step of a wait: spin a little, then give the CPU away.
fn spin(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    if *spins < 100 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}
