//! The disk suites' data files: where they go.

use super::BenchArgs;
use foliocache::Cache;
use std::path::PathBuf;

/// Where the data files go: `--dir`, else the system temporary directory, else the results
/// directory (on the checkout's file system), whichever first takes O_DIRECT for real (tmpfs
/// does not).
pub(crate) fn data_dir(args: &BenchArgs) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match &args.dir {
        Some(dir) => vec![dir.clone()],
        None => vec![std::env::temp_dir(), args.out.clone()],
    };
    let cache = Cache::builder()
        .capacity(1 << 20)
        .build()
        .map_err(|e| e.to_string())?;
    let mut reasons = Vec::new();
    for dir in candidates {
        let probe = dir.join(format!("fcache-readseq-probe-{}", std::process::id()));
        if let Err(e) = std::fs::write(&probe, [0u8; 4096]) {
            reasons.push(format!("{}: {e}", dir.display()));
            continue;
        }
        let opened = cache.open(&probe);
        let _ = std::fs::remove_file(&probe);
        match opened {
            Ok(_) => return Ok(dir),
            Err(e) => reasons.push(e.to_string()),
        }
    }
    Err(format!(
        "readseq needs a directory on a disk file system (O_DIRECT): {}. Pass --dir DIR.",
        reasons.join("; ")
    ))
}
