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

/// [`PRECISION`] as the vector shifts take it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) const PRECISION_I32: i32 = PRECISION as i32;

/// Half of the last bit, added before the shift to round.
pub(super) const HALF: i32 = 1 << (PRECISION - 1);

/// A rectangle of pixels: its left column, top row, width and height.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rect {
    pub(crate) x: usize,
    pub(crate) y: usize,
    pub(crate) w: usize,
    pub(crate) h: usize,
}

/// One axis: for each output index of a range, the first input index it reads and its
/// weights. Every output has the same number of taps, `n` (the most any needs): an output
/// that needs fewer has zero weights added, after its own or, at the axis's far end, before
/// (its first index moved back), so every tap reads inside the axis.
#[derive(Debug, Default)]
pub(super) struct Taps {
    first: Vec<usize>,
    /// `n` weights per output.
    weights: Vec<i32>,
    n: usize,
    /// The weights of each pair of outputs, tap by tap, each repeated for four lanes:
    /// `[pair][t][output of the pair][4]`.
    pairs: Vec<i32>,
    /// Scratch: each output's first index, count and weights before they are evened out.
    raw: Vec<(usize, usize)>,
    raw_weights: Vec<i32>,
    stride: usize,
}

fn triangle(x: f64) -> f64 {
    (1.0 - x.abs()).max(0.0)
}

impl Taps {
    /// The taps of outputs `outs` when `len` input pixels are resized to `out`.
    pub(super) fn compute(&mut self, len: usize, out: usize, outs: Range<usize>) {
        let scale = len as f64 / out as f64;
        let filterscale = scale.max(1.0);
        let support = filterscale;
        self.stride = support.ceil() as usize * 2 + 1;
        self.raw.clear();
        self.raw_weights.clear();
        let mut ws = [0f64; 64];
        for o in outs {
            let center = (o as f64 + 0.5) * scale;
            // As C's `(int)` casts: truncation toward zero, then clamping to the axis.
            let lo = ((center - support + 0.5) as isize).max(0) as usize;
            let hi = ((center + support + 0.5) as isize).min(len as isize).max(0) as usize;
            let n = hi.saturating_sub(lo).min(self.stride);
            // PIL's floating-point steps, in its order: an upscale often puts an output
            // exactly between two values, where the last bit of a weight decides the rounding.
            let ss = 1.0 / filterscale;
            let mut total = 0.0;
            let raw = |x: usize| triangle(((x + lo) as f64 - center + 0.5) * ss);
            if n <= ws.len() {
                for (x, w) in ws[..n].iter_mut().enumerate() {
                    *w = raw(x);
                    total += *w;
                }
            } else {
                total = (0..n).map(raw).sum();
            }
            let one = f64::from(1u32 << PRECISION);
            self.raw_weights.extend((0..n).map(|x| {
                let w = if n <= ws.len() { ws[x] } else { raw(x) };
                let w = if total == 0.0 { w } else { w / total };
                if w < 0.0 {
                    (-0.5 + w * one) as i32
                } else {
                    (0.5 + w * one) as i32
                }
            }));
            self.raw.push((lo, n));
        }
        // Even out the counts.
        self.n = self.raw.iter().map(|&(_, n)| n).max().unwrap_or(0);
        self.first.clear();
        self.weights.clear();
        let mut at = 0;
        for &(lo, n) in &self.raw {
            let first = lo.min(len - self.n);
            let before = lo - first;
            let own = &self.raw_weights[at..at + n];
            at += n;
            self.weights.extend(std::iter::repeat_n(0, before));
            self.weights.extend_from_slice(own);
            self.weights
                .extend(std::iter::repeat_n(0, self.n - before - n));
            self.first.push(first);
        }
        self.pairs.clear();
        for pair in self.weights.chunks_exact(2 * self.n.max(1)) {
            for t in 0..self.n {
                self.pairs.extend([pair[t]; 4]);
                self.pairs.extend([pair[self.n + t]; 4]);
            }
        }
    }

    /// Each output's first input index.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn first(&self) -> &[usize] {
        &self.first
    }

    /// Taps an output.
    pub(super) fn n(&self) -> usize {
        self.n
    }

    /// Pair `p`'s weights (outputs `2p` and `2p + 1`), tap by tap, eight lanes each.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn pairs(&self, p: usize) -> &[i32] {
        &self.pairs[p * 8 * self.n..][..8 * self.n]
    }

    /// The input indices any output reads.
    pub(super) fn span(&self) -> Range<usize> {
        let lo = self.first.iter().min().copied().unwrap_or(0);
        let hi = self.first.iter().max().map_or(0, |f| f + self.n);
        lo..hi.max(lo)
    }

    /// Output `o`'s first input index and weights.
    pub(super) fn of(&self, o: usize) -> (usize, &[i32]) {
        (self.first[o], &self.weights[o * self.n..][..self.n])
    }
}

fn clip(v: i32) -> u8 {
    (v >> PRECISION).clamp(0, 255) as u8
}

/// Where the resampled window goes: `[3, _, width]` planes of `plane` elements, the window's
/// top-left pixel at (`x0`, `y0`), mirrored left to right when `flip`.
pub(crate) struct Planes<'a> {
    pub(crate) data: &'a mut [u8],
    pub(crate) plane: usize,
    pub(crate) width: usize,
    pub(crate) x0: usize,
    pub(crate) y0: usize,
    pub(crate) flip: bool,
}

/// Resamples images into planes of `u8`, keeping its scratch memory for the next image.
#[derive(Debug, Default)]
pub(crate) struct Resampler {
    cols: Taps,
    rows: Taps,
    /// The first pass's output: the rows the second pass reads.
    mid: Vec<u8>,
    acc: Vec<i32>,
    /// One row of the horizontal pass's output, RGBX.
    line: Vec<u32>,
    /// Planes of `u8` for outputs of another element type, converted after.
    pub(crate) planes: Vec<u8>,
}

/// Output `i` of a horizontal pass over one row of interleaved RGB (`src`, from the row's
/// first pixel to the end of the image), `N` taps an output. Each tap reads four bytes (its
/// pixel's and the next pixel's first, ignored) where `src` has them.
#[inline(always)]
fn pixel<const N: usize>(src: &[u8], taps: &Taps, i: usize) -> [u8; 3] {
    let (first, k) = taps.of(i);
    let mut acc = [HALF; 4];
    if let Some(s) = src.get(first * 3..first * 3 + 3 * N + 1) {
        for t in 0..N {
            for c in 0..4 {
                acc[c] += i32::from(s[t * 3 + c]) * k[t];
            }
        }
    } else {
        let s = &src[first * 3..first * 3 + 3 * N];
        for t in 0..N {
            for c in 0..3 {
                acc[c] += i32::from(s[t * 3 + c]) * k[t];
            }
        }
    }
    [clip(acc[0]), clip(acc[1]), clip(acc[2])]
}

/// [`pixel`] for any number of taps.
fn pixel_any(src: &[u8], taps: &Taps, i: usize) -> [u8; 3] {
    let (first, k) = taps.of(i);
    let mut acc = [HALF; 3];
    for (p, &w) in src[first * 3..].chunks_exact(3).zip(k) {
        for c in 0..3 {
            acc[c] += i32::from(p[c]) * w;
        }
    }
    [clip(acc[0]), clip(acc[1]), clip(acc[2])]
}

/// Output `i` of a horizontal pass over one row, as RGBX bytes.
#[inline(always)]
fn rgbx(src: &[u8], taps: &Taps, i: usize) -> u32 {
    let px = match taps.n() {
        1 => pixel::<1>(src, taps, i),
        2 => pixel::<2>(src, taps, i),
        3 => pixel::<3>(src, taps, i),
        4 => pixel::<4>(src, taps, i),
        5 => pixel::<5>(src, taps, i),
        6 => pixel::<6>(src, taps, i),
        7 => pixel::<7>(src, taps, i),
        8 => pixel::<8>(src, taps, i),
        _ => pixel_any(src, taps, i),
    };
    u32::from_le_bytes([px[0], px[1], px[2], 0])
}

/// A horizontal pass over one row into `line`, one output at a time.
#[inline(always)]
fn horizontal(src: &[u8], taps: &Taps, line: &mut [u32]) {
    for (i, px) in line.iter_mut().enumerate() {
        *px = rgbx(src, taps, i);
    }
}

/// `line`'s RGBX pixels into three rows of planes (mirrored when `flip`).
#[inline(always)]
fn deinterleave(line: &[u32], flip: bool, [r, g, b]: [&mut [u8]; 3]) {
    let put = |((px, r), g): ((&u32, &mut u8), &mut u8), b: &mut u8| {
        let [pr, pg, pb, _] = px.to_le_bytes();
        (*r, *g, *b) = (pr, pg, pb);
    };
    if flip {
        for (x, b) in line
            .iter()
            .rev()
            .zip(r.iter_mut())
            .zip(g.iter_mut())
            .zip(b.iter_mut())
        {
            put(x, b);
        }
    } else {
        for (x, b) in line
            .iter()
            .zip(r.iter_mut())
            .zip(g.iter_mut())
            .zip(b.iter_mut())
        {
            put(x, b);
        }
    }
}

/// Three disjoint rows of `len` bytes of `data`, at `at`, `at + step` and `at + 2 step`.
fn three_rows(data: &mut [u8], at: usize, step: usize, len: usize) -> [&mut [u8]; 3] {
    let (r, rest) = data[at..].split_at_mut(step);
    let (g, b) = rest.split_at_mut(step);
    [&mut r[..len], &mut g[..len], &mut b[..len]]
}

/// One output row of a vertical pass: input row `first + t` (from `row`) weighed by `k[t]`,
/// summed in `acc`, written rounded to `out`.
#[inline(always)]
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
    /// Resizes `crop` (a rectangle of `image`) to `out` (width, height) and writes the window
    /// `cols × rows` of the result (ranges of output columns and rows) into `dst`. Nothing
    /// outside the window is computed.
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
        dst: Planes<'_>,
    ) {
        debug_assert!(crop.x + crop.w <= image.width() && crop.y + crop.h <= image.height());
        self.cols.compute(crop.w, out.0, cols);
        self.rows.compute(crop.h, out.1, rows);
        let vertical_first = out.1 < crop.h && crop.h - out.1 > 2 * crop.w.saturating_sub(out.0);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU running this has AVX2, checked just above.
            return unsafe { self.passes_avx2(image, crop, vertical_first, dst) };
        }
        self.passes::<false>(image, crop, vertical_first, dst);
    }

    /// [`run`](Self::run) without AVX2, whatever the CPU has.
    #[cfg(test)]
    fn run_portable(
        &mut self,
        image: &Image,
        crop: Rect,
        out: (usize, usize),
        cols: Range<usize>,
        rows: Range<usize>,
        dst: Planes<'_>,
    ) {
        self.cols.compute(crop.w, out.0, cols);
        self.rows.compute(crop.h, out.1, rows);
        let vertical_first = out.1 < crop.h && crop.h - out.1 > 2 * crop.w.saturating_sub(out.0);
        self.passes::<false>(image, crop, vertical_first, dst);
    }

    /// [`passes`](Self::passes) compiled for AVX2: the same code, eight lanes wide.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn passes_avx2(
        &mut self,
        image: &Image,
        crop: Rect,
        vertical_first: bool,
        dst: Planes<'_>,
    ) {
        self.passes::<true>(image, crop, vertical_first, dst);
    }

    /// Both passes, over the taps already computed; the horizontal one eight lanes wide with
    /// `AVX2`, which only [`passes_avx2`](Self::passes_avx2) asks for.
    #[inline(always)]
    fn passes<const AVX2: bool>(
        &mut self,
        image: &Image,
        crop: Rect,
        vertical_first: bool,
        dst: Planes<'_>,
    ) {
        let mut line = std::mem::take(&mut self.line);
        line.resize(self.cols.first.len(), 0);
        let mut row_pass = |src: &[u8], taps: &Taps, flip: bool, out: [&mut [u8]; 3]| {
            #[cfg(target_arch = "x86_64")]
            if AVX2 {
                let scalar = |i: usize| rgbx(src, taps, i);
                // SAFETY: `AVX2` is true only in `passes_avx2`, which runs only on a CPU with
                // AVX2.
                unsafe { super::avx2::horizontal(src, taps, &mut line, scalar) };
                return deinterleave(&line, flip, out);
            }
            horizontal(src, taps, &mut line);
            deinterleave(&line, flip, out);
        };
        let (ncols, nrows) = (self.cols.first.len(), self.rows.first.len());
        let width = image.width();
        // The crop's rows, from its left edge to the end of the image's pixels.
        let pixels = image.pixels();
        let input = |y: usize| &pixels[((crop.y + y) * width + crop.x) * 3..];
        let Planes {
            data,
            plane,
            width: dw,
            x0,
            y0,
            flip,
        } = dst;
        if vertical_first {
            // The columns any output reads, down each output row; then across, into the
            // planes.
            let span = self.cols.span();
            let wide = span.len() * 3;
            self.mid.resize(nrows * wide, 0);
            self.acc.resize(wide, 0);
            for j in 0..nrows {
                let (first, k) = self.rows.of(j);
                let row = |y: usize| &input(y)[span.start * 3..][..wide];
                let mid = &mut self.mid[j * wide..][..wide];
                vertical(row, first, k, &mut self.acc, mid);
            }
            let start = span.start;
            for first in &mut self.cols.first {
                *first -= start;
            }
            for j in 0..nrows {
                let src = &self.mid[j * wide..];
                let rows = three_rows(data, (y0 + j) * dw + x0, plane, ncols);
                row_pass(src, &self.cols, flip, rows);
            }
        } else {
            // The rows any output reads, across into planes of the window's width; then down
            // each plane, straight into `dst`.
            let span = self.rows.span();
            let mplane = span.len() * ncols;
            self.mid.resize(3 * mplane, 0);
            self.acc.resize(ncols, 0);
            for (m, y) in span.clone().enumerate() {
                let rows = three_rows(&mut self.mid, m * ncols, mplane, ncols);
                row_pass(input(y), &self.cols, flip, rows);
            }
            for c in 0..3 {
                let mid = &self.mid[c * mplane..][..mplane];
                for j in 0..nrows {
                    let (first, k) = self.rows.of(j);
                    let row = |y: usize| &mid[(y - span.start) * ncols..][..ncols];
                    let o = &mut data[c * plane + (y0 + j) * dw + x0..][..ncols];
                    vertical(row, first, k, &mut self.acc, o);
                }
            }
        }
        self.line = line;
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

    /// The resize as interleaved RGB rows.
    fn resize(image: &Image, crop: Rect, out: (usize, usize)) -> Vec<u8> {
        let (w, h) = out;
        let mut planes = vec![0u8; 3 * w * h];
        let dst = Planes {
            data: &mut planes,
            plane: w * h,
            width: w,
            x0: 0,
            y0: 0,
            flip: false,
        };
        Resampler::default().run(image, crop, out, 0..w, 0..h, dst);
        (0..w * h)
            .flat_map(|p| [planes[p], planes[w * h + p], planes[2 * w * h + p]])
            .collect()
    }

    #[test]
    fn the_vector_pass_computes_the_portable_pass_s_pixels() {
        let mut rng = crate::loader::SplitMix64::for_test("the_vector_pass");
        for case in 0..60 {
            let (w, h) = (1 + rng.below(90) as usize, 1 + rng.below(90) as usize);
            let image = random_image(rng.next_u64(), w, h);
            let (cw, ch) = (
                1 + rng.below(w as u64) as usize,
                1 + rng.below(h as u64) as usize,
            );
            let crop = Rect {
                x: rng.below((w - cw + 1) as u64) as usize,
                y: rng.below((h - ch + 1) as u64) as usize,
                w: cw,
                h: ch,
            };
            let out = (1 + rng.below(70) as usize, 1 + rng.below(70) as usize);
            let flip = rng.below(2) == 1;
            let mut both = [vec![0u8; 3 * out.0 * out.1], vec![0u8; 3 * out.0 * out.1]];
            for (k, planes) in both.iter_mut().enumerate() {
                let dst = Planes {
                    data: planes,
                    plane: out.0 * out.1,
                    width: out.0,
                    x0: 0,
                    y0: 0,
                    flip,
                };
                let mut r = Resampler::default();
                if k == 0 {
                    r.run(&image, crop, out, 0..out.0, 0..out.1, dst);
                } else {
                    r.run_portable(&image, crop, out, 0..out.0, 0..out.1, dst);
                }
            }
            assert!(
                both[0] == both[1],
                "case {case}: {w}x{h}, {crop:?} -> {out:?}, flip {flip}"
            );
        }
    }

    #[test]
    fn the_same_size_is_the_same_pixels() {
        let seed = crate::test_seed::seed("the_same_size_is_the_same_pixels");
        let image = random_image(seed, 17, 9);
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
        let seed = crate::test_seed::seed("a_window_holds_the_whole_resize_s_pixels");
        let image = random_image(seed, 50, 37);
        let crop = Rect {
            x: 3,
            y: 2,
            w: 41,
            h: 30,
        };
        for out in [(29, 23), (37, 11)] {
            let whole = resize(&image, crop, out);
            let (cols, rows) = (5..20, 7..out.1 - 2);
            for flip in [false, true] {
                let mut planes = vec![0u8; 3 * 15 * rows.len()];
                let plane = 15 * rows.len();
                let dst = Planes {
                    data: &mut planes,
                    plane,
                    width: 15,
                    x0: 0,
                    y0: 0,
                    flip,
                };
                Resampler::default().run(&image, crop, out, cols.clone(), rows.clone(), dst);
                for (j, y) in rows.clone().enumerate() {
                    for (i, x) in cols.clone().enumerate() {
                        let i = if flip { 14 - i } else { i };
                        for c in 0..3 {
                            let want = whole[(y * out.0 + x) * 3 + c];
                            assert_eq!(planes[c * plane + j * 15 + i], want, "{out:?} ({x}, {y})");
                        }
                    }
                }
            }
        }
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
