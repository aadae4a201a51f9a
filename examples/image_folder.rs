//! An image classifier's input: a folder of JPEG files (one subfolder per class, written here
//! first), decoded by the loader's workers straight into pinned batches of `u8` pixels, moved
//! to the GPU when there is one, and consumed by a per-batch step. Four epochs: training
//! crops (random-resized crop + flip); the same normalised to `f32` on the host (four times
//! the bytes over the link); the same with `u8` over the link, normalised to `f32` on the
//! device by the gather kernels (`Gather` + `Convert::normalize`), checked against the host's
//! formula; and evaluation crops (resize + center crop), whose every pixel is checked against
//! a decode of the file on its own. Prints the loader's figures per epoch.
//!
//!     cargo run --release --features image --example image_folder
//!     cargo run --release --features image --example image_folder -- --per-class 200 --workers 8
//!
//! Options: `--classes N`, `--per-class N`, `--batch-size N`, `--workers N`, `--cpu` (stay on
//! the host even with a GPU).

use std::path::PathBuf;
use std::time::Instant;

use pinnable::formats::image::{
    DecodeOn, IMAGENET_MEAN, IMAGENET_STD, ImageBatcher, ImageCodec, ImageFolder, Transform,
};
use pinnable::loader::{Dataset, Loader, SplitMix64};
use pinnable::{Convert, DType, Device, Gather, ToDevice};
use pinnable_harness::images;
use rand::SeedableRng;

struct Options {
    classes: usize,
    per_class: usize,
    batch_size: usize,
    workers: usize,
    cpu: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        classes: 4,
        per_class: 48,
        batch_size: 32,
        workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--classes" => o.classes = number("--classes")?,
            "--per-class" => o.per_class = number("--per-class")?,
            "--batch-size" => o.batch_size = number("--batch-size")?,
            "--workers" => o.workers = number("--workers")?,
            "--cpu" => o.cpu = true,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

/// The host path's codec for `transform`: this example shows the workers decoding, `u8`
/// crossing the link (with the default `DecodeOn::Auto`, a GPU with nvJPEG decodes instead).
fn on_host(transform: &Transform) -> ImageBatcher {
    ImageBatcher::new(ImageCodec::new(transform.clone()).decode_on(DecodeOn::Host))
}

/// Runs one epoch of `folder` through the loader, its images made as `transform` says; `step`
/// sees each batch back on the host (every batch on the host, one in eight on a GPU, where the
/// others are only waited for).
#[allow(clippy::too_many_arguments)]
fn epoch(
    o: &Options,
    device: &Device,
    name: &str,
    folder: ImageFolder,
    transform: &Transform,
    shuffle: bool,
    mut step: impl FnMut(usize, &pinnable::Tensor, &[i64]) -> pinnable::Result<()>,
) -> pinnable::Result<()> {
    let mut builder = Loader::builder(folder)
        .batch_size(o.batch_size)
        .workers(o.workers)
        .device(device.clone());
    if shuffle {
        builder = builder.shuffle(7);
    }
    let loader = builder.build(on_host(transform))?;
    let started = Instant::now();
    let mut images = 0;
    for (i, batch) in loader.iter().enumerate() {
        let (x, y) = batch?;
        images += y.shape()[0];
        if device.is_cpu() || i % 8 == 0 {
            let (x, y) = (x, y).to_cpu(false)?;
            step(i, &x, y.as_slice::<i64>()?)?;
        } else if let Some(ready) = x.ready_event() {
            ready.synchronize()?;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "\n{name}: {images} images in {:.1} ms, {:.0} images/s",
        seconds * 1e3,
        images as f64 / seconds
    );
    if let Some(stats) = loader.stats() {
        println!("{stats}");
    }
    Ok(())
}

fn main() -> pinnable::Result<()> {
    let o = options().map_err(pinnable::Error::other)?;
    let dir: PathBuf = std::env::temp_dir().join(format!("image-folder-{}", std::process::id()));
    let mut r = rand::rngs::SmallRng::seed_from_u64(11);
    let bytes = images::write_folder(&mut r, &dir, o.classes, o.per_class, (500, 375));
    let files = o.classes * o.per_class;
    let device = match Device::cuda(0) {
        Ok(d) if !o.cpu => d,
        _ => Device::cpu(),
    };
    println!(
        "{files} JPEGs of 500x375 (quality 90, {:.1} KiB each) in {} classes; batches of {}, \
         {} worker threads, on {device}",
        bytes as f64 / files as f64 / 1024.0,
        o.classes,
        o.batch_size,
        o.workers
    );
    let classes = o.classes as i64;
    let check_labels = |y: &[i64]| {
        assert!(y.iter().all(|&l| (0..classes).contains(&l)), "labels {y:?}");
    };

    // Training: u8 pixels cross the link; a model normalises them on the device.
    let train = Transform::random_resized_crop(224).flip(0.5);
    let folder = ImageFolder::open(&dir)?;
    epoch(&o, &device, "train, u8", folder, &train, true, |_, x, y| {
        assert_eq!(
            (x.dtype(), x.shape()),
            (DType::U8, &[y.len(), 3, 224, 224][..])
        );
        check_labels(y);
        Ok(())
    })?;

    // The same, normalised on the host: f32 written in place, four times the bytes moved.
    let normalised = train
        .clone()
        .normalize(DType::F32, IMAGENET_MEAN, IMAGENET_STD)?;
    let folder = ImageFolder::open(&dir)?;
    epoch(
        &o,
        &device,
        "train, f32 normalised on the host",
        folder,
        &normalised,
        true,
        |_, x, y| {
            assert_eq!(x.dtype(), DType::F32);
            let v = x.as_slice::<f32>()?;
            assert!(
                v.iter().all(|p| p.is_finite() && p.abs() < 3.0),
                "normalised pixels"
            );
            check_labels(y);
            Ok(())
        },
    )?;

    // Training with u8 over the link and f32 made on the device: the loader keeps each batch
    // in pinned memory (no `.device(...)`), and a `Gather` of its rows moves it, the gather
    // kernels reading the pinned u8 pixels and writing `(x / 255 - mean) / std` into the
    // batch's device allocation (on the host, the same conversion in Rust, bit for bit).
    let folder = ImageFolder::open(&dir)?;
    let loader = Loader::builder(folder)
        .batch_size(o.batch_size)
        .workers(o.workers)
        .shuffle(7)
        .build(on_host(&train))?;
    let normalize = Convert::normalize(DType::F32, &IMAGENET_MEAN, &IMAGENET_STD)?;
    let started = Instant::now();
    let (mut images, mut checked_rows) = (0, 0);
    for (i, batch) in loader.iter().enumerate() {
        let (x, y) = batch?; // pinned u8 [n, 3, 224, 224], i64 [n]
        let n = y.shape()[0];
        images += n;
        let moved = Gather::rows(&x, 0..n)?
            .convert(normalize.clone())?
            .to_device(&device, true)?;
        let x_f32 = moved.tensor()?; // f32 [n, 3, 224, 224] on the device
        assert_eq!((x_f32.dtype(), x_f32.shape()), (DType::F32, x.shape()));
        if i % 8 == 0 {
            // One batch in eight back on the host, checked against the formula.
            let got = x_f32.to_cpu(false)?;
            let (got, pixels) = (got.as_slice::<f32>()?, x.as_slice::<u8>()?);
            let plane = 224 * 224;
            for (k, (&g, &p)) in got.iter().zip(pixels).enumerate() {
                let c = (k / plane) % 3;
                let want = (p as f32 / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
                assert!((g - want).abs() < 1e-5, "element {k}: {g} against {want}");
            }
            checked_rows += n;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "\ntrain, u8 over the link, f32 normalised on {device}: {images} images in {:.1} ms, \
         {:.0} images/s; {checked_rows} rows checked against the formula",
        seconds * 1e3,
        images as f64 / seconds
    );

    // Evaluation: deterministic crops, each row checked against the file decoded on its own.
    let eval = Transform::resized_center_crop(256, 224);
    let folder = ImageFolder::open(&dir)?;
    let alone = folder.clone();
    let codec = ImageCodec::new(eval.clone());
    let per = 3 * 224 * 224;
    let (batch_size, mut checked) = (o.batch_size, 0);
    epoch(&o, &device, "eval, u8", folder, &eval, false, |i, x, y| {
        let pixels = x.as_slice::<u8>()?;
        for (row, &label) in y.iter().enumerate() {
            let index = i * batch_size + row;
            assert_eq!(Some(label), alone.label(index));
            let file = alone.get(index)?;
            let want = codec.load(&file.bytes()?, file.path(), SplitMix64::new(0))?;
            assert!(
                pixels[row * per..(row + 1) * per] == *want.as_slice::<u8>()?,
                "sample {index}: the batch's pixels are not the file's"
            );
            checked += 1;
        }
        Ok(())
    })?;
    println!("\neval: {checked} of {files} images checked pixel for pixel");
    assert_eq!(alone.len(), files);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
