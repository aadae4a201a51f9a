//! Images decoded on the workers and resized where the batch lands
//! ([`ImageBatcher::on_device`]): on the host, the batch is the CPU path's exactly; on a GPU,
//! every value is within 1 (as `u8`) of the CPU path's, for random image sizes, crops, flips
//! and output types; the pinned pixels may be dropped and their block reused right after a
//! non-blocking move.

use std::path::{Path, PathBuf};

use pinnable::image::{IMAGENET_MEAN, IMAGENET_STD, ImageBatcher, ImageFolder, Transform};
use pinnable::loader::{Batcher, Collator, Dataset, Loader};
use pinnable::{BatchLayout, DType, Device, PinnedPool, PoolConfig, Tensor, ToDevice};
use pinnable_harness::images::{self, Jpeg};
use pinnable_harness::{cuda_or_skip, rng};
use rand::Rng;
use rand::rngs::SmallRng;

/// `n` JPEGs of random sizes (some smaller than the crops, some much larger) under a folder of
/// the test's own; the folder and the files.
fn pictures(r: &mut SmallRng, name: &str, n: usize) -> (PathBuf, Vec<(PathBuf, i64)>) {
    let dir = std::env::temp_dir().join(format!(
        "pinnable-{name}-{}-{}",
        std::process::id(),
        r.random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let files = (0..n)
        .map(|i| {
            let big = r.random_bool(0.2);
            let (w, h) = if big {
                (r.random_range(200..700), r.random_range(150..500))
            } else {
                (r.random_range(5..120), r.random_range(5..120))
            };
            let rgb = images::picture(r, w, h, 6.0);
            let path = dir.join(format!("{i:03}.jpg"));
            std::fs::write(&path, images::jpeg(&rgb, w, h, 90, Jpeg::Baseline, None)).unwrap();
            (path, i as i64)
        })
        .collect();
    (dir, files)
}

/// A random transform: any of the three crops at a random size, maybe flipped, `u8` or
/// normalised to a random float type; and the same writing `u8`.
fn transforms(r: &mut SmallRng) -> (Transform, Transform) {
    let size = r.random_range(1..70);
    let t = match r.random_range(0..3) {
        0 => Transform::center_crop(size),
        1 => Transform::resized_center_crop(size + r.random_range(0..40), size),
        _ => Transform::random_resized_crop(size),
    };
    let t = t.flip(r.random_range(0.0..1.0));
    let dtype = [DType::U8, DType::F32, DType::F16, DType::BF16][r.random_range(0..4)];
    let out = match dtype {
        DType::U8 => t.clone(),
        d => t.clone().normalize(d, IMAGENET_MEAN, IMAGENET_STD).unwrap(),
    };
    (out, t)
}

fn loader<B: Batcher<pinnable::image::ImageFile> + 'static>(
    files: &[(PathBuf, i64)],
    t: &Transform,
    seed: u64,
    device: &Device,
    batcher: B,
) -> Loader<ImageFolder, B>
where
    B::Batch: ToDevice + 'static,
{
    let folder = ImageFolder::from_list(files.iter().cloned()).transform(t.clone());
    Loader::builder(folder)
        .batch_size(7)
        .shuffle(seed)
        .workers(2)
        .device(device.clone())
        .build(batcher)
        .unwrap()
}

/// The CPU path's batches of one epoch: images and labels.
fn cpu_batches(files: &[(PathBuf, i64)], t: &Transform, seed: u64) -> Vec<(Tensor, Tensor)> {
    loader(files, t, seed, &Device::cpu(), ImageBatcher)
        .epoch(1)
        .map(|b| b.unwrap())
        .collect()
}

fn cleanup(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn on_the_host_the_batch_is_the_cpu_path_s() {
    let mut r = rng("on_the_host_the_batch_is_the_cpu_path_s");
    let (dir, files) = pictures(&mut r, "ragged-host", 30);
    for _ in 0..6 {
        let (t, _) = transforms(&mut r);
        let seed = r.random();
        let want = cpu_batches(&files, &t, seed);
        let got = loader(&files, &t, seed, &Device::cpu(), ImageBatcher::on_device());
        let mut n = 0;
        for ((images, labels), (x, y)) in got.epoch(1).map(|b| b.unwrap()).zip(&want) {
            assert!(images.is_pending());
            assert_eq!(labels.to_vec::<i64>().unwrap(), y.to_vec::<i64>().unwrap());
            let images = images.into_tensor().unwrap();
            assert_eq!(
                (images.shape(), images.dtype()),
                (x.shape(), x.dtype()),
                "{t:?}"
            );
            assert_eq!(
                pinnable_harness::bytes_of(&images),
                pinnable_harness::bytes_of(x),
                "{t:?}"
            );
            n += 1;
        }
        assert_eq!(n, want.len());
    }
    cleanup(&dir);
}

/// The `u8` values behind `got` and `want` (batches of `t`'s dtype) differ by at most 1: for a
/// float type, each value of `got` is the normalisation of `want`'s `u8` value, or of a
/// neighbour. Returns how many values differ.
fn within_one(t: &Transform, got: &Tensor, want_u8: &[u8]) -> usize {
    let plane = got.shape()[2] * got.shape()[3];
    let norm = |c: usize, u: u8| {
        f32::from(u).mul_add(
            1.0 / (255.0 * IMAGENET_STD[c]),
            -IMAGENET_MEAN[c] / IMAGENET_STD[c],
        )
    };
    let candidates = |i: usize| {
        let (c, u) = ((i / plane) % 3, want_u8[i]);
        [u.saturating_sub(1), u, u.saturating_add(1)].map(move |u| (c, u))
    };
    let mut differ = 0;
    let mut check = |i: usize, ok: &dyn Fn(usize, u8) -> bool, exact: bool| {
        assert!(
            candidates(i).iter().any(|&(c, u)| ok(c, u)),
            "{t:?}: element {i} is not within 1 of {}",
            want_u8[i]
        );
        differ += usize::from(!exact);
    };
    match t.dtype() {
        DType::U8 => {
            let v = got.to_vec::<u8>().unwrap();
            for i in 0..v.len() {
                check(i, &|_, u| v[i] == u, v[i] == want_u8[i]);
            }
        }
        DType::F32 => {
            let v = got.to_vec::<f32>().unwrap();
            for i in 0..v.len() {
                let c = (i / plane) % 3;
                check(i, &|c, u| v[i] == norm(c, u), v[i] == norm(c, want_u8[i]));
            }
        }
        DType::F16 => {
            let v = got.to_vec::<half::f16>().unwrap();
            for i in 0..v.len() {
                let c = (i / plane) % 3;
                let h = |c, u| half::f16::from_f32(norm(c, u));
                check(i, &|c, u| v[i] == h(c, u), v[i] == h(c, want_u8[i]));
            }
        }
        _ => {
            let v = got.to_vec::<half::bf16>().unwrap();
            for i in 0..v.len() {
                let c = (i / plane) % 3;
                let h = |c, u| half::bf16::from_f32(norm(c, u));
                check(i, &|c, u| v[i] == h(c, u), v[i] == h(c, want_u8[i]));
            }
        }
    }
    differ
}

#[test]
fn on_a_gpu_each_value_is_within_one_of_the_cpu_path_s() {
    let test = "on_a_gpu_each_value_is_within_one_of_the_cpu_path_s";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    if let Err(why) = pinnable::cuda::gather_kernels(&dev) {
        panic!("{test}: the kernels do not run on {dev}: {why}");
    }
    let mut r = rng(test);
    let (dir, files) = pictures(&mut r, "ragged-gpu", 40);
    let (mut values, mut differ) = (0, 0);
    for round in 0..12 {
        let (t, u8s) = transforms(&mut r);
        let seed = r.random();
        let want = cpu_batches(&files, &u8s, seed);
        let got = loader(&files, &t, seed, &dev, ImageBatcher::on_device());
        for ((images, labels), (x, y)) in got.epoch(1).map(|b| b.unwrap()).zip(&want) {
            assert!(
                !images.is_pending(),
                "round {round}: moved to {dev} but not resampled"
            );
            let images = images.into_tensor().unwrap();
            assert_eq!(images.device(), dev);
            assert_eq!((images.shape(), images.dtype()), (x.shape(), t.dtype()));
            let images = images.to_cpu(false).unwrap();
            assert_eq!(
                labels.to_cpu(false).unwrap().to_vec::<i64>().unwrap(),
                y.to_vec::<i64>().unwrap()
            );
            differ += within_one(&t, &images, &x.to_vec::<u8>().unwrap());
            values += images.numel();
        }
    }
    // The share differing by 1 is reported, not bounded: it comes from the CPU's 8-bit
    // rounding between its passes, which the kernel does not do.
    println!("{differ} of {values} values differ by 1 from the CPU path's");
    assert!(values > 0, "no batch was compared");
    cleanup(&dir);
}

#[test]
fn the_pixels_block_is_held_until_the_kernel_has_read_it() {
    let test = "the_pixels_block_is_held_until_the_kernel_has_read_it";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let (dir, files) = pictures(&mut r, "ragged-reuse", 24);
    let pool = PinnedPool::new(PoolConfig::default());
    let folder = ImageFolder::from_list(files.iter().cloned())
        .transform(Transform::random_resized_crop(48).flip(0.5));
    let samples: Vec<_> = (0..folder.len()).map(|i| folder.get(i).unwrap()).collect();
    let (images, _) = ImageBatcher::on_device()
        .batch(samples.clone(), &mut Collator::new(&pool))
        .unwrap();
    let want = images.tensor().unwrap().to_vec::<u8>().unwrap();
    for _ in 0..5 {
        let (images, labels) = ImageBatcher::on_device()
            .batch(samples.clone(), &mut Collator::new(&pool))
            .unwrap();
        let bytes = images.pixels().unwrap().nbytes();
        let moved = images.to_device(&dev, true).unwrap();
        drop((images, labels));
        // Whatever the pool hands out now must not be the block the kernel still reads.
        let mut scribbles = Vec::new();
        for _ in 0..4 {
            let mut layout = BatchLayout::new();
            let slot = layout.push(DType::U8, &[bytes]).unwrap();
            let mut b = layout.allocate_in(&pool).unwrap();
            b.view_mut(slot).as_mut_slice::<u8>().unwrap().fill(0xA5);
            scribbles.push(b);
        }
        let got = moved.into_tensor().unwrap().to_cpu(false).unwrap();
        let got = got.to_vec::<u8>().unwrap();
        let far = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.abs_diff(**b) > 1)
            .count();
        assert_eq!(
            far, 0,
            "{far} values differ by more than 1 after the pixels' block was reused"
        );
    }
    cleanup(&dir);
}
