//! `Handle::read_at_nowait`: never waits for storage, starts what a blocking read would, and
//! reports a failed read it waited for instead of starting it forever.

use foliocache::{Backend, Cache, Error, ReadRequest};
use std::sync::{Arc, Mutex};

/// A backend whose requests wait until the test completes them.
#[derive(Debug, Default)]
struct Held {
    size: u64,
    pending: Mutex<Vec<ReadRequest>>,
}

impl Backend for Held {
    fn size(&self) -> u64 {
        self.size
    }
    fn submit(&self, requests: Vec<ReadRequest>) {
        self.pending.lock().unwrap().extend(requests);
    }
}

impl Held {
    /// Completes every pending request: with the byte pattern, or as failed.
    fn complete_all(&self, ok: bool) -> usize {
        let pending: Vec<ReadRequest> = std::mem::take(&mut *self.pending.lock().unwrap());
        let n = pending.len();
        for mut request in pending {
            if ok {
                let len = request.len();
                for (offset, bytes) in request.targets() {
                    for (i, b) in bytes.iter_mut().enumerate() {
                        *b = byte_at(offset + i as u64);
                    }
                }
                request.complete(Ok(len));
            } else {
                request.complete(Err(std::io::Error::from_raw_os_error(libc::EIO)));
            }
        }
        n
    }
}

fn byte_at(pos: u64) -> u8 {
    (pos % 251) as u8
}

fn setup() -> (Cache, Arc<Held>, foliocache::File) {
    let cache = Cache::builder().capacity(16 << 20).build().unwrap();
    let held = Arc::new(Held {
        size: 1 << 20,
        ..Held::default()
    });
    let file = cache
        .open_backend(Arc::clone(&held) as Arc<dyn Backend>, None)
        .unwrap();
    (cache, held, file)
}

#[test]
fn a_miss_starts_the_reads_and_says_would_block_then_the_bytes_come() {
    let (_cache, held, file) = setup();
    let mut handle = file.handle();
    let mut buf = vec![0u8; 10_000];
    match handle.read_at_nowait(&mut buf, 5000, true) {
        Err(Error::WouldBlock { offset }) => assert_eq!(offset, 5000),
        other => panic!("expected WouldBlock, got {other:?}"),
    }
    // It started readahead, as a blocking read would, and did not wait for it.
    assert!(!held.pending.lock().unwrap().is_empty());
    // Asked again before the reads end: still nothing to copy, and no second read started.
    let before = held.pending.lock().unwrap().len();
    assert!(matches!(
        handle.read_at_nowait(&mut buf, 5000, false),
        Err(Error::WouldBlock { offset: 5000 })
    ));
    assert_eq!(held.pending.lock().unwrap().len(), before);
    held.complete_all(true);
    let n = handle.read_at_nowait(&mut buf, 5000, false).unwrap();
    assert_eq!(n, buf.len());
    assert!(
        buf.iter()
            .enumerate()
            .all(|(i, &b)| b == byte_at(5000 + i as u64))
    );
}

#[test]
fn a_failed_read_waited_for_is_reported_and_a_new_try_starts_it_again() {
    let (_cache, held, file) = setup();
    let mut handle = file.handle();
    handle.set_ra_bytes(0); // one folio per read: the one asked for
    let mut buf = vec![0u8; 100];
    assert!(matches!(
        handle.read_at_nowait(&mut buf, 0, true),
        Err(Error::WouldBlock { offset: 0 })
    ));
    assert_eq!(held.complete_all(false), 1);
    // The caller waited for that read: its failure is the answer.
    assert!(matches!(
        handle.read_at_nowait(&mut buf, 0, false),
        Err(Error::Io { offset: 0, .. })
    ));
    assert!(
        held.pending.lock().unwrap().is_empty(),
        "a failed read was started again"
    );
    // A new read tries the device again.
    assert!(matches!(
        handle.read_at_nowait(&mut buf, 0, true),
        Err(Error::WouldBlock { offset: 0 })
    ));
    assert_eq!(held.complete_all(true), 1);
    assert_eq!(handle.read_at_nowait(&mut buf, 0, false).unwrap(), 100);
    assert!(buf.iter().enumerate().all(|(i, &b)| b == byte_at(i as u64)));
}

#[test]
fn cached_bytes_before_a_miss_are_copied_and_the_offset_says_where_it_stopped() {
    let (_cache, held, file) = setup();
    let mut handle = file.handle();
    handle.set_ra_bytes(0);
    let mut buf = vec![0u8; 4096];
    assert!(handle.read_at_nowait(&mut buf, 0, true).is_err());
    held.complete_all(true);
    let mut two = vec![0u8; 8192];
    match handle.read_at_nowait(&mut two, 0, true) {
        Err(Error::WouldBlock { offset }) => assert_eq!(offset, 4096),
        other => panic!("expected WouldBlock at 4096, got {other:?}"),
    }
    assert!(
        two[..4096]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == byte_at(i as u64))
    );
    held.complete_all(true);
}
