//! [`CachedStore`]: an [`ObjectStore`] whose reads go through a foliocache cache.
//!
//! Wrap the store a program reads through, and its reads (whole objects, ranges, suffixes,
//! `get_ranges`) become reads of the cache's files, one per path, with readahead ahead of a
//! sequential reader and a second read served from memory. Everything else (puts, deletes,
//! lists, copies, conditional and versioned gets) goes to the wrapped store; a change made
//! through the wrapper drops the cache's file for its path.
//!
//! Freshness, like NFS's attribute cache: a path's file is looked at again (one HEAD) when a
//! `head` asks about it, and on the first read after [`CachedStore::with_revalidate_after`]
//! (3 s by default) has passed since it was last looked at. A read never mixes two
//! versions of an object (see [`crate::ObjectHandle`]).

use crate::backend::{ObjectOptions, ObjectStats, StoreLink, errno_in};
use crate::file::ObjectFile;
use crate::runtime;
use async_trait::async_trait;
use bytes::Bytes;
use foliocache::Cache;
use futures_util::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Bytes read per item of a get's stream.
const STREAM_CHUNK: u64 = 4 << 20;

/// An [`ObjectStore`] reading through a cache (see the module documentation).
pub struct CachedStore {
    inner: Arc<dyn ObjectStore>,
    cache: Cache,
    link: Arc<StoreLink>,
    revalidate_after: Duration,
    files: Files,
}

/// The files a store has open, by path, with when each was last looked at.
type Files = Arc<Mutex<HashMap<Path, (ObjectFile, Instant)>>>;

impl fmt::Debug for CachedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedStore")
            .field("inner", &self.inner.to_string())
            .finish_non_exhaustive()
    }
}

impl fmt::Display for CachedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CachedStore({})", self.inner)
    }
}

fn generic(error: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
    object_store::Error::Generic {
        store: "foliocache",
        source: Box::new(error),
    }
}

impl CachedStore {
    /// Wraps `inner`: its reads go through `cache` (a private cache) with `options`.
    pub fn new(inner: Arc<dyn ObjectStore>, cache: Cache, options: ObjectOptions) -> Self {
        Self {
            link: StoreLink::new(Arc::clone(&inner), options),
            inner,
            cache,
            revalidate_after: Duration::from_secs(3),
            files: Files::default(),
        }
    }

    /// How long a path's file is read without looking at the object again.
    #[must_use]
    pub fn with_revalidate_after(mut self, after: Duration) -> Self {
        self.revalidate_after = after;
        self
    }

    /// The counters of every file this store has open, summed.
    pub fn stats(&self) -> ObjectStats {
        let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        files
            .values()
            .fold(ObjectStats::default(), |sum, (file, _)| {
                sum + file.backend().stats()
            })
    }

    fn forget(&self, path: &Path) {
        forget(&self.files, path);
    }

    /// The cache's file for `path`: opened (one HEAD) if new, revalidated if not looked at
    /// for `revalidate_after`, or when `look` asks.
    async fn file(&self, path: &Path, look: bool) -> Result<ObjectFile> {
        let known = {
            let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
            files.get(path).cloned()
        };
        if let Some((file, seen)) = known {
            if look || seen.elapsed() >= self.revalidate_after {
                let again = file.clone();
                runtime::blocking(move || again.revalidate())
                    .await
                    .map_err(|error| cache_error(&self.files, path, error))?;
                self.files
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(path.clone(), (file.clone(), Instant::now()));
            }
            return Ok(file);
        }
        let link = Arc::clone(&self.link);
        let cache = self.cache.clone();
        let at = path.clone();
        let opened = runtime::blocking(move || crate::open_linked_at(&cache, link, at))
            .await
            .map_err(|error| match error {
                crate::Error::Head { source, .. } if errno_in(&source) == Some(libc::ENOENT) => {
                    object_store::Error::NotFound {
                        path: path.to_string(),
                        source: Box::new(source),
                    }
                }
                other => generic(other),
            })?;
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        // Another reader may have opened it meanwhile: keep one file per path.
        let (file, _) = files
            .entry(path.clone())
            .or_insert_with(|| (opened, Instant::now()));
        Ok(file.clone())
    }

    /// Whether a get must go to the wrapped store (conditions and versions are its to judge).
    fn passes_through(options: &GetOptions) -> bool {
        options.head
            || options.if_match.is_some()
            || options.if_none_match.is_some()
            || options.if_modified_since.is_some()
            || options.if_unmodified_since.is_some()
            || options.version.is_some()
    }
}

#[async_trait]
impl ObjectStore for CachedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let out = self.inner.put_opts(location, payload, opts).await;
        self.forget(location);
        out
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        // The object changes when the upload completes; the file is looked at again then
        // at the latest (`revalidate_after`), and now.
        self.forget(location);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if Self::passes_through(&options) {
            let head = options.head;
            let out = self.inner.get_opts(location, options).await;
            if head {
                // A program looking at an object is about to read it: the cache looks too.
                let known = self
                    .files
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .contains_key(location);
                if known {
                    self.file(location, true).await?;
                }
            }
            return out;
        }
        let file = self.file(location, false).await?;
        let size = file.size();
        let range = match &options.range {
            None => 0..size,
            Some(range) if size == 0 && matches!(range, GetRange::Suffix(_)) => 0..0,
            Some(range) => range.as_range(size).map_err(generic)?,
        };
        let meta = file.backend().meta();
        let files = Arc::clone(&self.files);
        let path = location.clone();
        let reading = file.clone();
        let body = stream::unfold(range.start, move |at| {
            let files = Arc::clone(&files);
            let file = reading.clone();
            let path = path.clone();
            let end = range.end;
            async move {
                if at >= end {
                    return None;
                }
                let to = end.min(at + STREAM_CHUNK);
                let out = read(&files, &path, &file, at..to).await;
                let next = match &out {
                    Ok(bytes) if !bytes.is_empty() => at + bytes.len() as u64,
                    _ => end, // an error or the end: the stream ends after this item
                };
                Some((out, next))
            }
        })
        .boxed();
        Ok(GetResult {
            payload: GetResultPayload::Stream(body),
            meta,
            range: range.clone(),
            attributes: object_store::Attributes::default(),
            extensions: object_store::Extensions::default(),
        })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let file = self.file(location, false).await?;
        let size = file.size();
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            let range = GetRange::Bounded(range.clone())
                .as_range(size)
                .map_err(generic)?;
            out.push(read(&self.files, location, &file, range).await?);
        }
        Ok(out)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        // Forget every path asked about before the wrapped store deletes it.
        let files = Arc::clone(&self.files);
        let forgetting = locations
            .map(move |location| {
                if let Ok(path) = &location {
                    files
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(path);
                }
                location
            })
            .boxed();
        self.inner.delete_stream(forgetting)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let out = self.inner.copy_opts(from, to, options).await;
        self.forget(to);
        out
    }
}

fn forget(files: &Files, path: &Path) {
    files
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(path);
}

/// A cache error as the store's: a vanished object is `NotFound` (and its file forgotten).
fn cache_error(files: &Files, path: &Path, error: foliocache::Error) -> object_store::Error {
    if let foliocache::Error::Io { source, .. } = &error
        && source.raw_os_error() == Some(libc::ENOENT)
    {
        forget(files, path);
        return object_store::Error::NotFound {
            path: path.to_string(),
            source: Box::new(error),
        };
    }
    generic(error)
}

/// Reads `range` of `file` through a handle of its own.
async fn read(files: &Files, path: &Path, file: &ObjectFile, range: Range<u64>) -> Result<Bytes> {
    let len = usize::try_from(range.end - range.start).map_err(generic)?;
    let mut buf = vec![0u8; len];
    let mut handle = file.handle();
    let mut done = 0;
    while done < len {
        let n = handle
            .read_at_async(&mut buf[done..], range.start + done as u64)
            .await
            .map_err(|error| cache_error(files, path, error))?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(Bytes::from(buf))
}
