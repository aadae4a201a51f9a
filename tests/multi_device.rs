//! One process feeding several devices: `build_per_device` gives each device its own shard of
//! every epoch, disjoint and together complete. On CUDA, one loader a GPU, every GPU of the
//! machine, all running at once on their own threads and delivering to their own devices (on a
//! one-GPU machine, two loaders to that GPU, printing `partly skipped: …`).

use pinnable::loader::{FnDataset, Loader, Stack};
use pinnable::{DType, Device, Tensor, ToDevice};
use pinnable_harness::{cuda_targets_or_skip, random_tensor, rng};
use rand::Rng;

/// A dataset whose sample `i` is image `i` of `images` and the label `i`.
fn dataset(
    images: Tensor,
) -> FnDataset<impl Fn(usize) -> pinnable::Result<(Tensor, i64)> + Send + Sync> {
    let len = images.shape()[0];
    FnDataset::new(len, move |i| {
        Ok((images.narrow(0, i, 1)?.reshape(&[3, 4, 4])?, i as i64))
    })
}

fn images(r: &mut impl Rng, len: usize) -> Tensor {
    random_tensor(r, DType::F32, &[len, 3, 4, 4])
}

/// The labels of every batch of one epoch of `loader`, moved back to the host first.
fn labels_of(
    loader: &Loader<impl pinnable::loader::Dataset<Sample = (Tensor, i64)> + 'static, Stack>,
    device: &Device,
) -> Vec<i64> {
    let mut seen = Vec::new();
    for batch in loader.run_epoch(3) {
        let (images, labels) = batch.unwrap();
        assert_eq!(images.device().ordinal(), device.ordinal());
        seen.extend(labels.to_cpu(false).unwrap().to_vec::<i64>().unwrap());
    }
    seen
}

#[test]
fn each_device_gets_a_disjoint_share_of_every_epoch() {
    let mut r = rng("each_device_gets_a_disjoint_share_of_every_epoch");
    let n = r.random_range(2..5);
    let len = n * r.random_range(3..30);
    let devices = vec![Device::cpu(); n];
    let loaders = Loader::builder(dataset(images(&mut r, len)))
        .batch_size(r.random_range(1..6))
        .shuffle(r.random())
        .workers(2)
        .build_per_device(&devices, Stack)
        .unwrap();
    assert_eq!(loaders.len(), n);
    let mut all: Vec<i64> = Vec::new();
    let mut per_device = Vec::new();
    for (loader, device) in loaders.iter().zip(&devices) {
        let seen = labels_of(loader, device);
        per_device.push(seen.len());
        all.extend(seen);
    }
    assert!(
        per_device.iter().all(|&c| c == len / n),
        "equal shares: {per_device:?}"
    );
    all.sort_unstable();
    assert_eq!(
        all,
        (0..len as i64).collect::<Vec<_>>(),
        "disjoint and complete"
    );
    let empty: &[Device] = &[];
    let err = Loader::builder(dataset(images(&mut r, 4)))
        .build_per_device(empty, Stack)
        .unwrap_err();
    assert!(err.to_string().contains("at least one"), "{err}");
}

#[test]
fn every_gpu_is_fed_at_once_each_its_own_shard() {
    let test = "every_gpu_is_fed_at_once_each_its_own_shard";
    let Some(devices) = cuda_targets_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    let n = devices.len();
    let len = n * r.random_range(100..400);
    let loaders = Loader::builder(dataset(images(&mut r, len)))
        .batch_size(r.random_range(4..32))
        .shuffle(r.random())
        .workers(3)
        .build_per_device(&devices, Stack)
        .unwrap();
    assert_eq!(loaders.len(), n, "one loader a device");
    let shares: Vec<Vec<i64>> = std::thread::scope(|s| {
        let handles: Vec<_> = loaders
            .iter()
            .zip(&devices)
            .map(|(l, d)| s.spawn(move || labels_of(l, d)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let sizes: Vec<usize> = shares.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![len / n; n], "equal shares");
    let mut all: Vec<i64> = shares.concat();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..len as i64).collect::<Vec<_>>(),
        "disjoint and complete"
    );
}
