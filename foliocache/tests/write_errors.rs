//! Writeback errors, injected at chosen writes (EIO, ENOSPC, short writes), on real files
//! through each engine: the kernel's errseq reporting per handle, and what happens to the data
//! under each `WritebackErrorPolicy`.

mod common;

use common::{per_engine, test_file};
use foliocache::{
    Cache, EngineKind, Error, File, OpenOptions, PageState, Policy, WritebackErrorPolicy, raw,
};
use std::path::{Path, PathBuf};

fn cache(kind: EngineKind, policy: WritebackErrorPolicy) -> Cache {
    Cache::builder()
        .capacity(8 << 20)
        .io_engine(kind)
        .policy(Policy {
            writeback_error: policy,
            ..Policy::default()
        })
        .build()
        .unwrap()
}

fn fresh(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, vec![b'o'; 20_000]).unwrap();
    path
}

fn open(cache: &Cache, path: &Path) -> File {
    cache
        .open_with(path, OpenOptions::new().write(true))
        .unwrap()
}

fn writeback_errno(result: Result<(), Error>) -> Option<i32> {
    match result {
        Ok(()) => None,
        Err(Error::Writeback { source }) => source.raw_os_error(),
        Err(other) => panic!("not a writeback error: {other}"),
    }
}

/// The engines that run here (a probe file decides, as for the other disk tests).
fn engines() -> Vec<EngineKind> {
    let probe = test_file("write-errors-probe", 4096);
    per_engine(|kind| cache(kind, WritebackErrorPolicy::KeepDirty), &probe)
        .into_iter()
        .map(|(kind, _, _)| kind)
        .collect()
}

#[test]
fn an_error_is_reported_once_to_every_handle_open_when_it_happened() {
    for kind in engines() {
        let path = fresh("errseq-handles");
        let cache = cache(kind, WritebackErrorPolicy::KeepDirty);
        let file = open(&cache, &path);
        let (mut a, mut b) = (file.handle(), file.handle());
        a.write_at(b"new bytes", 100).unwrap();
        raw::injector(&cache).io_errors(1);
        assert_eq!(
            writeback_errno(a.sync_all()),
            Some(libc::EIO),
            "{kind:?}: a"
        );
        // Opened after the error was seen by `a`: never told.
        let mut d = file.handle();
        assert_eq!(
            writeback_errno(b.sync_all()),
            Some(libc::EIO),
            "{kind:?}: b, once"
        );
        assert_eq!(
            writeback_errno(b.sync_all()),
            None,
            "{kind:?}: b, not twice"
        );
        assert_eq!(
            writeback_errno(a.sync_all()),
            None,
            "{kind:?}: a, not twice"
        );
        assert_eq!(
            writeback_errno(d.sync_all()),
            None,
            "{kind:?}: d opened later"
        );
        // A second error: everyone open is told once more.
        a.write_at(b"more", 5000).unwrap();
        raw::injector(&cache).nospace_errors(1);
        assert_eq!(
            writeback_errno(d.sync_all()),
            Some(libc::ENOSPC),
            "{kind:?}: d"
        );
        assert_eq!(
            writeback_errno(a.sync_all()),
            Some(libc::ENOSPC),
            "{kind:?}: a"
        );
        assert_eq!(
            writeback_errno(b.sync_all()),
            Some(libc::ENOSPC),
            "{kind:?}: b"
        );
        assert_eq!(writeback_errno(a.sync_all()), None);
    }
}

#[test]
fn an_error_nobody_saw_reaches_a_handle_opened_later() {
    for kind in engines() {
        let path = fresh("errseq-unseen");
        let cache = cache(kind, WritebackErrorPolicy::KeepDirty);
        let file = open(&cache, &path);
        let mut writer = file.handle();
        writer.write_at(&[9; 100], 0).unwrap();
        let injector = raw::injector(&cache);
        let fired = injector.fired();
        injector.io_errors(1);
        // The flusher writes the dirty data in the background; nobody looks at the outcome.
        file.drop_cached(0, 0);
        let start = std::time::Instant::now();
        while injector.fired() == fired || file.mapping_stats().writeback_pages > 0 {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(20),
                "{kind:?}: writeback never ran"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        // Unseen: a handle created now is told (the kernel's rule since 4.17), once.
        let mut newcomer = file.handle();
        assert_eq!(
            writeback_errno(newcomer.sync_all()),
            Some(libc::EIO),
            "{kind:?}: an unseen error reaches a later opener"
        );
        assert_eq!(writeback_errno(newcomer.sync_all()), None);
        // Seen now: a handle created after that is not told.
        let mut last = file.handle();
        assert_eq!(writeback_errno(last.sync_all()), None, "{kind:?}");
        // And the writer, open when it happened, is told too.
        assert_eq!(
            writeback_errno(writer.sync_all()),
            Some(libc::EIO),
            "{kind:?}"
        );
        assert_eq!(
            &std::fs::read(&path).unwrap()[..100],
            &[9; 100],
            "{kind:?}: kept, retried"
        );
    }
}

#[test]
fn keep_dirty_keeps_the_data_and_the_next_sync_writes_it() {
    for kind in engines() {
        let path = fresh("errseq-keep");
        let cache = cache(kind, WritebackErrorPolicy::KeepDirty);
        let file = open(&cache, &path);
        let mut handle = file.handle();
        handle.write_at(b"precious", 4096).unwrap();
        raw::injector(&cache).io_errors(1);
        assert!(handle.sync_all().is_err());
        assert!(
            file.cached_ranges()
                .iter()
                .any(|r| r.state == PageState::Dirty),
            "{kind:?}: the data stays dirty"
        );
        assert_ne!(&std::fs::read(&path).unwrap()[4096..4104], b"precious");
        // The next sync tries again, and this time storage takes it.
        handle.sync_all().unwrap();
        assert_eq!(
            &std::fs::read(&path).unwrap()[4096..4104],
            b"precious",
            "{kind:?}"
        );
        assert!(
            file.cached_ranges()
                .iter()
                .all(|r| r.state == PageState::Uptodate)
        );
    }
}

#[test]
fn discard_is_the_kernels_behaviour_clean_and_lost() {
    for kind in engines() {
        let path = fresh("errseq-discard");
        let cache = cache(kind, WritebackErrorPolicy::Discard);
        let file = open(&cache, &path);
        let mut handle = file.handle();
        handle.write_at(b"doomed", 4096).unwrap();
        raw::injector(&cache).io_errors(1);
        assert_eq!(writeback_errno(handle.sync_all()), Some(libc::EIO));
        // Clean, not retried: the second sync says Ok although storage never got the data.
        assert!(
            file.cached_ranges()
                .iter()
                .all(|r| r.state == PageState::Uptodate),
            "{kind:?}"
        );
        assert_eq!(writeback_errno(handle.sync_all()), None);
        assert_ne!(
            &std::fs::read(&path).unwrap()[4096..4102],
            b"doomed",
            "{kind:?}"
        );
        // The cache still serves the new bytes until the page is dropped ...
        let mut buf = [0u8; 6];
        handle.read_at(&mut buf, 4096).unwrap();
        assert_eq!(&buf, b"doomed");
        // ... after which storage's old bytes come back (what fsyncgate was about).
        file.drop_cached(0, 0);
        handle.read_at(&mut buf, 4096).unwrap();
        assert_eq!(&buf, b"oooooo", "{kind:?}");
    }
}

#[test]
fn short_writes_are_continued_not_failed() {
    for kind in engines() {
        let path = fresh("errseq-short");
        let cache = cache(kind, WritebackErrorPolicy::KeepDirty);
        let file = open(&cache, &path);
        let mut handle = file.handle();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        handle.write_at(&data, 12_345).unwrap();
        raw::injector(&cache).short_transfers(8, 4096 + 1000);
        handle.sync_all().unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk.len(), 312_345, "{kind:?}");
        assert_eq!(&on_disk[12_345..], &data[..], "{kind:?}");
    }
}
