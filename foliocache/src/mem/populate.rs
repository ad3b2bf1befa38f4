//! Populating the arena ahead of the allocator: a background thread faults in the 2 MiB blocks
//! the buddy allocator will hand out next, so that readers do not pay for first touches.
//!
//! A fresh anonymous page is zeroed by the kernel at its first touch. For the cache that touch
//! is usually an O_DIRECT read into a new folio: the submitting reader faults the page in
//! (zeroing 2 MiB at a time with huge pages) inside its `io_uring_enter`, on the critical path
//! of a cold read. The kernel's own page cache never zeroes pages it reads into. On this
//! machine's VM a first touch is slow as well (the host backs the memory at that moment): a
//! profile of db_bench reading a cold database through the preload library spent a third of
//! its samples in `clear_page_erms` under the readers' submissions.
//!
//! The allocator takes its largest blocks from the head of the max-order free list, so the
//! blocks it hands out next are known. Whenever an allocation lands in a 2 MiB block other than
//! the last one's, the populator is kicked; it looks at the next [`AHEAD`] blocks on that list
//! and faults in those not yet done (`MADV_POPULATE_WRITE`, which touches no byte of a page
//! that is already there, so racing with a folio's owner is harmless). When the list is empty
//! (the arena has been handed out whole once) it stops for good: from then on freed memory has
//! been touched already. The work is the same (the zeroing still happens, on another core);
//! what changes is who waits for it.

use crate::mem::buddy::Buddy;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// Blocks kept populated ahead of the allocator (16 MiB).
pub(crate) const AHEAD: usize = 8;

/// Pages in a populated block (2 MiB).
pub(crate) const BLOCK_PAGES: usize = 512;

/// The populator of one arena (see the module documentation).
#[derive(Debug)]
pub(crate) struct Populator {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The block of the last allocation (a change kicks the thread).
    last_block: AtomicU32,
}

#[derive(Debug)]
struct Shared {
    /// The arena's first byte, as an address (the thread only ever passes it to `madvise`).
    base: usize,
    /// The arena's pages.
    pages: usize,
    /// The allocator, whose next blocks the thread populates.
    buddy: Arc<Buddy>,
    /// Blocks already faulted in by this thread.
    done: Box<[AtomicBool]>,
    state: Mutex<State>,
    wake: Condvar,
    /// No block left to populate: allocations stop kicking.
    finished: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    kicked: bool,
    shutdown: bool,
}

impl Populator {
    /// A populator for an arena of `pages` pages at `base` (aligned to a block) whose pages
    /// `buddy` allocates. The thread starts at the first kick.
    pub(crate) fn new(base: *mut u8, pages: usize, buddy: Arc<Buddy>) -> Self {
        let blocks = pages.div_ceil(BLOCK_PAGES);
        Self {
            shared: Arc::new(Shared {
                base: base as usize,
                pages,
                buddy,
                done: (0..blocks).map(|_| AtomicBool::new(false)).collect(),
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
                finished: AtomicBool::new(false),
            }),
            thread: Mutex::new(None),
            last_block: AtomicU32::new(u32::MAX),
        }
    }

    /// An allocation returned `pfn`. Cheap when its block is the last allocation's: one or
    /// two loads.
    pub(crate) fn allocated(&self, pfn: u32) {
        let block = pfn / BLOCK_PAGES as u32;
        if self.shared.finished.load(Ordering::Relaxed)
            || self.last_block.load(Ordering::Relaxed) == block
        {
            return;
        }
        self.last_block.store(block, Ordering::Relaxed);
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.is_none() {
            let shared = Arc::clone(&self.shared);
            match super::threads::spawn("foliocache-populate", move || shared.run()) {
                Ok(handle) => *thread = Some(handle),
                // No thread: readers touch their pages themselves, as without a populator.
                Err(_) => {
                    self.shared.finished.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
        drop(thread);
        let mut state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.kicked = true;
        drop(state);
        self.shared.wake.notify_one();
    }

    /// Pages `pfn..pfn + count` were given back to the kernel (`MADV_DONTNEED`): their blocks
    /// are not populated any more.
    pub(crate) fn discarded(&self, pfn: usize, count: usize) {
        let first = pfn / BLOCK_PAGES;
        let last = (pfn + count - 1) / BLOCK_PAGES;
        for done in &self.shared.done[first..=last.min(self.shared.done.len() - 1)] {
            done.store(false, Ordering::Relaxed);
        }
    }

    /// Blocks this populator faulted in (for tests and statistics).
    pub(crate) fn populated_blocks(&self) -> usize {
        self.shared
            .done
            .iter()
            .filter(|done| done.load(Ordering::Relaxed))
            .count()
    }
}

impl Shared {
    fn run(&self) {
        loop {
            {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                while !state.kicked && !state.shutdown {
                    state = self
                        .wake
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if state.shutdown {
                    return;
                }
                state.kicked = false;
            }
            let blocks = self.buddy.next_max_blocks(AHEAD);
            if blocks.is_empty() {
                // The arena was handed out whole once: everything has been touched.
                self.finished.store(true, Ordering::Relaxed);
                return;
            }
            for pfn in blocks {
                let block = pfn as usize / BLOCK_PAGES;
                if self.done[block].swap(true, Ordering::Relaxed) {
                    continue;
                }
                let first = block * BLOCK_PAGES;
                let pages = BLOCK_PAGES.min(self.pages - first);
                let addr = self.base + first * crate::mem::PAGE_SIZE;
                // SAFETY: the range lies inside the arena's mapping (a block holding a block of
                // the allocator's free list, clipped to the arena's pages), which outlives this
                // thread (the populator, which joins
                // it, is dropped before the arena). MADV_POPULATE_WRITE only faults pages in
                // as a write would; it never changes a byte of a page that is present, so a
                // folio owner using part of the block meanwhile is not disturbed.
                let rc = unsafe {
                    libc::madvise(
                        addr as *mut libc::c_void,
                        pages * crate::mem::PAGE_SIZE,
                        libc::MADV_POPULATE_WRITE,
                    )
                };
                if rc != 0 {
                    // An old kernel without it (or no memory): stop; readers fault as before.
                    self.finished.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
    }
}

impl Drop for Populator {
    fn drop(&mut self) {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .shutdown = true;
        self.shared.wake.notify_all();
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}
