//! The read path, shared by every kind of file (`docs/KERNEL.md`, "Data flow of a read").
//!
//! `ReadPolicy::Batched` (seed 004, the default): take a batch of up to 31 contiguous folios
//! per index walk ([`Mapping::get_read_batch`]); copy uptodate folios; for holes and folios
//! that are not uptodate, remember a pending *zero run* and clear the destination in one
//! `fill` when the run ends, however many folios and holes it spans. A hole is measured in the
//! same index walk that found it ([`FolioBatch::gap_end`]), skipping empty slots whole, and a
//! memory file's run of fallocated (zeros) folios a leaf at a time
//! ([`Cursor::seek`](crate::raw::Cursor::seek)).
//!
//! A small read (at most [`SMALL_READ_MAX`] bytes in one page) first tries the optimistic path
//! ([`SmallReadPolicy::Optimistic`]): no reference taken, nothing shared written.
//!
//! A read within one page skips the batch machinery: one speculative lookup, as the kernel's
//! batch of one costs one load, one try-get and one reload.
//!
//! `ReadPolicy::PerFolio` (the shmem loop before seed 004): one top-down index walk per
//! iteration, the folio locked and unlocked to check it is still in the file, and for holes and
//! folios that are not uptodate one 4 KiB copy from a zero page per iteration.
//!
//! Both read the size once, return a short read at end of file, and never take the file's
//! write lock: folios are immutable while uptodate (see [`crate::file`]), so a copy needs only
//! the folio's reference.

use crate::error::Error;
use crate::inode::{DiskSource, Inode};
use crate::io::ReadRequest;
use crate::mapping::{BatchEnd, FolioBatch, Mapping, OPTIMISTIC_MAX, Optimistic, Recent};
use crate::mem::{FolioRef, LockedFolio, PAGE_SHIFT, PAGE_SIZE, flag};
use crate::policy::{Policy, ReadPolicy, SmallReadPolicy};
use crate::readahead::{self, RaState};
use std::ops::Deref;
use std::sync::Arc;

/// Reads of at most this many bytes within one page may take the optimistic path
/// ([`SmallReadPolicy::Optimistic`]).
pub const SMALL_READ_MAX: usize = OPTIMISTIC_MAX;

/// The most bytes one zero-copy read ([`Handle::read_folios`](crate::Handle::read_folios))
/// returns: 1 GiB, so a huge sparse range costs at most 512 zero slices (2 MiB each).
pub const MAX_READ_RUN: usize = 1 << 30;

/// A shared buffer of zeros for holes in zero-copy reads and the per-folio loop's zero page.
/// It sits in `.bss`, so reading it costs no memory (the kernel maps its zero page).
static ZEROS: [u8; 2 << 20] = [0; 2 << 20];

/// Reads `buf.len()` bytes at `pos` (fewer at end of file). `ahead`: the reader is
/// sequential (this read starts where its last one ended), so its next read will likely start
/// where this one ends.
#[inline]
pub(crate) fn read_at(
    file: &Inode,
    policy: &Policy,
    buf: &mut [u8],
    pos: u64,
    ahead: bool,
    recent: &mut Option<Recent>,
) -> Result<usize, Error> {
    let mapping = &file.mapping;
    let size = mapping.size();
    if buf.is_empty() || pos >= size {
        return Ok(0);
    }
    let len = (size - pos).min(buf.len() as u64) as usize;
    let buf = &mut buf[..len];
    if policy.small_read == SmallReadPolicy::Optimistic
        && len <= SMALL_READ_MAX
        && pos >> PAGE_SHIFT == (pos + len as u64 - 1) >> PAGE_SHIFT
    {
        match mapping.read_optimistic(pos, buf, recent) {
            Optimistic::Data => return Ok(len),
            // A memory file: a hole or a fallocated folio reads as zeros.
            Optimistic::Gap => {
                buf.fill(0);
                return Ok(len);
            }
            Optimistic::Fallback => {}
        }
    }
    read_referenced(mapping, policy.read, buf, pos, ahead);
    Ok(len)
}

/// The read of `buf.len()` bytes at `pos` with references (the small read's optimistic path
/// inlined into its callers, the rest here).
#[inline(never)]
fn read_referenced(mapping: &Mapping, policy: ReadPolicy, buf: &mut [u8], pos: u64, ahead: bool) {
    match policy {
        ReadPolicy::Batched => read_batched(mapping, buf, pos, ahead),
        ReadPolicy::PerFolio => read_per_folio(mapping, buf, pos),
    }
}

/// Where the gap found by an empty read batch at byte `at` ends, clipped to `end`.
fn gap_end_byte(batch: &FolioBatch<'_>, at: u64, end: u64) -> u64 {
    batch
        .gap_end()
        .map_or(end, |page| (page << PAGE_SHIFT).clamp(at, end))
}

/// Zeros pending in the destination, cleared in one run when something else comes.
struct ZeroRun {
    from: Option<usize>,
}

impl ZeroRun {
    fn extend(&mut self, at: usize) {
        self.from.get_or_insert(at);
    }

    fn flush(&mut self, buf: &mut [u8], to: usize) {
        if let Some(from) = self.from.take() {
            buf[from..to].fill(0);
        }
    }
}

/// Seed 004's batched read. `ahead` as [`read_at`]: a read within one page then prefetches
/// what follows it, in its folio or the next one (see
/// [`copy_hits`](crate::mapping::copy_hits)).
fn read_batched(mapping: &Mapping, buf: &mut [u8], pos: u64, ahead: bool) {
    let end = pos + buf.len() as u64;
    let last = (end - 1) >> PAGE_SHIFT;
    if pos >> PAGE_SHIFT == last {
        // Within one page, a batch is one folio: one load, one try_get, one reload. The next
        // folio is peeked at only for a prefetch.
        let prefetch = ahead && crate::mem::folio::sequential_prefetch();
        let (folio, next) = if prefetch {
            mapping.lookup_peeking::<true>(last)
        } else {
            (mapping.lookup(last), None)
        };
        match folio.as_ref().and_then(|f| f.bytes().map(|b| (f, b))) {
            Some((folio, bytes)) => {
                let from = (pos - (folio.index() << PAGE_SHIFT)) as usize;
                let to = from + buf.len();
                if prefetch {
                    // Where the next read will start, if it does where this one ends: in
                    // this folio, or at the start of the next one.
                    if to < bytes.len() {
                        folio.prefetch(to, buf.len());
                    } else if let Some(next) = next {
                        mapping.prefetch_block(next, buf.len());
                    }
                }
                buf.copy_from_slice(&bytes[from..to]);
            }
            None => buf.fill(0),
        }
        return;
    }
    let mut at = pos;
    let mut zeros = ZeroRun { from: None };
    let mut batch = FolioBatch::new();
    while at < end {
        let done = (at - pos) as usize;
        mapping.get_read_batch(at >> PAGE_SHIFT, last, BatchEnd::AtGap, &mut batch);
        if batch.is_empty() {
            // A hole: zeros up to the next cached folio or the end.
            let next = gap_end_byte(&batch, at, end);
            zeros.extend(done);
            at = next;
            continue;
        }
        let folios = batch.folios();
        let mut k = 0;
        while k < folios.len() && at < end {
            let first = folios[k].index() << PAGE_SHIFT;
            let done = (at - pos) as usize;
            // The longest run of folios from here that are uptodate and adjacent in the arena:
            // copied with one memcpy.
            let mut run = k + 1;
            if folios[k].is_uptodate() {
                while run < folios.len()
                    && folios[run].is_uptodate()
                    && folios[run].id() == folios[run - 1].id() + folios[run - 1].nr_pages() as u32
                {
                    run += 1;
                }
            }
            let span = match FolioRef::contiguous_bytes(&folios[k..run]) {
                Some(bytes) => {
                    let n = ((first + bytes.len() as u64).min(end) - at) as usize;
                    zeros.flush(buf, done);
                    let from = (at - first) as usize;
                    buf[done..done + n].copy_from_slice(&bytes[from..from + n]);
                    n
                }
                None => {
                    // Not uptodate (a memory file's fallocated folio): zeros.
                    run = k + 1;
                    zeros.extend(done);
                    ((first + folios[k].len() as u64).min(end) - at) as usize
                }
            };
            at += span as u64;
            k = run;
        }
        batch.clear();
    }
    zeros.flush(buf, buf.len());
}

fn read_per_folio(mapping: &Mapping, buf: &mut [u8], pos: u64) {
    let end = pos + buf.len() as u64;
    let mut at = pos;
    while at < end {
        let done = (at - pos) as usize;
        let page_end = ((at >> PAGE_SHIFT) + 1) << PAGE_SHIFT;
        // The old loop locked the folio to check it was still in this file. One that left it
        // since the lookup (replaced by a copy, or removed) is looked up again, as the kernel's
        // loop does: what is there now is a folio or a hole, not necessarily a hole.
        let folio = loop {
            let Some(folio) = mapping.lookup(at >> PAGE_SHIFT) else {
                break None;
            };
            let still = {
                let _locked = folio.lock();
                folio.mapping_id() == mapping.id()
            };
            if still {
                break Some(folio);
            }
        };
        match folio.as_ref().and_then(FolioRef::bytes) {
            Some(bytes) => {
                let first = folio.as_ref().map_or(0, |f| f.index() << PAGE_SHIFT);
                let n = ((first + bytes.len() as u64).min(end) - at) as usize;
                let from = (at - first) as usize;
                buf[done..done + n].copy_from_slice(&bytes[from..from + n]);
                at += n as u64;
            }
            None => {
                // A hole or a folio not uptodate: one page of zeros from the zero page.
                let n = (page_end.min(end) - at) as usize;
                buf[done..done + n].copy_from_slice(&ZEROS[..n]);
                at += n as u64;
            }
        }
    }
}

/// A piece of a zero-copy read: bytes of a referenced folio, or zeros.
#[derive(Debug)]
pub enum Slice<'m> {
    /// `len` bytes of `folio` from byte `start`; the reference pins them.
    Folio {
        /// The folio, referenced.
        folio: FolioRef<'m>,
        /// First byte within the folio.
        start: usize,
        /// Number of bytes.
        len: usize,
    },
    /// `len` zero bytes (a hole, or a folio that is not uptodate).
    Zeros(usize),
}

impl Deref for Slice<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Folio { folio, start, len } => match folio.bytes() {
                Some(bytes) => &bytes[*start..*start + *len],
                // Not reachable: only uptodate folios become `Folio` slices, and a referenced
                // folio stays uptodate.
                None => &ZEROS[..(*len).min(ZEROS.len())],
            },
            Self::Zeros(len) => &ZEROS[..*len],
        }
    }
}

/// The result of [`Handle::read_folios`](crate::Handle::read_folios): the slices, in order,
/// covering the range read (clipped at end of file).
#[derive(Debug, Default)]
pub struct ReadRun<'m> {
    slices: Vec<Slice<'m>>,
    len: usize,
}

impl<'m> ReadRun<'m> {
    /// The slices, in file order.
    pub fn slices(&self) -> &[Slice<'m>] {
        &self.slices
    }

    /// Total bytes (0 at or past end of file).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the run is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the run into a vector (for tests and convenience).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for slice in &self.slices {
            out.extend_from_slice(slice);
        }
        out
    }

    fn push_zeros(&mut self, mut n: usize) {
        self.len += n;
        if let Some(Slice::Zeros(last)) = self.slices.last_mut() {
            let room = ZEROS.len() - *last;
            let add = room.min(n);
            *last += add;
            n -= add;
        }
        while n > 0 {
            let add = n.min(ZEROS.len());
            self.slices.push(Slice::Zeros(add));
            n -= add;
        }
    }
}

pub(crate) fn read_folios(file: &Inode, pos: u64, len: usize) -> Result<ReadRun<'_>, Error> {
    let mapping = &file.mapping;
    let size = mapping.size();
    let mut run = ReadRun::default();
    if len == 0 || pos >= size {
        return Ok(run);
    }
    let end = pos + (size - pos).min(len as u64);
    let last = (end - 1) >> PAGE_SHIFT;
    let mut at = pos;
    let mut batch = FolioBatch::new();
    while at < end {
        mapping.get_read_batch(at >> PAGE_SHIFT, last, BatchEnd::AtGap, &mut batch);
        if batch.is_empty() {
            let next = gap_end_byte(&batch, at, end);
            run.push_zeros((next - at) as usize);
            at = next;
            continue;
        }
        for folio in batch.drain() {
            let first = folio.index() << PAGE_SHIFT;
            let n = ((first + folio.len() as u64).min(end) - at) as usize;
            if folio.is_uptodate() {
                let start = (at - first) as usize;
                run.len += n;
                run.slices.push(Slice::Folio {
                    folio,
                    start,
                    len: n,
                });
            } else {
                run.push_zeros(n);
            }
            at += n as u64;
        }
    }
    debug_assert_eq!(run.len as u64, end - pos);
    Ok(run)
}

const _: () = assert!(PAGE_SIZE <= ZEROS.len());

/// Reads from a file backed by storage: the kernel's `filemap_read` (`docs/KERNEL.md`, "The
/// buffered read"). Misses start readahead and wait for the device; a folio carrying the
/// READAHEAD mark starts the next window before its own bytes are waited for.
pub(crate) fn read_disk(
    file: &Arc<Inode>,
    ra: &mut RaState,
    buf: &mut [u8],
    pos: u64,
) -> Result<usize, Error> {
    read_disk_waiting(file, ra, buf, pos, Wait::Block)
}

/// How a read of a backed file treats a folio whose read is not done (see
/// [`Handle::read_at_nowait`](crate::Handle::read_at_nowait)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Wait for the read in flight, or read the folio in this thread (`read_at`).
    Block,
    /// Never wait: start the reads a blocking read would start, then stop with
    /// [`Error::WouldBlock`]. A folio whose last read failed is read again when
    /// `retry_failed`, else its failure is the error (the caller waited for that read).
    No {
        /// Whether a failed folio is read again (else reported).
        retry_failed: bool,
    },
}

/// Reads of a file from storage of at most this many bytes first copy what is cached without
/// taking references ([`SmallReadPolicy::Optimistic`]). A reference is an atomic write to the
/// folio's descriptor, which on a random read is a cache miss the CPU must finish before it
/// goes on; a plain load of it overlaps with the copy's misses. Larger reads spread the
/// references over more bytes and take the batch path.
pub const HIT_READ_MAX: usize = 16 << 10;

/// A read of a file from storage under `policy`: a read of at most [`HIT_READ_MAX`] bytes
/// copies the cached folios it starts with without references, and the referenced path
/// ([`read_disk`]) reads the rest (misses, folios not uptodate, a READAHEAD mark, changes
/// under the copy), so what a read does to readahead and reclaim is the same either way.
pub(crate) fn read_disk_with(
    file: &Arc<Inode>,
    (policy, recent): (&Policy, &mut Option<Recent>),
    ra: &mut RaState,
    buf: &mut [u8],
    pos: u64,
) -> Result<usize, Error> {
    let mut done = 0;
    if policy.small_read == SmallReadPolicy::Optimistic && buf.len() <= HIT_READ_MAX {
        let size = file.mapping.size();
        if pos >= size || buf.is_empty() {
            return Ok(0);
        }
        let len = (size - pos).min(buf.len() as u64) as usize;
        let unmarked = u64::try_from(ra.prev_pos - 1).ok();
        // A reader that goes on where its last read ended will likely go on again.
        let sequential = ra.prev_pos == pos as i64;
        done = file
            .mapping
            .copy_hits(pos, &mut buf[..len], (unmarked, sequential), recent);
        if done > 0 {
            ra.prev_pos = (pos + done as u64) as i64;
        }
        if done == len {
            return Ok(len);
        }
    }
    Ok(done + read_disk(file, ra, &mut buf[done..], pos + done as u64)?)
}

/// [`read_disk`] with a choice of waiting.
pub(crate) fn read_disk_waiting(
    file: &Arc<Inode>,
    ra: &mut RaState,
    buf: &mut [u8],
    pos: u64,
    wait: Wait,
) -> Result<usize, Error> {
    walk_disk(
        file,
        ra,
        pos,
        buf.len(),
        wait,
        true,
        |folio, from, n, done| {
            if let Some(bytes) = folio.bytes() {
                buf[done..done + n].copy_from_slice(&bytes[from..from + n]);
            }
        },
    )
}

/// The zero-copy read of a file backed by storage: like [`read_disk`], but the run borrows the
/// folios.
pub(crate) fn read_folios_disk<'f>(
    file: &'f Arc<Inode>,
    ra: &mut RaState,
    pos: u64,
    len: usize,
) -> Result<ReadRun<'f>, Error> {
    let mut run = ReadRun::default();
    walk_disk(
        file,
        ra,
        pos,
        len,
        Wait::Block,
        false,
        |folio, start, len, _| {
            run.len += len;
            run.slices.push(Slice::Folio { folio, start, len });
        },
    )?;
    Ok(run)
}

/// Walks `pos..pos + len` of a backed file (clipped at end of file) in uptodate folios, in
/// order, handing each piece to `take(folio, offset in the folio, bytes, offset in the read)`.
/// Returns the bytes walked: all of them up to the end of the file, never a short count before
/// it. A failure to read is an error even after some bytes were walked: [`Error::Io`] then
/// says in `offset` where the walk stopped (the first byte not walked), so a caller can tell
/// how much it got, and a short count always means end of file. Updates the reader's position
/// for readahead. `copying` when `take` copies the bytes out: each next folio is prefetched.
fn walk_disk<'f>(
    file: &'f Arc<Inode>,
    ra: &mut RaState,
    pos: u64,
    len: usize,
    wait: Wait,
    copying: bool,
    mut take: impl FnMut(FolioRef<'f>, usize, usize, usize),
) -> Result<usize, Error> {
    let size = file.mapping.size();
    if len == 0 || pos >= size {
        return Ok(0);
    }
    let end = pos + (size - pos).min(len as u64);
    let last = (end - 1) >> PAGE_SHIFT;
    let mut at = pos;
    let mut batch = FolioBatch::new();
    // The previous read ended in the folio this one starts in: that folio's access was
    // recorded already (the kernel's `pos_same_folio` check, so that small sequential reads
    // do not make every folio look hot).
    let last_byte = u64::try_from(ra.prev_pos - 1).ok();
    while at < end {
        if let Err(error) = get_pages(file, ra, at >> PAGE_SHIFT, last, wait, &mut batch) {
            ra.prev_pos = at as i64;
            return Err(match error {
                Error::Io { len, source, .. } => Error::Io {
                    offset: at,
                    len,
                    source,
                },
                Error::WouldBlock { .. } => Error::WouldBlock { offset: at },
                other => other,
            });
        }
        let mut folios = batch.drain().peekable();
        while let Some(folio) = folios.next() {
            let first = folio.index() << PAGE_SHIFT;
            if first > at || at >= end || !folio.is_uptodate() {
                break;
            }
            let n = ((first + folio.len() as u64).min(end) - at) as usize;
            if copying && let Some(next) = folios.peek() {
                // As `copy_hits`: the next folio's first page on its way while this one is
                // copied.
                next.prefetch(0, (end - at) as usize - n);
            }
            let continued = at == pos
                && last_byte.is_some_and(|b| b >= first && b < first + folio.len() as u64);
            if !continued {
                crate::reclaim::mark_accessed(&folio);
            }
            take(folio, (at - first) as usize, n, (at - pos) as usize);
            at += n as u64;
        }
    }
    ra.prev_pos = at as i64;
    Ok((at - pos) as usize)
}

/// The kernel's `filemap_get_pages`: fills `batch` with uptodate folios from page `index`
/// (at most to `last`), starting readahead on a miss or a mark and waiting for the device
/// where it must. On success the batch holds at least one folio, all uptodate.
fn get_pages<'f>(
    file: &'f Arc<Inode>,
    ra: &mut RaState,
    index: u64,
    last: u64,
    wait: Wait,
    batch: &mut FolioBatch<'f>,
) -> Result<(), Error> {
    let mapping = &file.mapping;
    if file.disk().is_none() {
        return Err(Error::NotADiskFile);
    }
    loop {
        mapping.get_read_batch(index, last, BatchEnd::AtNotReady, batch);
        if batch.is_empty() {
            readahead::on_miss(file, ra, index, last + 1 - index);
            mapping.get_read_batch(index, last, BatchEnd::AtNotReady, batch);
            if batch.is_empty() {
                // Readahead read nothing here (disabled, out of memory, or raced): read this
                // one page ourselves.
                if let Wait::No { .. } = wait {
                    create_folio_nowait(file, index)?;
                    continue;
                }
                match create_folio(file, index)? {
                    Some(folio) => batch.push(folio),
                    None => continue,
                }
            }
        }
        if let Some(tail) = batch.folios().last() {
            // The next window starts before this one's bytes are waited for.
            let request = (last + 1).saturating_sub(tail.index()).max(1);
            readahead::on_folio(file, ra, tail, request);
        }
        let Some(tail) = batch.folios().last() else {
            continue;
        };
        if tail.is_uptodate() {
            return Ok(());
        }
        if batch.len() > 1 {
            // Copy the uptodate prefix now; come back for the rest.
            batch.pop();
            return Ok(());
        }
        let ready = match wait {
            Wait::Block => update_page(file, ra, tail)?,
            Wait::No { retry_failed } => update_page_nowait(file, tail, retry_failed)?,
        };
        match ready {
            true => return Ok(()),
            false => batch.clear(),
        }
    }
}

/// The kernel's `filemap_update_page` for a folio that is not uptodate: waits for a read in
/// flight, or reads it synchronously if none is (readahead skipped it, or its read failed).
/// Returns whether the folio is now uptodate and still in the file (`false`: look it up again).
pub(crate) fn update_page(
    file: &Inode,
    ra: &mut RaState,
    folio: &FolioRef<'_>,
) -> Result<bool, Error> {
    let mapping = &file.mapping;
    let Some(locked) = folio.try_lock() else {
        // A read in flight: wait for it, then look again (it may have failed, or the folio
        // may have left the file meanwhile).
        folio.wait_unlocked();
        return Ok(folio.is_uptodate() && folio.mapping_id() == mapping.id());
    };
    if folio.mapping_id() != mapping.id() {
        return Ok(false);
    }
    if folio.is_uptodate() {
        return Ok(true);
    }
    read_locked_folio(file, ra, locked)
}

/// Reads one locked folio that is in the file, synchronously (`filemap_read_folio`). Returns
/// whether it is uptodate now; `false` when a truncation cut the file short under the read
/// (look it up again). On failure the folio is left not uptodate (a later read tries again) and
/// this reader's window shrinks 4× (a failing device should not be hammered with large reads).
fn read_locked_folio(
    file: &Inode,
    ra: &mut RaState,
    locked: LockedFolio<'_>,
) -> Result<bool, Error> {
    let disk = file.disk().ok_or(Error::NotADiskFile)?;
    let folio = locked.folio().clone();
    let offset = folio.index() << PAGE_SHIFT;
    let limit = file.read_limit();
    disk.backend
        .read_now(vec![folio_request(file, disk, locked, limit)]);
    folio.wait_unlocked();
    if folio.is_uptodate() {
        return Ok(true);
    }
    // A shrinking `set_len` publishes the new size and cuts storage short, then waits for this
    // folio's lock to drop it. A request that took the old size as its limit meets the new end
    // of storage early and fails the folio as a short read. That is no I/O error: the folio is
    // leaving the file (or has left it), and the caller looks again with the new size. (Only
    // when the file did shrink: a read that fails at an unchanged limit is an error, or the
    // caller would retry it forever.)
    if folio.mapping_id() != file.mapping.id() || file.read_limit() < limit {
        return Ok(false);
    }
    ra.ra_pages /= 4;
    Err(Error::Io {
        offset,
        len: folio.len() as u64,
        source: disk.io.last_error(),
    })
}

/// [`update_page`] that never waits: a read in flight is [`Error::WouldBlock`]; a folio no
/// read is filling is submitted to the backend (not read in this thread) and is
/// `WouldBlock` too, unless its last read failed and `retry_failed` is false: then the
/// failure is the error (the caller waited for that read and must not start it again
/// forever; a later read tries the device again, as after any failed read).
fn update_page_nowait(
    file: &Inode,
    folio: &FolioRef<'_>,
    retry_failed: bool,
) -> Result<bool, Error> {
    let mapping = &file.mapping;
    let offset = folio.index() << PAGE_SHIFT;
    let Some(locked) = folio.try_lock() else {
        return Err(Error::WouldBlock { offset });
    };
    if folio.mapping_id() != mapping.id() {
        return Ok(false);
    }
    if folio.is_uptodate() {
        return Ok(true);
    }
    let disk = file.disk().ok_or(Error::NotADiskFile)?;
    if folio.test(flag::ERROR) && !retry_failed {
        return Err(Error::Io {
            offset,
            len: folio.len() as u64,
            source: disk.io.last_error(),
        });
    }
    submit_locked_folio(file, locked);
    Err(Error::WouldBlock { offset })
}

/// Starts the read of one locked folio that is in the file, without waiting for it.
fn submit_locked_folio(file: &Inode, locked: LockedFolio<'_>) {
    let Some(disk) = file.disk() else { return };
    disk.backend
        .submit(vec![folio_request(file, disk, locked, file.read_limit())]);
}

/// The request that reads one locked folio of the file (`read_folio`) up to `limit` (the
/// file's read limit when the request is made), counted, with the folio's last failure cleared.
fn folio_request(
    file: &Inode,
    disk: &DiskSource,
    locked: LockedFolio<'_>,
    limit: u64,
) -> ReadRequest {
    disk.ra.read_folio.inc();
    let folio = locked.folio();
    folio.clear(flag::ERROR);
    let offset = folio.index() << PAGE_SHIFT;
    ReadRequest::new(
        Arc::clone(&file.core.mem),
        Arc::clone(&disk.io),
        vec![locked],
        offset,
        limit,
    )
}

/// [`create_folio`] that never waits: inserts one page at `index` (if no other reader did)
/// and starts its read; returns [`Error::WouldBlock`] for the caller to wait, or `Ok` when
/// another reader's folio is there now (look it up again).
fn create_folio_nowait(file: &Arc<Inode>, index: u64) -> Result<(), Error> {
    let folio = file.core.alloc_for_readahead(0)?;
    let (locked, shadow) = match file.mapping.add_folio(folio, index) {
        Ok(added) => added,
        Err(Error::Exists { .. }) => return Ok(()),
        Err(error) => return Err(error),
    };
    let cache = &file.core;
    cache
        .reclaim
        .add_inserted(&cache.mem, &[(locked.folio().id(), shadow)]);
    submit_locked_folio(file, locked);
    Err(Error::WouldBlock {
        offset: index << PAGE_SHIFT,
    })
}

/// The kernel's `filemap_create_folio`: readahead produced no folio at `index`, so insert one
/// page and read it. `None` if another reader inserted one first, or a truncation cut the file
/// short under the read (look it up again).
pub(crate) fn create_folio<'f>(
    file: &'f Arc<Inode>,
    index: u64,
) -> Result<Option<FolioRef<'f>>, Error> {
    // The reader's own page: worth waiting a little for (other readers release the folios
    // they hold, and evicted memory comes back after a grace period).
    let mut tries = 0;
    let folio = loop {
        match file.core.alloc_for_readahead(0) {
            Ok(folio) => break folio,
            Err(Error::NoMemory { .. }) if tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(error) => return Err(error),
        }
    };
    let (locked, shadow) = match file.mapping.add_folio(folio, index) {
        Ok(added) => added,
        Err(Error::Exists { .. }) => return Ok(None),
        Err(error) => return Err(error),
    };
    let folio = locked.folio().clone();
    let cache = &file.core;
    cache
        .reclaim
        .add_inserted(&cache.mem, &[(folio.id(), shadow)]);
    let mut scratch = RaState::new(0);
    if !read_locked_folio(file, &mut scratch, locked)? {
        return Ok(None);
    }
    Ok(Some(folio))
}
