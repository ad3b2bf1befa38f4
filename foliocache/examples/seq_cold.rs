//! Cold sequential reads for profiling (readseq's `foliocache/large-folios` or `batched` and
//! `kernel` systems, without the benchmark around them):
//! `cargo run --release --example seq_cold -- <cache|kernel> <dir> <passes> [max order]
//! [record bytes] [readahead KiB]`. Two threads each read their own 256 MiB file in `dir` (made on first use)
//! in 8 KiB records (or the size given),
//! from a cold cache every pass (foliocache's emptied, the kernel's dropped with
//! `POSIX_FADV_DONTNEED` and guest memory warmed for it, as readseq does); prints the process's
//! CPU seconds per GiB read over the passes, and per pass its rate and how busy the device was
//! (`io_ticks` and `time_in_queue` of the disk's `stat` in sysfs: the share of the pass with a
//! request in flight, and the mean number in flight).
//! Under `perf record -e cpu-clock`, the main thread is the setup (the arena's prefault) and the
//! emptying between passes (whose deferred frees it also runs before each pass, as readseq
//! does): leave it out (`perf report --tid`) to see the passes alone.
//! `SEQ_COLD_REQUEST_KIB` sets the cache's request size (512 KiB when unset);
//! `SEQ_COLD_MARKS` prints each pass's start and end (`CLOCK_MONOTONIC`, ns), for
//! `scripts/disk-gaps`, which samples the disk's in-flight count alongside.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

const FILE: u64 = 256 << 20;
/// The record size when none is given.
const RECORD: usize = 8192;

/// The disk's `stat` fields 10 and 11 (`io_ticks`, `time_in_queue`, in ms) for the device
/// holding `path`, when sysfs tells.
fn disk_ticks(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let stat = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat"))
        .or_else(|_| std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/../stat")))
        .ok()?;
    let fields: Vec<u64> = stat
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    Some((*fields.get(9)?, *fields.get(10)?))
}

fn cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// As readseq does before a kernel pass: this VM hands idle free memory back to its host, and
/// the page cache's first touch of it afterwards is slow. Written in huge pages and freed, the
/// memory returns to the kernel's free lists just before the pass.
fn warm_guest_memory(bytes: usize) {
    let len = bytes.next_multiple_of(2 << 20);
    // SAFETY: a fresh private anonymous mapping of `len` bytes, written and unmapped here and
    // used by nothing else.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(map, libc::MAP_FAILED, "map memory to warm");
        libc::madvise(map, len, libc::MADV_HUGEPAGE);
        std::ptr::write_bytes(map.cast::<u8>(), 1, len);
        libc::munmap(map, len);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: seq_cold <cache|kernel> <dir> <passes> [max order 0..=9] [record bytes] \
                 [readahead KiB]";
    let (Some(mode), Some(dir), Some(Ok(passes))) = (
        args.get(1).cloned(),
        args.get(2).map(PathBuf::from),
        args.get(3).map(|p| p.parse::<usize>()),
    ) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    if mode != "cache" && mode != "kernel" {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let order: u8 = match args.get(4).map(|o| o.parse()) {
        None => 0,
        Some(Ok(order)) => order,
        Some(Err(_)) => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let record: usize = match args.get(5).map(|r| r.parse::<usize>()) {
        None => RECORD,
        Some(Ok(record)) if record > 0 && FILE.is_multiple_of(record as u64) => record,
        Some(_) => {
            eprintln!("{usage} (the record size must divide 256 MiB)");
            std::process::exit(2);
        }
    };
    let readahead_kb: u64 = match args.get(6).map(|r| r.parse::<u64>()) {
        None => 2048,
        Some(Ok(kb)) if kb > 0 => kb,
        Some(_) => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let paths: Vec<PathBuf> = (0..2).map(|t| dir.join(format!("seq-cold-{t}"))).collect();
    for path in &paths {
        if std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) != FILE {
            let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 3) as u8).collect();
            let file = std::fs::File::create(path).expect("create a data file");
            for at in (0..FILE).step_by(chunk.len()) {
                file.write_all_at(&chunk, at).expect("write a data file");
            }
            file.sync_all().expect("sync a data file");
        }
    }
    let cache = foliocache::Cache::builder()
        .capacity(2 * FILE + (64 << 20))
        .prefault(true)
        .readahead_bytes(readahead_kb << 10)
        .io_request_bytes(
            std::env::var("SEQ_COLD_REQUEST_KIB")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .map_or(512 << 10, |kib| kib << 10),
        )
        .build()
        .expect("cache");
    let files: Vec<foliocache::File> = paths
        .iter()
        .map(|path| {
            let options = foliocache::OpenOptions::new()
                .shared(false)
                .max_order(order);
            cache
                .open_with(path, options)
                .expect("open through the cache")
        })
        .collect();
    let plain: Vec<std::fs::File> = paths
        .iter()
        .map(|path| std::fs::File::open(path).expect("open"))
        .collect();
    let mut cpu = 0.0;
    for _ in 0..passes {
        for file in &files {
            file.drop_cached(0, 0);
        }
        for file in &plain {
            rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed).expect("fadvise");
        }
        if mode == "kernel" {
            warm_guest_memory(2 * FILE as usize);
        }
        // As readseq does: the frees the drop deferred run now, not in the next pass.
        foliocache::raw::drain_cpu_caches(&cache);
        let before = cpu_seconds();
        let ticks_before = disk_ticks(&paths[0]);
        let started = std::time::Instant::now();
        let mark = || {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
            t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
        };
        let pass_start = mark();
        std::thread::scope(|s| {
            for (file, plain) in files.iter().zip(&plain) {
                let through_cache = mode == "cache";
                s.spawn(move || {
                    let mut buf = vec![0u8; record];
                    let mut handle = file.handle();
                    let mut at = 0;
                    while at < FILE {
                        let n = if through_cache {
                            handle.read_at(&mut buf, at).expect("read")
                        } else {
                            plain.read_at(&mut buf, at).expect("pread")
                        };
                        assert_eq!(n, record, "short read at {at}");
                        at += record as u64;
                    }
                });
            }
        });
        cpu += cpu_seconds() - before;
        if std::env::var_os("SEQ_COLD_MARKS").is_some() {
            println!("marks {pass_start} {}", mark());
        }
        let wall = started.elapsed().as_secs_f64();
        let rate = 2.0 * FILE as f64 / wall / f64::from(1u32 << 20);
        match (ticks_before, disk_ticks(&paths[0])) {
            (Some((busy0, queue0)), Some((busy1, queue1))) => println!(
                "pass: {rate:.0} MiB/s, device busy {:.0}%, {:.1} requests in flight on average",
                (busy1 - busy0) as f64 / 10.0 / wall,
                (queue1 - queue0) as f64 / 1000.0 / wall
            ),
            _ => println!("pass: {rate:.0} MiB/s"),
        }
    }
    let gib = passes as f64 * 2.0 * FILE as f64 / f64::from(1u32 << 30);
    println!("{mode}: {:.3} CPU s per GiB", cpu / gib);
}
