//! The host's half of the device path: what each picture of a batch needs before it is
//! decoded (its size and EXIF orientation from the file's headers) and what the image kernels
//! read (`Job`s and their filter taps, made by the host resampler's own code from the crop box
//! the host transform draws), plus a plain Rust model of the kernels that the tests compare
//! with the host path.

use std::ops::Range;

use super::super::orient;
use super::super::resample::Taps;
use super::super::transform::{Plan, Transform};
use crate::error::Result;
use crate::loader::SplitMix64;

/// What a JPEG's headers say, read without decoding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JpegInfo {
    /// The stored size (before the EXIF orientation turns it).
    pub(crate) width: usize,
    pub(crate) height: usize,
    /// Components in the frame: 1 (gray) or 3 are what nvJPEG decodes to RGB.
    pub(crate) components: u8,
    /// `SOFn`: 0 baseline, 1 extended, 2 progressive (others are not Huffman-coded DCT).
    pub(crate) sof: u8,
    /// EXIF orientation, 1 to 8 (1 when absent).
    pub(crate) orientation: u8,
    /// Whether the components are sampled at different rates (4:2:0, 4:2:2, …).
    pub(crate) subsampled: bool,
}

impl JpegInfo {
    /// The size once turned upright.
    #[cfg(test)]
    pub(crate) fn upright(&self) -> (usize, usize) {
        if self.orientation >= 5 {
            (self.height, self.width)
        } else {
            (self.width, self.height)
        }
    }

    /// Whether nvJPEG's decoders may take it: Huffman-coded (baseline, extended or
    /// progressive) with one or three components. Anything else goes to the host decoder, and
    /// so do subsampled pictures at most 4 pixels across either way, whose chroma the host
    /// decoder replicates at the edges as libjpeg-turbo does (nvJPEG interpolates there:
    /// measured 21–29 dB from the host path at 3×3, 4×4 and 1×9 on an H100, against over 50 dB
    /// from 5×5 up).
    pub(crate) fn for_nvjpeg(&self) -> bool {
        let tiny = self.subsampled && (self.width <= 4 || self.height <= 4);
        self.sof <= 2
            && matches!(self.components, 1 | 3)
            && self.width > 0
            && self.height > 0
            && !tiny
    }
}

/// The headers of a JPEG up to its first scan: the first frame header and the first EXIF
/// block. `None` for bytes that are not a JPEG or end before a frame header.
pub(crate) fn probe(bytes: &[u8]) -> Option<JpegInfo> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut i = 2;
    let mut frame = None;
    let mut orientation = None;
    loop {
        let &marker = bytes.get(i + 1)?;
        if bytes[i] != 0xFF || matches!(marker, 0xFF | 0x00) {
            i += 1;
            continue;
        }
        match marker {
            0xDA | 0xD9 => break,
            0x01 | 0xD0..=0xD7 => i += 2,
            _ => {
                let len = bytes.get(i + 2..i + 4)?;
                let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
                if len < 2 {
                    return None;
                }
                let body = bytes.get(i + 4..(i + 2 + len).min(bytes.len()))?;
                match marker {
                    0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF if frame.is_none() => {
                        let &[_, h0, h1, w0, w1, n] = body.first_chunk::<6>()?;
                        // Each component: id, sampling factors (H << 4 | V), table.
                        let factors = body[6..].chunks_exact(3).take(usize::from(n));
                        let first = body.get(7).copied();
                        let subsampled = factors.map(|c| c[1]).any(|f| Some(f) != first);
                        frame = Some(JpegInfo {
                            width: usize::from(u16::from_be_bytes([w0, w1])),
                            height: usize::from(u16::from_be_bytes([h0, h1])),
                            components: n,
                            sof: marker - 0xC0,
                            orientation: 1,
                            subsampled,
                        });
                    }
                    0xE1 if orientation.is_none() => {
                        if let Some(tiff) = body.strip_prefix(b"Exif\0\0") {
                            orientation = orient::from_exif(tiff);
                        }
                    }
                    _ => {}
                }
                i += 2 + len;
            }
        }
    }
    let mut info = frame?;
    info.orientation = orientation.unwrap_or(1);
    Some(info)
}

/// One picture as the kernels read it: `image.cu`'s `Job`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Job {
    pub(crate) src: u64,
    pub(crate) mid: u64,
    pub(crate) src_w: u32,
    pub(crate) src_h: u32,
    pub(crate) pitch: u32,
    pub(crate) orient: u32,
    pub(crate) crop_x: u32,
    pub(crate) crop_y: u32,
    pub(crate) ncols: u32,
    pub(crate) nrows: u32,
    pub(crate) x0: u32,
    pub(crate) y0: u32,
    pub(crate) flip: u32,
    pub(crate) span0: u32,
    pub(crate) span_rows: u32,
    pub(crate) ntap_c: u32,
    pub(crate) ntap_r: u32,
    pub(crate) taps_c: u32,
    pub(crate) taps_r: u32,
    /// 0: the decoded picture is interleaved RGB, `pitch` bytes a row; else planar, each
    /// channel's plane `plane` bytes on from the last, `pitch` bytes a row of it.
    pub(crate) plane: u32,
}

/// The jobs of a batch and the taps they index, built picture by picture.
#[derive(Default)]
pub(crate) struct Jobs {
    pub(crate) jobs: Vec<Job>,
    pub(crate) taps: Vec<i32>,
    cols: Axis,
    rows: Axis,
}

/// One axis's taps: the last computed, and those already in the batch's table, by what they
/// are a function of (pictures of one size under one centre crop share theirs: computed once
/// a batch, stored once).
#[derive(Default)]
struct Axis {
    taps: Taps,
    /// (input length, resized length, first output, end output) → where the taps start in the
    /// table, taps an output, and the span of inputs they read (start, length).
    seen: Vec<(TapsKey, Placed)>,
}

/// What an axis's taps are a function of: input length, resized length, first and end output.
type TapsKey = (usize, usize, usize, usize);
/// Where an axis's taps start in the table, taps an output, and the inputs they read (start,
/// length).
type Placed = (u32, u32, (usize, usize));

impl Axis {
    /// The table offset, taps an output and input span of `outs` when `len` inputs are resized
    /// to `out`, appended to `table` unless the batch has them already.
    fn place(
        &mut self,
        table: &mut Vec<i32>,
        len: usize,
        out: usize,
        outs: Range<usize>,
    ) -> Placed {
        let key = (len, out, outs.start, outs.end);
        if let Some(&(_, found)) = self.seen.iter().find(|(k, _)| *k == key) {
            return found;
        }
        let count = outs.len();
        self.taps.compute(len, out, outs);
        let span = self.taps.span();
        let found = (
            table.len() as u32,
            self.taps.n() as u32,
            (span.start, span.len()),
        );
        append(table, &self.taps, count);
        // A batch holds a few sizes at most; a long list only costs its search.
        if self.seen.len() < 64 {
            self.seen.push((key, found));
        }
        found
    }
}

/// The part of the output window inside the resized picture, in resized coordinates, and where
/// it starts in the output (as the host transform's `resample` computes it).
fn inside(at: isize, len: usize, size: usize) -> (Range<usize>, usize) {
    let lo = at.max(0) as usize;
    let hi = (at + size as isize).clamp(0, len as isize) as usize;
    (lo..hi.max(lo), (lo as isize - at) as usize)
}

impl Jobs {
    pub(crate) fn clear(&mut self) {
        self.jobs.clear();
        self.taps.clear();
        self.cols.seen.clear();
        self.rows.seen.clear();
    }

    /// Adds a picture stored `stored` (width, height) with EXIF orientation `orientation`
    /// (upright already: 1), drawing its crop and flip from `rng` as the host transform does.
    /// `src` and `mid` are filled in later ([`Job::src`], [`Job::mid`]); the mid buffer's size
    /// is [`Job::mid_bytes`].
    ///
    /// # Errors
    ///
    /// As [`Transform::plan`]; a size past the kernels' 32-bit indices.
    pub(crate) fn push(
        &mut self,
        transform: &Transform,
        stored: (usize, usize),
        orientation: u8,
        mut rng: SplitMix64,
    ) -> Result<Plan> {
        let (w, h) = if orientation >= 5 {
            (stored.1, stored.0)
        } else {
            stored
        };
        let plan = transform.plan(w, h, &mut rng)?;
        let size = transform.shape()[1];
        let (cols, x0) = inside(plan.at.0, plan.resized.0, size);
        let (rows, y0) = inside(plan.at.1, plan.resized.1, size);
        let (ncols, nrows) = (cols.len(), rows.len());
        let x0 = if plan.flip { size - x0 - ncols } else { x0 };
        let mut job = Job {
            src_w: stored.0 as u32,
            src_h: stored.1 as u32,
            pitch: (stored.0 * 3) as u32,
            orient: u32::from(orientation.clamp(1, 8)),
            crop_x: plan.crop.x as u32,
            crop_y: plan.crop.y as u32,
            flip: u32::from(plan.flip),
            ..Job::default()
        };
        if ncols > 0 && nrows > 0 {
            let (taps_c, ntap_c, _) =
                self.cols
                    .place(&mut self.taps, plan.crop.w, plan.resized.0, cols);
            let (taps_r, ntap_r, span) =
                self.rows
                    .place(&mut self.taps, plan.crop.h, plan.resized.1, rows);
            job.ncols = ncols as u32;
            job.nrows = nrows as u32;
            job.x0 = x0 as u32;
            job.y0 = y0 as u32;
            job.span0 = span.0 as u32;
            job.span_rows = span.1 as u32;
            job.ntap_c = ntap_c;
            job.ntap_r = ntap_r;
            job.taps_c = taps_c;
            job.taps_r = taps_r;
        }
        self.jobs.push(job);
        Ok(plan)
    }
}

/// `n` outputs' first indices, then their weights.
fn append(taps: &mut Vec<i32>, t: &Taps, n: usize) {
    taps.extend((0..n).map(|o| t.of(o).0 as i32));
    for o in 0..n {
        taps.extend_from_slice(t.of(o).1);
    }
}

impl Job {
    /// Bytes of the rows filtered across.
    pub(crate) fn mid_bytes(&self) -> usize {
        self.span_rows as usize * self.ncols as usize * 3
    }

    /// Bytes of the decoded picture.
    pub(crate) fn src_bytes(&self) -> usize {
        let rows = self.pitch as usize * self.src_h as usize;
        if self.plane == 0 { rows } else { 3 * rows }
    }

    /// Has the picture decoded as three planes (`pitch` = its width) rather than interleaved.
    pub(crate) fn set_planar(&mut self) {
        self.pitch = self.src_w;
        self.plane = self.src_w * self.src_h;
    }

    /// Has the picture decoded interleaved, `3 × width` bytes a row.
    pub(crate) fn set_interleaved(&mut self) {
        self.pitch = self.src_w * 3;
        self.plane = 0;
    }
}

#[cfg(test)]
const HALF: i32 = 1 << 21;

#[cfg(test)]
fn clip8(v: i32) -> u8 {
    (v >> 22).clamp(0, 255) as u8
}

/// What the kernels compute for `job`, on the host: `src` the decoded picture (stored
/// orientation, `pitch` bytes a row), `table` the `[3][256]` outputs, into `out`
/// (`[3, size, size]`).
#[cfg(test)]
pub(crate) fn model<T: Copy>(
    job: &Job,
    taps: &[i32],
    src: &[u8],
    table: &[T],
    size: usize,
    out: &mut [T],
) {
    let (w, h) = (job.src_w as usize, job.src_h as usize);
    let stored = |x: usize, y: usize| -> usize {
        let (sx, sy) = match job.orient {
            2 => (w - 1 - x, y),
            3 => (w - 1 - x, h - 1 - y),
            4 => (x, h - 1 - y),
            5 => (y, x),
            6 => (y, h - 1 - x),
            7 => (w - 1 - y, h - 1 - x),
            8 => (w - 1 - y, x),
            _ => (x, y),
        };
        sy * job.pitch as usize + sx * if job.plane == 0 { 3 } else { 1 }
    };
    let step = if job.plane == 0 {
        1
    } else {
        job.plane as usize
    };
    let (ncols, nrows) = (job.ncols as usize, job.nrows as usize);
    let mut mid = vec![0u8; job.mid_bytes()];
    let firsts = &taps[job.taps_c as usize..];
    let weights = &firsts[ncols..];
    for m in 0..job.span_rows as usize {
        for o in 0..ncols {
            let y = (job.crop_y + job.span0) as usize + m;
            let x = job.crop_x as usize + firsts[o] as usize;
            let k = &weights[o * job.ntap_c as usize..][..job.ntap_c as usize];
            let mut acc = [HALF; 3];
            for (i, &wt) in k.iter().enumerate() {
                let p = &src[stored(x + i, y)..];
                for c in 0..3 {
                    acc[c] += i32::from(p[c * step]) * wt;
                }
            }
            for c in 0..3 {
                mid[(m * ncols + o) * 3 + c] = clip8(acc[c]);
            }
        }
    }
    let firsts = &taps[job.taps_r as usize..];
    let weights = &firsts[nrows..];
    let plane = size * size;
    for oy in 0..size {
        for ox in 0..size {
            let mut v = [0u8; 3];
            let (x0, y0) = (job.x0 as usize, job.y0 as usize);
            if (y0..y0 + nrows).contains(&oy) && (x0..x0 + ncols).contains(&ox) {
                let r = oy - y0;
                let c = if job.flip != 0 {
                    x0 + ncols - 1 - ox
                } else {
                    ox - x0
                };
                let k = &weights[r * job.ntap_r as usize..][..job.ntap_r as usize];
                let first = firsts[r] as usize - job.span0 as usize;
                let mut acc = [HALF; 3];
                for (i, &wt) in k.iter().enumerate() {
                    let p = &mid[((first + i) * ncols + c) * 3..][..3];
                    for ch in 0..3 {
                        acc[ch] += i32::from(p[ch]) * wt;
                    }
                }
                v = acc.map(clip8);
            }
            for ch in 0..3 {
                out[ch * plane + oy * size + ox] = table[ch * 256 + usize::from(v[ch])];
            }
        }
    }
}
