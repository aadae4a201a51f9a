//! JPEG and PNG files to upright RGB pixels, 8 bits a channel: [`Decoder`] and [`Image`].
//!
//! Every file is hostile input until checked: the format is told by its first bytes, the size
//! is checked against a limit before any pixel memory is taken, a JPEG cut short is refused
//! (its decoder would fill the missing part with grey), and a decoder's panic becomes an error
//! naming the file. Real-world oddities are converted, not refused: grayscale, CMYK and YCCK
//! JPEGs, progressive JPEGs, palette, grayscale, alpha and 16-bit PNGs all come out as RGB,
//! and the EXIF orientation is applied. Alpha is dropped (not blended), as PIL's
//! `convert("RGB")` does; a 16-bit sample keeps its high byte (`v >> 8`), as torchvision's
//! `decode_png` does. Pillow differs there for 16-bit grayscale: its `convert("RGB")` clamps
//! each value to 255, so a 16-bit gray PNG decodes brighter in Pillow than here.

use std::io::Cursor;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use png::{BitDepth, ColorType, Transformations};
use zune_jpeg::JpegDecoder;
use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;

use super::chroma;
use super::orient;
use crate::error::{Error, Result};

/// The most pixels a file may decode to by default: Pillow's `Image.MAX_IMAGE_PIXELS`, the
/// size at which it warns of a decompression bomb (it refuses at twice this). A trusted
/// dataset of larger pictures raises it with [`Decoder::max_pixels`].
pub const MAX_PIXELS: usize = 89_478_485;

/// Pictures with subsampled chroma and a side of at most this many pixels are decoded by
/// jpeg-decoder rather than zune-jpeg; see [`Decoder::jpeg`].
const SMALL_SIDE: usize = 32;

/// The most bytes deflate can expand one compressed byte into: a 258-byte match coded in two
/// bits (one for its length, one for its distance), 4 × 258.
const DEFLATE_MAX_RATIO: u64 = 1032;

/// A decoded image: RGB, 8 bits a channel, rows top to bottom, upright.
///
/// Its `Debug` shows the size and the byte count, not the pixels.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Image {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl Image {
    /// An image of `width × height` RGB pixels, row by row.
    ///
    /// # Errors
    ///
    /// [`Error::Shape`] if `pixels` does not hold `width * height * 3` bytes.
    pub fn from_rgb(width: usize, height: usize, pixels: Vec<u8>) -> Result<Image> {
        if width.checked_mul(height).and_then(|n| n.checked_mul(3)) != Some(pixels.len()) {
            return Err(Error::Shape(format!(
                "{} bytes are not {width} × {height} RGB pixels",
                pixels.len()
            )));
        }
        Ok(Image {
            width,
            height,
            pixels,
        })
    }

    /// Pixels in a row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Rows.
    pub fn height(&self) -> usize {
        self.height
    }

    /// The pixels, `[height, width, 3]` in row-major order.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// The pixel buffer, given up.
    pub fn into_pixels(self) -> Vec<u8> {
        self.pixels
    }

    /// Makes this `width × height`, keeping the buffer's memory; the pixels are then stale.
    /// A refused allocation is an error, not an abort.
    fn reshape(&mut self, width: usize, height: usize) -> std::result::Result<(), Problem> {
        let bytes = width
            .checked_mul(height)
            .and_then(|n| n.checked_mul(3))
            .ok_or_else(|| format!("{width} × {height} RGB pixels overflow the address space"))?;
        grow(&mut self.pixels, bytes)?;
        self.width = width;
        self.height = height;
        Ok(())
    }
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("bytes", &self.pixels.len())
            .finish()
    }
}

/// Decodes JPEG and PNG files into a buffer it keeps, so decoding file after file on one thread
/// reuses the same memory.
///
/// Every file is hostile input until checked: the format is told by its first bytes, the size
/// is checked against a limit before any pixel memory is taken, a JPEG cut short is refused
/// (its decoder would fill the missing part with grey), and a decoder's panic becomes an error
/// naming the file. Real-world oddities are converted, not refused: grayscale, CMYK and YCCK
/// JPEGs, progressive JPEGs, palette, grayscale, alpha and 16-bit PNGs all come out as RGB
/// (alpha dropped; a 16-bit sample keeps its high byte, as torchvision's `decode_png` does,
/// where Pillow's `convert("RGB")` clamps 16-bit gray to 255), and the EXIF orientation is
/// applied.
///
/// # Examples
///
/// ```
/// use pinnable::formats::image::Decoder;
///
/// let mut decoder = Decoder::new();
/// let e = decoder.decode(b"GIF89a...", "cat.gif".as_ref()).unwrap_err();
/// assert!(e.to_string().contains("cat.gif"), "{e}");
/// ```
pub struct Decoder {
    pub(crate) max_pixels: usize,
    image: Image,
    spare: Vec<u8>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("max_pixels", &self.max_pixels)
            .field("image", &self.image)
            .finish_non_exhaustive()
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

/// What a decode ran into, before it is given the file's name.
pub(super) type Problem = String;

impl Decoder {
    /// A decoder refusing images over [`MAX_PIXELS`] pixels.
    pub fn new() -> Decoder {
        Decoder {
            max_pixels: MAX_PIXELS,
            image: Image::default(),
            spare: Vec::new(),
        }
    }

    /// Refuses images of more than `max_pixels` pixels (width × height) before decoding them.
    pub fn max_pixels(mut self, max_pixels: usize) -> Decoder {
        self.max_pixels = max_pixels;
        self
    }

    /// The image decoded last (empty before the first decode), given up.
    pub fn into_image(self) -> Image {
        self.image
    }

    /// Decodes the bytes of a JPEG or PNG file (told apart by their first bytes, whatever the
    /// file's name) into upright RGB; `path` is what errors call the file.
    ///
    /// # Errors
    ///
    /// [`Error::Image`] naming `path` and the reason: neither a JPEG nor a PNG, a corrupt or
    /// truncated file, a size over the limit, or a decoder that panicked.
    pub fn decode(&mut self, bytes: &[u8], path: &Path) -> Result<&Image> {
        let decoded = catch_unwind(AssertUnwindSafe(|| self.decode_any(bytes)));
        let problem = match decoded {
            Ok(Ok(())) => return Ok(&self.image),
            Ok(Err(problem)) => problem,
            Err(panic) => format!("the decoder panicked: {}", panic_text(&*panic)),
        };
        Err(Error::Image {
            path: path.display().to_string(),
            problem,
        })
    }

    /// Decodes into `self.image` and turns it upright.
    fn decode_any(&mut self, bytes: &[u8]) -> std::result::Result<(), Problem> {
        let orientation = if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            self.jpeg(bytes)?
        } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            self.png(bytes)?
        } else if bytes.is_empty() {
            return Err("the file is empty".into());
        } else {
            let start = &bytes[..bytes.len().min(8)];
            return Err(format!(
                "neither a JPEG nor a PNG file (it starts with {start:02x?}); only JPEG and \
                 PNG files are decoded"
            ));
        };
        if let Some(o) = orientation {
            orient::apply(o, &mut self.image, &mut self.spare);
        }
        Ok(())
    }

    fn check_size(&self, width: usize, height: usize) -> std::result::Result<(), Problem> {
        let pixels = width.saturating_mul(height);
        if pixels == 0 {
            return Err(format!("the image is {width} × {height}: it has no pixels"));
        }
        if pixels > self.max_pixels {
            return Err(format!(
                "the image is {width} × {height} = {pixels} pixels, over the limit of {} \
                 (`max_pixels`); raise it if the file is trusted",
                self.max_pixels
            ));
        }
        Ok(())
    }

    /// Decodes a JPEG; returns its EXIF orientation.
    fn jpeg(&mut self, bytes: &[u8]) -> std::result::Result<Option<u8>, Problem> {
        let options = DecoderOptions::default()
            .jpeg_set_out_colorspace(ColorSpace::RGB)
            .set_max_width(usize::MAX)
            .set_max_height(usize::MAX);
        let mut d = JpegDecoder::new_with_options(ZCursor::new(bytes), options);
        let segments = segments(bytes);
        d.decode_headers().map_err(|e| {
            if segments.ends_in_headers || !segments.whole {
                format!(
                    "truncated JPEG: its {} bytes end before its end-of-image marker ({})",
                    bytes.len(),
                    words(e)
                )
            } else {
                format!("corrupt JPEG: {}", words(e))
            }
        })?;
        let (width, height) = d.dimensions().ok_or("corrupt JPEG: no frame header")?;
        self.check_size(width, height)?;
        if !segments.whole {
            return Err(format!(
                "truncated JPEG: its {} bytes end before the end-of-image marker",
                bytes.len()
            ));
        }
        if segments.key_plane_finer && d.input_colorspace() == Some(ColorSpace::CMYK) {
            return Err(
                "a CMYK JPEG whose key plane alone is at full resolution: this layout \
                        is not supported (re-save it with every plane at full resolution)"
                    .into(),
            );
        }
        // Every frame has a plane at full resolution: a floor whatever the segment walk saw.
        let plane = (width.div_ceil(8) as u64).saturating_mul(height.div_ceil(8) as u64);
        let blocks = segments.blocks.max(plane);
        if segments.scan_bytes.saturating_mul(8) < blocks {
            return Err(format!(
                "corrupt JPEG: its header declares {width} × {height} pixels, {} blocks of 8 × 8 \
                 in all components, but its {} bytes of scan data cannot hold them (every block \
                 takes at least one bit): the size in its header is wrong, or the file is cut",
                blocks, segments.scan_bytes
            ));
        }
        let orientation = d.exif().and_then(|e| orient::from_exif(e));
        self.image.reshape(width, height)?;
        let ycbcr = d.input_colorspace() == Some(ColorSpace::YCbCr);
        // A chroma plane at most two samples wide, which libjpeg repeats rather than
        // interpolates (see `chroma`).
        let narrow = segments
            .frame
            .filter(|_| ycbcr)
            .and_then(|at| chroma::layout(&bytes[at..], segments.scan_components).map(|n| (at, n)));
        if let Some((frame, narrow)) = narrow {
            chroma::decode(
                bytes,
                frame,
                narrow,
                (width, height),
                &mut self.image.pixels,
            )?;
        } else if segments.subsampled && width.min(height) <= SMALL_SIDE && ycbcr {
            self.small_subsampled_jpeg(bytes)?;
        } else {
            d.decode_into(&mut self.image.pixels)
                .map_err(|e| format!("corrupt JPEG: {}", words(e)))?;
        }
        Ok(orientation)
    }

    /// Decodes a small YCbCr JPEG with subsampled chroma through jpeg-decoder into the image,
    /// already sized by the frame header.
    ///
    /// zune-jpeg 0.5 upsamples each chroma plane over its whole MCU-padded width and height:
    /// the last image column (for an even width) and the last row (for an even height) are
    /// interpolated with the encoder's padding samples beyond the plane's real extent
    /// (`ceil(width × h / h_max)` samples), where libjpeg repeats the plane's last real
    /// sample. A photograph's padding is close to its edge, so large pictures differ by a few
    /// levels on that one line; in a picture a few pixels across, that line is most of the
    /// image, and it came out 20 to 60 levels off. jpeg-decoder upsamples as libjpeg does,
    /// except for a chroma plane at most two samples wide, which libjpeg repeats and this
    /// decoder leaves to `chroma` where it can.
    fn small_subsampled_jpeg(&mut self, bytes: &[u8]) -> std::result::Result<(), Problem> {
        let mut d = jpeg_decoder::Decoder::new(bytes);
        let pixels = d
            .decode()
            .map_err(|e| format!("corrupt JPEG: {}", words(e)))?;
        let info = d.info().ok_or("corrupt JPEG: no frame header")?;
        let size = (usize::from(info.width), usize::from(info.height));
        if info.pixel_format != jpeg_decoder::PixelFormat::RGB24
            || size != (self.image.width, self.image.height)
            || pixels.len() != self.image.pixels.len()
        {
            return Err(format!(
                "corrupt JPEG: its frame reads as {:?} {} × {} on a second look",
                info.pixel_format, size.0, size.1
            ));
        }
        self.image.pixels.copy_from_slice(&pixels);
        Ok(())
    }

    /// Decodes a PNG's first frame; returns its EXIF orientation.
    fn png(&mut self, bytes: &[u8]) -> std::result::Result<Option<u8>, Problem> {
        // Room for the widest row format (16-bit RGBA) of the largest image allowed, and the
        // decoder's own buffers.
        let limits = png::Limits {
            bytes: self.max_pixels.saturating_mul(8).saturating_add(1 << 24),
        };
        let mut d = png::Decoder::new_with_limits(Cursor::new(bytes), limits);
        d.set_transformations(Transformations::EXPAND | Transformations::STRIP_16);
        let mut reader = d
            .read_info()
            .map_err(|e| format!("corrupt PNG: {}", words(e)))?;
        let info = reader.info();
        let (width, height) = (info.width as usize, info.height as usize);
        self.check_size(width, height)?;
        // The image's raw scanlines (each row's filter byte, then its samples; fewer rows in
        // all when interlaced, so only the samples count) are inflated from the IDAT chunks:
        // more than deflate can expand those bytes into means the header lies.
        let bits = u64::from(info.color_type.samples() as u8) * u64::from(info.bit_depth as u8);
        let raw = (width as u64 * height as u64)
            .saturating_mul(bits)
            .div_ceil(8);
        let idat = png_image_data_bytes(bytes);
        if raw > idat.saturating_mul(DEFLATE_MAX_RATIO) {
            return Err(format!(
                "corrupt PNG: its header declares {width} × {height} pixels of {bits} bits, at \
                 least {raw} bytes, but its {idat} bytes of image data (IDAT) inflate to at most \
                 {} bytes: the size in its header is wrong, or the file is cut",
                idat.saturating_mul(DEFLATE_MAX_RATIO)
            ));
        }
        let orientation = info.exif_metadata.as_deref().and_then(orient::from_exif);
        let (color, depth) = reader.output_color_type();
        let channels = match (color, depth) {
            (ColorType::Rgb, BitDepth::Eight) => 3,
            (ColorType::Rgba, BitDepth::Eight) => 4,
            (ColorType::Grayscale, BitDepth::Eight) => 1,
            (ColorType::GrayscaleAlpha, BitDepth::Eight) => 2,
            other => {
                return Err(format!(
                    "unexpected PNG pixel format {other:?} after expansion"
                ));
            }
        };
        let size = reader
            .output_buffer_size()
            .ok_or("corrupt PNG: the image's size overflows")?;
        if size != width * height * channels {
            return Err(format!(
                "corrupt PNG: {size} bytes of pixels for {width} × {height} × {channels}"
            ));
        }
        self.image.reshape(width, height)?;
        let out = if channels == 3 {
            &mut self.image.pixels
        } else {
            grow(&mut self.spare, size)?;
            &mut self.spare
        };
        reader
            .next_frame(out)
            .map_err(|e| format!("corrupt or truncated PNG: {}", words(e)))?;
        let rgb = &mut self.image.pixels;
        match channels {
            4 => {
                for (dst, src) in rgb.chunks_exact_mut(3).zip(self.spare.chunks_exact(4)) {
                    dst.copy_from_slice(&src[..3]);
                }
            }
            1 => {
                for (dst, &v) in rgb.chunks_exact_mut(3).zip(&self.spare) {
                    dst.fill(v);
                }
            }
            2 => {
                for (dst, src) in rgb.chunks_exact_mut(3).zip(self.spare.chunks_exact(2)) {
                    dst.fill(src[0]);
                }
            }
            _ => {}
        }
        Ok(orientation)
    }
}

/// Makes `buffer` `len` bytes long; a refused allocation is an error, not an abort.
fn grow(buffer: &mut Vec<u8>, len: usize) -> std::result::Result<(), Problem> {
    if let Some(more) = len.checked_sub(buffer.len()) {
        buffer.try_reserve_exact(more).map_err(|_| {
            format!("cannot allocate {len} bytes for its pixels: the system refused the memory")
        })?;
    }
    buffer.resize(len, 0);
    Ok(())
}

/// The text of a decoder's panic.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic with a non-string payload"
    }
}

/// A decoder's error in words, without the line breaks some end with.
pub(super) fn words(e: impl std::fmt::Display) -> String {
    e.to_string().trim().to_owned()
}

/// The bytes of a PNG's IDAT chunks, as far as the file holds them (a chunk cut short counts
/// what is there); the walk stops at the end chunk or where the chunks stop making sense.
fn png_image_data_bytes(bytes: &[u8]) -> u64 {
    let mut at = 8usize;
    let mut total = 0u64;
    while let Some(head) = bytes.get(at..at.saturating_add(8)) {
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let data = bytes.len().saturating_sub(at + 8).min(len);
        match &head[4..8] {
            b"IDAT" => total += data as u64,
            b"IEND" => break,
            _ => {}
        }
        at = at.saturating_add(12).saturating_add(len);
    }
    total
}

/// Whether a JPEG of `width × height` (its frame header's) is whole by the checks the host
/// decoder makes before decoding: an end-of-image marker after the first scan, and enough scan
/// data for its blocks. The device decoders may not notice a file cut short; the device path
/// sends a file that fails these to the host decoder, which names it and the reason.
pub(crate) fn jpeg_looks_whole(bytes: &[u8], width: usize, height: usize) -> bool {
    let segments = segments(bytes);
    let plane = (width.div_ceil(8) as u64).saturating_mul(height.div_ceil(8) as u64);
    segments.whole
        && !segments.ends_in_headers
        && segments.scan_bytes.saturating_mul(8) >= segments.blocks.max(plane)
}

/// What the segments of a JPEG tell before it is decoded.
#[derive(Debug, Default, PartialEq, Eq)]
struct Segments {
    /// An end-of-image marker follows the start of the first scan. A file cut short (a
    /// transfer or a disk that stopped) lacks it; entropy-coded data never holds the marker's
    /// bytes, and a thumbnail's own marker comes before the first scan.
    whole: bool,
    /// The first component's sampling factors are below another's in a four-component
    /// frame: a layout (CMYK with only its key plane at full resolution) zune-jpeg decodes
    /// wrongly, so it is refused rather than decoded into wrong colours.
    key_plane_finer: bool,
    /// The bytes end inside the headers, before any scan.
    ends_in_headers: bool,
    /// The 8 × 8 blocks the first frame header declares, summed over its components, each
    /// component counted at its own resolution (`ceil(ceil(width × h / h_max) / 8)` ×
    /// `ceil(ceil(height × v / v_max) / 8)`, without the padding to whole MCUs).
    ///
    /// This is a floor on the bits of scan data a Huffman-coded JPEG (the only kind decoded:
    /// baseline, extended and progressive) needs: every Huffman code is at least one bit, and
    /// every block of every component is coded at least once with at least one code — its DC
    /// difference (in a sequential scan, followed by at least an end-of-block code; in a
    /// progressive file, in the first DC scan, which must come before any AC scan of the
    /// component). Refinement and AC scans can cover many blocks with one end-of-band run, so
    /// they add nothing to the floor.
    blocks: u64,
    /// Bytes from the first scan header to the end of the file: at least the scan data.
    scan_bytes: u64,
    /// The first frame header has three components, not all at one resolution.
    subsampled: bool,
    /// Where the first frame header's segment starts (at its marker).
    frame: Option<usize>,
    /// The components the first scan header lists.
    scan_components: u8,
}

fn segments(bytes: &[u8]) -> Segments {
    let mut found = Segments::default();
    let mut i = 2;
    let scan = loop {
        let Some(&marker) = bytes.get(i + 1) else {
            found.ends_in_headers = true;
            return found;
        };
        if bytes[i] != 0xFF || matches!(marker, 0xFF | 0x00 | 0x02..=0xBF) {
            // Fill bytes, or stray bytes between segments (a 0xFF not followed by a marker
            // code): step to the next 0xFF, as the decoder does.
            i += 1;
            continue;
        }
        match marker {
            0xDA => {
                found.scan_components = bytes.get(i + 4).copied().unwrap_or(0);
                break i;
            }
            0xD9 => return found,
            0x01 | 0xD0..=0xD8 => i += 2,
            _ => {
                let Some(len) = bytes.get(i + 2..i + 4) else {
                    found.ends_in_headers = true;
                    return found;
                };
                let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
                if matches!(marker, 0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF)
                    && found.blocks == 0
                {
                    found.blocks = frame_blocks(bytes.get(i + 4..).unwrap_or(&[]));
                    found.frame.get_or_insert(i);
                    found.subsampled = bytes.get(i + 9) == Some(&3)
                        && bytes
                            .get(i + 10..i + 19)
                            .is_some_and(|c| c[1] != c[4] || c[1] != c[7]);
                }
                // A frame header: precision, height, width, components, then 3 bytes each.
                if matches!(marker, 0xC0..=0xC2)
                    && bytes.get(i + 9) == Some(&4)
                    && let Some(c) = bytes.get(i + 10..i + 22)
                {
                    let first = c[1];
                    found.key_plane_finer = c
                        .chunks(3)
                        .any(|p| p[1] >> 4 > first >> 4 || p[1] & 15 > first & 15);
                }
                i += 2 + len;
            }
        }
    };
    found.whole = bytes[scan..].windows(2).rev().any(|w| w == [0xFF, 0xD9]);
    found.scan_bytes = (bytes.len() - scan) as u64;
    found
}

/// The 8 × 8 blocks a frame header (from its precision byte on) declares, summed over its
/// components at their own resolutions; 0 for a header cut short.
fn frame_blocks(frame: &[u8]) -> u64 {
    let Some(&[_, h0, h1, w0, w1, n]) = frame.first_chunk::<6>() else {
        return 0;
    };
    let (height, width) = (
        u64::from(u16::from_be_bytes([h0, h1])),
        u64::from(u16::from_be_bytes([w0, w1])),
    );
    let Some(components) = frame.get(6..6 + 3 * usize::from(n)) else {
        return 0;
    };
    let factors: Vec<(u64, u64)> = components
        .chunks_exact(3)
        .map(|c| (u64::from(c[1] >> 4).max(1), u64::from(c[1] & 15).max(1)))
        .collect();
    let h_max = factors.iter().map(|f| f.0).max().unwrap_or(1);
    let v_max = factors.iter().map(|f| f.1).max().unwrap_or(1);
    factors
        .iter()
        .map(|&(h, v)| {
            let w = (width * h).div_ceil(h_max);
            let hh = (height * v).div_ceil(v_max);
            w.div_ceil(8) * hh.div_ceil(8)
        })
        .sum()
}

#[cfg(test)]
pub(crate) mod tests;
