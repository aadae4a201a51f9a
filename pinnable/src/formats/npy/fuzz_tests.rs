//! `.npy` files are hostile input: the parser and the dataset over it are fed arbitrary bytes
//! (valid files, mutated) and must answer each with an [`Error::Npy`] naming the file, or an
//! array that views exactly the bytes after the header; never a panic, a hang or a read
//! outside the input.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::NpyArray;
use crate::error::Error;
use crate::fuzz::Fuzz;
use crate::loader::Dataset;
use crate::tensor::{HostBytes, Tensor};

/// An input's bytes in memory aligned for every dtype, as a file's mapping (page-aligned) or a
/// heap buffer would be; anywhere else an array's data may rightly be refused as misaligned.
struct Aligned {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl HostBytes for Aligned {
    fn host_bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

fn aligned(bytes: &[u8]) -> Arc<dyn HostBytes> {
    let mut buf = vec![0u8; bytes.len() + 8];
    let start = (0..8)
        .find(|s| (buf.as_ptr() as usize + s).is_multiple_of(8))
        .expect("one of eight starts is aligned");
    buf[start..start + bytes.len()].copy_from_slice(bytes);
    Arc::new(Aligned {
        buf,
        start,
        len: bytes.len(),
    })
}

/// A `.npy` file of format `version` with `header` (padded as NumPy pads it) and `data`.
fn file(version: u8, header: &str, data: &[u8]) -> Vec<u8> {
    let prefix = if version == 1 { 10 } else { 12 };
    let mut h = header.to_owned();
    while !(prefix + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut f = b"\x93NUMPY".to_vec();
    f.extend([version, 0]);
    if version == 1 {
        f.extend((h.len() as u16).to_le_bytes());
    } else {
        f.extend((h.len() as u32).to_le_bytes());
    }
    f.extend(h.as_bytes());
    f.extend(data);
    f
}

fn seeds() -> Vec<Vec<u8>> {
    let dict = |descr: &str, shape: &str| {
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}")
    };
    let bytes = |n: usize| (0..n).map(|i| (i * 37 % 256) as u8).collect::<Vec<u8>>();
    vec![
        file(1, &dict("<f4", "(2, 3)"), &bytes(24)),
        file(2, &dict("<i8", "(3,)"), &bytes(24)),
        file(3, &dict("|u1", "(4, 1, 2)"), &bytes(8)),
        file(1, &dict("|b1", "(5,)"), &[0, 1, 1, 0, 1]),
        file(1, &dict("<u2", "()"), &bytes(2)),
        file(1, &dict("<f8", "(0, 7)"), &[]),
        file(1, &dict("<i2", "(2L, 2L)"), &bytes(8)),
        file(1, &dict("<f2", "(3,)"), &bytes(6 + 10)), // trailing bytes after the data
        file(
            1,
            "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
            &bytes(4),
        ),
    ]
}

/// The bytes `t` reads, in row-major order.
fn bytes_of(t: &Tensor) -> Result<Vec<u8>, String> {
    let src = t.host_src("fuzz").map_err(|e| e.to_string())?;
    let mut out = vec![0u8; t.nbytes()];
    // SAFETY: `out` has room for the tensor's bytes and does not overlap them; the source is
    // live (held by `t`) and read-only.
    unsafe { src.gather(out.as_mut_ptr()) };
    Ok(out)
}

/// Checks an accepted file: the array views the bytes right after the header, as the header's
/// length field places them, and its rows are those bytes cut in order.
fn check(input: &[u8], array: &NpyArray) -> Result<(), String> {
    let header_end = match input[6] {
        1 => 10 + usize::from(u16::from_le_bytes([input[8], input[9]])),
        _ => 12 + u32::from_le_bytes([input[8], input[9], input[10], input[11]]) as usize,
    };
    let t = array.tensor();
    let data = bytes_of(t)?;
    let want = input
        .get(header_end..header_end + data.len())
        .ok_or_else(|| format!("{t:?} reaches past the input's {} bytes", input.len()))?;
    if data != want {
        return Err(format!("{t:?} does not view the bytes after the header"));
    }
    let rows = t.shape().first().copied().unwrap_or(0);
    if array.len() != rows {
        return Err(format!("{} rows for shape {:?}", array.len(), t.shape()));
    }
    if rows > 0 {
        let row = bytes_of(&array.get(rows - 1).map_err(|e| e.to_string())?)?;
        if row[..] != data[data.len() - row.len()..] {
            return Err("the last row is not the data's last bytes".into());
        }
    }
    Ok(())
}

#[test]
fn npy_parsing_of_arbitrary_bytes_is_an_error_or_a_correct_view() {
    for seed in seeds() {
        let array = NpyArray::from_host_bytes(aligned(&seed), "seed.npy");
        match array {
            // The structured dtype is refused; every other seed parses.
            Err(e) => assert!(e.to_string().contains("structured"), "{e}"),
            Ok(a) => check(&seed, &a).unwrap(),
        }
    }
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    Fuzz::new("npy_parsing_of_arbitrary_bytes_is_an_error_or_a_correct_view")
        .seeds(seeds())
        .tokens(&[
            b"\x93NUMPY",
            b"'descr'",
            b"'fortran_order'",
            b"'shape'",
            b"True",
            b"False",
            b"'<f4'",
            b"'|b1'",
            b"'>i8'",
            b"(",
            b")",
            b",",
            b"{",
            b"}",
            b": ",
            b"L",
            b"[",
            b"]",
            b"18446744073709551615",
        ])
        .run(
            move |input| match NpyArray::from_host_bytes(aligned(input), "fuzz.npy") {
                Ok(array) => {
                    counted.fetch_add(1, Ordering::Relaxed);
                    check(input, &array)
                }
                Err(Error::Npy { path, problem }) if path == "fuzz.npy" && !problem.is_empty() => {
                    Ok(())
                }
                Err(other) => Err(format!("an error that does not name the file: {other}")),
            },
        );
    // The mutations must reach the accepting path too, or the check above checks nothing.
    let accepted = accepted.load(Ordering::Relaxed);
    println!("{accepted} inputs accepted");
    assert!(accepted > 0, "no mutated input was accepted");
}
