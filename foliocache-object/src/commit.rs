//! Writes to an object: [`ObjectBackend`] as a [`WriteBackend`].
//!
//! A written object file holds its writes as dirty folios, as a file from a disk does. An
//! object changes only as a whole, so every writeback pass of it (a sync, the flusher, the
//! last holder letting go) is one **commit**: the new version is built from the dirty bytes,
//! the clean bytes the cache holds, and the old version's bytes for the rest (GETs pinned to
//! it, as reads are), and uploaded:
//!
//! * up to [`ObjectOptions::single_put_bytes`](crate::ObjectOptions::single_put_bytes) (64 MiB) as **one conditional PUT**: `If-Match`
//!   with the ETag the file's pages were read at (`PutMode::Update`), or `If-None-Match: *`
//!   for an object the file created (`PutMode::Create`). The store checks and replaces in one
//!   step, so another writer's version is never overwritten;
//! * larger, as a **multipart upload** in parts of [`ObjectOptions::part_bytes`](crate::ObjectOptions::part_bytes) (8 MiB, at
//!   least the S3 minimum of 5 MiB), [`ObjectOptions::parts_in_flight`](crate::ObjectOptions::parts_in_flight) at once. S3's
//!   completion takes no `If-Match` in `object_store`, so the check is a HEAD just before the
//!   completion: another writer's version that lands between that HEAD and the completion
//!   (the time of one request) is overwritten. That window is the documented limit.
//!
//! A commit that fails (the store unreachable past the deadline, a refusal, a conflict) leaves
//! the object as it was; the core keeps the folios dirty (`KeepDirty`) and records the errno
//! (`ESTALE` for a conflict), which the next sync reports; the next commit tries again. A
//! conflict does not go away by retrying: once one is seen, commits fail at once until
//! [`ObjectFile::discard_changes`](crate::ObjectFile::discard_changes) drops the changes and
//! takes the new version.
//!
//! The upload is the object's whole size: `object_store` has no server-side part copy, so a
//! small change to a large object uploads all of it, and downloads what the cache does not
//! hold of it (`docs/OBJECT.md`, "Writes").

use crate::backend::{ObjectBackend, Version, errno_error, errno_in, errno_of, lock};
use crate::runtime;
use bytes::Bytes;
use foliocache::{Changes, WriteBackend};
use object_store::{
    GetOptions, GetRange, MultipartUpload, ObjectMeta, ObjectStore, PutMode, PutOptions,
    PutPayload, UpdateVersion,
};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The message of a commit refused because the object changed.
fn conflict(path: &object_store::path::Path, what: &str) -> io::Error {
    errno_error(
        libc::ESTALE,
        format!(
            "{what} {path}: the object changed since this cache read it (another writer); \
             the changes stay dirty: ObjectFile::discard_changes drops them and reads the \
             new version"
        ),
    )
}

impl WriteBackend for ObjectBackend {
    fn read_sync(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        // Twice at most: this file's own commit may pin a new version while the GET asks for
        // the old one (a refusal then is not another writer's change).
        for attempt in 0..2 {
            let pinned = lock(&self.pinned).clone();
            let end = (offset + buf.len() as u64).min(foliocache::Backend::size(self));
            let n = end.saturating_sub(offset) as usize;
            if n > 0 {
                match self.get_old(&pinned, offset, end) {
                    Ok(bytes) => buf[..n].copy_from_slice(&bytes),
                    Err(error)
                        if attempt == 0
                            && errno_in(&error) == Some(libc::ESTALE)
                            && !lock(&self.pinned).same_as(&pinned) =>
                    {
                        continue;
                    }
                    Err(error) => return Err(error),
                }
            }
            buf[n..].fill(0);
            return Ok(());
        }
        Err(io::Error::from_raw_os_error(libc::ESTALE))
    }

    fn set_size(&self, size: u64) {
        self.limit.fetch_min(size, Ordering::AcqRel);
        self.resized.store(true, Ordering::Release);
    }

    fn resized(&self) -> bool {
        self.resized.load(Ordering::Acquire)
    }

    fn discard(&self) {
        self.forget_changes();
    }

    fn commit(&self, changes: &Changes<'_>) -> io::Result<()> {
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        let outcome = if self.conflicted.load(Ordering::Acquire) {
            Err(conflict(&self.path, "commit"))
        } else {
            self.upload(changes)
        };
        match outcome {
            Ok(version) => {
                self.pin_committed(version);
                Ok(())
            }
            Err(error) => {
                self.counters.failed_commits.fetch_add(1, Ordering::Relaxed);
                let errno = errno_in(&error).unwrap_or(libc::EIO);
                if errno == libc::ESTALE {
                    self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                    self.conflicted.store(true, Ordering::Release);
                }
                *lock(&self.counters.last_error) = Some(error.to_string());
                // The core keeps the errno only; the message is in `last_error`.
                Err(io::Error::from_raw_os_error(errno))
            }
        }
    }
}

impl ObjectBackend {
    /// Bytes `start..end` of the pinned version, in one GET (blocking).
    fn get_old(&self, pinned: &Version, start: u64, end: u64) -> io::Result<Bytes> {
        let link = Arc::clone(&self.link);
        let path = self.path.clone();
        let version = pinned.clone();
        let counters = Arc::clone(&self.counters);
        runtime::wait(async move {
            let _permit = Arc::clone(&link.limit).acquire_owned().await;
            counters.gets.fetch_add(1, Ordering::Relaxed);
            let what = format!("GET {path} bytes {start}..{end} (for a commit)");
            let options = GetOptions {
                range: Some(GetRange::Bounded(start..end)),
                if_match: version.e_tag.clone(),
                ..GetOptions::default()
            };
            let fetch = async {
                let got = match link.store.get_opts(&path, options).await {
                    Err(object_store::Error::Precondition { .. }) => {
                        return Err(conflict(&path, "GET"));
                    }
                    other => other.map_err(|error| {
                        errno_error(errno_of(&error), format!("{what}: {error}"))
                    })?,
                };
                if version.e_tag.is_some() && got.meta.e_tag != version.e_tag
                    || got.meta.size != version.size
                {
                    return Err(conflict(&path, "GET"));
                }
                if got.range != (start..end) {
                    return Err(errno_error(
                        libc::EIO,
                        format!("{what}: the store answered bytes {:?}", got.range),
                    ));
                }
                let bytes = got
                    .bytes()
                    .await
                    .map_err(|error| errno_error(libc::EIO, format!("{what}: {error}")))?;
                if bytes.len() as u64 != end - start {
                    return Err(errno_error(libc::EIO, format!("{what}: a short body")));
                }
                Ok(bytes)
            };
            let result = tokio::time::timeout(link.options.deadline, fetch)
                .await
                .unwrap_or_else(|_| {
                    Err(errno_error(
                        libc::ETIMEDOUT,
                        format!("{what}: not done in time"),
                    ))
                });
            if let Ok(bytes) = &result {
                counters
                    .bytes_fetched
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            } else {
                counters.failed_gets.fetch_add(1, Ordering::Relaxed);
            }
            result
        })
    }

    /// The new version's bytes `start..end`: the dirty bytes, then the clean ones the cache
    /// holds, then the pinned version's (one GET spanning what is left below `limit`), zeros
    /// past `limit` (where the file was cut).
    fn part(
        &self,
        changes: &Changes<'_>,
        (start, end): (u64, u64),
        limit: u64,
        pinned: &Version,
    ) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; (end - start) as usize];
        let mut covered: Vec<(u64, u64)> = Vec::new();
        for pieces in [changes.dirty(), changes.clean()] {
            let first =
                pieces.partition_point(|(offset, bytes)| offset + bytes.len() as u64 <= start);
            for &(offset, bytes) in &pieces[first..] {
                if offset >= end {
                    break;
                }
                let (a, b) = (offset.max(start), (offset + bytes.len() as u64).min(end));
                out[(a - start) as usize..(b - start) as usize]
                    .copy_from_slice(&bytes[(a - offset) as usize..(b - offset) as usize]);
                covered.push((a, b));
            }
        }
        covered.sort_unstable();
        // What is left below `limit`: storage's bytes.
        let mut gaps: Vec<(u64, u64)> = Vec::new();
        let mut at = start;
        let top = end.min(limit);
        for (a, b) in covered {
            if a > at && at < top {
                gaps.push((at, a.min(top)));
            }
            at = at.max(b);
        }
        if at < top {
            gaps.push((at, top));
        }
        if let (Some(&(from, _)), Some(&(_, to))) = (gaps.first(), gaps.last()) {
            let old = self.get_old(pinned, from, to)?;
            for (a, b) in gaps {
                out[(a - start) as usize..(b - start) as usize]
                    .copy_from_slice(&old[(a - from) as usize..(b - from) as usize]);
            }
        }
        Ok(out)
    }

    /// Uploads the version `changes` describes (see the module documentation); returns it.
    fn upload(&self, changes: &Changes<'_>) -> io::Result<Version> {
        let size = changes.size();
        let limit = foliocache::Backend::size(self);
        let pinned = lock(&self.pinned).clone();
        let options = &self.link.options;
        let result = if size <= options.single_put_bytes {
            let body = self.part(changes, (0, size), limit, &pinned)?;
            self.put_whole(&pinned, body)?
        } else {
            self.put_parts(changes, limit, &pinned)?
        };
        self.counters
            .bytes_uploaded
            .fetch_add(size, Ordering::Relaxed);
        let meta = ObjectMeta {
            location: self.path.clone(),
            last_modified: chrono::Utc::now(),
            size,
            e_tag: result.e_tag,
            version: result.version,
        };
        if meta.e_tag.is_none() && meta.version.is_none() {
            // A store that does not say what it made: its HEAD does (another writer's version
            // landing in between would be taken for ours: such a store cannot tell).
            let link = Arc::clone(&self.link);
            let path = self.path.clone();
            let counters = Arc::clone(&self.counters);
            return runtime::wait(
                async move { crate::backend::head(&link, &path, &counters).await },
            );
        }
        Ok(Version::of(meta))
    }

    /// One conditional PUT of the whole object.
    fn put_whole(&self, pinned: &Version, body: Vec<u8>) -> io::Result<object_store::PutResult> {
        let mode = if pinned.exists {
            PutMode::Update(UpdateVersion {
                e_tag: pinned.e_tag.clone(),
                version: pinned.version.clone(),
            })
        } else {
            PutMode::Create
        };
        let link = Arc::clone(&self.link);
        let path = self.path.clone();
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        let len = body.len();
        runtime::wait(async move {
            let put = link
                .store
                .put_opts(&path, PutPayload::from(body), PutOptions::from(mode));
            match tokio::time::timeout(link.options.deadline, put).await {
                Err(_) => Err(errno_error(
                    libc::ETIMEDOUT,
                    format!("PUT {path} ({len} bytes): not done in time"),
                )),
                Ok(Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::AlreadyExists { .. },
                )) => Err(conflict(&path, "PUT")),
                Ok(Err(error)) => Err(errno_error(
                    errno_of(&error),
                    format!("PUT {path} ({len} bytes): {error}"),
                )),
                Ok(Ok(result)) => Ok(result),
            }
        })
    }

    /// A multipart upload, checked by a HEAD before its completion.
    fn put_parts(
        &self,
        changes: &Changes<'_>,
        limit: u64,
        pinned: &Version,
    ) -> io::Result<object_store::PutResult> {
        let options = self.link.options.clone();
        let size = changes.size();
        let link = Arc::clone(&self.link);
        let path = self.path.clone();
        let deadline = options.deadline;
        let timed =
            move |what: String| errno_error(libc::ETIMEDOUT, format!("{what}: not done in time"));
        // The check first as well: a conflict found now costs no upload of the whole object.
        self.check_unchanged(pinned)?;
        let start = {
            let (link, path) = (Arc::clone(&link), path.clone());
            runtime::wait(async move {
                let begin = link
                    .store
                    .put_multipart_opts(&path, object_store::PutMultipartOptions::default());
                match tokio::time::timeout(deadline, begin).await {
                    Err(_) => Err(timed(format!("starting the multipart upload of {path}"))),
                    Ok(result) => result.map_err(|error| {
                        errno_error(
                            errno_of(&error),
                            format!("multipart upload of {path}: {error}"),
                        )
                    }),
                }
            })
        };
        let mut upload: Box<dyn MultipartUpload> = start?;
        let outcome = (|| -> io::Result<()> {
            let part_bytes = options.part_bytes.max(5 << 20);
            let mut in_flight: VecDeque<tokio::task::JoinHandle<io::Result<()>>> = VecDeque::new();
            let wait_one = |handle: tokio::task::JoinHandle<io::Result<()>>| -> io::Result<()> {
                runtime::wait(async move {
                    handle
                        .await
                        .unwrap_or_else(|_| Err(errno_error(libc::EIO, "a part's task ended")))
                })
            };
            // On an error the parts still in flight are waited for, so that the abort which
            // follows does not race them (a part landing after it would stay on the store).
            let settle = |in_flight: &mut VecDeque<tokio::task::JoinHandle<io::Result<()>>>| {
                for handle in in_flight.drain(..) {
                    let _ = wait_one(handle);
                }
            };
            let mut at = 0;
            while at < size {
                let end = (at + part_bytes).min(size);
                let body = match self.part(changes, (at, end), limit, pinned) {
                    Ok(body) => body,
                    Err(error) => {
                        settle(&mut in_flight);
                        return Err(error);
                    }
                };
                let put = upload.put_part(PutPayload::from(body));
                self.counters.parts.fetch_add(1, Ordering::Relaxed);
                let what = format!("part {at}..{end} of {path}");
                in_flight.push_back(runtime::handle().spawn(async move {
                    match tokio::time::timeout(deadline, put).await {
                        Err(_) => Err(timed(what)),
                        Ok(Err(error)) => {
                            Err(errno_error(errno_of(&error), format!("{what}: {error}")))
                        }
                        Ok(Ok(())) => Ok(()),
                    }
                }));
                if in_flight.len() >= options.parts_in_flight.max(1)
                    && let Some(oldest) = in_flight.pop_front()
                    && let Err(error) = wait_one(oldest)
                {
                    settle(&mut in_flight);
                    return Err(error);
                }
                at = end;
            }
            while let Some(handle) = in_flight.pop_front() {
                if let Err(error) = wait_one(handle) {
                    settle(&mut in_flight);
                    return Err(error);
                }
            }
            // The check before the completion (see the module documentation).
            self.check_unchanged(pinned)
        })();
        let path = self.path.clone();
        let (upload, result) = runtime::wait(async move {
            let result = match outcome {
                Ok(()) => match tokio::time::timeout(deadline, upload.complete()).await {
                    Err(_) => Err(timed(format!("completing the upload of {path}"))),
                    Ok(Err(error)) => Err(errno_error(
                        errno_of(&error),
                        format!("completing the upload of {path}: {error}"),
                    )),
                    Ok(Ok(result)) => Ok(result),
                },
                Err(error) => Err(error),
            };
            if result.is_err() {
                // Parts of an upload never completed cost storage until aborted.
                let _ = tokio::time::timeout(deadline, upload.abort()).await;
            }
            (upload, result)
        });
        drop(upload);
        result
    }

    /// One HEAD: `Ok` if the store's object is still `pinned` (or, for an object this file is
    /// to create, still missing), the conflict error if another writer changed it.
    fn check_unchanged(&self, pinned: &Version) -> io::Result<()> {
        let counters = Arc::clone(&self.counters);
        let (link, path) = (Arc::clone(&self.link), self.path.clone());
        let now = runtime::wait(async move { crate::backend::head(&link, &path, &counters).await });
        let unchanged = match now {
            Ok(now) => pinned.exists && now.e_tag == pinned.e_tag && now.size == pinned.size,
            Err(error) if errno_in(&error) == Some(libc::ENOENT) => !pinned.exists,
            Err(error) => return Err(error),
        };
        if unchanged {
            Ok(())
        } else {
            Err(conflict(&self.path, "multipart upload"))
        }
    }

    /// Takes the version this backend's own commit made: pinned, and the stamp the cache
    /// compares with next. The pages stay: the clean ones hold the new version's bytes too
    /// (it was built from them), so the generation does not move.
    fn pin_committed(&self, version: Version) {
        let mut pinned = lock(&self.pinned);
        self.size.store(version.size, Ordering::Release);
        self.limit.store(u64::MAX, Ordering::Release);
        self.resized.store(false, Ordering::Release);
        *lock(&self.last_head) = version.clone();
        *pinned = version;
        // The core asks for the stamp right after the commit: the one just made, no HEAD.
        self.fresh.store(true, Ordering::Release);
    }
}
