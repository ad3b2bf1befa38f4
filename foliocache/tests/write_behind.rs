//! Write-behind: a handle writing sequentially has the data behind it written back without a
//! sync, in the 2 MiB units it wrote whole, never the unit it is filling; random writes, `File::write_at`
//! and a cache with write-behind off leave everything dirty until something else writes it.
//! The flusher's other triggers (expiry, interval, background threshold) are set out of reach,
//! so any writeback seen here is write-behind's.

mod common;

use foliocache::{Cache, File, OpenOptions, PageState};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn cache(write_behind: u64) -> Cache {
    Cache::builder()
        .capacity(64 << 20)
        .write_behind_bytes(write_behind)
        .dirty_background_ratio(0.5)
        .dirty_ratio(0.9)
        .dirty_expire(Duration::from_secs(3600))
        .writeback_interval(Duration::from_secs(3600))
        .build()
        .unwrap()
}

/// An empty file opened for writing, or `None` (skipped) where the file system has no direct
/// I/O.
fn open(cache: &Cache, name: &str) -> Option<(PathBuf, File)> {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, b"").unwrap();
    match cache.open_with(&path, OpenOptions::new().write(true)) {
        Ok(file) => Some((path, file)),
        Err(foliocache::Error::NoDirectIo { .. }) => {
            common::skip("the target directory's file system has no direct I/O");
            None
        }
        Err(error) => panic!("{error}"),
    }
}

fn chunk(k: u64) -> Vec<u8> {
    vec![(k as u8).wrapping_mul(37) | 1; 256 << 10]
}

/// Pages of the file in `state`, by page index.
fn pages_in(file: &File, state: PageState) -> Vec<u64> {
    file.cached_ranges()
        .into_iter()
        .filter(|range| range.state == state)
        .flat_map(|range| range.first..range.first + range.pages)
        .collect()
}

/// Waits (at most 20 s) until no page of the file is under writeback and `pages` pages were
/// written back in all.
fn wait_written(cache: &Cache, file: &File, pages: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while cache.stats().dirty.written_pages < pages
        || !pages_in(file, PageState::Writeback).is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "write-behind wrote {} of {pages} pages in 20 s",
            cache.stats().dirty.written_pages
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_sequential_writer_has_the_data_behind_it_written_without_a_sync() {
    let cache = cache(4 * MIB);
    let Some((path, file)) = open(&cache, "write-behind-seq") else {
        return;
    };
    let mut handle = file.handle();
    // 5 MiB in 256 KiB writes: the trigger (4 MiB behind the writer) is reached once.
    for k in 0..20 {
        handle.write_at(&chunk(k), k * (256 << 10)).unwrap();
    }
    wait_written(&cache, &file, 4 * MIB / 4096);
    // Exactly the first 4 MiB went out; the unit being filled stayed dirty.
    assert_eq!(cache.stats().dirty.written_pages, 1024);
    assert_eq!(
        pages_in(&file, PageState::Dirty),
        (1024..1280).collect::<Vec<_>>()
    );
    let on_disk = std::fs::read(&path).unwrap();
    assert!(on_disk.len() as u64 >= 4 * MIB);
    for k in 0..16u64 {
        let at = (k * (256 << 10)) as usize;
        assert!(
            on_disk[at..at + (256 << 10)] == chunk(k)[..],
            "write {k} is not on storage"
        );
    }
    // The rest goes out with the sync, and storage has it all.
    handle.sync_all().unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk.len() as u64, 5 * MIB);
    for k in 0..20u64 {
        let at = (k * (256 << 10)) as usize;
        assert!(on_disk[at..at + (256 << 10)] == chunk(k)[..], "write {k}");
    }
}

#[test]
fn a_stream_starting_mid_unit_hands_off_only_the_units_it_wrote_whole() {
    let cache = cache(2 * MIB);
    let Some((_path, file)) = open(&cache, "write-behind-mid") else {
        return;
    };
    let mut handle = file.handle();
    // A stream from 3 MiB to 7 MiB: of the units behind it, 2–4 MiB was only partly written
    // by it and stays dirty; 4–6 MiB goes out; 6–7 MiB is being filled.
    for k in 0..16u64 {
        handle
            .write_at(&chunk(k), 3 * MIB + k * (256 << 10))
            .unwrap();
    }
    wait_written(&cache, &file, 2 * MIB / 4096);
    assert_eq!(cache.stats().dirty.written_pages, 512);
    let dirty: Vec<u64> = (768..1024).chain(1536..1792).collect();
    assert_eq!(pages_in(&file, PageState::Dirty), dirty);
    // A stream broken by a write elsewhere starts over: 7–8 MiB, then 9–10 MiB, then on to
    // 12 MiB; only 10–12 MiB is a whole unit of the new stream.
    handle.write_at(&[1; 4096], 20 * MIB).unwrap();
    for k in 0..4u64 {
        handle
            .write_at(&chunk(k), 7 * MIB + k * (256 << 10))
            .unwrap();
    }
    for k in 0..12u64 {
        handle
            .write_at(&chunk(k), 9 * MIB + k * (256 << 10))
            .unwrap();
    }
    wait_written(&cache, &file, 1024);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(cache.stats().dirty.written_pages, 1024);
}

#[test]
fn random_writes_file_writes_and_write_behind_off_leave_the_data_dirty() {
    let quiet = |cache: &Cache, file: &File, dirty: u64, what: &str| {
        // Nothing should start; give a wrong trigger time to show itself.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(cache.stats().dirty.written_pages, 0, "{what}");
        assert_eq!(
            pages_in(file, PageState::Dirty).len() as u64,
            dirty,
            "{what}"
        );
    };
    // Random 4 KiB writes over 8 MiB through a handle.
    let cache_on = cache(2 * MIB);
    let Some((_path, file)) = open(&cache_on, "write-behind-random") else {
        return;
    };
    let mut handle = file.handle();
    let mut pages: Vec<u64> = (0..2048).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for k in (1..pages.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        pages.swap(k, (state % (k as u64 + 1)) as usize);
    }
    for &page in &pages {
        handle
            .write_at(&[page as u8 | 1; 4096], page * 4096)
            .unwrap();
    }
    quiet(&cache_on, &file, 2048, "random writes");
    // Sequential writes through the file, not a handle.
    let Some((_path, file)) = open(&cache_on, "write-behind-file") else {
        return;
    };
    for k in 0..32 {
        file.write_at(&chunk(k), k * (256 << 10)).unwrap();
    }
    quiet(&cache_on, &file, 2048, "File::write_at");
    // Sequential writes through a handle of a cache with write-behind off.
    let cache_off = cache(0);
    let Some((_path, file)) = open(&cache_off, "write-behind-off") else {
        return;
    };
    let mut handle = file.handle();
    for k in 0..32 {
        handle.write_at(&chunk(k), k * (256 << 10)).unwrap();
    }
    quiet(&cache_off, &file, 2048, "write-behind off");
}

#[test]
fn write_behind_settings_are_checked() {
    let too_big = Cache::builder()
        .write_behind_bytes(foliocache::MAX_READAHEAD_BYTES + 1)
        .build();
    assert!(matches!(
        too_big,
        Err(foliocache::Error::InvalidSetting {
            name: "write_behind_bytes",
            ..
        })
    ));
}
