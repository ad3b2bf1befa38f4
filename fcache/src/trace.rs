//! Access traces: what `fcache replay` and `fcache ra-diff` replay.
//!
//! One operation per line; `#` starts a comment; numbers are decimal or `0x` hex.
//!
//! ```text
//! # A trace may say which file it was written for (ra-diff creates data files of that size):
//! file-size 8388608
//! 0 4096              # a read: `offset length` (the original format, still accepted)
//! read 4096 4096      # the same, named
//! willneed 0 1048576  # posix_fadvise(POSIX_FADV_WILLNEED): readahead(2) with no heuristics
//! dontneed 0 65536    # posix_fadvise(POSIX_FADV_DONTNEED): drop the idle pages of the range
//! ```
//!
//! A length of 0 means "to end of file" for `willneed` and `dontneed`, as for `posix_fadvise`;
//! a read of length 0 reads nothing. `file-size` may appear once, before the first operation.

use std::fmt;
use std::path::Path;

/// The longest single read or advice range a trace may ask for.
pub(crate) const MAX_LEN: u64 = 1 << 30;

/// One operation of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// One read (`pread`) of `len` bytes at `offset`.
    Read { offset: u64, len: u64 },
    /// `posix_fadvise(WILLNEED)` of the range (`len` 0: to end of file).
    WillNeed { offset: u64, len: u64 },
    /// `posix_fadvise(DONTNEED)` of the range (`len` 0: to end of file).
    DontNeed { offset: u64, len: u64 },
}

impl fmt::Display for Op {
    /// The canonical line for the operation (what recordings store).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Read { offset, len } => write!(f, "read {offset} {len}"),
            Self::WillNeed { offset, len } => write!(f, "willneed {offset} {len}"),
            Self::DontNeed { offset, len } => write!(f, "dontneed {offset} {len}"),
        }
    }
}

/// What one line of a trace says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Line {
    /// The size of the data file the trace was written for.
    FileSize(u64),
    /// An operation.
    Op(Op),
}

/// A parsed trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trace {
    /// A name for reports (the file name without `.trace`).
    pub(crate) name: String,
    /// The data file size it asks for, if it says.
    pub(crate) file_size: Option<u64>,
    /// The operations, in order.
    pub(crate) ops: Vec<Op>,
}

fn parse_number(word: &str) -> Option<u64> {
    match word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => word.parse().ok(),
    }
}

/// Parses one trace line (`number` is 1-based, for messages): `None` for blank and comment
/// lines.
pub(crate) fn parse_line(line: &str, number: usize) -> Result<Option<Line>, String> {
    let content = line.split('#').next().unwrap_or("").trim();
    if content.is_empty() {
        return Ok(None);
    }
    let words: Vec<&str> = content.split_whitespace().collect();
    let parse = |word: &str, what: &str| {
        parse_number(word).ok_or_else(|| {
            format!("trace line {number}: {what} {word:?} is not a number (decimal or 0x hex)")
        })
    };
    let range = |args: &[&str], what: &str| -> Result<(u64, u64), String> {
        let [offset, len] = args else {
            return Err(format!(
                "trace line {number}: expected `{what}offset length`, got {content:?}"
            ));
        };
        let (offset, len) = (parse(offset, "offset")?, parse(len, "length")?);
        if len > MAX_LEN {
            return Err(format!(
                "trace line {number}: length {len} is over the 1 GiB limit of one operation"
            ));
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(format!(
                "trace line {number}: offset {offset} + length {len} is past the largest file size"
            ));
        }
        Ok((offset, len))
    };
    let line = match words[0] {
        "read" => {
            let (offset, len) = range(&words[1..], "read ")?;
            Line::Op(Op::Read { offset, len })
        }
        "willneed" => {
            let (offset, len) = range(&words[1..], "willneed ")?;
            Line::Op(Op::WillNeed { offset, len })
        }
        "dontneed" => {
            let (offset, len) = range(&words[1..], "dontneed ")?;
            Line::Op(Op::DontNeed { offset, len })
        }
        "file-size" => {
            let [size] = words[1..] else {
                return Err(format!(
                    "trace line {number}: expected `file-size bytes`, got {content:?}"
                ));
            };
            Line::FileSize(parse(size, "file size")?)
        }
        first if first.starts_with(|c: char| c.is_ascii_digit()) => {
            let (offset, len) = range(&words, "")?;
            Line::Op(Op::Read { offset, len })
        }
        other => {
            return Err(format!(
                "trace line {number}: unknown operation {other:?} (expected `offset length`, \
                 `read`, `willneed`, `dontneed` or `file-size`)"
            ));
        }
    };
    Ok(Some(line))
}

/// Parses a whole trace.
pub(crate) fn parse(name: &str, text: &str) -> Result<Trace, String> {
    let mut trace = Trace {
        name: name.to_string(),
        file_size: None,
        ops: Vec::new(),
    };
    for (k, line) in text.lines().enumerate() {
        match parse_line(line, k + 1)? {
            None => {}
            Some(Line::Op(op)) => trace.ops.push(op),
            Some(Line::FileSize(size)) => {
                if trace.file_size.is_some() || !trace.ops.is_empty() {
                    return Err(format!(
                        "trace line {}: `file-size` must come once, before the first operation",
                        k + 1
                    ));
                }
                trace.file_size = Some(size);
            }
        }
    }
    Ok(trace)
}

/// Reads and parses the trace at `path` (named after the file, without `.trace`).
pub(crate) fn load(path: &Path) -> Result<Trace, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the trace {}: {e}", path.display()))?;
    let name = path
        .file_stem()
        .map_or_else(|| "trace".into(), |s| s.to_string_lossy().into_owned());
    parse(&name, &text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(line: &str) -> Result<Option<Line>, String> {
        parse_line(line, 1)
    }

    #[test]
    fn the_original_format_still_parses() {
        assert_eq!(op("  # comment"), Ok(None));
        assert_eq!(op(""), Ok(None));
        assert_eq!(
            op("4096 100 # tail"),
            Ok(Some(Line::Op(Op::Read {
                offset: 4096,
                len: 100
            })))
        );
        assert_eq!(
            op("0x1000\t0x10"),
            Ok(Some(Line::Op(Op::Read {
                offset: 4096,
                len: 16
            })))
        );
        let error = parse_line("12", 7).unwrap_err();
        assert!(error.contains("line 7"), "{error}");
        assert!(op("1 -5").unwrap_err().contains("length"));
        assert!(op("0 99999999999").unwrap_err().contains("limit"));
    }

    #[test]
    fn named_operations_and_the_header_parse() {
        assert_eq!(
            op("willneed 0 0x100000"),
            Ok(Some(Line::Op(Op::WillNeed {
                offset: 0,
                len: 1 << 20
            })))
        );
        assert_eq!(
            op("dontneed 4096 0"),
            Ok(Some(Line::Op(Op::DontNeed {
                offset: 4096,
                len: 0
            })))
        );
        assert_eq!(op("file-size 123"), Ok(Some(Line::FileSize(123))));
        assert!(op("a 1").unwrap_err().contains("unknown operation"));
        assert!(
            op("willneed 1")
                .unwrap_err()
                .contains("willneed offset length")
        );
        assert!(op("file-size").unwrap_err().contains("file-size bytes"));
        assert!(
            op("read 9223372036854775807 10")
                .unwrap_err()
                .contains("largest file size")
        );
    }

    #[test]
    fn a_trace_has_at_most_one_size_before_its_operations() {
        let trace = parse("t", "file-size 8192\n0 10\nwillneed 0 0\n").unwrap();
        assert_eq!(trace.file_size, Some(8192));
        assert_eq!(trace.ops.len(), 2);
        assert_eq!(trace.ops[1].to_string(), "willneed 0 0");
        assert!(
            parse("t", "0 10\nfile-size 1\n")
                .unwrap_err()
                .contains("line 2")
        );
        assert!(
            parse("t", "file-size 1\nfile-size 2\n")
                .unwrap_err()
                .contains("once")
        );
    }
}
