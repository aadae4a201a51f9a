//! The SMs as an engine: the gather kernels read pieces where they lie (pinned host memory
//! through its device mapping, or device memory) and write them, converted where asked, into
//! the batch's device allocation. One launch per kind of conversion, whatever the number of
//! pieces: the copy engine pays microseconds per copy, the SMs keep enough reads in flight to
//! fill the link with pieces of any size.
//!
//! A launch's table — explicit tasks, or for a gather's rows and windows just each piece's
//! start (8 bytes a piece) — is written into a pinned block, copied to the device on the copy
//! stream (the kernels read it many times; over the link each read would cost a round trip)
//! and freed there after the kernels, all in stream order.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use crate::alloc::{PinnedBlock, PinnedPool};
use crate::convert::{Convert, Resolved};
use crate::cuda::{CudaDevice, Function, Kernels};
use crate::error::{Error, Result};
use crate::pieces::StartTable;
use table::{Layout, Place, write_table};

/// One piece for the SMs: `count` source elements at `src`, written from `dst` on; `first` is
/// the index, in the gathered tensor, of the piece's first element (for per-channel maps).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SmPiece {
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) count: usize,
    pub(crate) first: usize,
}

/// What a launch does to the elements.
#[derive(Clone)]
pub(crate) enum SmOp {
    /// Bytes as they are.
    Copy,
    /// A conversion (checked against its source).
    Convert(Convert, Resolved),
}

impl SmOp {
    /// Bytes of one source element.
    fn in_size(&self) -> usize {
        match self {
            SmOp::Copy => 1,
            SmOp::Convert(_, layout) => layout.from.size(),
        }
    }

    /// Bytes of one result element.
    fn out_size(&self) -> usize {
        match self {
            SmOp::Copy => 1,
            SmOp::Convert(_, layout) => layout.to.size(),
        }
    }
}

/// The pieces one launch moves.
pub(crate) struct SmJob {
    pub(crate) op: SmOp,
    pub(crate) work: SmWork,
}

/// Which pieces a launch moves.
pub(crate) enum SmWork {
    /// Pieces of any sizes and places.
    Pieces(Vec<SmPiece>),
    /// Pieces of one size (rows or windows of one source, stacked in order).
    Indexed(Indexed),
}

/// Pieces of `piece` elements each: piece `p` is read from byte `src + starts[p] * stride` on
/// and written as elements `p * piece ..` of the result at `dst`.
pub(crate) struct Indexed {
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) piece: usize,
    /// Bytes of the source per unit of a start.
    pub(crate) stride: usize,
    /// The starts, in tables one after another (each a gather's own, shared, not copied).
    pub(crate) starts: Vec<Arc<StartTable>>,
}

impl Indexed {
    fn count(&self) -> usize {
        self.starts.iter().map(|s| s.len()).sum()
    }

    fn wide(&self) -> bool {
        self.starts.first().is_some_and(|s| s.is_wide())
    }

    fn table_bytes(&self) -> usize {
        self.starts.iter().map(|s| s.bytes()).sum()
    }

    /// The device address of the starts where the kernels can read them as they lie: one
    /// small table (or tables that continue each other) in a pinned block the device maps.
    /// Read over the link, each start costs its group one round trip, which a small table's
    /// few pieces pay at once; a device table would cost the move an allocation and a copy
    /// a table.
    fn mapped_table(&self) -> Option<u64> {
        let first = self.starts.first()?;
        let block = first.pinned()?;
        let chained = self.starts.windows(2).all(|w| w[0].is_continued_by(&w[1]));
        (chained && block.is_device_mapped() && self.table_bytes() <= MAPPED_TABLE_MAX)
            .then(|| block.as_ptr() as u64 + first.byte_offset() as u64)
    }
}

/// Tables of starts up to this size are read by the kernels where they lie, in mapped pinned
/// memory ([`Indexed::mapped_table`]): up to 4096 u32 starts.
const MAPPED_TABLE_MAX: usize = 16 << 10;

impl SmWork {
    fn is_empty(&self) -> bool {
        match self {
            SmWork::Pieces(p) => p.is_empty(),
            SmWork::Indexed(ix) => ix.count() == 0 || ix.piece == 0,
        }
    }
}

impl SmJob {
    /// Whether the job moves nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.work.is_empty()
    }

    /// Takes `next` into `self` when both are pieces of one size from one source, converted
    /// alike, and `next`'s land right after `self`'s (a batch's `x` and `y`): one launch then
    /// moves both.
    pub(crate) fn absorb(&mut self, next: &mut SmJob) -> bool {
        let (SmWork::Indexed(a), SmWork::Indexed(b)) = (&mut self.work, &mut next.work) else {
            return false;
        };
        let same_op = match (&self.op, &next.op) {
            (SmOp::Copy, SmOp::Copy) => true,
            (SmOp::Convert(c, l), SmOp::Convert(d, m)) => c == d && l == m,
            _ => false,
        };
        let end = a.dst + (a.count() * a.piece * self.op.out_size()) as u64;
        let alike =
            a.src == b.src && a.piece == b.piece && a.stride == b.stride && a.wide() == b.wide();
        if !same_op || !alike || b.dst != end {
            return false;
        }
        a.starts.append(&mut b.starts);
        true
    }
}

/// `Indexed` as the kernels take it (`struct Indexed` in `gather.cu`), by value.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct IndexedParams {
    src: u64,
    dst: u64,
    starts: u64,
    piece: u64,
    splits: u64,
    stride: u64,
    wide: u64,
}

/// A task as the kernels read it (`struct Task` in `gather.cu`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Task {
    src: u64,
    dst: u64,
    count: u64,
    first: u64,
}

/// Pieces are cut into tasks of at most this many source bytes, so a few large pieces still
/// give every thread group work (a 32 MiB batch of 1 MiB rows: 2048 tasks).
const TASK_BYTES: usize = 16 << 10;
/// Chunks of 16 bytes each thread has in flight (`UNROLL` in `gather.cu`).
const UNROLL: usize = 4;
/// Threads per block.
const BLOCK: u32 = 256;

/// Blocks a launch uses at most: few, since a link-bound gather needs few SMs and the training
/// step needs the rest. `PINNABLE_GATHER_BLOCKS` overrides it.
fn max_blocks(kernels: &Kernels) -> u32 {
    static FORCED: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let forced = *FORCED.get_or_init(|| {
        std::env::var("PINNABLE_GATHER_BLOCKS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&b| b > 0)
    });
    forced.unwrap_or(kernels.multiprocessors.clamp(1, 32))
}

/// Cuts `pieces` into tasks of at most [`TASK_BYTES`] source bytes (whole elements).
fn tasks(op: &SmOp, pieces: &[SmPiece], out: &mut Vec<Task>) {
    let size = op.in_size();
    let out_size = op.out_size();
    let per = per_task(op);
    for p in pieces {
        let mut done = 0;
        while done < p.count {
            let n = per.min(p.count - done);
            out.push(Task {
                src: p.src + (done * size) as u64,
                dst: p.dst + (done * out_size) as u64,
                count: n as u64,
                first: (p.first + done) as u64,
            });
            done += n;
        }
    }
}

/// Source elements of a task at most: [`TASK_BYTES`] of them.
fn per_task(op: &SmOp) -> usize {
    TASK_BYTES / op.in_size()
}

/// Threads per task, as a shift, for `tasks` tasks of `bytes` source bytes in all: enough that
/// each has [`UNROLL`] chunks of an average task in flight, at most a warp.
fn lane_shift(bytes: u64, tasks: usize) -> u32 {
    let chunks = (bytes / 16).div_ceil(tasks.max(1) as u64).max(1);
    let lanes = (chunks / UNROLL as u64).clamp(1, 32);
    63 - lanes.leading_zeros() // log2, rounded down
}

/// `jobs` with each taking in the ones after it that it can ([`SmJob::absorb`]).
pub(crate) fn merged(jobs: Vec<SmJob>) -> Vec<SmJob> {
    let mut out: Vec<SmJob> = Vec::with_capacity(jobs.len());
    for mut job in jobs {
        if !out.last_mut().is_some_and(|last| last.absorb(&mut job)) {
            out.push(job);
        }
    }
    out
}

/// Launches `jobs` on `dev`'s copy stream. Every pinned block the enqueued work reads (the
/// launch's own table, the gathers' tables of starts, copied or read in place) is pushed onto
/// `read` before the first enqueue that reads it, so when a later copy or launch fails, the
/// blocks of the work already queued are in `read` too: the caller fences all of `read` with
/// an event recorded after its last enqueue, on success and on error alike.
///
/// # Errors
///
/// [`Error::Config`] for an affine map of more channels than the kernels index (before
/// anything is enqueued); allocation and driver errors.
///
/// # Safety
///
/// 1. Every piece's source range is readable by the device (mapped pinned memory of a live
///    block, or live device memory) and stays so until the copy stream passes this point.
/// 2. Every piece's destination range lies in a live device allocation that nothing else
///    reads or writes before the copy stream passes this point.
pub(crate) unsafe fn launch(
    dev: &CudaDevice,
    kernels: &Kernels,
    pool: &PinnedPool,
    jobs: &[SmJob],
    read: &mut Vec<Arc<PinnedBlock>>,
) -> Result<()> {
    for job in jobs {
        if let SmOp::Convert(c, layout) = &job.op
            && c.is_affine()
        {
            affine_channels(layout)?;
        }
    }
    // The device table: the host part (tasks, tables of starts on the heap, coefficients),
    // written into one pinned block and copied at once, then the tables of starts already in
    // pinned blocks, each copied as it is.
    let mut host = Layout::default();
    let mut pinned_len = 0;
    let mut plans = Vec::with_capacity(jobs.len());
    let mut tasks_of = Vec::new();
    let mut tasks_all: Vec<u64> = Vec::new();
    for job in jobs {
        let plan = match &job.work {
            SmWork::Pieces(pieces) => {
                tasks_of.clear();
                tasks(&job.op, pieces, &mut tasks_of);
                for t in &tasks_of {
                    tasks_all.extend_from_slice(&[t.src, t.dst, t.count, t.first]);
                }
                let shift = lane_shift(
                    tasks_of.iter().map(|t| t.count).sum::<u64>() * job.op.in_size() as u64,
                    tasks_of.len(),
                );
                Plan {
                    at: Place::Host(host.take(tasks_of.len() * 32)),
                    n: tasks_of.len() as u64,
                    shift,
                    indexed: None,
                }
            }
            SmWork::Indexed(ix) => {
                let per = per_task(&job.op);
                let splits = ix.piece.div_ceil(per).max(1) as u64;
                let task_elems = ix.piece.div_ceil(splits as usize);
                let n = ix.count() as u64 * splits;
                let shift = lane_shift(n * (task_elems * job.op.in_size()) as u64, n as usize);
                let bytes = ix.table_bytes();
                let at = if let Some(address) = ix.mapped_table() {
                    Place::Mapped(address)
                } else if ix.starts.iter().all(|t| t.pinned().is_some()) {
                    let at = pinned_len;
                    pinned_len = (pinned_len + bytes).next_multiple_of(8);
                    Place::Pinned(at)
                } else {
                    Place::Host(host.take(bytes))
                };
                Plan {
                    at,
                    n,
                    shift,
                    indexed: Some(IndexedParams {
                        src: ix.src,
                        dst: ix.dst,
                        starts: 0,
                        piece: ix.piece as u64,
                        splits,
                        stride: ix.stride as u64,
                        wide: u64::from(ix.wide()),
                    }),
                }
            }
        };
        plans.push(plan);
    }
    if plans.iter().all(|p| p.n == 0) {
        return Ok(());
    }
    let mut coefficients: Vec<f32> = Vec::new();
    let mut coefficient_at = Vec::with_capacity(jobs.len());
    for job in jobs {
        coefficient_at.push(host.len + coefficients.len() * 4);
        if let SmOp::Convert(c, _) = &job.op {
            let (scale, offset) = c.coefficients();
            coefficients.extend_from_slice(scale);
            coefficients.extend_from_slice(offset);
        }
    }
    let host_bytes = (host.len + coefficients.len() * 4).next_multiple_of(8);
    // A launch whose tables are all gathers' own pinned starts has no host part.
    let block = match host_bytes {
        0 => None,
        n => Some(Arc::new(pool.alloc(n)?)),
    };
    if let Some(block) = &block {
        // SAFETY: the block was just allocated and nothing else refers to it; it holds
        // `host_bytes`.
        let words = unsafe { &mut block.as_mut_slice()[..host_bytes] };
        write_table(jobs, &plans, &tasks_all, words);
        for (c, out) in coefficients
            .iter()
            .zip(words[host.len..].chunks_exact_mut(4))
        {
            out.copy_from_slice(&c.to_ne_bytes());
        }
    }
    let stream = dev.copy_stream.cu_stream();
    let total = host_bytes + pinned_len;
    let table_memory = match total {
        0 => None,
        // SAFETY: written by the table's copies below before the kernels read it.
        n => Some(unsafe { dev.alloc(n) }.map_err(|e| Error::driver("cuMemAllocAsync", e))?),
    };
    let on_device = table_memory.as_ref().map_or(0, |m| {
        use cudarc::driver::DevicePtr;
        let (ptr, _) = m.device_ptr(&dev.copy_stream);
        ptr
    });
    let copy = |dst: u64, src: *const u8, bytes: usize| {
        crate::transfer::fault::enqueue("cuMemcpyHtoDAsync")?;
        // SAFETY: `bytes` of a pinned block (noted in `read` before this call, so the caller
        // fences it after this copy whatever happens next) into the allocation made above, in
        // stream order.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, stream).result() }
            .map_err(|e| Error::driver("cuMemcpyHtoDAsync", e))
    };
    // Each block is noted before the copy or kernel that reads it is enqueued: from then on
    // the caller's fence covers it, on the error path too.
    let mut copied = Ok(());
    if let Some(block) = block {
        read.push(block.clone());
        copied = copy(on_device, block.as_ptr(), host_bytes);
    }
    for (job, plan) in jobs.iter().zip(&plans) {
        let SmWork::Indexed(ix) = &job.work else {
            continue;
        };
        match plan.at {
            Place::Pinned(at) => {
                let mut dst = on_device + (host_bytes + at) as u64;
                for t in &ix.starts {
                    let b = t.pinned().expect("placed with the pinned tables");
                    read.push(b.clone());
                    let src = b.as_ptr().wrapping_add(t.byte_offset());
                    copied = copied.and_then(|()| copy(dst, src, t.bytes()));
                    dst += t.bytes() as u64;
                }
            }
            // The kernels read the table itself, over the link: its block is noted before
            // the first kernel is enqueued, as the tables copied are.
            Place::Mapped(_) => read.extend(ix.starts.iter().filter_map(|t| t.pinned().cloned())),
            Place::Host(_) => {}
        }
    }
    let launched = copied.and_then(|()| {
        jobs.iter()
            .zip(&plans)
            .zip(&coefficient_at)
            .try_for_each(|((job, plan), &coef)| {
                let table_at = match plan.at {
                    Place::Host(at) => on_device + at as u64,
                    Place::Pinned(at) => on_device + (host_bytes + at) as u64,
                    Place::Mapped(address) => address,
                };
                let coef_at = on_device + coef as u64;
                // SAFETY: the table holds the plan's tasks or starts, whose ranges the caller
                // vouches for; the coefficients are where `coefficient_at` says; forwarded
                // preconditions.
                unsafe { launch_one(dev, kernels, job, plan, table_at, coef_at) }
            })
    });
    // Freed in the copy stream's order, after the kernels that read it (also when a launch
    // failed: the kernels already queued still run first).
    drop(table_memory);
    launched
}

/// One job's launch: where its table lies, its task count and group size, and its indexed
/// pieces (`None` for a table of tasks).
struct Plan {
    at: Place,
    n: u64,
    shift: u32,
    indexed: Option<IndexedParams>,
}

/// Launches one job's kernel, whose table (tasks or starts) is at `table_at` on the device.
///
/// # Safety
///
/// As [`launch`]; `table_at` holds the plan's tasks or starts and `coef_at` the job's
/// coefficients, on the device.
unsafe fn launch_one(
    dev: &CudaDevice,
    kernels: &Kernels,
    job: &SmJob,
    plan: &Plan,
    table_at: u64,
    coef_at: u64,
) -> Result<()> {
    if plan.n == 0 {
        return Ok(());
    }
    let shift = plan.shift;
    let threads = plan.n << shift;
    let blocks = threads
        .div_ceil(u64::from(BLOCK))
        .min(u64::from(max_blocks(kernels))) as u32;
    let missing = |from, to| Error::Config {
        setting: "convert",
        problem: format!("no kernel converts {from} to {to}"),
    };
    let (function, mut affine) = match &job.op {
        SmOp::Copy => (kernels.copy, None),
        SmOp::Convert(c, layout) if c.is_affine() => {
            let f = kernels
                .affine(layout.to)
                .ok_or_else(|| missing(layout.from, layout.to))?;
            let channels = affine_channels(layout)?;
            let offset_at = coef_at + u64::from(channels) * 4;
            (f, Some((coef_at, offset_at, channels, layout.inner as u64)))
        }
        SmOp::Convert(_, layout) => {
            let f = kernels
                .cast(layout.from, layout.to)
                .ok_or_else(|| missing(layout.from, layout.to))?;
            (f, None)
        }
    };
    let (mut tasks, mut indexed) = match plan.indexed {
        Some(ix) => (
            0u64,
            IndexedParams {
                starts: table_at,
                ..ix
            },
        ),
        None => (table_at, IndexedParams::default()),
    };
    let (mut n, mut lane_shift) = (plan.n, shift);
    let mut params: Vec<*mut std::ffi::c_void> = vec![
        (&mut tasks as *mut u64).cast(),
        (&mut indexed as *mut IndexedParams).cast(),
        (&mut n as *mut u64).cast(),
        (&mut lane_shift as *mut u32).cast(),
    ];
    if let Some((scale, offset, channels, inner)) = &mut affine {
        params.extend([
            (scale as *mut u64).cast(),
            (offset as *mut u64).cast(),
            (channels as *mut u32).cast(),
            (inner as *mut u64).cast(),
        ]);
    }
    // SAFETY: the parameters are the kernel's, in order, and live for the call; forwarded
    // preconditions for what it reads and writes.
    unsafe { launch_kernel(dev, function, blocks, &mut params) }
}

/// The channel count of an affine map as the kernels take it (`u32 channels` in `gather.cu`).
///
/// # Errors
///
/// [`Error::Config`] above `u32::MAX` channels: such a map's coefficients alone would take
/// 32 GiB, and the kernels index channels in 32 bits.
fn affine_channels(layout: &Resolved) -> Result<u32> {
    u32::try_from(layout.channels).map_err(|_| Error::Config {
        setting: "convert",
        problem: format!(
            "an affine map over {} channels is more than the gather kernels index ({}); \
             give the channels along a dimension of at most that size",
            layout.channels,
            u32::MAX
        ),
    })
}

/// One kernel launch on `dev`'s copy stream.
///
/// # Safety
///
/// 1. `params` point at live values matching the kernel's parameters, in order.
/// 2. What the kernel reads and writes is valid until the stream passes this point.
unsafe fn launch_kernel(
    dev: &CudaDevice,
    function: Function,
    blocks: u32,
    params: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    crate::transfer::fault::enqueue("cuLaunchKernel")?;
    // SAFETY: forwarded from the caller; the function belongs to a module of `dev`'s context,
    // which is current.
    unsafe {
        result::launch_kernel(
            function.0,
            (blocks.max(1), 1, 1),
            (BLOCK, 1, 1),
            0,
            dev.copy_stream.cu_stream(),
            params,
        )
    }
    .map_err(|e| Error::driver("cuLaunchKernel", e))
}

mod table;
#[cfg(test)]
mod tests;
