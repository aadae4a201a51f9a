//! The shard formats, and where a file's tokens lie: parsed from the file's first bytes and
//! its length, every length checked against the file's size before anything is read.

use std::fmt;

use crate::dtype::DType;
use crate::formats::npy::parse_header;

/// How a shard file is laid out.
///
/// # Examples
///
/// ```
/// use pinnable::formats::tokens::ShardFormat;
/// use pinnable::DType;
///
/// // nanoGPT's `train.bin` of a tokenizer with more than 65536 tokens: say so.
/// let format = ShardFormat::Raw(DType::U32);
/// assert_eq!(format.to_string(), "raw u32");
/// assert_eq!(ShardFormat::default(), ShardFormat::Auto);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShardFormat {
    /// Told by the file: a `.npy` file by its magic `\x93NUMPY`, llm.c's format by one of its
    /// magic numbers (20240520, 20240801) in the first 4 bytes, anything else raw u16 tokens
    /// (nanoGPT's `train.bin`). A raw u16 file cannot be mistaken for llm.c's: its first two
    /// tokens would be 55432 and 308 (or 55489 and 308), and no raw file of u32 tokens is read
    /// as u16 without [`Raw`](Self::Raw) saying so — give the format explicitly for those. A
    /// file that starts with what looks like a damaged header of either (a `.npy` magic one
    /// byte off; 1024 bytes shaped like llm.c's header with a magic it does not write) is
    /// refused, not read as tokens: name its format to read it anyway.
    #[default]
    Auto,
    /// Raw little-endian tokens and nothing else, u16 ([`DType::U16`]) or u32
    /// ([`DType::U32`]): what NumPy's `tofile` writes (nanoGPT's `train.bin` is u16).
    Raw(DType),
    /// llm.c's format: a header of 256 little-endian i32 — `header[0]` the magic number,
    /// `header[1]` the version, `header[2]` the token count — then the tokens: magic 20240520
    /// with version 1 for u16 tokens (GPT-2), magic 20240801 with version 7 for u32 tokens
    /// (Llama 3), as llm.c's `dev/data/data_common.py` writes them.
    LlmC,
    /// A 1-D `.npy` array of `np.uint16` or `np.uint32`, as `np.save` writes it.
    Npy,
}

impl fmt::Display for ShardFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardFormat::Auto => f.write_str("auto"),
            ShardFormat::Raw(dtype) => write!(f, "raw {dtype}"),
            ShardFormat::LlmC => f.write_str("llm.c"),
            ShardFormat::Npy => f.write_str(".npy"),
        }
    }
}

/// llm.c's header: 256 little-endian i32.
pub(crate) const LLMC_HEADER: usize = 256 * 4;

/// The (magic, version, token type) pairs llm.c writes: GPT-2's, then Llama 3's.
const LLMC: [(i32, i32, DType); 2] = [(20240520, 1, DType::U16), (20240801, 7, DType::U32)];

const NPY_MAGIC: &[u8] = b"\x93NUMPY";

/// The bytes at the start of a file that [`layout`] may look at: a version 1.0 `.npy` header
/// (its length is 2 bytes), llm.c's header.
pub(crate) const HEAD: usize = 10 + (u16::MAX as usize) + 1;

/// Where a shard's tokens lie in its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The format, as found (never `Auto`).
    pub(crate) format: ShardFormat,
    /// `U16` or `U32`.
    pub(crate) dtype: DType,
    pub(crate) tokens: usize,
    /// The byte where the first token starts.
    pub(crate) offset: usize,
}

/// What is wrong with a file: the field, and what is wrong with it and what to do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) field: String,
    pub(crate) problem: String,
}

fn problem<T>(field: &str, problem: String) -> Result<T, Problem> {
    Err(Problem {
        field: field.to_owned(),
        problem,
    })
}

fn token_type(dtype: DType, field: &str) -> Result<DType, Problem> {
    match dtype {
        DType::U16 | DType::U32 => Ok(dtype),
        other => problem(
            field,
            format!(
                "{other} tokens; shards hold u16 or u32 tokens: convert them, e.g. \
                 a.astype(np.uint16) for a vocabulary of at most 65536 tokens, else np.uint32"
            ),
        ),
    }
}

/// Where the tokens of a file of `file_len` bytes lie, from its first bytes `head` (all of
/// them, or the first [`HEAD`]). Every length is checked against `file_len`: on `Ok`,
/// `offset + tokens × size ≤ file_len`.
pub(crate) fn layout(format: ShardFormat, head: &[u8], file_len: u64) -> Result<Layout, Problem> {
    let format = match format {
        ShardFormat::Auto if head.starts_with(NPY_MAGIC) => ShardFormat::Npy,
        ShardFormat::Auto
            if head.len() >= 4 && LLMC.iter().any(|l| head[..4] == l.0.to_le_bytes()) =>
        {
            ShardFormat::LlmC
        }
        ShardFormat::Auto => {
            refuse_header_shaped(head, file_len)?;
            ShardFormat::Raw(DType::U16)
        }
        f => f,
    };
    let layout = match format {
        ShardFormat::Raw(dtype) => raw(dtype, file_len)?,
        ShardFormat::LlmC => llmc(head, file_len)?,
        _ => npy(head, file_len)?,
    };
    debug_assert!(
        (layout.offset as u64) + (layout.tokens as u64) * (layout.dtype.size() as u64) <= file_len
    );
    Ok(Layout { format, ..layout })
}

/// In automatic detection, a file that is neither a `.npy` file nor llm.c's but starts with
/// what looks like one of their headers is refused rather than read as raw u16 tokens (its
/// header would become tokens). The rule:
/// - `.npy`-shaped: the first 6 bytes differ from `\x93NUMPY` in exactly one byte;
/// - llm.c-shaped: the file has at least 1024 bytes, and its third little-endian i32 is the
///   number of u16 or u32 tokens after a 1024-byte header, or the 1012 bytes after the first
///   three i32 are all zero (llm.c writes its header as 256 i32, unused ones zero).
///
/// Real text tokenized into u16 has neither: a 4-byte field equal to the file's token count
/// is a 1-in-2³² coincidence, and 506 zero tokens in a row do not occur in text. A raw file
/// that does start so can still be read by naming its format ([`ShardFormat::Raw`]).
fn refuse_header_shaped(head: &[u8], file_len: u64) -> Result<(), Problem> {
    let advice = "the file is damaged; if it really holds raw tokens, give its format \
                  explicitly (ShardFormat::Raw(DType::U16))";
    if head.len() >= NPY_MAGIC.len() {
        let differ = head.iter().zip(NPY_MAGIC).filter(|(a, b)| a != b).count();
        if differ == 1 {
            return problem(
                "header",
                format!(
                    "it starts with {:02x?}, one byte away from the .npy magic \\x93NUMPY: \
                     {advice}",
                    &head[..NPY_MAGIC.len()]
                ),
            );
        }
    }
    if file_len < LLMC_HEADER as u64 || head.len() < LLMC_HEADER {
        return Ok(());
    }
    let int = |i: usize| i32::from_le_bytes(head[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    let tokens = file_len - LLMC_HEADER as u64;
    let count = u64::try_from(int(2)).ok();
    let counts = count.is_some_and(|n| n * 2 == tokens || n * 4 == tokens);
    let zeros = head[12..LLMC_HEADER].iter().all(|&b| b == 0);
    if counts || zeros {
        let why = if counts {
            format!(
                "its third i32 ({}) is the token count after a 1024-byte header",
                int(2)
            )
        } else {
            "its first 1024 bytes are three i32 and zeros".to_owned()
        };
        return problem(
            "header[0] (magic)",
            format!(
                "{}, which is not llm.c's 20240520 or 20240801, but the file looks like an \
                 llm.c shard ({why}): {advice}",
                int(0)
            ),
        );
    }
    Ok(())
}

fn raw(dtype: DType, file_len: u64) -> Result<Layout, Problem> {
    let dtype = token_type(dtype, "format")?;
    let size = dtype.size() as u64;
    if !file_len.is_multiple_of(size) {
        return problem(
            "file size",
            format!(
                "{file_len} bytes is not a whole number of {dtype} tokens ({size} bytes each): \
                 the file is truncated, or its tokens are not raw {dtype}"
            ),
        );
    }
    let tokens = count(file_len / size, "file size")?;
    Ok(Layout {
        format: ShardFormat::Raw(dtype),
        dtype,
        tokens,
        offset: 0,
    })
}

fn count(n: u64, field: &str) -> Result<usize, Problem> {
    usize::try_from(n).or_else(|_| {
        problem(
            field,
            format!("{n} tokens do not fit in this machine's memory"),
        )
    })
}

fn llmc(head: &[u8], file_len: u64) -> Result<Layout, Problem> {
    if file_len < LLMC_HEADER as u64 || head.len() < 12 {
        return problem(
            "header",
            format!(
                "the file has {file_len} bytes, fewer than the {LLMC_HEADER} of llm.c's header \
                 (256 × i32): it is truncated, or not in llm.c's format"
            ),
        );
    }
    let int = |i: usize| i32::from_le_bytes(head[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    let (magic, version, n) = (int(0), int(1), int(2));
    let Some(&(_, want, dtype)) = LLMC.iter().find(|l| l.0 == magic) else {
        return problem(
            "header[0] (magic)",
            format!(
                "{magic}, which is not llm.c's 20240520 (GPT-2, u16 tokens) or 20240801 \
                 (Llama 3, u32 tokens): the file is not in llm.c's format; give its format \
                 explicitly (ShardFormat::Raw)"
            ),
        );
    };
    if version != want {
        return problem(
            "header[1] (version)",
            format!(
                "{version}, but llm.c writes magic {magic} with version {want} ({dtype} tokens); \
                 a file of another version cannot be read as llm.c's"
            ),
        );
    }
    let field = "header[2] (token count)";
    let Ok(n) = u64::try_from(n) else {
        return problem(field, format!("{n}, a negative count"));
    };
    let bytes = n * dtype.size() as u64;
    let have = file_len - LLMC_HEADER as u64;
    if have != bytes {
        let what = if have < bytes {
            "it is truncated".to_owned()
        } else {
            format!("{} bytes follow the last token", have - bytes)
        };
        return problem(
            field,
            format!(
                "{n} {dtype} tokens ({bytes} bytes), but the file holds {have} bytes after its \
                 header: {what}"
            ),
        );
    }
    Ok(Layout {
        format: ShardFormat::LlmC,
        dtype,
        tokens: count(n, field)?,
        offset: LLMC_HEADER,
    })
}

fn npy(head: &[u8], file_len: u64) -> Result<Layout, Problem> {
    let header = parse_header(head).map_err(|problem| Problem {
        field: "header".into(),
        problem: if (head.len() as u64) < file_len && problem.contains("ends inside its header") {
            format!(
                "the header is longer than the {} bytes shards may have",
                head.len()
            )
        } else {
            problem
        },
    })?;
    let dtype = token_type(header.dtype, "descr")?;
    let [n] = header.shape[..] else {
        return problem(
            "shape",
            format!("{:?}; a shard is 1-D: save a.reshape(-1)", header.shape),
        );
    };
    let bytes = (n as u64).checked_mul(dtype.size() as u64);
    let end = bytes.and_then(|b| b.checked_add(header.data_offset as u64));
    if end.is_none_or(|end| end > file_len) {
        return problem(
            "shape",
            format!(
                "({n},) {dtype} tokens from byte {}, but the file has {file_len} bytes: it is \
                 truncated",
                header.data_offset
            ),
        );
    }
    Ok(Layout {
        format: ShardFormat::Npy,
        dtype,
        tokens: n,
        offset: header.data_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::sampler::SplitMix64;

    fn llmc_file(magic: i32, version: i32, n: i32, tokens: usize) -> Vec<u8> {
        let mut f = vec![0u8; LLMC_HEADER];
        for (i, v) in [magic, version, n].into_iter().enumerate() {
            f[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        f.resize(LLMC_HEADER + tokens, 7);
        f
    }

    fn npy_file(descr: &str, shape: &str, data: usize) -> Vec<u8> {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut f = b"\x93NUMPY\x01\x00".to_vec();
        f.extend((h.len() as u16).to_le_bytes());
        f.extend(h.as_bytes());
        f.resize(f.len() + data, 3);
        f
    }

    fn parse(format: ShardFormat, file: &[u8]) -> Result<Layout, Problem> {
        layout(format, &file[..file.len().min(HEAD)], file.len() as u64)
    }

    fn field_of(r: Result<Layout, Problem>) -> String {
        r.expect_err("an error").field
    }

    #[test]
    fn every_format_is_found_and_measured() {
        let f = llmc_file(20240520, 1, 5, 10);
        let l = parse(ShardFormat::Auto, &f).unwrap();
        assert_eq!(
            (l.format, l.dtype, l.tokens, l.offset),
            (ShardFormat::LlmC, DType::U16, 5, 1024)
        );
        let f = llmc_file(20240801, 7, 3, 12);
        assert_eq!(parse(ShardFormat::LlmC, &f).unwrap().dtype, DType::U32);
        let f = npy_file("<u4", "(6,)", 24);
        let l = parse(ShardFormat::Auto, &f).unwrap();
        assert_eq!(
            (l.format, l.dtype, l.tokens, l.offset),
            (ShardFormat::Npy, DType::U32, 6, f.len() - 24)
        );
        let l = parse(ShardFormat::Auto, &[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(
            (l.format, l.dtype, l.tokens),
            (ShardFormat::Raw(DType::U16), DType::U16, 3)
        );
        assert_eq!(
            parse(ShardFormat::Raw(DType::U32), &[0; 8]).unwrap().tokens,
            2
        );
        assert_eq!(parse(ShardFormat::Auto, &[]).unwrap().tokens, 0);
    }

    #[test]
    fn bad_files_name_the_field() {
        let cases: [(ShardFormat, Vec<u8>, &str); 11] = [
            (ShardFormat::Auto, vec![1, 2, 3], "file size"),
            (ShardFormat::Raw(DType::U32), vec![0; 6], "file size"),
            (ShardFormat::Raw(DType::I64), vec![0; 8], "format"),
            (ShardFormat::LlmC, vec![0; 100], "header"),
            (
                ShardFormat::LlmC,
                llmc_file(1234, 1, 0, 0),
                "header[0] (magic)",
            ),
            (
                ShardFormat::Auto,
                llmc_file(20240520, 2, 5, 10),
                "header[1] (version)",
            ),
            (
                ShardFormat::Auto,
                llmc_file(20240520, 1, 6, 10),
                "header[2] (token count)",
            ),
            (
                ShardFormat::Auto,
                llmc_file(20240520, 1, 4, 10),
                "header[2] (token count)",
            ),
            (
                ShardFormat::Auto,
                llmc_file(20240520, 1, -1, 10),
                "header[2] (token count)",
            ),
            (ShardFormat::Npy, npy_file("<i8", "(6,)", 48), "descr"),
            (ShardFormat::Auto, npy_file("<u2", "(6,)", 11), "shape"),
        ];
        for (format, file, field) in cases {
            assert_eq!(field_of(parse(format, &file)), field, "{format}");
        }
        assert_eq!(
            field_of(parse(ShardFormat::Auto, &npy_file("<u2", "(2, 3)", 12))),
            "shape"
        );
        assert_eq!(field_of(parse(ShardFormat::Npy, &[1, 2, 3])), "header");
    }

    #[test]
    fn a_damaged_header_is_refused_not_read_as_raw_tokens() {
        let mut r = SplitMix64::for_test("a_damaged_header");
        for _ in 0..200 {
            let tokens = 2 * (1 + r.below(500) as usize);
            // llm.c's magic off by a little, or any wrong magic with the right count.
            let good = LLMC[r.below(2) as usize];
            let step = [1, -1, 1 << 8, r.next_u64() as i32 | 1][r.below(4) as usize];
            let magic = good.0.wrapping_add(step);
            let n = tokens / good.2.size();
            let damaged = llmc_file(magic, good.1, n as i32, tokens);
            let p = parse(ShardFormat::Auto, &damaged).unwrap_err();
            assert_eq!(p.field, "header[0] (magic)");
            assert!(p.problem.contains("ShardFormat::Raw"), "{}", p.problem);
            // A wrong count too: the zeros give it away.
            let damaged = llmc_file(magic, good.1, n as i32 + 1, tokens);
            assert!(parse(ShardFormat::Auto, &damaged).is_err());
            // Named explicitly, the same bytes are raw tokens.
            let raw = parse(ShardFormat::Raw(DType::U16), &damaged).unwrap();
            assert_eq!(raw.tokens, damaged.len() / 2);
            // A .npy magic with one byte changed.
            let mut npy = npy_file("<u2", "(6,)", 12);
            let i = r.below(6) as usize;
            npy[i] ^= 1 + r.below(255) as u8;
            assert_eq!(field_of(parse(ShardFormat::Auto, &npy)), "header");
        }
        // Random u16 tokens (text) are still raw, whatever their length.
        for _ in 0..200 {
            let n = r.below(4096) as usize;
            let text: Vec<u8> = (0..2 * n).map(|_| r.next_u64() as u8).collect();
            let l = parse(ShardFormat::Auto, &text).unwrap();
            assert_eq!((l.format, l.tokens), (ShardFormat::Raw(DType::U16), n));
        }
    }

    /// The shard headers under the crate's property-test harness: seeds of every format,
    /// mutated; every layout accepted lies within the file, no input panics or hangs.
    #[test]
    fn shard_headers_under_the_property_test_harness() {
        let seeds = vec![
            llmc_file(20240520, 1, 5, 10),
            llmc_file(20240801, 7, 3, 12),
            npy_file("<u2", "(6,)", 12),
            npy_file("<u4", "(2,)", 8),
        ];
        crate::fuzz::Fuzz::new("token_shard_header")
            .seeds(seeds)
            .tokens(&[
                b"\x93NUMPY",
                &20240520i32.to_le_bytes(),
                &20240801i32.to_le_bytes(),
            ])
            .run(|file| {
                let formats = [
                    ShardFormat::Auto,
                    ShardFormat::Raw(DType::U32),
                    ShardFormat::LlmC,
                    ShardFormat::Npy,
                ];
                for format in formats {
                    let len = file.len() as u64;
                    if let Ok(l) = layout(format, &file[..file.len().min(HEAD)], len) {
                        let end = l.offset as u64 + l.tokens as u64 * l.dtype.size() as u64;
                        if end > len || l.format == ShardFormat::Auto {
                            return Err(format!("{format}: {l:?} for {len} bytes"));
                        }
                    }
                }
                Ok(())
            });
    }

    /// Arbitrary bytes, and valid headers with random damage, never panic or hang, and every
    /// layout accepted lies within the file.
    #[test]
    fn arbitrary_bytes_are_errors_or_layouts_within_the_file() {
        let mut r = SplitMix64::for_test("arbitrary_bytes_are_errors_or_layouts");
        let formats = [
            ShardFormat::Auto,
            ShardFormat::Raw(DType::U16),
            ShardFormat::Raw(DType::U32),
            ShardFormat::LlmC,
            ShardFormat::Npy,
        ];
        let seeds = [
            llmc_file(20240520, 1, 5, 10),
            llmc_file(20240801, 7, 3, 12),
            npy_file("<u2", "(6,)", 12),
            npy_file("<u4", "(2,)", 8),
        ];
        let rounds = if cfg!(miri) { 300 } else { 40_000 };
        for round in 0..rounds {
            let mut file = match round % 3 {
                0 => (0..r.below(2048)).map(|_| r.next_u64() as u8).collect(),
                _ => seeds[r.below(seeds.len() as u64) as usize].clone(),
            };
            for _ in 0..r.below(4) {
                if file.is_empty() {
                    break;
                }
                let i = r.below(file.len().min(80) as u64) as usize;
                match r.below(3) {
                    0 => file[i] = r.next_u64() as u8,
                    1 => file.truncate(r.below(file.len() as u64 + 1) as usize),
                    _ => file.extend((0..r.below(9)).map(|_| r.next_u64() as u8)),
                }
            }
            // The file may also be claimed longer than the bytes at hand (a head only).
            let len = file.len() as u64 + r.below(2) * r.below(1 << 40);
            let format = formats[r.below(formats.len() as u64) as usize];
            if let Ok(l) = layout(format, &file[..file.len().min(HEAD)], len) {
                let end = l.offset as u64 + l.tokens as u64 * l.dtype.size() as u64;
                assert!(end <= len, "{l:?} past {len} bytes");
                assert!(matches!(l.dtype, DType::U16 | DType::U32));
                assert_ne!(l.format, ShardFormat::Auto);
            }
        }
    }
}
