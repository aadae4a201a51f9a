use std::path::Path;

use half::{bf16, f16};
use jpeg_encoder::{ColorType, Encoder, SamplingFactor};

use super::nvjpeg::{Library, status_name};
use super::plan::{Jobs, JpegInfo, model, probe};
use super::*;
use crate::dtype::DType;
use crate::formats::image::{
    Decoder, IMAGENET_MEAN, IMAGENET_STD, Image, ImageCodec, Transform, orient,
};
use crate::loader::SplitMix64;

/// A fresh seed each run, printed with the line that reruns it.
pub(super) fn seed(test: &str) -> u64 {
    crate::test_seed::seed(test)
}

fn pixels(rng: &mut SplitMix64, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

/// The transforms the device path takes, one of each kind, sized for `w × h` pictures.
fn transforms(rng: &mut SplitMix64) -> Vec<Transform> {
    let size = 1 + rng.below(24) as usize;
    let resize = size + rng.below(16) as usize;
    vec![
        Transform::resized_center_crop(resize, size),
        Transform::center_crop(size),
        Transform::random_resized_crop(size).flip(0.5),
        Transform::resized_center_crop(resize, size)
            .flip(0.5)
            .normalize(DType::F32, IMAGENET_MEAN, IMAGENET_STD)
            .expect("valid normalisation"),
        Transform::random_resized_crop(size)
            .normalize(DType::BF16, IMAGENET_MEAN, IMAGENET_STD)
            .expect("valid normalisation"),
        Transform::center_crop(size)
            .normalize(DType::F16, IMAGENET_MEAN, IMAGENET_STD)
            .expect("valid normalisation"),
    ]
}

/// The kernels' model on `stored` (with `orientation`) against the host transform on the
/// upright picture, element for element: equal, or one step of the 8-bit value apart where
/// the host filters down first (Pillow's order for pictures shrinking most in height), which
/// the device never does.
fn compare<T: Copy + PartialEq + std::fmt::Debug + 'static>(
    t: &Transform,
    stored: &Image,
    orientation: u8,
    rng: SplitMix64,
    table: &[T],
    host: &[T],
) {
    let mut upright = stored.clone();
    orient::apply(orientation, &mut upright, &mut Vec::new());
    let mut jobs = Jobs::default();
    let plan = jobs
        .push(t, (stored.width(), stored.height()), orientation, rng)
        .expect("plan");
    let size = t.shape()[1];
    let mut out = vec![table[0]; 3 * size * size];
    model(
        &jobs.jobs[0],
        &jobs.taps,
        stored.pixels(),
        table,
        size,
        &mut out,
    );
    // The same picture stored as three planes (as nvJPEG's planar output leaves it) makes
    // the same output.
    let (w, h) = (stored.width(), stored.height());
    let mut planar = vec![0u8; 3 * w * h];
    for (i, px) in stored.pixels().chunks(3).enumerate() {
        for c in 0..3 {
            planar[c * w * h + i] = px[c];
        }
    }
    let mut job = jobs.jobs[0];
    job.set_planar();
    assert_eq!(job.src_bytes(), planar.len());
    let mut from_planes = vec![table[0]; 3 * size * size];
    model(&job, &jobs.taps, &planar, table, size, &mut from_planes);
    assert!(out == from_planes, "{t:?}: planar input made other output");
    job.set_interleaved();
    assert_eq!(job, jobs.jobs[0]);
    let vertical_first = plan.resized.1 < plan.crop.h
        && plan.crop.h - plan.resized.1 > 2 * plan.crop.w.saturating_sub(plan.resized.0);
    let plane = size * size;
    // Whether `d` and `h` are the channel's outputs of two 8-bit values at most one apart.
    let near = |ch: usize, d: &T, h: &T| {
        let t = &table[ch * 256..][..256];
        (0..256).any(|a| t[a] == *d && (a.saturating_sub(1)..(a + 2).min(256)).any(|b| t[b] == *h))
    };
    for (i, (d, h)) in out.iter().zip(host).enumerate() {
        if d == h {
            continue;
        }
        assert!(
            vertical_first && near(i / plane, d, h),
            "{t:?} on a {}×{} picture, orientation {orientation}, plan {plan:?}: element {i} \
             is {d:?} on the device's model, {h:?} on the host",
            stored.width(),
            stored.height()
        );
    }
}

#[test]
fn the_kernels_model_makes_the_host_transforms_pixels_for_every_orientation() {
    let mut rng = SplitMix64::new(seed("model"));
    for _ in 0..60 {
        let (w, h) = (1 + rng.below(40) as usize, 1 + rng.below(40) as usize);
        let stored = Image::from_rgb(w, h, pixels(&mut rng, w * h * 3)).expect("picture");
        let orientation = 1 + rng.below(8) as u8;
        for t in transforms(&mut rng) {
            let draws = SplitMix64::new(rng.next_u64());
            let mut upright = stored.clone();
            orient::apply(orientation, &mut upright, &mut Vec::new());
            let host = t.apply(&upright, draws.clone()).expect("host transform");
            let table = t.table_bytes();
            match t.dtype() {
                DType::U8 => compare(
                    &t,
                    &stored,
                    orientation,
                    draws.clone(),
                    &table,
                    &host.to_vec::<u8>().unwrap(),
                ),
                DType::F32 => {
                    let table: Vec<f32> = table
                        .chunks(4)
                        .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
                        .collect();
                    compare(
                        &t,
                        &stored,
                        orientation,
                        draws.clone(),
                        &table,
                        &host.to_vec::<f32>().unwrap(),
                    )
                }
                DType::F16 => {
                    let table: Vec<u16> = table
                        .chunks(2)
                        .map(|b| u16::from_ne_bytes(b.try_into().unwrap()))
                        .collect();
                    let host: Vec<u16> = host
                        .to_vec::<f16>()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    compare(&t, &stored, orientation, draws.clone(), &table, &host)
                }
                DType::BF16 => {
                    let table: Vec<u16> = table
                        .chunks(2)
                        .map(|b| u16::from_ne_bytes(b.try_into().unwrap()))
                        .collect();
                    let host: Vec<u16> = host
                        .to_vec::<bf16>()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    compare(&t, &stored, orientation, draws.clone(), &table, &host)
                }
                other => panic!("no such output type: {other}"),
            }
        }
    }
}

/// A TIFF block recording `orientation`.
fn exif(orientation: u16) -> Vec<u8> {
    let mut b = b"MM\0*".to_vec();
    b.extend(8u32.to_be_bytes());
    b.extend(1u16.to_be_bytes());
    b.extend(0x0112u16.to_be_bytes());
    b.extend(3u16.to_be_bytes());
    b.extend(1u32.to_be_bytes());
    b.extend(orientation.to_be_bytes());
    b.extend([0, 0]);
    b.extend(0u32.to_be_bytes());
    b
}

fn encode(rgb: &[u8], w: usize, h: usize, kind: u64, orientation: u16) -> (Vec<u8>, u8, u8) {
    let mut out = Vec::new();
    let mut e = Encoder::new(&mut out, 90);
    let (sof, comps) = match kind {
        0 => {
            e.set_sampling_factor(SamplingFactor::R_4_2_0);
            (0, 3)
        }
        1 => {
            e.set_sampling_factor(SamplingFactor::R_4_4_4);
            (0, 3)
        }
        2 => {
            e.set_sampling_factor(SamplingFactor::R_4_2_2);
            (0, 3)
        }
        3 => {
            e.set_progressive(true);
            (2, 3)
        }
        _ => (0, 1),
    };
    if orientation != 0 {
        e.add_exif_metadata(&exif(orientation)).expect("exif");
    }
    let ct = if comps == 1 {
        ColorType::Luma
    } else {
        ColorType::Rgb
    };
    let data: Vec<u8> = if comps == 1 {
        rgb.iter().step_by(3).copied().collect()
    } else {
        rgb.to_vec()
    };
    e.encode(&data, w as u16, h as u16, ct).expect("encode");
    (out, sof, comps)
}

#[test]
fn headers_give_the_size_kind_and_orientation_the_host_decoder_turns_upright() {
    let mut rng = SplitMix64::new(seed("headers"));
    for _ in 0..30 {
        let (w, h) = (1 + rng.below(70) as usize, 1 + rng.below(70) as usize);
        let rgb = pixels(&mut rng, w * h * 3);
        let kind = rng.below(5);
        let orientation = rng.below(9) as u16;
        let (file, sof, components) = encode(&rgb, w, h, kind, orientation);
        let info = probe(&file).expect("a JPEG's headers");
        assert_eq!(
            info,
            JpegInfo {
                width: w,
                height: h,
                components,
                sof,
                orientation: orientation.max(1) as u8,
                subsampled: matches!(kind, 0 | 2),
            }
        );
        assert_eq!(info.for_nvjpeg(), !(info.subsampled && (w <= 4 || h <= 4)));
        let mut d = Decoder::new();
        let image = d.decode(&file, Path::new("x.jpg")).expect("decodes");
        assert_eq!(info.upright(), (image.width(), image.height()));
        // The crop box and flip drawn from the headers are the host path's, for any draws.
        let t = Transform::random_resized_crop(8).flip(0.5);
        let draws = SplitMix64::new(rng.next_u64());
        let mut jobs = Jobs::default();
        let from_headers = jobs
            .push(
                &t,
                (info.width, info.height),
                info.orientation,
                draws.clone(),
            )
            .expect("plan");
        let from_pixels = t
            .plan(image.width(), image.height(), &mut draws.clone())
            .expect("plan");
        assert_eq!(from_headers, from_pixels);
    }
}

#[test]
fn headers_of_what_nvjpeg_cannot_take_send_it_to_the_host() {
    let mut rng = SplitMix64::new(seed("refused"));
    let (file, ..) = encode(&pixels(&mut rng, 8 * 8 * 3), 8, 8, 0, 0);
    // Cut inside the headers: no frame header.
    let sof = file
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("a frame");
    assert_eq!(probe(&file[..sof + 3]), None);
    assert_eq!(probe(b"\x89PNG\r\n\x1a\n"), None);
    // A lossless frame (SOF3) and a four-component one are not for nvJPEG.
    let mut lossless = file.clone();
    lossless[sof + 1] = 0xC3;
    assert!(!probe(&lossless).expect("headers").for_nvjpeg());
    let mut four = file.clone();
    four[sof + 9] = 4;
    assert!(!probe(&four).expect("headers").for_nvjpeg());
    // Fuzzed headers give an answer, never a panic.
    for _ in 0..2000 {
        let mut f = file.clone();
        let cut = rng.below(f.len() as u64) as usize;
        f.truncate(cut.max(2));
        let at = rng.below(f.len() as u64) as usize;
        f[at] = rng.next_u64() as u8;
        let _ = probe(&f);
    }
}

#[test]
fn a_missing_override_is_the_answer_and_says_what_to_do() {
    let missing = std::env::temp_dir().join(format!("no-nvjpeg-{}/libnvjpeg.so", seed("missing")));
    let m = missing.display().to_string();
    let env = |k: &str| (k == "PINNABLE_NVJPEG").then(|| m.clone());
    let err = Library::load(&env).err().expect("nothing at that path");
    assert!(err.contains(&format!("PINNABLE_NVJPEG={m}")), "{err}");
    assert!(err.contains("unset it"), "{err}");
    // A library without nvJPEG's entry points is refused by name.
    let env = |k: &str| (k == "PINNABLE_NVJPEG").then(|| "libm.so.6".to_string());
    let err = Library::load(&env).err().expect("libm is not nvJPEG");
    assert!(err.contains("no symbol nvjpegCreateEx"), "{err}");
    // Without a library the host decodes, and the reason is the loader's.
    let choice = choose(&Device::cpu(), Err(err.clone()));
    assert_eq!(choice.decoder, JpegDecoder::Cpu);
    assert_eq!(choice.reason, err);
    assert!(
        choice.to_string().starts_with("the host decoder ("),
        "{choice}"
    );
    assert_eq!(gpu_decoder(&Device::cpu()).decoder, JpegDecoder::Cpu);
}

#[test]
fn statuses_are_named_as_the_header_names_them() {
    assert_eq!(status_name(7), "NVJPEG_STATUS_ARCH_MISMATCH");
    assert_eq!(status_name(3), "NVJPEG_STATUS_BAD_JPEG");
    assert_eq!(status_name(10), "NVJPEG_STATUS_INCOMPLETE_BITSTREAM");
    assert_eq!(status_name(42), "nvJPEG status 42");
}

#[test]
fn the_host_share_takes_the_same_positions_of_every_batch() {
    let mut rng = SplitMix64::new(seed("share"));
    let share = (rng.below(1000) as f64) / 1000.0;
    let b = ImageCodec::default().cpu_share(share);
    let n = 64 + rng.below(200) as usize;
    let taken: Vec<usize> = (0..n).filter(|&p| b.host_share(p)).collect();
    assert_eq!(
        taken.len(),
        (n as f64 * share).floor() as usize,
        "share {share} of {n}"
    );
    assert!(
        ImageCodec::default()
            .cpu_share(1.0)
            .host_share(rng.below(99) as usize)
    );
    assert!(!ImageCodec::default().cpu_share(f64::NAN).host_share(0));
    // A forced decoder is for the GPU: a batch for the host is decoded there.
    let forced = ImageCodec::default().jpeg_decoder(JpegDecoder::Cuda);
    assert_eq!(forced.chosen(&Device::cpu()).decoder, JpegDecoder::Cpu);
    assert!(
        !forced
            .decodes_on_gpu(&Device::cpu())
            .expect("Auto takes the host")
    );
    let host = ImageCodec::default().decode_on(crate::formats::image::DecodeOn::Host);
    assert_eq!(host.chosen(&Device::cpu()).decoder, JpegDecoder::Cpu);
    let device = ImageCodec::default().decode_on(crate::formats::image::DecodeOn::Device);
    let err = device
        .decodes_on_gpu(&Device::cpu())
        .expect_err("no GPU to decode on");
    assert!(err.to_string().contains("DecodeOn::Device"), "{err}");
}

#[test]
fn a_job_is_laid_out_as_the_kernels_read_it() {
    // `image.cu`'s `Job`: its fields in order, two u64s then eighteen u32s.
    let cu = include_str!("../../../../kernels/image.cu");
    let body = &cu[cu.find("struct Job {").expect("struct Job")..];
    let body = &body[..body.find("};").expect("end of struct Job")];
    let fields: Vec<(&str, &str)> = body
        .lines()
        .skip(1)
        .filter_map(|l| {
            let l = l.split("//").next()?.trim().strip_suffix(';')?;
            l.split_once(' ')
        })
        .collect();
    let rust = [
        "src",
        "mid",
        "src_w",
        "src_h",
        "pitch",
        "orient",
        "crop_x",
        "crop_y",
        "ncols",
        "nrows",
        "x0",
        "y0",
        "flip",
        "span0",
        "span_rows",
        "ntap_c",
        "ntap_r",
        "taps_c",
        "taps_r",
        "plane",
    ];
    assert_eq!(fields.iter().map(|f| f.1).collect::<Vec<_>>(), rust);
    assert!(fields[..2].iter().all(|f| f.0 == "u64") && fields[2..].iter().all(|f| f.0 == "u32"));
    assert_eq!(std::mem::size_of::<super::plan::Job>(), 2 * 8 + 18 * 4);
    assert_eq!(std::mem::align_of::<super::plan::Job>(), 8);
}

/// Hostile bytes: the header probe that routes a file to nvJPEG never panics, reads only what
/// is there, and what it reports of a frame is what the frame header says (sizes of 16 bits,
/// an EXIF orientation from 1 to 8); whatever it accepts for nvJPEG is a Huffman-coded frame of
/// one or three components with a size.
#[test]
fn fuzzed_headers_probe_within_their_bytes() {
    let mut rng = SplitMix64::new(seed("probe_fuzz"));
    let seeds: Vec<Vec<u8>> = (0..6)
        .map(|k| {
            let (w, h) = (1 + rng.below(40) as usize, 1 + rng.below(40) as usize);
            let rgb = pixels(&mut rng, w * h * 3);
            encode(&rgb, w, h, k % 5, (k % 9) as u16).0
        })
        .collect();
    crate::fuzz::Fuzz::new("jpeg_probe")
        .seeds(seeds)
        .tokens(crate::formats::image::decode::tests::JPEG_TOKENS)
        .run(|bytes| {
            let Some(info) = probe(bytes) else {
                return Ok(());
            };
            if info.width > 65535 || info.height > 65535 || !(1..=8).contains(&info.orientation) {
                return Err(format!("{info:?}"));
            }
            if !bytes.starts_with(&[0xFF, 0xD8]) {
                return Err(format!("{info:?} from bytes that are not a JPEG"));
            }
            if info.for_nvjpeg()
                && (info.sof > 2
                    || !matches!(info.components, 1 | 3)
                    || info.width == 0
                    || info.height == 0)
            {
                return Err(format!("{info:?} accepted for nvJPEG"));
            }
            Ok(())
        });
}

/// Pictures that share an axis's taps (one size under one centre crop) share them in the
/// batch's table, and the jobs read the taps a batch of one would.
#[test]
fn jobs_of_one_size_share_their_taps() {
    let mut rng = SplitMix64::new(seed("shared_taps"));
    let (w, h) = (20 + rng.below(300) as usize, 20 + rng.below(300) as usize);
    let t = Transform::resized_center_crop(16 + rng.below(8) as usize, 16);
    let alone = |size: (usize, usize)| {
        let mut one = Jobs::default();
        one.push(&t, size, 1, SplitMix64::new(1)).expect("plan");
        one
    };
    let mut jobs = Jobs::default();
    let sizes = [(w, h), (w, h), (w + 1, h), (w, h)];
    for (k, &size) in sizes.iter().enumerate() {
        jobs.push(&t, size, 1, SplitMix64::new(k as u64))
            .expect("plan");
    }
    let taps = |j: &crate::formats::image::gpu::plan::Job, table: &[i32]| {
        let c = &table[j.taps_c as usize..][..j.ncols as usize * (1 + j.ntap_c as usize)];
        let r = &table[j.taps_r as usize..][..j.nrows as usize * (1 + j.ntap_r as usize)];
        (c.to_vec(), r.to_vec(), j.span0, j.span_rows)
    };
    for (k, &size) in sizes.iter().enumerate() {
        let one = alone(size);
        assert_eq!(
            taps(&jobs.jobs[k], &jobs.taps),
            taps(&one.jobs[0], &one.taps),
            "job {k}"
        );
    }
    assert_eq!(jobs.jobs[0].taps_c, jobs.jobs[1].taps_c);
    assert_eq!(jobs.jobs[0].taps_r, jobs.jobs[3].taps_r);
    assert_ne!(jobs.jobs[0].taps_c, jobs.jobs[2].taps_c);
    // Two sizes' worth of columns, one of rows: the table holds nothing twice.
    let one = alone((w, h));
    assert!(jobs.taps.len() < 3 * one.taps.len());
    jobs.clear();
    jobs.push(&t, (w, h), 1, SplitMix64::new(0)).expect("plan");
    assert_eq!(jobs.taps, one.taps);
}
