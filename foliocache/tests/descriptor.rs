//! Files read and written through a descriptor the caller lends (`Cache::open_descriptor`):
//! O_DIRECT and buffered descriptors, both engines; detaching keeps the pages and hands the
//! descriptor back unclosed; attaching again keeps them only if the file did not change;
//! a refused descriptor comes back unclosed; a write-only descriptor writes around the cache
//! where a page would have to be read; writes made outside the cache are dropped from it.

mod common;

use common::{pattern, per_engine, test_file};
use foliocache::{Cache, CacheBuilder, EngineKind, Error, File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

fn cache(engine: EngineKind) -> Cache {
    CacheBuilder::default()
        .capacity(64 << 20)
        .io_engine(engine)
        .build()
        .unwrap()
}

fn open(path: &Path, write: bool, flags: i32) -> OwnedFd {
    std::fs::OpenOptions::new()
        .read(flags & libc::O_ACCMODE != libc::O_WRONLY)
        .write(write)
        .custom_flags(flags & !libc::O_ACCMODE)
        .open(path)
        .unwrap()
        .into()
}

/// Whether `fd` is an open descriptor of this process.
fn is_open(fd: RawFd) -> bool {
    // SAFETY: fcntl with an integer argument on a descriptor number.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

fn read(file: &File, pos: u64, len: usize) -> Result<Vec<u8>, Error> {
    let mut buf = vec![0u8; len];
    let n = file.read_at(&mut buf, pos)?;
    buf.truncate(n);
    Ok(buf)
}

/// The engines this machine runs (per_engine skips the others).
fn engines() -> Vec<EngineKind> {
    let path = test_file("descriptor-probe", 4096);
    per_engine(cache, &path)
        .into_iter()
        .map(|(kind, _, _)| kind)
        .collect()
}

#[test]
fn a_detached_file_keeps_its_pages_and_the_descriptor_stays_open() {
    for engine in engines() {
        let size = 3 << 20;
        let path = test_file(&format!("descriptor-detach-{engine:?}"), size);
        let cache = cache(engine);
        let fd = open(&path, false, libc::O_RDONLY | libc::O_DIRECT);
        let raw = fd.as_raw_fd();
        let file = cache.open_descriptor(fd, OpenOptions::new()).unwrap();
        assert_eq!(
            file.backend_description().unwrap().split(' ').next(),
            Some("O_DIRECT")
        );
        assert_eq!(read(&file, 0, size as usize).unwrap(), pattern(size));
        let fd = file.detach_descriptor().unwrap();
        assert_eq!(
            fd.as_raw_fd(),
            raw,
            "{engine:?}: another descriptor came back"
        );
        assert!(is_open(raw));
        // Cached pages are still read; a miss fails (no descriptor) and a later one retries.
        assert_eq!(read(&file, 4096, 100).unwrap(), pattern(size)[4096..4196]);
        file.drop_cached(1 << 20, 4096);
        assert!(
            read(&file, 1 << 20, 4096).is_err(),
            "{engine:?}: read without a descriptor"
        );
        assert!(matches!(file.detach_descriptor(), Err(Error::Detached)));
        // Nobody changed the file: its pages stay, and the missing one is read again.
        let again = file.attach_descriptor(fd, false).unwrap();
        assert!(!again.changed, "{engine:?}: {again:?}");
        assert_eq!(again.dropped_pages, 0);
        assert_eq!(
            read(&file, 1 << 20, 4096).unwrap(),
            pattern(size)[1 << 20..(1 << 20) + 4096]
        );
        // Changed while detached: the stale pages go.
        let fd = file.detach_descriptor().unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_at(b"changed", 4096)
            .unwrap();
        let again = file.attach_descriptor(fd, false).unwrap();
        assert!(
            again.changed && again.dropped_pages > 0,
            "{engine:?}: {again:?}"
        );
        assert_eq!(read(&file, 4096, 7).unwrap(), b"changed");
    }
}

#[test]
fn a_refused_descriptor_comes_back_unclosed() {
    let path = test_file("descriptor-refused", 8192);
    let other = test_file("descriptor-refused-other", 8192);
    let cache = cache(EngineKind::Auto);
    let file = cache
        .open_descriptor(open(&path, false, libc::O_RDONLY), OpenOptions::new())
        .unwrap();
    let fd = file.detach_descriptor().unwrap();
    // Another file's descriptor.
    let wrong = open(&other, false, libc::O_RDONLY);
    let raw = wrong.as_raw_fd();
    let refused = file.attach_descriptor(wrong, false).unwrap_err();
    assert!(
        matches!(refused.error, Error::OpenConflict { .. }),
        "{refused}"
    );
    assert_eq!(refused.fd.as_raw_fd(), raw);
    assert!(is_open(raw));
    // Read-only, but lent for writing.
    let raw = fd.as_raw_fd();
    let refused = file.attach_descriptor(fd, true).unwrap_err();
    assert_eq!(refused.fd.as_raw_fd(), raw);
    assert!(is_open(raw));
    // The cache has the file open already.
    let twice = cache
        .open_descriptor(open(&path, false, libc::O_RDONLY), OpenOptions::new())
        .unwrap_err();
    assert!(matches!(twice.error, Error::OpenConflict { .. }));
    assert!(is_open(twice.fd.as_raw_fd()));
}

#[test]
fn a_buffered_descriptor_writes_where_the_cache_says_even_with_o_append() {
    for engine in engines() {
        let path = test_file(&format!("descriptor-append-{engine:?}"), 64 << 10);
        let cache = cache(engine);
        let fd = open(&path, true, libc::O_RDWR | libc::O_APPEND);
        let file = cache
            .open_descriptor(fd, OpenOptions::new().write(true))
            .unwrap();
        let description = file.backend_description().unwrap();
        assert!(
            description.starts_with("buffered"),
            "{engine:?}: {description}"
        );
        file.write_at(b"middle", 1000).unwrap();
        file.write_at(&[7u8; 8192], 20_000).unwrap();
        file.sync_all().unwrap();
        let on_storage = std::fs::read(&path).unwrap();
        let mut expected = pattern(64 << 10);
        expected[1000..1006].copy_from_slice(b"middle");
        expected[20_000..28_192].fill(7);
        assert!(
            on_storage == expected,
            "{engine:?}: the writes did not land where the cache put them"
        );
        // Dirty data keeps the descriptor lent.
        file.write_at(b"x", 5).unwrap();
        assert!(matches!(
            file.detach_descriptor(),
            Err(Error::StillDirty { .. })
        ));
        file.sync_all().unwrap();
        assert!(file.detach_descriptor().is_ok());
    }
}

#[test]
fn a_write_only_descriptor_writes_around_pages_it_cannot_read() {
    for engine in engines() {
        let size = 40_000u64;
        let path = test_file(&format!("descriptor-wronly-{engine:?}"), size);
        let cache = cache(engine);
        let fd = open(&path, true, libc::O_WRONLY);
        let file = cache
            .open_descriptor(fd, OpenOptions::new().write(true))
            .unwrap();
        // Part of a page inside the file (its other bytes cannot be read), whole pages, part of
        // a page past the end (zeros), and an append.
        file.write_at(b"inside", 5000).unwrap();
        file.write_at(&[1u8; 8192], 8192).unwrap();
        file.write_at(b"tail", size + 100).unwrap();
        file.sync_all().unwrap();
        let mut expected = pattern(size);
        expected[5000..5006].copy_from_slice(b"inside");
        expected[8192..16_384].fill(1);
        expected.resize(size as usize + 100, 0);
        expected.extend_from_slice(b"tail");
        let on_storage = std::fs::read(&path).unwrap();
        assert_eq!(on_storage.len(), expected.len(), "{engine:?}");
        if let Some(at) = (0..expected.len()).find(|&i| on_storage[i] != expected[i]) {
            panic!("{engine:?}: storage differs at byte {at}");
        }
    }
}

#[test]
fn bytes_written_outside_the_cache_are_dropped_from_it() {
    let size = 4 << 20;
    let path = test_file("descriptor-outside", size);
    let cache = cache(EngineKind::Auto);
    let file = cache
        .open_descriptor(
            open(&path, false, libc::O_RDONLY | libc::O_DIRECT),
            OpenOptions::new(),
        )
        .unwrap();
    assert_eq!(read(&file, 0, size as usize).unwrap(), pattern(size));
    let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // Inside, then growing the file.
    writer.write_at(b"new bytes", 3 << 20).unwrap();
    file.written_outside(3 << 20, 9);
    assert_eq!(read(&file, 3 << 20, 9).unwrap(), b"new bytes");
    writer.write_at(b"grown", size).unwrap();
    file.written_outside(size, 5);
    assert_eq!(file.size(), size + 5);
    assert_eq!(read(&file, size, 5).unwrap(), b"grown");
    // A truncation: what the cache held past it goes, the size follows.
    writer.set_len(1000).unwrap();
    let changed = file.changed_outside().unwrap();
    assert!(changed.changed);
    assert_eq!(file.size(), 1000);
    assert_eq!(read(&file, 0, 4096).unwrap(), pattern(size)[..1000]);
    assert!(
        file.mapping_stats().cached_pages <= 1,
        "pages past the truncation stayed"
    );
}

#[test]
fn a_tmpfs_descriptor_is_refused_and_comes_back() {
    let dir = Path::new("/dev/shm");
    if !dir.is_dir() {
        common::skip("no /dev/shm");
        return;
    }
    let path = dir.join(format!("foliocache-descriptor-{}", std::process::id()));
    std::fs::write(&path, b"tmpfs").unwrap();
    let cache = cache(EngineKind::Auto);
    let fd = open(&path, false, libc::O_RDONLY);
    let raw = fd.as_raw_fd();
    let refused = cache.open_descriptor(fd, OpenOptions::new()).unwrap_err();
    assert!(
        matches!(refused.error, Error::NoDirectIo { .. }),
        "{refused}"
    );
    assert_eq!(refused.fd.as_raw_fd(), raw);
    let _ = std::fs::remove_file(&path);
}
