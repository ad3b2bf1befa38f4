//! Eviction policies simulated on a page trace, for the reclaim suite to set the cache's own
//! hit ratios beside: exact LRU, Belady's offline optimum, and three of today's best online
//! policies — ARC (Megiddo and Modha, FAST 2003), S3-FIFO (Yang et al., SOSP 2023) and SIEVE
//! (Zhang et al., NSDI 2024). Each holds `capacity` pages and counts a hit when the page asked
//! for is resident; a miss always brings the page in (demand paging: no bypass). They are
//! written from the papers' algorithms and each is checked against a trace worked by hand.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// An online policy: `access` returns whether the page was resident.
pub(crate) trait Simulated {
    fn access(&mut self, page: u64) -> bool;
}

/// The hit ratio of `policy` over `trace` (0 for an empty trace).
pub(crate) fn hit_ratio(policy: &mut impl Simulated, trace: &[u64]) -> f64 {
    let hits = trace.iter().filter(|&&page| policy.access(page)).count();
    hits as f64 / trace.len().max(1) as f64
}

/// Pages in recency order: a stamp per page, pages by stamp (oldest first).
#[derive(Debug, Default)]
struct Recency {
    stamp_of: HashMap<u64, u64>,
    by_stamp: BTreeMap<u64, u64>,
}

impl Recency {
    fn len(&self) -> usize {
        self.stamp_of.len()
    }

    fn contains(&self, page: u64) -> bool {
        self.stamp_of.contains_key(&page)
    }

    /// Puts `page` at the most recent end (moving it if present).
    fn touch(&mut self, page: u64, stamp: u64) {
        if let Some(old) = self.stamp_of.insert(page, stamp) {
            self.by_stamp.remove(&old);
        }
        self.by_stamp.insert(stamp, page);
    }

    fn remove(&mut self, page: u64) -> bool {
        match self.stamp_of.remove(&page) {
            Some(stamp) => {
                self.by_stamp.remove(&stamp);
                true
            }
            None => false,
        }
    }

    /// Removes and returns the least recent page.
    fn pop_oldest(&mut self) -> Option<u64> {
        let (_, page) = self.by_stamp.pop_first()?;
        self.stamp_of.remove(&page);
        Some(page)
    }

    #[cfg(test)]
    fn pages(&self) -> Vec<u64> {
        self.by_stamp.values().copied().collect()
    }
}

/// Exact LRU.
#[derive(Debug)]
pub(crate) struct Lru {
    capacity: usize,
    list: Recency,
    clock: u64,
}

impl Lru {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            list: Recency::default(),
            clock: 0,
        }
    }
}

impl Simulated for Lru {
    fn access(&mut self, page: u64) -> bool {
        self.clock += 1;
        let hit = self.list.contains(page);
        if !hit && self.list.len() == self.capacity {
            self.list.pop_oldest();
        }
        self.list.touch(page, self.clock);
        hit
    }
}

/// Belady's optimum with `capacity` pages: on a miss with the cache full, evict the resident
/// page used furthest in the future (never used again first). The page asked for is always
/// brought in.
pub(crate) fn belady_hit_ratio(trace: &[u64], capacity: usize) -> f64 {
    let capacity = capacity.max(1);
    let mut next_use = vec![usize::MAX; trace.len()];
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for (t, &page) in trace.iter().enumerate().rev() {
        next_use[t] = seen.insert(page, t).unwrap_or(usize::MAX);
    }
    // Resident pages by their next use; ties (never used again) broken by page number.
    let mut resident: HashMap<u64, usize> = HashMap::new();
    let mut by_next: BTreeMap<(usize, u64), ()> = BTreeMap::new();
    let mut hits = 0usize;
    for (t, &page) in trace.iter().enumerate() {
        if let Some(old) = resident.remove(&page) {
            by_next.remove(&(old, page));
            hits += 1;
        } else if resident.len() == capacity
            && let Some(((_, victim), ())) = by_next.pop_last()
        {
            resident.remove(&victim);
        }
        resident.insert(page, next_use[t]);
        by_next.insert((next_use[t], page), ());
    }
    hits as f64 / trace.len().max(1) as f64
}

/// ARC: two LRU lists of resident pages, T1 (seen once recently) and T2 (seen at least
/// twice), and their ghosts B1 and B2 (recently evicted pages, no data); a hit in a ghost moves
/// the target size `p` of T1 towards the list that would have kept the page.
#[derive(Debug)]
pub(crate) struct Arc {
    c: usize,
    p: usize,
    t1: Recency,
    t2: Recency,
    b1: Recency,
    b2: Recency,
    clock: u64,
}

impl Arc {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            c: capacity.max(1),
            p: 0,
            t1: Recency::default(),
            t2: Recency::default(),
            b1: Recency::default(),
            b2: Recency::default(),
            clock: 0,
        }
    }

    /// The paper's REPLACE: demote T1's LRU page to B1 when T1 is over its target (or at it
    /// and the page asked for came from B2), else T2's LRU page to B2.
    fn replace(&mut self, in_b2: bool) {
        self.clock += 1;
        let t1 = self.t1.len();
        if t1 >= 1 && ((in_b2 && t1 == self.p) || t1 > self.p) {
            if let Some(page) = self.t1.pop_oldest() {
                self.b1.touch(page, self.clock);
            }
        } else if let Some(page) = self.t2.pop_oldest() {
            self.b2.touch(page, self.clock);
        } else if let Some(page) = self.t1.pop_oldest() {
            self.b1.touch(page, self.clock);
        }
    }
}

impl Simulated for Arc {
    fn access(&mut self, x: u64) -> bool {
        self.clock += 1;
        // Case I: a hit.
        if self.t1.remove(x) || self.t2.contains(x) {
            self.t2.touch(x, self.clock);
            return true;
        }
        if self.b1.contains(x) {
            // Case II: T1 was too small.
            let delta = (self.b2.len() / self.b1.len()).max(1);
            self.p = (self.p + delta).min(self.c);
            self.replace(false);
            self.b1.remove(x);
            self.clock += 1;
            self.t2.touch(x, self.clock);
            return false;
        }
        if self.b2.contains(x) {
            // Case III: T2 was too small.
            let delta = (self.b1.len() / self.b2.len()).max(1);
            self.p = self.p.saturating_sub(delta);
            self.replace(true);
            self.b2.remove(x);
            self.clock += 1;
            self.t2.touch(x, self.clock);
            return false;
        }
        // Case IV: a page seen nowhere.
        let l1 = self.t1.len() + self.b1.len();
        let total = l1 + self.t2.len() + self.b2.len();
        if l1 == self.c {
            if self.t1.len() < self.c {
                self.b1.pop_oldest();
                self.replace(false);
            } else {
                self.t1.pop_oldest();
            }
        } else if total >= self.c {
            if total == 2 * self.c {
                self.b2.pop_oldest();
            }
            self.replace(false);
        }
        self.clock += 1;
        self.t1.touch(x, self.clock);
        false
    }
}

/// S3-FIFO, as the paper's Algorithm 1: a small FIFO S (10% of the pages) that new pages enter,
/// a main FIFO M (the rest) with a 2-bit frequency per page (a clock: a page with frequency
/// left goes round again with one less), and a ghost FIFO G of pages evicted from S (as many
/// as M holds). A page leaves S for M if it was hit at least twice there (its frequency is
/// cleared on the move), else for G; a miss found in G goes straight to M (found in G when it
/// is asked for, before the evictions that make room for it).
#[derive(Debug)]
pub(crate) struct S3Fifo {
    capacity: usize,
    small_cap: usize,
    main_cap: usize,
    /// Head at the front (newest), tail at the back.
    small: VecDeque<u64>,
    main: VecDeque<u64>,
    ghost: VecDeque<u64>,
    /// Resident pages' frequency (0..=3).
    freq: HashMap<u64, u8>,
    in_ghost: HashMap<u64, ()>,
}

impl S3Fifo {
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(2);
        let small_cap = (capacity / 10).max(1);
        Self {
            capacity,
            small_cap,
            main_cap: capacity - small_cap,
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghost: VecDeque::new(),
            freq: HashMap::new(),
            in_ghost: HashMap::new(),
        }
    }

    fn evict(&mut self) {
        if self.small.len() >= self.small_cap {
            self.evict_small();
        } else {
            self.evict_main();
        }
    }

    fn evict_small(&mut self) {
        while let Some(t) = self.small.pop_back() {
            if self.freq.get(&t).copied().unwrap_or(0) > 1 {
                self.freq.insert(t, 0);
                self.main.push_front(t);
                if self.main.len() > self.main_cap {
                    self.evict_main();
                }
            } else {
                self.freq.remove(&t);
                self.ghost.push_front(t);
                self.in_ghost.insert(t, ());
                if self.ghost.len() > self.main_cap
                    && let Some(old) = self.ghost.pop_back()
                {
                    self.in_ghost.remove(&old);
                }
                return;
            }
        }
    }

    fn evict_main(&mut self) {
        while let Some(t) = self.main.pop_back() {
            let f = self.freq.get(&t).copied().unwrap_or(0);
            if f > 0 {
                self.freq.insert(t, f - 1);
                self.main.push_front(t);
            } else {
                self.freq.remove(&t);
                return;
            }
        }
    }
}

impl Simulated for S3Fifo {
    fn access(&mut self, page: u64) -> bool {
        if let Some(f) = self.freq.get_mut(&page) {
            *f = (*f + 1).min(3);
            return true;
        }
        // Whether the page was in the ghost is decided at the request, before the evictions
        // below could push it out (as libCacheSim's implementation does).
        let ghost_hit = self.in_ghost.remove(&page).is_some();
        if ghost_hit {
            self.ghost.retain(|&g| g != page);
        }
        while self.small.len() + self.main.len() >= self.capacity {
            self.evict();
        }
        if ghost_hit {
            self.main.push_front(page);
        } else {
            self.small.push_front(page);
        }
        self.freq.insert(page, 0);
        false
    }
}

/// SIEVE: one FIFO queue with a visited bit per page and a hand that moves from the oldest
/// page towards the newest: a hit sets the bit; a miss with the cache full moves the hand past
/// visited pages (clearing their bit) to the first unvisited one, evicts it, and leaves the
/// hand on the next newer page; new pages enter at the newest end. Pages never move.
#[derive(Debug)]
pub(crate) struct Sieve {
    capacity: usize,
    /// Slots of a doubly linked list; `newer`/`older` are slot numbers.
    nodes: Vec<SieveNode>,
    free: Vec<usize>,
    slot_of: HashMap<u64, usize>,
    newest: Option<usize>,
    oldest: Option<usize>,
    hand: Option<usize>,
}

#[derive(Debug, Clone, Copy)]
struct SieveNode {
    page: u64,
    visited: bool,
    newer: Option<usize>,
    older: Option<usize>,
}

impl Sieve {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            nodes: Vec::new(),
            free: Vec::new(),
            slot_of: HashMap::new(),
            newest: None,
            oldest: None,
            hand: None,
        }
    }

    fn unlink(&mut self, slot: usize) {
        let SieveNode { newer, older, .. } = self.nodes[slot];
        match newer {
            Some(n) => self.nodes[n].older = older,
            None => self.newest = older,
        }
        match older {
            Some(o) => self.nodes[o].newer = newer,
            None => self.oldest = newer,
        }
        self.free.push(slot);
    }

    fn evict(&mut self) {
        let Some(mut at) = self.hand.or(self.oldest) else {
            return;
        };
        while self.nodes[at].visited {
            self.nodes[at].visited = false;
            at = match self.nodes[at].newer.or(self.oldest) {
                Some(next) => next,
                None => break,
            };
        }
        self.hand = self.nodes[at].newer;
        self.slot_of.remove(&self.nodes[at].page);
        self.unlink(at);
    }

    #[cfg(test)]
    fn pages_newest_first(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = self.newest;
        while let Some(slot) = at {
            out.push(self.nodes[slot].page);
            at = self.nodes[slot].older;
        }
        out
    }
}

impl Simulated for Sieve {
    fn access(&mut self, page: u64) -> bool {
        if let Some(&slot) = self.slot_of.get(&page) {
            self.nodes[slot].visited = true;
            return true;
        }
        if self.slot_of.len() == self.capacity {
            self.evict();
        }
        let node = SieveNode {
            page,
            visited: false,
            newer: None,
            older: self.newest,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        match self.newest {
            Some(n) => self.nodes[n].newer = Some(slot),
            None => self.oldest = Some(slot),
        }
        self.newest = Some(slot);
        self.slot_of.insert(page, slot);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(policy: &mut impl Simulated, trace: &[u64]) -> Vec<bool> {
        trace.iter().map(|&p| policy.access(p)).collect()
    }

    /// The textbook reference string (Silberschatz et al.) with 3 frames: LRU takes 12
    /// faults, the optimum 9.
    const TEXTBOOK: [u64; 20] = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1];

    #[test]
    fn lru_and_belady_on_the_textbook_string() {
        let lru = hit_ratio(&mut Lru::new(3), &TEXTBOOK);
        assert!((lru - 8.0 / 20.0).abs() < 1e-12, "{lru}");
        let opt = belady_hit_ratio(&TEXTBOOK, 3);
        assert!((opt - 11.0 / 20.0).abs() < 1e-12, "{opt}");
    }

    #[test]
    fn sieve_by_hand() {
        // Capacity 3. A B C fill [C B A] (newest first). A hit: A visited. D: the hand starts
        // at the oldest (A), clears A's bit and moves to B, evicts B; the hand is left on C.
        // B: C is unvisited, evicted; the hand on D. A hit. E: D evicted; the hand on B.
        // A hit, B hit.
        let (a, b, c, d, e) = (1, 2, 3, 4, 5);
        let trace = [a, b, c, a, d, b, a, e, a, b];
        let mut sieve = Sieve::new(3);
        let got = hits(&mut sieve, &trace);
        assert_eq!(
            got,
            [
                false, false, false, true, false, false, true, false, true, true
            ]
        );
        assert_eq!(sieve.pages_newest_first(), vec![e, b, a]);
        // The hand was left on B (the page after D); A (visited again) is kept and B, visited
        // by the last access, survives one more pass: the next miss evicts E.
        sieve.access(6);
        assert_eq!(sieve.pages_newest_first(), vec![6, b, a]);
    }

    #[test]
    fn arc_by_hand() {
        // Capacity 2, worked with the paper's cases (lists written LRU..MRU):
        // 1, 2: T1 = [1 2]. 1 hits: T1 = [2], T2 = [1]. 3 (case IV, B): REPLACE with p = 0
        // demotes 2 to B1; T1 = [3]. 2 (case II, in B1): p = 1; REPLACE (|T1| = p) demotes 1
        // from T2 to B2; T2 = [2]. 1 (case III, in B2): p = 0; REPLACE demotes 3 to B1;
        // T2 = [2 1]. 3 (case II): p = 1; |T1| = 0, so 2 goes from T2 to B2; T2 = [1 3].
        // 1 hits: T2 = [3 1].
        let trace = [1, 2, 1, 3, 2, 1, 3, 1];
        let mut arc = Arc::new(2);
        let got = hits(&mut arc, &trace);
        assert_eq!(got, [false, false, true, false, false, false, false, true]);
        assert_eq!(arc.t1.pages(), Vec::<u64>::new());
        assert_eq!(arc.t2.pages(), vec![3, 1]);
        assert_eq!(arc.b1.pages(), Vec::<u64>::new());
        assert_eq!(arc.b2.pages(), vec![2]);
        assert_eq!(arc.p, 1);
    }

    #[test]
    fn s3fifo_by_hand() {
        // Capacity 5: S holds 1 page (10%, at least one), M 4, G 4. Queues newest first.
        // 1..5 fill S = [5 4 3 2 1]; 1 hits (freq 1). 6: S is at its share, evict from S:
        // 1 (freq 1, not > 1) goes to G; S = [6 5 4 3 2]. 1: in G, so into M after evicting
        // 2 to G. 7: 3 to G. 2: in G, into M after 4 goes to G; M = [2 1]. 1 hits (freq 1),
        // 5 hits twice (freq 2). 8: from S, 5 moves to M (freq cleared) and 6 goes to G;
        // S = [8 7], M = [5 2 1], G = [6 4 3].
        let mut s3 = S3Fifo::new(5);
        let trace = [1, 2, 3, 4, 5, 1, 6, 1, 7, 2, 1, 5, 5, 8];
        let got = hits(&mut s3, &trace);
        let hit_at: Vec<usize> = (0..trace.len()).filter(|&k| got[k]).collect();
        assert_eq!(hit_at, vec![5, 10, 11, 12]);
        assert_eq!(Vec::from(s3.small.clone()), vec![8, 7]);
        assert_eq!(Vec::from(s3.main.clone()), vec![5, 2, 1]);
        assert_eq!(Vec::from(s3.ghost.clone()), vec![6, 4, 3]);
        // 9: 7 to G (G full: [7 6 4 3]). 3: in G, into M after 8 goes to G; M = [3 5 2 1].
        // 4: in G, into M after 9 goes to G (S empty now); M = [4 3 5 2 1]. 6: in G; S is
        // below its share, so evict from M: 1 (freq 1) goes round with 0, 2 (freq 0) is
        // evicted; M = [6 1 4 3 5], G = [9 8 7].
        for page in [9, 3, 4, 6] {
            assert!(!s3.access(page));
        }
        assert!(s3.small.is_empty());
        assert_eq!(Vec::from(s3.main.clone()), vec![6, 1, 4, 3, 5]);
        assert_eq!(Vec::from(s3.ghost.clone()), vec![9, 8, 7]);
        assert_eq!(s3.freq[&1], 0);
    }

    #[test]
    fn every_policy_fills_to_capacity_and_never_beats_belady() {
        let mut rng = super::super::rng::Rng(7);
        let trace: Vec<u64> = (0..5000)
            .map(|_| rng.below(300).min(rng.below(300)))
            .collect();
        let opt = belady_hit_ratio(&trace, 50);
        for (name, ratio) in [
            ("lru", hit_ratio(&mut Lru::new(50), &trace)),
            ("arc", hit_ratio(&mut Arc::new(50), &trace)),
            ("s3-fifo", hit_ratio(&mut S3Fifo::new(50), &trace)),
            ("sieve", hit_ratio(&mut Sieve::new(50), &trace)),
        ] {
            assert!(ratio > 0.1 && ratio <= opt, "{name}: {ratio} against {opt}");
        }
        // A loop of capacity + 1 pages: LRU and SIEVE always evict the page needed next; the
        // optimum keeps all but one.
        let looping: Vec<u64> = (0..600).map(|k| k % 11).collect();
        assert_eq!(hit_ratio(&mut Lru::new(10), &looping), 0.0);
        assert_eq!(hit_ratio(&mut Sieve::new(10), &looping), 0.0);
        assert!(belady_hit_ratio(&looping, 10) > 0.85);
    }
}
