//! Sets of resident pages, their ranges, and how two of them compare.

use serde_json::{Value, json};

/// A set of page indexes of one file (a bitmap: the files here have at most a few hundred
/// thousand pages).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct PageSet {
    words: Vec<u64>,
}

impl PageSet {
    /// An empty set.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The set of pages `k` where `resident(k)` holds, for `k < pages`.
    pub(crate) fn from_fn(pages: u64, resident: impl Fn(u64) -> bool) -> Self {
        let mut set = Self::new();
        for page in 0..pages {
            if resident(page) {
                set.insert(page);
            }
        }
        set
    }

    /// The set holding the inclusive ranges `first..=last`.
    pub(crate) fn from_ranges(ranges: &[(u64, u64)]) -> Self {
        let mut set = Self::new();
        for &(first, last) in ranges {
            for page in first..=last {
                set.insert(page);
            }
        }
        set
    }

    pub(crate) fn insert(&mut self, page: u64) {
        let word = (page / 64) as usize;
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        self.words[word] |= 1 << (page % 64);
    }

    pub(crate) fn contains(&self, page: u64) -> bool {
        self.words
            .get((page / 64) as usize)
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    /// The number of pages in the set.
    pub(crate) fn len(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    fn zip(&self, other: &Self, f: impl Fn(u64, u64) -> u64) -> Self {
        let n = self.words.len().max(other.words.len());
        let word = |s: &Self, k: usize| s.words.get(k).copied().unwrap_or(0);
        Self {
            words: (0..n).map(|k| f(word(self, k), word(other, k))).collect(),
        }
    }

    /// Pages in `self` and not in `other`.
    pub(crate) fn minus(&self, other: &Self) -> Self {
        self.zip(other, |a, b| a & !b)
    }

    /// Pages in both.
    pub(crate) fn and(&self, other: &Self) -> Self {
        self.zip(other, |a, b| a & b)
    }

    /// Pages in either.
    pub(crate) fn or(&self, other: &Self) -> Self {
        self.zip(other, |a, b| a | b)
    }

    /// Whether both hold the same pages (trailing empty words do not count).
    pub(crate) fn same(&self, other: &Self) -> bool {
        self.minus(other).len() == 0 && other.minus(self).len() == 0
    }

    /// |A ∩ B| / |A ∪ B|; 1 for two empty sets.
    pub(crate) fn jaccard(&self, other: &Self) -> f64 {
        let union = self.or(other).len();
        if union == 0 {
            return 1.0;
        }
        self.and(other).len() as f64 / union as f64
    }

    /// The set as inclusive ranges `(first, last)`, in order.
    pub(crate) fn ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (k, &word) in self.words.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let page = k as u64 * 64 + u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                match out.last_mut() {
                    Some(last) if last.1 + 1 == page => last.1 = page,
                    _ => out.push((page, page)),
                }
            }
        }
        out
    }

    /// `0-27, 40, 64-95` (or `-` for an empty set); at most `limit` ranges, then a count.
    pub(crate) fn describe(&self, limit: usize) -> String {
        let ranges = self.ranges();
        if ranges.is_empty() {
            return "-".into();
        }
        let mut parts: Vec<String> = ranges
            .iter()
            .take(limit)
            .map(|&(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        if ranges.len() > limit {
            parts.push(format!("... {} more ranges", ranges.len() - limit));
        }
        parts.join(", ")
    }

    /// `[[first, last], ...]`.
    pub(crate) fn to_json(&self) -> Value {
        json!(
            self.ranges()
                .iter()
                .map(|&(a, b)| [a, b])
                .collect::<Vec<_>>()
        )
    }

    /// Reads `[[first, last], ...]`.
    pub(crate) fn from_json(value: &Value) -> Result<Self, String> {
        let bad = || format!("expected page ranges [[first, last], ...], got {value}");
        let mut ranges = Vec::new();
        for range in value.as_array().ok_or_else(bad)? {
            let pair = range.as_array().ok_or_else(bad)?;
            let (Some(first), Some(last)) = (
                pair.first().and_then(Value::as_u64),
                pair.get(1).and_then(Value::as_u64),
            ) else {
                return Err(bad());
            };
            if pair.len() != 2 || first > last || last > 1 << 40 {
                return Err(bad());
            }
            ranges.push((first, last));
        }
        Ok(Self::from_ranges(&ranges))
    }
}

/// The pages present in more than half of `runs` (the kernel's majority result at one step).
pub(crate) fn majority(runs: &[PageSet]) -> PageSet {
    let pages = runs
        .iter()
        .map(|s| s.words.len() as u64 * 64)
        .max()
        .unwrap_or(0);
    PageSet::from_fn(pages, |page| {
        2 * runs.iter().filter(|s| s.contains(page)).count() > runs.len()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip_and_compare() {
        let a = PageSet::from_ranges(&[(0, 27), (64, 64), (100, 130)]);
        assert_eq!(a.ranges(), [(0, 27), (64, 64), (100, 130)]);
        assert_eq!(a.len(), 28 + 1 + 31);
        assert_eq!(a.describe(2), "0-27, 64, ... 1 more ranges");
        assert_eq!(PageSet::from_json(&a.to_json()).unwrap(), a);
        let b = PageSet::from_ranges(&[(0, 27)]);
        assert!((a.jaccard(&b) - 28.0 / 60.0).abs() < 1e-12);
        assert_eq!(a.minus(&b).ranges(), [(64, 64), (100, 130)]);
        assert!(b.minus(&a).ranges().is_empty());
        assert_eq!(PageSet::new().jaccard(&PageSet::new()), 1.0);
        let mut c = b.clone();
        c.insert(5000);
        assert!(!c.same(&b));
        assert!(b.same(&c.minus(&PageSet::from_ranges(&[(5000, 5000)]))));
        assert!(PageSet::from_json(&serde_json::json!([[3, 1]])).is_err());
        assert!(PageSet::from_json(&serde_json::json!([[1]])).is_err());
    }

    #[test]
    fn the_majority_keeps_pages_most_runs_hold() {
        let runs = [
            PageSet::from_ranges(&[(0, 3)]),
            PageSet::from_ranges(&[(0, 7)]),
            PageSet::from_ranges(&[(0, 3), (9, 9)]),
        ];
        assert_eq!(majority(&runs).ranges(), [(0, 3)]);
        assert_eq!(majority(&runs[..2]).ranges(), [(0, 3)]);
    }
}
