//! Failures of a real SeaweedFS cluster under a reader: a volume server killed during a scan,
//! the S3 gateway stopped and started. This binary's cluster is its own (its tests break it),
//! and its tests run one at a time.

mod common;

use common::{Role, cache, cluster, pattern, skip};
use foliocache_object::{ObjectCache, ObjectFile, ObjectOptions};
use object_store::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// One test at a time: each breaks the cluster and mends it.
static SERIAL: Mutex<()> = Mutex::new(());

fn open(
    cache: &foliocache::Cache,
    store: &Arc<dyn object_store::ObjectStore>,
    key: &str,
    options: &ObjectOptions,
) -> ObjectFile {
    cache
        .open_object_in(Arc::clone(store), &Path::from(key), options)
        .unwrap()
}

#[test]
fn a_volume_server_killed_during_a_scan_never_gives_wrong_bytes() {
    if skip() {
        return;
    }
    let _one = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let c = cluster();
    let store = c.store("volumes").unwrap();
    let bytes = pattern(21, 48 * MIB + 99);
    common::put(&store, "scan", bytes.clone());
    let cache = cache(256 << 20);
    let options = ObjectOptions {
        deadline: Duration::from_secs(10),
        readahead_bytes: 2 << 20,
        get_bytes: 1 << 20,
        ..ObjectOptions::default()
    };
    let file = open(&cache, &store, "scan", &options);
    let mut handle = file.handle();
    let mut buf = vec![0u8; 256 << 10];
    let mut pos = 0u64;
    let mut errors = Vec::new();
    let mut killed = false;
    while (pos as usize) < bytes.len() {
        if !killed && pos as usize >= bytes.len() / 4 {
            c.kill(Role::Volume(0));
            killed = true;
        }
        match handle.read_at(&mut buf, pos) {
            Ok(n) => {
                assert!(n > 0, "a short read at {pos} before the end");
                assert!(
                    buf[..n] == bytes[pos as usize..pos as usize + n],
                    "wrong bytes at {pos} after a volume server died"
                );
                pos += n as u64;
            }
            Err(error) => {
                // A clear error is allowed; the same range is read again (a failed read is
                // retried by the next one), a bounded number of times.
                assert!(matches!(error, foliocache::Error::Io { .. }), "{error}");
                errors.push(format!("{pos}: {error}: {:?}", file.backend().last_error()));
                assert!(errors.len() < 20, "the scan keeps failing: {errors:#?}");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    eprintln!(
        "volume killed at a quarter of the scan: {} failed reads, stats {:?}",
        errors.len(),
        file.backend().stats()
    );
    // Mend the cluster for the next test.
    c.launch(Role::Volume(0)).unwrap();
}

#[test]
fn the_gateway_stopped_and_started_during_reads_errors_by_the_deadline_then_serves_again() {
    if skip() {
        return;
    }
    let _one = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let c = cluster();
    let store = c.store("gateway").unwrap();
    let bytes = Arc::new(pattern(23, 12 * MIB));
    common::put(&store, "obj", bytes.to_vec());
    let cache = cache(128 << 20);
    let short = ObjectOptions {
        deadline: Duration::from_secs(2),
        request_timeout: Duration::from_secs(1),
        readahead_bytes: 1 << 20,
        ..ObjectOptions::default()
    };
    // A reader with a long deadline and many retries, opened (one HEAD) before the outage.
    let patient = ObjectOptions {
        deadline: Duration::from_secs(40),
        store_retries: 12,
        request_timeout: Duration::from_secs(2),
        readahead_bytes: 1 << 20,
        ..ObjectOptions::default()
    };
    let file = open(&cache, &store, "obj", &short);
    let patient_file = open(&cache, &store, "obj", &patient);
    let mut handle = file.handle();
    let mut buf = vec![0u8; 1 << 20];
    assert_eq!(handle.read_at(&mut buf, 0).unwrap(), buf.len());

    c.kill(Role::Gateway);
    // What is cached is served while the store is away.
    let mut again = file.handle();
    assert_eq!(again.read_at(&mut buf, 0).unwrap(), buf.len());
    assert!(buf[..] == bytes[..buf.len()]);
    // A miss fails with an I/O error, and within two deadlines (the window's GET, then the
    // reader's own folio, as the kernel retries a failed readahead with `read_folio`), plus
    // scheduling: never a hang.
    let started = Instant::now();
    let far = 8 * MIB as u64;
    let error = handle.read_at(&mut buf, far).unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(error, foliocache::Error::Io { .. }), "{error}");
    assert!(
        waited < short.deadline * 2 + Duration::from_secs(2),
        "the failed read took {waited:?}"
    );
    eprintln!(
        "gateway down: the miss failed after {waited:?}: {:?}",
        file.backend().last_error()
    );

    // The patient reader's one read, started while the gateway is down, gets its bytes once
    // the gateway is back: the client's retries carry it over the outage.
    let reader = {
        let bytes = Arc::clone(&bytes);
        std::thread::spawn(move || {
            let mut handle = patient_file.handle();
            let mut buf = vec![0u8; 1 << 20];
            let started = Instant::now();
            let n = handle
                .read_at(&mut buf, 10 * MIB as u64)
                .unwrap_or_else(|error| {
                    panic!("{error}: {:?}", patient_file.backend().last_error())
                });
            assert_eq!(n, buf.len());
            assert!(buf[..] == bytes[10 * MIB..11 * MIB]);
            (started.elapsed(), patient_file.backend().stats())
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    c.launch(Role::Gateway).unwrap();
    c.wait_for_gateway().unwrap();
    let (took, stats) = reader.join().unwrap();
    eprintln!("gateway back: the waiting reader got its bytes after {took:?} ({stats:?})");
    // And the range that failed reads correctly now (a failed read is tried again).
    assert_eq!(handle.read_at(&mut buf, far).unwrap(), buf.len());
    assert!(buf[..] == bytes[far as usize..far as usize + buf.len()]);
}
