//! JPEGs whose subsampled chroma planes are at most two samples wide, decoded as libjpeg does.
//!
//! libjpeg interpolates a halved chroma plane (triangle, or "fancy", upsampling) only when the
//! plane is more than two samples wide; a narrower one (a 4:2:0 or 4:2:2 picture at most four
//! pixels wide) it repeats over each sample's 2 × 2 or 2 × 1 box. Neither Rust decoder has that
//! case or hands out the planes before upsampling, so the file is decoded by jpeg-decoder under
//! a rewritten frame header that leads it to the planes' raw samples, without colour
//! conversion; the boxes and the YCbCr to RGB conversion are then done here in libjpeg's integer
//! arithmetic.
//!
//! - **4:2:0** (luma sampled 2 × 2, both chroma planes 1 × 1): the luma factors are rewritten to
//!   1 × 4 and the height to four times the chroma plane's, in whole MCUs. The MCU still codes
//!   four luma blocks, then one of each chroma plane, so the entropy-coded data reads the same;
//!   luma's blocks come out stacked, and each chroma row comes out repeated over four rows
//!   (jpeg-decoder repeats, rather than interpolates, a plane sampled four times coarser). Only
//!   a sequential frame whose scan holds all three components reads the same this way: the
//!   blocks of a single-component scan (every progressive file) follow each plane's own size.
//! - **4:2:2** (luma 2 × 1, chroma 1 × 1): the width is rewritten to 4, which changes no plane's
//!   count of blocks. jpeg-decoder's interpolation across a row of two chroma samples then
//!   leaves them as they are in the row's first and last pixels; there is no vertical filter.

use super::decode::Problem;

/// How each chroma sample covers pixels in a picture whose chroma libjpeg repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Narrow {
    /// 4:2:0: a sample covers 2 × 2 pixels.
    Quarter,
    /// 4:2:2: a sample covers 2 × 1 pixels.
    Half,
}

/// The layout of a frame whose chroma libjpeg repeats and this module decodes, from the bytes
/// of the frame header's segment (from its marker on) and the count of components in the first
/// scan; `None` for any other frame.
pub(super) fn layout(frame: &[u8], scan_components: u8) -> Option<Narrow> {
    // The marker, length, precision, height, width, component count, then each component's
    // id, sampling factors and quantisation table.
    let f = frame.first_chunk::<19>()?;
    let (marker, width, components) = (f[1], u16::from_be_bytes([f[7], f[8]]), f[9]);
    let (y, cb, cr) = (f[11], f[14], f[17]);
    // The rewritten 4:2:0 frame's height, 32 rows an MCU, still fits its field.
    let mcu_rows = usize::from(u16::from_be_bytes([f[5], f[6]])).div_ceil(16);
    if f[0] != 0xFF || components != 3 || !(1..=4).contains(&width) || cb != 0x11 || cr != 0x11 {
        return None;
    }
    match (y, marker) {
        (0x22, 0xC0 | 0xC1) if scan_components == 3 && mcu_rows * 32 <= 0xFFFF => {
            Some(Narrow::Quarter)
        }
        (0x21, 0xC0..=0xC2) => Some(Narrow::Half),
        _ => None,
    }
}

/// Decodes the JPEG `bytes`, whose first frame header starts at `frame` and has the layout
/// [`layout`] found, into `pixels`: `width × height` RGB pixels, as the frame header declares.
pub(super) fn decode(
    bytes: &[u8],
    frame: usize,
    narrow: Narrow,
    size: (usize, usize),
    pixels: &mut [u8],
) -> Result<(), Problem> {
    let ycc = planes(bytes, frame, narrow, size)?;
    if ycc.len() != pixels.len() {
        return Err(format!(
            "corrupt JPEG: it decodes to {} samples, not the {} its header declares",
            ycc.len(),
            pixels.len()
        ));
    }
    for (rgb, ycc) in pixels.chunks_exact_mut(3).zip(ycc.chunks_exact(3)) {
        rgb.copy_from_slice(&ycc_to_rgb([ycc[0], ycc[1], ycc[2]]));
    }
    Ok(())
}

/// The picture's `width × height` pixels as Y, Cb and Cr, each chroma sample repeated over
/// the pixels it covers.
fn planes(
    bytes: &[u8],
    frame: usize,
    narrow: Narrow,
    (width, height): (usize, usize),
) -> Result<Vec<u8>, Problem> {
    // The rewritten frame's size, and where a pixel's luma and chroma samples land in it.
    let (decoded_width, decoded_height) = match narrow {
        // Chroma rows of whole MCUs (8 each, one MCU per 16 rows), four decoded rows apiece.
        Narrow::Quarter => (width, height.div_ceil(16) * 32),
        Narrow::Half => (4, height),
    };
    let decoded_height = u16::try_from(decoded_height)
        .map_err(|_| format!("corrupt JPEG: {height} rows do not fit its frame header"))?;
    let mut patched = bytes.to_vec();
    let header = patched
        .get_mut(frame..frame + 19)
        .ok_or("corrupt JPEG: its frame header is cut short")?;
    let declared = (
        usize::from(u16::from_be_bytes([header[7], header[8]])),
        usize::from(u16::from_be_bytes([header[5], header[6]])),
    );
    if declared != (width, height) {
        return Err(format!(
            "corrupt JPEG: its frame header declares {} × {} pixels, its decoder read {width} × \
             {height}",
            declared.0, declared.1
        ));
    }
    header[5..7].copy_from_slice(&decoded_height.to_be_bytes());
    header[7..9].copy_from_slice(&(decoded_width as u16).to_be_bytes());
    if narrow == Narrow::Quarter {
        header[11] = 0x14;
    }

    let mut d = jpeg_decoder::Decoder::new(patched.as_slice());
    // Takes the three planes as they are: no YCbCr conversion.
    d.set_color_transform(jpeg_decoder::ColorTransform::RGB);
    let decoded = d
        .decode()
        .map_err(|e| format!("corrupt JPEG: {}", super::decode::words(e)))?;
    let info = d.info().ok_or("corrupt JPEG: no frame header")?;
    let size = (usize::from(info.width), usize::from(info.height));
    if info.pixel_format != jpeg_decoder::PixelFormat::RGB24
        || size != (decoded_width, usize::from(decoded_height))
        || decoded.len() != decoded_width * usize::from(decoded_height) * 3
    {
        return Err(format!(
            "corrupt JPEG: its frame reads as {:?} {} × {} on a second look",
            info.pixel_format, size.0, size.1
        ));
    }
    let sample =
        |(x, y): (usize, usize), channel: usize| decoded[(y * decoded_width + x) * 3 + channel];
    let mut ycc = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        for x in 0..width {
            let (luma, chroma) = match narrow {
                // Luma block k of an MCU (left to right, then top to bottom in 2 × 2) is
                // decoded as block row k of a column of four; only the left blocks (k = 0, 2)
                // hold pixels of a picture 8 or fewer pixels wide.
                Narrow::Quarter => (
                    (x, y / 16 * 32 + y % 16 / 8 * 16 + y % 8),
                    (x / 2, y / 2 * 4),
                ),
                // A row's two chroma samples are left in its first and last decoded pixels.
                Narrow::Half => ((x, y), (x / 2 * 3, y)),
            };
            ycc.extend([sample(luma, 0), sample(chroma, 1), sample(chroma, 2)]);
        }
    }
    Ok(ycc)
}

/// One pixel from YCbCr (JFIF's full range) to RGB, in libjpeg's fixed-point arithmetic: each
/// coefficient scaled by 2^16 and rounded, red and blue rounded per term, green rounded once
/// from the sum of its two terms, the result clamped to 0..=255.
fn ycc_to_rgb([y, cb, cr]: [u8; 3]) -> [u8; 3] {
    const SCALE: u32 = 16;
    const HALF: i32 = 1 << (SCALE - 1);
    const fn fixed(c: f64) -> i32 {
        (c * (1 << SCALE) as f64 + 0.5) as i32
    }
    let (y, cb, cr) = (i32::from(y), i32::from(cb) - 128, i32::from(cr) - 128);
    let red = (fixed(1.402) * cr + HALF) >> SCALE;
    let blue = (fixed(1.772) * cb + HALF) >> SCALE;
    let green = (-fixed(0.34414) * cb - fixed(0.71414) * cr + HALF) >> SCALE;
    [y + red, y + green, y + blue].map(|v| v.clamp(0, 255) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::SplitMix64;
    use jpeg_encoder::{ColorType, Encoder, SamplingFactor};

    /// A frame header (SOF `marker`, `width` × 2 pixels, three components sampled `y`, `c`, `c`).
    fn frame(marker: u8, width: u16, y: u8, c: u8) -> Vec<u8> {
        let mut f = vec![0xFF, marker, 0, 17, 8, 0, 2];
        f.extend(width.to_be_bytes());
        f.extend([3, 1, y, 0, 2, c, 1, 3, c, 1]);
        f
    }

    #[test]
    fn layout_takes_only_the_frames_whose_chroma_libjpeg_repeats_and_reads_the_same() {
        for width in 1..=4 {
            let quarter = frame(0xC0, width, 0x22, 0x11);
            assert_eq!(
                layout(&quarter, 3),
                Some(Narrow::Quarter),
                "4:2:0 {width} wide"
            );
            assert_eq!(
                layout(&frame(0xC1, width, 0x22, 0x11), 3),
                Some(Narrow::Quarter)
            );
            assert_eq!(
                layout(&frame(0xC0, width, 0x21, 0x11), 3),
                Some(Narrow::Half)
            );
            assert_eq!(
                layout(&frame(0xC2, width, 0x21, 0x11), 1),
                Some(Narrow::Half)
            );
            // A progressive 4:2:0 file, or a sequential one scanning its planes one at a time:
            // its blocks would not read the same under the rewritten header.
            assert_eq!(layout(&frame(0xC2, width, 0x22, 0x11), 1), None);
            assert_eq!(layout(&quarter, 1), None);
            // Full-resolution chroma, and layouts libjpeg interpolates whatever the width.
            assert_eq!(layout(&frame(0xC0, width, 0x11, 0x11), 3), None);
            assert_eq!(layout(&frame(0xC0, width, 0x12, 0x11), 3), None);
            assert_eq!(layout(&frame(0xC0, width, 0x41, 0x11), 3), None);
        }
        for width in [0, 5, 6, 16, 4000] {
            assert_eq!(
                layout(&frame(0xC0, width, 0x22, 0x11), 3),
                None,
                "{width} wide"
            );
        }
        assert_eq!(
            layout(&frame(0xC0, 4, 0x22, 0x11)[..18], 3),
            None,
            "cut short"
        );
        // 4:2:0 up to 2047 MCUs tall: 32752 rows, decoded as 65504.
        let mut tall = frame(0xC0, 4, 0x22, 0x11);
        tall[5..7].copy_from_slice(&32752u16.to_be_bytes());
        assert_eq!(layout(&tall, 3), Some(Narrow::Quarter));
        tall[5..7].copy_from_slice(&32753u16.to_be_bytes());
        assert_eq!(layout(&tall, 3), None);
        tall[11] = 0x21;
        assert_eq!(layout(&tall, 3), Some(Narrow::Half));
    }

    #[test]
    fn narrow_planes_hold_the_luma_and_the_raw_chroma_samples() {
        let seed = crate::test_seed::seed("narrow_planes");
        let mut rng = SplitMix64::new(seed);
        for (sampling, progressive, narrow) in [
            (SamplingFactor::R_4_2_0, false, Narrow::Quarter),
            (SamplingFactor::R_4_2_2, false, Narrow::Half),
            (SamplingFactor::R_4_2_2, true, Narrow::Half),
        ] {
            for width in 1..=4usize {
                for height in 1..=40usize {
                    let case = format!("{narrow:?} {width} × {height}, seed {seed}");
                    let rgb: Vec<u8> = (0..width * height * 3)
                        .map(|_| rng.next_u64() as u8)
                        .collect();
                    let mut file = Vec::new();
                    let mut e = Encoder::new(&mut file, 80 + (rng.next_u64() % 16) as u8);
                    e.set_sampling_factor(sampling);
                    e.set_progressive(progressive);
                    e.encode(&rgb, width as u16, height as u16, ColorType::Rgb)
                        .unwrap();
                    let at = file
                        .windows(2)
                        .position(|m| m == [0xFF, 0xC0] || m == [0xFF, 0xC2])
                        .unwrap();
                    let scan = file.windows(2).position(|m| m == [0xFF, 0xDA]).unwrap();
                    assert_eq!(layout(&file[at..], file[scan + 4]), Some(narrow), "{case}");
                    let ours = planes(&file, at, narrow, (width, height)).unwrap();

                    // jpeg-decoder on the file as written: the luma planes are one, and its
                    // interpolated chroma equals the raw samples in the first and last pixel
                    // of a row; for 4:2:0, only in the first row and, for an even height, the
                    // last (where the row it would blend with is the same row).
                    let mut d = jpeg_decoder::Decoder::new(file.as_slice());
                    d.set_color_transform(jpeg_decoder::ColorTransform::RGB);
                    let theirs = d.decode().unwrap();
                    assert_eq!(ours.len(), theirs.len(), "{case}");
                    let last = width.div_ceil(2) * 2 - 1;
                    for (i, (a, b)) in ours.chunks(3).zip(theirs.chunks(3)).enumerate() {
                        let (x, y) = (i % width, i / width);
                        assert_eq!(a[0], b[0], "luma at ({x}, {y}), {case}");
                        let raw_row = narrow == Narrow::Half
                            || y == 0
                            || (y == height - 1 && height % 2 == 0);
                        if raw_row && (x == 0 || x == last) {
                            assert_eq!(a[1..], b[1..], "chroma at ({x}, {y}), {case}");
                        }
                        let (bx, by) = match narrow {
                            Narrow::Quarter => (x / 2 * 2, y / 2 * 2),
                            Narrow::Half => (x / 2 * 2, y),
                        };
                        let corner = (by * width + bx) * 3;
                        assert_eq!(a[1..], ours[corner + 1..corner + 3], "box at ({x}, {y})");
                    }
                }
            }
        }
    }

    #[test]
    fn ycc_to_rgb_is_libjpeg_s_fixed_point_conversion() {
        for v in 0..=255 {
            assert_eq!(ycc_to_rgb([v, 128, 128]), [v; 3], "grey stays grey");
        }
        // Green is 65.49998 exactly; libjpeg's scaled coefficients sum to just over a half.
        assert_eq!(ycc_to_rgb([0, 2, 97]), [0, 66, 0]);
        // Every input: the bound is exact, not a sample's.
        for ycc in 0..1u32 << 24 {
            let [_, y, cb, cr] = ycc.to_be_bytes();
            let (yf, cbf, crf) = (f64::from(y), f64::from(cb) - 128.0, f64::from(cr) - 128.0);
            let exact = [
                yf + 1.402 * crf,
                yf - 0.34414 * cbf - 0.71414 * crf,
                yf + 1.772 * cbf,
            ];
            let ours = ycc_to_rgb([y, cb, cr]);
            for (o, e) in ours.iter().zip(exact) {
                assert!(
                    (f64::from(*o) - e.clamp(0.0, 255.0)).abs() <= 1.0,
                    "{y} {cb} {cr}: {ours:?} against {exact:?}"
                );
            }
        }
    }
}
