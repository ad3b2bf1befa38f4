//! Objects read through the cache from a real SeaweedFS cluster (started once for this
//! binary, see `common`), checked byte for byte against the bytes put.

mod common;

use common::{cache, cluster, pattern, skip, stored};
use foliocache_object::{CachedStore, ObjectCache, ObjectOptions};
use object_store::ObjectStore;
use object_store::path::Path;
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn options() -> ObjectOptions {
    ObjectOptions {
        deadline: std::time::Duration::from_secs(20),
        ..ObjectOptions::default()
    }
}

/// Reads the whole file in `chunk`-byte reads through one handle.
fn read_all(file: &foliocache_object::ObjectFile, chunk: usize) -> Vec<u8> {
    let mut handle = file.handle();
    let mut out = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        let n = handle.read_at(&mut buf, out.len() as u64).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn large_and_odd_sized_objects_read_byte_for_byte_sequentially_and_at_random() {
    if skip() {
        return;
    }
    let c = cluster();
    let store = c.store("reads").unwrap();
    let sizes = [0, 1, 4095, 4096, 4097, 65_537, MIB + 123, 40 * MIB + 7];
    let cache = cache(256 << 20);
    for (i, &size) in sizes.iter().enumerate() {
        let key = format!("odd/{size}");
        let bytes = pattern(i as u64 + 1, size);
        common::put(&store, &key, bytes.clone());
        let file = cache
            .open_object_in(Arc::clone(&store), &Path::from(key.as_str()), &options())
            .unwrap();
        assert_eq!(file.size(), size as u64);
        // Sequential, in 64 KiB reads.
        assert!(
            read_all(&file, 64 << 10) == bytes,
            "{key}: sequential read differs"
        );
        // Random reads of a fresh file, of sizes that cross folios, and past the end.
        let file = cache
            .open_object_in(Arc::clone(&store), &Path::from(key.as_str()), &options())
            .unwrap();
        let mut handle = file.handle();
        let mut rng = pattern(size as u64 + 99, 4096);
        for step in 0..64 {
            let word = |k: usize| u64::from_le_bytes(rng[k * 8..k * 8 + 8].try_into().unwrap());
            let pos = if size == 0 {
                0
            } else {
                word(step) % (size as u64 + 10)
            };
            let len = (word(step + 64) % (300 << 10)) as usize + 1;
            let mut buf = vec![0xEEu8; len];
            let n = handle.read_at(&mut buf, pos).unwrap();
            let want = (size as u64).saturating_sub(pos).min(len as u64) as usize;
            assert_eq!(n, want, "{key}: read of {len} at {pos}");
            if n > 0 {
                assert!(
                    buf[..n] == bytes[pos as usize..pos as usize + n],
                    "{key}: random read of {len} at {pos} differs"
                );
            }
            rng.rotate_left(3);
        }
        let stats = file.backend().stats();
        assert_eq!(stats.failed_gets, 0, "{key}: {stats:?}");
    }
}

#[test]
fn concurrent_readers_get_the_right_bytes_and_share_each_get() {
    if skip() {
        return;
    }
    let c = cluster();
    let store = c.store("concurrent").unwrap();
    let bytes = Arc::new(pattern(7, 24 * MIB + 4321));
    common::put(&store, "shared", bytes.to_vec());
    let cache = cache(256 << 20);
    // The oracle: what one reader of the whole object sends.
    let alone = cache
        .open_object_in(Arc::clone(&store), &Path::from("shared"), &options())
        .unwrap();
    assert!(read_all(&alone, 256 << 10) == *bytes);
    let one_reader = alone.backend().stats();
    // Eight readers of one fresh file, each reading all of it from its own start.
    let file = cache
        .open_object_in(Arc::clone(&store), &Path::from("shared"), &options())
        .unwrap();
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let file = file.clone();
            let bytes = Arc::clone(&bytes);
            scope.spawn(move || {
                let mut handle = file.handle();
                let len = bytes.len() as u64;
                let start = (t * 3 * MIB as u64) % len;
                let mut pos = start;
                let mut buf = vec![0u8; 256 << 10];
                let mut read = 0u64;
                while read < len {
                    let n = handle.read_at(&mut buf, pos).unwrap();
                    assert!(n > 0 || pos == len);
                    assert!(
                        buf[..n] == bytes[pos as usize..pos as usize + n],
                        "reader {t}: bytes at {pos} differ"
                    );
                    read += n as u64;
                    pos = if pos + n as u64 >= len {
                        0
                    } else {
                        pos + n as u64
                    };
                }
            });
        }
    });
    let eight = file.backend().stats();
    // Every byte was fetched about once however many readers wanted it: eight readers do not
    // fetch eight times what one does (windows of readers starting apart overlap a little).
    assert!(
        eight.bytes_fetched <= one_reader.bytes_fetched * 3 / 2,
        "one reader fetched {} bytes, eight fetched {}",
        one_reader.bytes_fetched,
        eight.bytes_fetched
    );
    assert_eq!(eight.failed_gets, 0);
}

#[test]
fn a_second_pass_is_served_from_memory_and_random_reads_fetch_about_what_they_read() {
    if skip() {
        return;
    }
    let c = cluster();
    let store = c.store("passes").unwrap();
    let bytes = pattern(11, 16 * MIB);
    common::put(&store, "obj", bytes.clone());
    let cache = cache(256 << 20);
    let file = cache
        .open_object_in(Arc::clone(&store), &Path::from("obj"), &options())
        .unwrap();
    assert!(read_all(&file, 64 << 10) == bytes);
    let first = file.backend().stats();
    assert!(read_all(&file, 64 << 10) == bytes);
    let second = file.backend().stats();
    assert_eq!(second.gets, first.gets, "the second pass sent GETs");
    assert_eq!(second.bytes_fetched, first.bytes_fetched);
    // Random 64 KiB reads at 64 KiB-aligned offsets, with random advice.
    let random = cache
        .open_object_in(Arc::clone(&store), &Path::from("obj"), &options())
        .unwrap();
    let mut handle = random.handle();
    handle.inner().advise(foliocache::Advice::Random).unwrap();
    let blocks = bytes.len() / (64 << 10);
    let order = pattern(5, 64 * 8);
    let mut read = 0u64;
    let mut seen = std::collections::HashSet::new();
    for k in 0..64 {
        let word = u64::from_le_bytes(order[k * 8..k * 8 + 8].try_into().unwrap());
        let block = (word % blocks as u64) as usize;
        let mut buf = vec![0u8; 64 << 10];
        let pos = (block * (64 << 10)) as u64;
        assert_eq!(handle.read_at(&mut buf, pos).unwrap(), buf.len());
        assert!(buf[..] == bytes[pos as usize..pos as usize + buf.len()]);
        if seen.insert(block) {
            read += buf.len() as u64;
        }
    }
    let stats = random.backend().stats();
    assert!(
        stats.bytes_fetched as f64 <= read as f64 * 1.1,
        "random reads of {read} distinct bytes fetched {}",
        stats.bytes_fetched
    );
}

#[test]
fn async_reads_from_a_tokio_runtime_get_the_right_bytes() {
    if skip() {
        return;
    }
    let c = cluster();
    let store = c.store("async").unwrap();
    let bytes = Arc::new(pattern(13, 9 * MIB + 17));
    common::put(&store, "obj", bytes.to_vec());
    let cache = cache(128 << 20);
    let file = cache
        .open_object_in(Arc::clone(&store), &Path::from("obj"), &options())
        .unwrap();
    // A current-thread runtime: a read that blocked its one thread would stop every task.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..4u64 {
            let file = file.clone();
            let bytes = Arc::clone(&bytes);
            tasks.push(tokio::spawn(async move {
                let mut handle = file.handle();
                let mut pos = t * 1_000_003 % bytes.len() as u64;
                let mut buf = vec![0u8; 100_000];
                for _ in 0..40 {
                    let n = handle.read_at_async(&mut buf, pos).await.unwrap();
                    let want = (bytes.len() as u64 - pos).min(buf.len() as u64) as usize;
                    assert_eq!(n, want);
                    assert!(buf[..n] == bytes[pos as usize..pos as usize + n]);
                    pos = (pos + n as u64) % bytes.len() as u64;
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
}

#[test]
fn a_rewritten_object_is_seen_after_revalidation_and_no_read_mixes_versions() {
    if skip() {
        return;
    }
    let c = cluster();
    let store = c.store("rewrite").unwrap();
    // Version v: every 4 KiB page starts with v (as a u64), so a read can tell which
    // versions its pages came from.
    let size = 16 * MIB;
    let version = |v: u64| {
        let mut out = pattern(v, size);
        for page in out.chunks_mut(4096) {
            page[..8].copy_from_slice(&v.to_le_bytes());
        }
        out
    };
    let versions: Vec<Vec<u8>> = (0..=12).map(version).collect();
    common::put(&store, "obj", versions[1].clone());
    // A cache smaller than the object and small windows: pages are evicted and fetched again
    // all the time, so GETs keep meeting the object as it changes.
    let cache = cache(6 << 20);
    let small = ObjectOptions {
        readahead_bytes: 1 << 20,
        get_bytes: 256 << 10,
        ..options()
    };
    let file = cache
        .open_object_in(Arc::clone(&store), &Path::from("obj"), &small)
        .unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for t in 0..3u64 {
            let file = file.clone();
            let (done, versions) = (&done, &versions);
            scope.spawn(move || {
                let mut handle = file.handle();
                let mut buf = vec![0u8; 512 << 10];
                let mut pos = t * 4096 * 37 % size as u64;
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) || reads < 10 {
                    let n = handle.read_at(&mut buf, pos).unwrap_or_else(|error| {
                        panic!("read at {pos}: {error}: {:?}", file.backend().last_error())
                    });
                    let v = u64::from_le_bytes(buf[..8].try_into().unwrap()) as usize;
                    assert!((1..versions.len()).contains(&v), "version {v} at {pos}");
                    assert!(
                        buf[..n] == versions[v][pos as usize..pos as usize + n],
                        "a read at {pos} of version {v} mixed versions or bytes"
                    );
                    reads += 1;
                    pos = (pos + n as u64) % size as u64;
                    if reads % 16 == 0 {
                        file.revalidate().unwrap();
                    }
                }
            });
        }
        for next in &versions[2..] {
            std::thread::sleep(std::time::Duration::from_millis(60));
            common::put(&store, "obj", next.clone());
        }
        std::thread::sleep(std::time::Duration::from_millis(60));
        done.store(true, std::sync::atomic::Ordering::Release);
    });
    // After a revalidation, the last version, and only it.
    file.revalidate().unwrap();
    assert!(read_all(&file, 1 << 20) == versions[versions.len() - 1]);
    let stats = file.backend().stats();
    assert!(file.backend().generation() >= 2, "{stats:?}");
    eprintln!(
        "rewrite: {} versions pinned, {} GETs refused as stale, {stats:?}",
        file.backend().generation(),
        stats.stale
    );
}

#[test]
fn an_object_file_is_refused_by_a_shared_cache() {
    if skip() {
        return;
    }
    let c = cluster();
    let store = c.store("refused").unwrap();
    common::put(&store, "obj", vec![1; 10]);
    let name = format!("object-test-{}", std::process::id());
    let shared = match foliocache::Cache::builder()
        .capacity(16 << 20)
        .shared(name.as_str())
        .owner_program(common::workspace_bin("foliocache", "foliocache-owner"))
        .build()
    {
        Ok(shared) => shared,
        Err(error) => panic!("a shared cache could not start: {error}"),
    };
    let error = shared
        .open_object_in(Arc::clone(&store), &Path::from("obj"), &options())
        .unwrap_err();
    // The owner goes when its last client does.
    drop(shared);
    assert!(
        error.to_string().contains("shared"),
        "unexpected error: {error}"
    );
}

#[test]
// `ParquetObjectReader` (deprecated in parquet 60 for a hand-written `AsyncFileReader`) is
// the reader a program over the `ObjectStore` trait uses: the very use `CachedStore` serves.
#[allow(deprecated)]
fn the_parquet_reader_reads_columns_through_the_cached_store_as_it_does_directly() {
    if skip() {
        return;
    }
    use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
    use futures_util::TryStreamExt;
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::ParquetRecordBatchStreamBuilder;
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::async_reader::ParquetObjectReader;
    use parquet::file::properties::WriterProperties;

    let c = cluster();
    let store = c.store("parquet").unwrap();
    // A file of several row groups and three columns.
    let rows = 200_000i64;
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
    let values: ArrayRef = Arc::new(Float64Array::from_iter_values(
        (0..rows).map(|i| (i as f64).sqrt()),
    ));
    let names: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..rows).map(|i| format!("row-{}", i * 7919 % 100_003)),
    ));
    let batch =
        RecordBatch::try_from_iter([("id", ids), ("value", values), ("name", names)]).unwrap();
    let mut bytes = Vec::new();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(30_000))
        .build();
    let mut writer = ArrowWriter::try_new(&mut bytes, batch.schema(), Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    common::put(&store, "table.parquet", bytes);

    let cached: Arc<dyn ObjectStore> = Arc::new(CachedStore::new(
        Arc::clone(&store),
        cache(128 << 20),
        options(),
    ));
    let read = |store: Arc<dyn ObjectStore>, columns: Vec<usize>| {
        common::block_on(async move {
            let reader = ParquetObjectReader::new(store, Path::from("table.parquet"));
            let builder = ParquetRecordBatchStreamBuilder::new(reader).await.unwrap();
            assert!(builder.metadata().num_row_groups() >= 6);
            let mask = ProjectionMask::roots(builder.parquet_schema(), columns);
            let stream = builder.with_projection(mask).build().unwrap();
            stream.try_collect::<Vec<RecordBatch>>().await.unwrap()
        })
    };
    for columns in [vec![0], vec![1, 2], vec![0, 1, 2]] {
        let direct = read(Arc::clone(&store), columns.clone());
        let through = read(Arc::clone(&cached), columns.clone());
        assert_eq!(
            direct, through,
            "columns {columns:?} differ through the cache"
        );
        assert_eq!(
            through.iter().map(RecordBatch::num_rows).sum::<usize>(),
            rows as usize
        );
    }
}

/// Writes through the cache, synced, read back by a second client without the cache: a new
/// object, a small object rewritten in one conditional PUT, a 40 MiB object changed in a few
/// places and uploaded in 8 MiB parts; then a conflict: another writer's version is never
/// overwritten (SeaweedFS answers `If-Match` on PUT), and the changes stay until discarded.
#[test]
fn writes_are_synced_to_the_store_and_read_back_by_another_client() {
    if skip() {
        return;
    }
    let c = cluster();
    let store = c.store("writes").unwrap();
    let cache = cache(256 << 20);
    let write = ObjectOptions {
        write: true,
        single_put_bytes: 16 * MIB as u64,
        ..options()
    };

    // A new object.
    let create = ObjectOptions {
        create: true,
        ..write.clone()
    };
    let file = cache
        .open_object_in(Arc::clone(&store), &Path::from("w/new"), &create)
        .unwrap();
    let fresh = pattern(41, 3 * MIB + 5);
    file.write_at(&fresh, 0).unwrap();
    file.sync().unwrap();
    assert!(
        stored(&store, "w/new") == fresh,
        "the created object differs"
    );
    assert_eq!(file.backend().stats().puts, 1);

    // A small object rewritten in part: one PUT.
    let mut small = pattern(42, 100_000);
    common::put(&store, "w/small", small.clone());
    let file = cache
        .open_object_in(Arc::clone(&store), &Path::from("w/small"), &write)
        .unwrap();
    file.write_at(b"through the cache", 4090).unwrap();
    small[4090..4107].copy_from_slice(b"through the cache");
    file.write_at(b"appended", 100_000).unwrap();
    small.extend_from_slice(b"appended");
    file.sync().unwrap();
    assert!(
        stored(&store, "w/small") == small,
        "the rewritten object differs"
    );

    // A large object changed in a few places: a multipart upload of all of it.
    let mut large = pattern(43, 40 * MIB + 7);
    common::put(&store, "w/large", large.clone());
    let file = cache
        .open_object_in(Arc::clone(&store), &Path::from("w/large"), &write)
        .unwrap();
    for (at, what) in [
        (0usize, &b"head"[..]),
        (13 * MIB + 1, b"middle"),
        (40 * MIB + 3, b"tail!"),
    ] {
        file.write_at(what, at as u64).unwrap();
        let end = at + what.len();
        if end > large.len() {
            large.resize(end, 0);
        }
        large[at..end].copy_from_slice(what);
    }
    file.sync().unwrap();
    let stats = file.backend().stats();
    assert_eq!(
        stats.parts,
        large.len().div_ceil(8 * MIB) as u64,
        "{stats:?}"
    );
    assert!(
        stored(&store, "w/large") == large,
        "the large object differs"
    );
    // Read back through another file of the cache as well (from the store, at the new version).
    let again = cache
        .open_object_in(Arc::clone(&store), &Path::from("w/large"), &options())
        .unwrap();
    assert!(read_all(&again, 1 << 20) == large);

    // A conflict: another writer's PUT lands between this file's read and its sync.
    let file = cache
        .open_object_in(Arc::clone(&store), &Path::from("w/small"), &write)
        .unwrap();
    assert!(read_all(&file, 64 << 10) == small);
    file.write_at(b"mine", 0).unwrap();
    let theirs = pattern(44, 5000);
    common::put(&store, "w/small", theirs.clone());
    let error = file.sync().unwrap_err();
    assert!(
        matches!(&error, foliocache::Error::Writeback { source } if source.raw_os_error() == Some(libc::ESTALE)),
        "{error}"
    );
    assert!(
        stored(&store, "w/small") == theirs,
        "another writer's version was overwritten"
    );
    file.discard_changes().unwrap();
    assert!(read_all(&file, 64 << 10) == theirs);
}
