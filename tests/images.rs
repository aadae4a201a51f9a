//! Image datasets (the `image` feature): decoded pixels against second decoders (jpeg-decoder,
//! zune-png) and the source pictures, every odd kind of file real datasets hold, errors that
//! name the file and lose nothing else, reproducible crops and flips, the folder's listing,
//! and hostile bytes.

use std::path::{Path, PathBuf};

use pinnable::formats::image::{Decoder, Image, ImageBatcher, ImageCodec, ImageFolder, Transform};
use pinnable::loader::{Dataset, Loader};
use pinnable::{DType, Error, PinnedPool, PoolConfig, Tensor};
use pinnable_harness::images::{self, Jpeg};
use pinnable_harness::{Bars, hostile, rng, sweep};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use zune_png::zune_core::bytestream::ZCursor;
use zune_png::zune_core::colorspace::ColorSpace;
use zune_png::zune_core::result::DecodingResult;

fn decode(bytes: &[u8]) -> pinnable::Result<Image> {
    let mut d = Decoder::new();
    d.decode(bytes, Path::new("test.img"))?;
    Ok(d.into_image())
}

/// A folder of its own under the system's temporary folder, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(r: &mut SmallRng, name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "pinnable-{name}-{}-{:x}",
            std::process::id(),
            r.random::<u64>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Absolute differences: (mean, max, share over `over`).
fn differences(a: &[u8], b: &[u8], over: u8) -> (f64, u8, f64) {
    assert_eq!(a.len(), b.len());
    let d: Vec<u8> = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).collect();
    let mean = d.iter().map(|&v| f64::from(v)).sum::<f64>() / d.len() as f64;
    let share = d.iter().filter(|&&v| v > over).count() as f64 / d.len() as f64;
    (mean, d.iter().copied().max().unwrap_or(0), share)
}

/// jpeg-decoder's pixels as RGB.
fn second_jpeg(bytes: &[u8]) -> Vec<u8> {
    let mut d = jpeg_decoder::Decoder::new(bytes);
    let px = d.decode().expect("jpeg-decoder");
    match d.info().unwrap().pixel_format {
        jpeg_decoder::PixelFormat::RGB24 => px,
        jpeg_decoder::PixelFormat::L8 => px.iter().flat_map(|&v| [v; 3]).collect(),
        other => panic!("no conversion for {other:?}"),
    }
}

/// zune-png's pixels as RGB: alpha dropped, 16 bits cut to the high byte, gray replicated.
fn second_png(bytes: &[u8]) -> Vec<u8> {
    let mut d = zune_png::PngDecoder::new(ZCursor::new(bytes));
    let px: Vec<u8> = match d.decode().expect("zune-png") {
        DecodingResult::U8(v) => v,
        DecodingResult::U16(v) => v.iter().map(|&s| (s >> 8) as u8).collect(),
        other => panic!("unexpected {:?}", std::mem::discriminant(&other)),
    };
    let channels = match d.colorspace().unwrap() {
        ColorSpace::RGB => 3,
        ColorSpace::RGBA => 4,
        ColorSpace::Luma => 1,
        ColorSpace::LumaA => 2,
        other => panic!("unexpected {other:?}"),
    };
    px.chunks(channels)
        .flat_map(|p| {
            if channels >= 3 {
                [p[0], p[1], p[2]]
            } else {
                [p[0]; 3]
            }
        })
        .collect()
}

/// Our JPEG pixels against jpeg-decoder's and the source picture's, each difference held to
/// its bar.
fn jpeg_pixels(r: &mut SmallRng, bars: &mut Bars) {
    for (w, h) in [
        (1, 1),
        (17, 9),
        (63, 47),
        (64, 48),
        (r.random_range(8..90), r.random_range(8..90)),
    ] {
        let rgb = images::picture(r, w, h, 4.0);
        for kind in [Jpeg::Full, Jpeg::Baseline, Jpeg::Progressive] {
            let q = r.random_range(80..=95);
            let file = images::jpeg(&rgb, w, h, q, kind, None);
            let ours = decode(&file).unwrap();
            assert_eq!((ours.width(), ours.height()), (w, h));
            let (mean, max, share) = differences(ours.pixels(), &second_jpeg(&file), 8);
            let case = format!("{kind:?} {w}x{h} q{q}");
            // Both decoders compute the inverse DCT in integers their own way; with 4:2:0
            // chroma they also interpolate the colour planes their own way.
            if kind == Jpeg::Full {
                bars.at_most("4:4:4 mean against jpeg-decoder", mean, 0.4, &case);
                bars.at_most("4:4:4 max against jpeg-decoder", f64::from(max), 4.0, &case);
            } else if w.min(h) < 32 {
                // Where a picture is a few blocks across, most pixels are near an edge of the
                // halved chroma planes, which the two decoders interpolate differently.
                bars.at_most("4:2:0 mean against jpeg-decoder, < 32 px", mean, 0.5, &case);
                bars.at_most("4:2:0 share over 8, < 32 px", share, 0.01, &case);
            } else {
                bars.at_most("4:2:0 mean against jpeg-decoder", mean, 1.2, &case);
                bars.at_most("4:2:0 share over 8", share, 0.04, &case);
            }
        }
        // And the pixels are the picture's, within what JPEG at quality 95 changes (at full
        // chroma resolution: halving it loses more at the pictures' colour edges).
        for kind in [Jpeg::Full, Jpeg::Progressive] {
            let file = images::jpeg(&rgb, w, h, 95, kind, None);
            let (mean, _, _) = differences(decode(&file).unwrap().pixels(), &rgb, 255);
            let case = format!("{kind:?} {w}x{h} q95");
            if kind == Jpeg::Full {
                bars.at_most("4:4:4 q95 mean from the source", mean, 5.0, case);
            } else if w.min(h) >= 32 {
                // Under 32 pixels, where the shapes' colour edges are most of the picture,
                // halving the chroma loses 0 to 38 on average (1000 seeds): the encoder's loss,
                // not the decoder's, which the comparison with jpeg-decoder checks there.
                bars.at_most("4:2:0 q95 mean from the source", mean, 16.0, case);
            }
        }
    }
}

// The bars, from `sweep_jpeg_pixels` over 6000 seeds (three sweeps, 2026-11-28; 30000 values
// each but the size-split ones, about 15000): the worst value found, then the bar.
// - 4:4:4 against jpeg-decoder: mean 0.333 (a 1×1 picture, one value off by one; 0.1% 0.13),
//   bar 0.4; max 3, bar 4.
// - 4:2:0 against jpeg-decoder (chroma interpolated each its own way, so a long tail where a
//   picture is dense in colour edges): mean 0.717 (0.1% 0.54), bar 1.2; share over 8 0.0187
//   (0.1% 0.009), bar 0.04. Under 32 pixels (jpeg-decoder decodes those for us): mean 0.333
//   (a 1×1 picture; 0.1% 0), bar 0.5; share over 8 0, bar 0.01.
// - From the source at q95: 4:4:4 mean 3.52 (0.1% 3.25), bar 5; 4:2:0 from 32 pixels 13.2
//   (0.1% 11.1; a long tail at 32 to 40 pixels), bar 16.
// What a real defect gives on these pictures (the same 1000 seeds): red off by 2 adds 0.67 to
// a mean; a picture one pixel off gives a mean of 2.8 to 22 and 3 to 60 % of values over 8; red
// and blue swapped, a mean of 20 to 100.
const WORST_PIXELS: &[u64] = &[
    145_944_625_574_592_297,
    5_505_242_957_359_515_725,
    2_186_939_337_698_183_494,
    9_420_600_782_493_859_280,
    2_947_368_239_393_860_547,
    15_049_615_930_953_273_761,
    2_792_790_961_368_732_088,
    14_135_670_876_684_027_029,
    11_409_870_725_634_397_955,
    5_386_680_590_825_232_281,
    5_096_993_099_337_736_299,
];

#[test]
fn jpeg_pixels_match_a_second_decoder_and_the_source() {
    let test = "jpeg_pixels_match_a_second_decoder_and_the_source";
    jpeg_pixels(&mut rng(test), &mut Bars::checked());
}

#[test]
fn jpeg_pixels_at_the_worst_seeds_found() {
    for &seed in WORST_PIXELS {
        jpeg_pixels(&mut SmallRng::seed_from_u64(seed), &mut Bars::checked());
    }
}

#[test]
#[ignore = "a sweep: PINNABLE_TEST_SWEEP=N measures the bars over N seeds"]
fn sweep_jpeg_pixels() {
    sweep("jpeg_pixels", jpeg_pixels);
}

/// Gray, CMYK and YCCK JPEGs against a second decoder and the source, each difference held to
/// its bar; the CMYK file.
fn gray_cmyk_ycck(r: &mut SmallRng, bars: &mut Bars) -> Vec<u8> {
    let (w, h) = (r.random_range(16..80), r.random_range(16..80));
    let rgb = images::picture(r, w, h, 3.0);
    let gray = images::jpeg(&rgb, w, h, 95, Jpeg::Gray, None);
    let ours = decode(&gray).unwrap();
    assert!(
        ours.pixels()
            .chunks(3)
            .all(|p| p[0] == p[1] && p[1] == p[2]),
        "gray is R = G = B"
    );
    let case = format!("{w}x{h}");
    let (mean, max, _) = differences(ours.pixels(), &second_jpeg(&gray), 255);
    bars.at_most("gray mean against jpeg-decoder", mean, 0.15, &case);
    bars.at_most("gray max against jpeg-decoder", f64::from(max), 2.0, &case);
    let luma: Vec<u8> = images::luma(&rgb).iter().flat_map(|&v| [v; 3]).collect();
    let (mean, _, _) = differences(ours.pixels(), &luma, 255);
    bars.at_most("gray mean against the picture's luma", mean, 2.5, &case);
    let cmyk = images::jpeg(&rgb, w, h, 95, Jpeg::Cmyk, None);
    let (mean, _, _) = differences(decode(&cmyk).unwrap().pixels(), &rgb, 255);
    bars.at_most("CMYK mean against the RGB picture", mean, 3.0, &case);
    // YCCK at 4:2:0: against the same file in YCbCr at 4:2:0.
    let ycck = decode(&images::jpeg(&rgb, w, h, 95, Jpeg::Ycck, None)).unwrap();
    let ycbcr = decode(&images::jpeg(&rgb, w, h, 95, Jpeg::Baseline, None)).unwrap();
    let (mean, _, _) = differences(ycck.pixels(), ycbcr.pixels(), 255);
    bars.at_most("YCCK mean against YCbCr", mean, 2.5, &case);
    cmyk
}

// The bars, from `sweep_gray_cmyk_ycck` over 6000 seeds (three sweeps, 2026-11-28): the worst
// value found, then the bar. Gray against jpeg-decoder: mean 0.056, bar 0.15; max 1, bar 2.
// Gray against the picture's luma: 1.58 (0.1% 1.50), bar 2.5. CMYK against the picture: 2.14
// (0.1% 2.09), bar 3 (a channel off by 2 adds 0.67, one pixel off 2.8 or more). YCCK against
// the same picture in YCbCr: 1.47 (0.1% 1.16), bar 2.5 (YCCK read as CMYK gives tens).
const WORST_GRAY_CMYK_YCCK: &[u64] = &[
    14_774_087_443_579_783_462,
    9_989_831_708_702_926_921,
    13_781_673_533_833_767_624,
    1_058_318_307_829_980_127,
    11_435_537_839_680_858_149,
    445_881_008_094_007_734,
    15_867_061_902_233_985_982,
    2_998_396_122_586_599_377,
];

#[test]
fn gray_cmyk_and_ycck_jpegs_at_the_worst_seeds_found() {
    for &seed in WORST_GRAY_CMYK_YCCK {
        gray_cmyk_ycck(&mut SmallRng::seed_from_u64(seed), &mut Bars::checked());
    }
}

#[test]
#[ignore = "a sweep: PINNABLE_TEST_SWEEP=N measures the bars over N seeds"]
fn sweep_gray_cmyk_ycck() {
    sweep("gray_cmyk_ycck", |r, bars| {
        gray_cmyk_ycck(r, bars);
    });
}

#[test]
fn gray_cmyk_and_ycck_jpegs_come_out_rgb() {
    let mut r = rng("gray_cmyk_and_ycck_jpegs_come_out_rgb");
    let cmyk = gray_cmyk_ycck(&mut r, &mut Bars::checked());
    // CMYK with only its key plane at full resolution would come out in wrong colours: it is
    // refused, naming the reason.
    let mut odd = cmyk.clone();
    let sof = odd.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
    assert_eq!(odd[sof + 9], 4, "four components");
    odd[sof + 20] = 0x22; // the key plane's sampling factors
    let e = decode(&odd).unwrap_err();
    assert!(e.to_string().contains("key plane"), "{e}");
}

/// Every PNG colour type and bit depth: the decoded RGB is exactly the source's (alpha
/// dropped, 16 bits cut to the high byte, gray replicated, palette looked up) and exactly
/// zune-png's.
#[test]
fn png_pixels_are_exactly_the_source_s_and_a_second_decoder_s() {
    use png::{BitDepth as B, ColorType as C};
    let mut r = rng("png_pixels_are_exactly_the_source_s_and_a_second_decoder_s");
    let cases = [
        (C::Rgb, B::Eight),
        (C::Rgba, B::Eight),
        (C::Grayscale, B::Eight),
        (C::GrayscaleAlpha, B::Eight),
        (C::Rgb, B::Sixteen),
        (C::Rgba, B::Sixteen),
        (C::Grayscale, B::Sixteen),
        (C::GrayscaleAlpha, B::Sixteen),
        (C::Grayscale, B::One),
        (C::Grayscale, B::Two),
        (C::Grayscale, B::Four),
        (C::Indexed, B::Eight),
        (C::Indexed, B::Four),
    ];
    for (color, depth) in cases {
        let (w, h) = (r.random_range(1..40), r.random_range(1..40));
        let bits = depth as usize;
        let samples = match color {
            C::Rgb => 3,
            C::Rgba => 4,
            C::GrayscaleAlpha => 2,
            _ => 1,
        };
        // Random samples, packed as PNG rows (each row starts on a byte).
        let values: Vec<Vec<u16>> = (0..h)
            .map(|_| {
                (0..w * samples)
                    .map(|_| r.random_range(0..(1u32 << bits)) as u16)
                    .collect()
            })
            .collect();
        let mut data = Vec::new();
        for row in &values {
            match bits {
                16 => row.iter().for_each(|v| data.extend(v.to_be_bytes())),
                8 => data.extend(row.iter().map(|&v| v as u8)),
                _ => {
                    let mut packed = vec![0u8; (row.len() * bits).div_ceil(8)];
                    for (i, &v) in row.iter().enumerate() {
                        packed[i * bits / 8] |= (v as u8) << (8 - bits - (i * bits) % 8);
                    }
                    data.extend(packed);
                }
            }
        }
        let palette: Vec<u8> = (0..(3 << bits)).map(|_| r.random()).collect();
        let trns: Vec<u8> = (0..(1 << bits)).map(|_| r.random()).collect();
        let indexed = color == C::Indexed;
        let file = images::png(
            &data,
            w,
            h,
            color,
            depth,
            indexed.then_some(&palette[..]),
            (indexed && bits == 4).then_some(&trns[..]),
            None,
        );
        // What the rules make of each pixel.
        let to8 = |v: u16| match bits {
            16 => (v >> 8) as u8,
            8 => v as u8,
            b => (u32::from(v) * 255 / ((1 << b) - 1)) as u8,
        };
        let expected: Vec<u8> = values
            .iter()
            .flat_map(|row| row.chunks(samples).map(|p| p.to_vec()).collect::<Vec<_>>())
            .flat_map(|p| match color {
                C::Indexed => {
                    let i = usize::from(p[0]) * 3;
                    [palette[i], palette[i + 1], palette[i + 2]]
                }
                C::Rgb | C::Rgba => [to8(p[0]), to8(p[1]), to8(p[2])],
                _ => [to8(p[0]); 3],
            })
            .collect();
        let ours = decode(&file).unwrap();
        assert_eq!((ours.width(), ours.height()), (w, h), "{color:?} {depth:?}");
        assert!(
            ours.pixels() == expected,
            "{color:?} {depth:?}: not the source's pixels"
        );
        assert!(
            ours.pixels() == second_png(&file),
            "{color:?} {depth:?}: not zune-png's"
        );
    }
}

/// Stored pixel (sx, sy) of a picture stored with EXIF orientation `o`, for upright (x, y).
fn store(o: u16, upright: &[u8], w: usize, h: usize) -> (Vec<u8>, usize, usize) {
    let (sw, sh) = if o >= 5 { (h, w) } else { (w, h) };
    let mut stored = vec![0u8; w * h * 3];
    for y in 0..h {
        for x in 0..w {
            // The stored position each upright pixel comes from (the EXIF specification).
            let (sx, sy) = match o {
                1 => (x, y),
                2 => (sw - 1 - x, y),
                3 => (sw - 1 - x, sh - 1 - y),
                4 => (x, sh - 1 - y),
                5 => (y, x),
                6 => (y, sh - 1 - x),
                7 => (sw - 1 - y, sh - 1 - x),
                _ => (sw - 1 - y, x),
            };
            let (s, u) = ((sy * sw + sx) * 3, (y * w + x) * 3);
            stored[s..s + 3].copy_from_slice(&upright[u..u + 3]);
        }
    }
    (stored, sw, sh)
}

/// Pictures stored in each EXIF orientation come out upright: PNGs exactly, JPEGs within
/// their bar.
fn exif_upright(r: &mut SmallRng, bars: &mut Bars) {
    let (w, h) = (r.random_range(9..40), r.random_range(9..40));
    let upright = images::picture(r, w, h, 0.0);
    for o in 1..=8u16 {
        let (stored, sw, sh) = store(o, &upright, w, h);
        let exif = images::exif_orientation(o);
        let file = images::png(
            &stored,
            sw,
            sh,
            png::ColorType::Rgb,
            png::BitDepth::Eight,
            None,
            None,
            Some(&exif),
        );
        let ours = decode(&file).unwrap();
        assert_eq!(
            (ours.width(), ours.height()),
            (w, h),
            "png, orientation {o}"
        );
        assert!(
            ours.pixels() == upright,
            "png, orientation {o}: not upright"
        );
        let file = images::jpeg(&stored, sw, sh, 100, Jpeg::Full, Some(&exif));
        let ours = decode(&file).unwrap();
        assert_eq!(
            (ours.width(), ours.height()),
            (w, h),
            "jpeg, orientation {o}"
        );
        let (mean, _, _) = differences(ours.pixels(), &upright, 255);
        let case = format!("orientation {o}, {w}x{h}");
        bars.at_most("q100 4:4:4 mean from upright", mean, 1.2, case);
    }
}

#[test]
fn exif_orientation_turns_pngs_and_jpegs_upright() {
    let test = "exif_orientation_turns_pngs_and_jpegs_upright";
    exif_upright(&mut rng(test), &mut Bars::checked());
}

/// The JPEG bar, from `sweep_exif_upright` over 6000 seeds (three sweeps, 2026-11-28, 48000
/// values): the mean from upright at q100, 4:4:4, was at most 0.727 (0.1% 0.65); the bar is
/// 1.2 (a picture turned wrong, or one pixel off, gives 2.8 or more). The worst seed found.
#[test]
fn exif_orientation_at_the_worst_seed_found() {
    exif_upright(
        &mut SmallRng::seed_from_u64(13_567_495_764_524_699_337),
        &mut Bars::checked(),
    );
}

#[test]
#[ignore = "a sweep: PINNABLE_TEST_SWEEP=N measures the bars over N seeds"]
fn sweep_exif_upright() {
    sweep("exif_upright", exif_upright);
}

#[test]
fn bad_files_are_errors_naming_the_file_and_the_reason() {
    let mut r = rng("bad_files_are_errors_naming_the_file_and_the_reason");
    let (w, h) = (48, 32);
    let rgb = images::picture(&mut r, w, h, 6.0);
    let jpeg = images::jpeg(&rgb, w, h, 90, Jpeg::Baseline, None);
    let progressive = images::jpeg(&rgb, w, h, 90, Jpeg::Progressive, None);
    let png = images::png_rgb(&rgb, w, h);
    let mut corrupt_header = jpeg.clone();
    // The frame header's precision and size fields, after SOI and APP0.
    let sof = corrupt_header
        .windows(2)
        .position(|m| m == [0xFF, 0xC0])
        .unwrap();
    corrupt_header[sof + 4..sof + 9].copy_from_slice(&[0x11, 0, 0, 0, 0]);
    let mut bad_crc = png.clone();
    let n = bad_crc.len();
    bad_crc[n - 20] ^= 0x40; // inside the image data
    let cut = |b: &[u8], at: usize| b[..at].to_vec();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.jpg", Vec::new(), "empty"),
        (
            "text.jpg",
            b"not an image at all".to_vec(),
            "neither a JPEG nor a PNG",
        ),
        ("half.jpg", cut(&jpeg, jpeg.len() / 2), "truncated"),
        ("short.jpg", cut(&jpeg, jpeg.len() - 40), "truncated"),
        (
            "half-progressive.jpg",
            cut(&progressive, progressive.len() * 2 / 3),
            "truncated",
        ),
        ("header.jpg", cut(&jpeg, 40), "JPEG"),
        ("frame.jpg", corrupt_header, "corrupt JPEG"),
        ("half.png", cut(&png, png.len() / 2), "PNG"),
        ("crc.png", bad_crc, "PNG"),
    ];
    for (name, bytes, words) in cases {
        let e = Decoder::new()
            .decode(&bytes, Path::new("shelf").join(name).as_path())
            .unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(&e, Error::Image { path, .. } if path.ends_with(name)),
            "{name}: {e:?}"
        );
        assert!(text.contains(words), "{name}: {text}");
    }
    let e = Decoder::new()
        .max_pixels(w * h - 1)
        .decode(&jpeg, Path::new("big.jpg"))
        .unwrap_err();
    assert!(e.to_string().contains("over the limit"), "{e}");
    assert!(
        Decoder::new()
            .max_pixels(w * h)
            .decode(&jpeg, Path::new("ok.jpg"))
            .is_ok()
    );
}

/// Writes `n` pictures as `dir/NN.jpg`; returns their paths.
fn pictures(r: &mut SmallRng, dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let (w, h) = (r.random_range(20..60), r.random_range(20..60));
            let rgb = images::picture(r, w, h, 6.0);
            let path = dir.join(format!("{i:02}.jpg"));
            std::fs::write(&path, images::jpeg(&rgb, w, h, 90, Jpeg::Baseline, None)).unwrap();
            path
        })
        .collect()
}

#[test]
fn a_bad_file_fails_its_batch_naming_the_file_and_loses_nothing_else() {
    let mut r = rng("a_bad_file_fails_its_batch_naming_the_file_and_loses_nothing_else");
    let dir = TempDir::new(&mut r, "bad-file");
    let mut files = pictures(&mut r, &dir.0, 12);
    let bad = r.random_range(4..12);
    let bytes = std::fs::read(&files[bad]).unwrap();
    std::fs::write(&files[bad], &bytes[..bytes.len() / 2]).unwrap();
    files.push(dir.0.join("missing.jpg"));
    let transform = Transform::resized_center_crop(20, 16);
    let folder =
        ImageFolder::from_list(files.iter().enumerate().map(|(i, p)| (p.clone(), i as i64)));
    let codec = ImageCodec::new(transform.clone());
    let pool = PinnedPool::new(PoolConfig::default());
    let loader = Loader::builder(folder.clone())
        .batch_size(4)
        .workers(3)
        .pool(pool.clone())
        .build(ImageBatcher::new(codec.clone()))
        .unwrap();
    let mut delivered = 0;
    let mut failure = None;
    for batch in loader.run_epoch(0) {
        match batch {
            Ok((images, labels)) => {
                assert_eq!(images.shape(), &[4, 3, 16, 16]);
                let labels = labels.to_vec::<i64>().unwrap();
                let pixels = images.to_vec::<u8>().unwrap();
                for (row, &i) in pixels.chunks(768).zip(&labels) {
                    let file = folder.get(i as usize).unwrap();
                    let image = codec.decode(&file.bytes().unwrap(), file.path()).unwrap();
                    let rng = pinnable::loader::SplitMix64::new(0);
                    let want = transform
                        .apply(&image, rng)
                        .unwrap()
                        .to_vec::<u8>()
                        .unwrap();
                    assert!(row == want, "sample {i}'s pixels");
                }
                delivered += labels.len();
            }
            Err(e) => failure = Some(e),
        }
    }
    // Every batch before the bad one arrived whole; the bad one's error names the file.
    assert_eq!(delivered, bad / 4 * 4);
    let e = failure.expect("the bad batch's error");
    let Error::Sample {
        index,
        during,
        source,
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!((*index, *during), (bad, "writing in place"), "{e}");
    let path = files[bad].display().to_string();
    assert!(
        matches!(&**source, Error::Image { path: p, problem } if *p == path && problem.contains("truncated")),
        "{e}"
    );
    assert_eq!(
        pool.stats().in_use_bytes,
        0,
        "every block went back to the pool"
    );
    // A missing file is as clear.
    let e = ImageFolder::from_list([(files[12].clone(), 0)])
        .get(0)
        .unwrap()
        .bytes()
        .unwrap_err();
    assert!(
        e.to_string().contains("missing.jpg") && e.to_string().contains("cannot read"),
        "{e}"
    );
}

#[test]
fn crops_and_flips_are_reproducible_from_the_seed_and_change_across_epochs() {
    let mut r = rng("crops_and_flips_are_reproducible_from_the_seed_and_change_across_epochs");
    let dir = TempDir::new(&mut r, "crops");
    let files = pictures(&mut r, &dir.0, 10);
    // Each sample labelled by its index, to follow it across epochs.
    let folder =
        ImageFolder::from_list(files.iter().enumerate().map(|(i, p)| (p.clone(), i as i64)));
    let codec = ImageCodec::new(Transform::random_resized_crop(12).flip(0.5));
    let seed: u64 = r.random();
    // Sample index -> its pixels, for one epoch of a loader.
    let epoch = |seed: u64, workers: usize, epoch: u64| {
        let loader = Loader::builder(folder.clone())
            .batch_size(3)
            .shuffle(seed)
            .workers(workers)
            .build(ImageBatcher::new(codec.clone()))
            .unwrap();
        let mut by_index = vec![Vec::new(); 10];
        for b in loader.run_epoch(epoch) {
            let (images, labels) = b.unwrap();
            let labels = labels.to_vec::<i64>().unwrap();
            for (row, &i) in images.to_vec::<u8>().unwrap().chunks(432).zip(&labels) {
                by_index[i as usize] = row.to_vec();
            }
        }
        by_index
    };
    let first = epoch(seed, 1, 0);
    assert!(
        first.iter().all(|p| p.len() == 432),
        "every sample delivered once"
    );
    assert_eq!(
        first,
        epoch(seed, 3, 0),
        "the same seed and epoch on three workers"
    );
    let next = epoch(seed, 2, 1);
    let changed = first.iter().zip(&next).filter(|(a, b)| a != b).count();
    assert!(
        changed >= 8,
        "only {changed} of 10 crops changed in the next epoch"
    );
    let other = epoch(seed ^ 1, 2, 0);
    let changed = first.iter().zip(&other).filter(|(a, b)| a != b).count();
    assert!(
        changed >= 8,
        "only {changed} of 10 crops changed with another seed"
    );
}

#[test]
fn an_image_folder_lists_classes_and_files_as_torchvision_does() {
    let mut r = rng("an_image_folder_lists_classes_and_files_as_torchvision_does");
    let dir = TempDir::new(&mut r, "folder");
    let root = &dir.0;
    let png = images::png(
        &[7, 8, 9],
        1,
        1,
        png::ColorType::Rgb,
        png::BitDepth::Eight,
        None,
        None,
        None,
    );
    for f in [
        "dog/b.png",
        "dog/a.PNG",
        "dog/sub/c.jpeg",
        "dog/notes.txt",
        "cat/z.jpg",
        "cat/y.png",
    ] {
        let path = root.join(f);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, &png).unwrap();
    }
    std::fs::write(root.join("README.md"), "not a class").unwrap();
    let folder = ImageFolder::open(root).unwrap();
    assert_eq!(folder.classes(), ["cat", "dog"]);
    let listed: Vec<(String, i64)> = (0..folder.len())
        .map(|i| {
            let p = folder.path(i).unwrap().strip_prefix(root).unwrap();
            (p.display().to_string(), folder.label(i).unwrap())
        })
        .collect();
    let want = [
        ("cat/y.png", 0),
        ("cat/z.jpg", 0),
        ("dog/a.PNG", 1),
        ("dog/b.png", 1),
        ("dog/sub/c.jpeg", 1),
    ];
    assert_eq!(listed, want.map(|(p, l)| (p.to_string(), l)));
    // A .jpg holding a PNG decodes: the bytes decide the format.
    let file = folder.get(1).unwrap();
    let image = ImageCodec::default().decode(&file.bytes().unwrap(), file.path());
    assert_eq!(image.unwrap().pixels(), [7, 8, 9]);
    assert_eq!(folder.get(4).unwrap().label(), 1);
    assert!(matches!(
        folder.get(5),
        Err(Error::IndexOutOfRange { index: 5, len: 5 })
    ));
    // The errors name the folder at fault.
    std::fs::create_dir_all(root.join("empty")).unwrap();
    let e = ImageFolder::open(root).unwrap_err();
    assert!(
        matches!(&e, Error::ImageFolder { path, .. } if path.ends_with("empty")),
        "{e}"
    );
    let e = ImageFolder::open(root.join("dog/sub")).unwrap_err();
    assert!(e.to_string().contains("no class folder"), "{e}");
    let e = ImageFolder::open(root.join("nowhere")).unwrap_err();
    assert!(
        e.to_string().contains("nowhere") && e.to_string().contains("cannot list"),
        "{e}"
    );
}

#[test]
fn normalised_batches_are_the_u8_batches_normalised() {
    let mut r = rng("normalised_batches_are_the_u8_batches_normalised");
    let dir = TempDir::new(&mut r, "normalise");
    let files = pictures(&mut r, &dir.0, 4);
    let list = || ImageFolder::from_list(files.iter().map(|p| (p.clone(), 0)));
    let t = Transform::random_resized_crop(10).flip(0.5);
    let (mean, std) = (
        pinnable::formats::image::IMAGENET_MEAN,
        pinnable::formats::image::IMAGENET_STD,
    );
    let run = |t: Transform| -> Tensor {
        let loader = Loader::builder(list())
            .batch_size(4)
            .shuffle(3)
            .workers(2)
            .build(ImageBatcher::new(ImageCodec::new(t)))
            .unwrap();
        loader.run_epoch(5).next().unwrap().unwrap().0
    };
    let u8s = run(t.clone()).to_vec::<u8>().unwrap();
    let f32s = run(t.normalize(DType::F32, mean, std).unwrap());
    assert_eq!(f32s.dtype(), DType::F32);
    for (i, (&x, &y)) in u8s.iter().zip(&f32s.to_vec::<f32>().unwrap()).enumerate() {
        let c = i / 100 % 3;
        assert_eq!(
            y,
            f32::from(x).mul_add(1.0 / (255.0 * std[c]), -mean[c] / std[c]),
            "element {i}"
        );
    }
}

#[test]
fn hostile_bytes_give_an_image_or_an_error() {
    let mut r = rng("hostile_bytes_give_an_image_or_an_error");
    let rgb = images::picture(&mut r, 24, 16, 6.0);
    let exif = images::exif_orientation(6);
    let seeds = vec![
        images::jpeg(&rgb, 24, 16, 85, Jpeg::Baseline, Some(&exif)),
        images::jpeg(&rgb, 24, 16, 85, Jpeg::Progressive, None),
        images::jpeg(&rgb, 24, 16, 85, Jpeg::Gray, None),
        images::jpeg(&rgb, 24, 16, 85, Jpeg::Cmyk, None),
        images::png(
            &rgb,
            24,
            16,
            png::ColorType::Rgb,
            png::BitDepth::Eight,
            None,
            None,
            Some(&exif),
        ),
        images::png(
            &rgb[..24 * 16],
            24,
            16,
            png::ColorType::Indexed,
            png::BitDepth::Eight,
            Some(&[9; 768]),
            None,
            None,
        ),
    ];
    // Small images only: a mutated size field must not make the test allocate gigabytes.
    let mut decoder = Decoder::new().max_pixels(1 << 20);
    let ok = hostile::check(
        &mut r,
        &seeds,
        3000,
        std::time::Duration::from_secs(5),
        |b| decoder.decode(b, Path::new("hostile")).map(|i| i.width()),
    );
    assert!(
        ok > 0,
        "no mutation decoded: the mutations are all too harsh to test the happy path"
    );
}

#[test]
fn small_subsampled_jpegs_match_a_second_decoder_at_every_size() {
    use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
    let mut r = rng("small_subsampled_jpegs_match_a_second_decoder_at_every_size");
    let mut worst = Vec::new();
    for (name, sampling) in [
        ("4:2:0", SamplingFactor::R_4_2_0),
        ("4:2:2", SamplingFactor::R_4_2_2),
        ("4:4:4", SamplingFactor::R_4_4_4),
    ] {
        for w in 1..=17usize {
            // jpeg-decoder interpolates a chroma plane at most two samples wide, which libjpeg
            // (and so this crate) repeats: those pictures are checked against libjpeg-turbo's
            // decodes in `small_jpegs_match_libjpeg_turbo_s_decode_by_pillow`.
            if w <= 4 && name != "4:4:4" {
                continue;
            }
            for h in 1..=17usize {
                let rgb = images::picture(&mut r, w, h, 8.0);
                let mut file = Vec::new();
                let mut e = Encoder::new(&mut file, r.random_range(85..=95));
                e.set_sampling_factor(sampling);
                e.encode(&rgb, w as u16, h as u16, ColorType::Rgb).unwrap();
                let ours = decode(&file).unwrap();
                assert_eq!((ours.width(), ours.height()), (w, h));
                let (_, max, _) = differences(ours.pixels(), &second_jpeg(&file), 255);
                // The two inverse DCTs round differently by up to 3 on noisy pictures.
                if max > 3 {
                    worst.push(format!("{name} {w}x{h}: {max}"));
                }
            }
        }
    }
    assert!(worst.is_empty(), "over 3 from jpeg-decoder: {worst:?}");
}

#[test]
fn small_jpegs_match_libjpeg_turbo_s_decode_by_pillow() {
    // Written and decoded by Pillow 12 and 13 (libjpeg-turbo 3.2, fancy upsampling), sizes
    // from 1 × 1 to 17 × 17 at 4:2:0, 4:2:2 and 4:4:4, and pictures at most 4 pixels wide and
    // up to 40 tall, one of them progressive:
    // pinnable/tests/data/make_small_jpegs.py.
    let dir = pinnable_harness::fixture("pinnable/tests/data/small420");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jpg"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 42, "the reference files in {}", dir.display());
    let mut report = Vec::new();
    for file in &files {
        let reference = std::fs::read(file.with_extension("rgb")).unwrap();
        let ours = decode(&std::fs::read(file).unwrap()).unwrap();
        assert_eq!(ours.pixels().len(), reference.len(), "{}", file.display());
        let (_, max, _) = differences(ours.pixels(), &reference, 255);
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        println!("{name}: max {max} from libjpeg-turbo");
        // The pictures up to 4 pixels wide with halved chroma included: libjpeg repeats a
        // chroma plane at most two samples wide rather than interpolating it, and so do we
        // (they were 12 to 63 off when interpolated). What is left is the inverse DCT's
        // rounding, which differs between the decoders.
        if max > 3 {
            report.push(format!("{name}: {max}"));
        }
    }
    assert!(report.is_empty(), "over 3 from libjpeg-turbo: {report:?}");
}

/// Our 4:2:0 pixels against jpeg-decoder's (which upsamples chroma as libjpeg does) as a
/// device batch test sees them: a random crop to 32 × 32 of pictures 40 to 240 pixels across,
/// PSNR image by image; and apart, the difference on the picture's last column and row.
fn against_libjpeg_cropped(r: &mut SmallRng, bars: &mut Bars) {
    let t = Transform::random_resized_crop(32).flip(0.5);
    for i in 0..40 {
        let (w, h) = (40 + r.random_range(0..200), 40 + r.random_range(0..200));
        let rgb = images::picture(r, w, h, 6.0);
        let kind = [Jpeg::Baseline, Jpeg::Progressive][i % 2];
        let file = images::jpeg(&rgb, w, h, 85, kind, None);
        let (ours, theirs) = (decode(&file).unwrap(), second_jpeg(&file));
        let case = format!("{kind:?} {w}x{h}");
        let last = |k: usize| k / 3 % w == w - 1 || k / 3 / w == h - 1;
        let rms = |on_last: bool| {
            let d: Vec<f64> = (0..theirs.len())
                .filter(|&k| last(k) == on_last)
                .map(|k| f64::from(ours.pixels()[k].abs_diff(theirs[k])).powi(2))
                .collect();
            (d.iter().sum::<f64>() / d.len().max(1) as f64).sqrt()
        };
        bars.at_most("RMS difference inside", rms(false), 1.5, &case);
        bars.at_most(
            "RMS difference on the last column and row",
            rms(true),
            1.5,
            &case,
        );
        let theirs = Image::from_rgb(w, h, theirs).unwrap();
        let k = r.random::<u64>();
        let crop = |im: &Image| {
            let x = t.apply(im, pinnable::loader::SplitMix64::new(k)).unwrap();
            x.to_vec::<u8>().unwrap()
        };
        let (a, b) = (crop(&ours), crop(&theirs));
        let mse = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
            .sum::<f64>()
            / a.len() as f64;
        let psnr = 10.0 * (255.0f64.powi(2) / mse).log10();
        bars.at_least("PSNR of a random crop to 32, dB", psnr, 40.0, &case);
    }
}

/// Where the device tests' low PSNR comes from, found on the host: zune-jpeg interpolates the
/// last column (even widths) and row (even heights) of a halved chroma plane with the
/// encoder's padding, where libjpeg (and jpeg-decoder) repeat the plane's last sample (see
/// `Decoder::jpeg`). Over 1000 seeds (2026-11-28, 40 pictures each): inside, the RMS
/// difference was at most 0.79; on the last column and row it reached 21.4 (1% over 7.5, 15%
/// over 1.5), and a crop holding that line, scaled up, fell to 36.0 dB (8 crops of 40000
/// under 40 dB: 0.8% of 40-picture batches), as a device batch test once did (39.4 dB, a
/// baseline 86×50). With the last line taken from jpeg-decoder, no crop was under 50.1 dB. A
/// sweep, not a test, until the host decoder's last line is libjpeg's.
#[test]
#[ignore = "a sweep: PINNABLE_TEST_SWEEP=N measures the bars over N seeds"]
fn sweep_against_libjpeg_cropped() {
    sweep("against_libjpeg_cropped", against_libjpeg_cropped);
}
