//! Faults in the I/O engines, on real files with O_DIRECT, through io_uring and through the
//! thread pool: transfers cut short (aligned and not), device errors, panics while completing,
//! and requests of more than 1024 vectors. Readers get the file's bytes or an error, never
//! wrong bytes, and nothing hangs (every case runs under a deadline).

mod common;

use common::{byte_at, per_engine, test_file, with_deadline};
use foliocache::{Cache, EngineKind, Error, File, raw};
use std::time::Duration;

const SIZE: u64 = 3 * (1 << 20) + 5000;
const DEADLINE: Duration = Duration::from_secs(60);

fn cache(kind: EngineKind) -> Cache {
    Cache::builder()
        .capacity(16 << 20)
        .readahead_bytes(256 << 10)
        .io_engine(kind)
        .build()
        .unwrap()
}

/// Reads the whole file in `chunk`-byte reads; an I/O error is retried (at most `retries` in
/// all). Checks every byte.
fn read_checked(file: &File, chunk: usize, retries: u32) -> u32 {
    assert!(file.size() == SIZE);
    let mut handle = file.handle();
    let mut buf = vec![0u8; chunk];
    let mut pos = 0u64;
    let mut errors = 0;
    loop {
        match handle.read_at(&mut buf, pos) {
            Ok(0) => break,
            Ok(n) => {
                for (k, &b) in buf[..n].iter().enumerate() {
                    assert_eq!(b, byte_at(pos + k as u64), "byte {}", pos + k as u64);
                }
                pos += n as u64;
            }
            Err(Error::Io { offset, .. }) => {
                errors += 1;
                assert!(errors <= retries, "more I/O errors than faults injected");
                assert!(offset >= pos, "an error before the read's start");
                // The bytes before `offset` were read: keep them, go on from there.
                let got = (offset - pos) as usize;
                for (k, &b) in buf[..got].iter().enumerate() {
                    assert_eq!(b, byte_at(pos + k as u64), "byte {}", pos + k as u64);
                }
                pos = offset;
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(pos, SIZE);
    errors
}

#[test]
fn transfers_cut_short_are_continued() {
    let path = test_file("engine-faults-short", SIZE);
    for (kind, cache, file) in per_engine(cache, &path) {
        // 64 KiB (block aligned) and 1000 bytes (not: the engine restarts at the block
        // boundary below it, as O_DIRECT requires).
        for short in [64 << 10, 1000] {
            file.drop_cached(0, 0);
            raw::injector(&cache).short_transfers(20, short);
            let file = file.clone();
            let errors = with_deadline(DEADLINE, "short transfers", move || {
                read_checked(&file, 8192, 0)
            });
            assert_eq!(errors, 0, "{kind:?}, {short}");
        }
        assert_eq!(file.io_stats().errors, 0, "{kind:?}: no error was reported");
    }
}

#[test]
fn device_errors_reach_the_reader_and_a_retry_reads() {
    let path = test_file("engine-faults-eio", SIZE);
    for (kind, cache, file) in per_engine(cache, &path) {
        raw::injector(&cache).io_errors(3);
        let reader = file.clone();
        let errors = with_deadline(DEADLINE, "io errors", move || {
            read_checked(&reader, 100_000, 3)
        });
        assert!(errors >= 1, "{kind:?}: an injected EIO must reach a reader");
        assert!(file.io_stats().errors >= 1, "{kind:?}");
    }
}

#[test]
fn a_panic_while_completing_fails_that_request_and_the_engine_goes_on() {
    common::quiet_injected_panics();
    let path = test_file("engine-faults-panic", SIZE);
    for (kind, cache, file) in per_engine(cache, &path) {
        // Each panic happens after the first folio of its request was ended: the rest of
        // that request fails, readers retry them.
        raw::injector(&cache).completion_panics(4);
        let reader = file.clone();
        with_deadline(DEADLINE, "completion panics", move || {
            read_checked(&reader, 65_536, 4)
        });
        // The engine still serves: a cold reread, no fault armed.
        file.drop_cached(0, 0);
        let reader = file.clone();
        let errors = with_deadline(DEADLINE, "after panics", move || {
            read_checked(&reader, 65_536, 0)
        });
        assert_eq!(errors, 0, "{kind:?}");
    }
}

#[test]
fn requests_of_more_than_1024_vectors_read_whole() {
    const BIG: u64 = 16 << 20;
    let path = test_file("engine-faults-iovecs", BIG);
    // 4 KiB folios in small pages (each its own vector), 64 MiB requests and an 8 MiB window:
    // a request would hold 2048 vectors; readv takes at most 1024.
    let build = |kind| {
        Cache::builder()
            .capacity(32 << 20)
            .huge_pages(false)
            .max_order(0)
            .readahead_bytes(8 << 20)
            .io_request_bytes(64 << 20)
            .io_engine(kind)
            .build()
            .unwrap()
    };
    for (kind, _cache, file) in per_engine(build, &path) {
        let reader = file.clone();
        let read = with_deadline(DEADLINE, "1024 vectors", move || {
            let mut handle = reader.handle();
            let mut buf = vec![0u8; 1 << 20];
            let mut pos = 0u64;
            while pos < BIG {
                let n = handle.read_at(&mut buf, pos).unwrap();
                assert!(n > 0);
                for (k, &b) in buf[..n].iter().enumerate() {
                    assert_eq!(b, byte_at(pos + k as u64));
                }
                pos += n as u64;
            }
            pos
        });
        assert_eq!(read, BIG);
        assert_eq!(file.io_stats().errors, 0, "{kind:?}");
    }
}
