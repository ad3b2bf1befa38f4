//! Writeback: dirty folios to storage, and the kernel's error semantics (`mm/page-writeback.c`,
//! `fs/fs-writeback.c`, `lib/errseq.c`; `kernel-write-path.md` §2–6).
//!
//! # Folio states and who changes them
//! A folio is dirty (DIRTY flag, Dirty mark) from the write that made it until a writeback pass
//! takes it: then it is under writeback (WRITEBACK flag and mark) until its write completes,
//! and then clean, or dirty again if the write failed and [`WritebackErrorPolicy::KeepDirty`]
//! keeps its data. Every one of these changes happens under the mapping's writer lock,
//! together with the marks, so flag and mark agree whenever the lock is free (the kernel's
//! invariants 3 and 4 hold without its exception). Writes never change a folio in place: they
//! copy it (`Mapping::replace_dirty`), and wait for a folio under writeback before copying it,
//! so the bytes of a folio under writeback are stable and its write sees one version.
//!
//! # A pass
//! [`write_back`] is one pass over a range of one file, at most one at a time per file (the
//! kernel's `I_SYNC`), which waits for its own writes before it ends: no folio is under
//! writeback outside a pass. An integrity pass ([`SyncMode::All`], fsync) first turns the
//! range's Dirty marks into ToWrite marks and then writes exactly the tagged folios, however
//! fast writers dirty new ones (no livelock); a background pass ([`SyncMode::None`]) writes
//! Dirty folios up to a page budget. Adjacent folios go out as one request (up to
//! [`MAX_WRITE_BYTES`]), with at most [`PASS_WINDOW_BYTES`] of a pass in flight. O_DIRECT writes whole blocks, so a last page past the end of the file
//! extends it on storage: the pass then sets the size on storage back to the file's size.
//!
//! # Errors ([`ErrSeq`])
//! A failed write records its errno in the file's error sequence (the kernel's errseq_t): a
//! [`Handle`](crate::Handle) samples it when created and, at its next sync, reports an error
//! recorded since, once. The data of the failed folios is kept dirty (retried by the next
//! pass) or, with [`WritebackErrorPolicy::Discard`], dropped as the kernel does.

use crate::error::Error;
use crate::index::Mark;
use crate::inode::Inode;
use crate::io::{MAX_IOVECS, Transfer};
use crate::mem::{FolioRef, PAGE_SHIFT, PAGE_SIZE};
use crate::policy::WritebackErrorPolicy;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// The largest single write a pass submits.
pub(crate) const MAX_WRITE_BYTES: usize = 2 << 20;

/// The most bytes one pass keeps in flight: it takes more folios from the index only when
/// its writes in flight fall below this. Unbounded, a pass of 256 MiB put 128 extending writes
/// on ext4 at once, which contend for the inode and got 90% of what the device does at depth
/// 8; with 16 MiB, 95% (median of 15 paired runs each, a throwaway harness on this machine).
/// It also bounds how long folios stay under writeback, which writers of them wait for.
const PASS_WINDOW_BYTES: u64 = 16 << 20;

/// Folios one pass takes from the index per hold of the writer lock.
const BATCH_PAGES: u64 = 512;

/// The kernel's errseq_t (`lib/errseq.c`): the last error (errno, 12 bits), whether anyone has
/// seen it (bit 12), and a counter of errors seen (the rest).
#[derive(Debug, Default)]
pub(crate) struct ErrSeq(AtomicU32);

const ERRNO_MASK: u32 = (1 << 12) - 1;
const SEEN: u32 = 1 << 12;
const COUNTER_ONE: u32 = 1 << 13;

impl ErrSeq {
    /// Records an error (`errseq_set`). The counter moves only if the last error was seen:
    /// errors nobody looked at merge into one report.
    pub(crate) fn set(&self, errno: i32) {
        let errno = (errno.unsigned_abs() & ERRNO_MASK).max(1);
        let mut old = self.0.load(Ordering::Acquire);
        loop {
            let mut new = (old & !(ERRNO_MASK | SEEN)) | errno;
            if old & SEEN != 0 {
                new = new.wrapping_add(COUNTER_ONE);
            }
            if new == old {
                return;
            }
            match self
                .0
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) if now == new => return,
                Err(now) => old = now,
            }
        }
    }

    /// What a new reader of the errors starts from (`errseq_sample`): 0 while the current
    /// error is unseen, so a handle opened after an error nobody saw still reports it.
    pub(crate) fn sample(&self) -> u32 {
        let now = self.0.load(Ordering::Acquire);
        if now & SEEN == 0 { 0 } else { now }
    }

    /// The error recorded since `since`, if any, marking it seen and moving `since` on
    /// (`errseq_check_and_advance`): each reader gets each error once.
    pub(crate) fn check_and_advance(&self, since: &mut u32) -> Option<i32> {
        let old = self.0.load(Ordering::Acquire);
        if old == *since {
            return None;
        }
        let new = old | SEEN;
        if new != old {
            // A lost race is fine: someone else marked it seen.
            let _ = self
                .0
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire);
        }
        *since = new;
        match new & ERRNO_MASK {
            0 => None,
            errno => Some(errno as i32),
        }
    }
}

/// Which folios a pass writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyncMode {
    /// Every folio dirty when the pass starts (an integrity sync: fsync, sync_range with all
    /// three flags, the last close). The kernel's `WB_SYNC_ALL`.
    All,
    /// Dirty folios, up to this many pages (background writeback). `WB_SYNC_NONE`.
    None(u64),
}

/// The outcome of one pass (its errors are in the file's error sequence).
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Pages written (or attempted).
    pub(crate) pages: u64,
}

/// The writes of one pass in flight.
#[derive(Debug, Default)]
struct Pass {
    state: Mutex<PassState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct PassState {
    pending: usize,
    /// Bytes of this pass's writes in flight.
    in_flight: u64,
    /// The largest end offset a write of this pass reached.
    end: u64,
}

impl Pass {
    fn lock(&self) -> std::sync::MutexGuard<'_, PassState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn finished(&self, end: u64, len: usize) {
        let mut state = self.lock();
        state.pending -= 1;
        state.in_flight -= len as u64;
        state.end = state.end.max(end);
        if state.pending == 0 || state.in_flight < PASS_WINDOW_BYTES {
            self.done.notify_all();
        }
    }

    /// Waits until less than the window is in flight.
    fn wait_for_window(&self) {
        let mut state = self.lock();
        while state.in_flight >= PASS_WINDOW_BYTES {
            state = self
                .done
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn wait(&self) -> PassState {
        let mut state = self.lock();
        while state.pending > 0 {
            state = self
                .done
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        std::mem::take(&mut *state)
    }
}

/// A write of a run of folios under writeback, adjacent in the file from byte `offset`: what
/// the I/O engine is handed. It holds a reference on each folio (and the file) until it
/// completes.
struct WriteRequest {
    inode: Arc<Inode>,
    /// Folio ids, in file order; each holds one reference taken for this request.
    folios: Vec<u32>,
    offset: u64,
    len: usize,
    pass: Arc<Pass>,
    completed: bool,
}

impl WriteRequest {
    fn end(&mut self, result: &io::Result<usize>) {
        if self.completed {
            return;
        }
        self.completed = true;
        let failed = match result {
            Ok(n) => *n < self.len,
            Err(_) => true,
        };
        let disk = self.inode.disk().expect("writeback of a file from storage");
        if failed {
            let errno = match result {
                Err(error) => error.raw_os_error().unwrap_or(libc::EIO),
                Ok(_) => libc::EIO,
            };
            disk.wb.errors.set(errno);
            disk.wb
                .failed_writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        } else if let Some(direct) = &disk.direct {
            direct.wrote_to(self.offset + self.len as u64);
        }
        let redirty =
            failed && self.inode.policy.writeback_error == WritebackErrorPolicy::KeepDirty;
        let mem = &self.inode.core.mem;
        let mut pages = 0;
        for &pfn in &self.folios {
            // The request's reference, dropped at the end of this iteration.
            let folio = FolioRef { mem, pfn };
            pages += folio.nr_pages() as u64;
            self.inode.mapping.end_writeback(&folio, redirty);
        }
        disk.wb
            .written_pages
            .fetch_add(pages, std::sync::atomic::Ordering::Relaxed);
        self.inode.core.writeback_done(pages);
        self.pass.finished(self.offset + self.len as u64, self.len);
    }
}

impl Transfer for WriteRequest {
    fn offset(&self) -> u64 {
        self.offset
    }

    fn len(&self) -> usize {
        self.len
    }

    fn io_vectors(&self) -> Vec<libc::iovec> {
        let mem = &self.inode.core.mem;
        let mut out: Vec<libc::iovec> = Vec::with_capacity(self.folios.len());
        for &pfn in &self.folios {
            let base = mem.page_ptr(pfn);
            let len = PAGE_SIZE << mem.desc(pfn).order.load(crate::sync::Ordering::Relaxed);
            if let Some(last) = out.last_mut()
                && last.iov_base.cast::<u8>().wrapping_add(last.iov_len) == base
            {
                last.iov_len += len;
                continue;
            }
            out.push(libc::iovec {
                iov_base: base.cast(),
                iov_len: len,
            });
        }
        out
    }

    fn is_write(&self) -> bool {
        true
    }

    fn end_of_file(&self) -> u64 {
        u64::MAX
    }

    fn complete(mut self: Box<Self>, result: io::Result<usize>) {
        self.end(&result);
    }
}

impl Drop for WriteRequest {
    fn drop(&mut self) {
        // Lost on the way (an engine shutting down, a panic while completing): the folios end
        // their writeback as failed rather than stay under it forever.
        self.end(&Err(io::Error::other("write request dropped")));
    }
}

/// Writes back the dirty folios of `inode` in pages `first..=last` (see the module
/// documentation) and waits for the writes. Errors of the writes are in the outcome (and in
/// the file's error sequence); `Err` only if the pass could not run (a read-only file).
pub(crate) fn write_back(
    inode: &Arc<Inode>,
    first: u64,
    last: u64,
    mode: SyncMode,
) -> Result<Outcome, Error> {
    let Some(disk) = inode.disk() else {
        return Ok(Outcome::default());
    };
    let Some(direct) = &disk.direct else {
        return Ok(Outcome::default()); // a custom backend: read only, never dirty
    };
    let _one_pass = disk.wb.pass_lock();
    if inode.mapping.dirty_pages() == 0 {
        return Ok(Outcome::default());
    }
    // The writes change the file's times on storage: the cache's own change.
    inode.own_change(|| pass(inode, direct, first, last, mode))
}

/// [`write_back`]'s pass, under the pass lock.
fn pass(
    inode: &Arc<Inode>,
    direct: &crate::io::DirectFile,
    first: u64,
    last: u64,
    mode: SyncMode,
) -> Result<Outcome, Error> {
    let disk = inode.disk().expect("a file from storage");
    let mapping = &inode.mapping;
    let (mark, budget) = match mode {
        SyncMode::All => {
            mapping.tag_towrite(first, last);
            (Mark::ToWrite, u64::MAX)
        }
        SyncMode::None(pages) => (Mark::Dirty, pages),
    };
    let pass = Arc::new(Pass::default());
    let mut from = first;
    let mut pages = 0u64;
    while pages < budget {
        pass.wait_for_window();
        let (folios, next) =
            mapping.start_writeback(from, last, mark, BATCH_PAGES.min(budget - pages));
        if folios.is_empty() {
            break;
        }
        let mut requests: Vec<Box<dyn Transfer>> = Vec::new();
        let mut run: Vec<FolioRef<'_>> = Vec::new();
        let flush = |run: &mut Vec<FolioRef<'_>>, requests: &mut Vec<Box<dyn Transfer>>| {
            if run.is_empty() {
                return;
            }
            let offset = run[0].index() << PAGE_SHIFT;
            let len = run.iter().map(FolioRef::len).sum();
            let folios = run
                .drain(..)
                .map(|folio| {
                    let pfn = folio.pfn;
                    // The reference now belongs to the request.
                    std::mem::forget(folio);
                    pfn
                })
                .collect();
            let mut state = pass.lock();
            state.pending += 1;
            state.in_flight += len as u64;
            drop(state);
            requests.push(Box::new(WriteRequest {
                inode: Arc::clone(inode),
                folios,
                offset,
                len,
                pass: Arc::clone(&pass),
                completed: false,
            }));
        };
        for folio in folios {
            pages += folio.nr_pages() as u64;
            let adjacent = run.last().is_some_and(|prev| {
                prev.index() + prev.nr_pages() as u64 == folio.index()
                    && run.iter().map(FolioRef::len).sum::<usize>() + folio.len() <= MAX_WRITE_BYTES
                    && run.len() < MAX_IOVECS
            });
            if !adjacent {
                flush(&mut run, &mut requests);
            }
            run.push(folio);
        }
        flush(&mut run, &mut requests);
        // Not writable after all: the requests were dropped, which failed them.
        direct.submit_writes(requests)?;
        match next {
            Some(next) => from = next,
            None => break,
        }
    }
    let state = pass.wait();
    // O_DIRECT wrote whole blocks: a last page past the end of the file made it longer on
    // storage than it is. Set it back (the bytes past the end are zeros: the cache keeps the
    // bytes of a folio past the end of the file zero).
    let size = mapping.size();
    if state.end > size
        && let Err(error) = direct.set_size(size)
    {
        let errno = match &error {
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        };
        disk.wb.errors.set(errno);
    }
    disk.wb.clear_dirtied_if(|| mapping.dirty_pages() == 0);
    Ok(Outcome { pages })
}

/// What each file from storage keeps for writeback.
#[derive(Debug, Default)]
pub(crate) struct WbState {
    /// One pass at a time (the kernel's `I_SYNC`); also taken by changes that must not run
    /// during a pass (truncation, hole punching).
    pass: Mutex<()>,
    /// Errors of writeback, as an errseq.
    pub(crate) errors: ErrSeq,
    /// When the file first became dirty since it was last clean (the kernel's
    /// `dirtied_when`, for expiry), and whether it is on the flusher's list.
    dirtied: Mutex<Option<std::time::Instant>>,
    /// Pages written back, and writes that failed (counters).
    pub(crate) written_pages: AtomicU64,
    pub(crate) failed_writes: AtomicU64,
}

impl WbState {
    pub(crate) fn pass_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.pass.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that the file has dirty data; returns true when it just became dirty (the caller
    /// then puts it on the flusher's list).
    pub(crate) fn note_dirtied(&self) -> bool {
        let mut dirtied = self.dirtied.lock().unwrap_or_else(PoisonError::into_inner);
        if dirtied.is_some() {
            return false;
        }
        *dirtied = Some(std::time::Instant::now());
        true
    }

    pub(crate) fn dirtied_when(&self) -> Option<std::time::Instant> {
        *self.dirtied.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets when the file became dirty if `clean()` says it has no dirty data left: asked
    /// under the same lock as `note_dirtied`, so a writer that dirties a folio meanwhile
    /// (counted before it calls `note_dirtied`) either keeps the file dirty here or finds it
    /// clean there and puts it back on the flusher's list.
    fn clear_dirtied_if(&self, clean: impl FnOnce() -> bool) {
        let mut dirtied = self.dirtied.lock().unwrap_or_else(PoisonError::into_inner);
        if clean() {
            *dirtied = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errseq_follows_the_kernels_worked_example() {
        // kernel-write-path.md §6.2, EIO = 5.
        let wb = ErrSeq::default();
        let (mut a, mut b) = (wb.sample(), wb.sample());
        assert_eq!((a, b), (0, 0));
        wb.set(-5);
        let mut c = wb.sample(); // opened after the error, before anyone saw it
        assert_eq!(c, 0, "an unseen error reaches a later opener");
        assert_eq!(wb.check_and_advance(&mut a), Some(5));
        let mut d = wb.sample(); // opened after it was seen
        assert_ne!(d, 0);
        assert_eq!(wb.check_and_advance(&mut b), Some(5));
        assert_eq!(wb.check_and_advance(&mut c), Some(5));
        assert_eq!(
            wb.check_and_advance(&mut d),
            None,
            "opened after it was seen"
        );
        assert_eq!(wb.check_and_advance(&mut a), None, "reported once");
        // A second error: everyone sees it once.
        wb.set(-5);
        for since in [&mut a, &mut b, &mut c, &mut d] {
            assert_eq!(wb.check_and_advance(since), Some(5));
            assert_eq!(wb.check_and_advance(since), None);
        }
        // Two errors before anyone looks: one report (the latest errno).
        let mut e = wb.sample();
        wb.set(-5);
        wb.set(-28);
        assert_eq!(wb.check_and_advance(&mut e), Some(28));
        assert_eq!(wb.check_and_advance(&mut e), None);
    }
}
