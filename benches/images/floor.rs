//! The machine's floor for the loader: N threads, each reading, decoding and transforming the
//! files into one reused batch block of its own, with no loader (no jobs, permits, channels or
//! pool), and the CPU's topology, so the loader's figure can be read against what the cores
//! give with nothing else running.

use std::collections::BTreeSet;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::Instant;

use pinnable::formats::image::{ImageCodec, ImageFolder, Transform};
use pinnable::loader::{Dataset, SplitMix64};
use pinnable::{BatchLayout, PinnedBatch, Slot};

/// The CPUs as Linux describes them (`/sys/devices/system/cpu`, `/proc/cpuinfo`).
pub struct Cpus {
    /// Online logical CPUs.
    pub logical: usize,
    /// Distinct physical cores among them (sets of hyperthread siblings).
    pub cores: usize,
    /// Distinct packages (sockets).
    pub packages: usize,
    /// The CPUs this process may run on (affinity, cgroup quota).
    pub usable: usize,
    pub model: String,
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    Some(std::fs::read_to_string(path).ok()?.trim().to_string())
}

/// `0-3,8,10-11` as the CPUs it lists.
fn cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let mut ends = part
            .split('-')
            .filter_map(|n| n.trim().parse::<usize>().ok());
        if let Some(lo) = ends.next() {
            cpus.extend(lo..=ends.next().unwrap_or(lo));
        }
    }
    cpus
}

impl Cpus {
    pub fn read() -> Cpus {
        let base = Path::new("/sys/devices/system/cpu");
        let online = read(base.join("online")).map_or_else(Vec::new, |l| cpu_list(&l));
        let (mut cores, mut packages) = (BTreeSet::new(), BTreeSet::new());
        for cpu in &online {
            let topo = base.join(format!("cpu{cpu}/topology"));
            if let Some(siblings) = read(topo.join("thread_siblings_list")) {
                cores.insert(cpu_list(&siblings));
            }
            if let Some(p) = read(topo.join("physical_package_id")) {
                packages.insert(p);
            }
        }
        let model = read("/proc/cpuinfo")
            .and_then(|info| {
                let line = info.lines().find(|l| l.starts_with("model name"))?;
                Some(line.split_once(':')?.1.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        Cpus {
            logical: online.len(),
            cores: cores.len(),
            packages: packages.len(),
            usable: std::thread::available_parallelism().map_or(1, |n| n.get()),
            model,
        }
    }
}

impl fmt::Display for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_core = if self.cores > 0 {
            format!("{:.0}", self.logical as f64 / self.cores as f64)
        } else {
            "?".into()
        };
        write!(
            f,
            "{} logical CPUs on {} physical cores ({per_core} hardware thread(s) per core as the kernel \
             is told; a virtual machine may hide hyperthreads), {} package(s), {} usable by \
             this process; {}",
            self.logical, self.cores, self.packages, self.usable, self.model
        )
    }
}

/// Writes the next `rows`-long batch of `folder`'s samples (from the `k`th, cycled) into
/// `block`'s slot `slot`, as `codec` makes them.
fn write_batch(
    folder: &ImageFolder,
    codec: &ImageCodec,
    block: &mut PinnedBatch,
    slot: Slot,
    k: &mut usize,
) {
    for mut row in block.view_mut(slot).rows_mut() {
        let sample = folder.get(*k % folder.len()).expect("sample");
        let bytes = sample.bytes().expect("read");
        codec
            .write(&bytes, sample.path(), &mut row, SplitMix64::new(*k as u64))
            .expect("write");
        *k += 1;
    }
}

/// Images a second of `threads` threads, each reading, decoding and transforming `batches`
/// batches of `batch` images (its own share of `files`, cycled) into one block of its own,
/// after one warm-up batch; the time is from all starting together to the last one done.
pub fn images_per_s(
    files: &[PathBuf],
    transform: &Transform,
    threads: usize,
    batch: usize,
    batches: usize,
) -> f64 {
    let folder = ImageFolder::from_list(files.iter().map(|p| (p.clone(), 0)));
    let codec = ImageCodec::new(transform.clone());
    let start = Barrier::new(threads + 1);
    let (folder, codec, start) = (&folder, &codec, &start);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    // A panic before the start is carried past it, so no thread waits forever.
                    let ready = catch_unwind(AssertUnwindSafe(|| {
                        let mut layout = BatchLayout::new();
                        let [c, h, w] = codec.shape();
                        let slot = layout
                            .push(codec.dtype(), &[batch, c, h, w])
                            .expect("layout");
                        let mut block = layout.allocate().expect("block");
                        let mut k = t * (batches + 1) * batch;
                        write_batch(folder, codec, &mut block, slot, &mut k);
                        (block, slot, k)
                    }));
                    start.wait();
                    let (mut block, slot, mut k) = ready.unwrap_or_else(|p| resume_unwind(p));
                    for _ in 0..batches {
                        write_batch(folder, codec, &mut block, slot, &mut k);
                    }
                    Instant::now()
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        let end = handles
            .into_iter()
            .map(|h| h.join().expect("a floor thread panicked"))
            .max()
            .unwrap_or(t0);
        (threads * batches * batch) as f64 / (end - t0).as_secs_f64()
    })
}
