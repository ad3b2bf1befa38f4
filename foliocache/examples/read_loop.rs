//! A read loop for profiling (e.g. under `valgrind --tool=callgrind`):
//! `cargo run --release --example read_loop -- <batched|per-folio> <normal|fallocated|hole> <block bytes> <max order> <reads>`
//! (`READ_LOOP_SMALL=refcounted` makes small reads take a reference; `READ_LOOP_RANDOM=1` reads
//! blocks at random block-aligned offsets instead of in order, so the index walk and the
//! folio's descriptor miss the CPU's caches as a random reader's do; `READ_LOOP_SKEW=<bytes>`
//! adds that much to every position, so that a block straddles two pages as RocksDB's do;
//! `READ_LOOP_FILE=<path>` reads that file from storage instead of a memory file, its first
//! `READ_LOOP_MIB` read once before the clock starts so that every timed read is a hit: the
//! hit path of a file from storage, `copy_hits`, which the preload library's reads take;
//! `READ_LOOP_SAME=1` reads the same block every time, at `READ_LOOP_SKEW`, as smallread does;
//! `READ_LOOP_KIB` sizes the file in KiB rather than `READ_LOOP_MIB`.)

use foliocache::{Cache, ReadPolicy};
use std::hint::black_box;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: read_loop <batched|per-folio> <normal|fallocated|hole> <block bytes> <max order 0..=9> <reads>";
    if args.len() != 6 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let policy = match args[1].as_str() {
        "batched" => ReadPolicy::Batched,
        "per-folio" => ReadPolicy::PerFolio,
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let (Ok(block), Ok(order), Ok(reads)) = (
        args[3].parse::<usize>(),
        args[4].parse::<u8>(),
        args[5].parse::<u64>(),
    ) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    // READ_LOOP_KIB, if set, gives the size in KiB instead (a file of one page: 4).
    let size: u64 = match std::env::var("READ_LOOP_KIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(kib) => kib.max(4) << 10,
        None => {
            std::env::var("READ_LOOP_MIB")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(64)
                << 20
        }
    };
    let huge = std::env::var("READ_LOOP_HUGE").is_ok_and(|v| v == "1");
    let cache = Cache::builder()
        .capacity((size + size / 32).next_multiple_of(1 << 20) + (8 << 20))
        .huge_pages(huge)
        .prefault(huge)
        .build()
        .expect("cache");
    let from_storage = std::env::var_os("READ_LOOP_FILE");
    let file = match &from_storage {
        Some(path) => {
            let file = cache
                .open_with(
                    std::path::Path::new(path),
                    foliocache::OpenOptions::new().max_order(order),
                )
                .expect("open the file through the cache");
            assert!(
                file.size() >= size,
                "READ_LOOP_FILE is shorter than READ_LOOP_MIB"
            );
            let mut warm = file.handle();
            let mut chunk = vec![0u8; (1 << 20).min(size as usize)];
            for at in (0..size).step_by(chunk.len()) {
                warm.read_at(&mut chunk, at).expect("warm the file");
            }
            file
        }
        None => cache.create_memory_file(order).expect("file"),
    };
    match args[2].as_str() {
        _ if from_storage.is_some() => {}
        "normal" => {
            // Distinct bytes everywhere (identical pages could be deduplicated by the host and
            // then read from one cached copy).
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let mut chunk = vec![0u8; (1 << 20).min(size as usize)];
            for at in (0..size).step_by(chunk.len()) {
                for word in chunk.chunks_exact_mut(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    word.copy_from_slice(&x.to_le_bytes());
                }
                file.write_at(&chunk, at).expect("write");
            }
        }
        "fallocated" => file.fallocate(0, size).expect("fallocate"),
        "hole" => file.set_len(size).expect("set_len"),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
    let mut handle = file.handle();
    handle.set_read_policy(policy);
    if std::env::var("READ_LOOP_SMALL").is_ok_and(|v| v == "refcounted") {
        handle.set_small_read_policy(foliocache::SmallReadPolicy::Refcounted);
    }
    // READ_LOOP_DST_OFFSET: the destination's offset from a page boundary (default 0).
    let offset: usize = std::env::var("READ_LOOP_DST_OFFSET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut backing = vec![0u8; block + 2 * 4096];
    let base = backing.as_ptr().align_offset(4096) + offset;
    let buf = &mut backing[base..base + block];
    buf.fill(1);
    let random = std::env::var("READ_LOOP_RANDOM").is_ok_and(|v| v == "1");
    let same = std::env::var("READ_LOOP_SAME").is_ok_and(|v| v == "1");
    let skew: u64 = std::env::var("READ_LOOP_SKEW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let blocks = (size.saturating_sub(skew) / block.max(1) as u64).max(1);
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut pos = skew;
    let start = std::time::Instant::now();
    for _ in 0..reads {
        if random {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            pos = (rng % blocks) * block as u64 + skew;
        }
        let n = handle.read_at(buf, pos).expect("read") as u64;
        black_box(&buf);
        if !same {
            pos = if pos + n >= size { 0 } else { pos + n };
        }
    }
    let elapsed = start.elapsed();
    let stats = file.mapping_stats();
    println!(
        "{reads} reads, {} index walks, {} lookups, {} from the recent folio, {:.2} GiB/s, {:.1} ns per read",
        stats.index_walks,
        stats.lookups,
        stats.recent_hits,
        (reads * block as u64) as f64 / elapsed.as_secs_f64() / f64::from(1u32 << 30),
        elapsed.as_nanos() as f64 / reads as f64
    );
}
