//! The tar reader: ustar, pax (`path` and `size` records, per-member and global headers) and
//! GNU long names, read from a shard's bytes without copying members.
//!
//! It yields each member's path and the byte range of its data in the shard; nothing is read
//! but headers. Every header's checksum is checked, every length is checked against the
//! shard's size before anything is read, and every error names the shard and the byte offset
//! of the header at fault.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::error::{Error, Result};

/// A tar block: headers and member data are laid out in 512-byte blocks.
pub(crate) const BLOCK: u64 = 512;

/// The largest pax header or GNU long name read: far above any real path, and a bound on the
/// memory a hostile shard can make the reader take.
pub(crate) const MAX_META: u64 = 1 << 20;

/// The bytes of one shard, read by offset: a memory-mapped file today, ranged reads of an
/// object in storage tomorrow.
///
/// Implement it to read shards from somewhere else; the reader asks only for ranges inside
/// `0..len()`, and treats a short answer as a truncated shard.
pub trait ShardBytes: Send + Sync {
    /// The shard's size in bytes.
    fn len(&self) -> u64;

    /// Whether the shard holds no byte.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` bytes from `offset` (borrowed where the bytes are already in memory).
    ///
    /// # Errors
    ///
    /// The I/O error reading them.
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>>;

    /// The whole shard, when it is in memory (mapped): members then become zero-copy views.
    fn in_memory(&self) -> Option<&[u8]> {
        None
    }
}

/// What kind of member a header describes, by its type flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file (`0`, NUL, or the contiguous-file flag `7`).
    File,
    /// A directory (`5`, or NUL with a name ending in `/`, as tar readers take it).
    Directory,
    /// Anything else: links, devices, FIFOs, unknown flags. Its data (if any) is skipped.
    Other(u8),
}

/// One member of a shard: its path and where its data lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The path, after pax and GNU long-name records are applied (raw bytes, as stored).
    pub path: Vec<u8>,
    /// What the member is.
    pub kind: Kind,
    /// The offset of the member's first header (including pax or long-name headers before it).
    pub header: u64,
    /// The offset of its data.
    pub data: u64,
    /// The length of its data.
    pub size: u64,
}

/// The members of a shard in file order, from [`members`].
pub struct Members<'a> {
    bytes: &'a dyn ShardBytes,
    shard: &'a str,
    offset: u64,
    global: HashMap<Vec<u8>, Vec<u8>>,
    done: bool,
}

/// The members of the shard `bytes`, named `shard` in errors.
pub fn members<'a>(bytes: &'a dyn ShardBytes, shard: &'a str) -> Members<'a> {
    Members {
        bytes,
        shard,
        offset: 0,
        global: HashMap::new(),
        done: false,
    }
}

impl Members<'_> {
    /// The byte offset of the next header to read.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn error(&self, offset: u64, problem: impl Into<String>) -> Error {
        Error::Tar {
            shard: self.shard.to_owned(),
            offset,
            problem: problem.into(),
        }
    }

    fn read(&self, offset: u64, len: u64, what: &str) -> Result<Cow<'_, [u8]>> {
        let end = offset.checked_add(len).filter(|&e| e <= self.bytes.len());
        if end.is_none() {
            return Err(self.error(
                offset,
                format!(
                    "the {what} needs {len} bytes here but the shard is {} bytes long: it is \
                     truncated; copy it again",
                    self.bytes.len()
                ),
            ));
        }
        let n = usize::try_from(len).map_err(|_| self.error(offset, "too long for memory"))?;
        match self.bytes.read_at(offset, n) {
            Ok(b) if b.len() == n => Ok(b),
            Ok(b) => Err(self.error(offset, format!("the {what}: read {} of {n} bytes", b.len()))),
            Err(e) => Err(self.error(offset, format!("the {what}: {e}"))),
        }
    }

    /// Reads the next member, following pax and long-name headers; `None` at the end.
    fn next_member(&mut self) -> Result<Option<Member>> {
        // Where the member's first header is, once a header other than a global one is read.
        let mut first: Option<u64> = None;
        let mut local: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut long_name: Option<Vec<u8>> = None;
        loop {
            let at = self.offset;
            let len = self.bytes.len();
            if at >= len {
                // No end-of-archive blocks: tar readers accept that, as we do, unless a pax
                // or long-name header promised a member.
                if first.is_some() {
                    return Err(self.error(
                        at,
                        "the shard ends after a pax or long-name header, \
                         before the member it describes: it is truncated",
                    ));
                }
                return Ok(None);
            }
            let block = self.read(at, BLOCK, "header block")?.into_owned();
            if block.iter().all(|&b| b == 0) {
                if first.is_some() {
                    return Err(self.error(
                        at,
                        "an end-of-archive block right after a pax or \
                         long-name header: the member it describes is missing",
                    ));
                }
                return Ok(None);
            }
            let header = Header::parse(&block).map_err(|p| self.error(at, p))?;
            if header.flag != b'g' {
                first.get_or_insert(at);
            }
            let data = at + BLOCK;
            let size = match local.get(&b"size"[..]).or(self.global.get(&b"size"[..])) {
                Some(v) if header.is_entry() => pax_number(v).ok_or_else(|| {
                    self.error(at, "a pax `size` record that is not a decimal number")
                })?,
                _ => header.size,
            };
            let padded = size
                .checked_add(BLOCK - 1)
                .map(|s| s / BLOCK * BLOCK)
                .and_then(|p| data.checked_add(p))
                .ok_or_else(|| self.error(at, format!("member size {size} overflows")))?;
            if data.checked_add(size).is_none_or(|end| end > len) {
                return Err(self.error(
                    at,
                    format!(
                        "the member's data ({size} bytes from byte {data}) runs past the end \
                         of the shard ({len} bytes): it is truncated; copy it again"
                    ),
                ));
            }
            // The padding of the last member may be missing: the next read finds the end.
            self.offset = padded.min(len);
            match header.flag {
                b'x' | b'g' | b'L' | b'K' if size > MAX_META => {
                    return Err(self.error(
                        at,
                        format!("a {size}-byte metadata header; at most {MAX_META} are read"),
                    ));
                }
                b'x' | b'g' => {
                    let text = self.read(data, size, "pax header")?;
                    let records = pax_records(&text).map_err(|p| self.error(at, p))?;
                    if header.flag == b'g' {
                        self.global.extend(records);
                    } else {
                        local.extend(records);
                    }
                }
                b'L' => {
                    let name = self.read(data, size, "GNU long name")?;
                    long_name = Some(until_nul(&name).to_vec());
                }
                b'K' => {}
                b'S' => {
                    return Err(self.error(
                        at,
                        "a GNU sparse member: not supported in a shard; \
                         write the shard without --sparse",
                    ));
                }
                _ => {
                    // Old archives mark directories as regular files whose name ends in `/`.
                    let old_dir = header.flag == 0 && header.name.ends_with(b"/");
                    let pax_path = local.get(&b"path"[..]).or(self.global.get(&b"path"[..]));
                    let path = match (pax_path, long_name) {
                        (Some(p), _) => p.clone(),
                        (None, Some(n)) => n,
                        (None, None) => header.name,
                    };
                    return Ok(Some(Member {
                        path,
                        kind: match header.flag {
                            0 if old_dir => Kind::Directory,
                            b'0' | 0 | b'7' => Kind::File,
                            b'5' => Kind::Directory,
                            f => Kind::Other(f),
                        },
                        header: first.unwrap_or(at),
                        data,
                        size,
                    }));
                }
            }
        }
    }
}

impl Iterator for Members<'_> {
    type Item = Result<Member>;

    /// The next member; after an error, nothing.
    fn next(&mut self) -> Option<Result<Member>> {
        if self.done {
            return None;
        }
        let next = self.next_member();
        if !matches!(next, Ok(Some(_))) {
            self.done = true;
        }
        next.transpose()
    }
}

/// The fields of one 512-byte header block that the reader uses.
struct Header {
    name: Vec<u8>,
    size: u64,
    flag: u8,
}

impl Header {
    fn parse(block: &[u8]) -> std::result::Result<Header, String> {
        let stored = octal(&block[148..156])
            .ok_or("the header checksum field is not an octal number: this is not a tar header")?;
        let unsigned: u64 = block
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u64::from(b)
                }
            })
            .sum();
        let signed: i64 = block
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    i64::from(b as i8)
                }
            })
            .sum();
        if stored != unsigned && i64::try_from(stored).ok() != Some(signed) {
            return Err(format!(
                "header checksum {stored} does not match the header's bytes ({unsigned}): the \
                 shard is corrupt here"
            ));
        }
        let size = number(&block[124..136]).ok_or("the header's size field is not a number")?;
        let flag = block[156];
        let mut name = until_nul(&block[..100]).to_vec();
        // POSIX ustar keeps a path prefix; GNU's magic ("ustar  ") uses that space otherwise.
        if &block[257..263] == b"ustar\0" {
            let prefix = until_nul(&block[345..500]);
            if !prefix.is_empty() {
                let mut full = prefix.to_vec();
                full.push(b'/');
                full.extend_from_slice(&name);
                name = full;
            }
        }
        Ok(Header { name, size, flag })
    }

    /// Whether the header is a member (not a pax or long-name header), whose size a pax
    /// `size` record overrides.
    fn is_entry(&self) -> bool {
        !matches!(self.flag, b'x' | b'g' | b'L' | b'K')
    }
}

fn until_nul(bytes: &[u8]) -> &[u8] {
    bytes.split(|&b| b == 0).next().unwrap_or(bytes)
}

/// An octal field: optional spaces, digits, then NULs or spaces.
fn octal(field: &[u8]) -> Option<u64> {
    let text = until_nul(field);
    let digits = text.trim_ascii();
    if digits.is_empty() {
        return Some(0);
    }
    digits.iter().try_fold(0u64, |n, &d| match d {
        b'0'..=b'7' => n.checked_mul(8)?.checked_add(u64::from(d - b'0')),
        _ => None,
    })
}

/// A numeric field: octal, or GNU's base-256 form (high bit of the first byte set).
fn number(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 != 0 {
        if field[0] & 0x40 != 0 {
            return None; // negative
        }
        let mut n = u64::from(field[0] & 0x3f);
        for &b in &field[1..] {
            n = n.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(n);
    }
    octal(field)
}

fn pax_number(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// A pax record: its keyword and value.
type Record = (Vec<u8>, Vec<u8>);

/// The `"<len> <key>=<value>\n"` records of a pax header.
fn pax_records(mut text: &[u8]) -> std::result::Result<Vec<Record>, String> {
    let mut out = Vec::new();
    while !text.is_empty() && text[0] != 0 {
        let space = text
            .iter()
            .position(|&b| b == b' ')
            .ok_or("a pax record without a length")?;
        let len: usize = std::str::from_utf8(&text[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("a pax record whose length is not a decimal number")?;
        if len <= space + 1 || len > text.len() || text[len - 1] != b'\n' {
            return Err(format!(
                "a pax record of length {len} that does not fit its header or end in a newline"
            ));
        }
        let record = &text[space + 1..len - 1];
        let eq = record
            .iter()
            .position(|&b| b == b'=')
            .ok_or("a pax record without `=`")?;
        out.push((record[..eq].to_vec(), record[eq + 1..].to_vec()));
        text = &text[len..];
    }
    Ok(out)
}

impl ShardBytes for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        usize::try_from(offset)
            .ok()
            .and_then(|o| self.get(o..o.checked_add(len)?))
            .map(Cow::Borrowed)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
    }

    fn in_memory(&self) -> Option<&[u8]> {
        Some(self)
    }
}

impl ShardBytes for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        self.as_slice().read_at(offset, len)
    }

    fn in_memory(&self) -> Option<&[u8]> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header block for `name` of type `flag` claiming `size` bytes (octal, or base-256
    /// when `base256`), checksummed.
    fn header(name: &[u8], flag: u8, size: u64, base256: bool) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name);
        if base256 {
            h[124] = 0x80;
            h[128..136].copy_from_slice(&size.to_be_bytes());
        } else {
            h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        }
        h[156] = flag;
        h[257..263].copy_from_slice(b"ustar\0");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        h
    }

    fn data(out: &mut Vec<u8>, bytes: &[u8]) {
        out.extend_from_slice(bytes);
        out.resize(out.len().next_multiple_of(512), 0);
    }

    fn pax(records: &[(&str, &str)]) -> Vec<u8> {
        let mut text = String::new();
        for (k, v) in records {
            let body = format!(" {k}={v}\n");
            let mut n = body.len() + 1;
            while format!("{n}{body}").len() != n {
                n += 1;
            }
            text.push_str(&format!("{n}{body}"));
        }
        text.into_bytes()
    }

    #[test]
    fn pax_size_and_path_base256_sizes_and_old_directories_are_read() {
        let mut r = crate::loader::SplitMix64::for_test("pax_size_and_path");
        let payload: Vec<u8> = (0..1 + r.below(2000)).map(|_| r.next_u64() as u8).collect();
        let mut tar = Vec::new();
        let g = pax(&[("comment", "global")]);
        tar.extend(header(b"pax_global", b'g', g.len() as u64, false));
        data(&mut tar, &g);
        let x = pax(&[
            ("path", "very/long/name.BIN"),
            ("size", &payload.len().to_string()),
        ]);
        tar.extend(header(b"PaxHeader", b'x', x.len() as u64, false));
        data(&mut tar, &x);
        let at = tar.len() as u64;
        tar.extend(header(b"short.bin", b'0', 0, false)); // size 0: pax says otherwise
        data(&mut tar, &payload);
        let big = tar.len() as u64;
        tar.extend(header(b"b256.txt", b'0', 3, true));
        data(&mut tar, b"abc");
        tar.extend(header(b"olddir/", 0, 0, false));
        tar.extend([0u8; 1024]);
        let got: Vec<Member> = members(&tar, "t.tar").map(|m| m.unwrap()).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].path, b"very/long/name.BIN");
        assert_eq!(got[0].header, 512 + 512); // the x header, after the global one
        assert_eq!((got[0].data, got[0].size), (at + 512, payload.len() as u64));
        assert_eq!(&tar[got[0].data as usize..][..payload.len()], &payload[..]);
        assert_eq!((got[1].data, got[1].size), (big + 512, 3));
        assert_eq!(got[2].kind, Kind::Directory);
    }

    #[test]
    fn lengths_past_the_end_are_errors_naming_the_offset() {
        let mut tar = Vec::new();
        tar.extend(header(b"a.txt", b'0', 5, false));
        data(&mut tar, b"hello");
        let second = tar.len() as u64;
        tar.extend(header(b"b.txt", b'0', 1 << 40, true)); // a terabyte
        data(&mut tar, b"x");
        let got: Vec<_> = members(&tar, "t.tar").collect();
        assert_eq!(got.len(), 2);
        let Err(Error::Tar {
            offset, problem, ..
        }) = &got[1]
        else {
            panic!("{:?}", got[1])
        };
        assert_eq!(*offset, second);
        assert!(problem.contains("truncated"), "{problem}");
        // A pax header claiming more than the bound is refused before it is read.
        let mut tar = header(b"PaxHeader", b'x', MAX_META + 1, false);
        tar.resize(tar.len() + MAX_META as usize + 512, b'1');
        let got: Vec<_> = members(&tar, "t.tar").collect();
        assert!(
            matches!(&got[0], Err(Error::Tar { offset: 0, .. })),
            "{got:?}"
        );
    }
}
