//! A receiver's spool on disk: the records written for it and not yet
//! known to be taken, in segment files under a byte bound, with the read
//! position kept beside them so a restarted CA goes on where it stopped.
//!
//! A segment is `<first seq, 20 digits>.seg`: each record a little-endian
//! `u32` length and the message. `read.pos` holds the first sequence
//! number not yet confirmed. The `Writer` (the receiver's spooler task)
//! appends; the `Reader` (its sender task) reads and confirms; they share
//! the segment index behind one lock, taken in short sections with no file
//! I/O under it. A full spool refuses the newest record (the caller counts
//! it): what the receiver has stays a gap-free sequence up to the gap.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The position file's name.
const POSITION_FILE: &str = "read.pos";
/// How often a confirmed position is written to `read.pos` at most.
const PERSIST_EVERY: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug)]
struct Segment {
    first: u64,
    count: u64,
    bytes: u64,
}

#[derive(Debug)]
struct Index {
    segments: VecDeque<Segment>,
    /// The sequence number the next record gets.
    next: u64,
    /// Every record below it was taken.
    confirmed: u64,
    /// The bytes of every segment file.
    bytes: u64,
    persisted: u64,
    persisted_at: Option<Instant>,
}

/// One receiver's spool.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    bound: u64,
    segment_bytes: u64,
    index: Mutex<Index>,
    /// Woken when records are committed.
    pub(crate) committed: tokio::sync::Notify,
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.seg")
}

/// The records of a segment file's bytes: each message's length and the
/// length of the whole records (a torn tail is not counted).
fn scan(bytes: &[u8]) -> (u64, usize) {
    let (mut count, mut at) = (0, 0);
    while let Some(len) = bytes
        .get(at..at + 4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(|b| u32::from_le_bytes(b) as usize)
    {
        if at + 4 + len > bytes.len() {
            break;
        }
        at += 4 + len;
        count += 1;
    }
    (count, at)
}

impl Spool {
    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens (creating) the spool in `dir`, bounded at `bound` bytes; a
    /// torn record at a segment's end (a crash mid-write) is cut off.
    pub fn open(dir: &Path, bound: u64) -> io::Result<(Arc<Spool>, Writer, Reader)> {
        std::fs::create_dir_all(dir)?;
        let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let first = name.strip_suffix(".seg")?.parse().ok()?;
                Some((first, e.path()))
            })
            .collect();
        found.sort_unstable();
        let mut segments = VecDeque::new();
        for (first, path) in &found {
            let bytes = std::fs::read(path)?;
            let (count, valid) = scan(&bytes);
            if valid < bytes.len() {
                OpenOptions::new()
                    .write(true)
                    .open(path)?
                    .set_len(valid as u64)?;
            }
            segments.push_back(Segment {
                first: *first,
                count,
                bytes: valid as u64,
            });
        }
        let saved: Option<u64> = std::fs::read_to_string(dir.join(POSITION_FILE))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let next = segments
            .back()
            .map_or(saved.unwrap_or(0), |s| s.first + s.count);
        let oldest = segments.front().map_or(next, |s| s.first);
        let confirmed = saved.unwrap_or(oldest).clamp(oldest, next);
        let bytes = segments.iter().map(|s| s.bytes).sum();
        let current = segments.back().copied();
        let spool = Arc::new(Spool {
            dir: dir.to_owned(),
            bound,
            segment_bytes: (bound / 16).clamp(4096, 8 << 20),
            index: Mutex::new(Index {
                segments,
                next,
                confirmed,
                bytes,
                persisted: confirmed,
                persisted_at: None,
            }),
            committed: tokio::sync::Notify::new(),
        });
        let file = match current {
            Some(s) => Some(
                OpenOptions::new()
                    .append(true)
                    .open(dir.join(segment_name(s.first)))?,
            ),
            None => None,
        };
        let writer = Writer {
            spool: spool.clone(),
            file,
            current_bytes: current.map_or(0, |s| s.bytes),
            buf: Vec::new(),
            pending: 0,
            next,
        };
        let reader = Reader {
            spool: spool.clone(),
            open: None,
        };
        Ok((spool, writer, reader))
    }

    /// The bytes on disk and the records not yet confirmed.
    pub fn usage(&self) -> (u64, u64) {
        let ix = self.index();
        (ix.bytes, ix.next - ix.confirmed)
    }

    /// The first record not yet confirmed: where a sender starts.
    pub fn confirmed(&self) -> u64 {
        self.index().confirmed
    }

    /// The sequence number of the next record appended.
    pub fn next_seq(&self) -> u64 {
        self.index().next
    }

    /// Every record below `upto` was taken: segments wholly below it are
    /// deleted (but the one being written), and the position is written to
    /// `read.pos` at most every 500 ms (always with `force`).
    pub fn confirm(&self, upto: u64, force: bool) -> io::Result<()> {
        let (gone, persist) = {
            let mut ix = self.index();
            let upto = upto.min(ix.next);
            ix.confirmed = ix.confirmed.max(upto);
            let mut gone = Vec::new();
            while ix.segments.len() > 1 {
                match ix.segments.front() {
                    Some(s) if s.first + s.count <= ix.confirmed => {
                        gone.push(s.first);
                        ix.bytes -= s.bytes;
                        ix.segments.pop_front();
                    }
                    _ => break,
                }
            }
            let due = force || ix.persisted_at.is_none_or(|t| t.elapsed() >= PERSIST_EVERY);
            let persist = (due && ix.persisted != ix.confirmed).then_some(ix.confirmed);
            if let Some(p) = persist {
                ix.persisted = p;
                ix.persisted_at = Some(Instant::now());
            }
            (gone, persist)
        };
        if let Some(position) = persist {
            let tmp = self.dir.join("read.pos.tmp");
            std::fs::write(&tmp, format!("{position}\n"))?;
            std::fs::rename(&tmp, self.dir.join(POSITION_FILE))?;
        }
        for first in gone {
            std::fs::remove_file(self.dir.join(segment_name(first)))?;
        }
        Ok(())
    }
}

/// Appends to a spool (one per spool: the receiver's spooler task).
#[derive(Debug)]
pub struct Writer {
    spool: Arc<Spool>,
    file: Option<File>,
    current_bytes: u64,
    buf: Vec<u8>,
    pending: u64,
    next: u64,
}

impl Writer {
    /// The spool written.
    pub fn spool(&self) -> &Arc<Spool> {
        &self.spool
    }

    /// The sequence number the next `push` gets.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Adds one record to the batch `commit` writes; `false` when the
    /// spool is full (the record is dropped).
    pub fn push(&mut self, message: &[u8]) -> io::Result<bool> {
        let len = message.len() as u64 + 4;
        let Ok(len32) = u32::try_from(message.len()) else {
            return Ok(false);
        };
        let used = self.spool.index().bytes + self.buf.len() as u64;
        if used + len > self.spool.bound {
            return Ok(false);
        }
        if self.file.is_none()
            || self.current_bytes + self.buf.len() as u64 >= self.spool.segment_bytes
        {
            self.commit().map_err(|(e, _)| e)?;
            self.roll()?;
        }
        self.buf.extend_from_slice(&len32.to_le_bytes());
        self.buf.extend_from_slice(message);
        self.pending += 1;
        self.next += 1;
        Ok(true)
    }

    /// Writes the batch and makes it readable. On an error the batch is
    /// lost: the error and how many records it held.
    pub fn commit(&mut self) -> Result<(), (io::Error, u64)> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let written = match self.file.as_mut() {
            Some(f) => f.write_all(&self.buf),
            None => Err(io::Error::other("no segment open")),
        };
        if let Err(e) = written {
            let lost = self.pending;
            if let Some(f) = self.file.as_mut() {
                let _ = f.set_len(self.current_bytes);
            }
            self.next -= lost;
            self.buf.clear();
            self.pending = 0;
            return Err((e, lost));
        }
        let bytes = self.buf.len() as u64;
        {
            let mut ix = self.spool.index();
            if let Some(s) = ix.segments.back_mut() {
                s.count += self.pending;
                s.bytes += bytes;
            }
            ix.bytes += bytes;
            ix.next = self.next;
        }
        self.current_bytes += bytes;
        self.buf.clear();
        self.pending = 0;
        self.spool.committed.notify_one();
        Ok(())
    }

    fn roll(&mut self) -> io::Result<()> {
        let path = self.spool.dir.join(segment_name(self.next));
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)?;
        self.spool.index().segments.push_back(Segment {
            first: self.next,
            count: 0,
            bytes: 0,
        });
        self.file = Some(file);
        self.current_bytes = 0;
        Ok(())
    }
}

#[derive(Debug)]
struct OpenSegment {
    first: u64,
    at: u64,
    file: BufReader<File>,
}

/// Reads a spool in order (one per spool: the receiver's sender task).
#[derive(Debug)]
pub struct Reader {
    spool: Arc<Spool>,
    open: Option<OpenSegment>,
}

impl Reader {
    /// The spool read.
    pub fn spool(&self) -> &Arc<Spool> {
        &self.spool
    }

    /// Committed records from `from` on, at least one if there is one and
    /// at most `max_bytes` of messages beyond the first; with the sequence
    /// number of the first (later than `from` only if `from` was deleted).
    pub fn read(&mut self, from: u64, max_bytes: usize) -> io::Result<(u64, Vec<Vec<u8>>)> {
        let segment = {
            let ix = self.spool.index();
            let from = from.max(ix.segments.front().map_or(from, |s| s.first));
            ix.segments
                .iter()
                .find(|s| s.first <= from && from < s.first + s.count)
                .map(|s| (*s, from))
        };
        let Some((segment, from)) = segment else {
            return Ok((from, Vec::new()));
        };
        let reusable = self
            .open
            .as_ref()
            .is_some_and(|o| o.first == segment.first && o.at == from);
        if !reusable {
            let file = File::open(self.spool.dir.join(segment_name(segment.first)))?;
            let mut open = OpenSegment {
                first: segment.first,
                at: segment.first,
                file: BufReader::with_capacity(64 << 10, file),
            };
            open.file.seek(SeekFrom::Start(0))?;
            while open.at < from {
                let len = read_len(&mut open.file)?;
                open.file.seek_relative(i64::from(len))?;
                open.at += 1;
            }
            self.open = Some(open);
        }
        let Some(open) = self.open.as_mut() else {
            return Ok((from, Vec::new()));
        };
        let end = segment.first + segment.count;
        let (mut out, mut bytes) = (Vec::new(), 0);
        while open.at < end && (out.is_empty() || bytes < max_bytes) {
            let len = read_len(&mut open.file)?;
            let mut message = vec![0; len as usize];
            open.file.read_exact(&mut message)?;
            bytes += message.len();
            out.push(message);
            open.at += 1;
        }
        Ok((from, out))
    }
}

fn read_len(file: &mut BufReader<File>) -> io::Result<u32> {
    let mut len = [0; 4];
    file.read_exact(&mut len)?;
    Ok(u32::from_le_bytes(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("reach-spool-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn all(reader: &mut Reader, from: u64) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = from;
        loop {
            let (start, batch) = reader.read(at, 100).unwrap();
            assert_eq!(start, at);
            if batch.is_empty() {
                return out;
            }
            at += batch.len() as u64;
            out.extend(batch.into_iter().map(|m| String::from_utf8(m).unwrap()));
        }
    }

    #[test]
    fn records_come_back_in_order_across_segments() {
        let d = dir("order");
        let (_spool, mut w, mut r) = Spool::open(&d, 1 << 16).unwrap();
        for i in 0..2000 {
            assert_eq!(w.next_seq(), i);
            assert!(w.push(format!("record {i}").as_bytes()).unwrap());
            if i % 7 == 0 {
                w.commit().unwrap();
            }
        }
        w.commit().unwrap();
        let got = all(&mut r, 0);
        assert_eq!(got.len(), 2000);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, m)| *m == format!("record {i}"))
        );
        let segments = std::fs::read_dir(&d).unwrap().count();
        assert!(
            segments > 2,
            "{segments} files: the test must cross segments"
        );
        // Uncommitted records are not read.
        w.push(b"later").unwrap();
        assert!(r.read(2000, 100).unwrap().1.is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_full_spool_refuses_records_until_confirmed_ones_are_deleted() {
        let d = dir("full");
        let (spool, mut w, mut r) = Spool::open(&d, 8192).unwrap();
        let message = [b'x'; 96];
        let mut kept = 0;
        let mut dropped = 0;
        for _ in 0..200 {
            if w.push(&message).unwrap() {
                kept += 1;
            } else {
                dropped += 1;
            }
            w.commit().unwrap();
        }
        assert_eq!(kept, 8192 / 100);
        assert_eq!(dropped, 200 - kept);
        let (bytes, records) = spool.usage();
        assert!(bytes <= 8192, "{bytes}");
        assert_eq!(records, kept);
        assert!(!w.push(&message).unwrap());
        // Taken by the receiver: whole segments go, room comes back.
        assert_eq!(all(&mut r, 0).len() as u64, kept);
        spool.confirm(kept, true).unwrap();
        assert!(spool.usage().0 < 8192 / 2, "{:?}", spool.usage());
        assert!(w.push(&message).unwrap());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_restart_resumes_at_the_confirmed_position_and_cuts_a_torn_record() {
        let d = dir("restart");
        {
            let (spool, mut w, _r) = Spool::open(&d, 1 << 20).unwrap();
            for i in 0..10 {
                w.push(format!("r{i}").as_bytes()).unwrap();
            }
            w.commit().unwrap();
            spool.confirm(4, true).unwrap();
        }
        // A crash in the middle of a record.
        let seg = d.join(segment_name(0));
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(&[200, 0, 0, 0, b'p']).unwrap();
        drop(f);
        let (spool, mut w, mut r) = Spool::open(&d, 1 << 20).unwrap();
        assert_eq!(spool.confirmed(), 4);
        assert_eq!(spool.usage().1, 6);
        assert_eq!(w.next_seq(), 10);
        w.push(b"r10").unwrap();
        w.commit().unwrap();
        let got = all(&mut r, spool.confirmed());
        assert_eq!(got, ["r4", "r5", "r6", "r7", "r8", "r9", "r10"]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
