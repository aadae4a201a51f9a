//! burn's training loop on our loader: burn's `Learner` trains through `BurnLoader` with the
//! same per-step losses as through burn's own loader; burn's split across devices gets equal
//! batch counts; a failing sample reaches burn as an error naming it; a resume continues with
//! the remaining batches.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use burn_core as burn;
use burn_core::data::dataloader::batcher::Batcher as BurnBatcher;
use burn_core::data::dataloader::split::split_dataloader;
use burn_core::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn_core::data::dataset::InMemDataset;
use burn_core::module::Module;
use burn_nn::loss::{MseLoss, Reduction};
use burn_nn::{Linear, LinearConfig, Relu};
use burn_optim::SgdConfig;
use burn_tensor::{Device, Tensor, TensorData};
use burn_train::{
    InferenceStep, Learner, RegressionOutput, SupervisedTraining, TrainOutput, TrainStep,
};
use pinnable::interop::burn::{BurnLoader, to_burn_float};
use pinnable::loader::{Collator, FnDataset, Loader};
use pinnable::{Placement, ToDevice};
use pinnable_harness::rng;
use rand::Rng;

const FEATURES: usize = 6;

/// One sample: features and a target.
#[derive(Clone, Debug)]
struct Sample {
    x: Vec<f32>,
    y: f32,
}

fn random_samples(r: &mut impl Rng, n: usize) -> Vec<Sample> {
    (0..n)
        .map(|_| Sample {
            x: (0..FEATURES).map(|_| r.random_range(-1.0..1.0)).collect(),
            y: r.random_range(-1.0..1.0),
        })
        .collect()
}

/// burn's batch.
#[derive(Clone, Debug)]
struct Batch {
    x: Tensor<2>,
    y: Tensor<2>,
}

/// Our batch: `x` `[B, FEATURES]`, `y` `[B, 1]`, both in one pinned block.
type Ours = (pinnable::Tensor, pinnable::Tensor);

fn collate(samples: Vec<Sample>, c: &mut Collator) -> pinnable::Result<Ours> {
    let b = samples.len();
    let xs = samples
        .iter()
        .map(|s| pinnable::Tensor::from_vec(s.x.clone(), &[FEATURES]))
        .collect::<pinnable::Result<Vec<_>>>()?;
    let x = c.stack("x", xs.iter())?;
    let y = c.stack_scalars("y", samples.iter().map(|s| s.y))?;
    let mut out = c.finish()?;
    Ok((out.take(x)?, out.take(y)?.reshape(&[b, 1])?))
}

fn to_burn((x, y): Ours, device: &Device) -> pinnable::Result<Batch> {
    Ok(Batch {
        x: to_burn_float(&x, device)?,
        y: to_burn_float(&y, device)?,
    })
}

/// burn's own batcher for the same samples.
#[derive(Clone)]
struct SampleBatcher;

impl BurnBatcher<Sample, Batch> for SampleBatcher {
    fn batch(&self, items: Vec<Sample>, device: &Device) -> Batch {
        let b = items.len();
        let x: Vec<f32> = items.iter().flat_map(|s| s.x.clone()).collect();
        let y: Vec<f32> = items.iter().map(|s| s.y).collect();
        Batch {
            x: Tensor::from_data(TensorData::new(x, [b, FEATURES]), device),
            y: Tensor::from_data(TensorData::new(y, [b, 1]), device),
        }
    }
}

/// A small MLP that records the loss of every training step.
#[derive(Module, Debug)]
struct Mlp {
    hidden: Linear,
    relu: Relu,
    out: Linear,
    #[module(skip)]
    losses: Arc<Mutex<Vec<f32>>>,
}

impl Mlp {
    fn new(device: &Device) -> Self {
        Mlp {
            hidden: LinearConfig::new(FEATURES, 16).init(device),
            relu: Relu::new(),
            out: LinearConfig::new(16, 1).init(device),
            losses: Arc::default(),
        }
    }

    fn forward(&self, batch: Batch) -> RegressionOutput {
        let output = self
            .out
            .forward(self.relu.forward(self.hidden.forward(batch.x)));
        let loss = MseLoss::new().forward(output.clone(), batch.y.clone(), Reduction::Mean);
        RegressionOutput::new(loss, output, batch.y)
    }
}

impl TrainStep for Mlp {
    type Input = Batch;
    type Output = RegressionOutput;

    fn step(&self, batch: Batch) -> TrainOutput<RegressionOutput> {
        let item = self.forward(batch);
        let loss: Vec<f32> = item.loss.to_data().try_to_vec().unwrap();
        self.losses.lock().unwrap().push(loss[0]);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl InferenceStep for Mlp {
    type Input = Batch;
    type Output = RegressionOutput;

    fn step(&self, batch: Batch) -> RegressionOutput {
        self.forward(batch)
    }
}

/// Trains a copy of `model` for one epoch on `train` with burn's Learner (plain SGD, so the
/// losses depend only on the weights and the batches); the losses of its steps, and the error
/// that ended the training, if one did.
fn train(
    model: &Mlp,
    train: Arc<dyn DataLoader<Batch>>,
    valid: Arc<dyn DataLoader<Batch>>,
    dir: &str,
) -> (Vec<f32>, Option<String>) {
    let mut model = model.clone();
    let losses: Arc<Mutex<Vec<f32>>> = Arc::default();
    model.losses = losses.clone();
    let dir = std::env::temp_dir().join(format!("pinnable-burn-{dir}-{}", std::process::id()));
    let training = SupervisedTraining::new(&dir, train, valid)
        .num_epochs(1)
        .with_application_logger(None);
    let learner = Learner::new(model, SgdConfig::new().init(), 0.05);
    let result = training.launch(learner);
    let _ = std::fs::remove_dir_all(&dir);
    let losses = losses.lock().unwrap().clone();
    (losses, result.error.map(|e| e.to_string()))
}

#[test]
fn learner_trains_on_our_loader_with_the_losses_of_burns_own_loader() {
    let mut r = rng("learner_trains_on_our_loader_with_the_losses_of_burns_own_loader");
    let (n, batch) = (r.random_range(30..60), r.random_range(3..8));
    let samples = random_samples(&mut r, n);
    let seed = r.random();
    let device = Device::default().autodiff();

    let data = samples.clone();
    let loader = Loader::builder(FnDataset::new(n, move |i| Ok(data[i].clone())))
        .batch_size(batch)
        .shuffle(seed)
        .workers(r.random_range(1..4))
        .build_with(collate)
        .unwrap();
    // The same samples in the order our loader's epoch 0 takes them, for burn's loader.
    let order = loader.sampler().indices(0);
    let ours: Arc<dyn DataLoader<Batch>> =
        Arc::new(BurnLoader::new(loader, device.clone(), to_burn));
    assert_eq!(ours.num_items(), n);

    let in_order: Vec<Sample> = order.iter().map(|&i| samples[i].clone()).collect();
    let burns = DataLoaderBuilder::new(SampleBatcher)
        .batch_size(batch)
        .set_device(device.clone())
        .build(InMemDataset::new(in_order));
    let valid = DataLoaderBuilder::new(SampleBatcher)
        .batch_size(batch)
        .build(InMemDataset::new(samples[..batch].to_vec()));

    let model = Mlp::new(&device);
    let (with_ours, error) = train(&model, ours, valid.clone(), "ours");
    assert_eq!(error, None);
    let (with_burns, error) = train(&model, burns, valid, "burns");
    assert_eq!(error, None);
    assert_eq!(with_ours.len(), n.div_ceil(batch), "one loss a step");
    assert_eq!(with_ours.len(), with_burns.len());
    for (step, (a, b)) in with_ours.iter().zip(&with_burns).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5,
            "step {step}: {a} through ours, {b} through burn's"
        );
    }
    // The weights moved: the losses are not one value repeated.
    assert!(with_ours.windows(2).any(|w| w[0] != w[1]), "{with_ours:?}");
}

/// The batches of each loader of burn's split of `loader` over `devices` devices, and the
/// targets each part saw.
fn split_batches(loader: Arc<dyn DataLoader<Batch>>, devices: usize) -> Vec<(usize, Vec<f32>)> {
    let devices = vec![Device::default(); devices];
    split_dataloader(loader, &devices)
        .iter()
        .map(|part| {
            let mut batches = 0;
            let mut ys = Vec::new();
            for b in part.iter() {
                let b = b.unwrap();
                batches += 1;
                ys.extend(b.y.to_data().try_to_vec::<f32>().unwrap());
            }
            (batches, ys)
        })
        .collect()
}

#[test]
fn burns_split_over_devices_gets_equal_batch_counts() {
    let mut r = rng("burns_split_over_devices_gets_equal_batch_counts");
    // 10 batches of 2 over 3 devices: burn's own split gives 3, 3 and 4 batches.
    for (n, batch, devices) in [
        (20, 2, 3),
        (
            r.random_range(30..200),
            r.random_range(1..9),
            r.random_range(2..6),
        ),
    ] {
        let samples = random_samples(&mut r, n);
        let data = samples.clone();
        let fixed = (n, batch, devices) == (20, 2, 3);
        let drop_last = !fixed && r.random_bool(0.5);
        let loader = Loader::builder(FnDataset::new(n, move |i| Ok(data[i].clone())))
            .batch_size(batch)
            .shuffle(r.random())
            .drop_last(drop_last)
            .workers(2)
            .build_with(collate)
            .unwrap();
        let ours = split_batches(
            Arc::new(BurnLoader::new(loader, Device::default(), to_burn)),
            devices,
        );
        let counts: Vec<usize> = ours.iter().map(|(b, _)| *b).collect();
        assert!(
            counts.iter().all(|&c| c == counts[0]),
            "{n} samples, batches of {batch}, {devices} devices: {counts:?}"
        );
        let per_rank = if drop_last {
            n / devices
        } else {
            n.div_ceil(devices)
        };
        let expected = if drop_last {
            per_rank / batch
        } else {
            per_rank.div_ceil(batch)
        };
        assert_eq!(counts[0], expected);
        // Every sample is seen (without drop_last), each part's disjoint but for the padding.
        let mut seen: BTreeMap<u32, usize> = BTreeMap::new();
        for (_, ys) in &ours {
            for y in ys {
                *seen.entry(y.to_bits()).or_default() += 1;
            }
        }
        if !drop_last {
            for s in &samples {
                assert!(seen.contains_key(&s.y.to_bits()), "a sample no part saw");
            }
            let total: usize = ours.iter().map(|(_, ys)| ys.len()).sum();
            assert_eq!(total, per_rank * devices, "padded to an equal share");
        }

        let burns = DataLoaderBuilder::new(SampleBatcher)
            .batch_size(batch)
            .build(InMemDataset::new(samples));
        let theirs: Vec<usize> = split_batches(burns, devices)
            .iter()
            .map(|(b, _)| *b)
            .collect();
        if fixed {
            assert_eq!(theirs, [3, 3, 4], "burn's own split, for comparison");
            assert_eq!(counts, [4, 4, 4]);
        }
    }
}

#[test]
fn a_failing_sample_reaches_burn_as_an_error_naming_it() {
    let mut r = rng("a_failing_sample_reaches_burn_as_an_error_naming_it");
    let n = r.random_range(20..60);
    let bad = r.random_range(0..n);
    let samples = random_samples(&mut r, n);
    let valid = samples[..4].to_vec();
    let loader = Loader::builder(FnDataset::new(n, move |i| {
        if i == bad {
            return Err(pinnable::Error::Config {
                setting: "sample",
                problem: format!("record {i} is corrupt"),
            });
        }
        Ok(samples[i].clone())
    }))
    .batch_size(r.random_range(1..6))
    .shuffle(r.random())
    .workers(2)
    .build_with(collate)
    .unwrap();
    let burn = BurnLoader::new(loader, Device::default().autodiff(), to_burn);

    // burn's Learner stops with the error.
    let valid = DataLoaderBuilder::new(SampleBatcher)
        .batch_size(2)
        .build(InMemDataset::new(valid));
    let model = Mlp::new(&Device::default().autodiff());
    let (losses, error) = train(&model, Arc::new(burn.clone()), valid, "failing");
    let error = error.expect("the training ends with an error");
    assert!(error.contains(&format!("sample {bad}")), "{error}");
    assert!(losses.len() < n, "{} steps", losses.len());

    // And its iterator yields it in the failing batch's place.
    let mut errors = Vec::new();
    for item in burn.iter() {
        if let Err(e) = item {
            errors.push(e);
        }
    }
    assert_eq!(errors.len(), 1, "the epoch ends at the error");
    let message = errors[0].to_string();
    assert!(message.contains(&format!("sample {bad}")), "{message}");
    assert!(
        message.contains(&format!("record {bad} is corrupt")),
        "{message}"
    );
    let ours = std::error::Error::source(&errors[0])
        .and_then(|s| s.downcast_ref::<pinnable::Error>())
        .expect("our error as the source");
    assert!(
        matches!(ours, pinnable::Error::Sample { index, .. } if *index == bad),
        "{ours}"
    );
}

#[test]
fn a_panicking_conversion_reaches_burn_as_an_error() {
    let mut r = rng("a_panicking_conversion_reaches_burn_as_an_error");
    let n = r.random_range(10..30);
    let samples = random_samples(&mut r, n);
    let panic_at = r.random_range(0..n.div_ceil(2));
    let loader = Loader::builder(FnDataset::new(n, move |i| Ok(samples[i].clone())))
        .batch_size(2)
        .build_with(collate)
        .unwrap();
    let calls = Mutex::new(0usize);
    let burn = BurnLoader::new(loader, Device::default(), move |b: Ours, d: &Device| {
        let mut c = calls.lock().unwrap();
        *c += 1;
        if *c == panic_at + 1 {
            panic!("conversion {panic_at} broke");
        }
        to_burn(b, d)
    });
    let results: Vec<_> = burn.iter().collect();
    let (i, e) = results
        .iter()
        .enumerate()
        .find_map(|(i, r)| r.as_ref().err().map(|e| (i, e)))
        .unwrap();
    assert_eq!(i, panic_at);
    assert!(
        e.to_string()
            .contains(&format!("conversion {panic_at} broke")),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!("batch {panic_at} of epoch 0")),
        "{e}"
    );
}

#[test]
fn a_resume_through_our_position_gives_the_remaining_batches() {
    let mut r = rng("a_resume_through_our_position_gives_the_remaining_batches");
    let n = r.random_range(30..80);
    let batch = r.random_range(2..7);
    let seed = r.random();
    let samples = random_samples(&mut r, n);
    let build = |resume: Option<pinnable::loader::Position>, workers: usize| {
        let data = samples.clone();
        let b = Loader::builder(FnDataset::new(n, move |i| Ok(data[i].clone())))
            .batch_size(batch)
            .shuffle(seed)
            .workers(workers);
        let b = match resume {
            Some(p) => b.resume(p),
            None => b,
        };
        BurnLoader::new(b.build_with(collate).unwrap(), Device::default(), to_burn)
    };
    let targets = |b: Batch| b.y.to_data().try_to_vec::<f32>().unwrap();

    let whole = build(None, 2);
    // Epoch 0, then epoch 1 uninterrupted.
    assert_eq!(whole.iter().count(), n.div_ceil(batch));
    let uninterrupted: Vec<Vec<f32>> = whole.iter().map(|b| targets(b.unwrap())).collect();

    let first = build(None, 3);
    assert_eq!(first.iter().count(), n.div_ceil(batch));
    let stop = r.random_range(1..n.div_ceil(batch));
    let mut epoch = first.iter();
    for _ in 0..stop {
        epoch.next().unwrap().unwrap();
    }
    assert_eq!(epoch.progress().items_processed, stop * batch);
    drop(epoch);
    let position = first.position();
    assert_eq!((position.epoch(), position.batch()), (1, stop as u64));

    let resumed = build(Some(position), 1);
    let mut epoch = resumed.iter();
    assert_eq!(
        epoch.progress().items_processed,
        stop * batch,
        "progress counts the skipped"
    );
    assert_eq!(epoch.progress().items_total, n);
    let rest: Vec<Vec<f32>> = epoch.by_ref().map(|b| targets(b.unwrap())).collect();
    assert_eq!(rest, uninterrupted[stop..]);
    assert!(epoch.progress().is_completed());
}

#[test]
fn a_device_burn_names_is_served_by_the_placement_or_refused_with_its_reason() {
    let mut r = rng("a_device_burn_names_is_served_by_the_placement_or_refused_with_its_reason");
    let n = r.random_range(10..40);
    let samples = random_samples(&mut r, n);
    let data = samples.clone();
    let loader = Loader::builder(FnDataset::new(n, move |i| Ok(data[i].clone())))
        .batch_size(r.random_range(1..6))
        .build_with(collate)
        .unwrap();
    let refusing = BurnLoader::new(loader, Device::default(), to_burn).placement(|d| {
        Err(pinnable::Error::Config {
            setting: "placement",
            problem: format!("no GPU of ours serves {d:?}"),
        })
    });
    let moved = refusing.to_device(&Device::default());
    assert_eq!(moved.num_items(), 0);
    let items: Vec<_> = moved.iter().collect();
    assert_eq!(items.len(), 1);
    let e = items[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("no GPU of ours serves"), "{e}");
}

/// GPU: with a placement onto `cuda:0`, `to_device` gives a loader whose batches arrive on
/// the GPU (moved by our copies); the conversion brings them back, values intact.
#[test]
fn to_device_moves_batches_to_the_gpu_the_placement_names() {
    let Some(gpu) =
        pinnable_harness::cuda_or_skip("to_device_moves_batches_to_the_gpu_the_placement_names")
    else {
        return;
    };
    let mut r = rng("to_device_moves_batches_to_the_gpu_the_placement_names");
    let n = r.random_range(20..60);
    let batch = r.random_range(2..8);
    let samples = random_samples(&mut r, n);
    let data = samples.clone();
    let loader = Loader::builder(FnDataset::new(n, move |i| Ok(data[i].clone())))
        .batch_size(batch)
        .build_with(collate)
        .unwrap();
    let target = gpu.clone();
    let adapter = BurnLoader::new(
        loader,
        Device::default(),
        move |(x, y): Ours, d: &Device| {
            assert_eq!(
                (x.placement(), y.placement()),
                (Placement::Cuda(0), Placement::Cuda(0))
            );
            to_burn((x.to_cpu(false)?, y.to_cpu(false)?), d)
        },
    )
    .placement(move |_| Ok(target.clone()));
    let on_gpu = adapter.to_device(&Device::default());
    let mut ys = Vec::new();
    for b in on_gpu.iter() {
        ys.extend(b.unwrap().y.to_data().try_to_vec::<f32>().unwrap());
    }
    let expected: Vec<f32> = samples.iter().map(|s| s.y).collect();
    assert_eq!(ys, expected);
}
