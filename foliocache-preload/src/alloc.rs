//! The library's own memory allocator: every Rust allocation of this library (the cache's
//! bookkeeping, the fd table, vectors on a miss) comes from here, never from glibc's `malloc`.
//!
//! # Why
//! `read` and `pread` are async-signal-safe: a program may call them from a signal handler,
//! and the handler may have interrupted the program inside `malloc`, holding one of glibc's
//! arena locks (or halfway through its per-thread cache). Through this library, such a read
//! runs the cache's code, which allocates on a miss; with glibc's allocator it would wait for
//! the lock its own thread holds, forever (or corrupt the interrupted list). With an allocator
//! of its own, the library never touches glibc's allocator state from a hook.
//!
//! # Design
//! * Blocks of 16 B to 64 KiB come from power-of-two size classes. Each class has a free list
//!   threaded through its free blocks, and refills from 1 MiB chunks mapped with `mmap`; memory
//!   of a class is reused, never unmapped (the library's heap is small: its large data is the
//!   cache's arena, mapped separately). A block of class `c` is aligned to `c` (chunks are
//!   page-aligned and carved in steps of `c`), so alignments up to 4 KiB are served by size.
//! * Larger blocks (or alignments above 4 KiB) are their own `mmap`, unmapped on free.
//! * Each class has a spin lock (held for a few instructions; a waiter yields its CPU after a
//!   while). A thread that enters the allocator while it is already inside it (a signal
//!   handler that interrupted it) must not wait for itself: it only *tries* the class's lock
//!   (free, the interrupted frame is not using that class), and otherwise takes its block from
//!   the *reserve*, a separate 4 MiB region handed out by a lock-free atomic bump and never
//!   reused. Freeing a reserve block does nothing; a nested free that finds its class's lock
//!   taken leaks the block.
//! * fork: nothing is held across it (a thread that holds nothing of ours but is inside glibc's
//!   `malloc` may be interrupted by a handler that allocates here, while the forking thread
//!   waits for that `malloc` to finish). Instead the child starts the classes afresh
//!   ([`reset_in_child`]): a class lock a vanished thread held, or a list it was changing, is
//!   dropped with the parent's free lists (their memory stays valid and is simply not reused).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering, compiler_fence};

const PAGE: usize = 4096;
/// The smallest class (a free block holds the next pointer).
const MIN_SHIFT: u32 = 4;
/// The largest class, 64 KiB.
const MAX_SHIFT: u32 = 16;
const CLASSES: usize = (MAX_SHIFT - MIN_SHIFT + 1) as usize;
/// The size of the chunks classes carve blocks from.
const CHUNK: usize = 1 << 20;
/// The reserve for nested allocations.
const RESERVE: usize = 4 << 20;
/// Spins before a waiter yields its CPU.
const SPINS: u32 = 64;

struct Class {
    lock: AtomicBool,
    /// The first free block (each free block's first word points to the next); guarded by
    /// `lock`.
    free: AtomicPtr<u8>,
    /// Uncarved space of the current chunk: `[next, end)`; guarded by `lock`.
    next: AtomicUsize,
    end: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // the array initialiser below, one per class
const EMPTY: Class = Class {
    lock: AtomicBool::new(false),
    free: AtomicPtr::new(null_mut()),
    next: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
};

static CLASS: [Class; CLASSES] = [EMPTY; CLASSES];

/// The reserve: `[start, start + RESERVE)`, handed out up to `RESERVE_USED`.
static RESERVE_START: AtomicUsize = AtomicUsize::new(0);
static RESERVE_USED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread is inside the allocator (const-initialised, no destructor: usable
    /// at any point of a thread's life, signal handlers included).
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// The allocator: set as the library's `#[global_allocator]`.
pub(crate) struct Allocator;

/// Where a layout is served from. `dealloc` routes by the same function.
enum Route {
    Class(usize),
    Map,
}

fn route(layout: Layout) -> Route {
    let size = layout.size().max(layout.align()).max(1 << MIN_SHIFT);
    if size > 1 << MAX_SHIFT || layout.align() > PAGE {
        return Route::Map;
    }
    let shift = size.next_power_of_two().trailing_zeros();
    Route::Class((shift - MIN_SHIFT) as usize)
}

fn map(bytes: usize) -> *mut u8 {
    // SAFETY: a new private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        null_mut()
    } else {
        p.cast()
    }
}

fn unmap(p: *mut u8, bytes: usize) {
    // SAFETY: callers pass a range this module mapped and nothing uses any more.
    unsafe { libc::munmap(p.cast(), bytes) };
}

fn spin_lock(lock: &AtomicBool) {
    let mut spins = 0;
    while lock
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins < SPINS {
            std::hint::spin_loop();
        } else {
            // SAFETY: sched_yield takes no arguments and only gives up the CPU.
            unsafe { libc::sched_yield() };
        }
    }
}

fn unlock(lock: &AtomicBool) {
    lock.store(false, Ordering::Release);
}

/// A mapping of at least `size` bytes aligned to `align` (a power of two): mapped with room
/// to spare, then the unaligned head and the tail beyond the rounded size unmapped.
fn map_aligned(size: usize, align: usize) -> *mut u8 {
    let bytes = size.next_multiple_of(PAGE);
    if align <= PAGE {
        return map(bytes);
    }
    let Some(padded) = bytes.checked_add(align) else {
        return null_mut();
    };
    let base = map(padded);
    if base.is_null() {
        return base;
    }
    let start = (base as usize).next_multiple_of(align);
    let head = start - base as usize;
    if head > 0 {
        unmap(base, head);
    }
    let tail = padded - head - bytes;
    if tail > 0 {
        unmap((start + bytes) as *mut u8, tail);
    }
    start as *mut u8
}

/// A block from the reserve (nested allocations), null when it is used up. Lock-free: a
/// nested call may have interrupted another on its own thread.
fn from_reserve(layout: Layout) -> *mut u8 {
    let mut start = RESERVE_START.load(Ordering::Acquire);
    if start == 0 {
        let mapped = map(RESERVE) as usize;
        if mapped == 0 {
            return null_mut();
        }
        match RESERVE_START.compare_exchange(0, mapped, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => start = mapped,
            Err(theirs) => {
                unmap(mapped as *mut u8, RESERVE);
                start = theirs;
            }
        }
    }
    let mut at = 0;
    let bumped = RESERVE_USED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
        at = (start + used).next_multiple_of(layout.align());
        let end = at.checked_add(layout.size())?;
        (end <= start + RESERVE).then_some(end - start)
    });
    if bumped.is_ok() {
        at as *mut u8
    } else {
        null_mut()
    }
}

fn in_reserve(p: *mut u8) -> bool {
    let start = RESERVE_START.load(Ordering::Relaxed);
    start != 0 && (start..start + RESERVE).contains(&(p as usize))
}

/// Takes a block of class `k`, with its lock held.
fn class_alloc(k: usize) -> *mut u8 {
    let class = &CLASS[k];
    let size = 1usize << (k as u32 + MIN_SHIFT);
    let head = class.free.load(Ordering::Relaxed);
    if !head.is_null() {
        // SAFETY: `head` is a free block of this class (at least 16 bytes, aligned to its
        // size): its first word holds the next free block, written by `class_free`.
        let next = unsafe { head.cast::<*mut u8>().read() };
        class.free.store(next, Ordering::Relaxed);
        return head;
    }
    let mut next = class.next.load(Ordering::Relaxed);
    if next == 0 || next + size > class.end.load(Ordering::Relaxed) {
        let chunk = map(CHUNK);
        if chunk.is_null() {
            return chunk;
        }
        next = chunk as usize;
        class.end.store(next + CHUNK, Ordering::Relaxed);
    }
    class.next.store(next + size, Ordering::Relaxed);
    next as *mut u8
}

/// Returns block `p` to class `k`, with its lock held.
fn class_free(k: usize, p: *mut u8) {
    let class = &CLASS[k];
    let next = class.free.load(Ordering::Relaxed);
    // SAFETY: `p` is a block of this class that its owner gave up: this module owns its bytes
    // now, and the first word (the block is at least 16 bytes, aligned) holds the link.
    unsafe { p.cast::<*mut u8>().write(next) };
    class.free.store(p, Ordering::Relaxed);
}

/// Runs `op` with class `k`'s lock held, marked as inside the allocator. A thread already
/// inside (a signal handler interrupted it) does not wait for the lock, which its interrupted
/// frame may hold: `None` when the lock is taken.
fn with_class<T>(k: usize, op: impl FnOnce() -> T) -> Option<T> {
    let lock = &CLASS[k].lock;
    if INSIDE.with(|inside| inside.replace(true)) {
        if !try_lock(lock) {
            return None;
        }
        let result = op();
        unlock(lock);
        return Some(result);
    }
    // The mark must be in place before the lock is taken, for a handler on this thread: a
    // compiler fence orders the two for it (a handler runs on this very thread).
    compiler_fence(Ordering::SeqCst);
    spin_lock(lock);
    let result = op();
    unlock(lock);
    compiler_fence(Ordering::SeqCst);
    INSIDE.with(|inside| inside.set(false));
    Some(result)
}

/// Takes a class's lock if it is free, without waiting.
fn try_lock(lock: &AtomicBool) -> bool {
    lock.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
}

// SAFETY: `alloc` returns null or a block of at least `layout.size()` bytes aligned to
// `layout.align()` that no other live allocation overlaps (a class block is handed out once
// until freed; mappings are fresh); `dealloc` takes back exactly such blocks, routed by the
// same layout.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let k = match route(layout) {
            Route::Map => return map_aligned(layout.size(), layout.align()),
            Route::Class(k) => k,
        };
        with_class(k, || class_alloc(k)).unwrap_or_else(|| from_reserve(layout))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if let Route::Map = route(layout) {
            // A fresh anonymous mapping reads as zeros.
            return map_aligned(layout.size(), layout.align());
        }
        // SAFETY: the caller's layout promise, passed on.
        let p = unsafe { self.alloc(layout) };
        if !p.is_null() {
            // SAFETY: `p` has `layout.size()` writable bytes.
            unsafe { p.write_bytes(0, layout.size()) };
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if in_reserve(p) {
            return;
        }
        let k = match route(layout) {
            Route::Map => return unmap(p, layout.size().next_multiple_of(PAGE)),
            Route::Class(k) => k,
        };
        // `None`: nested with the class's lock taken, the block is leaked rather than waited for.
        let _ = with_class(k, || class_free(k, p));
    }
}

/// In a forked child, first thing: forgets every class's lock, free list and chunk (a thread
/// that did not come along may have held a lock or been changing a list). The parent's blocks
/// stay valid memory: those the child frees go to the new lists, the rest are not reused.
pub(crate) fn reset_in_child() {
    for class in &CLASS {
        class.free.store(null_mut(), Ordering::Relaxed);
        class.next.store(0, Ordering::Relaxed);
        class.end.store(0, Ordering::Relaxed);
        class.lock.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` as a signal handler that interrupted this thread inside the allocator would.
    fn inside<T>(f: impl FnOnce() -> T) -> T {
        assert!(!INSIDE.with(|inside| inside.replace(true)));
        let result = f();
        INSIDE.with(|inside| inside.set(false));
        result
    }

    fn check(a: &Allocator, size: usize, align: usize, fill: u8) -> (*mut u8, Layout) {
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: a non-zero-sized layout.
        let p = unsafe { a.alloc(layout) };
        assert!(!p.is_null(), "{layout:?}");
        assert_eq!(p as usize % align, 0, "{layout:?} at {p:?}");
        // SAFETY: the block has `size` writable bytes.
        unsafe { p.write_bytes(fill, size) };
        (p, layout)
    }

    #[test]
    fn blocks_are_aligned_disjoint_and_reused() {
        let a = Allocator;
        let mut live = Vec::new();
        let sizes = [1, 8, 16, 17, 100, 4096, 5000, 65536, 65537, 300_000];
        for (i, &size) in sizes.iter().enumerate() {
            for align in [1, 8, 64, 4096, 1 << 16] {
                live.push((check(&a, size, align, i as u8), i as u8));
            }
        }
        // Every block still holds its own fill: none overlapped another.
        for ((p, layout), fill) in &live {
            // SAFETY: a live block of `layout.size()` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(*p, layout.size()) };
            assert!(bytes.iter().all(|b| b == fill), "{layout:?}");
        }
        // A freed class block is handed out again. This allocator serves the whole test
        // process, so another test's thread may take the block first: look for it among the
        // next few blocks of its class rather than in the very next one.
        let (p, layout) = check(&a, 200, 8, 1);
        // Made before the free: its own buffer must not be the block looked for.
        let mut again = Vec::with_capacity(256);
        // SAFETY: allocated above with this layout.
        unsafe { a.dealloc(p, layout) };
        while again.len() < 256 && !again.contains(&p) {
            again.push(check(&a, 200, 8, 2).0);
        }
        assert!(
            again.contains(&p),
            "a freed block of 200 bytes was not handed out again"
        );
        for q in again {
            // SAFETY: each was allocated just above with `layout` and is freed once.
            unsafe { a.dealloc(q, layout) };
        }
        for ((p, layout), _) in live {
            // SAFETY: each was allocated above with its layout and is freed once.
            unsafe { a.dealloc(p, layout) };
        }
    }

    #[test]
    fn a_nested_allocation_comes_from_the_reserve() {
        let a = Allocator;
        // Inside, with the class's lock taken: as a signal handler that interrupted the
        // allocator in that class would be.
        let Route::Class(k) = route(Layout::from_size_align(100, 16).unwrap()) else {
            unreachable!()
        };
        spin_lock(&CLASS[k].lock);
        let nested = inside(|| check(&a, 100, 16, 7));
        unlock(&CLASS[k].lock);
        assert!(in_reserve(nested.0));
        // Nested with the class's lock free: a class block. (This test binary allocates
        // through this allocator on other threads too, and one of them may hold the lock for
        // a moment: a few tries.)
        let from_class = (0..1000).any(|_| {
            let (q, layout) = inside(|| check(&a, 100, 16, 9));
            let class = !in_reserve(q);
            // SAFETY: allocated just above (a reserve block's free is a no-op).
            unsafe { a.dealloc(q, layout) };
            class
        });
        assert!(from_class, "a nested call never used its free class");
        // SAFETY: allocated above; freeing a reserve block is a no-op.
        unsafe { a.dealloc(nested.0, nested.1) };
        let (p, layout) = check(&a, 100, 16, 8);
        assert!(!in_reserve(p));
        // SAFETY: allocated above.
        unsafe { a.dealloc(p, layout) };
    }

    #[test]
    fn threads_allocating_at_once_never_share_a_block() {
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                std::thread::spawn(move || {
                    let a = Allocator;
                    let mut x = u64::from(t) + 1;
                    let mut live: Vec<(usize, Layout, u8)> = Vec::new();
                    for i in 0..20_000u32 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        if live.len() > 64 || (x >> 60) == 0 && !live.is_empty() {
                            let (p, layout, fill) =
                                live.swap_remove((x as usize >> 8) % live.len());
                            let p = p as *mut u8;
                            // SAFETY: a live block of `layout.size()` bytes.
                            let bytes = unsafe { std::slice::from_raw_parts(p, layout.size()) };
                            assert!(bytes.iter().all(|b| *b == fill));
                            // SAFETY: allocated below with this layout, freed once.
                            unsafe { a.dealloc(p, layout) };
                        }
                        let size = 1 + (x >> 20) as usize % 3000;
                        let fill = (i as u8) ^ t;
                        let (p, layout) = check(&a, size, 8, fill);
                        live.push((p as usize, layout, fill));
                    }
                    for (p, layout, _) in live {
                        // SAFETY: as above.
                        unsafe { a.dealloc(p as *mut u8, layout) };
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
