//! Writes to objects on `object_store`'s in-memory store (no server): random writes, size
//! changes and syncs against a plain byte vector as the model, through one conditional PUT
//! and through multipart uploads; a conflict with another writer; a failed upload that keeps
//! the data dirty until a later sync; objects created by the cache; the last close.

mod common;

use async_trait::async_trait;
use foliocache_object::{ObjectCache, ObjectFile, ObjectOptions};
use futures_util::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// A small deterministic generator (xorshift), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn cache() -> foliocache::Cache {
    common::cache(128 << 20)
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    common::pattern(u64::from(seed), len)
}

fn stored(store: &Arc<dyn ObjectStore>, path: &Path) -> Vec<u8> {
    common::stored(store, path.as_ref())
}

fn put(store: &Arc<dyn ObjectStore>, path: &Path, data: Vec<u8>) {
    common::put(store, path.as_ref(), data);
}

fn writable(options: ObjectOptions) -> ObjectOptions {
    ObjectOptions {
        write: true,
        ..options
    }
}

/// Everything the file reads, through its own pages.
fn read_all(file: &ObjectFile) -> Vec<u8> {
    let mut out = vec![0u8; file.size() as usize];
    let mut handle = file.handle();
    let mut at = 0;
    while at < out.len() {
        let n = handle.read_at(&mut out[at..], at as u64).unwrap();
        assert!(n > 0, "a short read at {at} of {}", out.len());
        at += n;
    }
    out
}

fn errno(error: &foliocache::Error) -> Option<i32> {
    match error {
        foliocache::Error::Writeback { source } | foliocache::Error::Io { source, .. } => {
            source.raw_os_error()
        }
        _ => None,
    }
}

/// Random writes (inside pages, across pages and folios, past the end), truncations and
/// extensions, reads between them, and syncs; after each sync the store's object equals the
/// model, byte for byte, and so does every read before it.
fn random_changes(options: ObjectOptions, initial: usize, seed: u64) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let path = Path::from("w/random.bin");
    let mut model = bytes(7, initial);
    put(&store, &path, model.clone());
    let cache = cache();
    let file = cache
        .open_object_in(Arc::clone(&store), &path, &writable(options))
        .unwrap();
    let mut rng = Rng(seed);
    for round in 0..6 {
        for _ in 0..12 {
            match rng.below(10) {
                0 => {
                    // A size change, mostly shrinking a little or growing a little.
                    let len = model.len() as u64;
                    let new = if rng.below(2) == 0 {
                        len.saturating_sub(rng.below(70_000))
                    } else {
                        len + rng.below(70_000)
                    };
                    file.set_len(new).unwrap();
                    model.resize(new as usize, 0);
                }
                1 | 2 => {
                    // A read somewhere (fills the cache with clean pages).
                    let pos = rng.below(model.len() as u64 + 1);
                    let len = rng.below(300_000) as usize;
                    let mut buf = vec![0u8; len];
                    let n = file.handle().read_at(&mut buf, pos).unwrap();
                    let want = &model[(pos as usize).min(model.len())..];
                    assert_eq!(&buf[..n], &want[..n.min(want.len())], "round {round}");
                    assert_eq!(n, len.min(want.len()));
                }
                _ => {
                    let pos = rng.below(model.len() as u64 + 20_000);
                    let big = rng.below(4) == 0;
                    let len = 1 + rng.below(if big { 3 << 20 } else { 9000 });
                    let data = bytes(rng.next() as u8, len as usize);
                    file.write_at(&data, pos).unwrap();
                    let end = pos as usize + data.len();
                    if end > model.len() {
                        model.resize(end, 0);
                    }
                    model[pos as usize..end].copy_from_slice(&data);
                }
            }
        }
        assert_eq!(
            read_all(&file),
            model,
            "round {round}: the file before its sync"
        );
        file.sync().unwrap();
        assert!(!file.holds_changes());
        assert_eq!(
            stored(&store, &path),
            model,
            "round {round}: the store after sync"
        );
    }
    let stats = file.backend().stats();
    // One per sync: a truncation commits nothing (it keeps a dirty end folio, zeroed past
    // the new end).
    assert_eq!(stats.commits, 6, "{stats:?}");
    assert_eq!(stats.failed_commits, 0);
    // A second client without the cache reads the same.
    let other = cache
        .open_object_in(Arc::clone(&store), &path, &ObjectOptions::default())
        .unwrap();
    assert_eq!(read_all(&other), model);
}

#[test]
fn random_changes_reach_the_store_in_one_put() {
    random_changes(
        ObjectOptions::default(),
        (9 << 20) + 4321,
        0x9e37_79b9_7f4a_7c15,
    );
}

#[test]
fn random_changes_reach_the_store_in_parts() {
    let options = ObjectOptions {
        single_put_bytes: 1 << 20,
        part_bytes: 5 << 20,
        parts_in_flight: 2,
        ..ObjectOptions::default()
    };
    random_changes(options, (17 << 20) + 99, 0x2545_f491_4f6c_dd1d);
}

/// A small change to a large object the cache holds: the upload is the whole object, and
/// nothing is fetched for it. The same change with nothing cached fetches the rest once.
#[test]
fn a_small_change_uploads_the_whole_object() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let path = Path::from("w/big.bin");
    let mut model = bytes(3, 24 << 20);
    put(&store, &path, model.clone());
    let cache = cache();
    let options = writable(ObjectOptions {
        single_put_bytes: 4 << 20,
        ..ObjectOptions::default()
    });
    let file = cache
        .open_object_in(Arc::clone(&store), &path, &options)
        .unwrap();
    assert_eq!(read_all(&file), model);
    let before = file.backend().stats();
    file.write_at(b"changed", 5 << 20).unwrap();
    model[5 << 20..(5 << 20) + 7].copy_from_slice(b"changed");
    file.sync().unwrap();
    let after = file.backend().stats();
    assert_eq!(after.bytes_fetched - before.bytes_fetched, 0);
    assert_eq!(
        after.bytes_uploaded - before.bytes_uploaded,
        model.len() as u64
    );
    assert_eq!(after.parts - before.parts, 3);
    assert_eq!(stored(&store, &path), model);

    // Nothing cached: the rest is fetched from the store for the upload.
    let cold = foliocache::Cache::builder()
        .capacity(64 << 20)
        .build()
        .unwrap();
    let file = cold
        .open_object_in(Arc::clone(&store), &path, &options)
        .unwrap();
    let before = file.backend().stats();
    file.write_at(b"again", 100).unwrap();
    model[100..105].copy_from_slice(b"again");
    file.sync().unwrap();
    let after = file.backend().stats();
    let fetched = after.bytes_fetched - before.bytes_fetched;
    // The page the write covered in part, then the upload's gaps.
    assert!(
        fetched >= model.len() as u64 - 4096 && fetched <= model.len() as u64 + 4096,
        "fetched {fetched} for a {} byte object",
        model.len()
    );
    assert_eq!(stored(&store, &path), model);
}

/// Another writer changes the object under a file holding changes: the sync fails with
/// `ESTALE`, the store keeps the other writer's version, the file keeps its changes (and
/// reads them), every later sync fails the same way, and `discard_changes` takes the new
/// version. Both upload paths, with the object wholly cached (nothing to fetch: the PUT's
/// `If-Match`, or the check before a multipart completion, is what refuses) and not cached
/// (the GETs for the upload, pinned to the old version, refuse first).
#[test]
fn a_sync_never_overwrites_another_writers_version() {
    for (single_put_bytes, cached) in [(64 << 20, true), (0, true), (64 << 20, false), (0, false)] {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("w/conflict.bin");
        put(&store, &path, bytes(1, 6 << 20));
        let cache = cache();
        let options = writable(ObjectOptions {
            single_put_bytes,
            ..ObjectOptions::default()
        });
        let file = cache
            .open_object_in(Arc::clone(&store), &path, &options)
            .unwrap();
        if cached {
            read_all(&file);
        }
        file.write_at(b"mine", 10).unwrap();
        let theirs = bytes(2, 3 << 20);
        put(&store, &path, theirs.clone());
        let mut uploads = None;
        for _ in 0..2 {
            let error = file.sync().unwrap_err();
            assert_eq!(errno(&error), Some(libc::ESTALE), "{error}");
            assert_eq!(stored(&store, &path), theirs);
            let mut buf = [0u8; 4];
            file.handle().read_at(&mut buf, 10).unwrap();
            assert_eq!(&buf, b"mine");
            assert!(file.holds_changes());
            // After the first conflict, a commit fails at once: nothing more is sent.
            let stats = file.backend().stats();
            let sent = (stats.puts, stats.parts, stats.gets);
            assert!(uploads.is_none_or(|before| before == sent), "{stats:?}");
            uploads = Some(sent);
        }
        let message = file.backend().last_error().unwrap();
        assert!(
            message.contains("changed since this cache read it"),
            "{message}"
        );
        assert_eq!(file.backend().stats().conflicts, 2);
        // Revalidation does not take the new version either while changes are held, through
        // the object file or the core's file.
        let error = file.revalidate().unwrap_err();
        assert_eq!(errno(&error), Some(libc::ESTALE));
        let error = file.file().revalidate().unwrap_err();
        assert_eq!(errno(&error), Some(libc::ESTALE));
        assert!(file.discard_changes().unwrap() > 0);
        assert!(!file.holds_changes());
        assert_eq!(read_all(&file), theirs);
        // And from there on writes commit over their version.
        file.write_at(b"after", 0).unwrap();
        file.sync().unwrap();
        let mut want = theirs.clone();
        want[..5].copy_from_slice(b"after");
        assert_eq!(stored(&store, &path), want);
    }
}

/// The in-memory store with faults: uploads fail while `failing` is above zero (each failed
/// upload counts one down), and a `careless` one ignores the conditions of GETs and PUTs.
#[derive(Debug, Default)]
struct Flaky {
    inner: InMemory,
    failing: AtomicU32,
    careless: bool,
}

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flaky({})", self.inner)
    }
}

impl Flaky {
    fn fail(&self) -> object_store::Result<()> {
        let failing = self
            .failing
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        match failing {
            Ok(_) => Err(object_store::Error::Generic {
                store: "Flaky",
                source: "injected upload failure".into(),
            }),
            Err(_) => Ok(()),
        }
    }
}

#[async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.fail()?;
        let opts = if self.careless {
            PutOptions::default()
        } else {
            opts
        };
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.fail()?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let options = if self.careless {
            GetOptions {
                if_match: None,
                ..options
            }
        } else {
            options
        };
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A failed upload leaves the object as it was and the data dirty; the sync reports it once,
/// and the next sync uploads.
#[test]
fn a_failed_upload_keeps_the_data_dirty_for_the_next_sync() {
    let flaky = Arc::new(Flaky::default());
    let store: Arc<dyn ObjectStore> = Arc::clone(&flaky) as Arc<dyn ObjectStore>;
    let path = Path::from("w/flaky.bin");
    let original = bytes(5, 300_000);
    put(&store, &path, original.clone());
    let cache = cache();
    let file = cache
        .open_object_in(
            Arc::clone(&store),
            &path,
            &writable(ObjectOptions::default()),
        )
        .unwrap();
    file.write_at(b"kept", 4090).unwrap();
    flaky.failing.store(2, Ordering::Release);
    for _ in 0..2 {
        let error = file.sync().unwrap_err();
        assert_eq!(errno(&error), Some(libc::EIO), "{error}");
        assert_eq!(stored(&store, &path), original);
        assert!(file.holds_changes());
    }
    assert!(
        file.backend()
            .last_error()
            .unwrap()
            .contains("injected upload failure")
    );
    file.sync().unwrap();
    let mut want = original;
    want[4090..4094].copy_from_slice(b"kept");
    assert_eq!(stored(&store, &path), want);
    assert_eq!(file.backend().stats().failed_commits, 2);
}

/// `create`: a missing object opens empty and the first sync creates it; if another writer
/// created it first, the sync is a conflict. The last close commits what is dirty. A file
/// opened without `write` refuses writes.
#[test]
fn created_objects_and_the_last_close() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let cache = cache();
    let create = ObjectOptions {
        create: true,
        ..ObjectOptions::default()
    };
    let path = Path::from("w/new.bin");
    let file = cache
        .open_object_in(Arc::clone(&store), &path, &create)
        .unwrap();
    assert_eq!(file.size(), 0);
    assert!(file.revalidate().is_ok());
    let data = bytes(9, 70_001);
    file.write_at(&data, 0).unwrap();
    file.sync().unwrap();
    assert_eq!(stored(&store, &path), data);

    let raced = Path::from("w/raced.bin");
    let file = cache
        .open_object_in(Arc::clone(&store), &raced, &create)
        .unwrap();
    file.write_at(b"late", 0).unwrap();
    put(&store, &raced, b"first".to_vec());
    let error = file.sync().unwrap_err();
    assert_eq!(errno(&error), Some(libc::ESTALE), "{error}");
    assert_eq!(stored(&store, &raced), b"first");

    let closed = Path::from("w/closed.bin");
    let file = cache
        .open_object_in(Arc::clone(&store), &closed, &create)
        .unwrap();
    file.write_at(b"at the last close", 3).unwrap();
    drop(file);
    assert_eq!(stored(&store, &closed), b"\0\0\0at the last close");

    let read_only = cache
        .open_object_in(Arc::clone(&store), &closed, &ObjectOptions::default())
        .unwrap();
    assert!(matches!(
        read_only.write_at(b"x", 0),
        Err(foliocache::Error::ReadOnly)
    ));
    assert!(matches!(
        read_only.file().punch_hole(0, 1),
        Err(foliocache::Error::ReadOnly)
    ));
    let written = cache
        .open_object_in(
            Arc::clone(&store),
            &closed,
            &writable(ObjectOptions::default()),
        )
        .unwrap();
    assert!(matches!(
        written.file().punch_hole(0, 1),
        Err(foliocache::Error::NotOffered { .. })
    ));
    let missing = cache.open_object_in(
        Arc::clone(&store),
        &Path::from("w/missing.bin"),
        &writable(ObjectOptions::default()),
    );
    assert!(missing.is_err(), "write without create needs the object");
}

/// The negative control of the conflict test: a store that ignores the conditions (`If-Match`
/// on GETs, `PutMode::Update` on PUTs) lets the same sync overwrite the other writer's
/// version, so the conflict test's assertions do catch an unconditional upload.
#[test]
fn negative_control_a_store_without_conditions_lets_the_sync_overwrite() {
    let store: Arc<dyn ObjectStore> = Arc::new(Flaky {
        careless: true,
        ..Flaky::default()
    });
    let path = Path::from("w/careless.bin");
    put(&store, &path, bytes(1, 1 << 20));
    let cache = cache();
    let file = cache
        .open_object_in(
            Arc::clone(&store),
            &path,
            &writable(ObjectOptions::default()),
        )
        .unwrap();
    read_all(&file);
    file.write_at(b"mine", 10).unwrap();
    let theirs = bytes(2, 3000);
    put(&store, &path, theirs.clone());
    // What the conflict test refuses happens here: the sync succeeds over their version.
    file.sync().unwrap();
    assert_ne!(stored(&store, &path), theirs);
}

/// Appends racing syncs: each commit takes the size with the folios it uploads, so after the
/// clean pages are dropped (only storage has their bytes then) the object still holds every
/// append. A commit that saw an appended folio but not its size lost the append this way.
#[test]
fn appends_racing_syncs_all_reach_the_store() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let path = Path::from("w/appends.bin");
    let cache = cache();
    let create = ObjectOptions {
        create: true,
        ..ObjectOptions::default()
    };
    let file = cache
        .open_object_in(Arc::clone(&store), &path, &create)
        .unwrap();
    let rounds = 6000;
    let piece = 700;
    let model: Vec<u8> = bytes(11, rounds * piece);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Each commit, then its clean pages dropped: a folio a commit cut short and left
            // clean is gone from the cache, and the store must have all of it.
            while !done.load(Ordering::Acquire) {
                file.sync().unwrap();
                file.file().drop_cached(0, 0);
            }
        });
        for k in 0..rounds {
            let at = k * piece;
            file.write_at(&model[at..at + piece], at as u64).unwrap();
        }
        done.store(true, Ordering::Release);
    });
    file.sync().unwrap();
    file.file().drop_cached(0, 0);
    file.sync().unwrap();
    assert_eq!(file.size(), model.len() as u64);
    assert!(
        stored(&store, &path) == model,
        "an append is missing from the store"
    );
    assert!(read_all(&file) == model);
}

/// A truncation discarded with the rest of the changes leaves the object as it was (the
/// discard must not commit the size it drops).
#[test]
fn discarding_a_truncation_leaves_the_object_alone() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let path = Path::from("w/cut.bin");
    let data = bytes(4, 200_000);
    put(&store, &path, data.clone());
    let cache = cache();
    let file = cache
        .open_object_in(
            Arc::clone(&store),
            &path,
            &writable(ObjectOptions::default()),
        )
        .unwrap();
    file.set_len(1000).unwrap();
    let mut buf = vec![0u8; 10];
    assert_eq!(file.handle().read_at(&mut buf, 999).unwrap(), 1);
    assert!(file.holds_changes());
    file.discard_changes().unwrap();
    assert!(!file.holds_changes());
    assert_eq!(file.backend().stats().commits, 0);
    assert_eq!(stored(&store, &path), data);
    assert_eq!(read_all(&file), data);
    file.sync().unwrap();
    assert_eq!(file.backend().stats().commits, 0);
}

/// Under `WritebackErrorPolicy::Discard` a failed commit drops the new bytes (as the kernel
/// drops pages whose writeback failed): they are not left clean, where the next commit would
/// take them for storage's and upload them after all.
#[test]
fn a_failed_commit_under_the_discard_policy_drops_the_data() {
    let flaky = Arc::new(Flaky::default());
    let store: Arc<dyn ObjectStore> = Arc::clone(&flaky) as Arc<dyn ObjectStore>;
    let path = Path::from("w/discard.bin");
    let original = bytes(6, 100_000);
    put(&store, &path, original.clone());
    let policy = foliocache::Policy {
        writeback_error: foliocache::WritebackErrorPolicy::Discard,
        ..foliocache::Policy::default()
    };
    let cache = foliocache::Cache::builder()
        .capacity(64 << 20)
        .policy(policy)
        .build()
        .unwrap();
    let file = cache
        .open_object_in(
            Arc::clone(&store),
            &path,
            &writable(ObjectOptions::default()),
        )
        .unwrap();
    file.write_at(b"lost", 50_000).unwrap();
    flaky.failing.store(1, Ordering::Release);
    assert!(file.sync().is_err());
    assert!(!file.holds_changes());
    // Another change, committed: the object has it and not the dropped one.
    file.write_at(b"kept", 10).unwrap();
    file.sync().unwrap();
    let mut want = original;
    want[10..14].copy_from_slice(b"kept");
    assert_eq!(stored(&store, &path), want);
    assert_eq!(read_all(&file), want);
}

/// A writer that dirties more than the cache lets stay dirty is throttled (under the file's
/// change lock, as every writer is) until the flusher cleans pages; for an object file that
/// is a commit, which must not wait for that lock. Several times the dirty limit, written in
/// 1 MiB writes, then synced and checked against the store.
#[test]
fn a_writer_past_the_dirty_limit_is_cleaned_by_the_flusher() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let path = Path::from("w/throttled.bin");
    let cache = foliocache::Cache::builder()
        .capacity(32 << 20)
        .dirty_ratio(0.2)
        .build()
        .unwrap();
    let create = ObjectOptions {
        create: true,
        ..ObjectOptions::default()
    };
    let file = cache
        .open_object_in(Arc::clone(&store), &path, &create)
        .unwrap();
    let data = bytes(12, 24 << 20);
    let (done, finished) = std::sync::mpsc::channel();
    // A thread of its own (not scoped): if it is stuck, the test fails instead of hanging.
    let writer = {
        let (file, data) = (file.clone(), data.clone());
        std::thread::spawn(move || {
            for (k, chunk) in data.chunks(1 << 20).enumerate() {
                file.write_at(chunk, (k << 20) as u64).unwrap();
            }
            file.sync().unwrap();
            let _ = done.send(());
        })
    };
    if finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .is_err()
    {
        // Left as they are: dropping the cache would wait for the stuck writer.
        std::mem::forget(file);
        std::mem::forget(cache);
        panic!("the writer is stuck: its pages were never committed");
    }
    writer.join().unwrap();
    assert!(
        file.backend().stats().commits > 1,
        "the flusher committed nothing"
    );
    assert!(stored(&store, &path) == data);
}
