//! Row codecs for the L2 level (EVMix, design note `evstore.md` §3.2): an f32 row of
//! dimension `D` is stored in lower precision so that more rows fit in the same bytes.
//!
//! ```text
//! codec    bytes/row    layout (little-endian)
//! F32      4·D          [x0 f32][x1 f32] …                          bit-exact
//! F16      2·D          [x0 f16][x1 f16] …                          IEEE binary16, RNE
//! Int8Row  4 + D        [lo f16][scale f16][q0][q1] …               x̂ = lo + q·scale, q ≤ 255
//! Int4Row  4 + ⌈D/2⌉    [lo f16][scale f16][q1<<4|q0][q3<<4|q2] …   q ≤ 15; odd D: last high
//!                                                                   nibble is 0
//! ```
//!
//! The per-row header of [`Int8Row`]/[`Int4Row`] is chosen so that every finite value lies on
//! the grid's range: `lo` is `min(row)` rounded *down* to f16, `scale` is
//! `(max(row) − lo) / levels` rounded *up* to f16, and the codes are computed from these
//! rounded values, the same ones decode uses.
//!
//! ## Invariants (note §3.4, tested below)
//! - [`F32`] is bit-exact; [`F16`] equals `half::f16::from_f32` with finite overflow saturated
//!   to ±65504 (±inf and NaN pass through).
//! - Affine codecs, for finite rows with |x| ≤ 65504: per element `|x − x̂| ≤ scale/2` (plus
//!   f32 arithmetic), where `scale` is the stored one, itself at most one f16 rounding above
//!   `(max − min + ulp₁₆(min)) / levels`; so the row's min and max decode within half a step.
//! - Decode is monotone in the code. Re-encoding a decoded row with its stored `(lo, scale)`
//!   reproduces the codes whenever f32 resolves the grid (`4·ulp₃₂(max |x|) ≤ scale`, true at
//!   embedding scales). A row whose min and max are the same f16 value stores `scale = 0`,
//!   codes 0, and decodes to `lo`.
//! - Non-finite input never panics: `lo`/`scale` come from the finite values only (0 and 0
//!   when there are none), NaN and −inf encode as code 0, +inf as the top code. The cache
//!   rejects non-finite rows before encoding, so this only has to be deterministic.
//! - Lengths are the caller's contract: `out.len() == bytes_per_row(row.len())` for `encode`,
//!   `code.len() == bytes_per_row(out.len())` for `decode`. A mismatch is a bug: it fails a
//!   `debug_assert!`; in release a buffer that is too short panics (slice index) and extra
//!   bytes are ignored. No codec uses `unsafe` and `decode` never allocates.
//!
//! Feature `compat` adds the paper's clipping codecs [`Ev16`], [`Ev8`] and [`Ev4`], for
//! reproducing its figures only (their error is large at real embedding scales, note §3.2).

use std::fmt;
use std::str::FromStr;

use half::f16;

use crate::{Error, Result};

/// Largest finite f16; larger finite values saturate to it.
const F16_MAX: f32 = 65504.0;
/// Bytes of the affine codecs' per-row header: `lo` and `scale`, one f16 each.
const HEADER: usize = 4;

/// Stores one row of `D` f32 values in `bytes_per_row(D)` bytes (see the module docs).
pub trait Codec: Send + Sync + fmt::Debug {
    /// The codec's name, as [`CodecKind::parse`] accepts it (`"int8"`, …).
    fn name(&self) -> &'static str;
    /// Bytes one encoded row of dimension `dim` takes.
    fn bytes_per_row(&self, dim: usize) -> usize;
    /// Encodes `row` into `out`; `out.len()` must be `bytes_per_row(row.len())`.
    fn encode(&self, row: &[f32], out: &mut [u8]);
    /// Decodes `code` into `out` (`D = out.len()` values); `code.len()` must be
    /// `bytes_per_row(out.len())`. Does not allocate.
    fn decode(&self, code: &[u8], out: &mut [f32]);
    /// Whether `decode(encode(row))` is bit-exact for every row (only [`F32`]).
    fn lossless(&self) -> bool {
        false
    }
}

/// `out[..n]`, checking in debug builds that `out` is exactly `n` bytes long.
fn fit_mut(out: &mut [u8], n: usize) -> &mut [u8] {
    debug_assert_eq!(out.len(), n, "code buffer is {} bytes, expected {n}", out.len());
    &mut out[..n]
}

/// `code[..n]`, checking in debug builds that `code` is exactly `n` bytes long.
fn fit(code: &[u8], n: usize) -> &[u8] {
    debug_assert_eq!(code.len(), n, "code is {} bytes, expected {n}", code.len());
    &code[..n]
}

/// Full precision: the f32 values' little-endian bytes, bit-exact (NaN payloads included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct F32;

impl Codec for F32 {
    fn name(&self) -> &'static str {
        "f32"
    }
    fn bytes_per_row(&self, dim: usize) -> usize {
        4 * dim
    }
    fn encode(&self, row: &[f32], out: &mut [u8]) {
        let out = fit_mut(out, self.bytes_per_row(row.len()));
        for (c, x) in out.chunks_exact_mut(4).zip(row) {
            c.copy_from_slice(&x.to_le_bytes());
        }
    }
    fn decode(&self, code: &[u8], out: &mut [f32]) {
        let code = fit(code, self.bytes_per_row(out.len()));
        for (o, c) in out.iter_mut().zip(code.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    fn lossless(&self) -> bool {
        true
    }
}

/// IEEE binary16 via `half`, round-to-nearest-even; finite values beyond ±65504 saturate
/// to ±65504 instead of becoming ±inf. ±inf and NaN stay what they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct F16;

impl Codec for F16 {
    fn name(&self) -> &'static str {
        "f16"
    }
    fn bytes_per_row(&self, dim: usize) -> usize {
        2 * dim
    }
    fn encode(&self, row: &[f32], out: &mut [u8]) {
        let out = fit_mut(out, self.bytes_per_row(row.len()));
        for (c, &x) in out.chunks_exact_mut(2).zip(row) {
            let x = if x.is_finite() { x.clamp(-F16_MAX, F16_MAX) } else { x };
            c.copy_from_slice(&f16::from_f32(x).to_le_bytes());
        }
    }
    fn decode(&self, code: &[u8], out: &mut [f32]) {
        let code = fit(code, self.bytes_per_row(out.len()));
        for (o, c) in out.iter_mut().zip(code.chunks_exact(2)) {
            *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
        }
    }
}

/// Per-row affine 8-bit: a 4-byte header `(lo, scale)` in f16, then one code `q ≤ 255` per
/// element; `x̂ = lo + q·scale`. Relative RMSE ≈ 0.005 on Gaussian rows at any scale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int8Row;

impl Codec for Int8Row {
    fn name(&self) -> &'static str {
        "int8"
    }
    fn bytes_per_row(&self, dim: usize) -> usize {
        HEADER + dim
    }
    fn encode(&self, row: &[f32], out: &mut [u8]) {
        let out = fit_mut(out, self.bytes_per_row(row.len()));
        let (lo, scale) = affine_header(row, 255);
        encode_affine(row, lo, scale, 255, out);
    }
    fn decode(&self, code: &[u8], out: &mut [f32]) {
        let code = fit(code, self.bytes_per_row(out.len()));
        let (lo, scale) = header(code);
        for (o, &q) in out.iter_mut().zip(&code[HEADER..]) {
            *o = lo + f32::from(q) * scale;
        }
    }
}

/// Per-row affine 4-bit: [`Int8Row`] with 15 steps (`q ≤ 15`), two codes per byte, element
/// `2j` in the low nibble. Relative RMSE ≈ 0.08 on Gaussian rows at any scale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int4Row;

impl Codec for Int4Row {
    fn name(&self) -> &'static str {
        "int4"
    }
    fn bytes_per_row(&self, dim: usize) -> usize {
        HEADER + dim.div_ceil(2)
    }
    fn encode(&self, row: &[f32], out: &mut [u8]) {
        let out = fit_mut(out, self.bytes_per_row(row.len()));
        let (lo, scale) = affine_header(row, 15);
        encode_affine(row, lo, scale, 15, out);
    }
    fn decode(&self, code: &[u8], out: &mut [f32]) {
        let code = fit(code, self.bytes_per_row(out.len()));
        let (lo, scale) = header(code);
        for (pair, &b) in out.chunks_mut(2).zip(&code[HEADER..]) {
            pair[0] = lo + f32::from(b & 15) * scale;
            if let Some(o) = pair.get_mut(1) {
                *o = lo + f32::from(b >> 4) * scale;
            }
        }
    }
}

/// `x` rounded to an f16 on the chosen side (`up`: the least f16 ≥ x); |x| ≤ 65504.
fn f16_toward(x: f64, up: bool) -> f16 {
    let h = f16::from_f64(x);
    let v = h.to_f64();
    if v == x || (v > x) == up {
        return h;
    }
    // One ulp away from `h` on the needed side; ±0 steps to the smallest subnormal.
    let b = h.to_bits();
    f16::from_bits(match v == 0.0 {
        true if up => 0x0001,
        true => 0x8001,
        false if (v > 0.0) == up => b + 1,
        false => b - 1,
    })
}

/// The affine header of `row` for `levels` steps: `lo = min` rounded down, `scale =
/// (max − lo)/levels` rounded up, over the finite values (0, 0 when there are none).
fn affine_header(row: &[f32], levels: u8) -> (f16, f16) {
    let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
    for &x in row.iter().filter(|x| x.is_finite()) {
        (min, max) = (min.min(x), max.max(x));
    }
    if min > max {
        return (f16::ZERO, f16::ZERO);
    }
    let lo = f16_toward(f64::from(min.clamp(-F16_MAX, F16_MAX)), false);
    let step = (f64::from(max) - lo.to_f64()) / f64::from(levels);
    let scale = if step > 0.0 { f16_toward(step.min(f64::from(F16_MAX)), true) } else { f16::ZERO };
    (lo, scale)
}

/// Writes the header `(lo, scale)` and the codes of `row` on that grid into `out`
/// (`levels` 255: one code per byte; 15: two per byte, low nibble first).
fn encode_affine(row: &[f32], lo: f16, scale: f16, levels: u8, out: &mut [u8]) {
    out[..2].copy_from_slice(&lo.to_le_bytes());
    out[2..HEADER].copy_from_slice(&scale.to_le_bytes());
    let (lo, scale) = (lo.to_f32(), scale.to_f32());
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    // NaN (NaN input, or inf·0) survives the clamp and `as u8` turns it into code 0.
    let q = |x: f32| ((x - lo) * inv).round().clamp(0.0, f32::from(levels)) as u8;
    let codes = &mut out[HEADER..];
    if levels == 255 {
        codes.iter_mut().zip(row).for_each(|(c, &x)| *c = q(x));
    } else {
        for (c, pair) in codes.iter_mut().zip(row.chunks(2)) {
            *c = q(pair[0]) | pair.get(1).map_or(0, |&x| q(x) << 4);
        }
    }
}

/// The decoded `(lo, scale)` of an affine code.
fn header(code: &[u8]) -> (f32, f32) {
    let lo = f16::from_le_bytes([code[0], code[1]]);
    (lo.to_f32(), f16::from_le_bytes([code[2], code[3]]).to_f32())
}

/// `‖x − decode(encode(x))‖ / ‖x‖` in f64 (0 for an exact round trip, inf for a zero row
/// that does not decode to zero). Allocates; for benchmarks and tests, not the hot path.
pub fn relative_rmse(codec: &dyn Codec, row: &[f32]) -> f64 {
    let mut code = vec![0u8; codec.bytes_per_row(row.len())];
    let mut back = vec![0f32; row.len()];
    codec.encode(row, &mut code);
    codec.decode(&code, &mut back);
    let (mut err, mut norm) = (0f64, 0f64);
    for (&x, &y) in row.iter().zip(&back) {
        err += (f64::from(x) - f64::from(y)).powi(2);
        norm += f64::from(x).powi(2);
    }
    if err == 0.0 {
        0.0
    } else {
        (err / norm).sqrt()
    }
}

/// Clips to [−1, 1] for the paper's codecs; NaN becomes 0.
#[cfg(feature = "compat")]
fn clip(v: f32) -> f32 {
    if v.is_nan() {
        0.0
    } else {
        v.clamp(-1.0, 1.0)
    }
}

/// EV-16 (compat), an approximation: linear on clipped [−1, 1] with 65535 levels
/// (`q = round((v+1)/2·65534)`, step 3.05e-5). The artifact's exact mapping (linear on
/// [−0.65, 0.65] with 0.01-step tails, sign in the parity) is not reproduced.
#[cfg(feature = "compat")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ev16;

#[cfg(feature = "compat")]
impl Codec for Ev16 {
    fn name(&self) -> &'static str {
        "ev16"
    }
    fn bytes_per_row(&self, dim: usize) -> usize {
        2 * dim
    }
    fn encode(&self, row: &[f32], out: &mut [u8]) {
        let out = fit_mut(out, self.bytes_per_row(row.len()));
        for (c, &v) in out.chunks_exact_mut(2).zip(row) {
            let q = ((clip(v) + 1.0) / 2.0 * 65534.0).round() as u16;
            c.copy_from_slice(&q.to_le_bytes());
        }
    }
    fn decode(&self, code: &[u8], out: &mut [f32]) {
        let code = fit(code, self.bytes_per_row(out.len()));
        for (o, c) in out.iter_mut().zip(code.chunks_exact(2)) {
            *o = f32::from(u16::from_le_bytes([c[0], c[1]])) / 32767.0 - 1.0;
        }
    }
}

/// EV-8 (compat, paper §5.3): `q = round((v+1)/2·254)` on clipped [−1, 1], step 0.00787;
/// 0.23 → 156.
#[cfg(feature = "compat")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ev8;

#[cfg(feature = "compat")]
impl Codec for Ev8 {
    fn name(&self) -> &'static str {
        "ev8"
    }
    fn bytes_per_row(&self, dim: usize) -> usize {
        dim
    }
    fn encode(&self, row: &[f32], out: &mut [u8]) {
        let out = fit_mut(out, self.bytes_per_row(row.len()));
        for (c, &v) in out.iter_mut().zip(row) {
            *c = ((clip(v) + 1.0) / 2.0 * 254.0).round() as u8;
        }
    }
    fn decode(&self, code: &[u8], out: &mut [f32]) {
        let code = fit(code, self.bytes_per_row(out.len()));
        for (o, &q) in out.iter_mut().zip(code) {
            *o = f32::from(q) / 127.0 - 1.0;
        }
    }
}

/// EV-4's 15-level Posit-like codebook (paper §5.3), ascending; the code is the index.
#[cfg(feature = "compat")]
pub const EV4_CODEBOOK: [f32; 15] = [
    -1.0, -0.8, -0.6, -0.4, -0.0625, -0.0039, -1.5e-5, 0.0, 1.5e-5, 0.0039, 0.0625, 0.4, 0.6, 0.8,
    1.0,
];

/// EV-4 (compat): the nearest [`EV4_CODEBOOK`] value (a tie goes to the lower one; the
/// artifact's own boundary cases are not reproduced), two codes per byte, low nibble first.
#[cfg(feature = "compat")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ev4;

#[cfg(feature = "compat")]
impl Codec for Ev4 {
    fn name(&self) -> &'static str {
        "ev4"
    }
    fn bytes_per_row(&self, dim: usize) -> usize {
        dim.div_ceil(2)
    }
    fn encode(&self, row: &[f32], out: &mut [u8]) {
        let out = fit_mut(out, self.bytes_per_row(row.len()));
        let q = |v: f32| {
            let v = clip(v);
            let b = &EV4_CODEBOOK;
            (0..14).take_while(|&i| v > (b[i] + b[i + 1]) / 2.0).count() as u8
        };
        for (c, pair) in out.iter_mut().zip(row.chunks(2)) {
            *c = q(pair[0]) | pair.get(1).map_or(0, |&x| q(x) << 4);
        }
    }
    fn decode(&self, code: &[u8], out: &mut [f32]) {
        let code = fit(code, self.bytes_per_row(out.len()));
        let v = |q: u8| EV4_CODEBOOK[usize::from(q).min(14)];
        for (pair, &b) in out.chunks_mut(2).zip(code) {
            pair[0] = v(b & 15);
            if let Some(o) = pair.get_mut(1) {
                *o = v(b >> 4);
            }
        }
    }
}

/// Names a codec, for configuration: `"f32"`, `"f16"`, `"int8"`, `"int4"` (and `"ev16"`,
/// `"ev8"`, `"ev4"` with feature `compat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CodecKind {
    /// [`F32`].
    F32,
    /// [`F16`].
    F16,
    /// [`Int8Row`].
    Int8,
    /// [`Int4Row`].
    Int4,
    /// [`Ev16`] (compat).
    #[cfg(feature = "compat")]
    Ev16,
    /// [`Ev8`] (compat).
    #[cfg(feature = "compat")]
    Ev8,
    /// [`Ev4`] (compat).
    #[cfg(feature = "compat")]
    Ev4,
}

impl CodecKind {
    /// Every kind, in the order of [`CodecKind::NAMES`].
    #[cfg(not(feature = "compat"))]
    pub const ALL: &'static [Self] = &[Self::F32, Self::F16, Self::Int8, Self::Int4];
    /// Every kind, in the order of [`CodecKind::NAMES`].
    #[cfg(feature = "compat")]
    pub const ALL: &'static [Self] =
        &[Self::F32, Self::F16, Self::Int8, Self::Int4, Self::Ev16, Self::Ev8, Self::Ev4];
    /// The accepted names.
    #[cfg(not(feature = "compat"))]
    pub const NAMES: &'static [&'static str] = &["f32", "f16", "int8", "int4"];
    /// The accepted names.
    #[cfg(feature = "compat")]
    pub const NAMES: &'static [&'static str] =
        &["f32", "f16", "int8", "int4", "ev16", "ev8", "ev4"];

    /// The kind called `name` (exact, lowercase), if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The codec's name.
    pub fn name(self) -> &'static str {
        self.codec().name()
    }

    /// The codec itself (a unit struct, so no allocation).
    pub fn codec(self) -> &'static dyn Codec {
        match self {
            Self::F32 => &F32,
            Self::F16 => &F16,
            Self::Int8 => &Int8Row,
            Self::Int4 => &Int4Row,
            #[cfg(feature = "compat")]
            Self::Ev16 => &Ev16,
            #[cfg(feature = "compat")]
            Self::Ev8 => &Ev8,
            #[cfg(feature = "compat")]
            Self::Ev4 => &Ev4,
        }
    }
}

impl fmt::Display for CodecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CodecKind {
    type Err = Error;

    /// [`CodecKind::parse`]; an unknown name is an `UnknownName` error.
    fn from_str(name: &str) -> Result<Self> {
        Self::parse(name).ok_or_else(|| {
            let known = Self::NAMES.join(", ");
            Error::unknown_name(format!("unknown codec '{name}', expected one of: {known}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Deterministic Gaussian rows from the crate's SplitMix64.
    struct Rng {
        g: crate::trace::SplitMix64,
    }

    #[allow(non_snake_case)]
    fn Rng(seed: u64) -> Rng {
        Rng { g: crate::trace::SplitMix64::new(seed) }
    }

    impl Rng {
        fn row(&mut self, dim: usize, mean: f32, sigma: f32) -> Vec<f32> {
            (0..dim).map(|_| mean + sigma * self.g.normal() as f32).collect()
        }
    }

    fn round_trip(c: &dyn Codec, row: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let (mut code, mut back) = (vec![0u8; c.bytes_per_row(row.len())], vec![0f32; row.len()]);
        c.encode(row, &mut code);
        c.decode(&code, &mut back);
        (code, back)
    }

    /// Invariants (4) and (6) of an affine codec with `levels` steps on one finite row.
    fn check_affine(c: &dyn Codec, levels: u8, row: &[f32]) {
        let (code, back) = round_trip(c, row);
        let (lo, s) = header(&code);
        let min = row.iter().copied().fold(f32::INFINITY, f32::min);
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let ulp16 = |x: f32| {
            let h = f16::from_f32(x.abs());
            f16::from_bits(h.to_bits() + 1).to_f32() - h.to_f32()
        };
        let ideal = (max - min + ulp16(min)) / f32::from(levels);
        assert!(lo <= min && s <= ideal * (1.0 + 1.0 / 1024.0) + 6e-8, "{row:?}: {lo} {s}");
        let tol = s / 2.0 + 4.0 * f32::EPSILON * (lo.abs() + f32::from(levels) * s);
        for (x, y) in row.iter().zip(&back) {
            assert!((x - y).abs() <= tol, "{}: {x} -> {y}, tol {tol}", c.name());
        }
        // (6) needs f32 to resolve the grid near the row's values.
        let big = min.abs().max(max.abs()) + s;
        if 4.0 * (f32::from_bits(big.to_bits() + 1) - big) <= s {
            let mut again = vec![0u8; code.len()];
            encode_affine(&back, f16::from_f32(lo), f16::from_f32(s), levels, &mut again);
            assert_eq!(again, code, "{}: re-encoding {row:?}", c.name());
        }
    }

    #[test]
    fn bytes_per_row_and_names() {
        let expect: &[(&dyn Codec, [usize; 3])] = &[
            (&F32, [64, 144, 512]),
            (&F16, [32, 72, 256]),
            (&Int8Row, [20, 40, 132]),
            (&Int4Row, [12, 22, 68]),
        ];
        for (c, bytes) in expect {
            assert_eq!([16, 36, 128].map(|d| c.bytes_per_row(d)), *bytes, "{}", c.name());
        }
        for (i, &k) in CodecKind::ALL.iter().enumerate() {
            assert_eq!((k.name(), CodecKind::parse(k.name())), (CodecKind::NAMES[i], Some(k)));
            assert_eq!(k.codec().lossless(), k == CodecKind::F32);
        }
        assert_eq!(CodecKind::parse("INT8"), None);
        let e = "bf16".parse::<CodecKind>().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::UnknownName);
        assert!(e.message().starts_with("unknown codec 'bf16', expected one of: f32, f16, int8"));
    }

    #[test]
    fn f32_is_bit_exact() {
        let row = [0.0, -0.0, 1e-45, -3.4e38, f32::INFINITY, f32::from_bits(0x7fc0_1234), 0.1];
        let (_, back) = round_trip(&F32, &row);
        assert_eq!(
            row.map(f32::to_bits).to_vec(),
            back.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn f16_matches_half_and_saturates() {
        let row = Rng(1).row(64, 0.0, 3.0);
        let (_, back) = round_trip(&F16, &row);
        for (x, y) in row.iter().zip(&back) {
            assert_eq!(f16::from_f32(*x).to_f32(), *y);
        }
        let tie = 1.0 + 2f32.powi(-11); // halfway between 1 and 1 + 2^-10: even is 1
        let row = [tie, 1.0 + 3.0 * 2f32.powi(-11), 1e6, -7e4, 65519.0, f32::NEG_INFINITY];
        let (_, back) = round_trip(&F16, &row);
        assert_eq!(back, [1.0, 1.0 + 2f32.powi(-9), 65504.0, -65504.0, 65504.0, f32::NEG_INFINITY]);
        assert!(round_trip(&F16, &[f32::NAN]).1[0].is_nan());
    }

    #[test]
    fn affine_bounds_on_gaussian_rows() {
        let mut rng = Rng(7);
        for dim in [1, 2, 3, 16, 35, 36, 128] {
            for sigma in [1e-3, 0.01, 0.05, 0.2, 0.5, 3.0] {
                for mean in [0.0, 0.3, -1.7] {
                    let row = rng.row(dim, mean, sigma);
                    check_affine(&Int8Row, 255, &row);
                    check_affine(&Int4Row, 15, &row);
                }
            }
        }
    }

    #[test]
    fn decode_is_monotone_in_the_code() {
        for (lo, s) in [(-0.37, 0.0021), (1.0, 6e-8), (-65504.0, 65504.0), (0.5, 0.0)] {
            let head = [f16::from_f32(lo).to_le_bytes(), f16::from_f32(s).to_le_bytes()].concat();
            let mut out = vec![0f32; 256];
            Int8Row.decode(&[&head[..], &(0..=255).collect::<Vec<u8>>()].concat(), &mut out);
            let mut out4 = vec![0f32; 16];
            let packed: Vec<u8> = (0..8).map(|j| (2 * j) | ((2 * j + 1) << 4)).collect();
            Int4Row.decode(&[&head[..], &packed].concat(), &mut out4);
            for v in [&out, &out4] {
                assert!(v.windows(2).all(|w| w[0] <= w[1]), "({lo}, {s}): {v:?}");
                assert!(lo != -0.37 || v.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }

    #[test]
    fn constant_rows_odd_dims_and_nibble_order() {
        for c in [&Int8Row as &dyn Codec, &Int4Row] {
            let (code, back) = round_trip(c, &[0.25; 7]); // an f16 value: scale 0, codes 0
            assert!(code[2..].iter().all(|&b| b == 0) && back == [0.25; 7]);
            let (_, back) = round_trip(c, &[0.1; 5]); // not an f16 value: a tiny scale
            assert!(back.iter().all(|y| (y - 0.1).abs() < 1e-6), "{back:?}");
        }
        let row = Rng(3).row(35, 0.1, 0.2);
        let (code, _) = round_trip(&Int4Row, &row);
        assert_eq!((code.len(), code[21] >> 4), (22, 0));
        check_affine(&Int4Row, 15, &row);
        let (code, back) = round_trip(&Int4Row, &[1.0, 0.0, 0.0]);
        assert_eq!((code[4], code[5]), (0x0F, 0x00)); // element 0 in the low nibble
        assert!((back[0] - 1.0).abs() <= header(&code).1 / 2.0);
    }

    #[test]
    fn non_finite_input_is_deterministic() {
        let row = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0, 2.0, 1.5];
        let (code, back) = round_trip(&Int8Row, &row);
        let (lo, s) = header(&code);
        assert_eq!((lo, &code[4..9]), (1.0, &[0, 255, 0, 0, 255][..]));
        assert!(back[0] == 1.0 && (back[4] - 2.0).abs() <= s / 2.0, "{back:?}");
        let (code, back) = round_trip(&Int4Row, &[f32::NAN; 3]);
        assert_eq!((code, back), (vec![0; 6], vec![0.0; 3]));
    }

    /// Mean per-row relative RMSE of `c` over 500 N(0, σ²) rows of dimension 36.
    fn mean_rmse(c: &dyn Codec, sigma: f32) -> f64 {
        let mut rng = Rng(42);
        (0..500).map(|_| relative_rmse(c, &rng.row(36, 0.0, sigma))).sum::<f64>() / 500.0
    }

    #[test]
    fn relative_rmse_table_d36() {
        println!("codec  bytes(D=36)  sigma=0.01  sigma=0.05   sigma=0.2   sigma=0.5");
        for &k in CodecKind::ALL {
            let c = k.codec();
            let e = [0.01, 0.05, 0.2, 0.5].map(|s| mean_rmse(c, s));
            let cells: String = e.iter().map(|x| format!("  {x:>10.5}")).collect();
            println!("{:<6} {:>11}{cells}", k.name(), c.bytes_per_row(36));
            let ok = |lo: f64, hi: f64| e.iter().all(|&x| lo <= x && x < hi);
            match k {
                CodecKind::F32 => assert!(ok(0.0, 1e-12)),
                CodecKind::F16 => assert!(ok(1e-5, 1e-3), "{e:?}"),
                CodecKind::Int8 => assert!(ok(0.002, 0.01), "{e:?}"),
                CodecKind::Int4 => assert!(ok(0.04, 0.12), "{e:?}"),
                #[cfg(feature = "compat")]
                _ => assert!(e[0] > e[2], "{k}: clipping codecs lose precision at small σ"),
            }
        }
    }

    proptest! {
        #[test]
        fn affine_bounds_hold(seed: u64, dim in 1usize..=64, mean in -2.0f32..2.0, e in -3.0f32..0.5) {
            let row = Rng(seed).row(dim, mean, 10f32.powf(e));
            check_affine(&Int8Row, 255, &row);
            check_affine(&Int4Row, 15, &row);
        }

        #[test]
        fn any_input_round_trips_without_panic(row in prop::collection::vec(any::<f32>(), 0..40)) {
            for &k in CodecKind::ALL {
                let (_, back) = round_trip(k.codec(), &row);
                if k.codec().lossless() {
                    prop_assert!(row.iter().zip(&back).all(|(x, y)| x.to_bits() == y.to_bits()));
                }
            }
        }
    }

    #[cfg(feature = "compat")]
    #[test]
    fn compat_codecs() {
        let c = [Ev16.bytes_per_row(36), Ev8.bytes_per_row(36), Ev4.bytes_per_row(36)];
        assert_eq!(c, [72, 36, 18]);
        let (code, back) = round_trip(&Ev8, &[0.23, -1.0, 1.0, 2.0, -2.0, f32::NAN, 0.0]);
        assert_eq!((code, back[6]), (vec![156, 0, 254, 254, 0, 127, 127], 0.0));
        assert!((back[0] - 0.2283).abs() < 1e-4);
        let (code, back) = round_trip(&Ev16, &[0.0, 1.0, -1.0, 0.3]);
        assert_eq!(
            (&code[..6], &back[..3]),
            (&[0xff, 0x7f, 0xfe, 0xff, 0, 0][..], &[0.0, 1.0, -1.0][..])
        );
        assert!((back[3] - 0.3).abs() <= 1.6e-5);
        let (code, back) = round_trip(&Ev4, &EV4_CODEBOOK);
        assert_eq!(back, EV4_CODEBOOK);
        assert_eq!((code[0], code[7]), (0x10, 0x0e));
        let row = Rng(5).row(99, 0.0, 0.5);
        let (_, back) = round_trip(&Ev4, &row);
        for (x, y) in row.iter().map(|x| x.clamp(-1.0, 1.0)).zip(back) {
            assert!(EV4_CODEBOOK.iter().all(|b| (x - y).abs() <= (x - b).abs()), "{x} -> {y}");
        }
    }
}
