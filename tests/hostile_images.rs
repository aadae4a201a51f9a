//! Hostile image files: every one is refused or decoded within 100 ms and 64 MiB of memory
//! above what the process held before it, and a refusal names the file. The cases: tiny real
//! JPEGs and PNGs (PNG as RGB, RGBA, gray and 16-bit gray) whose headers declare 4096²,
//! 8000², 12000², 20000² and 65535² pixels, the same files cut short, random bytes (with and
//! without a JPEG or PNG signature), and files of zeros or of nothing.
//!
//! The peak is the kernel's high-water mark of resident memory (`VmHWM`), reset before each
//! case by writing `5` to `/proc/self/clear_refs`. It is process-wide, so this file holds one
//! test and nothing else runs beside it.

use std::path::Path;
use std::time::Duration;

use pinnable::formats::image::{Decoder, ImageCodec, ImageFolder};
use pinnable::loader::Dataset;
use pinnable_harness::images::{self, Jpeg};
use pinnable_harness::{peak, rng};
use rand::Rng;

const TIME: Duration = Duration::from_millis(100);
const MEMORY: u64 = 64 << 20;

/// The IEEE CRC-32 PNG chunks end with.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// `png` (starting with its IHDR chunk) declaring `width × height`, its CRC redone.
fn png_declaring(png: &[u8], width: u32, height: u32) -> Vec<u8> {
    let mut f = png.to_vec();
    assert_eq!(&f[12..16], b"IHDR");
    f[16..20].copy_from_slice(&width.to_be_bytes());
    f[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = crc32(&f[12..29]);
    f[29..33].copy_from_slice(&crc.to_be_bytes());
    f
}

/// `jpeg` with its frame header declaring `width × height`.
fn jpeg_declaring(jpeg: &[u8], width: u16, height: u16) -> Vec<u8> {
    let mut f = jpeg.to_vec();
    let sof = f
        .windows(2)
        .position(|w| w[0] == 0xFF && matches!(w[1], 0xC0..=0xC2))
        .expect("a frame header");
    f[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    f[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    f
}

/// One outcome: the case, what happened, how long it took and the memory it raised the peak by.
struct Outcome {
    case: String,
    result: Result<(usize, usize), String>,
    took: Duration,
    peak: u64,
}

#[test]
fn hostile_image_files_are_refused_or_decoded_in_bounded_time_and_memory() {
    if !peak::gauge_works() {
        println!("skipped: the peak resident memory cannot be reset here (/proc/self/clear_refs)");
        return;
    }
    let mut r = rng("hostile_image_files_are_refused_or_decoded_in_bounded_time_and_memory");
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    let one = images::picture(&mut r, 1, 1, 0.0);
    let jpegs = [
        (
            "jpeg-420",
            images::jpeg(&one, 1, 1, 90, Jpeg::Baseline, None),
        ),
        ("jpeg-444", images::jpeg(&one, 1, 1, 90, Jpeg::Full, None)),
        (
            "jpeg-progressive",
            images::jpeg(&one, 1, 1, 90, Jpeg::Progressive, None),
        ),
        ("jpeg-gray", images::jpeg(&one, 1, 1, 90, Jpeg::Gray, None)),
    ];
    let png = |color, depth, px: &[u8]| images::png(px, 1, 1, color, depth, None, None, None);
    use png::{BitDepth, ColorType};
    let pngs = [
        ("png-rgb", png(ColorType::Rgb, BitDepth::Eight, &one)),
        (
            "png-rgba",
            png(
                ColorType::Rgba,
                BitDepth::Eight,
                &[one[0], one[1], one[2], 255],
            ),
        ),
        (
            "png-gray",
            png(ColorType::Grayscale, BitDepth::Eight, &one[..1]),
        ),
        (
            "png-gray16",
            png(ColorType::Grayscale, BitDepth::Sixteen, &one[..2]),
        ),
    ];
    for side in [4096u16, 8000, 12000, 20000, 65535] {
        for (name, f) in &jpegs {
            cases.push((format!("{name}-{side}.jpg"), jpeg_declaring(f, side, side)));
        }
        for (name, f) in &pngs {
            let s = u32::from(side);
            cases.push((format!("{name}-{side}.png"), png_declaring(f, s, s)));
        }
    }
    // Real pictures cut short at random points, and whole (the decoder still decodes).
    let (w, h) = (r.random_range(40..120), r.random_range(30..90));
    let picture = images::picture(&mut r, w, h, 4.0);
    let whole = [
        (
            "cut-jpeg",
            images::jpeg(&picture, w, h, 90, Jpeg::Baseline, None),
        ),
        (
            "cut-progressive",
            images::jpeg(&picture, w, h, 90, Jpeg::Progressive, None),
        ),
        (
            "cut-png",
            images::png(
                &picture,
                w,
                h,
                ColorType::Rgb,
                BitDepth::Eight,
                None,
                None,
                None,
            ),
        ),
    ];
    for (name, f) in &whole {
        cases.push((format!("{name}-whole"), f.clone()));
        for _ in 0..8 {
            let cut = r.random_range(0..f.len());
            cases.push((format!("{name}-at-{cut}"), f[..cut].to_vec()));
        }
    }
    for k in 0..8 {
        let n = r.random_range(0..4096);
        let mut bytes: Vec<u8> = (0..n).map(|_| r.random()).collect();
        let signature: &[u8] = match k % 3 {
            0 => &[0xFF, 0xD8, 0xFF],
            1 => b"\x89PNG\r\n\x1a\n",
            _ => &[],
        };
        bytes.splice(0..0, signature.iter().copied());
        cases.push((format!("random-{k}"), bytes));
    }
    cases.push(("empty".into(), Vec::new()));
    cases.push(("zeros".into(), vec![0; 4096]));
    cases.push((
        "jpeg-zeros".into(),
        [&[0xFF, 0xD8, 0xFF][..], &[0; 4096]].concat(),
    ));
    cases.push((
        "png-zeros".into(),
        [&b"\x89PNG\r\n\x1a\n"[..], &[0; 4096]].concat(),
    ));

    let mut outcomes = Vec::new();
    for (case, bytes) in &cases {
        let path = format!("hostile/{case}");
        let (result, took, peak) = peak::measure_best(TIME, || {
            let mut d = Decoder::new();
            d.decode(bytes, Path::new(&path))
                .map(|i| {
                    assert_eq!(i.pixels().len(), i.width() * i.height() * 3, "{case}");
                    (i.width(), i.height())
                })
                .map_err(|e| e.to_string())
        });
        if let Err(e) = &result {
            assert!(
                e.contains(&path),
                "{case}: the error does not name the file: {e}"
            );
        }
        let what = match &result {
            Ok((w, h)) => format!("decoded {w}x{h}"),
            Err(e) => format!("refused: {}", e.chars().take(90).collect::<String>()),
        };
        println!(
            "{case:<28} {:>9.2} ms {:>8.1} MiB  {what}",
            took.as_secs_f64() * 1e3,
            peak as f64 / f64::from(1 << 20)
        );
        outcomes.push(Outcome {
            case: case.clone(),
            result,
            took,
            peak,
        });
    }
    // The files as a folder's samples: the same answers, naming the file on disk.
    let dir = std::env::temp_dir().join(format!(
        "pinnable-hostile-{}-{:x}",
        std::process::id(),
        r.random::<u64>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let files: Vec<_> = cases.iter().map(|(c, _)| (dir.join(c), 0)).collect();
    for ((path, _), (_, bytes)) in files.iter().zip(&cases) {
        std::fs::write(path, bytes).unwrap();
    }
    let folder = ImageFolder::from_list(files.clone());
    let codec = ImageCodec::default();
    for (i, o) in outcomes.iter().enumerate() {
        let file = folder.get(i).unwrap();
        let again = file
            .bytes()
            .and_then(|b| codec.decode(&b, file.path()))
            .map(|im| (im.width(), im.height()));
        match (&o.result, again) {
            (Ok(a), Ok(b)) => assert_eq!(*a, b, "{}", o.case),
            (Err(_), Err(e)) => {
                let named = files[i].0.display().to_string();
                assert!(e.to_string().contains(&named), "{}: {e}", o.case);
            }
            (a, b) => panic!("{}: the decoder gave {a:?}, the folder {b:?}", o.case),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);

    let mut over = Vec::new();
    for o in &outcomes {
        if o.took > TIME || o.peak > MEMORY {
            over.push(format!(
                "{} ({:.1} ms, {:.1} MiB)",
                o.case,
                o.took.as_secs_f64() * 1e3,
                o.peak as f64 / f64::from(1 << 20)
            ));
        }
    }
    let (ok, refused) = outcomes.iter().fold((0, 0), |(a, b), o| {
        (
            a + usize::from(o.result.is_ok()),
            b + usize::from(o.result.is_err()),
        )
    });
    assert!(
        ok >= 3,
        "the whole pictures decode ({ok} decoded, {refused} refused)"
    );
    assert!(
        over.is_empty(),
        "over {TIME:?} or {} MiB: {over:?}",
        MEMORY >> 20
    );
}
