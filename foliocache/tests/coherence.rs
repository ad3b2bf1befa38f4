//! Files changed on storage by another program: after revalidation (explicit, or by opening
//! the file again) every byte read is the new content; files are shared per inode within a
//! cache; a file replaced by rename is a new file.

mod common;

use common::{child_role, run_child, skip};
use foliocache::{Cache, Error, File, OpenOptions};
use std::path::{Path, PathBuf};

/// The content of generation `g` of a test file: every byte says its generation and position.
fn content(generation: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(31) ^ generation.wrapping_mul(97))
        .collect()
}

fn read_whole(file: &File) -> Vec<u8> {
    let mut out = vec![0u8; file.size() as usize];
    let mut handle = file.handle();
    let mut at = 0;
    while at < out.len() {
        let n = handle.read_at(&mut out[at..], at as u64).unwrap();
        assert!(n > 0, "short read before end of file");
        at += n;
    }
    out
}

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// Done by another process (a child of this test binary): writes generation `g` of `len`
/// bytes over the file in place (no truncation: the inode and, when `len` is the same, the
/// size stay), or truncates it to `len` first.
fn child_writes(path: &Path, generation: u8, len: usize, truncate: bool) {
    // The file system's clock ticks every few milliseconds: keep each change in a tick of
    // its own, so its times differ from the last one's (see `File::revalidate`).
    std::thread::sleep(std::time::Duration::from_millis(25));
    let role = format!(
        "write:{}:{generation}:{len}:{}",
        path.display(),
        u8::from(truncate)
    );
    assert!(
        run_child(
            "a_file_rewritten_by_another_process_is_seen_after_revalidation",
            &role
        )
        .success()
    );
}

fn run_as_child(role: &str) {
    let parts: Vec<&str> = role.split(':').collect();
    let [_, path, generation, len, truncate] = parts[..] else {
        panic!("bad role {role}");
    };
    let bytes = content(generation.parse().unwrap(), len.parse().unwrap());
    let mut options = std::fs::OpenOptions::new();
    options.write(true).truncate(truncate == "1");
    use std::io::Write;
    let mut file = options.open(path).unwrap();
    file.write_all(&bytes).unwrap();
    file.sync_all().unwrap();
}

fn open(cache: &Cache, path: &Path) -> Option<File> {
    match cache.open(path) {
        Ok(file) => Some(file),
        Err(Error::NoDirectIo { .. }) => {
            skip("the target directory's file system has no direct I/O");
            None
        }
        Err(error) => panic!("{error}"),
    }
}

#[test]
fn a_file_rewritten_by_another_process_is_seen_after_revalidation() {
    if let Some(role) = child_role() {
        run_as_child(&role);
        return;
    }
    let path = path("coherence-rewrite");
    let len = 300_000;
    std::fs::write(&path, content(1, len)).unwrap();
    let cache = Cache::builder().capacity(8 << 20).build().unwrap();
    let Some(file) = open(&cache, &path) else {
        return;
    };
    assert_eq!(read_whole(&file), content(1, len));
    assert!(file.mapping_stats().cached_pages > 0);
    assert!(!file.revalidate().unwrap().changed, "nothing changed yet");

    // Rewritten in place, same size: the cache still holds generation 1's pages until it
    // revalidates; then every byte is generation 2's.
    child_writes(&path, 2, len, false);
    let revalidated = file.revalidate().unwrap();
    assert!(revalidated.changed);
    assert_eq!(revalidated.size, len as u64);
    assert!(revalidated.dropped_pages > 0);
    assert_eq!(read_whole(&file), content(2, len));

    // Truncated and rewritten shorter: the size follows.
    child_writes(&path, 3, 123_457, true);
    assert!(file.revalidate().unwrap().changed);
    assert_eq!(file.size(), 123_457);
    assert_eq!(read_whole(&file), content(3, 123_457));

    // Grown: opening the file again revalidates it, and gives the same shared file.
    child_writes(&path, 4, 500_001, true);
    let again = open(&cache, &path).unwrap();
    assert_eq!(again.size(), 500_001);
    assert_eq!(
        read_whole(&file),
        content(4, 500_001),
        "one file, seen through both"
    );
    assert_eq!(
        foliocache::raw::mapping(&again).id(),
        foliocache::raw::mapping(&file).id()
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_reader_holding_pages_across_a_revalidation_keeps_whole_old_pages() {
    if let Some(role) = child_role() {
        run_as_child(&role);
        return;
    }
    let path = path("coherence-held");
    let len = 64 << 10;
    std::fs::write(&path, content(1, len)).unwrap();
    let cache = Cache::builder().capacity(8 << 20).build().unwrap();
    let Some(file) = open(&cache, &path) else {
        return;
    };
    let mut handle = file.handle();
    let run = handle.read_folios(0, len).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(25));
    std::fs::write(&path, content(2, len)).unwrap();
    assert!(file.revalidate().unwrap().changed);
    // The pinned pages left the file but are still the old ones, whole.
    assert_eq!(run.to_vec(), content(1, len));
    drop(run);
    assert_eq!(read_whole(&file), content(2, len));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_file_replaced_by_rename_is_a_new_file() {
    let path = path("coherence-rename");
    let fresh = path.with_extension("new");
    std::fs::write(&path, content(1, 10_000)).unwrap();
    let cache = Cache::builder().capacity(8 << 20).build().unwrap();
    let Some(old) = open(&cache, &path) else {
        return;
    };
    assert_eq!(read_whole(&old), content(1, 10_000));
    std::fs::write(&fresh, content(2, 20_000)).unwrap();
    std::fs::rename(&fresh, &path).unwrap();
    let new = open(&cache, &path).unwrap();
    assert_ne!(
        foliocache::raw::mapping(&new).id(),
        foliocache::raw::mapping(&old).id()
    );
    assert_eq!(read_whole(&new), content(2, 20_000));
    // Whoever had the old file open still reads it (as with an unlinked file).
    assert_eq!(read_whole(&old), content(1, 10_000));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn files_are_shared_per_inode_and_layout_conflicts_are_errors() {
    let path = path("coherence-shared");
    std::fs::write(&path, content(1, 50_000)).unwrap();
    let cache = Cache::builder().capacity(8 << 20).build().unwrap();
    let Some(a) = open(&cache, &path) else {
        return;
    };
    let b = cache.open(&path).unwrap();
    assert_eq!(
        foliocache::raw::mapping(&a).id(),
        foliocache::raw::mapping(&b).id()
    );
    let err = cache
        .open_with(&path, OpenOptions::new().max_order(0))
        .unwrap_err();
    assert!(matches!(err, Error::OpenConflict { .. }), "{err}");
    let apart = cache
        .open_with(&path, OpenOptions::new().max_order(0).shared(false))
        .unwrap();
    assert_ne!(
        foliocache::raw::mapping(&apart).id(),
        foliocache::raw::mapping(&a).id()
    );
    assert_eq!(read_whole(&apart), content(1, 50_000));
    // Once every holder let go, a new open makes a new file.
    let id = foliocache::raw::mapping(&a).id();
    drop((a, b));
    let c = cache.open(&path).unwrap();
    assert_ne!(foliocache::raw::mapping(&c).id(), id);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_caches_own_writeback_and_truncation_are_not_taken_for_another_programs_changes() {
    let path = path("coherence-own-changes");
    std::fs::write(&path, content(1, 100_000)).unwrap();
    let cache = Cache::builder().capacity(16 << 20).build().unwrap();
    let Some(_probe) = open(&cache, &path) else {
        return;
    };
    drop(_probe);
    let file = cache
        .open_with(&path, OpenOptions::new().write(true))
        .unwrap();
    let mut handle = file.handle();
    let mut model = content(1, 100_000);
    // Write, write back (storage's times move), then append past the size on storage and
    // open again (revalidating): the append must stay, size and bytes.
    let sleep = || std::thread::sleep(std::time::Duration::from_millis(25));
    handle.write_at(&content(2, 5000), 1000).unwrap();
    model[1000..6000].copy_from_slice(&content(2, 5000));
    handle.sync_all().unwrap();
    sleep();
    handle.write_at(&content(3, 50_000), 100_000).unwrap();
    model.extend_from_slice(&content(3, 50_000));
    let again = cache
        .open_with(&path, OpenOptions::new().write(true))
        .unwrap();
    assert_eq!(again.size(), 150_000, "the append survives a reopen");
    assert!(read_whole(&again) == model);
    // Clean pages the cache wrote itself stay cached across a reopen.
    handle.sync_all().unwrap();
    sleep();
    file.set_len(120_000).unwrap();
    model.truncate(120_000);
    sleep();
    let cached = file.mapping_stats().cached_pages;
    assert!(cached > 0);
    let again = cache.open(&path).unwrap();
    assert_eq!(again.size(), 120_000);
    assert_eq!(
        again.mapping_stats().cached_pages,
        cached,
        "the cache's own changes made a reopen drop its pages"
    );
    assert!(read_whole(&again) == model);
    // Another program's change is still seen.
    child_writes(&path, 4, 70_000, true);
    let again = cache.open(&path).unwrap();
    assert_eq!(again.size(), 70_000);
    assert!(read_whole(&again) == content(4, 70_000));
}

#[test]
fn a_revalidation_during_writeback_keeps_the_files_size() {
    // Appends written back in the background while the file is revalidated: a writeback pass
    // leaves the file longer on storage (to a block boundary) until it sets the size back, and
    // a revalidation must not take that size for another program's change.
    let path = path("coherence-revalidate-writeback");
    std::fs::write(&path, b"").unwrap();
    let cache = Cache::builder().capacity(16 << 20).build().unwrap();
    let Some(_probe) = open(&cache, &path) else {
        return;
    };
    let file = cache
        .open_with(&path, OpenOptions::new().write(true))
        .unwrap();
    let mut handle = file.handle();
    let mut size = 0u64;
    for step in 0..2000 {
        handle.write_at(&[b'r'; 100], size).unwrap();
        size += 100;
        file.drop_cached(0, 0); // starts writeback of the dirty data (the flusher writes)
        file.revalidate().unwrap();
        assert_eq!(file.size(), size, "step {step}");
    }
    handle.sync_all().unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn an_open_while_the_last_holder_writes_back_shares_its_file() {
    let path = path("coherence-close-open-race");
    let len = 32 << 20;
    let chunk = 1 << 20;
    std::fs::write(&path, content(1, len)).unwrap();
    // Room for the dirty data well below the flusher's background threshold: the drop has
    // all of it to write back.
    let cache = Cache::builder().capacity(1 << 30).build().unwrap();
    let Some(probe) = open(&cache, &path) else {
        return;
    };
    drop(probe);
    let mut opened_during = 0;
    for round in 0..4u8 {
        let file = cache
            .open_with(&path, OpenOptions::new().write(true))
            .unwrap();
        let id = foliocache::raw::mapping(&file).id();
        // Unsynced writes in an order that starts no write-behind.
        let want = content(2 + round, len);
        let mut handle = file.handle();
        for k in (0..len / chunk).rev() {
            handle
                .write_at(&want[k * chunk..(k + 1) * chunk], (k * chunk) as u64)
                .unwrap();
        }
        drop(handle);
        let dropping = std::sync::atomic::AtomicBool::new(false);
        let dropped = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            // Holding nothing, waits for the last holder's drop to begin, then opens and reads
            // the file while that drop writes back.
            let reader = s.spawn(|| {
                while !dropping.load(std::sync::atomic::Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
                let mut during = 0;
                loop {
                    let done = dropped.load(std::sync::atomic::Ordering::Acquire);
                    // Without revalidation (which would wait for the write back to end), so
                    // the open returns while the drop writes back.
                    let again = cache
                        .open_with(&path, OpenOptions::new().revalidate(false))
                        .unwrap();
                    // Data still dirty or under writeback once the open returned (this reader
                    // writes nothing): the drop was writing back all through the open, its
                    // file alive, so the open must have got that file, not a second copy of
                    // it read from storage behind the write back's back.
                    let dirty = cache.stats().dirty;
                    if dirty.dirty_pages + dirty.writeback_pages > 0 {
                        assert_eq!(foliocache::raw::mapping(&again).id(), id, "round {round}");
                        during += 1;
                    }
                    let mut handle = again.handle();
                    for at in (0..len).step_by(len / 8) {
                        let mut buf = vec![0u8; 65536];
                        handle.read_at(&mut buf, at as u64).unwrap();
                        assert!(
                            buf == want[at..at + 65536],
                            "round {round}: stale bytes at {at}"
                        );
                    }
                    if done {
                        return during;
                    }
                }
            });
            dropping.store(true, std::sync::atomic::Ordering::Release);
            drop(file);
            dropped.store(true, std::sync::atomic::Ordering::Release);
            opened_during += reader.join().unwrap();
        });
    }
    // The window was hit (32 MiB take tens of milliseconds to write back), so the test can
    // fail.
    assert!(opened_during > 0, "no open landed during a write back");
    std::fs::remove_file(&path).unwrap();
}
