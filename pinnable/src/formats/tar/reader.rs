//! The tar reader: ustar, pax (`path` and `size` records, per-member and global headers) and
//! GNU long names, read from a shard's bytes without copying members.
//!
//! It yields each member's path and the byte range of its data in the shard; nothing is read
//! but headers. Every header's checksum is checked, every length is checked against the
//! shard's size before anything is read (for a gzip-compressed shard, whose size is known
//! only at its end, by decompressing up to the member's last byte), and every error names the
//! shard and the byte offset of the header at fault.

use std::borrow::Cow;
use std::collections::HashMap;

use super::gzip::Gz;
use crate::error::{Error, Result};
use crate::storage::ByteSource;

/// A tar block: headers and member data are laid out in 512-byte blocks.
pub(crate) const BLOCK: u64 = 512;

/// The largest pax header or GNU long name read: far above any real path, and a bound on the
/// memory a hostile shard can make the reader take.
pub(crate) const MAX_META: u64 = 1 << 20;

/// What kind of member a header describes, by its type flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A regular file (`0`, NUL, or the contiguous-file flag `7`).
    File,
    /// A directory (`5`, or NUL with a name ending in `/`, as tar readers take it).
    Directory,
    /// Anything else: links, devices, FIFOs, unknown flags. Its data (if any) is skipped.
    Other(u8),
}

/// One member of a shard: its path and where its data lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
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

/// The members of a shard in file order, from `members`.
pub(crate) struct Members<'a> {
    bytes: &'a dyn ByteSource,
    /// A compressed shard, whose size is known only once decompression reaches its end.
    stream: Option<&'a Gz>,
    shard: &'a str,
    offset: u64,
    global: HashMap<Vec<u8>, Vec<u8>>,
    /// The path of the member whose data runs past the end, once that is the error.
    truncated: Option<Vec<u8>>,
    done: bool,
}

/// The members of the shard `bytes`, named `shard` in errors.
pub(crate) fn members<'a>(bytes: &'a dyn ByteSource, shard: &'a str) -> Members<'a> {
    Members {
        bytes,
        stream: None,
        shard,
        offset: 0,
        global: HashMap::new(),
        truncated: None,
        done: false,
    }
}

/// The members of a compressed shard, read in one pass of its decompression.
pub(crate) fn stream_members<'a>(gz: &'a Gz, shard: &'a str) -> Members<'a> {
    Members {
        stream: Some(gz),
        ..members(gz, shard)
    }
}

impl Members<'_> {
    /// After the error of a member whose data runs past the end of the shard: its path.
    pub(crate) fn truncated_member(&self) -> Option<&[u8]> {
        self.truncated.as_deref()
    }

    /// The shard's size: known for a plain shard, and for a compressed one once its
    /// decompression has reached the end.
    fn size(&self) -> Option<u64> {
        match self.stream {
            Some(gz) => gz.known_len(),
            None => Some(self.bytes.len()),
        }
    }

    fn error(&self, offset: u64, problem: impl Into<String>) -> Error {
        Error::Tar {
            shard: self.shard.to_owned(),
            offset,
            problem: problem.into(),
        }
    }

    fn truncated(&self, offset: u64, len: u64, what: &str, size: u64) -> Error {
        let long = if self.stream.is_some() {
            "decompresses to"
        } else {
            "is"
        };
        self.error(
            offset,
            format!(
                "the {what} needs {len} bytes here but the shard {long} {size} bytes: it is \
                 truncated; copy it again"
            ),
        )
    }

    fn read(&self, offset: u64, len: u64, what: &str) -> Result<Cow<'_, [u8]>> {
        let end = offset.checked_add(len);
        if let Some(size) = self.size()
            && end.is_none_or(|e| e > size)
        {
            return Err(self.truncated(offset, len, what, size));
        }
        let n = usize::try_from(len).map_err(|_| self.error(offset, "too long for memory"))?;
        let got = self.bytes.read_at(offset, n);
        if matches!(&got, Ok(b) if b.len() == n) {
            return got.map_err(|e| self.error(offset, e.to_string()));
        }
        // A compressed shard's end is found by reading past it.
        if let Some(size) = self.size()
            && end.is_none_or(|e| e > size)
        {
            return Err(self.truncated(offset, len, what, size));
        }
        match got {
            Ok(b) => Err(self.error(offset, format!("the {what}: read {} of {n} bytes", b.len()))),
            Err(e) => Err(self.error(offset, format!("the {what}: {e}"))),
        }
    }

    /// The end of the members: none is missing unless a pax or long-name header (at `first`)
    /// promised one.
    fn end(&self, at: u64, first: Option<u64>, what: &str) -> Result<Option<Member>> {
        match first {
            Some(_) => Err(self.error(
                at,
                format!(
                    "{what} right after a pax or long-name header: the member it describes is \
                     missing"
                ),
            )),
            None => Ok(None),
        }
    }

    /// The path a member header stands for, after pax and long-name records.
    fn path(
        &self,
        local: &HashMap<Vec<u8>, Vec<u8>>,
        long: Option<Vec<u8>>,
        name: &[u8],
    ) -> Vec<u8> {
        let pax_path = local.get(&b"path"[..]).or(self.global.get(&b"path"[..]));
        match (pax_path, long) {
            (Some(p), _) => p.clone(),
            (None, Some(n)) => n,
            (None, None) => name.to_vec(),
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
            // No end-of-archive blocks: tar readers accept that, as we do, unless a pax or
            // long-name header promised a member.
            if self.size().is_some_and(|len| at >= len) {
                return self.end(at, first, "the shard ends");
            }
            let block = match self.read(at, BLOCK, "header block") {
                Ok(block) => block.into_owned(),
                Err(_) if self.size().is_some_and(|len| at >= len) => {
                    return self.end(at, first, "the shard ends");
                }
                Err(e) => return Err(e),
            };
            if block.iter().all(|&b| b == 0) {
                return self.end(at, first, "an end-of-archive block");
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
            if let Err(e) = self.check_data(at, data, size) {
                if header.is_entry() {
                    self.truncated = Some(self.path(&local, long_name, &header.name));
                }
                return Err(e);
            }
            // The padding of the last member may be missing: the next read finds the end.
            self.offset = self.size().map_or(padded, |len| padded.min(len));
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
                    return Ok(Some(Member {
                        path: self.path(&local, long_name, &header.name),
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

    /// That the `size` bytes of data from `data` (the member whose header is at `at`) lie in
    /// the shard: checked against its size, or for a compressed shard by decompressing up to
    /// their last byte.
    fn check_data(&self, at: u64, data: u64, size: u64) -> Result<()> {
        let past =
            |len: u64| {
                self.error(
                at,
                format!(
                    "the member's data ({size} bytes from byte {data}) runs past the end of the \
                     shard ({len} bytes{}): it is truncated; copy it again",
                    if self.stream.is_some() { " decompressed" } else { "" }
                ),
            )
            };
        let end = data.checked_add(size);
        if let Some(len) = self.size() {
            return match end {
                Some(end) if end <= len => Ok(()),
                _ => Err(past(len)),
            };
        }
        let Some(last) = end.and_then(|e| e.checked_sub(1)).filter(|_| size > 0) else {
            return Ok(());
        };
        match self.read(last, 1, "member's data") {
            Ok(_) => Ok(()),
            Err(e) => match self.size() {
                Some(len) if last >= len => Err(past(len)),
                _ => Err(e),
            },
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

#[cfg(test)]
mod tests;
