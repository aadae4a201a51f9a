//! The loaders of `bench/python/speed.py` driven from Rust, the Python package's yardstick: the
//! same files, batch size, workers, prefetch, shuffle seed, dtype, codec and device, read from
//! `$PINNABLE_TWINS_DATA/twins.cfg` (written by `speed.py --prepare`), measured as speed.py does
//! ([`stream`], [`overhead`]), printed as `name value unit` rows with speed.py's names (joined by
//! `bench/python/run_speed.sh`). Without `PINNABLE_TWINS_DATA` (`cargo bench --bench python_twins
//! --features image`) it writes tiny files and runs on the host; a manifest naming `cuda:0` on a
//! machine without a GPU prints `skipped: …` and runs on the host. `--quick`: short windows.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, DevicePtrMut, DeviceRepr, sys};
use pinnable::formats::image::{DecodeOn, IMAGENET_MEAN, IMAGENET_STD, ImageBatcher, ImageCodec};
use pinnable::formats::image::{ImageFolder, Transform};
use pinnable::formats::tar::{TarImageBatcher, TarShards};
use pinnable::formats::tokens::{PackedBatch, PackedDocs, TokenBatch, TokenShards, TokenWindows};
use pinnable::loader::{Batcher, Budget, Epoch, Loader, LoaderBuilder, Source, SplitMix64};
use pinnable::{DType, Device, Element, Tensor, ToDevice};
use pinnable_harness::bench::{Window, check, cpu_seconds, percentile};
use pinnable_harness::{cuda_or_skip, images, kernels::Consumer, rng, tar::shard};

/// The settings of a run without speed.py's files: tiny, on the host.
const SMOKE: &str = "device cpu\ndecode host\nseed 7\nrepeats 1\nwindow_max 100\n\
tokens_batch 8\ntokens_context 256\ntokens_workers 2\ntokens_prefetch 2\ntokens_warmup 2\n\
docs_eot 50256\ndocs_row_tokens 4096\ndocs_rows 1\ndocs_workers 2\ndocs_prefetch 2\ndocs_warmup 2\n\
images_batch 4\nimages_workers 2\nimages_prefetch 2\nimages_warmup 2\nimages_dtype float32\n\
tar_shuffle_buffer 16\noverhead_prefetch 4\noverhead_take 2\noverhead_rounds 5\noverhead_settle_ms 10\n";
/// `--quick`: one repeat, short windows.
const QUICK: &str = "repeats 1\nwindow_max 20\noverhead_rounds 3\n";

/// `twins.cfg`: `key value` lines (a later line wins).
type Cfg = HashMap<String, String>;

fn num(cfg: &Cfg, k: &str) -> usize {
    cfg[k].parse().expect(k)
}

/// Tiny files in a fresh folder, and their manifest: for a run without speed.py.
fn smoke_data() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pinnable-twins-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("shards")).expect("a temporary folder");
    let mut r = SplitMix64::new(7);
    let mut token = |n: u64| ((r.next_u64() % n) as u16).to_le_bytes();
    let tokens: Vec<u8> = (0..1 << 20).flat_map(|_| token(50257)).collect();
    std::fs::write(dir.join("train.bin"), tokens).expect("write tokens");
    let mut docs = Vec::new();
    while docs.len() < 1 << 21 {
        let len = 100 + u16::from_le_bytes(token(2000));
        (1..len).for_each(|_| docs.extend(token(50256)));
        docs.extend(50256u16.to_le_bytes());
    }
    std::fs::write(dir.join("docs.bin"), docs).expect("write documents");
    let at = dir.join("folder");
    images::write_folder(&mut rng("python_twins"), &at, 2, 32, (96, 64));
    let folder = ImageFolder::open(at).expect("the folder just written");
    for s in 0..2 {
        let sample = |i: usize| {
            let jpg = std::fs::read(folder.path(i).unwrap()).expect("read a JPEG");
            let cls = folder.label(i).unwrap().to_string().into_bytes();
            let fields = vec![("jpg".into(), jpg), ("cls".into(), cls)];
            (format!("s{i:04}"), fields)
        };
        let samples: Vec<_> = (s..folder.len()).step_by(2).map(sample).collect();
        let path = format!("shards/train-{s:06}.tar");
        std::fs::write(dir.join(path), shard(&samples).0).expect("write a shard");
    }
    let d = dir.display();
    let paths = format!(
        "tokens_file {d}/train.bin\ndocs_file {d}/docs.bin\nimages_dir {d}/folder\n\
         tar_pattern {d}/shards/train-{{000000..000001}}.tar\n"
    );
    std::fs::write(dir.join("twins.cfg"), format!("{SMOKE}{paths}")).expect("write twins.cfg");
    dir
}

/// The consumer's touch of each tensor, on its own stream: the harness's read kernel when
/// `PINNABLE_KERNELS_PTX` loads, else a device copy into the scratch; nothing on the host.
struct Touch(Option<Consumer>, RefCell<Option<CudaSlice<u8>>>);

impl Touch {
    fn batch(&self, tensors: &[Tensor]) {
        let Some(c) = &self.0 else { return };
        for t in tensors {
            match t.dtype() {
                DType::I64 => self.read::<i64>(c, t),
                DType::I32 => self.read::<i32>(c, t),
                DType::F32 => self.read::<f32>(c, t),
                DType::U8 => self.read::<u8>(c, t),
                other => panic!("no touch for {other}"),
            }
        }
    }

    /// Every byte of `t` read on the consumer's stream, after the copy that fills it.
    fn read<T: Element + DeviceRepr>(&self, c: &Consumer, t: &Tensor) {
        let view = t.cuda_view::<T>(&c.stream).expect("a device view");
        let (src, bytes) = (view.device_ptr(), t.nbytes());
        if let Some(k) = &c.kernels {
            return k.read_sum(&c.stream, src, bytes / 4, c.sum_ptr());
        }
        let mut scratch = self.1.borrow_mut();
        if scratch.as_ref().is_none_or(|s| s.len() < bytes) {
            *scratch = Some(c.stream.alloc_zeros::<u8>(bytes).expect("scratch"));
        }
        let (dst, _record) = scratch.as_mut().unwrap().device_ptr_mut(&c.stream);
        // SAFETY: both ranges hold `bytes` bytes of this device; the copy is queued on the
        // view's stream, which waits for the batch's copy and is recorded when the view drops.
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, c.stream.cu_stream()) });
    }

    fn sync(&self) {
        if let Some(c) = &self.0 {
            c.stream.synchronize().expect("sync");
        }
    }
}

/// `repeats` windows of `job`'s loader (epoch r in repeat r), reported as speed.py reports
/// them: a warm-up, then a window (the epoch's last `prefetch + 2` batches left out) of batches
/// taken and touched, a sync ending its first and last step (the harness's [`Window`]); the
/// median repeat's rate, its range, the share of the window inside `next()`, step p50/p90 and
/// the process's CPU time over the window as cores.
fn stream<S, B>(
    (cfg, touch): (&Cfg, &Touch),
    (job, name): (&str, &str),
    loader: Loader<S, B>,
    fields: impl Fn(&B::Batch) -> Vec<Tensor>,
) where
    S: Source,
    B: Batcher<S::Sample> + 'static,
    B::Batch: ToDevice + 'static,
{
    let k = |s: &str| num(cfg, &format!("{job}_{s}"));
    let (warmup, tail) = (k("warmup"), k("prefetch") + 2);
    let mut runs = Vec::new();
    for r in 0..num(cfg, "repeats") as u64 {
        let mut epoch = loader.run_epoch(r);
        let n = epoch.remaining().unwrap_or(0);
        let batches = n.saturating_sub(warmup + tail).min(num(cfg, "window_max"));
        assert!(batches > 0, "{name}: {n} batches an epoch, no window");
        let (mut w, mut waited, mut c0) = (Window::new(warmup, 0), Duration::ZERO, 0.0);
        for i in 1..=warmup + batches {
            let a = Instant::now();
            let b = epoch.next().expect("a batch").expect("a batch");
            waited += a.elapsed();
            touch.batch(&fields(&b));
            drop(b);
            if i == warmup || i == warmup + batches {
                touch.sync(); // the window's ends
            }
            if i == warmup {
                c0 = cpu_seconds();
            }
            w.step(Some(waited));
        }
        let (t, cpu) = (w.finish(), cpu_seconds() - c0);
        let wait = t.wait_share().expect("counted");
        runs.push([
            1.0 / t.per_batch(),
            wait,
            t.steps[0],
            t.steps[1],
            cpu / t.window,
        ]);
    }
    runs.sort_by(|a, b| a[0].total_cmp(&b[0]));
    let [rate, wait, p50, p90, cores] = runs[runs.len() / 2];
    let (per, unit) = match job {
        "images" => (k("batch") as f64, "images/s"),
        _ => (1.0, "batch/s"),
    };
    let (lo, hi) = (runs[0][0] * per, runs[runs.len() - 1][0] * per);
    let (rate, wait, p50, p90) = (rate * per, 100.0 * wait, 1e3 * p50, 1e3 * p90);
    let workers = k("workers");
    println!(
        "{name} {rate:.3} {unit}\n{name}.min {lo:.3} {unit}\n{name}.max {hi:.3} {unit}\n\
         {name}.wait {wait:.2} %\n{name}.p50 {p50:.4} ms\n{name}.p90 {p90:.4} ms\n\
         {name}.cores {cores:.2} cores\n{name}.workers {workers} workers"
    );
}

/// `next()` of a batch already waiting, in µs: the queue fills during a sleep, then `take`
/// batches (fewer than the prefetch depth) are timed, `overhead_rounds` times.
fn overhead<T>(cfg: &Cfg, name: &str, mut epoch: Epoch<T>) {
    epoch.by_ref().take(2).for_each(drop);
    let take = num(cfg, "overhead_take");
    let left = epoch.remaining().unwrap_or(0).saturating_sub(take) / take;
    let mut v = Vec::new();
    for _ in 0..left.min(num(cfg, "overhead_rounds")) {
        std::thread::sleep(Duration::from_millis(num(cfg, "overhead_settle_ms") as u64));
        for _ in 0..take {
            let t = Instant::now();
            let _batch = epoch.next().expect("a batch").expect("a batch");
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    v.sort_by(f64::total_cmp);
    for (s, p) in [("", 0.5), (".p90", 0.9), (".p99", 0.99)] {
        println!("{name}{s} {:.3} us", percentile(&v, p));
    }
    println!(
        "{name}.mean {:.3} us",
        v.iter().sum::<f64>() / v.len() as f64
    );
}

/// The image loaders' settings (the folder's and the shards').
fn images<S>(cfg: &Cfg, l: LoaderBuilder<S>, dev: &Device) -> LoaderBuilder<S> {
    let (n, seed) = (|k| num(cfg, k), num(cfg, "seed") as u64);
    let l = l.batch_size(n("images_batch")).shuffle(seed);
    let l = l.workers(n("images_workers"));
    l.prefetch(n("images_prefetch")).device(dev.clone())
}

fn main() {
    let dir = std::env::var("PINNABLE_TWINS_DATA").map_or_else(|_| smoke_data(), PathBuf::from);
    let mut text = std::fs::read_to_string(dir.join("twins.cfg")).expect("read twins.cfg");
    if std::env::args().any(|a| a == "--quick") {
        text.push_str(QUICK);
    }
    let lines = text.lines().filter(|l| !l.starts_with('#'));
    let pairs = lines.filter_map(|l| l.split_once(' '));
    let cfg: Cfg = pairs.map(|(k, v)| (k.into(), v.into())).collect();
    let gpu = cfg["device"].starts_with("cuda");
    let gpu = gpu.then(|| cuda_or_skip("bench python_twins (GPU rows: runs on the host)"));
    let decode = gpu.as_ref().map_or("host", |_| cfg["decode"].as_str());
    let dev = gpu.flatten().unwrap_or_else(Device::cpu);
    let (seed, dev) = (num(&cfg, "seed") as u64, &dev);
    let consumer = dev.ordinal().map(|_| Consumer::new(dev));
    let kernel = consumer.as_ref().map(|c| c.kernels.is_some());
    let touch = Touch(consumer, RefCell::default());
    let f32 = cfg["images_dtype"] == "float32";
    let (m, s) = (IMAGENET_MEAN, IMAGENET_STD);
    let mut t = Transform::resized_center_crop(256, 224);
    if f32 {
        t = t.normalize(DType::F32, m, s).expect("normalize");
    }
    let on = [DecodeOn::Host, DecodeOn::Device][usize::from(decode == "device")];
    let codec = ImageCodec::new(t).decode_on(on);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (name, choice, data) = (dev.name(), codec.chosen(dev), dir.display());
    println!("# python_twins: {name}, {cores} cores, decoder {choice}, data {data}");
    println!("# touch: read kernel {kernel:?} (Some(false): a device copy; None: host)");
    let n = |k: &str| num(&cfg, k);
    let ntok = format!("tokens_{}x{}", n("tokens_batch"), n("tokens_context"));
    let npk = format!("packed_{}x{}", n("docs_rows"), n("docs_row_tokens"));
    let img = format!("{decode}_{}", if f32 { "f32" } else { "u8" });
    let tokens = |prefetch: usize| {
        let shards = TokenShards::open([&cfg["tokens_file"]]).expect("read the tokens");
        let w = TokenWindows::new(shards, n("tokens_context")).expect("windows");
        let b = w.batcher(DType::I64).expect("a batcher");
        let l = Loader::builder(w).shuffle(seed).drop_last(true);
        let l = l.batch_size(n("tokens_batch")).prefetch(prefetch);
        let l = l.workers(n("tokens_workers")).device(dev.clone());
        l.build(b).expect("the token loader")
    };
    let packed = |prefetch: usize| {
        let shards = TokenShards::open([&cfg["docs_file"]]).expect("read the documents");
        let docs = shards.documents(n("docs_eot") as u32).expect("docs");
        let (row_tokens, rows) = (n("docs_row_tokens"), n("docs_rows"));
        let p = PackedDocs::pack(docs, Budget::Packed { row_tokens, rows }, seed).expect("a plan");
        let b = p.batcher(DType::I64).expect("a batcher");
        let l = Loader::builder(p).workers(n("docs_workers"));
        let l = l.prefetch(prefetch).device(dev.clone());
        l.build(b).expect("the packed loader")
    };
    let ours = (&cfg, &touch);
    let (nfolder, ntar) = (format!("folder_{img}"), format!("tar_{img}"));
    let xy = |b: &TokenBatch| vec![b.x.tensor().expect("x"), b.y.tensor().expect("y")];
    stream(ours, ("tokens", &ntok), tokens(n("tokens_prefetch")), xy);
    let fields = |b: &PackedBatch| {
        let mut v = vec![b.input_ids.tensor().expect("input_ids"), b.labels.clone()];
        v.extend([b.position_ids.clone(), b.cu_seqlens.clone()]);
        v.extend(b.seq_idx.clone());
        v
    };
    stream(ours, ("docs", &npk), packed(n("docs_prefetch")), fields);
    let pair = |b: &(Tensor, Tensor)| vec![b.0.clone(), b.1.clone()];
    let folder = ImageFolder::open(&cfg["images_dir"]).expect("the image folder");
    let batcher = ImageBatcher::new(codec.clone());
    let l = images(&cfg, Loader::builder(folder), dev).build(batcher);
    stream(ours, ("images", &nfolder), l.expect("folder loader"), pair);
    let tar = TarShards::open([&cfg["tar_pattern"]]).expect("the shards");
    let tar = tar.shuffle_buffer(num(&cfg, "tar_shuffle_buffer"));
    let batcher = TarImageBatcher::new(codec).label("cls");
    let l = images(&cfg, Loader::builder(tar), dev).build(batcher);
    stream(ours, ("images", &ntar), l.expect("tar loader"), pair);
    let op = num(&cfg, "overhead_prefetch");
    overhead(&cfg, &format!("next_{ntok}"), tokens(op).run_epoch(0));
    overhead(&cfg, &format!("next_{npk}"), packed(op).run_epoch(0));
    if std::env::var_os("PINNABLE_TWINS_DATA").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
