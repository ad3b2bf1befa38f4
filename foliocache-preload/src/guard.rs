//! This thread's state as the hooks see it: whether it is already inside a hook, its number,
//! and its record in the fd table's readers (`readers`). One thread-local, so that a hook
//! reaches all of it with one lookup (in a shared library every thread-local lookup is a call
//! to `__tls_get_addr`).
//!
//! Reentrancy: the library's own code calls `open`, `read`, `fstat`... through the same
//! symbols the program does (they resolve to this library's hooks). So does a signal handler
//! that interrupts a hook and reads a file. A hook entered while the thread is already inside
//! one must not touch the cache or take any lock of this library: it takes the *raw path*
//! (the real libc call, at the offset the fd table keeps). [`enter`] tells which case it is.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering, compiler_fence};

/// A thread's hook state. Const-initialised cells without a destructor: no allocation, no
/// registration, safe to touch at any point of a thread's life.
pub(crate) struct HookThread {
    inside: Cell<bool>,
    number: Cell<usize>,
    /// The thread's record in the fd table's readers: an index, or [`UNCLAIMED`] or [`NONE`].
    record: Cell<u32>,
    /// How many fd-table references (`table::FdRef`) this thread holds as counts on an fd's
    /// counter (not through its record): not 0 while a signal handler runs on top of code
    /// that is using a description so.
    holds: Cell<u32>,
}

/// The thread has not asked for a record yet.
const UNCLAIMED: u32 = u32::MAX;
/// Every record was some live thread's when this thread asked: it counts in the fd's counter.
const NONE: u32 = u32::MAX - 1;

thread_local! {
    static THREAD: HookThread = const {
        HookThread {
            inside: Cell::new(false),
            number: Cell::new(usize::MAX),
            record: Cell::new(UNCLAIMED),
            holds: Cell::new(0),
        }
    };
}
static NEXT_NUMBER: AtomicUsize = AtomicUsize::new(0);

/// This thread's state. The pointer is valid for as long as the thread runs; it is used only
/// on this thread (what holds it, [`Entered`] and the table's `FdRef`, is not `Send`).
#[inline]
pub(crate) fn this_thread() -> *const HookThread {
    THREAD.with(|thread| thread as *const HookThread)
}

impl HookThread {
    /// This thread's number (in order of first use): its preferred readahead slot in a
    /// description, and its shard of the read counters. No other thread of the process has
    /// it (the read counters rely on that).
    #[inline]
    pub(crate) fn number(&self) -> usize {
        let number = self.number.get();
        if number != usize::MAX {
            return number;
        }
        let number = NEXT_NUMBER.fetch_add(1, Ordering::Relaxed);
        self.number.set(number);
        number
    }

    /// This thread's record in the fd table's readers, claimed on first use (`claim` is asked
    /// once per thread); `None` if there was none to claim.
    #[inline]
    pub(crate) fn record(&self, claim: impl FnOnce() -> Option<usize>) -> Option<usize> {
        match self.record.get() {
            UNCLAIMED => {
                let index = claim();
                self.record
                    .set(index.map_or(NONE, |i| u32::try_from(i).unwrap_or(NONE)));
                index
            }
            NONE => None,
            index => Some(index as usize),
        }
    }

    /// This thread's record if it has claimed one (never claims).
    pub(crate) fn claimed(&self) -> Option<usize> {
        match self.record.get() {
            UNCLAIMED | NONE => None,
            index => Some(index as usize),
        }
    }

    /// Counts an fd-table reference this thread takes on an fd's counter (before the count,
    /// so that a signal handler arriving after it sees this). A handler's own takes and gives
    /// back balance before it returns, so a plain cell is enough.
    #[inline]
    pub(crate) fn hold(&self) {
        self.holds.set(self.holds.get().wrapping_add(1));
    }

    /// Gives back what [`Self::hold`] counted.
    #[inline]
    pub(crate) fn unhold(&self) {
        self.holds.set(self.holds.get().wrapping_sub(1));
    }

    /// Whether this thread holds an fd-table reference on a counter: a remover that does is a
    /// signal handler on top of a hook using a description, and must not free one.
    pub(crate) fn holding(&self) -> bool {
        self.holds.get() != 0
    }
}

/// This thread's number (see [`HookThread::number`]).
pub(crate) fn thread_number() -> usize {
    // SAFETY: this thread's own state, valid while it runs (see `this_thread`).
    unsafe { &*this_thread() }.number()
}

/// Proof that this thread entered a hook from outside; leaving clears the mark.
#[derive(Debug)]
pub(crate) struct Entered(*const HookThread);

impl Entered {
    /// The thread's state.
    #[inline]
    pub(crate) fn thread(&self) -> &HookThread {
        // SAFETY: made by `enter_on` from this thread's state; `Entered` is not `Send`, so
        // it is dropped on this thread, which is still running.
        unsafe { &*self.0 }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        // Everything the hook did comes before the mark goes, for a handler on this thread.
        compiler_fence(Ordering::SeqCst);
        self.thread().inside.set(false);
    }
}

/// Marks this thread as inside a hook, or `None` if it already was (a nested call: the library
/// itself, or a signal handler that interrupted a hook), or if the cache is starting a shared
/// cache's owner in this thread (its own calls, whatever called the cache).
pub(crate) fn enter() -> Option<Entered> {
    enter_on(this_thread())
}

/// [`enter`], for a caller that already has this thread's state (`this_thread`).
#[inline]
pub(crate) fn enter_on(thread: *const HookThread) -> Option<Entered> {
    // The cache starting a shared cache's owner (from a request, a thread's exit, anywhere):
    // its own calls, as if nested.
    if foliocache::starting_owner() {
        return None;
    }
    // SAFETY: this thread's state (the caller got it from `this_thread` on this thread).
    let inside = unsafe { &(*thread).inside };
    let entered = if inside.replace(true) {
        None
    } else {
        Some(Entered(thread))
    };
    // The mark is in place before anything the hook does (a lock it takes, say), for a
    // handler on this thread: only the compiler could reorder them.
    compiler_fence(Ordering::SeqCst);
    entered
}
