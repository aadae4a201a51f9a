//! burn's `Learner` trains a small MLP on our loader, on burn's default device: batches are
//! collated into pinned memory by our workers and handed to burn through `BurnLoader`. The run
//! is stopped midway through its second epoch, as a crash would stop it, and resumed from the
//! loader's saved position: the restarted run trains on exactly the batches that were left.
//! Last, the first epoch is trained again from the same weights through burn's own
//! `DataLoader` on the same samples in the same order: every step's loss is the same (within
//! 1e-5).
//!
//! On burn's CPU backend:
//!
//! ```text
//! cargo run --release --features burn --example burn_train
//! ```
//!
//! On a GPU, through burn's CUDA backend (built in `burn-cuda/`, whose LLVM
//! `scripts/burn-cuda-env.sh` installs):
//!
//! ```text
//! eval "$(scripts/burn-cuda-env.sh)"
//! cargo run --release --manifest-path burn-cuda/Cargo.toml --example burn_train_on_cuda
//! ```

use std::sync::{Arc, Mutex};

use burn_core as burn;
use burn_core::data::dataloader::batcher::Batcher as BurnBatcher;
use burn_core::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn_core::data::dataset::InMemDataset;
use burn_core::module::Module;
use burn_nn::loss::{MseLoss, Reduction};
use burn_nn::{Linear, LinearConfig, Relu};
use burn_optim::AdamConfig;
use burn_tensor::{Device, Tensor, TensorData};
use burn_train::{
    InferenceStep, Interrupter, Learner, RegressionOutput, SupervisedTraining, TrainOutput,
    TrainStep,
};
use pinnable::interop::burn::{BurnLoader, to_burn_float};
use pinnable::loader::{Collator, FnDataset, Loader, Position};

const FEATURES: usize = 16;
const SAMPLES: usize = 4096;
const BATCH: usize = 128;

/// burn's batch.
#[derive(Clone, Debug)]
struct Batch {
    x: Tensor<2>,
    y: Tensor<2>,
}

/// Sample `i`: features from a fixed generator and a target that is a smooth function of them.
fn sample(i: usize) -> pinnable::Result<Sample> {
    let mut rng = pinnable::loader::SplitMix64::new(i as u64);
    let x: Vec<f32> = (0..FEATURES)
        .map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
        .collect();
    let y = x
        .iter()
        .enumerate()
        .map(|(k, v)| (k as f32 * 0.3).sin() * v)
        .sum::<f32>();
    Ok((pinnable::Tensor::from_vec(x, &[FEATURES])?, y.tanh()))
}

/// Our batch: `x` and `y` in one pinned block.
fn collate(samples: Vec<Sample>, c: &mut Collator) -> pinnable::Result<Pair> {
    let b = samples.len();
    let x = c.stack("x", samples.iter().map(|s| &s.0))?;
    let y = c.stack_scalars("y", samples.iter().map(|s| s.1))?;
    let mut out = c.finish()?;
    Ok((out.take(x)?, out.take(y)?.reshape(&[b, 1])?))
}

/// A sample: its features and its target.
type Sample = (pinnable::Tensor, f32);
/// Our batch: features `[B, FEATURES]` and targets `[B, 1]` in one pinned block.
type Pair = (pinnable::Tensor, pinnable::Tensor);
type GetFn = fn(usize) -> pinnable::Result<Sample>;
type CollateFn = fn(Vec<Sample>, &mut Collator) -> pinnable::Result<Pair>;
type ConvertFn = fn(Pair, &Device) -> pinnable::Result<Batch>;
type Adapter = BurnLoader<FnDataset<GetFn>, CollateFn, ConvertFn>;

/// The training loader: shuffled, 4 workers; from `resume` when given.
fn loader(samples: usize, resume: Option<Position>, device: &Device) -> pinnable::Result<Adapter> {
    let get: GetFn = sample;
    let builder = Loader::builder(FnDataset::new(samples, get))
        .batch_size(BATCH)
        .shuffle(2024)
        .workers(4);
    let builder = match resume {
        Some(p) => builder.resume(p),
        None => builder,
    };
    let batcher: CollateFn = collate;
    let convert: ConvertFn = |(x, y), device| {
        Ok(Batch {
            x: to_burn_float(&x, device)?,
            y: to_burn_float(&y, device)?,
        })
    };
    Ok(BurnLoader::new(
        builder.build(batcher)?,
        device.clone(),
        convert,
    ))
}

#[derive(Module, Debug)]
struct Mlp {
    hidden: Linear,
    relu: Relu,
    out: Linear,
    /// Counts the training steps, and stops the training after a set number of them.
    #[module(skip)]
    control: Arc<Mutex<Control>>,
}

/// The steps trained and their losses, and the simulated crash: the step it comes after, and
/// how.
#[derive(Default)]
struct Control {
    steps: usize,
    losses: Vec<f32>,
    crash: Option<(usize, Interrupter)>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("steps", &self.steps)
            .field("crash_at", &self.crash.as_ref().map(|(at, _)| at))
            .finish()
    }
}

impl Mlp {
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
        let loss: Vec<f32> = item.loss.to_data().convert::<f32>().try_to_vec().unwrap();
        let mut control = self.control.lock().unwrap();
        control.steps += 1;
        control.losses.push(loss[0]);
        if let Some((at, interrupter)) = &control.crash
            && control.steps == *at
        {
            interrupter.stop(Some("simulated crash"));
        }
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

/// The mean of the validation batches' losses.
fn valid_loss(
    model: &Mlp,
    valid: &dyn DataLoader<Batch>,
) -> Result<f32, Box<dyn std::error::Error>> {
    let mut losses = Vec::new();
    for batch in valid.iter() {
        let loss: Vec<f32> = model.forward(batch?).loss.to_data().try_to_vec()?;
        losses.push(loss[0]);
    }
    Ok(losses.iter().sum::<f32>() / losses.len().max(1) as f32)
}

/// Trains `model` for `epochs` epochs on `train`; stops after `stop_after` steps when given.
fn fit(
    model: Mlp,
    train: Arc<dyn DataLoader<Batch>>,
    valid: Arc<dyn DataLoader<Batch>>,
    epochs: usize,
    stop_after: Option<usize>,
    dir: &std::path::Path,
) -> Result<Mlp, Box<dyn std::error::Error>> {
    let training = SupervisedTraining::new(dir, train, valid)
        .num_epochs(epochs)
        .with_application_logger(None);
    {
        let mut control = model.control.lock().unwrap();
        control.crash = stop_after.map(|n| (control.steps + n, training.interrupter()));
    }
    let learner = Learner::new(model, AdamConfig::new().init(), 3e-3);
    let result = training.launch(learner);
    if let Some(e) = result.error {
        return Err(e.to_string().into());
    }
    let model = result.model.train();
    model.control.lock().unwrap().crash = None;
    Ok(model)
}

/// burn's own batcher, for the same samples: rows concatenated into `TensorData`.
#[derive(Clone)]
struct RowBatcher;

impl BurnBatcher<(Vec<f32>, f32), Batch> for RowBatcher {
    fn batch(&self, items: Vec<(Vec<f32>, f32)>, device: &Device) -> Batch {
        let b = items.len();
        let x: Vec<f32> = items.iter().flat_map(|s| s.0.iter().copied()).collect();
        let y: Vec<f32> = items.iter().map(|s| s.1).collect();
        Batch {
            x: Tensor::from_data(TensorData::new(x, [b, FEATURES]), device),
            y: Tensor::from_data(TensorData::new(y, [b, 1]), device),
        }
    }
}

/// burn's own `DataLoader` over the samples of our loader's epoch 0, in its order.
fn burns_own(order: &[usize], device: &Device) -> pinnable::Result<Arc<dyn DataLoader<Batch>>> {
    let mut rows = Vec::with_capacity(order.len());
    for &i in order {
        let (x, y) = sample(i)?;
        rows.push((x.to_vec::<f32>()?, y));
    }
    Ok(DataLoaderBuilder::new(RowBatcher)
        .batch_size(BATCH)
        .set_device(device.clone())
        .build(InMemDataset::new(rows)))
}

// `pub`: burn-cuda/ runs it from its one test binary.
pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::default().autodiff();
    println!("burn's device: {device:?}");
    let dir = std::env::temp_dir().join(format!("pinnable-burn-example-{}", std::process::id()));
    let valid: Arc<dyn DataLoader<Batch>> = Arc::new(loader(512, None, &device)?);
    let model = Mlp {
        hidden: LinearConfig::new(FEATURES, 64).init(&device),
        relu: Relu::new(),
        out: LinearConfig::new(64, 1).init(&device),
        control: Arc::default(),
    };
    let steps_per_epoch = SAMPLES.div_ceil(BATCH);
    let untrained = valid_loss(&model, &*valid)?;

    // The same weights, to train the first epoch again through burn's own loader.
    let mut initial = model.clone();
    initial.control = Arc::default();

    // The first run: one whole epoch, then a crash 10 steps into the second.
    let started = std::time::Instant::now();
    let train = Arc::new(loader(SAMPLES, None, &device)?);
    let order = train.loader().sampler().indices(0);
    let model = fit(model, train.clone(), valid.clone(), 1, None, &dir)?;
    let model = fit(model, train.clone(), valid.clone(), 1, Some(10), &dir)?;
    // What a checkpoint stores beside the weights.
    let saved = train.position().to_bytes();
    println!(
        "stopped at epoch {} after batch {} of {steps_per_epoch} ({:.1?} so far); stats of the \
         epoch: {}",
        train.position().epoch(),
        train.position().batch(),
        started.elapsed(),
        train.loader().stats().expect("an epoch ran"),
    );
    drop(train);

    // The restart: the loader resumes at the next batch; burn trains the rest of the epoch.
    let position = Position::from_bytes(&saved)?;
    let resumed = Arc::new(loader(SAMPLES, Some(position), &device)?);
    let before = model.control.lock().unwrap().steps;
    let model = fit(model, resumed.clone(), valid.clone(), 1, None, &dir)?;
    let trained = model.control.lock().unwrap().steps - before;
    assert_eq!(
        trained,
        steps_per_epoch - 10,
        "the batches left of the epoch"
    );
    println!(
        "resumed: trained the {trained} batches left of epoch 1; the loader is now at epoch {}",
        resumed.position().epoch(),
    );
    println!(
        "validation MSE {untrained:.4} untrained, {:.4} after 2 epochs (the second stopped and resumed); {} steps in {:.1?}",
        valid_loss(&model, &*valid)?,
        model.control.lock().unwrap().steps,
        started.elapsed()
    );

    // The first epoch again, from the same weights, through burn's own DataLoader.
    let ours: Vec<f32> = model.control.lock().unwrap().losses[..steps_per_epoch].to_vec();
    let again = fit(initial, burns_own(&order, &device)?, valid, 1, None, &dir)?;
    let theirs = again.control.lock().unwrap().losses.clone();
    assert_eq!(theirs.len(), ours.len(), "one loss a step");
    let worst = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= 1e-5,
        "a step's loss differs by {worst} between our loader and burn's"
    );
    println!(
        "epoch 0 again through burn's own DataLoader: the same {} losses (largest difference \
         {worst:e})",
        ours.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
