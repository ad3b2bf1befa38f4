//! `CachedStore` and object files over `object_store`'s in-memory store (no server): reads of
//! every shape answered as the store itself answers them, changes through the wrapper and
//! beside it, and a read that meets a changed object.

use bytes::Bytes;
use foliocache_object::{CachedStore, ObjectCache, ObjectOptions};
use futures_util::TryStreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use std::sync::Arc;
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn cache() -> foliocache::Cache {
    foliocache::Cache::builder()
        .capacity(64 << 20)
        .build()
        .unwrap()
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn get(
    store: &dyn ObjectStore,
    path: &Path,
    range: Option<GetRange>,
) -> object_store::Result<Bytes> {
    let options = GetOptions {
        range,
        ..GetOptions::default()
    };
    let result = store.get_opts(path, options).await?;
    let chunks: Vec<Bytes> = result.into_stream().try_collect().await?;
    Ok(chunks.concat().into())
}

#[test]
fn the_cached_store_answers_every_read_shape_as_the_store_does() {
    let rt = runtime();
    rt.block_on(async {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("a/b.bin");
        let data = bytes(1, 9 << 20 | 4321);
        inner.put(&path, data.clone().into()).await.unwrap();
        let cached = CachedStore::new(Arc::clone(&inner), cache(), ObjectOptions::default());
        let len = data.len() as u64;
        let shapes = [
            None,
            Some(GetRange::Bounded(0..1)),
            Some(GetRange::Bounded(4095..4097)),
            Some(GetRange::Bounded(5_000_000..len + 100)),
            Some(GetRange::Offset(len - 10)),
            Some(GetRange::Suffix(12_345)),
            Some(GetRange::Suffix(len + 5)),
        ];
        for shape in shapes {
            let direct = get(&*inner, &path, shape.clone()).await.unwrap();
            let through = get(&cached, &path, shape.clone()).await.unwrap();
            assert!(direct == through, "{shape:?} differs");
        }
        // get_ranges, and a second round served from memory.
        let ranges = [0..10, 100..5_000_000, len - 3..len];
        let direct = inner.get_ranges(&path, &ranges).await.unwrap();
        let before = cached.stats();
        let through = cached.get_ranges(&path, &ranges).await.unwrap();
        assert_eq!(direct, through);
        assert_eq!(
            cached.stats().gets,
            before.gets,
            "cached ranges were fetched again"
        );
        // A range past the end, and a missing object, are errors as they are for the store.
        assert!(
            get(&cached, &path, Some(GetRange::Offset(len + 1)))
                .await
                .is_err()
        );
        let missing = get(&cached, &Path::from("nope"), None).await.unwrap_err();
        assert!(
            matches!(missing, object_store::Error::NotFound { .. }),
            "{missing}"
        );
        // Listing and heads go to the store.
        assert_eq!(cached.head(&path).await.unwrap().size, len);
        let listed: Vec<_> = cached.list(None).try_collect().await.unwrap();
        assert_eq!(listed.len(), 1);
    });
}

#[test]
fn a_change_through_the_wrapper_or_beside_it_is_seen() {
    let rt = runtime();
    rt.block_on(async {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("obj");
        inner.put(&path, bytes(1, 100_000).into()).await.unwrap();
        let cached = CachedStore::new(Arc::clone(&inner), cache(), ObjectOptions::default())
            .with_revalidate_after(Duration::from_secs(3600));
        assert_eq!(get(&cached, &path, None).await.unwrap(), bytes(1, 100_000));
        // Through the wrapper: the next read sees it.
        cached.put(&path, bytes(2, 90_000).into()).await.unwrap();
        assert_eq!(get(&cached, &path, None).await.unwrap(), bytes(2, 90_000));
        // Beside it: the cached version until someone looks (a head), then the new one.
        inner.put(&path, bytes(3, 80_000).into()).await.unwrap();
        assert_eq!(get(&cached, &path, None).await.unwrap(), bytes(2, 90_000));
        assert_eq!(cached.head(&path).await.unwrap().size, 80_000);
        assert_eq!(get(&cached, &path, None).await.unwrap(), bytes(3, 80_000));
        // With no attribute time, every read looks.
        let eager = CachedStore::new(Arc::clone(&inner), cache(), ObjectOptions::default())
            .with_revalidate_after(Duration::ZERO);
        assert_eq!(get(&eager, &path, None).await.unwrap(), bytes(3, 80_000));
        inner.put(&path, bytes(4, 70_000).into()).await.unwrap();
        assert_eq!(get(&eager, &path, None).await.unwrap(), bytes(4, 70_000));
        // A deleted object is not found, through the wrapper or beside it.
        inner.delete(&path).await.unwrap();
        assert!(get(&eager, &path, None).await.is_err());
    });
}

#[test]
fn a_read_that_meets_a_changed_object_gives_the_new_version_whole() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let path = Path::from("obj");
    let rt = runtime();
    let size = 4 << 20;
    rt.block_on(inner.put(&path, bytes(1, size).into()))
        .unwrap();
    let cache = cache();
    let file = cache
        .open_object_in(Arc::clone(&inner), &path, &ObjectOptions::default())
        .unwrap();
    let heads_at_open = file.backend().stats().heads;
    assert_eq!(heads_at_open, 1, "opening sent more than one HEAD");
    let mut handle = file.handle();
    handle.inner().set_ra_bytes(0); // read only what is asked: the rest stays uncached
    let mut first = vec![0u8; 8192];
    assert_eq!(handle.read_at(&mut first, 0).unwrap(), 8192);
    assert!(first[..] == bytes(1, size)[..8192]);
    // Another writer replaces the object. A read of cached and uncached pages together
    // meets the change, revalidates, and returns the new version only.
    rt.block_on(inner.put(&path, bytes(2, size).into()))
        .unwrap();
    let mut buf = vec![0u8; 64 << 10];
    assert_eq!(handle.read_at(&mut buf, 0).unwrap(), buf.len());
    assert!(
        buf[..] == bytes(2, size)[..buf.len()],
        "a read mixed versions"
    );
    assert_eq!(file.backend().generation(), 1);
    assert!(file.backend().stats().stale >= 1);
    // The async read sees the same.
    rt.block_on(inner.put(&path, bytes(3, size).into()))
        .unwrap();
    let n = rt
        .block_on(handle.read_at_async(&mut buf, 3 << 20))
        .unwrap();
    assert_eq!(n, buf.len());
    assert!(buf[..] == bytes(3, size)[3 << 20..(3 << 20) + buf.len()]);
    // A read of pages still cached from version 3 after another change: the cache's version
    // until the next revalidation (no HEAD per hit), then the new one.
    rt.block_on(inner.put(&path, bytes(4, size).into()))
        .unwrap();
    assert_eq!(handle.read_at(&mut buf, 3 << 20).unwrap(), buf.len());
    assert!(buf[..] == bytes(3, size)[3 << 20..(3 << 20) + buf.len()]);
    let revalidated = file.revalidate().unwrap();
    assert!(revalidated.changed);
    assert_eq!(handle.read_at(&mut buf, 3 << 20).unwrap(), buf.len());
    assert!(buf[..] == bytes(4, size)[3 << 20..(3 << 20) + buf.len()]);
}
