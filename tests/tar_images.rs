//! Image members of tar shards (feature `image`): JPEG and PNG members decoded as the image
//! folder decodes their files, and only members in a decoded format taken as the image.

use std::path::PathBuf;

use pinnable::formats::image::{
    IMAGENET_MEAN, IMAGENET_STD, ImageBatcher, ImageCodec, ImageFolder, Transform,
};
use pinnable::formats::tar::{TarImageBatcher, TarShards};
use pinnable::loader::Loader;
use pinnable::{DType, Error, Tensor};
use pinnable_harness::images::{self, Jpeg};
use pinnable_harness::rng;
use pinnable_harness::tar::{Sample, folder, shard};
use rand::Rng;

/// A batch as (images, labels).
fn rows(batch: pinnable::Result<(Tensor, Tensor)>) -> (Vec<u8>, Vec<i64>) {
    let (x, y) = batch.unwrap();
    (x.to_vec::<u8>().unwrap(), y.to_vec::<i64>().unwrap())
}

#[test]
fn jpeg_and_png_members_decode_as_the_image_folder_decodes_their_files() {
    let mut r = rng("jpeg_and_png_members_decode_as_the_image_folder_decodes_their_files");
    let dir = folder("images");
    let mut files = Vec::new();
    let mut samples = Vec::new();
    for i in 0..9 {
        let (w, h) = (r.random_range(17..60), r.random_range(17..60));
        let rgb = images::picture(&mut r, w, h, 6.0);
        let (ext, bytes) = if i % 3 == 2 {
            ("PNG", images::png_rgb(&rgb, w, h))
        } else {
            ("jpg", images::jpeg(&rgb, w, h, 90, Jpeg::Baseline, None))
        };
        let label = r.random_range(0..100i64);
        let path = dir.join(format!("{i}.{ext}"));
        std::fs::write(&path, &bytes).unwrap();
        files.push((path, label));
        samples.push((
            format!("{i:03}"),
            vec![
                (ext.to_owned(), bytes),
                ("cls".into(), label.to_string().into_bytes()),
            ],
        ));
    }
    std::fs::write(dir.join("images.tar"), shard(&samples).0).unwrap();
    let transform = Transform::resized_center_crop(20, 16);
    let codec = ImageCodec::new(transform);
    let folder = ImageFolder::from_list(files);
    let want: Vec<(Vec<u8>, Vec<i64>)> = Loader::builder(folder)
        .batch_size(4)
        .workers(2)
        .build(ImageBatcher::new(codec.clone()))
        .unwrap()
        .iter()
        .map(|b| {
            let (x, y) = b.unwrap();
            (x.to_vec::<u8>().unwrap(), y.to_vec::<i64>().unwrap())
        })
        .collect();
    let shards = TarShards::open([dir.join("images.tar").to_str().unwrap()]).unwrap();
    let got: Vec<(Vec<u8>, Vec<i64>)> = Loader::builder(shards)
        .batch_size(4)
        .workers(3)
        .build(TarImageBatcher::new(codec))
        .unwrap()
        .iter()
        .map(|b| {
            let (x, y) = b.unwrap();
            assert_eq!(&x.shape()[1..], &[3, 16, 16]);
            (x.to_vec::<u8>().unwrap(), y.to_vec::<i64>().unwrap())
        })
        .collect();
    assert_eq!(got.len(), 3);
    assert_eq!(got, want);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The bytes of a WebP file (a RIFF container): never decoded, whatever follows its header.
fn webp(r: &mut impl Rng) -> Vec<u8> {
    let body: Vec<u8> = (0..r.random_range(16..200)).map(|_| r.random()).collect();
    let mut out = b"RIFF".to_vec();
    out.extend(((body.len() + 4) as u32).to_le_bytes());
    out.extend(b"WEBPVP8 ");
    out.extend(body);
    out
}

/// Samples holding a `.webp` and a `.png` (the WebP written first) decode their PNG: the
/// batches equal the image folder's over the PNG files.
#[test]
fn a_sample_holding_webp_and_png_decodes_its_png() {
    let mut r = rng("a_sample_holding_webp_and_png_decodes_its_png");
    let dir = folder("webp-png");
    let mut files = Vec::new();
    let mut samples: Vec<Sample> = Vec::new();
    for i in 0..r.random_range(4..12) {
        let (w, h) = (r.random_range(17..60), r.random_range(17..60));
        let rgb = images::picture(&mut r, w, h, 6.0);
        let png = images::png_rgb(&rgb, w, h);
        let label = r.random_range(0..100i64);
        let path = dir.join(format!("{i}.png"));
        std::fs::write(&path, &png).unwrap();
        files.push((path, label));
        samples.push((
            format!("{i:03}"),
            vec![
                ("webp".into(), webp(&mut r)),
                ("png".into(), png),
                ("cls".into(), label.to_string().into_bytes()),
            ],
        ));
    }
    std::fs::write(dir.join("s.tar"), shard(&samples).0).unwrap();
    let transform = Transform::resized_center_crop(20, 16);
    let codec = ImageCodec::new(transform);
    let folder = ImageFolder::from_list(files);
    let loader = Loader::builder(folder)
        .batch_size(4)
        .workers(2)
        .build(ImageBatcher::new(codec.clone()));
    let want: Vec<_> = loader.unwrap().iter().map(rows).collect();
    let shards = TarShards::open([dir.join("s.tar").to_str().unwrap()]).unwrap();
    let loader = Loader::builder(shards).batch_size(4).workers(2);
    let got: Vec<_> = loader
        .build(TarImageBatcher::new(codec))
        .unwrap()
        .iter()
        .map(rows)
        .collect();
    assert_eq!(got.len(), samples.len().div_ceil(4));
    assert_eq!(got, want);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A sample whose only image is a `.webp` fails its batch with an error naming the shard, the
/// sample and the member's format, and the formats that are decoded; the batches before it
/// are made.
#[test]
fn a_sample_whose_only_image_is_webp_is_an_error_naming_it_and_the_formats_decoded() {
    let mut r = rng("a_sample_whose_only_image_is_webp_is_an_error");
    let dir = folder("webp-only");
    let n: usize = r.random_range(8..20);
    let bad = r.random_range(0..n);
    let (mut samples, mut labels) = (Vec::new(), Vec::new());
    for i in 0..n {
        let label = r.random_range(0..100i64);
        let (ext, bytes) = if i == bad {
            ("WebP", webp(&mut r))
        } else {
            let (w, h) = (r.random_range(17..40), r.random_range(17..40));
            let rgb = images::picture(&mut r, w, h, 6.0);
            ("jpg", images::jpeg(&rgb, w, h, 90, Jpeg::Baseline, None))
        };
        labels.push(label);
        samples.push((
            format!("k{i:03}"),
            vec![
                (ext.into(), bytes),
                ("cls".into(), label.to_string().into_bytes()),
            ],
        ));
    }
    let (bytes, starts) = shard(&samples);
    let path = dir.join("s.tar");
    std::fs::write(&path, bytes).unwrap();
    let shards = TarShards::open([path.to_str().unwrap()]).unwrap();
    let loader = Loader::builder(shards)
        .batch_size(4)
        .workers(2)
        .build(TarImageBatcher::new(ImageCodec::new(
            Transform::resized_center_crop(20, 16),
        )))
        .unwrap();
    let out: Vec<_> = loader.iter().collect();
    // The epoch ends at the failed batch.
    assert_eq!(out.len(), bad / 4 + 1);
    for (b, batch) in out.iter().enumerate() {
        if b != bad / 4 {
            let want = &labels[4 * b..4 * b + 4];
            assert_eq!(batch.as_ref().unwrap().1.to_vec::<i64>().unwrap(), want);
            continue;
        }
        let err = batch.as_ref().unwrap_err();
        let Error::Sample { index, source, .. } = err else {
            panic!("{err}")
        };
        assert_eq!(*index, bad);
        let Error::Tar {
            shard,
            offset,
            problem,
        } = &**source
        else {
            panic!("{err}")
        };
        assert_eq!((PathBuf::from(shard), *offset), (path.clone(), starts[bad]));
        for part in [
            format!("`k{bad:03}`"),
            "`.webp`".into(),
            "`.jpg`".into(),
            "`.png`".into(),
        ] {
            assert!(problem.contains(&part), "{part} in {problem}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A batch's images as the bits of their elements (`u8` or `f32`) and its labels, or the
/// error's text.
type Bits = Result<(Vec<u32>, Vec<i64>), String>;

/// A batch as [`Bits`].
fn bits(batch: pinnable::Result<(Tensor, Tensor)>) -> Bits {
    let (x, y) = batch.map_err(|e| e.to_string())?;
    let x = match x.dtype() {
        DType::U8 => x
            .to_vec::<u8>()
            .unwrap()
            .into_iter()
            .map(u32::from)
            .collect(),
        _ => x
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect(),
    };
    Ok((x, y.to_vec::<i64>().unwrap()))
}

/// Each sample's row (its elements' bits) by its label, the labels being unique; the error's
/// text where a batch failed.
fn by_label(batches: Vec<Bits>) -> (std::collections::BTreeMap<i64, Vec<u32>>, Vec<String>) {
    let (mut rows, mut errors) = (std::collections::BTreeMap::new(), Vec::new());
    for b in batches {
        match b {
            Ok((x, y)) => {
                let per = x.len() / y.len();
                for (row, label) in x.chunks(per).zip(y) {
                    assert!(rows.insert(label, row.to_vec()).is_none(), "{label} twice");
                }
            }
            Err(e) => errors.push(e),
        }
    }
    (rows, errors)
}

/// One `ImageCodec` (a random crop with flips drawn from the loader's seed, a random output
/// dtype, a limit on pixels) given once to the folder's batcher and to the tar batcher: the
/// same bytes (JPEGs of several kinds, some turned by EXIF, PNGs) make bit-equal rows for each
/// sample in both (the two containers shuffle into different orders; a sample's crop is drawn
/// from the seed, the epoch and its index), epoch after epoch; and a limit under the largest
/// picture is refused by both, naming that picture's sample.
#[test]
fn one_codec_makes_the_same_rows_from_a_folder_and_from_tar_shards() {
    let mut r = rng("one_codec_makes_the_same_rows_from_a_folder_and_from_tar_shards");
    let dir = folder("one-codec");
    let n: usize = r.random_range(9..24);
    let base = r.random_range(0..1000i64);
    let (mut files, mut samples, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let (w, h) = (r.random_range(17..70), r.random_range(17..70));
        let rgb = images::picture(&mut r, w, h, 6.0);
        let exif = images::exif_orientation(r.random_range(1..=8));
        let exif = r.random_bool(0.5).then_some(exif.as_slice());
        let (ext, bytes) = match r.random_range(0..4) {
            0 => ("png", images::png_rgb(&rgb, w, h)),
            1 => (
                "jpeg",
                images::jpeg(&rgb, w, h, 85, Jpeg::Progressive, exif),
            ),
            2 => ("jpg", images::jpeg(&rgb, w, h, 90, Jpeg::Full, exif)),
            _ => ("jpg", images::jpeg(&rgb, w, h, 90, Jpeg::Baseline, exif)),
        };
        let label = base + i as i64;
        let path = dir.join(format!("{i}.{ext}"));
        std::fs::write(&path, &bytes).unwrap();
        files.push((path, label));
        sizes.push(w * h);
        samples.push((
            format!("{i:03}"),
            vec![
                (ext.to_owned(), bytes),
                ("cls".into(), label.to_string().into_bytes()),
            ],
        ));
    }
    std::fs::write(dir.join("s.tar"), shard(&samples).0).unwrap();
    let tar = dir.join("s.tar");
    let size = r.random_range(4..20);
    let mut transform = Transform::random_resized_crop(size).flip(0.5);
    if r.random_bool(0.5) {
        transform = transform
            .normalize(DType::F32, IMAGENET_MEAN, IMAGENET_STD)
            .unwrap();
    }
    let largest = *sizes.iter().max().unwrap();
    let (seed, batch, epoch) = (
        r.random::<u64>(),
        r.random_range(2..6),
        r.random_range(0..9),
    );
    let run = |codec: &ImageCodec, epoch: u64| {
        let folder = ImageFolder::from_list(files.clone());
        let from_files: Vec<_> = Loader::builder(folder)
            .batch_size(batch)
            .shuffle(seed)
            .workers(2)
            .build(ImageBatcher::new(codec.clone()))
            .unwrap()
            .run_epoch(epoch)
            .map(bits)
            .collect::<Vec<_>>();
        let shards = TarShards::open([tar.to_str().unwrap()]).unwrap();
        let from_tar: Vec<_> = Loader::builder(shards)
            .batch_size(batch)
            .shuffle(seed)
            .workers(3)
            .build(TarImageBatcher::new(codec.clone()))
            .unwrap()
            .run_epoch(epoch)
            .map(bits)
            .collect::<Vec<_>>();
        (by_label(from_files), by_label(from_tar))
    };
    // Every picture under the limit: the same rows, and other crops in another epoch.
    let codec = ImageCodec::new(transform).max_pixels(largest);
    let (files_0, tar_0) = run(&codec, epoch);
    assert_eq!(files_0.0.len(), n, "{:?}", files_0.1);
    assert_eq!(tar_0, files_0, "seed {seed}, epoch {epoch}");
    let (files_1, tar_1) = run(&codec, epoch + 1);
    assert_eq!(tar_1, files_1);
    let changed = (files_0.0.iter().zip(&files_1.0))
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        changed > n / 2,
        "{changed} of {n} crops changed in the next epoch"
    );
    // The limit under the largest picture: both refuse it, naming its sample, and every row
    // made before is the same.
    let refusing = codec.max_pixels(largest - 1);
    let (files_2, tar_2) = run(&refusing, epoch);
    for (rows, errors) in [&files_2, &tar_2] {
        assert_eq!(errors.len(), 1, "{errors:?}");
        let err = &errors[0];
        assert!(err.contains("over the limit"), "{err}");
        let index: usize = err["sample ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(sizes[index], largest, "{err}");
        for (label, row) in rows {
            assert_eq!(Some(row), files_0.0.get(label), "sample {}", label - base);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
