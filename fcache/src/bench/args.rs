//! `fcache bench`'s command line: which suites run, at which sizes, with how many repetitions,
//! and where the results go.

use super::Suite;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// The suite to run; all suites when omitted.
    pub(crate) suite: Option<Suite>,
    /// Small sizes that finish in well under a minute (the default).
    #[arg(long, conflicts_with = "full")]
    pub(crate) quick: bool,
    /// The seeds' sizes and more repetitions.
    #[arg(long)]
    pub(crate) full: bool,
    /// Write the results as JSON here (one file per suite: `PATH` for one suite, else
    /// `PATH` with the suite name added before the extension).
    #[arg(long, value_name = "PATH")]
    pub(crate) json: Option<PathBuf>,
    /// Thread counts, e.g. `1,2,4` (where a suite uses threads).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) threads: Option<Vec<u32>>,
    /// Repetitions per case (default 5 quick, 9 full).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) reps: Option<u32>,
    /// Directory for the plots (and the JSON when --json is not given).
    #[arg(long, value_name = "DIR", default_value = "results")]
    pub(crate) out: PathBuf,
    /// Directory for the disk suites' data files, on a disk file system (default: the system
    /// temporary directory). The files are deleted at the end.
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
    /// Maximum readahead window in KiB for the disk suites (default: the disk's own
    /// `read_ahead_kb`, as the kernel uses it; 2048 when sysfs does not tell).
    #[arg(long, value_name = "KIB", value_parser = clap::value_parser!(u64).range(0..=1048576))]
    pub(crate) ra_kb: Option<u64>,
    /// Largest single read in KiB for the disk suites: readseq's cache requests (default the
    /// library's, 512) and multiproc's sequential records (default 128).
    #[arg(long, value_name = "KIB", value_parser = clap::value_parser!(u64).range(4..=65536))]
    pub(crate) request_kb: Option<u64>,
    /// The ELF executable for the exec suite (default: this fcache binary, and the Rust
    /// toolchain's `librustc_driver` when one is found).
    #[arg(long, value_name = "PATH")]
    pub(crate) elf: Option<PathBuf>,
    /// Print every suite's full tables (they are always written beside the JSON, as `.md`).
    #[arg(long, short)]
    pub(crate) verbose: bool,
    /// Compare two runs instead of running: each a suite's JSON file or a results directory.
    /// Shows each figure's change and whether it is beyond the runs' min-max spread.
    #[arg(long, num_args = 2, value_names = ["OLD", "NEW"])]
    pub(crate) compare: Option<Vec<PathBuf>>,
}

impl BenchArgs {
    /// Repetitions per case: `--reps`, else 5 (quick) or 9 (full).
    pub(crate) fn reps(&self) -> usize {
        self.reps
            .map_or(if self.full { 9 } else { 5 }, |r| r as usize)
    }
}
