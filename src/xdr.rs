//! XDR (RFC 4506) primitives: a bounded, zero-copy reader over a request buffer and a
//! writer that builds replies in one contiguous buffer.
//!
//! Every variable-length item is checked against both a protocol maximum and the bytes
//! actually remaining *before* anything is allocated or sliced, so a hostile length can
//! never cause a large allocation or a panic.

use crate::vfs::FileRange;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum XdrError {
    #[error("truncated: needed {needed} bytes at offset {offset}, {available} available")]
    Truncated { offset: usize, needed: usize, available: usize },
    #[error("length {len} exceeds the limit of {max}")]
    TooLong { len: usize, max: usize },
    #[error("invalid value {value} for {what}")]
    BadValue { what: &'static str, value: u32 },
}

pub type XdrResult<T> = Result<T, XdrError>;

/// Rounds a byte count up to the XDR 4-byte boundary.
#[inline]
pub const fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

/// Reader over one decoded RPC record. Borrowed slices point into the record, so WRITE
/// payloads reach the backend without a copy.
#[derive(Debug, Clone)]
pub struct XdrReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> XdrReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The unread tail of the buffer.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    fn take(&mut self, n: usize) -> XdrResult<&'a [u8]> {
        if n > self.remaining() {
            return Err(XdrError::Truncated { offset: self.pos, needed: n, available: self.remaining() });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u32(&mut self) -> XdrResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn i32(&mut self) -> XdrResult<i32> {
        Ok(self.u32()? as i32)
    }

    pub fn u64(&mut self) -> XdrResult<u64> {
        let b = self.take(8)?;
        Ok(u64::from_be_bytes(b.try_into().expect("8 bytes")))
    }

    pub fn bool(&mut self) -> XdrResult<bool> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(XdrError::BadValue { what: "bool", value: v }),
        }
    }

    /// Fixed-length opaque of `n` bytes (plus padding).
    pub fn fixed(&mut self, n: usize) -> XdrResult<&'a [u8]> {
        let s = self.take(n)?;
        self.take(pad4(n) - n)?;
        Ok(s)
    }

    /// Variable-length opaque bounded by `max`.
    pub fn opaque(&mut self, max: usize) -> XdrResult<&'a [u8]> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(XdrError::TooLong { len, max });
        }
        self.fixed(len)
    }

    pub fn fixed_array<const N: usize>(&mut self) -> XdrResult<[u8; N]> {
        Ok(self.fixed(N)?.try_into().expect("exact length"))
    }
}

/// Reply builder. Replies are assembled in a single `Vec<u8>` that starts with room for the
/// RPC record mark, so the transport writes each reply with one syscall. The last item may
/// be an opaque whose bytes stay in a file ([`XdrWriter::opaque_from_file`]).
#[derive(Debug, Default)]
pub struct XdrWriter {
    buf: Vec<u8>,
    /// Bytes that follow `buf` on the wire, sent from the file, then their padding.
    file: Option<FileRange>,
}

impl XdrWriter {
    pub fn new() -> Self {
        Self::with_capacity(256)
    }

    pub fn with_capacity(n: usize) -> Self {
        Self { buf: Vec::with_capacity(n), file: None }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn truncate(&mut self, len: usize) {
        if len < self.buf.len() {
            // Whatever followed the cut, a file opaque included, is gone.
            self.file = None;
        }
        self.buf.truncate(len);
    }

    pub fn into_inner(self) -> Vec<u8> {
        debug_assert!(self.file.is_none(), "into_inner would drop a file opaque");
        self.buf
    }

    /// The encoded bytes and the file range that follows them, if any.
    pub fn into_parts(self) -> (Vec<u8>, Option<FileRange>) {
        (self.buf, self.file)
    }

    /// Appends an opaque whose bytes are sent from `range` by the transport; it must be
    /// the last item written.
    pub fn opaque_from_file(&mut self, range: FileRange) {
        self.u32(range.len as u32);
        self.file = Some(range);
    }

    /// Bytes on the wire: the encoded ones plus a file opaque and its padding.
    pub fn wire_len(&self) -> usize {
        self.buf.len() + self.file.as_ref().map_or(0, |f| pad4(f.len))
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    pub fn u32(&mut self, v: u32) {
        debug_assert!(self.file.is_none(), "nothing may follow a file opaque");
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn i32(&mut self, v: i32) {
        self.u32(v as u32);
    }

    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn bool(&mut self, v: bool) {
        self.u32(v as u32);
    }

    fn pad(&mut self, n: usize) {
        self.buf.resize(self.buf.len() + (pad4(n) - n), 0);
    }

    pub fn fixed(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        self.pad(data.len());
    }

    pub fn opaque(&mut self, data: &[u8]) {
        self.u32(data.len() as u32);
        self.fixed(data);
    }

    /// Overwrites a u32 written earlier at `at` (used for lengths known only afterwards).
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        self.buf[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// Overwrites bytes written earlier at `at`.
    pub fn patch_bytes(&mut self, at: usize, data: &[u8]) {
        self.buf[at..at + data.len()].copy_from_slice(data);
    }

    /// Appends an opaque whose bytes `fill` appends to the reply buffer itself (at most
    /// `max` of them; more are cut). READ uses this to `pread` straight into the reply,
    /// with no zero-filling first.
    pub fn opaque_with<E>(&mut self, max: usize, fill: impl FnOnce(&mut Vec<u8>) -> Result<(), E>) -> Result<usize, E> {
        let len_at = self.buf.len();
        self.u32(0);
        let start = self.buf.len();
        match fill(&mut self.buf) {
            Ok(()) => {
                self.buf.truncate(start + max);
                let n = self.buf.len() - start;
                self.pad(n);
                self.patch_u32(len_at, n as u32);
                Ok(n)
            }
            Err(e) => {
                self.buf.truncate(len_at);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_primitives() {
        let mut w = XdrWriter::new();
        w.u32(7);
        w.u64(u64::MAX - 1);
        w.bool(true);
        w.opaque(b"hello");
        w.fixed(&[1, 2, 3]);
        assert_eq!(w.len(), 4 + 8 + 4 + 4 + 8 + 4);
        let bytes = w.into_inner();
        let mut r = XdrReader::new(&bytes);
        assert_eq!(r.u32().unwrap(), 7);
        assert_eq!(r.u64().unwrap(), u64::MAX - 1);
        assert!(r.bool().unwrap());
        assert_eq!(r.opaque(16).unwrap(), b"hello");
        assert_eq!(r.fixed(3).unwrap(), &[1, 2, 3]);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn rejects_oversized_and_truncated_lengths() {
        let mut w = XdrWriter::new();
        w.u32(0xffff_fff0);
        let bytes = w.into_inner();
        assert!(matches!(XdrReader::new(&bytes).opaque(1024), Err(XdrError::TooLong { .. })));
        // A length within the limit but beyond the buffer is a truncation, not a panic.
        let mut w = XdrWriter::new();
        w.u32(100);
        w.u32(1);
        let bytes = w.into_inner();
        assert!(matches!(XdrReader::new(&bytes).opaque(1024), Err(XdrError::Truncated { .. })));
        assert!(matches!(XdrReader::new(&[0, 0, 0, 2]).bool(), Err(XdrError::BadValue { .. })));
    }

    #[test]
    fn opaque_with_pads_and_patches_length() {
        let mut w = XdrWriter::new();
        let n = w
            .opaque_with::<()>(10, |buf| {
                buf.extend_from_slice(b"abcde");
                Ok(())
            })
            .unwrap();
        assert_eq!(n, 5);
        let bytes = w.into_inner();
        assert_eq!(bytes.len(), 4 + 8);
        assert_eq!(XdrReader::new(&bytes).opaque(10).unwrap(), b"abcde");
        // More than `max` is cut; a failure leaves nothing behind.
        let mut w = XdrWriter::new();
        let cut = w.opaque_with::<()>(2, |buf| {
            buf.extend_from_slice(b"xyz");
            Ok(())
        });
        assert_eq!(cut.unwrap(), 2);
        assert_eq!(w.len(), 8);
        assert_eq!(
            w.opaque_with(8, |buf| {
                buf.push(1);
                Err(())
            }),
            Err(())
        );
        assert_eq!(w.len(), 8);
    }
}
