//! [`ObjectFile`] and [`ObjectHandle`]: an object in a foliocache cache, read blocking or
//! async, never mixing two versions of the object in one read.
//!
//! A read compares the backend's generation before and after it: the generation moves only
//! after every page of the old version left the cache, so a read that saw no move saw one
//! version only; one that saw a move is read again. A read that reaches the store after the
//! object changed fails with `ESTALE` (see [`crate::backend`]): the file is revalidated (its
//! pages dropped, the new version pinned) and the read done again, at most
//! [`CHANGE_RETRIES`] times.

use crate::backend::ObjectBackend;
use crate::runtime;
use foliocache::{Error, File, Handle, Revalidated};
use std::sync::Arc;
use std::time::Duration;

/// Times one read starts again because the object changed under it.
pub const CHANGE_RETRIES: u32 = 3;

/// How long an async read waits for a completion before it looks again (a folio locked by
/// something other than a read, eviction for one, wakes no one).
const RECHECK: Duration = Duration::from_millis(10);

/// An object opened in a cache ([`ObjectCache::open_object`](crate::ObjectCache::open_object)).
/// Cheap to clone; clones share the cache's pages of the object.
#[derive(Debug, Clone)]
pub struct ObjectFile {
    file: File,
    backend: Arc<ObjectBackend>,
}

/// Whether `error` says the object changed since its version was pinned.
fn is_stale(error: &Error) -> bool {
    matches!(error, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ESTALE))
}

fn kept_changing(pos: u64) -> Error {
    Error::Io {
        offset: pos,
        len: 0,
        source: std::io::Error::from_raw_os_error(libc::ESTALE),
    }
}

impl ObjectFile {
    pub(crate) fn new(file: File, backend: Arc<ObjectBackend>) -> Self {
        Self { file, backend }
    }

    /// The cache's file (counters, cached ranges, zero-copy reads; reads through it are not
    /// checked for a version change: use [`ObjectHandle`]).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The backend: the object's path, pinned version and request counters.
    pub fn backend(&self) -> &ObjectBackend {
        &self.backend
    }

    /// The size of the pinned version.
    pub fn size(&self) -> u64 {
        self.file.size()
    }

    /// A reader with its own readahead state, its window the options' `readahead_bytes`.
    pub fn handle(&self) -> ObjectHandle {
        let mut handle = self.file.handle();
        handle.set_ra_bytes(self.backend.options().readahead_bytes);
        ObjectHandle {
            handle,
            file: self.clone(),
        }
    }

    /// Reads at `pos` with a handle of its own (no readahead history: prefer a kept
    /// [`ObjectHandle`] for a sequential reader).
    pub fn read_at(&self, buf: &mut [u8], pos: u64) -> Result<usize, Error> {
        self.handle().read_at(buf, pos)
    }

    /// Looks at the object again (one HEAD): if it changed, drops every cached page and reads
    /// the new version from now on. A file holding changes not yet committed keeps them and
    /// its version: if the object changed, that is a conflict (`Error::Io` with `ESTALE`; the
    /// next sync fails the same way), which [`discard_changes`](Self::discard_changes) ends.
    /// The core checks this under the file's change lock, so a write cannot slip in between.
    pub fn revalidate(&self) -> Result<Revalidated, Error> {
        // The new version is pinned by the core, under the file's locks, after the drop
        // (`Backend::revalidated`, see `ObjectBackend::adopt_last_head`).
        self.file.revalidate()
    }

    /// Whether the file holds changes not yet committed (dirty pages, a commit under way, a
    /// size change).
    pub fn holds_changes(&self) -> bool {
        let stats = self.file.mapping_stats();
        stats.dirty_pages + stats.writeback_pages > 0
            || foliocache::WriteBackend::resized(&*self.backend)
    }

    /// Writes `data` at `pos` into the cache (dirty; the object changes at the next sync).
    /// The file must have been opened with [`ObjectOptions::write`](crate::ObjectOptions::write)
    /// or `create`, else [`Error::ReadOnly`].
    pub fn write_at(&self, data: &[u8], pos: u64) -> Result<usize, Error> {
        self.file.write_at(data, pos)
    }

    /// Sets the file's size (committed at the next sync).
    pub fn set_len(&self, len: u64) -> Result<(), Error> {
        self.file.set_len(len)
    }

    /// Uploads the object if the file holds changes, and waits ([`crate::commit`]). `Ok`:
    /// the store has every change made before the call. An error leaves the object as it
    /// was and the changes dirty (the next sync tries again): `Error::Writeback` with
    /// `ESTALE` when another writer changed the object (a conflict), the store's errno
    /// otherwise; [`ObjectBackend::last_error`] says what happened.
    pub fn sync(&self) -> Result<(), Error> {
        self.file.sync_all()
    }

    /// Drops the changes not yet committed and reads the object as the store has it now
    /// (how a conflict ends). Returns the pages of changes dropped.
    pub fn discard_changes(&self) -> Result<u64, Error> {
        // The core drops the changes (a size change too, `WriteBackend::discard`) under the
        // file's locks, so no commit can take them meanwhile.
        let dropped = self.file.discard_dirty(libc::ECANCELED);
        // The discard is recorded as an error (`ECANCELED`) for the handles that were open
        // (their writes are gone); the caller asked for it, so it is seen here (a handle's
        // look at the error sequence that writes nothing), not by the next `sync`.
        if dropped > 0 {
            let _ = self
                .file
                .handle()
                .sync_range(0, 0, foliocache::SyncRange::WAIT_BEFORE);
        }
        // The size and pages as the store has them: looked at again whatever the stamp says.
        self.file.changed_outside()?;
        Ok(dropped)
    }
}

/// One reader of an object: the blocking and the async read, each giving bytes of one
/// version of the object.
#[derive(Debug)]
pub struct ObjectHandle {
    handle: Handle,
    file: ObjectFile,
}

impl ObjectHandle {
    /// The cache's handle (readahead state, advice).
    pub fn inner(&mut self) -> &mut Handle {
        &mut self.handle
    }

    /// Reads at `pos` into `buf`, blocking on a miss; a short count means the end of the
    /// object. The bytes are of one version of the object (the one pinned when the read
    /// ended): if it changed under the read, the file is revalidated and the read done again.
    pub fn read_at(&mut self, buf: &mut [u8], pos: u64) -> Result<usize, Error> {
        for _ in 0..=CHANGE_RETRIES {
            let before = self.file.backend.generation();
            match self.handle.read_at(buf, pos) {
                Ok(n) if self.file.backend.generation() == before => return Ok(n),
                Ok(_) => continue,
                Err(error) if is_stale(&error) => {
                    self.file.revalidate()?;
                    self.restore_window();
                }
                Err(error) => return Err(error),
            }
        }
        Err(kept_changing(pos))
    }

    /// [`read_at`](Self::read_at) that does not block a thread on a miss: it copies what is
    /// cached, starts the reads the blocking read would start (readahead included), and waits
    /// for their completions as a future, in any executor (the requests run on the crate's
    /// own runtime). Revalidation after a change runs on that runtime's blocking threads.
    pub async fn read_at_async(&mut self, buf: &mut [u8], pos: u64) -> Result<usize, Error> {
        for _ in 0..=CHANGE_RETRIES {
            let before = self.file.backend.generation();
            match self.read_once_async(buf, pos).await {
                Ok(n) if self.file.backend.generation() == before => return Ok(n),
                Ok(_) => continue,
                Err(error) if is_stale(&error) => {
                    let file = self.file.clone();
                    runtime::blocking(move || file.revalidate()).await?;
                    self.restore_window();
                }
                Err(error) => return Err(error),
            }
        }
        Err(kept_changing(pos))
    }

    /// A failed read shrinks the handle's window (a failing device should not get large
    /// reads); a read refused because the object changed is no such failure.
    fn restore_window(&mut self) {
        self.handle
            .set_ra_bytes(self.file.backend.options().readahead_bytes);
    }

    async fn read_once_async(&mut self, buf: &mut [u8], pos: u64) -> Result<usize, Error> {
        let mut done = 0;
        // Where the last try stopped to wait: a failed read found there again is the read it
        // waited for, reported rather than started again.
        let mut waited_at = None;
        loop {
            let completions = Arc::clone(&self.file.backend.completions);
            let notified = completions.notified();
            tokio::pin!(notified);
            // Registered before the try, so a completion between the try and the wait wakes it.
            notified.as_mut().enable();
            let at = pos + done as u64;
            let retry_failed = waited_at != Some(at);
            match self
                .handle
                .read_at_nowait(&mut buf[done..], at, retry_failed)
            {
                Ok(n) => return Ok(done + n),
                Err(Error::WouldBlock { offset }) => {
                    done = usize::try_from(offset - pos)
                        .unwrap_or(buf.len())
                        .min(buf.len());
                    waited_at = Some(offset);
                    let recheck = runtime::sleep(RECHECK);
                    tokio::pin!(recheck);
                    futures_util::future::select(notified, recheck).await;
                }
                Err(error) => return Err(error),
            }
        }
    }
}
