//! Measures the device: `cargo run --release --example device_probe -- BLOCK_KIB DEPTH THREADS FILE...`
//! (each thread reads its share of the files with its own ring) into memory that keeps every
//! byte, or with `FOLIOCACHE_PROBE_BUFFERS=reused` or `reused-4k` into reused buffers (see
//! `foliocache::raw::probe::Buffers`). Buffers are faulted in before the threads start together.
use foliocache::raw::probe::{Buffers, concurrent_read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "usage: device_probe BLOCK_KIB DEPTH THREADS FILE...";

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("device_probe: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<String, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |k: usize, what: &str| -> Result<usize, String> {
        let arg = args.get(k).ok_or_else(|| USAGE.to_string())?;
        arg.parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{what} must be a positive number, not {arg:?}\n{USAGE}"))
    };
    let block = number(0, "BLOCK_KIB")? << 10;
    let depth = number(1, "DEPTH")?;
    let threads = number(2, "THREADS")?;
    let files: Vec<PathBuf> = args.iter().skip(3).map(Into::into).collect();
    if files.is_empty() {
        return Err(USAGE.into());
    }
    let buffers = match std::env::var("FOLIOCACHE_PROBE_BUFFERS").as_deref() {
        Ok("reused") => Buffers::Reused,
        Ok("reused-4k") => Buffers::ReusedSmallPages,
        Ok("keep") | Err(_) => Buffers::Keep,
        Ok(other) => {
            return Err(format!(
                "FOLIOCACHE_PROBE_BUFFERS={other:?}: expected keep, reused or reused-4k"
            ));
        }
    };
    let groups: Vec<Vec<&Path>> = (0..threads.min(files.len()))
        .map(|t| {
            files
                .iter()
                .skip(t)
                .step_by(threads)
                .map(PathBuf::as_path)
                .collect()
        })
        .collect();
    let read = concurrent_read(&groups, block, depth, buffers).map_err(|e| e.to_string())?;
    Ok(format!(
        "{:.0} MiB/s",
        read.bytes as f64 / read.elapsed.as_secs_f64() / f64::from(1 << 20)
    ))
}
