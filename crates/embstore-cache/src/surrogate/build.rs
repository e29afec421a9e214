//! The offline build: exact k-nearest neighbours within a table, then a surrogate per row.

use half::f16;
use rayon::prelude::*;

use super::{f16_up, Metric, SurrogateConfig, Surrogates, MAX_ROWS, NONE};
use crate::{Error, Result};

const NO_ROW: u32 = u32::MAX;
/// Queries per rayon task and candidates per block: 256 rows of D = 36 are 36 KiB, so both
/// stay in L2 while every pair is visited.
const QB: usize = 256;
const CB: usize = 256;
/// The register tile: 4 queries x 8 candidates, 32 accumulators (8 SSE registers).
const TQ: usize = 4;
const TC: usize = 8;

/// Builds the surrogates of one table (see the module docs): `rows` is `[N x dim]` row-major
/// with `N = ids.len()`; `counts[i]` is the access count of `ids[i]` from a window disjoint
/// from the evaluation (`None`: nearest); `version` is the table checkpoint's version (step)
/// the rows come from, kept for the file. Runs on the current rayon pool. Errors: bad `cfg`,
/// `dim` 0, duplicate or reserved ids, non-finite values, more than [`MAX_ROWS`] rows
/// (InvalidArgument); `rows` or `counts` of the wrong length (ShapeMismatch).
pub fn build(
    ids: &[u64],
    rows: &[f32],
    dim: usize,
    counts: Option<&[u64]>,
    cfg: &SurrogateConfig,
    version: u64,
) -> Result<Surrogates> {
    cfg.validate()?;
    let n = ids.len();
    if dim == 0 || dim > u32::MAX as usize {
        return Err(Error::invalid(format!("dim must be in 1..=4294967295, got {dim}")));
    }
    if n.checked_mul(dim) != Some(rows.len()) {
        return Err(Error::shape(format!(
            "rows has {} values, expected ids.len() * dim = {n} * {dim}",
            rows.len()
        )));
    }
    if let Some(c) = counts.filter(|c| c.len() != n) {
        return Err(Error::shape(format!("counts has {} entries, expected {n}", c.len())));
    }
    if n > MAX_ROWS {
        return Err(Error::invalid(format!(
            "{n} rows exceed the exact build's limit of {MAX_ROWS}; an ann index is future work"
        )));
    }
    if let Some(p) = rows.iter().position(|v| !v.is_finite()) {
        let (i, j) = (p / dim, p % dim);
        return Err(Error::invalid(format!(
            "row {i} (id {}) has a non-finite value {} at column {j}",
            ids[i], rows[p]
        )));
    }
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_unstable_by_key(|&i| ids[i as usize]);
    if let Some(w) = order.windows(2).find(|w| ids[w[0] as usize] == ids[w[1] as usize]) {
        return Err(Error::invalid(format!("duplicate id {}", ids[w[0] as usize])));
    }
    if ids.contains(&NONE) {
        return Err(Error::invalid(format!("id {NONE} is reserved for none")));
    }

    let prep = Prepared::new(rows, n, dim, cfg.metric);
    let mut best = vec![(NO_ROW, f16::INFINITY); n];
    best.par_chunks_mut(QB).enumerate().for_each(|(b, out)| {
        let q0 = b * QB;
        for (r, top) in prep.knn(q0, q0 + out.len(), cfg.k).into_iter().enumerate() {
            out[r] = prep.select(q0 + r, &top.idx, counts.filter(|_| cfg.popularity), cfg);
        }
    });
    let alt_of = |i: usize| match best[i].0 {
        NO_ROW => NONE,
        j => ids[j as usize],
    };
    Ok(Surrogates {
        ids: order.iter().map(|&i| ids[i as usize]).collect(),
        alt: order.iter().map(|&i| alt_of(i as usize)).collect(),
        dist: order.iter().map(|&i| best[i as usize].1).collect(),
        dim,
        config: *cfg,
        version,
    })
}

/// The rows as the kernel reads them (see [`Prepared::new`]).
struct Prepared<'a> {
    rows: &'a [f32],
    dim: usize,
    metric: Metric,
    /// `||e_i||` in f64; rows with norm 0 get no surrogate.
    norms: Vec<f64>,
    /// Query rows (unit norm under cosine), padded with zero rows to a multiple of `TQ`.
    queries: Vec<f32>,
    /// Candidates in panels of `TC` rows, each `dim x TC` (lane fastest), zero padded.
    panels: Vec<f32>,
    /// Ranking key of a pair: `bias[c] - scale * dot` (smaller is nearer); +inf excludes `c`.
    bias: Vec<f32>,
    scale: f32,
}

impl<'a> Prepared<'a> {
    fn new(rows: &'a [f32], n: usize, dim: usize, metric: Metric) -> Self {
        let norms: Vec<f64> = rows
            .chunks_exact(dim)
            .map(|r| r.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt())
            .collect();
        let mut queries = vec![0.0f32; n.div_ceil(TQ) * TQ * dim];
        let mut bias = vec![f32::INFINITY; n.div_ceil(TC) * TC];
        for (i, (q, r)) in queries.chunks_exact_mut(dim).zip(rows.chunks_exact(dim)).enumerate() {
            let s = if metric == Metric::Cosine && norms[i] > 0.0 { 1.0 / norms[i] } else { 1.0 };
            for (q, &v) in q.iter_mut().zip(r) {
                *q = (f64::from(v) * s) as f32;
            }
            bias[i] = match metric {
                Metric::Cosine if norms[i] == 0.0 => f32::INFINITY,
                Metric::Cosine => 0.0,
                Metric::L2 => (norms[i] * norms[i]) as f32,
            };
        }
        let mut panels = vec![0.0f32; n.div_ceil(TC) * TC * dim];
        for (p, panel) in panels.chunks_exact_mut(TC * dim).enumerate() {
            for (l, q) in queries.chunks_exact(dim).skip(p * TC).take(TC).enumerate() {
                for (t, &v) in q.iter().enumerate() {
                    panel[t * TC + l] = v;
                }
            }
        }
        let scale = if metric == Metric::Cosine { 1.0 } else { 2.0 };
        Self { rows, dim, metric, norms, queries, panels, bias, scale }
    }

    /// The top-`k` neighbours of rows `q0..q1`, nearest first, self excluded.
    fn knn(&self, q0: usize, q1: usize, k: usize) -> Vec<TopK> {
        let d = self.dim;
        let mut tops: Vec<TopK> = (q0..q1).map(|_| TopK::new(k)).collect();
        // Query tiles of TQ rows, transposed (`dim x TQ`) so the kernel reads them in order.
        let nt = (q1 - q0).div_ceil(TQ);
        let mut tiles = vec![0.0f32; nt * TQ * d];
        for (t, tile) in tiles.chunks_exact_mut(TQ * d).enumerate() {
            let q = &self.queries[(q0 + t * TQ) * d..(q0 + t * TQ + TQ) * d];
            for (r, row) in q.chunks_exact(d).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    tile[j * TQ + r] = v;
                }
            }
        }
        for (b, block) in self.panels.chunks(CB * d).enumerate() {
            for (t, tile) in tiles.chunks_exact(TQ * d).enumerate() {
                for (p, panel) in block.chunks_exact(TC * d).enumerate() {
                    let c0 = b * CB + p * TC;
                    let acc = kernel(tile, panel);
                    for (r, acc) in acc.iter().enumerate() {
                        let Some(top) = tops.get_mut(t * TQ + r) else { break };
                        for (l, &dot) in acc.iter().enumerate() {
                            let key = self.bias[c0 + l] - self.scale * dot;
                            if key < top.worst && c0 + l != q0 + t * TQ + r {
                                top.push(key, (c0 + l) as u32);
                            }
                        }
                    }
                }
            }
        }
        tops
    }

    /// Row `i`'s surrogate among its neighbours `nbrs` (nearest first) and its distance
    /// rounded up to f16, or `(NO_ROW, inf)`.
    fn select(
        &self,
        i: usize,
        nbrs: &[u32],
        counts: Option<&[u64]>,
        cfg: &SurrogateConfig,
    ) -> (u32, f16) {
        if self.norms[i] == 0.0 {
            return (NO_ROW, f16::INFINITY);
        }
        let mut best: Option<(u32, u64, f64, f16)> = None;
        for &j in nbrs {
            let d = self.dist(i, j as usize);
            let h = f16_up(d);
            if h.to_f32() > cfg.max_dist {
                continue;
            }
            let c = counts.map_or(0, |c| c[j as usize]);
            if best.is_none_or(|(_, bc, bd, _)| c > bc || (c == bc && d < bd)) {
                best = Some((j, c, d, h));
            }
        }
        best.map_or((NO_ROW, f16::INFINITY), |(j, _, _, h)| (j, h))
    }

    /// The exact distance between rows `i` and `j`, in f64.
    fn dist(&self, i: usize, j: usize) -> f64 {
        let (a, b) = (self.row(i), self.row(j));
        match self.metric {
            Metric::Cosine => {
                let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
                (1.0 - dot / (self.norms[i] * self.norms[j])).clamp(0.0, 2.0)
            }
            Metric::L2 => {
                let sq: f64 =
                    a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum();
                sq.sqrt() / self.norms[i]
            }
        }
    }

    fn row(&self, i: usize) -> &[f32] {
        &self.rows[i * self.dim..(i + 1) * self.dim]
    }
}

/// Dot products of a query tile (`dim x TQ`) with a candidate panel (`dim x TC`).
#[inline]
fn kernel(tile: &[f32], panel: &[f32]) -> [[f32; TC]; TQ] {
    let mut acc = [[0.0f32; TC]; TQ];
    let (qs, _) = tile.as_chunks::<TQ>();
    let (cs, _) = panel.as_chunks::<TC>();
    for (q, c) in qs.iter().zip(cs) {
        for (acc, &s) in acc.iter_mut().zip(q) {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += s * v;
            }
        }
    }
    acc
}

/// The `k` smallest (key, row) pairs offered, ascending; rows arrive in increasing order, so
/// equal keys keep the lower row.
struct TopK {
    keys: Vec<f32>,
    idx: Vec<u32>,
    k: usize,
    /// The largest kept key once full, +inf before.
    worst: f32,
}

impl TopK {
    fn new(k: usize) -> Self {
        Self { keys: Vec::with_capacity(k), idx: Vec::with_capacity(k), k, worst: f32::INFINITY }
    }

    /// Keeps `(key, row)`; the caller checked `key < worst`.
    fn push(&mut self, key: f32, row: u32) {
        let pos = self.keys.partition_point(|&x| x <= key);
        if self.keys.len() == self.k {
            self.keys.pop();
            self.idx.pop();
        }
        self.keys.insert(pos, key);
        self.idx.insert(pos, row);
        if self.keys.len() == self.k {
            self.worst = self.keys[self.k - 1];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::surrogate::testing::*;
    use crate::surrogate::*;
    use crate::ErrorKind;

    fn naive_dist(metric: Metric, a: &[f32], b: &[f32]) -> f64 {
        let norm = |r: &[f32]| r.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
        match metric {
            Metric::Cosine => {
                let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
                (1.0 - dot / (norm(a) * norm(b))).clamp(0.0, 2.0)
            }
            Metric::L2 => {
                let sq: f64 =
                    a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum();
                sq.sqrt() / norm(a)
            }
        }
    }

    /// Sorted distances from row `i` to every admissible other row.
    fn naive_nbrs(metric: Metric, rows: &[f32], dim: usize, i: usize) -> Vec<f64> {
        let row = |j: usize| &rows[j * dim..(j + 1) * dim];
        let zero = |j: usize| row(j).iter().all(|&v| v == 0.0);
        let mut d: Vec<f64> = (0..rows.len() / dim)
            .filter(|&j| j != i && !(metric == Metric::Cosine && zero(j)))
            .map(|j| naive_dist(metric, row(i), row(j)))
            .collect();
        d.sort_by(f64::total_cmp);
        d
    }

    #[test]
    fn knn_agrees_with_naive_reference() {
        for (seed, n, dim) in [(1u64, 37, 5), (2, 300, 16), (3, 601, 9)] {
            println!("seed {seed}, n {n}, dim {dim}");
            let mut rows = gaussian(seed, n, dim);
            rows[5 * dim..6 * dim].fill(0.0); // a zero row
            let (copy, k) = (rows[..dim].to_vec(), 7);
            rows[7 * dim..8 * dim].copy_from_slice(&copy); // a duplicate row (distance 0)
            for metric in [Metric::Cosine, Metric::L2] {
                let prep = Prepared::new(&rows, n, dim, metric);
                let tops: Vec<TopK> =
                    (0..n).step_by(QB).flat_map(|q0| prep.knn(q0, n.min(q0 + QB), k)).collect();
                for (i, top) in tops.iter().enumerate().filter(|&(i, _)| i != 5) {
                    let want = &naive_nbrs(metric, &rows, dim, i)[..k];
                    let mut got: Vec<f64> =
                        top.idx.iter().map(|&j| prep.dist(i, j as usize)).collect();
                    got.sort_by(f64::total_cmp);
                    assert!(
                        !top.idx.contains(&(i as u32)),
                        "{metric:?} row {i} is its own neighbour"
                    );
                    for (g, w) in got.iter().zip(want) {
                        assert!((g - w).abs() < 1e-5, "{metric:?} row {i}: {got:?} vs {want:?}");
                    }
                    assert_eq!(got.len(), k);
                }
            }
        }
    }

    #[test]
    fn nearest_surrogate_agrees_with_naive_and_respects_max_dist() {
        let (seed, n, dim) = (11u64, 400, 8);
        println!("seed {seed}");
        let rows = gaussian(seed, n, dim);
        let ids = ids(n);
        for metric in [Metric::Cosine, Metric::L2] {
            let nearest: Vec<f64> = (0..n).map(|i| naive_nbrs(metric, &rows, dim, i)[0]).collect();
            let mut sorted = nearest.clone();
            sorted.sort_by(f64::total_cmp);
            let max_dist = sorted[n / 2] as f32;
            let cfg = SurrogateConfig { metric, max_dist, popularity: false, ..Default::default() };
            let s = build(&ids, &rows, dim, None, &cfg, 0).unwrap();
            assert_eq!(s.len(), n);
            assert!((0.4..0.6).contains(&s.coverage()), "coverage {}", s.coverage());
            for i in 0..n {
                let got = s.get(ids[i]);
                let slack = 1e-3;
                if nearest[i] > f64::from(max_dist) + slack {
                    assert_eq!(got, None, "{metric:?} row {i}");
                    continue;
                }
                let Some((alt, d)) = got else {
                    assert!(nearest[i] > f64::from(max_dist) - slack, "{metric:?} row {i}");
                    continue;
                };
                assert_ne!(alt, ids[i]);
                let j = ids.iter().position(|&x| x == alt).unwrap();
                let true_d = naive_dist(metric, &rows[i * dim..][..dim], &rows[j * dim..][..dim]);
                assert!((true_d - nearest[i]).abs() < 1e-5, "{metric:?} row {i} not nearest");
                assert!(f64::from(d) >= true_d - 1e-6 && d <= max_dist, "{metric:?} row {i}: {d}");
            }
        }
        let none = SurrogateConfig { max_dist: 0.0, ..Default::default() };
        let s = build(&ids, &rows, dim, None, &none, 0).unwrap();
        assert_eq!(s.coverage(), 0.0);
        assert!(ids.iter().all(|&id| s.get(id).is_none()));
    }

    #[test]
    fn popularity_picks_the_most_counted_then_the_nearest() {
        // Unit vectors at these angles (rad) from id 10; 1.5 rad is 0.93 away under cosine.
        let ids = [10u64, 11, 12, 13, 14];
        let rows: Vec<f32> =
            [0.0f32, 0.1, 0.2, 0.3, 1.5].iter().flat_map(|a| [a.cos(), a.sin()]).collect();
        let counts = [0u64, 5, 9, 9, 100];
        let cfg = SurrogateConfig::default();
        let s = build(&ids, &rows, 2, Some(&counts), &cfg, 0).unwrap();
        assert_eq!(s.get(10).map(|v| v.0), Some(12)); // 12 and 13 tie at 9; 12 is nearer
        assert_eq!(s.get(11).map(|v| v.0), Some(12));
        assert_eq!(s.get(14), None); // nearest is 13 at 1 - cos(1.2) = 0.64 > 0.5
        let (_, d) = s.get(10).unwrap();
        assert!(f64::from(d) >= 1.0 - 0.2f64.cos() && d < 0.0199 + 0.0001, "{d}");
        let nearest = |cfg: &SurrogateConfig, counts: Option<&[u64]>| {
            build(&ids, &rows, 2, counts, cfg, 0).unwrap().get(10).map(|v| v.0)
        };
        assert_eq!(nearest(&SurrogateConfig { popularity: false, ..cfg }, Some(&counts)), Some(11));
        assert_eq!(nearest(&cfg, None), Some(11));
        assert_eq!(nearest(&SurrogateConfig { k: 1, ..cfg }, Some(&counts)), Some(11));
    }

    #[test]
    fn zero_rows_have_no_surrogate_and_are_none_under_cosine() {
        let ids = [1u64, 2, 3];
        let rows = [0.0f32, 0.0, 1.0, 0.0, 1.0, 0.1];
        let s = build(&ids, &rows, 2, None, &SurrogateConfig::default(), 0).unwrap();
        assert_eq!(s.get(1), None);
        assert_eq!(s.get(2).map(|v| v.0), Some(3));
        assert_eq!(s.get(3).map(|v| v.0), Some(2));
        let l2 = SurrogateConfig { metric: Metric::L2, max_dist: 2.0, ..Default::default() };
        let s = build(&ids, &rows, 2, None, &l2, 0).unwrap();
        assert_eq!(s.get(1), None);
        assert_eq!(s.get(42), None);
        assert!(build(&[], &[], 4, None, &l2, 0).unwrap().is_empty());
    }

    #[test]
    fn bad_input_gives_typed_errors() {
        let cfg = SurrogateConfig::default();
        let (inv, shape) = (ErrorKind::InvalidArgument, ErrorKind::ShapeMismatch);
        let (k0, nan) =
            (SurrogateConfig { k: 0, ..cfg }, SurrogateConfig { max_dist: f32::NAN, ..cfg });
        let many: Vec<u64> = (0..=MAX_ROWS as u64).collect();
        let fails = |r: Result<Surrogates>, kind: ErrorKind, msg: &str| {
            let e = r.unwrap_err();
            assert_eq!((e.kind(), e.message()), (kind, msg));
        };
        let msg = "rows has 3 values, expected ids.len() * dim = 2 * 2";
        fails(build(&[1, 2], &[1.0; 3], 2, None, &cfg, 0), shape, msg);
        let msg = "counts has 1 entries, expected 2";
        fails(build(&[1, 2], &[1.0; 2], 1, Some(&[1]), &cfg, 0), shape, msg);
        fails(build(&[1], &[], 0, None, &cfg, 0), inv, "dim must be in 1..=4294967295, got 0");
        fails(build(&[5, 3, 5], &[1.0; 3], 1, None, &cfg, 0), inv, "duplicate id 5");
        let msg = "row 1 (id 2) has a non-finite value NaN at column 0";
        fails(build(&[1, 2], &[1.0, 2.0, f32::NAN, 0.0], 2, None, &cfg, 0), inv, msg);
        let msg = "id 18446744073709551615 is reserved for none";
        fails(build(&[NONE], &[1.0], 1, None, &cfg, 0), inv, msg);
        fails(build(&[1], &[1.0], 1, None, &k0, 0), inv, "k must be in 1..=1024, got 0");
        fails(
            build(&[1], &[1.0], 1, None, &nan, 0),
            inv,
            "max_dist must be in [0, 65504], got NaN",
        );
        let msg =
            "1048577 rows exceed the exact build's limit of 1048576; an ann index is future work";
        fails(build(&many, &vec![0.0; MAX_ROWS + 1], 1, None, &cfg, 0), inv, msg);
    }

    /// Build time at the sizes of the note (release: `cargo test --release -- --ignored
    /// --nocapture build_time`); prints, asserts nothing about time.
    #[test]
    #[ignore]
    fn build_time() {
        for (n, dim) in [(20_000usize, 16usize), (100_000, 36)] {
            let rows = gaussian(7, n, dim);
            let ids: Vec<u64> = (0..n as u64).collect();
            let counts: Vec<u64> = (0..n as u64).map(|i| i % 97).collect();
            let t = std::time::Instant::now();
            let s = build(&ids, &rows, dim, Some(&counts), &SurrogateConfig::default(), 0).unwrap();
            let secs = t.elapsed().as_secs_f64();
            println!(
                "n {n} dim {dim}: {secs:.2} s on {} threads, coverage {:.3}",
                rayon::current_num_threads(),
                s.coverage()
            );
        }
    }
}
