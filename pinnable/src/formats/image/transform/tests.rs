use super::*;

/// The synthetic image the PIL cases were computed on.
fn synthetic(w: usize, h: usize) -> Image {
    let mut px = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            for c in 0..3 {
                px.push(((x * 37 + y * 91 + c * 53 + (x * y) % 7 * 19) % 256) as u8);
            }
        }
    }
    Image::from_rgb(w, h, px).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `crop` of `image` resized to `size × size`, with no flip.
fn resized_crop(image: &Image, crop: Rect, size: usize) -> Vec<u8> {
    let plan = Plan {
        crop,
        resized: (size, size),
        at: (0, 0),
        flip: false,
    };
    let mut out = vec![0u8; 3 * size * size];
    write(
        image,
        &plan,
        size,
        &mut out,
        &mut Resampler::default(),
        |_, v| v,
    );
    out
}

#[test]
fn pixels_are_pil_s_for_torchvision_s_transforms() {
    let cases = include_str!("../../../../tests/data/pil_resize.txt");
    let lines: Vec<&str> = cases.lines().filter(|l| !l.starts_with('#')).collect();
    let rng = || SplitMix64::new(0);
    let mut checked = 0;
    for pair in lines.chunks(2) {
        let (case, expected) = (pair[0], hex(pair[1]));
        let got = match case {
            "resized_center_crop(12, 10) of 23x17" => {
                Transform::resized_center_crop(12, 10).apply(&synthetic(23, 17), rng())
            }
            "resized_center_crop(16, 16) of 97x61" => {
                Transform::resized_center_crop(16, 16).apply(&synthetic(97, 61), rng())
            }
            "resized_center_crop(12, 10) of 7x5" => {
                Transform::resized_center_crop(12, 10).apply(&synthetic(7, 5), rng())
            }
            "resized_center_crop(12, 10) of 17x23" => {
                Transform::resized_center_crop(12, 10).apply(&synthetic(17, 23), rng())
            }
            "center_crop(10) of 9x7" => Transform::center_crop(10).apply(&synthetic(9, 7), rng()),
            "crop (3, 2, 15, 11) of 23x17 resized to 8x8" => {
                let crop = Rect {
                    x: 3,
                    y: 2,
                    w: 15,
                    h: 11,
                };
                Tensor::from_vec(resized_crop(&synthetic(23, 17), crop, 8), &[3, 8, 8])
            }
            "crop (10, 1, 5, 14) of 23x17 resized to 8x8" => {
                let crop = Rect {
                    x: 10,
                    y: 1,
                    w: 5,
                    h: 14,
                };
                Tensor::from_vec(resized_crop(&synthetic(23, 17), crop, 8), &[3, 8, 8])
            }
            "resized_center_crop(16, 12) of 20x61" => {
                Transform::resized_center_crop(16, 12).apply(&synthetic(20, 61), rng())
            }
            "crop (5, 0, 30, 41) of 40x41 resized to 20x20" => {
                let crop = Rect {
                    x: 5,
                    y: 0,
                    w: 30,
                    h: 41,
                };
                Tensor::from_vec(resized_crop(&synthetic(40, 41), crop, 20), &[3, 20, 20])
            }
            other => panic!("unknown case {other}"),
        };
        let got = got.unwrap().to_vec::<u8>().unwrap();
        let diffs = got.iter().zip(&expected).filter(|(a, b)| a != b).count();
        assert_eq!(got.len(), expected.len(), "{case}");
        assert_eq!(
            diffs,
            0,
            "{case}: {diffs} of {} values differ from PIL's",
            got.len()
        );
        checked += 1;
    }
    assert_eq!(checked, 9);
}

#[test]
fn flipping_mirrors_every_row() {
    let image = synthetic(31, 22);
    let t = Transform::resized_center_crop(20, 16);
    let plain = t
        .apply(&image, SplitMix64::new(1))
        .unwrap()
        .to_vec::<u8>()
        .unwrap();
    let flipped = t.flip(1.0).apply(&image, SplitMix64::new(1)).unwrap();
    let flipped = flipped.to_vec::<u8>().unwrap();
    for (a, b) in plain.chunks(16).zip(flipped.chunks(16)) {
        let mirrored: Vec<u8> = a.iter().rev().copied().collect();
        assert_eq!(b, &mirrored[..]);
    }
}

/// 2000 random crops of pictures of many sizes, each drawn from its own seed of `seed`'s
/// stream, each inside its picture and the same again from the same seed; the least and the
/// largest share of the picture's area of those of pictures over 2000 pixels.
fn crop_area_span(seed: u64) -> (f64, f64) {
    let t = Transform::random_resized_crop(8);
    let mut seeds = SplitMix64::new(seed);
    let mut areas = Vec::new();
    for i in 0..2000 {
        let (w, h) = (1 + i % 97, 1 + (i * 7) % 61);
        let seed = seeds.next_u64();
        let plan = t.plan(w, h, &mut SplitMix64::new(seed)).unwrap();
        let c = plan.crop;
        assert!(
            c.w >= 1 && c.h >= 1 && c.x + c.w <= w && c.y + c.h <= h,
            "{plan:?} of {w}x{h}"
        );
        let again = t.plan(w, h, &mut SplitMix64::new(seed)).unwrap();
        assert_eq!(plan, again, "the same draws give the same crop");
        if (w, h) == (96, 60) || w * h > 2000 {
            areas.push((c.w * c.h) as f64 / (w * h) as f64);
        }
    }
    areas
        .iter()
        .fold((1.0f64, 0.0f64), |(l, h), &a| (l.min(a), h.max(a)))
}

/// The crops' area shares span about 0.08..1. Over 1000 seeds (2026-11-28,
/// `sweep_crop_area_span`, 593 crops a run) the least share of a run was 0.075 to 0.085 and
/// the largest 0.891 to 1 (under 0.9, the old bar, for 0.1 to 1 % of seeds); the bars, under
/// 0.12 and over 0.8, hold with room, while a scale range starting at 0.15, or ending at 0.75,
/// crosses them every time.
#[test]
fn random_crops_stay_inside_and_follow_the_draws() {
    let (lo, hi) = crop_area_span(crate::test_seed::seed("random_crops"));
    assert_crop_area_span(lo, hi);
}

fn assert_crop_area_span(lo: f64, hi: f64) {
    assert!(
        lo < 0.12 && hi > 0.8,
        "area shares span {lo:.3}..{hi:.3}, not about 0.08..1"
    );
}

/// The seeds of the sweep's highest least share and lowest largest share.
#[test]
fn random_crops_at_the_worst_seeds_found() {
    for seed in [12_948_336_785_267_583_726, 11_435_537_839_680_858_149] {
        let (lo, hi) = crop_area_span(seed);
        assert_crop_area_span(lo, hi);
    }
}

#[test]
#[ignore = "a sweep: PINNABLE_TEST_SWEEP=N measures the bars over N seeds"]
fn sweep_crop_area_span() {
    crate::test_seed::sweep("least crop share", |s| {
        let (lo, hi) = crop_area_span(s);
        (lo, format!("largest {hi:.4}"))
    });
    crate::test_seed::sweep("largest crop share", |s| {
        let (lo, hi) = crop_area_span(s);
        (hi, format!("least {lo:.4}"))
    });
}

#[test]
fn normalised_pixels_are_the_u8_pixels_normalised() {
    let image = synthetic(40, 30);
    let (mean, std) = (IMAGENET_MEAN, IMAGENET_STD);
    let t = Transform::random_resized_crop(12).flip(0.5);
    let u8s = t
        .apply(&image, SplitMix64::new(9))
        .unwrap()
        .to_vec::<u8>()
        .unwrap();
    let f = t.clone().normalize(DType::F32, mean, std).unwrap();
    let f32s = f
        .apply(&image, SplitMix64::new(9))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let b = t.normalize(DType::BF16, mean, std).unwrap();
    let bf16s = b
        .apply(&image, SplitMix64::new(9))
        .unwrap()
        .to_vec::<bf16>()
        .unwrap();
    for (i, ((&x, &y), &z)) in u8s.iter().zip(&f32s).zip(&bf16s).enumerate() {
        let c = i / 144;
        let want = f32::from(x).mul_add(1.0 / (255.0 * std[c]), -mean[c] / std[c]);
        assert_eq!(y, want, "element {i}");
        assert_eq!(z, bf16::from_f32(want), "element {i}");
    }
    assert!(
        Transform::center_crop(4)
            .normalize(DType::U8, mean, std)
            .is_err()
    );
    assert!(
        Transform::center_crop(4)
            .normalize(DType::F32, mean, [0.0; 3])
            .is_err()
    );
}

#[test]
fn sizes_that_cannot_be_represented_are_errors_not_panics() {
    let seed = crate::test_seed::seed("sizes_that_cannot_be_represented");
    let mut rng = SplitMix64::new(seed);
    let (w, h) = (1 + rng.below(40) as usize, 1 + rng.below(40) as usize);
    let colour = [0; 3].map(|_: u8| rng.next_u64() as u8);
    let image = Image::from_rgb(w, h, colour.repeat(w * h)).unwrap();
    let f32s = |t: Transform| t.normalize(DType::F32, [0.5; 3], [0.25; 3]).unwrap();
    for t in [
        Transform::center_crop(1 << 32),
        Transform::center_crop(usize::MAX),
        Transform::center_crop(MAX_SIDE + 1),
        Transform::resized_center_crop(usize::MAX / 2, 8),
        Transform::resized_center_crop(MAX_SIDE + 1, 8),
        Transform::resized_center_crop(8, usize::MAX / 2),
        Transform::random_resized_crop(usize::MAX),
        Transform::random_resized_crop(1 << 31).flip(1.0),
        f32s(Transform::center_crop(1_500_000_000)),
        f32s(Transform::resized_center_crop(usize::MAX, 4)),
    ] {
        let e = t.apply(&image, SplitMix64::new(seed)).unwrap_err();
        assert!(matches!(e, Error::Config { .. }), "{t:?}: {e}");
        assert!(e.to_string().contains("limit") || e.to_string().contains("cannot"));
    }
    // A resize whose longer side alone goes over: a tall image, its width to MAX_SIDE / 2.
    let tall = Image::from_rgb(1, 3, colour.repeat(3)).unwrap();
    let t = Transform::resized_center_crop(MAX_SIDE / 2, 4);
    let e = t.apply(&tall, SplitMix64::new(seed)).unwrap_err();
    assert!(e.to_string().contains("longer side"), "{e}");
    // Inside the limits, the output is still computed: a one-colour image upscaled about
    // 2^24 times is that colour everywhere.
    let t = Transform::resized_center_crop(1 << 24, 4);
    let x = t.apply(&image, SplitMix64::new(seed)).unwrap();
    assert_eq!(
        x.to_vec::<u8>().unwrap(),
        [[colour[0]; 16], [colour[1]; 16], [colour[2]; 16]].concat()
    );
}
