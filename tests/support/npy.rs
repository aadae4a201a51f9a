//! `.npy` files as NumPy's `np.save` writes them (format version 1.0), for the tests, examples
//! and benches that need one.

/// A `.npy` file: a version 1.0 header for `descr` (e.g. `<f4`) and `shape` (C order, or
/// Fortran order), padded to 64 bytes as NumPy pads it, then `data`.
pub fn npy_file(descr: &str, shape: &[usize], fortran: bool, data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let order = if fortran { "True" } else { "False" };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}");
    while !(10 + dict.len() + 1).is_multiple_of(64) {
        dict.push(' ');
    }
    dict.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((dict.len() as u16).to_le_bytes());
    bytes.extend(dict.as_bytes());
    bytes.extend(data);
    bytes
}
