//! `fcache cat`: prints a file or an object (`s3://bucket/key`) read through a fresh cache, and
//! says on standard error what the read cost: bytes, time, and for an object the GETs sent and
//! the bytes fetched per byte read.

use clap::Args;
use foliocache::{Cache, OpenOptions};
use foliocache_object::{ObjectCache, ObjectOptions, ObjectUrl};
use std::io::Write as _;
use std::time::Instant;

#[derive(Debug, Args)]
pub(crate) struct CatArgs {
    /// A file, or an object `s3://bucket/key` (the store from the environment, as the
    /// `object_store` crate reads it: AWS_ENDPOINT, AWS_REGION, AWS_ACCESS_KEY_ID, ...,
    /// AWS_ALLOW_HTTP=true for a store over plain HTTP).
    target: String,
    /// Read size in KiB.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=65536))]
    chunk_kb: u64,
    /// Maximum readahead window in MiB (objects; files use the cache's default).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(0..=1024))]
    ra_mib: u64,
    /// Cache capacity in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1048576))]
    capacity_mib: u64,
    /// Read the whole thing twice (the second pass from memory) and print it once.
    #[arg(long)]
    twice: bool,
    /// Print nothing on standard output (measure only).
    #[arg(long, short)]
    quiet: bool,
}

pub(crate) fn run(args: &CatArgs) -> Result<(), String> {
    let cache = Cache::builder()
        .capacity(args.capacity_mib << 20)
        .build()
        .map_err(|e| e.to_string())?;
    let chunk = (args.chunk_kb << 10) as usize;
    let mut out = std::io::stdout().lock();
    let passes = if args.twice { 2 } else { 1 };
    if ObjectUrl::is_object_url(&args.target) {
        let options = ObjectOptions {
            readahead_bytes: args.ra_mib << 20,
            ..ObjectOptions::default()
        };
        let object = cache
            .open_object_with(&args.target, &options)
            .map_err(|e| e.to_string())?;
        for pass in 0..passes {
            let before = object.backend().stats();
            let started = Instant::now();
            let mut handle = object.handle();
            let mut buf = vec![0u8; chunk];
            let mut pos = 0u64;
            loop {
                let n = handle.read_at(&mut buf, pos).map_err(|e| {
                    let detail = object.backend().last_error().unwrap_or_default();
                    format!("{}: at byte {pos}: {e} {detail}", args.target)
                })?;
                if n == 0 {
                    break;
                }
                if pass == 0 && !args.quiet && out.write_all(&buf[..n]).is_err() {
                    return Ok(()); // stdout closed (a pager quit)
                }
                pos += n as u64;
            }
            let after = object.backend().stats();
            let secs = started.elapsed().as_secs_f64();
            let fetched = after.bytes_fetched - before.bytes_fetched;
            eprintln!(
                "fcache cat: {} pass {}: {pos} bytes in {secs:.3} s ({:.1} MB/s), {} GETs, \
                 {fetched} bytes fetched ({:.3} per byte read)",
                args.target,
                pass + 1,
                pos as f64 / secs / 1e6,
                after.gets - before.gets,
                if pos == 0 {
                    0.0
                } else {
                    fetched as f64 / pos as f64
                },
            );
        }
        return Ok(());
    }
    let file = cache
        .open_with(&args.target, OpenOptions::new().buffered_fallback(true))
        .map_err(|e| e.to_string())?;
    for pass in 0..passes {
        let before = file.io_stats();
        let started = Instant::now();
        let mut handle = file.handle();
        let mut buf = vec![0u8; chunk];
        let mut pos = 0u64;
        loop {
            let n = handle
                .read_at(&mut buf, pos)
                .map_err(|e| format!("{}: at byte {pos}: {e}", args.target))?;
            if n == 0 {
                break;
            }
            if pass == 0 && !args.quiet && out.write_all(&buf[..n]).is_err() {
                return Ok(());
            }
            pos += n as u64;
        }
        let after = file.io_stats();
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "fcache cat: {} pass {}: {pos} bytes in {secs:.3} s ({:.1} MB/s), {} device reads, \
             {} bytes read from the device",
            args.target,
            pass + 1,
            pos as f64 / secs / 1e6,
            after.requests - before.requests,
            after.bytes - before.bytes,
        );
    }
    Ok(())
}
