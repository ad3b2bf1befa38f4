//! The fill path for an object: [`ObjectBackend`], a [`Backend`] whose reads are ranged GETs.
//!
//! Readahead hands the backend one batch of requests per window (contiguous runs of locked,
//! not-uptodate folios). Adjacent requests are merged into GETs of at most
//! [`ObjectOptions::get_bytes`], each spawned on the crate's runtime, so a window is one or a
//! few GETs and the async part of the next window is in flight while the reader copies the
//! sync part. A random read's request is one folio, so it costs one GET of that folio. Misses
//! of many readers on one folio are one GET: the first reader inserts the folio locked, the
//! others wait on its lock.
//!
//! **Versions.** The backend is pinned to one version of the object, the one its last HEAD
//! saw (size and ETag): every GET carries `If-Match` with that ETag, and its answer's ETag and
//! range are checked again. A GET of an object that changed fails with `ESTALE` and never
//! returns bytes of another version, so pages of two versions never meet in the cache. The
//! file's owner ([`ObjectFile`](crate::ObjectFile)) then revalidates: drops every page and
//! pins the new version (`adopt_last_head`), bumping the generation that
//! reads compare to tell that the version changed under them.
//!
//! **Failures.** `object_store`'s client retries timeouts, 5xx answers and connection resets
//! with exponential backoff ([`ObjectOptions::store_retries`]); a body that breaks off is
//! fetched again from where it broke, up to [`ObjectOptions::body_retries`] times; and the
//! whole GET, retries included, is cut at [`ObjectOptions::deadline`]. Then the request
//! completes as failed: its folios stay not uptodate (a later read tries again) and the
//! reader gets `Error::Io` with `ETIMEDOUT`, `EIO`, `ENOENT` or `ESTALE`.

use crate::runtime;
use bytes::Bytes;
use foliocache::{Backend, FileStamp, ReadRequest};
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, GetResultPayload, ObjectMeta, ObjectStore};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};

/// How object files are read. The defaults suit a store a few milliseconds away; the
/// window and the GETs in flight are what keep a reader at the network's rate
/// (`docs/OBJECT.md` has the model).
#[derive(Debug, Clone)]
pub struct ObjectOptions {
    /// The largest readahead window of an object file's handles (default 32 MiB).
    pub readahead_bytes: u64,
    /// The largest single GET: a window's adjacent requests are merged up to this many bytes
    /// (default 4 MiB, so a full window is eight GETs in flight).
    pub get_bytes: u64,
    /// GETs in flight at once, for all the files opened from one store (default 32).
    pub gets_in_flight: usize,
    /// Every GET, retries included, ends by this deadline (default 30 s); a stalled connection
    /// is cut there.
    pub deadline: Duration,
    /// Retries of a request that failed with a timeout, a 5xx answer or a reset connection,
    /// done by `object_store`'s client with exponential backoff (default 4).
    pub store_retries: usize,
    /// Times a body that broke off is fetched again from where it broke (default 3).
    pub body_retries: u32,
    /// The time one HTTP request may take before the client gives it up and retries it
    /// (default 10 s).
    pub request_timeout: Duration,
    /// Whether the file can be written (default false): writes go into the cache, and each
    /// sync uploads the object ([`crate::commit`]).
    pub write: bool,
    /// Whether a missing object opens as an empty file (implies `write`; default false): the
    /// first commit creates it, unless another writer created it first.
    pub create: bool,
    /// A file up to this size is committed as one conditional PUT (default 64 MiB, held in
    /// memory for the PUT); a larger one as a multipart upload.
    pub single_put_bytes: u64,
    /// The part size of a multipart upload (default 8 MiB; at least 5 MiB, S3's minimum).
    pub part_bytes: u64,
    /// Parts of one upload in flight at once (default 4).
    pub parts_in_flight: usize,
}

impl ObjectOptions {
    /// The options a store's client is built with: those of reading and writing files are
    /// per file, not per client.
    pub(crate) fn for_client(&self) -> Self {
        Self {
            write: false,
            create: false,
            ..self.clone()
        }
    }
}

impl Default for ObjectOptions {
    fn default() -> Self {
        Self {
            readahead_bytes: 32 << 20,
            get_bytes: 4 << 20,
            gets_in_flight: 32,
            deadline: Duration::from_secs(30),
            store_retries: 4,
            body_retries: 3,
            request_timeout: Duration::from_secs(10),
            write: false,
            create: false,
            single_put_bytes: 64 << 20,
            part_bytes: 8 << 20,
            parts_in_flight: 4,
        }
    }
}

/// The version a backend reads: what a HEAD said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Version {
    /// False for an object opened with `create` that is not there yet (size 0).
    pub(crate) exists: bool,
    pub(crate) size: u64,
    pub(crate) e_tag: Option<String>,
    pub(crate) version: Option<String>,
    pub(crate) meta: ObjectMeta,
}

impl Version {
    pub(crate) fn of(meta: ObjectMeta) -> Self {
        Self {
            exists: true,
            size: meta.size,
            e_tag: meta.e_tag.clone(),
            version: meta.version.clone(),
            meta,
        }
    }

    /// Whether two answers name one version (the metadata's times may differ: a commit's
    /// own is the local clock's).
    pub(crate) fn same_as(&self, other: &Self) -> bool {
        (self.exists, self.size, &self.e_tag, &self.version)
            == (other.exists, other.size, &other.e_tag, &other.version)
    }

    /// An object that is not there yet (opened with `create`).
    fn missing(path: &Path) -> Self {
        Self {
            exists: false,
            size: 0,
            e_tag: None,
            version: None,
            meta: ObjectMeta {
                location: path.clone(),
                last_modified: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
                size: 0,
                e_tag: None,
                version: None,
            },
        }
    }

    /// The stamp revalidation compares: the size and a 128-bit hash of the ETag (or version).
    pub(crate) fn stamp(&self) -> FileStamp {
        FileStamp::versioned(self.size, version_hash(self))
    }
}

/// Two 64-bit SipHashes of the version's name, keyed apart: equality is all it is used for.
fn version_hash(version: &Version) -> u128 {
    use std::hash::{Hash, Hasher};
    let name = (&version.e_tag, &version.version);
    let mut high = std::hash::DefaultHasher::new();
    (1u8, name).hash(&mut high);
    let mut low = std::hash::DefaultHasher::new();
    (2u8, name).hash(&mut low);
    (u128::from(high.finish()) << 64) | u128::from(low.finish())
}

/// Counters of one object file (a snapshot: [`ObjectBackend::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectStats {
    /// GET requests sent (each retry by this crate counts; `object_store`'s own retries of one
    /// request do not).
    pub gets: u64,
    /// Body bytes received.
    pub bytes_fetched: u64,
    /// GETs that failed for good (after their retries).
    pub failed_gets: u64,
    /// Bodies fetched again after they broke off.
    pub body_retries: u64,
    /// GETs refused because the object changed (`If-Match` failed).
    pub stale: u64,
    /// HEAD requests sent.
    pub heads: u64,
    /// Commits tried (each sync, flush or last close of a written file).
    pub commits: u64,
    /// Commits that failed (the object unchanged, the data still dirty).
    pub failed_commits: u64,
    /// Commits refused because another writer changed the object (`ESTALE`).
    pub conflicts: u64,
    /// Single PUTs sent.
    pub puts: u64,
    /// Parts of multipart uploads sent.
    pub parts: u64,
    /// Bytes of the versions committed.
    pub bytes_uploaded: u64,
}

impl std::ops::Add for ObjectStats {
    type Output = Self;

    /// Field-wise sums (counters of several files).
    fn add(self, b: Self) -> Self {
        Self {
            gets: self.gets + b.gets,
            bytes_fetched: self.bytes_fetched + b.bytes_fetched,
            failed_gets: self.failed_gets + b.failed_gets,
            body_retries: self.body_retries + b.body_retries,
            stale: self.stale + b.stale,
            heads: self.heads + b.heads,
            commits: self.commits + b.commits,
            failed_commits: self.failed_commits + b.failed_commits,
            conflicts: self.conflicts + b.conflicts,
            puts: self.puts + b.puts,
            parts: self.parts + b.parts,
            bytes_uploaded: self.bytes_uploaded + b.bytes_uploaded,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) gets: AtomicU64,
    pub(crate) bytes_fetched: AtomicU64,
    pub(crate) failed_gets: AtomicU64,
    body_retries: AtomicU64,
    stale: AtomicU64,
    heads: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) failed_commits: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) puts: AtomicU64,
    pub(crate) parts: AtomicU64,
    pub(crate) bytes_uploaded: AtomicU64,
    /// The last failed request's message (the core keeps only its errno).
    pub(crate) last_error: Mutex<Option<String>>,
}

/// What the files of one store share: the client and the bound on GETs in flight.
#[derive(Debug)]
pub(crate) struct StoreLink {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) limit: Arc<Semaphore>,
    pub(crate) options: ObjectOptions,
}

impl StoreLink {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, options: ObjectOptions) -> Arc<Self> {
        Arc::new(Self {
            store,
            limit: Arc::new(Semaphore::new(options.gets_in_flight.max(1))),
            options,
        })
    }
}

/// One object as a foliocache backend (see the module documentation).
pub struct ObjectBackend {
    pub(crate) link: Arc<StoreLink>,
    pub(crate) path: Path,
    /// The version GETs ask for.
    pub(crate) pinned: Mutex<Version>,
    /// `pinned.size`, read on every request.
    pub(crate) size: AtomicU64,
    /// Where a truncation not yet committed cut the file (`u64::MAX`: none): the pinned
    /// version's bytes past it are no longer the file's.
    pub(crate) limit: AtomicU64,
    /// A size change waits for the next commit.
    pub(crate) resized: std::sync::atomic::AtomicBool,
    /// A commit found the object changed by another writer: until the changes are discarded,
    /// commits fail at once with `ESTALE` (retrying cannot succeed, and a multipart upload
    /// would send the whole object first).
    pub(crate) conflicted: std::sync::atomic::AtomicBool,
    /// Bumped each time another version is pinned.
    generation: AtomicU64,
    /// What the last HEAD saw (revalidation's `stamp`), until it is pinned.
    pub(crate) last_head: Mutex<Version>,
    /// Set by `open`, whose HEAD the cache's first `stamp` (when it opens the file) takes
    /// instead of sending another.
    pub(crate) fresh: std::sync::atomic::AtomicBool,
    pub(crate) counters: Arc<Counters>,
    /// Woken whenever a request completes: async readers wait on it.
    pub(crate) completions: Arc<Notify>,
}

impl fmt::Debug for ObjectBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectBackend")
            .field("store", &self.link.store.to_string())
            .field("path", &self.path.as_ref())
            .field("size", &self.size.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A failure with the errno it stands for and what happened.
#[derive(Debug)]
struct Failure {
    errno: i32,
    message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let os = io::Error::from_raw_os_error(self.errno);
        write!(f, "{} ({os})", self.message)
    }
}

impl std::error::Error for Failure {}

/// An `io::Error` that says what happened and carries the errno ([`errno_in`]).
pub(crate) fn errno_error(errno: i32, what: impl fmt::Display) -> io::Error {
    let kind = io::Error::from_raw_os_error(errno).kind();
    io::Error::new(
        kind,
        Failure {
            errno,
            message: what.to_string(),
        },
    )
}

/// The errno of an error: an OS error's, or the one [`errno_error`] put in.
pub(crate) fn errno_in(error: &io::Error) -> Option<i32> {
    error.raw_os_error().or_else(|| {
        error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<Failure>())
            .map(|failure| failure.errno)
    })
}

/// The errno an `object_store` error stands for.
pub(crate) fn errno_of(error: &object_store::Error) -> i32 {
    match error {
        object_store::Error::NotFound { .. } => libc::ENOENT,
        object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
            libc::ESTALE
        }
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => libc::EACCES,
        _ => libc::EIO,
    }
}

impl ObjectBackend {
    /// Opens `path` in the store: one HEAD, whose version the backend is pinned to.
    pub(crate) async fn open(link: Arc<StoreLink>, path: Path, create: bool) -> io::Result<Self> {
        let counters = Arc::new(Counters::default());
        let version = match head(&link, &path, &counters).await {
            Err(error) if create && errno_in(&error) == Some(libc::ENOENT) => {
                Version::missing(&path)
            }
            other => other?,
        };
        Ok(Self {
            link,
            path,
            size: AtomicU64::new(version.size),
            limit: AtomicU64::new(u64::MAX),
            resized: std::sync::atomic::AtomicBool::new(false),
            conflicted: std::sync::atomic::AtomicBool::new(false),
            pinned: Mutex::new(version.clone()),
            generation: AtomicU64::new(0),
            last_head: Mutex::new(version),
            fresh: std::sync::atomic::AtomicBool::new(true),
            counters,
            completions: Arc::new(Notify::new()),
        })
    }

    /// The object's path in its store.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many times another version was pinned (reads compare it before and after).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The pinned version's metadata (size, ETag, last modified).
    pub fn meta(&self) -> ObjectMeta {
        lock(&self.pinned).meta.clone()
    }

    pub(crate) fn options(&self) -> &ObjectOptions {
        &self.link.options
    }

    /// Pins the version the last HEAD saw, if it is not pinned already. Called after the
    /// file's pages were dropped for it (`File::revalidate`), never before: until then GETs
    /// keep asking for the old version and fail, so no page of the new version can sit next
    /// to a page of the old one.
    pub(crate) fn adopt_last_head(&self) -> bool {
        let head = lock(&self.last_head).clone();
        let mut pinned = lock(&self.pinned);
        if pinned.same_as(&head) {
            return false;
        }
        self.size.store(head.size, Ordering::Release);
        *pinned = head;
        self.generation.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Forgets what waits for a commit, the changes being discarded: a size change, and a
    /// conflict seen (commits fail at once while one stands, see [`crate::commit`]).
    pub(crate) fn forget_changes(&self) {
        self.limit.store(u64::MAX, Ordering::Release);
        self.resized.store(false, Ordering::Release);
        self.conflicted.store(false, Ordering::Release);
    }

    /// What the last failed GET said (a read fails with its errno only).
    pub fn last_error(&self) -> Option<String> {
        lock(&self.counters.last_error).clone()
    }

    /// This file's counters.
    pub fn stats(&self) -> ObjectStats {
        let c = &self.counters;
        ObjectStats {
            gets: c.gets.load(Ordering::Relaxed),
            bytes_fetched: c.bytes_fetched.load(Ordering::Relaxed),
            failed_gets: c.failed_gets.load(Ordering::Relaxed),
            body_retries: c.body_retries.load(Ordering::Relaxed),
            stale: c.stale.load(Ordering::Relaxed),
            heads: c.heads.load(Ordering::Relaxed),
            commits: c.commits.load(Ordering::Relaxed),
            failed_commits: c.failed_commits.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            puts: c.puts.load(Ordering::Relaxed),
            parts: c.parts.load(Ordering::Relaxed),
            bytes_uploaded: c.bytes_uploaded.load(Ordering::Relaxed),
        }
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) async fn head(
    link: &StoreLink,
    path: &Path,
    counters: &Counters,
) -> io::Result<Version> {
    counters.heads.fetch_add(1, Ordering::Relaxed);
    let options = GetOptions {
        head: true,
        ..GetOptions::default()
    };
    let meta = tokio::time::timeout(link.options.deadline, link.store.get_opts(path, options))
        .await
        .map_err(|_| errno_error(libc::ETIMEDOUT, format!("HEAD {path}: no answer in time")))?
        .map_err(|error| errno_error(errno_of(&error), format!("HEAD {path}: {error}")))?
        .meta;
    Ok(Version::of(meta))
}

impl Backend for ObjectBackend {
    fn size(&self) -> u64 {
        self.size
            .load(Ordering::Acquire)
            .min(self.limit.load(Ordering::Acquire))
    }

    fn submit(&self, requests: Vec<ReadRequest>) {
        let pinned = lock(&self.pinned).clone();
        let end = self.size();
        for run in merge(requests, self.link.options.get_bytes) {
            let fetch = Fetch {
                end,
                link: Arc::clone(&self.link),
                path: self.path.clone(),
                version: pinned.clone(),
                counters: Arc::clone(&self.counters),
                completions: Arc::clone(&self.completions),
            };
            runtime::handle().spawn(fetch.run(run));
        }
    }

    fn describe(&self) -> String {
        format!("object {} in {}", self.path, self.link.store)
    }

    fn revalidated(&self) {
        // Called with nothing held (the core refuses a new version under changes): a
        // conflict seen before is over with the version that caused it pinned.
        if self.adopt_last_head() {
            self.conflicted.store(false, Ordering::Release);
        }
    }

    fn stamp(&self) -> io::Result<Option<FileStamp>> {
        if self.fresh.swap(false, Ordering::AcqRel) {
            return Ok(Some(lock(&self.last_head).stamp()));
        }
        let counters = Arc::clone(&self.counters);
        let link = Arc::clone(&self.link);
        let path = self.path.clone();
        let version = match runtime::wait(async move { head(&link, &path, &counters).await }) {
            // Still not there: the file created here is not committed yet.
            Err(error) if errno_in(&error) == Some(libc::ENOENT) && !lock(&self.pinned).exists => {
                lock(&self.pinned).clone()
            }
            other => other?,
        };
        let stamp = version.stamp();
        *lock(&self.last_head) = version;
        Ok(Some(stamp))
    }
}

/// Groups contiguous requests (in the order given) into runs of at most `max` bytes (a run
/// has at least one request, however large).
fn merge(requests: Vec<ReadRequest>, max: u64) -> Vec<Vec<ReadRequest>> {
    let mut runs: Vec<Vec<ReadRequest>> = Vec::new();
    let mut run_end = 0;
    let mut run_bytes = 0;
    for request in requests {
        let len = request.len() as u64;
        let joins = runs
            .last()
            .is_some_and(|_| request.offset() == run_end && run_bytes + len <= max.max(len));
        run_end = request.offset() + len;
        if joins {
            run_bytes += len;
            if let Some(run) = runs.last_mut() {
                run.push(request);
            }
        } else {
            run_bytes = len;
            runs.push(vec![request]);
        }
    }
    runs
}

/// One GET's worth of requests, filled in order as the body arrives.
struct Fetch {
    /// Where the file's bytes on storage end (the pinned version's size, or less where a
    /// truncation not yet committed cut it): nothing past it is asked for.
    end: u64,
    link: Arc<StoreLink>,
    path: Path,
    version: Version,
    counters: Arc<Counters>,
    completions: Arc<Notify>,
}

/// Where a run's body is copied: the requests in order, each with its bytes so far. A
/// request is completed as soon as its last byte arrived, so a reader waiting for the first
/// folios of a window does not wait for the whole GET.
struct Fill {
    /// (the request while not completed, its offset, its length, bytes filled)
    requests: Vec<(Option<ReadRequest>, u64, usize, usize)>,
    /// The request being filled.
    at: usize,
    completions: Arc<Notify>,
}

impl Fill {
    fn new(requests: Vec<ReadRequest>, completions: Arc<Notify>) -> Self {
        Self {
            requests: requests
                .into_iter()
                .map(|r| (r.offset(), r.len(), Some(r)))
                .map(|(offset, len, r)| (r, offset, len, 0))
                .collect(),
            at: 0,
            completions,
        }
    }

    /// Copies `bytes` into the requests from where the last copy stopped.
    fn take(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.at < self.requests.len() {
            let (slot, _, len, filled) = &mut self.requests[self.at];
            let Some(request) = slot.as_mut() else {
                self.at += 1;
                continue;
            };
            let mut skip = *filled;
            for (_, target) in request.targets() {
                if skip >= target.len() {
                    skip -= target.len();
                    continue;
                }
                let n = (target.len() - skip).min(bytes.len());
                target[skip..skip + n].copy_from_slice(&bytes[..n]);
                bytes = &bytes[n..];
                *filled += n;
                skip = 0;
                if bytes.is_empty() {
                    break;
                }
            }
            if *filled == *len {
                if let Some(request) = slot.take() {
                    request.complete(Ok(*len));
                    self.completions.notify_waiters();
                }
                self.at += 1;
            }
        }
    }

    /// Bytes received so far.
    fn received(&self) -> u64 {
        self.requests.iter().map(|r| r.3 as u64).sum()
    }

    /// Ends every request not completed yet: with `Ok(bytes)` when the object ends in it
    /// (the core zeroes the tail), else with `error`. The errno reaches the reader (the core
    /// records a failed read's errno, which is how `ESTALE` tells the reader to revalidate);
    /// the message goes to `last_error`.
    fn finish(
        self,
        end_of_object: u64,
        error: Option<io::Error>,
        last_error: &Mutex<Option<String>>,
    ) {
        if let Some(error) = &error {
            *lock(last_error) = Some(error.to_string());
        }
        for (slot, offset, len, filled) in self.requests {
            let Some(request) = slot else { continue };
            let complete =
                filled == len || offset + filled as u64 >= end_of_object && error.is_none();
            if complete {
                request.complete(Ok(filled));
            } else {
                let errno = error.as_ref().and_then(errno_in).unwrap_or(libc::EIO);
                request.complete(Err(io::Error::from_raw_os_error(errno)));
            }
        }
        self.completions.notify_waiters();
    }
}

impl Fetch {
    async fn run(self, requests: Vec<ReadRequest>) {
        let start = requests.first().map_or(0, ReadRequest::offset);
        let mut fill = Fill::new(requests, Arc::clone(&self.completions));
        let wanted: u64 = fill.requests.iter().map(|r| r.2 as u64).sum();
        // Past the end of the pinned version nothing is asked for: the core zeroes it.
        let end = (start + wanted).min(self.end);
        let error = if start < end {
            let permit = Arc::clone(&self.link.limit).acquire_owned().await;
            let outcome = tokio::time::timeout(
                self.link.options.deadline,
                self.get_into(start, end, &mut fill),
            )
            .await;
            drop(permit);
            match outcome {
                Ok(result) => result.err(),
                Err(_) => Some(errno_error(
                    libc::ETIMEDOUT,
                    format!(
                        "GET {} bytes {start}..{end}: not done within {:?}",
                        self.path, self.link.options.deadline
                    ),
                )),
            }
        } else {
            None
        };
        if let Some(error) = &error {
            self.counters.failed_gets.fetch_add(1, Ordering::Relaxed);
            if errno_in(error) == Some(libc::ESTALE) {
                self.counters.stale.fetch_add(1, Ordering::Relaxed);
            }
        }
        fill.finish(self.end, error, &self.counters.last_error);
    }

    /// GETs `start..end` into `fill`, fetching again from where a broken body stopped.
    async fn get_into(&self, start: u64, end: u64, fill: &mut Fill) -> io::Result<()> {
        let retries = self.link.options.body_retries;
        let mut tries = 0;
        loop {
            let from = start + fill.received();
            if from >= end {
                return Ok(());
            }
            if tries > 0 {
                self.counters.body_retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50 << tries.min(4))).await;
            }
            let outcome = self.get_once(from, end, fill).await;
            let short = start + fill.received() < end;
            match outcome {
                // Only a transfer that broke is fetched again: a changed or missing object,
                // or a refusal, will not get better.
                Err(error) if errno_in(&error) != Some(libc::EIO) || tries >= retries => {
                    return Err(error);
                }
                Ok(()) if short && tries >= retries => {
                    return Err(errno_error(
                        libc::EIO,
                        format!(
                            "GET {} bytes {from}..{end}: the body kept ending early",
                            self.path
                        ),
                    ));
                }
                _ => {}
            }
            tries += 1;
        }
    }

    async fn get_once(&self, from: u64, end: u64, fill: &mut Fill) -> io::Result<()> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        let what = || format!("GET {} bytes {from}..{end}", self.path);
        let options = GetOptions {
            range: Some(GetRange::Bounded(from..end)),
            if_match: self.version.e_tag.clone(),
            version: if self.version.e_tag.is_none() {
                self.version.version.clone()
            } else {
                None
            },
            ..GetOptions::default()
        };
        let got = self
            .link
            .store
            .get_opts(&self.path, options)
            .await
            .map_err(|error| errno_error(errno_of(&error), format!("{}: {error}", what())))?;
        // A store that ignored If-Match or the range must not slip another version in.
        if self.version.e_tag.is_some() && got.meta.e_tag != self.version.e_tag
            || got.meta.size != self.version.size
        {
            return Err(errno_error(
                libc::ESTALE,
                format!("{}: the object changed (ETag {:?})", what(), got.meta.e_tag),
            ));
        }
        if got.range != (from..end) {
            return Err(errno_error(
                libc::EIO,
                format!("{}: the store answered bytes {:?}", what(), got.range),
            ));
        }
        let mut body = match got.payload {
            GetResultPayload::Stream(stream) => stream,
            GetResultPayload::File(..) => {
                return Err(errno_error(libc::EIO, "a local file payload"));
            }
        };
        let mut left = end - from;
        while let Some(chunk) = body.next().await {
            let chunk: Bytes =
                chunk.map_err(|error| errno_error(libc::EIO, format!("{}: {error}", what())))?;
            let n = (chunk.len() as u64).min(left);
            // Counted before the bytes reach the folios: a reader that sees the last folio
            // filled (its flag's release, then the reader's acquire) sees every byte counted.
            self.counters
                .bytes_fetched
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            fill.take(&chunk[..n as usize]);
            left -= n;
            if left == 0 {
                break;
            }
        }
        Ok(())
    }
}
