//! Image files for the image tests, example and bench: synthetic pictures, JPEG and PNG
//! encoders of every kind the decoder must take (jpeg-encoder, png), and folders of them.

use std::path::Path;

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use rand::Rng;

/// A synthetic `width × height` RGB picture: a smooth colour field, a few flat shapes and a
/// little noise, so it compresses like a photograph rather than like noise or a flat colour.
pub fn picture(r: &mut impl Rng, width: usize, height: usize, noise: f32) -> Vec<u8> {
    // The colour field: a random 4 × 3 grid of colours, interpolated.
    let grid: Vec<[f32; 3]> = (0..12)
        .map(|_| [0; 3].map(|_: i32| r.random_range(0.0..255.0)))
        .collect();
    let shapes: Vec<(f32, f32, f32, f32, [f32; 3], bool)> = (0..6)
        .map(|_| {
            (
                r.random_range(0.0..width as f32),
                r.random_range(0.0..height as f32),
                r.random_range(0.05..0.4) * width as f32,
                r.random_range(0.05..0.4) * height as f32,
                [0; 3].map(|_: i32| r.random_range(0.0..255.0)),
                r.random_bool(0.5),
            )
        })
        .collect();
    let mut out = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        for x in 0..width {
            let gx = x as f32 / width.max(2) as f32 * 3.0;
            let gy = y as f32 / height.max(2) as f32 * 2.0;
            let (ix, iy) = ((gx as usize).min(2), (gy as usize).min(1));
            let (fx, fy) = (gx - ix as f32, gy - iy as f32);
            let mut c = [0f32; 3];
            for (k, v) in c.iter_mut().enumerate() {
                let at = |i: usize, j: usize| grid[j * 4 + i][k];
                let top = at(ix, iy) * (1.0 - fx) + at(ix + 1, iy) * fx;
                let bottom = at(ix, iy + 1) * (1.0 - fx) + at(ix + 1, iy + 1) * fx;
                *v = top * (1.0 - fy) + bottom * fy;
            }
            for &(sx, sy, sw, sh, colour, round) in &shapes {
                let (dx, dy) = ((x as f32 - sx) / sw, (y as f32 - sy) / sh);
                let inside = if round {
                    dx * dx + dy * dy <= 1.0
                } else {
                    dx.abs() <= 1.0 && dy.abs() <= 1.0
                };
                if inside {
                    c = colour;
                }
            }
            for v in c {
                let n = if noise > 0.0 {
                    r.random_range(-noise..noise)
                } else {
                    0.0
                };
                out.push((v + n).clamp(0.0, 255.0) as u8);
            }
        }
    }
    out
}

/// How a JPEG is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jpeg {
    /// Baseline, 4:2:0 chroma (what cameras and PIL write).
    Baseline,
    /// Baseline, full-resolution chroma.
    Full,
    /// Progressive, 4:2:0.
    Progressive,
    /// One channel: the picture's luma.
    Gray,
    /// Adobe CMYK (inverted, every plane at full resolution), from the picture as
    /// `C = 255 - R`, ..., `K = 0`.
    Cmyk,
    /// Adobe YCCK (4:2:0), the same CMYK.
    Ycck,
}

/// The picture (`width × height` RGB) encoded as a JPEG of `kind` at `quality`, with an EXIF
/// block when given (its TIFF bytes).
///
/// # Panics
///
/// If the encoder refuses (a test's bad arguments).
pub fn jpeg(
    rgb: &[u8],
    width: usize,
    height: usize,
    quality: u8,
    kind: Jpeg,
    exif: Option<&[u8]>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = Encoder::new(&mut out, quality);
    match kind {
        // Adobe's CMYK files keep every plane at full resolution.
        Jpeg::Full | Jpeg::Cmyk => e.set_sampling_factor(SamplingFactor::R_4_4_4),
        Jpeg::Progressive => {
            // The encoder's own default is 4:4:4 from quality 90 on.
            e.set_progressive(true);
            e.set_sampling_factor(SamplingFactor::R_4_2_0);
        }
        _ => e.set_sampling_factor(SamplingFactor::R_4_2_0),
    }
    if let Some(exif) = exif {
        e.add_exif_metadata(exif).expect("exif");
    }
    let (w, h) = (width as u16, height as u16);
    match kind {
        Jpeg::Gray => e.encode(&luma(rgb), w, h, ColorType::Luma),
        Jpeg::Cmyk | Jpeg::Ycck => {
            let cmyk: Vec<u8> = rgb
                .chunks(3)
                .flat_map(|p| [255 - p[0], 255 - p[1], 255 - p[2], 0])
                .collect();
            let t = if kind == Jpeg::Cmyk {
                ColorType::Cmyk
            } else {
                ColorType::CmykAsYcck
            };
            e.encode(&cmyk, w, h, t)
        }
        _ => e.encode(rgb, w, h, ColorType::Rgb),
    }
    .expect("encode jpeg");
    out
}

/// The picture's luma as a JPEG encoder computes it (BT.601), rounded.
pub fn luma(rgb: &[u8]) -> Vec<u8> {
    rgb.chunks(3)
        .map(|p| {
            (0.299 * f32::from(p[0]) + 0.587 * f32::from(p[1]) + 0.114 * f32::from(p[2])).round()
                as u8
        })
        .collect()
}

/// An 8-bit RGB PNG of `pixels`, no palette, transparency or EXIF: [`png()`] with those settings.
pub fn png_rgb(pixels: &[u8], width: usize, height: usize) -> Vec<u8> {
    png(
        pixels,
        width,
        height,
        png::ColorType::Rgb,
        png::BitDepth::Eight,
        None,
        None,
        None,
    )
}

/// `pixels` (rows of `width` pixels of `color` at `depth`, 16-bit samples big-endian) as a
/// PNG, with a palette, a transparency chunk and an EXIF block when given.
///
/// # Panics
///
/// If the encoder refuses (a test's bad arguments).
#[allow(clippy::too_many_arguments)]
pub fn png(
    pixels: &[u8],
    width: usize,
    height: usize,
    color: png::ColorType,
    depth: png::BitDepth,
    palette: Option<&[u8]>,
    trns: Option<&[u8]>,
    exif: Option<&[u8]>,
) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, width as u32, height as u32);
        e.set_color(color);
        e.set_depth(depth);
        if let Some(p) = palette {
            e.set_palette(p.to_vec());
        }
        if let Some(t) = trns {
            e.set_trns(t.to_vec());
        }
        let mut w = e.write_header().expect("png header");
        if let Some(x) = exif {
            w.write_chunk(png::chunk::eXIf, x).expect("eXIf");
        }
        w.write_image_data(pixels).expect("png data");
    }
    out
}

/// An EXIF block (TIFF, little-endian) recording `orientation`.
pub fn exif_orientation(orientation: u16) -> Vec<u8> {
    let mut b = b"II*\0".to_vec();
    b.extend(8u32.to_le_bytes());
    b.extend(1u16.to_le_bytes());
    b.extend(0x0112u16.to_le_bytes());
    b.extend(3u16.to_le_bytes());
    b.extend(1u32.to_le_bytes());
    b.extend(orientation.to_le_bytes());
    b.extend([0, 0]);
    b.extend(0u32.to_le_bytes());
    b
}

/// Writes `per_class` JPEG pictures (`width × height`, quality 90, 4:2:0) into each of
/// `classes` subfolders of `dir` (`class0/000.jpg`, ...); returns the bytes written.
///
/// # Panics
///
/// If the files cannot be written.
pub fn write_folder(
    r: &mut impl Rng,
    dir: &Path,
    classes: usize,
    per_class: usize,
    (width, height): (usize, usize),
) -> u64 {
    let mut bytes = 0;
    for c in 0..classes {
        let class = dir.join(format!("class{c}"));
        std::fs::create_dir_all(&class).expect("create class folder");
        for i in 0..per_class {
            let rgb = picture(r, width, height, 6.0);
            let f = jpeg(&rgb, width, height, 90, Jpeg::Baseline, None);
            bytes += f.len() as u64;
            std::fs::write(class.join(format!("{i:03}.jpg")), f).expect("write jpeg");
        }
    }
    bytes
}
