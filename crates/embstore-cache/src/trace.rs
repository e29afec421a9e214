//! Request traces for the evaluator, the table-qualified key scheme, and the design note's
//! synthetic Criteo-like generator (§6.2).
//!
//! ## Keys
//! A key names one row of one table: `key = table << 48 | id` ([`table_key`]), table in the
//! top 16 bits (up to 65,536 tables), id in the low 48 bits (2.8 × 10^14 rows per table).
//! The note's export format for libCacheSim (`table << 32 | id`, §6.3) is a different, narrower
//! packing; convert with [`split_key`] when writing it.
//!
//! ## Layout
//! A [`Trace`] is ragged, TorchRec-style: `keys` concatenated and `offsets` of length `N + 1`
//! (request `i` is `keys[offsets[i]..offsets[i + 1]]`). A one-hot trace of `N` requests over
//! `G` tables is the `[N, G]` row-major matrix with `offsets = 0, G, 2G, …`:
//!
//! ```text
//! keys    [ t0:7  t1:3  t2:9 | t0:7  t1:4  t2:1 | … ]     N = 2+, G = 3
//! offsets [ 0, 3, 6, … ]
//! ```
//! Every constructor deduplicates each request (first occurrence kept, note §1: a key repeated
//! in one request counts once) and rejects empty requests, so `G_i ≥ 1` for every request.

use crate::{Error, Result};
use embstore_policy::index::KeySet;

/// Bits of a key that hold the row id; the table index sits above them.
pub const TABLE_SHIFT: u32 = 48;
/// Largest row id a key can carry (`2^48 - 1`).
pub const MAX_ID: u64 = (1 << TABLE_SHIFT) - 1;

/// The key of row `id` of table `table`: `table << 48 | id`. Errors if `id > MAX_ID`.
pub fn table_key(table: u16, id: u64) -> Result<u64> {
    if id > MAX_ID {
        return Err(Error::invalid(format!("id must be at most 2^48 - 1, got {id}")));
    }
    Ok((u64::from(table) << TABLE_SHIFT) | id)
}

/// `(table, id)` of a key made by [`table_key`].
pub fn split_key(key: u64) -> (u16, u64) {
    ((key >> TABLE_SHIFT) as u16, key & MAX_ID)
}

/// A sequence of requests, each a non-empty list of distinct u64 keys (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    keys: Vec<u64>,
    offsets: Vec<usize>,
}

impl Trace {
    /// A trace from the `[N, G]` row-major matrix `keys` (`N = keys.len() / g`). Errors:
    /// `g == 0`, or `keys.len()` not a multiple of `g`.
    pub fn from_dense(keys: &[u64], g: usize) -> Result<Self> {
        if g == 0 {
            return Err(Error::shape("g (keys per request) must be at least 1, got 0"));
        }
        if !keys.len().is_multiple_of(g) {
            return Err(Error::shape(format!(
                "keys must hold N x {g} values, got {} (not a multiple of {g})",
                keys.len()
            )));
        }
        Self::from_requests(keys.chunks_exact(g))
    }

    /// A trace from concatenated `keys` and `offsets` (`N + 1` non-decreasing values from 0 to
    /// `keys.len()`). Errors: offsets malformed, or a request empty.
    pub fn from_ragged(keys: &[u64], offsets: &[usize]) -> Result<Self> {
        if offsets.first() != Some(&0) || offsets.last() != Some(&keys.len()) {
            return Err(Error::shape(format!(
                "offsets must start at 0 and end at keys.len() = {}, got {} values from {:?} to {:?}",
                keys.len(),
                offsets.len(),
                offsets.first(),
                offsets.last()
            )));
        }
        if let Some(i) = offsets.windows(2).position(|w| w[1] < w[0]) {
            return Err(Error::shape(format!(
                "offsets must be non-decreasing, got {} then {} at position {i}",
                offsets[i],
                offsets[i + 1]
            )));
        }
        Self::from_requests(offsets.windows(2).map(|w| &keys[w[0]..w[1]]))
    }

    /// A trace from one key list per request. Errors: an empty request.
    pub fn from_requests<I, R>(requests: I) -> Result<Self>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<[u64]>,
    {
        let mut t = Self { keys: Vec::new(), offsets: vec![0] };
        let mut set = KeySet::default();
        for (i, r) in requests.into_iter().enumerate() {
            let r = r.as_ref();
            if r.is_empty() {
                return Err(Error::shape(format!("request {i} is empty")));
            }
            let start = t.keys.len();
            if r.len() <= 32 {
                for &k in r {
                    if !t.keys[start..].contains(&k) {
                        t.keys.push(k);
                    }
                }
            } else {
                set.clear();
                t.keys.extend(r.iter().copied().filter(|&k| set.insert(k)));
            }
            t.offsets.push(t.keys.len());
        }
        Ok(t)
    }

    /// Number of requests `N`.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether there is no request.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Request `i` (its distinct keys, in first-occurrence order). Panics if `i >= len()`.
    pub fn request(&self, i: usize) -> &[u64] {
        &self.keys[self.offsets[i]..self.offsets[i + 1]]
    }

    /// The requests in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u64]> + '_ {
        self.offsets.windows(2).map(|w| &self.keys[w[0]..w[1]])
    }

    /// All keys, concatenated (deduplicated per request).
    pub fn keys(&self) -> &[u64] {
        &self.keys
    }

    /// The `N + 1` offsets into [`keys`](Self::keys).
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// The largest request (`max G`); 0 for an empty trace.
    pub fn max_request_len(&self) -> usize {
        self.offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
    }

    /// Number of distinct keys in the whole trace (the note's cache-size denominator).
    pub fn unique_keys(&self) -> usize {
        let mut set = KeySet::default();
        set.extend(self.keys.iter().copied());
        set.len()
    }
}

/// SplitMix64 (Steele, Lea and Flood 2014), the seeded generator of traces and figures; its
/// home is `embstore-common` (this path stays for the crate's users).
pub use embstore_common::SplitMix64;

/// Zipf(α) over ranks `0..n` by inverse CDF (binary search in a precomputed table): rank `r`
/// has probability ∝ `(r + 1)^-α`.
#[derive(Clone, Debug)]
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u64, alpha: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|r| {
                acc += (r as f64).powf(-alpha);
                acc
            })
            .collect();
        let total = acc;
        for c in &mut cdf {
            *c /= total;
        }
        Self { cdf }
    }

    fn sample(&self, rng: &mut SplitMix64) -> u64 {
        let u = rng.next_f64();
        (self.cdf.partition_point(|&c| c <= u) as u64).min(self.cdf.len() as u64 - 1)
    }
}

/// The note's synthetic Criteo-like trace (§6.2): `num_contexts` contexts with Zipf(α)
/// popularity; table sizes log-spaced from `min_table_size` to `max_table_size`; each request
/// draws a context, and each table takes the context's own row with probability `rho` (co-access),
/// else an independent Zipf(α) row of that table. `drift > 0` rotates context popularity:
/// request `i` maps popularity rank `r` to context `(r + ⌊i·drift⌋) mod num_contexts`.
///
/// Rows: rank `r` of table `t` is row `r` (so the most popular rows of a table are its small
/// ids), and the context's own row in table `t` is `context mod size_t`: popular contexts
/// share their rows with the popular independent draws in small tables. Keys: [`table_key`].
/// The same configuration gives the same trace on every run and platform.
#[derive(Clone, Debug, PartialEq)]
pub struct Synthetic {
    /// Requests `N` (note: 200,000).
    pub num_requests: usize,
    /// Tables `T` (one key each per request; Criteo: 26).
    pub num_tables: usize,
    /// Contexts `M` (note: 200,000).
    pub num_contexts: u64,
    /// Zipf exponent α of contexts and of independent draws (note: 1.0).
    pub zipf_alpha: f64,
    /// Rows of the smallest table (note: 10).
    pub min_table_size: u64,
    /// Rows of the largest table (note: 200,000).
    pub max_table_size: u64,
    /// Co-access ρ in [0, 1] (note: 0.3, 0.7, 0.9).
    pub rho: f64,
    /// Contexts of popularity rotation per request (0 = stationary).
    pub drift: f64,
    /// Seed of the generator.
    pub seed: u64,
}

impl Default for Synthetic {
    fn default() -> Self {
        Self {
            num_requests: 200_000,
            num_tables: 26,
            num_contexts: 200_000,
            zipf_alpha: 1.0,
            min_table_size: 10,
            max_table_size: 200_000,
            rho: 0.7,
            drift: 0.0,
            seed: 0,
        }
    }
}

impl Synthetic {
    /// Checks the parameters: at least one request, table and context; 1 ≤ table count ≤
    /// 65,536; 1 ≤ min size ≤ max size ≤ 2^48; α finite and ≥ 0; ρ in [0, 1]; drift finite and ≥ 0.
    pub fn validate(&self) -> Result<()> {
        if self.num_requests == 0 || self.num_contexts == 0 {
            return Err(Error::invalid("num_requests and num_contexts must be at least 1"));
        }
        if self.num_tables == 0 || self.num_tables > 1 << 16 {
            return Err(Error::invalid(format!(
                "num_tables must be in 1..=65536, got {}",
                self.num_tables
            )));
        }
        if self.min_table_size == 0
            || self.min_table_size > self.max_table_size
            || self.max_table_size > MAX_ID + 1
        {
            return Err(Error::invalid(format!(
                "table sizes must satisfy 1 <= min <= max <= 2^48, got {} and {}",
                self.min_table_size, self.max_table_size
            )));
        }
        if !(self.zipf_alpha.is_finite() && self.zipf_alpha >= 0.0) {
            return Err(Error::invalid(format!(
                "zipf_alpha must be finite and >= 0, got {}",
                self.zipf_alpha
            )));
        }
        if !(0.0..=1.0).contains(&self.rho) {
            return Err(Error::invalid(format!("rho must be in [0, 1], got {}", self.rho)));
        }
        if !(self.drift.is_finite() && self.drift >= 0.0) {
            return Err(Error::invalid(format!(
                "drift must be finite and >= 0, got {}",
                self.drift
            )));
        }
        Ok(())
    }

    /// Rows per table: log-spaced from min to max (table 0 the smallest).
    pub fn table_sizes(&self) -> Vec<u64> {
        let t = self.num_tables;
        let (lo, hi) = (self.min_table_size as f64, self.max_table_size as f64);
        (0..t)
            .map(|i| {
                if t == 1 {
                    return self.max_table_size;
                }
                let x = lo * (hi / lo).powf(i as f64 / (t - 1) as f64);
                (x.round() as u64).clamp(self.min_table_size, self.max_table_size)
            })
            .collect()
    }

    /// Generates the `[N, T]` trace. Memory: the Zipf tables hold one f64 per context and per
    /// row of every table (about 5 MB with the defaults).
    pub fn generate(&self) -> Result<Trace> {
        self.validate()?;
        let sizes = self.table_sizes();
        let contexts = Zipf::new(self.num_contexts, self.zipf_alpha);
        let tables: Vec<Zipf> = sizes.iter().map(|&n| Zipf::new(n, self.zipf_alpha)).collect();
        let mut rng = SplitMix64::new(self.seed);
        let t = self.num_tables;
        let mut keys = Vec::with_capacity(self.num_requests * t);
        for i in 0..self.num_requests {
            let shift = ((i as f64) * self.drift) as u64 % self.num_contexts;
            let ctx = (contexts.sample(&mut rng) + shift) % self.num_contexts;
            for (tab, (&n, z)) in sizes.iter().zip(&tables).enumerate() {
                let id = if rng.next_f64() < self.rho { ctx % n } else { z.sample(&mut rng) };
                keys.push(((tab as u64) << TABLE_SHIFT) | id);
            }
        }
        Trace::from_dense(&keys, t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn key_scheme_round_trips() {
        let k = table_key(25, 123_456).unwrap();
        assert_eq!(k, (25 << 48) | 123_456);
        assert_eq!(split_key(k), (25, 123_456));
        assert_eq!(table_key(1, 1 << 48).unwrap_err().kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn constructors_dedup_and_validate() {
        let t = Trace::from_dense(&[1, 2, 1, 3, 3, 3], 3).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.request(0), &[1, 2]);
        assert_eq!(t.request(1), &[3]);
        assert_eq!(t.max_request_len(), 2);
        assert_eq!(t.unique_keys(), 3);
        let e = Trace::from_dense(&[1, 2, 3], 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
        assert_eq!(e.to_string(), "keys must hold N x 2 values, got 3 (not a multiple of 2)");
        assert_eq!(Trace::from_dense(&[], 0).unwrap_err().kind(), ErrorKind::ShapeMismatch);
        let r = Trace::from_ragged(&[1, 2, 3], &[0, 1, 3]).unwrap();
        assert_eq!(r.request(1), &[2, 3]);
        let e = Trace::from_ragged(&[1, 2, 3], &[0, 1, 1, 3]).unwrap_err();
        assert_eq!(e.to_string(), "request 1 is empty");
        assert!(Trace::from_ragged(&[1, 2, 3], &[0, 2]).is_err());
        assert!(Trace::from_ragged(&[1, 2, 3], &[0, 2, 1, 3]).is_err());
        assert!(Trace::from_ragged(&[], &[]).is_err());
        let long: Vec<u64> = (0..100).chain(0..100).collect();
        assert_eq!(Trace::from_requests([&long]).unwrap().request(0).len(), 100);
    }

    #[test]
    fn synthetic_is_deterministic_and_shaped() {
        let s = Synthetic { num_requests: 2_000, num_contexts: 5_000, ..Default::default() };
        let a = s.generate().unwrap();
        assert_eq!(a, s.generate().unwrap());
        assert_eq!(a.len(), 2_000);
        assert_eq!(a.max_request_len(), 26);
        let sizes = s.table_sizes();
        assert_eq!((sizes[0], sizes[25]), (10, 200_000));
        for r in a.iter() {
            for (t, &k) in r.iter().enumerate() {
                let (tab, id) = split_key(k);
                assert_eq!(tab as usize, t);
                assert!(id < sizes[t]);
            }
        }
        let b = Synthetic { seed: 1, ..s.clone() }.generate().unwrap();
        assert_ne!(a, b);
        // Co-access: with rho = 1 every request is a pure context, so far fewer unique keys.
        let one = Synthetic { rho: 1.0, ..s.clone() }.generate().unwrap();
        assert!(one.unique_keys() < a.unique_keys());
        assert!(Synthetic { rho: 1.5, ..s }.generate().is_err());
    }

    #[test]
    fn zipf_rank_zero_is_most_popular() {
        let z = Zipf::new(100, 1.0);
        let mut rng = SplitMix64::new(3);
        let mut counts = [0u32; 100];
        for _ in 0..20_000 {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        // P(rank 0) = 1 / H_100 ≈ 0.193.
        assert!((3_500..4_200).contains(&counts[0]), "{}", counts[0]);
        assert!(counts[0] > counts[1] && counts[1] > counts[10]);
    }
}
