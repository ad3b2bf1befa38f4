//! Writeback: dirty folios to storage, and the kernel's error semantics (`mm/page-writeback.c`,
//! `fs/fs-writeback.c`, `lib/errseq.c`; `docs/KERNEL.md`, from "Dirty state and marks" to
//! "Writeback errors").
//!
//! # Folio states and who changes them
//! A folio is dirty (DIRTY flag, Dirty mark) from the write that made it until a writeback pass
//! takes it: then it is under writeback (WRITEBACK flag and mark) until its write completes,
//! and then clean, or dirty again if the write failed and [`WritebackErrorPolicy::KeepDirty`]
//! keeps its data. Every one of these changes happens under the mapping's writer lock,
//! together with the marks, so flag and mark agree whenever the lock is free (the kernel's
//! invariants 3 and 4, `docs/KERNEL.md` "Invariants of the write path", hold without its
//! exception). Writes never change a folio in place: they copy it (`Mapping::replace_dirty`),
//! and wait for a folio under writeback before copying it, so the bytes of a folio under
//! writeback are stable and its write sees one version.
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
//! # Errors (`ErrSeq`, in `wbstate.rs`)
//! A failed write records its errno in the file's error sequence (the kernel's errseq_t): a
//! [`Handle`](crate::Handle) samples it when created and, at its next sync, reports an error
//! recorded since, once. The data of the failed folios is kept dirty (retried by the next
//! pass) or, with [`WritebackErrorPolicy::Discard`], dropped as the kernel does.

use crate::dirty::Flushable;
use crate::error::Error;
use crate::index::Mark;
use crate::inode::Inode;
use crate::io::{MAX_IOVECS, Transfer, WriteBackend};
use crate::mem::{FolioRef, PAGE_SHIFT, PAGE_SIZE};
use crate::policy::WritebackErrorPolicy;
use std::io;
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
    write_back_to(inode, first, last, mode, Target::Storage)
}

/// Where a writeback pass writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Storage, through the file's own descriptor (O_DIRECT when it has it).
    Storage,
    /// The kernel's page cache (`DirectFile::submit_writes_to_kernel`): the folios are clean
    /// once the kernel has their bytes, which reach storage by its writeback or an fsync.
    Kernel,
}

/// [`write_back`] to `target`.
pub(crate) fn write_back_to(
    inode: &Arc<Inode>,
    first: u64,
    last: u64,
    mode: SyncMode,
    target: Target,
) -> Result<Outcome, Error> {
    let Some(disk) = inode.disk() else {
        return Ok(Outcome::default());
    };
    if let Some(writer) = &disk.writer {
        return Ok(commit(inode, disk, &**writer));
    }
    let Some(direct) = &disk.direct else {
        return Ok(Outcome::default()); // a custom backend: read only, never dirty
    };
    let _one_pass = disk.wb.pass_lock();
    if inode.mapping.dirty_pages() == 0 {
        // Nothing to write (a truncation may have dropped what was dirty): the file leaves
        // the flusher's list as a pass that wrote would have it.
        disk.wb
            .clear_dirtied_if(|| inode.mapping.dirty_pages() == 0);
        return Ok(Outcome::default());
    }
    // The writes change the file's times on storage: the cache's own change.
    inode.own_change(|| pass(inode, disk, direct, (first, last), mode, target))
}

/// [`write_back`]'s pass, under the pass lock.
fn pass(
    inode: &Arc<Inode>,
    disk: &crate::inode::DiskSource,
    direct: &crate::io::DirectFile,
    (first, last): (u64, u64),
    mode: SyncMode,
    target: Target,
) -> Result<Outcome, Error> {
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
        crate::inject::kill::point("writeback");
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
        match target {
            Target::Storage => direct.submit_writes(requests)?,
            Target::Kernel => direct.submit_writes_to_kernel(requests)?,
        }
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

/// A pass over a file whose backend takes whole-file commits ([`WriteBackend`]): every dirty
/// folio of the file goes under writeback, the backend puts the new version on storage, and
/// the folios end their writeback together, clean if the commit succeeded (dirty again under
/// `KeepDirty` if not, dropped under `Discard`). Whatever range or budget the caller gave, the pass commits the whole
/// file: a version of it is all storage takes.
fn commit(
    inode: &Arc<Inode>,
    disk: &crate::inode::DiskSource,
    writer: &dyn WriteBackend,
) -> Outcome {
    let mapping = &inode.mapping;
    // The size lock while the folios go under writeback and the size is read: a write puts
    // its folio in dirty before it raises the size, so without it this version could hold an
    // appended folio but not the size that covers it. Not the change lock: a writer holds
    // that while it is throttled, waiting for this very commit to clean its pages.
    let one_pass = disk.wb.pass_lock();
    let sizing = inode.lock_size();
    if mapping.dirty_pages() == 0 && !writer.resized() {
        disk.wb
            .clear_dirtied_if(|| inode.mapping.dirty_pages() == 0);
        return Outcome::default();
    }
    mapping.tag_towrite(0, u64::MAX);
    let mut folios: Vec<FolioRef<'_>> = Vec::new();
    let mut from = 0;
    loop {
        let (batch, next) = mapping.start_writeback(from, u64::MAX, Mark::ToWrite, BATCH_PAGES);
        folios.extend(batch);
        match next {
            Some(next) => from = next,
            None => break,
        }
    }
    crate::inject::kill::point("writeback");
    let size = mapping.size();
    drop(sizing);
    // The clean folios too, referenced for the commit: their bytes are storage's, and never
    // change (a write replaces a folio, it does not change it), so the backend need not
    // fetch them again. Those under writeback are the ones taken above.
    let mut clean: Vec<FolioRef<'_>> = Vec::new();
    if size > 0 {
        mapping.for_each_cached(0, (size - 1) >> PAGE_SHIFT, |folio| {
            if folio.is_uptodate() && !folio.is_dirty() && !folio.is_writeback() {
                clean.push(folio);
            }
        });
    }
    let changes = crate::io::Changes {
        size,
        dirty: pieces(&folios, size),
        clean: pieces(&clean, size),
    };
    // A backend that panics must not leave the folios under writeback for ever (writers of
    // them would wait for ever): they end as after a failed commit.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.commit(&changes)));
    drop(changes);
    drop(clean);
    // A panic is taken as a failed commit and not resumed: the caller may be the flusher
    // (which would stop for every file) or a file's last holder letting go in a drop.
    let result = result.unwrap_or_else(|_| Err(std::io::Error::from_raw_os_error(libc::EIO)));
    let keep = inode.policy.writeback_error == WritebackErrorPolicy::KeepDirty;
    let redirty = result.is_err() && keep;
    match &result {
        Ok(()) => inode.committed(writer.stamp().ok().flatten()),
        Err(error) => {
            disk.wb
                .errors
                .set(error.raw_os_error().unwrap_or(libc::EIO));
            disk.wb
                .failed_writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let mut pages = 0;
    for folio in &folios {
        pages += folio.nr_pages() as u64;
        mapping.end_writeback(folio, redirty);
    }
    if result.is_err() && !keep {
        // `Discard`: the data is dropped. Left clean, a later commit would take these bytes
        // for storage's and upload them after all, beside pages it fetches without them.
        for folio in &folios {
            let first = folio.index();
            let last = first + folio.nr_pages() as u64 - 1;
            mapping.truncate_unless(first..=last, |flags| {
                flags & (crate::mem::flag::DIRTY | crate::mem::flag::WRITEBACK) != 0
            });
        }
    }
    drop(folios);
    disk.wb
        .written_pages
        .fetch_add(pages, std::sync::atomic::Ordering::Relaxed);
    inode.core.writeback_done(pages);
    disk.wb.clear_dirtied_if(|| mapping.dirty_pages() == 0);
    drop(one_pass);
    Outcome { pages }
}

/// The bytes of `folios` below `size`, as `(file offset, bytes)`.
fn pieces<'a>(folios: &'a [FolioRef<'_>], size: u64) -> Vec<(u64, &'a [u8])> {
    folios
        .iter()
        .filter_map(|folio| {
            let offset = folio.index() << PAGE_SHIFT;
            let bytes = folio.bytes()?;
            let len = (size.saturating_sub(offset)).min(bytes.len() as u64) as usize;
            (len > 0).then(|| (offset, &bytes[..len]))
        })
        .collect()
}

impl Flushable for Inode {
    fn flush(self: Arc<Self>, first: u64, last: u64, pages: u64) -> u64 {
        let mode = if pages == u64::MAX {
            SyncMode::All
        } else {
            SyncMode::None(pages)
        };
        write_back(&self, first, last, mode).map_or(0, |outcome| outcome.pages)
    }

    fn dirtied_when(&self) -> Option<std::time::Instant> {
        self.disk().and_then(|disk| disk.wb.dirtied_when())
    }
}
