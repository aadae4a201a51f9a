//! Antialiased bilinear resampling, computed as PIL's `Image.resize(size, BILINEAR)` computes it
//! (and so torchvision's `Resize` on PIL images, and `antialias=True` on tensors): a triangle
//! filter widened by the downscale factor, so every input pixel counts when shrinking; weights
//! in 22-bit fixed point; a horizontal pass, its rows rounded to 8 bits, then a vertical pass.
//!
//! Only the pixels asked for are computed: a center crop of a resized image costs the crop's
//! pixels, not the whole resized image's, and each output pixel is the value the whole resize
//! would have given it.

use std::ops::Range;

use super::decode::Image;

/// Fixed-point bits of a weight (PIL's `PRECISION_BITS`): sums of 8-bit pixels times weights
/// fit an `i32`.
const PRECISION: u32 = 22;

/// Half of the last bit, added before the shift to round.
const HALF: i32 = 1 << (PRECISION - 1);

/// A rectangle of pixels: its left column, top row, width and height.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rect {
    pub(crate) x: usize,
    pub(crate) y: usize,
    pub(crate) w: usize,
    pub(crate) h: usize,
}

/// One axis: for each output index of a range, the first input index it reads, how many, and
/// their weights.
#[derive(Debug, Default)]
struct Taps {
    first: Vec<usize>,
    count: Vec<usize>,
    /// `stride` weights per output, the first `count` of them used.
    weights: Vec<i32>,
    stride: usize,
    /// Scratch for one output's weights before they are normalised.
    raw: Vec<f64>,
}

fn triangle(x: f64) -> f64 {
    (1.0 - x.abs()).max(0.0)
}

impl Taps {
    /// The taps of outputs `outs` when `len` input pixels are resized to `out`.
    fn compute(&mut self, len: usize, out: usize, outs: Range<usize>) {
        let scale = len as f64 / out as f64;
        let filterscale = scale.max(1.0);
        let support = filterscale;
        self.stride = support.ceil() as usize * 2 + 1;
        self.first.clear();
        self.count.clear();
        self.weights.clear();
        for o in outs {
            let center = (o as f64 + 0.5) * scale;
            // As C's `(int)` casts: truncation toward zero, then clamping to the axis.
            let lo = ((center - support + 0.5) as isize).max(0) as usize;
            let hi = ((center + support + 0.5) as isize).min(len as isize).max(0) as usize;
            let n = hi.saturating_sub(lo).min(self.stride);
            // PIL's floating-point steps, in its order: an upscale often puts an output
            // exactly between two values, where the last bit of a weight decides the rounding.
            let ss = 1.0 / filterscale;
            self.raw.clear();
            self.raw
                .extend((0..n).map(|x| triangle(((x + lo) as f64 - center + 0.5) * ss)));
            let total: f64 = self.raw.iter().sum();
            let one = f64::from(1u32 << PRECISION);
            self.weights.extend(self.raw.iter().map(|&w| {
                let w = if total == 0.0 { w } else { w / total };
                if w < 0.0 {
                    (-0.5 + w * one) as i32
                } else {
                    (0.5 + w * one) as i32
                }
            }));
            self.weights.extend(std::iter::repeat_n(0, self.stride - n));
            self.first.push(lo);
            self.count.push(n);
        }
    }

    /// The input indices any output reads.
    fn span(&self) -> Range<usize> {
        let lo = self.first.iter().min().copied().unwrap_or(0);
        let hi = (self.first.iter().zip(&self.count))
            .map(|(f, n)| f + n)
            .max()
            .unwrap_or(0);
        lo..hi.max(lo)
    }

    /// Output `o`'s first input index and weights.
    fn of(&self, o: usize) -> (usize, &[i32]) {
        (
            self.first[o],
            &self.weights[o * self.stride..][..self.count[o]],
        )
    }
}

fn clip(v: i32) -> u8 {
    (v >> PRECISION).clamp(0, 255) as u8
}

/// Resamples images into rows of RGB, keeping its scratch memory for the next image.
#[derive(Debug, Default)]
pub(crate) struct Resampler {
    cols: Taps,
    rows: Taps,
    /// The first pass's output: the rows (or the columns of each row) the second pass reads.
    mid: Vec<u8>,
    acc: Vec<i32>,
    line: Vec<u8>,
}

/// One output pixel of a horizontal pass: `src` interleaved RGB from the first input pixel
/// the weights `k` apply to.
fn horizontal(src: &[u8], k: &[i32]) -> [u8; 3] {
    let (mut r, mut g, mut b) = (HALF, HALF, HALF);
    for (p, &w) in src.chunks_exact(3).zip(k) {
        r += i32::from(p[0]) * w;
        g += i32::from(p[1]) * w;
        b += i32::from(p[2]) * w;
    }
    [clip(r), clip(g), clip(b)]
}

/// One output row of a vertical pass into `out`: input row `first + t` (from `row`) weighed by
/// `k[t]`, summed in `acc`.
fn vertical<'a>(
    row: impl Fn(usize) -> &'a [u8],
    first: usize,
    k: &[i32],
    acc: &mut [i32],
    out: &mut [u8],
) {
    acc.fill(HALF);
    for (t, &w) in k.iter().enumerate() {
        for (a, &p) in acc.iter_mut().zip(row(first + t)) {
            *a += i32::from(p) * w;
        }
    }
    for (o, &a) in out.iter_mut().zip(acc.iter()) {
        *o = clip(a);
    }
}

impl Resampler {
    /// Resizes `crop` (a rectangle of `image`) to `out` (width, height) and hands the window
    /// `cols × rows` of the result (ranges of output columns and rows) to `emit`, row by row:
    /// `emit(j, rgb)` for window row `j`, `rgb` holding `cols.len()` interleaved RGB pixels.
    /// Nothing outside the window is computed.
    ///
    /// The passes run in Pillow's order (since 13.0): vertical first when the height shrinks
    /// by more than twice as many pixels as the width, else horizontal first. The order
    /// decides how the first pass's output is rounded, so it decides the last bit of some
    /// pixels.
    pub(crate) fn run(
        &mut self,
        image: &Image,
        crop: Rect,
        out: (usize, usize),
        cols: Range<usize>,
        rows: Range<usize>,
        mut emit: impl FnMut(usize, &[u8]),
    ) {
        debug_assert!(crop.x + crop.w <= image.width() && crop.y + crop.h <= image.height());
        self.cols.compute(crop.w, out.0, cols.clone());
        self.rows.compute(crop.h, out.1, rows.clone());
        let stride = cols.len() * 3;
        let width = image.width();
        let pixels = image.pixels();
        // Input row `y` of the crop, from its column `x`.
        let input = |y: usize, x: usize| &pixels[((crop.y + y) * width + crop.x + x) * 3..];
        self.acc.resize(stride.max(crop.w * 3), 0);
        self.line.resize(stride, 0);
        let vertical_first = out.1 < crop.h && crop.h - out.1 > 2 * crop.w.saturating_sub(out.0);
        if vertical_first {
            // The columns any output reads, for each output row; then each row across.
            let span = self.cols.span();
            let wide = span.len() * 3;
            self.mid.resize(rows.len() * wide, 0);
            for (j, mid) in self.mid.chunks_exact_mut(wide.max(1)).enumerate() {
                let (first, k) = self.rows.of(j);
                let row = |y: usize| &input(y, span.start)[..wide];
                vertical(row, first, k, &mut self.acc[..wide], mid);
            }
            for j in 0..rows.len() {
                let mid = &self.mid[j * wide..][..wide];
                for (o, px) in self.line.chunks_exact_mut(3).enumerate() {
                    let (first, k) = self.cols.of(o);
                    px.copy_from_slice(&horizontal(&mid[(first - span.start) * 3..], k));
                }
                emit(j, &self.line);
            }
        } else {
            // The rows any output reads, across; then each output row down.
            let span = self.rows.span();
            self.mid.resize(span.len() * stride, 0);
            for (m, y) in span.clone().enumerate() {
                let src = &input(y, 0)[..crop.w * 3];
                let dst = &mut self.mid[m * stride..][..stride];
                for (o, px) in dst.chunks_exact_mut(3).enumerate() {
                    let (first, k) = self.cols.of(o);
                    px.copy_from_slice(&horizontal(&src[first * 3..], k));
                }
            }
            for j in 0..rows.len() {
                let (first, k) = self.rows.of(j);
                let mid = &self.mid;
                let row = |y: usize| &mid[(y - span.start) * stride..][..stride];
                vertical(row, first, k, &mut self.acc[..stride], &mut self.line);
                emit(j, &self.line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_image(seed: u64, w: usize, h: usize) -> Image {
        let mut rng = crate::loader::SplitMix64::new(seed);
        let pixels = (0..w * h * 3).map(|_| rng.next_u64() as u8).collect();
        Image::from_rgb(w, h, pixels).unwrap()
    }

    fn resize(image: &Image, crop: Rect, out: (usize, usize)) -> Vec<u8> {
        let mut all = Vec::new();
        Resampler::default().run(image, crop, out, 0..out.0, 0..out.1, |_, row| {
            all.extend_from_slice(row)
        });
        all
    }

    #[test]
    fn the_same_size_is_the_same_pixels() {
        let image = random_image(1, 17, 9);
        let full = Rect {
            x: 0,
            y: 0,
            w: 17,
            h: 9,
        };
        assert_eq!(resize(&image, full, (17, 9)), image.pixels());
    }

    #[test]
    fn a_window_holds_the_whole_resize_s_pixels() {
        let image = random_image(2, 50, 37);
        let crop = Rect {
            x: 3,
            y: 2,
            w: 41,
            h: 30,
        };
        let whole = resize(&image, crop, (29, 23));
        let mut r = Resampler::default();
        r.run(&image, crop, (29, 23), 5..20, 7..19, |j, row| {
            let at = ((7 + j) * 29 + 5) * 3;
            assert_eq!(row, &whole[at..at + 15 * 3], "row {}", 7 + j);
        });
    }

    #[test]
    fn halving_averages_pairs_with_their_neighbours() {
        // 4 → 2: scale 2, support 2: output 0 (center 1.0) weighs inputs 0, 1, 2 as 1:3:3:1
        // over -0.5..2.5, clipped to the image: inputs 0, 1, 2 get 3, 3, 1 (of 7).
        let row: Vec<u8> = [0u8, 70, 140, 210].iter().flat_map(|&v| [v; 3]).collect();
        let image = Image::from_rgb(4, 1, row).unwrap();
        let out = resize(
            &image,
            Rect {
                x: 0,
                y: 0,
                w: 4,
                h: 1,
            },
            (2, 1),
        );
        let expect0 = ((0.0 * 3.0 + 70.0 * 3.0 + 140.0) / 7.0f64).round() as u8;
        let expect1 = ((70.0 + 140.0 * 3.0 + 210.0 * 3.0) / 7.0f64).round() as u8;
        assert_eq!(out, [expect0, expect0, expect0, expect1, expect1, expect1]);
    }
}
