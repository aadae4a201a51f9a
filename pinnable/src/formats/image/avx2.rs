//! The resampler's horizontal pass with AVX2: two outputs a vector, each pixel's four bytes
//! (RGB and the next pixel's red, ignored) widened to four `i32` lanes, weighed and summed.
//! The arithmetic is the portable pass's (22-bit weights, `i32` sums, rounding, clamping), so
//! the pixels are the same.

use std::arch::x86_64::{
    __m256i, _mm_cvtsi32_si128, _mm_cvtsi128_si32, _mm_insert_epi32, _mm256_add_epi32,
    _mm256_castsi256_si128, _mm256_cvtepu8_epi32, _mm256_extracti128_si256, _mm256_loadu_si256,
    _mm256_mullo_epi32, _mm256_packus_epi16, _mm256_packus_epi32, _mm256_set1_epi32,
    _mm256_srai_epi32,
};

use super::resample::{HALF, PRECISION_I32, Taps};

/// Four bytes of `s` at `at`, little-endian, as one `i32`.
#[inline(always)]
fn word(s: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(s[at..at + 4].try_into().expect("four bytes"))
}

/// The horizontal pass over one row: `src` holds interleaved RGB from the row's first pixel to
/// the end of the image; output `i` goes to `line[i]` as RGBX bytes. Pairs of outputs whose
/// four-byte reads stay inside `src` go through vectors; the rest through `scalar`. Up to
/// eight taps an output, the pass is compiled for its number of taps (unrolled, no bounds
/// checks in the loop).
#[target_feature(enable = "avx2")]
pub(super) fn horizontal(src: &[u8], taps: &Taps, line: &mut [u32], scalar: impl Fn(usize) -> u32) {
    match taps.n() {
        1 => pass::<1>(src, taps, line, scalar),
        2 => pass::<2>(src, taps, line, scalar),
        3 => pass::<3>(src, taps, line, scalar),
        4 => pass::<4>(src, taps, line, scalar),
        5 => pass::<5>(src, taps, line, scalar),
        6 => pass::<6>(src, taps, line, scalar),
        7 => pass::<7>(src, taps, line, scalar),
        8 => pass::<8>(src, taps, line, scalar),
        _ => pass::<0>(src, taps, line, scalar),
    }
}

/// [`horizontal`] for `N` taps an output, or for any number when `N` is 0.
#[target_feature(enable = "avx2")]
#[inline]
fn pass<const N: usize>(src: &[u8], taps: &Taps, line: &mut [u32], scalar: impl Fn(usize) -> u32) {
    let n = if N == 0 { taps.n() } else { N };
    let half = _mm256_set1_epi32(HALF);
    let pairs = taps.first().chunks_exact(2).zip(line.chunks_exact_mut(2));
    for (p, (first, out)) in pairs.enumerate() {
        let (a, b) = (first[0] * 3, first[1] * 3);
        // `first` grows with the output: the pair's second pixel reads furthest.
        let (Some(sa), Some(sb)) = (src.get(a..a + 3 * n + 1), src.get(b..b + 3 * n + 1)) else {
            out[0] = scalar(2 * p);
            out[1] = scalar(2 * p + 1);
            continue;
        };
        let weights = &taps.pairs(p)[..8 * n];
        let mut acc = half;
        for t in 0..n {
            let v = _mm_insert_epi32::<1>(_mm_cvtsi32_si128(word(sa, 3 * t)), word(sb, 3 * t));
            let w = &weights[8 * t..8 * t + 8];
            // SAFETY: `w` holds 8 `i32`s, the 32 bytes read.
            let w: __m256i = unsafe { _mm256_loadu_si256(w.as_ptr().cast()) };
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(v), w));
        }
        // Saturating packs clamp to 0..=255 as `clip` does; each 128-bit half's low dword
        // then holds one output's RGBX.
        let v = _mm256_srai_epi32::<PRECISION_I32>(acc);
        let v = _mm256_packus_epi32(v, v);
        let v = _mm256_packus_epi16(v, v);
        out[0] = _mm_cvtsi128_si32(_mm256_castsi256_si128(v)) as u32;
        out[1] = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(v)) as u32;
    }
    if line.len() % 2 == 1 {
        let last = line.len() - 1;
        line[last] = scalar(last);
    }
}
