//! `.npy` files as datasets: an array saved from NumPy (`np.save`) or PyTorch
//! (`np.save(path, t.numpy())`) loads with no conversion step, from a path or a URL, read into
//! memory ([`NpyArray::open`]) or mapped ([`NpyArray::open_mapped`]), and its rows are samples
//! that view those bytes without a copy.
//!
//! The format (NumPy's `format.py` documents it): the magic `\x93NUMPY`, a major and minor
//! version byte (1.0, 2.0 or 3.0), the header's length (2 bytes little-endian in version 1, 4
//! in versions 2 and 3), and the header: a Python dict literal such as
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 3, 32, 32), }`, padded with
//! spaces and a newline so the data starts at a multiple of 64 bytes. The data follows, in
//! C order.

use std::path::Path;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::loader::{Dataset, TensorRows};
use crate::storage::{Mapping, Session, Storage};
use crate::tensor::{External, HostBytes, Tensor, contiguous_strides};

/// A storage error as an `.npy` error naming the file.
fn as_npy(e: Error, name: &str) -> Error {
    match e {
        Error::Storage { problem, .. } => Error::Npy {
            path: name.to_owned(),
            problem,
        },
        e => e,
    }
}

/// A parsed `.npy` header: element type, shape, and where the data starts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    pub(crate) data_offset: usize,
}

const MAGIC: &[u8] = b"\x93NUMPY";

/// Parses the header at the start of `bytes`. Errors say what is wrong and what to do.
pub(crate) fn parse_header(bytes: &[u8]) -> std::result::Result<Header, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(
            "it does not start with the .npy magic `\\x93NUMPY`; is it a .npy file \
                    (np.save), not .npz or raw bytes?"
                .into(),
        );
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len, start): (usize, usize) = match major {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => {
            let n = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (
                usize::try_from(n).map_err(|_| "the header length is invalid")?,
                12,
            )
        }
        _ => {
            return Err(format!(
                "format version {major}.{minor} is not one of 1.0, 2.0, 3.0"
            ));
        }
    };
    let end = start
        .checked_add(len)
        .filter(|&end| end <= bytes.len())
        .ok_or("the file ends inside its header")?;
    let text = &bytes[start..end];
    let text = std::str::from_utf8(text).map_err(|_| "the header is not text")?;
    let dict = parse_dict(text)?;
    let field = |key: &str| -> std::result::Result<&Value, String> {
        dict.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("the header has no '{key}' entry"))
    };
    let Value::Str(descr) = field("descr")? else {
        return Err(
            "the header's 'descr' is not a string: structured (record) arrays are not \
                    supported; save each field as its own array"
                .into(),
        );
    };
    let dtype = parse_descr(descr)?;
    match field("fortran_order")? {
        Value::Bool(false) => {}
        Value::Bool(true) => {
            return Err(
                "the array is stored in Fortran (column-major) order; save a C-order \
                        copy: np.save(path, np.ascontiguousarray(a))"
                    .into(),
            );
        }
        _ => return Err("the header's 'fortran_order' is not True or False".into()),
    }
    let Value::Tuple(shape) = field("shape")? else {
        return Err("the header's 'shape' is not a tuple".into());
    };
    Ok(Header {
        dtype,
        shape: shape.clone(),
        data_offset: end,
    })
}

/// A NumPy dtype string (`<f4`, `|b1`, `<i8`, ...) as a [`DType`].
fn parse_descr(descr: &str) -> std::result::Result<DType, String> {
    // The byte order is one ASCII character; anything else is not a dtype we know.
    let (order, kind) = descr.split_at_checked(1).unwrap_or(("", descr));
    let dtype = match kind {
        "b1" => DType::Bool,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        _ => {
            return Err(format!(
                "dtype '{descr}' is not supported (bool, u8–u64, i8–i64, f16, f32 and f64 \
                 are); convert it first, e.g. np.save(path, a.astype(np.float32))"
            ));
        }
    };
    let native_little = cfg!(target_endian = "little");
    let little = match order {
        "<" => true,
        ">" => false,
        "=" => native_little,
        "|" => dtype.size() == 1 || native_little,
        _ => {
            return Err(format!(
                "dtype '{descr}' has an unknown byte order '{order}'"
            ));
        }
    };
    if dtype.size() > 1 && little != native_little {
        return Err(format!(
            "dtype '{descr}' is {}-endian and this machine is not; save a native-order copy: \
             np.save(path, a.astype(a.dtype.newbyteorder('=')))",
            if little { "little" } else { "big" }
        ));
    }
    Ok(dtype)
}

/// A value in a `.npy` header dict.
#[derive(Debug, PartialEq, Eq)]
enum Value {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
    /// Anything else (a list, for structured dtypes).
    Other,
}

/// Parses the header's dict literal: string keys; string, `True`/`False`, int-tuple values.
fn parse_dict(text: &str) -> std::result::Result<Vec<(String, Value)>, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let bad = || format!("the header {:?} is not a dict literal", text.trim_end());
    p.skip_ws();
    if !p.eat(b'{') {
        return Err(bad());
    }
    let mut out = Vec::new();
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            return Ok(out);
        }
        let key = p.string().ok_or_else(bad)?;
        p.skip_ws();
        if !p.eat(b':') {
            return Err(bad());
        }
        p.skip_ws();
        let value = p.value().ok_or_else(bad)?;
        out.push((key, value));
        p.skip_ws();
        if !p.eat(b',') {
            p.skip_ws();
            return if p.eat(b'}') { Ok(out) } else { Err(bad()) };
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        self.i += usize::from(hit);
        hit
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn string(&mut self) -> Option<String> {
        let quote = self.peek().filter(|&c| c == b'\'' || c == b'"')?;
        self.i += 1;
        let start = self.i;
        while self.peek()? != quote {
            self.i += 1;
        }
        let s = std::str::from_utf8(&self.s[start..self.i]).ok()?.to_owned();
        self.i += 1;
        Some(s)
    }

    fn word(&mut self) -> &[u8] {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
        {
            self.i += 1;
        }
        &self.s[start..self.i]
    }

    fn value(&mut self) -> Option<Value> {
        match self.peek()? {
            b'\'' | b'"' => self.string().map(Value::Str),
            b'(' => {
                self.i += 1;
                let mut dims = Vec::new();
                loop {
                    self.skip_ws();
                    if self.eat(b')') {
                        return Some(Value::Tuple(dims));
                    }
                    let digits = self.word();
                    // Old files may write `3L`.
                    let digits = digits.strip_suffix(b"L").unwrap_or(digits);
                    dims.push(std::str::from_utf8(digits).ok()?.parse().ok()?);
                    self.skip_ws();
                    if !self.eat(b',') {
                        self.skip_ws();
                        return self.eat(b')').then_some(Value::Tuple(dims));
                    }
                }
            }
            b'[' => {
                // A structured dtype's field list: skip it, brackets balanced.
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'[' => depth += 1,
                        b']' => depth -= 1,
                        _ => {}
                    }
                    self.i += 1;
                    if depth == 0 {
                        return Some(Value::Other);
                    }
                }
            }
            _ => match self.word() {
                b"True" => Some(Value::Bool(true)),
                b"False" => Some(Value::Bool(false)),
                _ => None,
            },
        }
    }
}

/// A `.npy` file, memory-mapped, as a dataset of its rows (indices along the first dimension);
/// each sample a zero-copy view of the mapping, copied once, by collation.
///
/// The file must not be modified or truncated while the array (or any tensor viewing it) lives:
/// the mapping reads it in place.
///
/// # Examples
///
/// ```
/// use pinnable::loader::Dataset;
/// use pinnable::formats::npy::NpyArray;
///
/// // A 2×3 i32 array as `np.save` writes it: magic, version 1.0, the header padded to 64 bytes.
/// let mut header = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }".to_string();
/// while (10 + header.len() + 1) % 64 != 0 {
///     header.push(' ');
/// }
/// header.push('\n');
/// let mut file = b"\x93NUMPY\x01\x00".to_vec();
/// file.extend((header.len() as u16).to_le_bytes());
/// file.extend(header.as_bytes());
/// file.extend([1i32, 2, 3, 4, 5, 6].iter().flat_map(|v| v.to_le_bytes()));
/// let path = std::env::temp_dir().join(format!("npy-doc-{}.npy", std::process::id()));
/// std::fs::write(&path, file).unwrap();
///
/// // SAFETY: nothing writes the file while it is mapped.
/// let array = unsafe { NpyArray::open_mapped(&path) }?;
/// assert_eq!(array.len(), 2);
/// assert_eq!(array.get(1)?.to_vec::<i32>()?, vec![4, 5, 6]); // a view of the mapped file
/// # drop(array);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct NpyArray {
    tensor: Tensor,
    rows: Option<TensorRows>,
}

impl NpyArray {
    /// Reads the `.npy` file at `location` (a path, or with the `remote` feature an
    /// `s3://` or `http(s)://` URL) into memory with the default [`Storage`] settings, and
    /// checks its header: see [`open_with`](Self::open_with).
    ///
    /// # Errors
    ///
    /// As [`open_with`](Self::open_with).
    pub fn open(location: impl AsRef<Path>) -> Result<NpyArray> {
        NpyArray::open_with(&Storage::new(), location)
    }

    /// Reads the `.npy` file at `location` (a path or a URL) into memory, read as `storage`
    /// says, and checks its header. The array owns its bytes: nothing a file's later writers
    /// do changes it. [`open_mapped`](Self::open_mapped) maps a local file instead.
    ///
    /// # Errors
    ///
    /// [`Error::Npy`] naming the file and what to do: it cannot be read (a URL without the
    /// `remote` feature), is not `.npy`, is Fortran-ordered, big-endian, of a dtype without a
    /// counterpart here, or shorter than its header says.
    pub fn open_with(storage: &Storage, location: impl AsRef<Path>) -> Result<NpyArray> {
        let name = location.as_ref().display().to_string();
        let bytes = Session::new(storage)
            .read_all(&name)
            .map_err(|e| as_npy(e, &name))?;
        NpyArray::parse(Arc::new(bytes), &name)
    }

    /// Maps the local `.npy` file at `path` and checks its header: rows view the mapping, no
    /// copy.
    ///
    /// # Errors
    ///
    /// As [`open_with`](Self::open_with); a URL is not a local file.
    ///
    /// # Safety
    ///
    /// 1. Nothing (this process or another) writes to or truncates the file while the array or
    ///    any tensor viewing it lives. The mapping is not a snapshot: a write would change
    ///    bytes that tensors read as unchanging (and `bool` data checked when opened), and a
    ///    truncation would make reading them fault. Datasets saved once and then only read
    ///    satisfy this.
    pub unsafe fn open_mapped(path: impl AsRef<Path>) -> Result<NpyArray> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let mapping = Mapping::open(path).map_err(|problem| Error::Npy {
            path: name.clone(),
            problem,
        })?;
        NpyArray::parse(Arc::new(mapping), &name)
    }

    /// A `.npy` file already in memory (read from an archive, received over the network) as
    /// a dataset of its rows, each a zero-copy view of `bytes`. `name` stands for the file in
    /// errors.
    ///
    /// # Errors
    ///
    /// [`Error::Npy`] naming `name` and what to do, as for [`open`](Self::open).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use pinnable::loader::Dataset;
    /// use pinnable::formats::npy::NpyArray;
    ///
    /// let header = "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }";
    /// let mut file = b"\x93NUMPY\x01\x00".to_vec();
    /// file.extend((header.len() as u16).to_le_bytes());
    /// file.extend(header.as_bytes());
    /// file.extend([1u8, 2, 3, 4, 5, 6]);
    /// let array = NpyArray::from_host_bytes(Arc::new(file), "in-memory.npy")?;
    /// assert_eq!(array.get(1)?.to_vec::<u8>()?, vec![4, 5, 6]);
    /// # Ok::<(), pinnable::Error>(())
    /// ```
    pub fn from_host_bytes(bytes: Arc<dyn HostBytes>, name: &str) -> Result<NpyArray> {
        NpyArray::parse(bytes, name)
    }

    /// Parses the header and views the data, both in the one answer `bytes` gives.
    fn parse(bytes: Arc<dyn HostBytes>, name: &str) -> Result<NpyArray> {
        let err = |problem: String| Error::Npy {
            path: name.to_owned(),
            problem,
        };
        let bytes = External::new(bytes);
        let header = parse_header(bytes.bytes()).map_err(err)?;
        let (strides, _) = contiguous_strides(&header.shape).map_err(|e| err(e.to_string()))?;
        let tensor = Tensor::over_host_bytes(
            bytes,
            header.dtype,
            &header.shape,
            &strides,
            header.data_offset,
        )
        .map_err(|e| {
            err(format!(
                "the data does not match the header ({e}); the file may be truncated"
            ))
        })?;
        let rows = TensorRows::new(tensor.clone()).ok();
        Ok(NpyArray { tensor, rows })
    }

    /// The whole array, viewing the mapping.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }
}

/// Row `index` of the array (a rank-0 array has no rows: its length is 0).
impl Dataset for NpyArray {
    type Sample = Tensor;

    fn len(&self) -> usize {
        self.rows.as_ref().map_or(0, Dataset::len)
    }

    fn get(&self, index: usize) -> Result<Tensor> {
        match &self.rows {
            Some(rows) => rows.get(index),
            None => Err(Error::IndexOutOfRange { index, len: 0 }),
        }
    }
}

#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
mod descr_tests {
    use super::parse_descr;
    use crate::dtype::DType;

    #[test]
    fn hostile_dtype_strings_are_errors_not_panics() {
        assert_eq!(parse_descr("<f4"), Ok(DType::F32));
        assert_eq!(parse_descr("|b1"), Ok(DType::Bool));
        for bad in ["", "é4", "<", "ff", "<é", "\u{1F600}f4", "<f16"] {
            assert!(parse_descr(bad).is_err(), "{bad:?} was accepted");
        }
    }
}

#[cfg(test)]
mod header_tests {
    use super::{Header, parse_header};
    use crate::dtype::DType;

    #[test]
    fn npy_headers_of_every_version_parse() {
        let header = |major: u8, dict: &str| {
            let mut v = b"\x93NUMPY".to_vec();
            v.extend([major, 0]);
            let len = dict.len();
            if major == 1 {
                v.extend((len as u16).to_le_bytes());
            } else {
                v.extend((len as u32).to_le_bytes());
            }
            v.extend(dict.as_bytes());
            v
        };
        let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }   \n";
        for major in [1, 2, 3] {
            let h = parse_header(&header(major, dict)).unwrap();
            let start = if major == 1 { 10 } else { 12 };
            let want = Header {
                dtype: DType::F32,
                shape: vec![3, 4],
                data_offset: start + dict.len(),
            };
            assert_eq!(h, want);
        }
        let scalar = "{\"shape\": (), \"fortran_order\": False, \"descr\": \"|b1\"}\n";
        let h = parse_header(&header(1, scalar)).unwrap();
        assert_eq!((h.dtype, h.shape), (DType::Bool, vec![]));
        let one = "{'descr': '<i8', 'fortran_order': False, 'shape': (7,), }\n";
        assert_eq!(parse_header(&header(1, one)).unwrap().shape, vec![7]);
    }

    #[test]
    fn npy_header_errors_say_what_to_do() {
        let header = |dict: &str| {
            let mut v = b"\x93NUMPY\x01\x00".to_vec();
            v.extend((dict.len() as u16).to_le_bytes());
            v.extend(dict.as_bytes());
            v
        };
        let err = |dict: &str| parse_header(&header(dict)).unwrap_err();
        let e = err("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }");
        assert!(e.contains("np.ascontiguousarray"), "{e}");
        let e = err("{'descr': '>f8', 'fortran_order': False, 'shape': (3,), }");
        assert!(
            e.contains("big-endian") && e.contains("newbyteorder"),
            "{e}"
        );
        let e = err("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }");
        assert!(
            e.contains("'<c8' is not supported") && e.contains("astype"),
            "{e}"
        );
        let e = err("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }");
        assert!(e.contains("structured"), "{e}");
        let e = err("{'descr': '<f4', 'shape': (3,), }");
        assert!(e.contains("'fortran_order'"), "{e}");
        let e = err("not a dict");
        assert!(e.contains("not a dict literal"), "{e}");
        assert!(
            parse_header(b"PK\x03\x04 zip")
                .unwrap_err()
                .contains("magic")
        );
        let mut v2 = header("{}");
        v2[6] = 9;
        assert!(parse_header(&v2).unwrap_err().contains("version 9.0"));
        assert!(
            parse_header(&header(
                "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }"
            ))
            .is_ok()
        );
    }
}
