//! The C API from C: the checked-in header is what cbindgen makes of the sources today, and the
//! example programs compile with gcc and work: `examples/cat.c` prints files byte for byte,
//! `examples/append.c` writes a log with syncs and a truncation that storage then holds.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A missing tool fails the test, unless `FOLIOCACHE_ALLOW_SKIP=1` (then it says so and skips).
fn missing(what: &str) {
    if std::env::var("FOLIOCACHE_ALLOW_SKIP").as_deref() == Ok("1") {
        eprintln!("SKIPPED: {what} (FOLIOCACHE_ALLOW_SKIP=1)");
    } else {
        panic!("{what}; install it (`bash scripts/test` does) or set FOLIOCACHE_ALLOW_SKIP=1");
    }
}

/// The header as cbindgen (the library, pinned as a dev-dependency: no tool to install) makes
/// it from the sources and `cbindgen.toml` today. `FOLIOCACHE_WRITE_HEADER=1` writes it over
/// the checked-in one.
#[test]
fn checked_in_header_is_current() {
    let config =
        cbindgen::Config::from_file(crate_dir().join("cbindgen.toml")).expect("read cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir())
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("a UTF-8 header");
    let path = crate_dir().join("include/foliocache.h");
    if std::env::var("FOLIOCACHE_WRITE_HEADER").as_deref() == Ok("1") {
        std::fs::write(&path, &fresh).expect("write include/foliocache.h");
    }
    let checked_in = std::fs::read_to_string(&path).expect("header");
    assert!(
        fresh == checked_in,
        "include/foliocache.h is stale: run `FOLIOCACHE_WRITE_HEADER=1 cargo test -p \
         foliocache-capi --test c_api checked_in_header_is_current`"
    );
}

/// The directory holding this test's build of the library (target/<profile>).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// `cargo test` builds the library as an rlib only: build the shared library of the same
/// profile into the same target directory.
fn build_cdylib(lib_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--quiet", "-p", "foliocache-capi", "--target-dir"])
        .arg(lib_dir.parent().expect("target directory"));
    match lib_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") => {}
        Some("release") => {
            command.arg("--release");
        }
        Some(profile) => {
            command.args(["--profile", profile]);
        }
        None => panic!("unexpected target layout {}", lib_dir.display()),
    }
    let status = command.status().expect("run cargo build");
    assert!(status.success(), "cargo build -p foliocache-capi failed");
}

#[test]
fn c_example_prints_files_byte_for_byte() {
    let lib_dir = profile_dir();
    build_cdylib(&lib_dir);
    assert!(
        lib_dir.join("libfoliocache_capi.so").exists(),
        "libfoliocache_capi.so not built in {}",
        lib_dir.display()
    );
    let Some((work, exe)) = compile_example("cat", &lib_dir) else {
        return;
    };

    let mut files = Vec::new();
    let mut expected = Vec::new();
    for (name, size) in [
        ("empty", 0usize),
        ("small", 1),
        ("page", 4096),
        ("odd", 3 * (1 << 20) + 123),
    ] {
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
        let path = work.join(name);
        std::fs::write(&path, &data).unwrap();
        expected.extend_from_slice(&data);
        files.push(path);
    }
    let out = Command::new(&exe)
        .args(&files)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .output()
        .expect("run fc-cat");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fc-cat failed: {stderr}");
    assert!(
        out.stdout == expected,
        "fc-cat's output differs from the files"
    );
    assert!(stderr.contains("read from the device"), "{stderr}");

    // A missing file: a clear message and a failing exit status, no crash.
    let out = Command::new(&exe)
        .arg(work.join("missing"))
        .env("LD_LIBRARY_PATH", &lib_dir)
        .output()
        .expect("run fc-cat");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No such file"), "{stderr}");
    let _ = std::fs::remove_dir_all(&work);
}

/// Compiles `examples/NAME.c` against the library in `lib_dir`, in a fresh work directory on
/// the checkout's file system (the system temporary directory may be tmpfs, which has no
/// direct I/O). `None`: gcc is missing (and skipping is allowed).
fn compile_example(name: &str, lib_dir: &Path) -> Option<(PathBuf, PathBuf)> {
    if Command::new("gcc").arg("--version").output().is_err() {
        missing("gcc not found");
        return None;
    }
    let work = lib_dir.join(format!("capi-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let exe = work.join(format!("fc-{name}"));
    let status = Command::new("gcc")
        .args(["-Wall", "-Wextra", "-Werror", "-O2", "-I"])
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join(format!("examples/{name}.c")))
        .arg("-L")
        .arg(lib_dir)
        .args(["-lfoliocache_capi", "-o"])
        .arg(&exe)
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc failed to compile examples/{name}.c");
    Some((work, exe))
}

/// Record `k` of `examples/append.c`.
fn record(k: u64) -> Vec<u8> {
    let mut out = format!("record {k:08} ").into_bytes();
    for i in 0..k % 200 {
        out.push(b'a' + ((k + i) % 26) as u8);
    }
    out.push(b'\n');
    out
}

#[test]
fn c_example_writes_a_log_that_storage_holds_byte_for_byte() {
    let lib_dir = profile_dir();
    build_cdylib(&lib_dir);
    let Some((work, exe)) = compile_example("append", &lib_dir) else {
        return;
    };
    let log = work.join("log");
    // Something to truncate: the example opens with create and truncate.
    std::fs::write(&log, vec![b'x'; 3 << 20]).unwrap();
    let records = 20_000u64;
    let out = Command::new(&exe)
        .arg(&log)
        .arg(records.to_string())
        .env("LD_LIBRARY_PATH", &lib_dir)
        .output()
        .expect("run fc-append");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fc-append failed: {stderr}");
    let expected: Vec<u8> = (0..records).flat_map(record).collect();
    let on_disk = std::fs::read(&log).unwrap();
    assert_eq!(on_disk.len(), expected.len(), "the log's size on storage");
    assert!(on_disk == expected, "the log on storage differs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("{} bytes in {records} records", expected.len())),
        "{stdout}"
    );
    // Bad arguments: usage and status 2.
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .output()
        .expect("run fc-append");
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&work);
}
