//! RPC record marking over stream transports (RFC 5531 section 11).
//!
//! A record is a sequence of fragments, each preceded by a 4-byte mark whose top bit
//! flags the last fragment. The reader bounds the total record size and the number of
//! fragments, and grows its buffer only as data actually arrives, so an announced but
//! never-sent fragment costs no memory.

use super::Reply;
use crate::xdr::XdrWriter;
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

const LAST_FRAGMENT: u32 = 0x8000_0000;
/// Buffer growth step while receiving a fragment.
const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct RecordLimits {
    pub max_record: usize,
    pub max_fragments: usize,
}

impl Default for RecordLimits {
    fn default() -> Self {
        // 1 MiB WRITE payload plus headers.
        Self { max_record: 1024 * 1024 + 64 * 1024, max_fragments: 1024 }
    }
}

#[derive(Debug, Error)]
pub enum RecordError {
    #[error("record of at least {size} bytes exceeds the limit of {max}")]
    TooLarge { size: usize, max: usize },
    #[error("record has more than {max} fragments")]
    TooManyFragments { max: usize },
    #[error("connection closed in the middle of a record")]
    Truncated,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Record buffers kept for reuse. A large WRITE's record is about 1 MiB: allocated afresh
/// for every call it costs page faults and, while it grows, copies. Buffers of at least
/// `MIN_POOLED` bytes come back after their call; at most `max` are kept, so the memory
/// held while idle stays bounded (`max` × the largest record).
pub struct RecordPool {
    bufs: parking_lot::Mutex<Vec<Vec<u8>>>,
    max: usize,
}

impl RecordPool {
    const MIN_POOLED: usize = 64 * 1024;

    pub fn new(max: usize) -> Self {
        Self { bufs: parking_lot::Mutex::new(Vec::new()), max }
    }

    /// An empty buffer, with the capacity of an earlier record if one is free.
    pub fn take(&self) -> Vec<u8> {
        self.bufs.lock().pop().unwrap_or_default()
    }

    /// Returns a record's buffer once its call is done with it.
    pub fn put(&self, mut buf: Vec<u8>) {
        if buf.capacity() < Self::MIN_POOLED {
            return;
        }
        buf.clear();
        let mut bufs = self.bufs.lock();
        if bufs.len() < self.max {
            bufs.push(buf);
        }
    }

    #[cfg(test)]
    pub fn pooled(&self) -> usize {
        self.bufs.lock().len()
    }
}

/// A stream records are read from, which may be told how much a read is waiting for.
pub trait RecordSource: AsyncRead + Unpin {
    /// The next read is for the rest of a record fragment, `bytes` long: it cannot finish
    /// the record before they have all arrived, so a transport may wait for them rather
    /// than wake its reader for each piece. Applies until a read returns data.
    fn expect(&mut self, _bytes: usize) {}
}

impl RecordSource for &[u8] {}

/// Reads one whole record into `buf` (cleared first). Returns `Ok(false)` on a clean end
/// of stream between records. Small records come out of the reader's buffer (many per
/// `read` syscall); the rest of a large one is read straight from the stream into `buf`.
pub async fn read_record<R: RecordSource>(r: &mut BufReader<R>, limits: &RecordLimits, buf: &mut Vec<u8>) -> Result<bool, RecordError> {
    buf.clear();
    let mut fragments = 0usize;
    loop {
        let mut mark = [0u8; 4];
        match read_full(r, &mut mark).await? {
            0 if fragments == 0 => return Ok(false),
            4 => {}
            _ => return Err(RecordError::Truncated),
        }
        let mark = u32::from_be_bytes(mark);
        let len = (mark & !LAST_FRAGMENT) as usize;
        fragments += 1;
        if fragments > limits.max_fragments {
            return Err(RecordError::TooManyFragments { max: limits.max_fragments });
        }
        let total = buf.len() + len;
        if total > limits.max_record {
            return Err(RecordError::TooLarge { size: total, max: limits.max_record });
        }
        let end = buf.len() + len;
        while buf.len() < end {
            let want = end - buf.len();
            let buffered = r.buffer();
            if !buffered.is_empty() {
                let n = buffered.len().min(want);
                buf.extend_from_slice(&buffered[..n]);
                r.consume(n);
                continue;
            }
            // Nothing buffered: read into the record's spare capacity (no copy through the
            // reader's buffer, no zero-filling). The buffer doubles as bytes arrive, up to
            // the announced length: a handful of reallocations per record (growing by a
            // fixed step copied a 1 MiB WRITE's data ~16 times over), and never much more
            // memory than the client has actually sent.
            if buf.capacity() == buf.len() {
                buf.reserve_exact(buf.capacity().max(READ_CHUNK).min(want));
            }
            let step = want.min(buf.capacity() - buf.len());
            r.get_mut().expect(want);
            if r.get_mut().take(step as u64).read_buf(buf).await? == 0 {
                return Err(RecordError::Truncated);
            }
        }
        if mark & LAST_FRAGMENT != 0 {
            return Ok(true);
        }
    }
}

/// Like `read_exact`, but reports how much was read before end of stream.
async fn read_full<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = r.read(&mut buf[got..]).await?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// Starts a reply buffer with room for the record mark.
pub fn begin_record(capacity: usize) -> XdrWriter {
    let mut w = XdrWriter::with_capacity(capacity);
    w.u32(0);
    w
}

/// The record a buffer started with [`begin_record`] would be now, as a copy (its file
/// part, if any, left out).
pub fn framed_copy(w: &XdrWriter) -> Vec<u8> {
    let mut bytes = w.as_slice().to_vec();
    let mark = record_mark(bytes.len());
    bytes[..4].copy_from_slice(&mark.to_be_bytes());
    bytes
}

/// The mark of a record sent as one last fragment, `framed_len` bytes with the mark.
fn record_mark(framed_len: usize) -> u32 {
    LAST_FRAGMENT | (framed_len - 4) as u32
}

/// Fills in the record mark of a buffer started with [`begin_record`], as a single
/// last fragment (covering a file opaque at its end too).
pub fn finish_record(mut w: XdrWriter) -> Reply {
    w.patch_u32(0, record_mark(w.wire_len()));
    let (bytes, file) = w.into_parts();
    Reply { bytes, file }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_keeps_large_buffers_up_to_its_limit_and_hands_them_back_empty() {
        let pool = RecordPool::new(2);
        assert_eq!(pool.take().capacity(), 0, "an empty pool allocates nothing up front");
        pool.put(Vec::with_capacity(1024)); // small: not worth keeping
        assert_eq!(pool.pooled(), 0);
        for _ in 0..3 {
            let mut big = Vec::with_capacity(1 << 20);
            big.extend_from_slice(b"a previous record");
            pool.put(big);
        }
        assert_eq!(pool.pooled(), 2, "kept beyond its limit");
        let reused = pool.take();
        assert!(reused.is_empty() && reused.capacity() >= 1 << 20);
        assert_eq!(pool.pooled(), 1);
    }

    #[tokio::test]
    async fn a_record_read_into_a_reused_buffer_is_only_that_record() {
        let pool = RecordPool::new(4);
        let limits = RecordLimits { max_record: 4 << 20, max_fragments: 8 };
        let first = vec![7u8; 3 << 20];
        let second = b"short".to_vec();
        let mut wire = frag(&first, true);
        wire.extend(frag(&second, true));
        let mut r = BufReader::new(&wire[..]);
        let mut buf = pool.take();
        assert!(read_record(&mut r, &limits, &mut buf).await.unwrap());
        assert_eq!(buf, first);
        pool.put(buf);
        let mut buf = pool.take();
        assert!(buf.capacity() >= 3 << 20);
        assert!(read_record(&mut r, &limits, &mut buf).await.unwrap());
        assert_eq!(buf, second);
    }

    fn frag(data: &[u8], last: bool) -> Vec<u8> {
        let mut v = ((data.len() as u32) | if last { LAST_FRAGMENT } else { 0 }).to_be_bytes().to_vec();
        v.extend_from_slice(data);
        v
    }

    async fn read_all(stream: &[u8], limits: RecordLimits) -> Result<Vec<Vec<u8>>, RecordError> {
        // A tiny buffer, so records span the buffered and the direct read paths.
        let mut r = BufReader::with_capacity(3, stream);
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while read_record(&mut r, &limits, &mut buf).await? {
            out.push(buf.clone());
        }
        Ok(out)
    }

    #[tokio::test]
    async fn joins_fragments_and_splits_records() {
        let mut s = frag(b"ab", false);
        s.extend(frag(b"", false));
        s.extend(frag(b"cd", true));
        s.extend(frag(b"xyz", true));
        let recs = read_all(&s, RecordLimits::default()).await.unwrap();
        assert_eq!(recs, vec![b"abcd".to_vec(), b"xyz".to_vec()]);
    }

    #[tokio::test]
    async fn bounds_size_fragments_and_truncation() {
        let limits = RecordLimits { max_record: 8, max_fragments: 3 };
        // Announced size alone is rejected before anything is allocated.
        let huge = (LAST_FRAGMENT | 0x7fff_ffff).to_be_bytes();
        assert!(matches!(read_all(&huge, limits).await, Err(RecordError::TooLarge { .. })));
        let mut many = Vec::new();
        for _ in 0..4 {
            many.extend(frag(b"", false));
        }
        assert!(matches!(read_all(&many, limits).await, Err(RecordError::TooManyFragments { .. })));
        let mut cut = frag(b"abcdef", true);
        cut.truncate(6);
        assert!(matches!(read_all(&cut, limits).await, Err(RecordError::Truncated)));
        assert!(matches!(read_all(&[0, 0], limits).await, Err(RecordError::Truncated)));
    }

    #[test]
    fn reply_record_mark() {
        let mut w = begin_record(16);
        w.u32(5);
        let v = finish_record(w);
        assert_eq!(v.bytes, vec![0x80, 0, 0, 4, 0, 0, 0, 5]);
        assert!(v.file.is_none());
    }
}
