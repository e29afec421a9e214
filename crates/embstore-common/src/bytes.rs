//! Little-endian byte cursors: the one way embstore writes and reads the fields of its wire
//! frames (the framed lookup path, the sync port) and of its files (the manifest), and the one
//! constant-time comparison of secrets (tokens).
//!
//! A [`Reader`] is named for what it reads (`"a sync frame"`, `"a manifest record"`): every
//! read past the end, a count the rest cannot hold, a string that is not UTF-8 or a varint
//! that overflows is an [`ErrorKind::Corruption`](crate::ErrorKind::Corruption) error whose
//! message names it. Nothing panics on any input.

use crate::{Error, Result};

/// Fields appended to a buffer, little-endian.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// A writer with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Raw bytes, without a length.
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    /// `len u32 | bytes`.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32).raw(b)
    }
    /// `len u32 | utf-8`.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
    /// `len u16 | utf-8` (short names).
    pub fn str16(&mut self, s: &str) -> &mut Self {
        self.u16(s.len() as u16).raw(s.as_bytes())
    }
    pub fn f32s(&mut self, v: &[f32]) -> &mut Self {
        self.0.reserve(v.len() * 4);
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
    /// LEB128: 7 bits a byte, low first.
    pub fn varint(&mut self, mut v: u64) -> &mut Self {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
        self
    }
}

/// Fields read off the front of a byte slice, little-endian; see the module's documentation
/// for its errors.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader of `b`, which is `what` (named in every error).
    pub fn new(b: &'a [u8], what: &'static str) -> Self {
        Self { b, pos: 0, what }
    }

    /// Bytes read so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left.
    pub fn left(&self) -> usize {
        self.b.len() - self.pos
    }

    /// A [`ErrorKind::Corruption`](crate::ErrorKind::Corruption) error about what this reads.
    pub fn error(&self, why: impl std::fmt::Display) -> Error {
        Error::corrupt(format!("{} {why}", self.what))
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| self.error(format!("ends early (needs {n} more bytes)")))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// The next `N` bytes, as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        self.array().map(u16::from_le_bytes)
    }
    pub fn u32(&mut self) -> Result<u32> {
        self.array().map(u32::from_le_bytes)
    }
    pub fn u64(&mut self) -> Result<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// `len u32 | bytes`.
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn utf8(&self, b: &[u8]) -> Result<String> {
        String::from_utf8(b.to_vec()).map_err(|_| self.error("holds a string that is not utf-8"))
    }

    /// `len u32 | utf-8`.
    pub fn str(&mut self) -> Result<String> {
        let b = self.bytes()?;
        self.utf8(b)
    }

    /// `len u16 | utf-8`.
    pub fn str16(&mut self) -> Result<String> {
        let n = self.u16()? as usize;
        let b = self.take(n)?;
        self.utf8(b)
    }

    /// A `u32` count of items each at least `min_bytes` long, checked against what is left
    /// (so that a count is never trusted to size an allocation).
    pub fn count(&mut self, min_bytes: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_bytes) > self.left() {
            return Err(self.error(format!("announces {n} items it cannot hold")));
        }
        Ok(n)
    }

    /// `n` little-endian `f32`s.
    pub fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        let len = n.checked_mul(4).ok_or_else(|| self.error("announces a count that overflows"))?;
        let raw = self.take(len)?;
        Ok(raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect())
    }

    /// LEB128 (7 bits a byte, low first), at most 64 bits.
    pub fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f)
                .checked_shl(shift)
                .filter(|_| shift < 63 || b <= 1)
                .ok_or_else(|| self.error("holds a varint that overflows"))?;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.error("holds a varint that is too long"))
    }

    /// Every byte not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.b[self.pos..];
        self.pos = self.b.len();
        s
    }

    /// Fails unless every byte was read.
    pub fn end(&self) -> Result<()> {
        match self.left() {
            0 => Ok(()),
            n => Err(self.error(format!("has {n} bytes past its end"))),
        }
    }
}

/// Whether `a` equals `b`, in time that depends only on their lengths (for secrets: a token
/// compared byte by byte until the first difference tells an attacker how much was right).
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn every_field_round_trips() {
        let mut w = Writer::default();
        w.u8(7).u16(0xBEEF).u32(1 << 31).u64(u64::MAX).str("héllo").str16("t").bytes(b"ab");
        w.f32s(&[1.5, -0.0]).varint(0).varint(300).varint(u64::MAX);
        let mut r = Reader::new(&w.0, "a test frame");
        assert_eq!(r.u8().unwrap(), 7);
        assert_eq!(r.u16().unwrap(), 0xBEEF);
        assert_eq!(r.u32().unwrap(), 1 << 31);
        assert_eq!(r.u64().unwrap(), u64::MAX);
        assert_eq!(r.str().unwrap(), "héllo");
        assert_eq!(r.str16().unwrap(), "t");
        assert_eq!(r.bytes().unwrap(), b"ab");
        assert_eq!(r.f32s(2).unwrap(), vec![1.5, -0.0]);
        assert_eq!(r.varint().unwrap(), 0);
        assert_eq!(r.varint().unwrap(), 300);
        assert_eq!(r.varint().unwrap(), u64::MAX);
        r.end().unwrap();
    }

    #[test]
    fn errors_name_what_is_read_and_are_corruption() {
        let mut r = Reader::new(&[1, 0], "a manifest record");
        let e = r.u32().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corruption);
        assert_eq!(e.message(), "a manifest record ends early (needs 4 more bytes)");
        assert_eq!(r.pos(), 0, "a failed read consumes nothing");
        let e = Reader::new(&[9, 9], "x").end().unwrap_err();
        assert_eq!(e.message(), "x has 2 bytes past its end");
        let mut big = Writer::default();
        big.u32(1_000_000);
        let e = Reader::new(&big.0, "x").count(8).unwrap_err();
        assert_eq!(e.message(), "x announces 1000000 items it cannot hold");
        let e = Reader::new(&[2, 0, 0, 0, 0xFF, 0xFE], "x").str().unwrap_err();
        assert_eq!(e.message(), "x holds a string that is not utf-8");
        let e = Reader::new(&[0xFF; 10], "x").varint().unwrap_err();
        assert_eq!(e.message(), "x holds a varint that overflows");
    }

    #[test]
    fn any_bytes_read_without_panicking() {
        // Every prefix of a valid encoding, and a sweep of arbitrary bytes, through every read.
        let mut w = Writer::default();
        w.str("abc").varint(1 << 40).u64(3).f32s(&[1.0; 3]);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut noise = vec![0u8; 64];
        for _ in 0..200 {
            for b in noise.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *b = seed as u8;
            }
            for bytes in (0..=w.0.len()).map(|n| &w.0[..n]).chain([noise.as_slice()]) {
                let mut r = Reader::new(bytes, "x");
                let _ = (r.str(), r.varint(), r.count(4), r.f32s(usize::MAX / 2), r.str16());
                let _ = (r.u64(), r.array::<3>(), r.bytes(), r.rest(), r.end());
            }
        }
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret(b"token", b"token"));
        assert!(same_secret(b"", b""));
        assert!(!same_secret(b"token", b"tokem"));
        assert!(!same_secret(b"token", b"token1"));
        assert!(!same_secret(b"", b"x"));
    }
}
