//! pika's binlog on its own volume, read while pika is stopped: the commands a master wrote past a position. Its
//! layout (pika v4.0.1, `pika_binlog.cc`, `pika_binlog_transverter.cc`): files `write2file<N>` in
//! `<log-path>/log_db0/`, cut into 64 KiB blocks of physical records, each an 8-byte header (payload length in 3
//! bytes little-endian, a 4-byte time, a record type) and its payload. A block's tail too short for a header is
//! zero-filled. A binlog item spans one full record or a first, middle… and last one; it is a 34-byte header (type
//! 1, time, term, logic id, file number, offset, content length) followed by the command in RESP.

use std::path::{Path, PathBuf};

use crate::input::replication::{BinlogCommand as Command, BinlogPosition};

/// Bytes per block.
const BLOCK: usize = 64 * 1024;
/// Bytes of a physical record's header.
const HEADER: usize = 8;
/// Bytes of a binlog item's header before its content.
const ITEM_HEADER: usize = 34;
/// The one item type pika writes.
const TYPE_FIRST: u16 = 1;

/// The binlog's file name prefix.
pub const FILE_PREFIX: &str = "write2file";

/// Why the binlog could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file that exists (or the first one) could not be read.
    #[error("cannot read the binlog file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The first file ends before the position: not this history's binlog.
    #[error("the binlog file {path} ends at byte {len}, before the position {offset}")]
    ShortFile {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: usize,
        /// The position in it.
        offset: u64,
    },
}

/// What a file holds from a position on: its commands in order, and where the last whole record ended (a torn or
/// zero record stops the read: pika died writing it, or never wrote past it).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    /// The commands, in order.
    pub commands: Vec<Command>,
    /// Where the last whole item ended, in the last file read.
    pub end: usize,
    /// Items that did not decode (a foreign type, a content that is no RESP array): skipped, counted.
    pub undecoded: usize,
}

/// Decodes the records of one binlog file's bytes from `start`, which must be a record boundary (a position pika
/// reported).
#[must_use]
pub fn decode(bytes: &[u8], start: usize) -> Decoded {
    let mut out = Decoded { end: start, ..Decoded::default() };
    let mut pos = start;
    let mut item: Vec<u8> = Vec::new();
    loop {
        let in_block = pos % BLOCK;
        if BLOCK - in_block <= HEADER {
            pos += BLOCK - in_block;
        }
        let Some(header) = bytes.get(pos..pos + HEADER) else { break };
        let len = usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
        let kind = header[7];
        if len == 0 || kind == 0 || len > BLOCK - HEADER {
            break;
        }
        let Some(payload) = bytes.get(pos + HEADER..pos + HEADER + len) else { break };
        pos += HEADER + len;
        match kind {
            1 => item = payload.to_vec(),
            2 => {
                item = payload.to_vec();
                continue;
            }
            3 => {
                item.extend_from_slice(payload);
                continue;
            }
            4 => item.extend_from_slice(payload),
            _ => break,
        }
        match decode_item(&item) {
            Some(command) => out.commands.push(command),
            None => out.undecoded += 1,
        }
        out.end = pos;
    }
    out
}

/// A binlog item's command.
fn decode_item(item: &[u8]) -> Option<Command> {
    let kind = u16::from_le_bytes(item.get(..2)?.try_into().ok()?);
    let len = u32::from_le_bytes(item.get(30..ITEM_HEADER)?.try_into().ok()?);
    let content = item.get(ITEM_HEADER..)?;
    if kind != TYPE_FIRST || content.len() != usize::try_from(len).ok()? {
        return None;
    }
    parse_resp_array(content)
}

/// `*N\r\n` then N `$L\r\n<L bytes>\r\n`; the whole input.
fn parse_resp_array(text: &[u8]) -> Option<Command> {
    fn line(text: &[u8], at: usize, mark: u8) -> Option<(usize, usize)> {
        if text.get(at) != Some(&mark) {
            return None;
        }
        let end = at + text[at..].windows(2).position(|w| w == b"\r\n")?;
        let n = std::str::from_utf8(&text[at + 1..end]).ok()?.parse().ok()?;
        Some((n, end + 2))
    }
    let (count, mut at) = line(text, 0, b'*')?;
    let mut args = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let (len, from) = line(text, at, b'$')?;
        let arg = text.get(from..from + len)?;
        if text.get(from + len..from + len + 2) != Some(b"\r\n") {
            return None;
        }
        args.push(arg.to_vec());
        at = from + len + 2;
    }
    (at == text.len()).then_some(args)
}

/// `<dir>/write2file<N>`.
#[must_use]
pub fn file_of(dir: &Path, file: u64) -> PathBuf {
    dir.join(format!("{FILE_PREFIX}{file}"))
}

/// Every command in the binlog of `dir` from `from` on, through the files after it while they exist.
///
/// # Errors
/// A file that cannot be read, or the first one shorter than the position.
pub fn read_after(dir: &Path, from: BinlogPosition) -> Result<Decoded, Error> {
    let mut all = Decoded::default();
    let mut file = from.file;
    let mut start = from.offset;
    loop {
        let path = file_of(dir, file);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && file != from.file => break,
            Err(source) => return Err(Error::Read { path, source }),
        };
        let offset = usize::try_from(start).unwrap_or(usize::MAX);
        if offset > bytes.len() {
            return Err(Error::ShortFile { path, len: bytes.len(), offset: start });
        }
        let decoded = decode(&bytes, offset);
        all.commands.extend(decoded.commands);
        all.undecoded += decoded.undecoded;
        all.end = decoded.end;
        file += 1;
        start = 0;
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `command` as pika writes it: RESP inside a binlog item.
    fn item(command: &[&[u8]]) -> Vec<u8> {
        let mut content = format!("*{}\r\n", command.len()).into_bytes();
        for arg in command {
            content.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            content.extend_from_slice(arg);
            content.extend_from_slice(b"\r\n");
        }
        let mut item = Vec::new();
        item.extend_from_slice(&TYPE_FIRST.to_le_bytes());
        item.extend_from_slice(&[0; 4 + 4 + 8 + 4 + 8]);
        item.extend_from_slice(&u32::try_from(content.len()).unwrap().to_le_bytes());
        item.extend_from_slice(&content);
        item
    }

    /// Appends `item` to a file as pika's producer does: zero-fills a block tail too short for a header, and cuts
    /// the item into full, or first, middle… and last records.
    fn append(file: &mut Vec<u8>, item: &[u8]) {
        let mut left = item;
        let mut begin = true;
        loop {
            let leftover = BLOCK - file.len() % BLOCK;
            if leftover < HEADER {
                file.extend(std::iter::repeat_n(0, leftover));
            }
            let avail = BLOCK - file.len() % BLOCK - HEADER;
            let n = left.len().min(avail);
            let end = n == left.len();
            let kind = match (begin, end) {
                (true, true) => 1,
                (true, false) => 2,
                (false, true) => 4,
                (false, false) => 3,
            };
            file.extend_from_slice(&[(n & 0xff) as u8, ((n >> 8) & 0xff) as u8, (n >> 16) as u8, 0, 0, 0, 0, kind]);
            file.extend_from_slice(&left[..n]);
            left = &left[n..];
            begin = false;
            if end {
                break;
            }
        }
    }

    #[test]
    fn a_command_reads_back_from_its_record() {
        let mut file = Vec::new();
        append(&mut file, &item(&[b"SET", b"k", b"v"]));
        let decoded = decode(&file, 0);
        assert_eq!(decoded.commands, vec![vec![b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()]]);
        assert_eq!(decoded.end, file.len());
    }

    #[test]
    fn a_torn_last_record_ends_the_read_at_the_record_before() {
        let mut file = Vec::new();
        append(&mut file, &item(&[b"SET", b"a", b"1"]));
        let whole = file.len();
        append(&mut file, &item(&[b"SET", b"b", b"2"]));
        file.truncate(file.len() - 3);
        let decoded = decode(&file, 0);
        assert_eq!(decoded.commands.len(), 1);
        assert_eq!(decoded.end, whole);
    }

    #[test]
    fn an_item_that_is_no_resp_array_is_counted_and_skipped() {
        let mut bad = item(&[b"SET", b"a", b"1"]);
        bad[ITEM_HEADER] = b'+';
        let mut file = Vec::new();
        append(&mut file, &bad);
        append(&mut file, &item(&[b"DEL", b"a"]));
        let decoded = decode(&file, 0);
        assert_eq!(decoded.undecoded, 1);
        assert_eq!(decoded.commands, vec![vec![b"DEL".to_vec(), b"a".to_vec()]]);
    }

    #[test]
    fn the_files_after_the_position_are_read_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let (mut first, mut second) = (Vec::new(), Vec::new());
        append(&mut first, &item(&[b"SET", b"before", b"1"]));
        let from = first.len();
        append(&mut first, &item(&[b"SET", b"after", b"1"]));
        append(&mut second, &item(&[b"SET", b"next", b"1"]));
        std::fs::write(file_of(dir.path(), 3), &first).unwrap();
        std::fs::write(file_of(dir.path(), 4), &second).unwrap();
        let read = read_after(dir.path(), BinlogPosition::new(3, from as u64)).unwrap();
        let keys: Vec<&[u8]> = read.commands.iter().map(|c| c[1].as_slice()).collect();
        assert_eq!(keys, vec![b"after".as_slice(), b"next"]);
        assert!(matches!(read_after(dir.path(), BinlogPosition::new(3, 1 << 30)), Err(Error::ShortFile { .. })));
        assert!(matches!(read_after(dir.path(), BinlogPosition::new(9, 0)), Err(Error::Read { .. })));
    }

    proptest! {
        /// Whatever the sizes (items across block boundaries, block tails zero-filled), reading from the end of any
        /// item gives exactly the items after it.
        #[test]
        fn reading_from_any_item_boundary_gives_the_items_after_it(
            sizes in proptest::collection::vec(0usize..40_000, 1..12),
            from in 0usize..12,
        ) {
            let mut file = Vec::new();
            let mut bounds = vec![0];
            let mut commands = Vec::new();
            for (i, size) in sizes.iter().enumerate() {
                let key = format!("k{i}").into_bytes();
                let value = vec![b'x'; *size];
                append(&mut file, &item(&[b"SET", &key, &value]));
                bounds.push(file.len());
                commands.push(vec![b"SET".to_vec(), key, value]);
            }
            let from = from.min(sizes.len());
            let decoded = decode(&file, bounds[from]);
            prop_assert_eq!(decoded.commands, commands[from..].to_vec());
            prop_assert_eq!(decoded.end, file.len());
        }
    }
}
