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

/// The file extensions of the formats decoded (lower-case): what folders list and what tar
/// samples take as their image. The decoder itself tells JPEG from PNG by the bytes.
pub(crate) const EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

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

mod segments;
#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
use segments::frame_blocks;
pub(crate) use segments::jpeg_looks_whole;
use segments::segments;
