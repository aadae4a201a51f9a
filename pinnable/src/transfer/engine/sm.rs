//! The SMs as an engine: the gather kernels read pieces where they lie (pinned host memory
//! through its device mapping, or device memory) and write them, converted where asked, into
//! the batch's device allocation. One launch per kind of conversion, whatever the number of
//! pieces: the copy engine pays microseconds per copy, the SMs keep enough reads in flight to
//! fill the link with pieces of any size.
//!
//! A launch's task table is written into a pinned block, copied to the device on the copy
//! stream (the kernels read it many times; over the link each read would cost a round trip)
//! and freed there after the kernels, all in stream order.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use crate::alloc::{PinnedBlock, PinnedPool};
use crate::convert::{Convert, Resolved};
use crate::cuda::{CudaDevice, Function, Kernels};
use crate::error::{Error, Result};

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
}

/// The pieces one launch moves.
pub(crate) struct SmJob {
    pub(crate) op: SmOp,
    pub(crate) pieces: Vec<SmPiece>,
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
    let (out_size, per) = match op {
        SmOp::Copy => (1, TASK_BYTES),
        SmOp::Convert(_, layout) => (layout.to.size(), TASK_BYTES / size),
    };
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

/// Threads per task, as a shift: enough that each has [`UNROLL`] chunks of an average task in
/// flight, at most a warp.
fn lane_shift(tasks: &[Task], in_size: usize) -> u32 {
    let bytes: u64 = tasks.iter().map(|t| t.count * in_size as u64).sum();
    let chunks = (bytes / 16).div_ceil(tasks.len().max(1) as u64).max(1);
    let lanes = (chunks / UNROLL as u64).clamp(1, 32);
    63 - lanes.leading_zeros() // log2, rounded down
}

/// Launches `jobs` on `dev`'s copy stream. Returns the pinned block holding the task table:
/// the caller records the move's ready event on it, so it is not reused while the table copy
/// may still read it.
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
) -> Result<Option<Arc<PinnedBlock>>> {
    let mut table: Vec<Task> = Vec::new();
    let mut spans = Vec::with_capacity(jobs.len());
    for job in jobs {
        let start = table.len();
        tasks(&job.op, &job.pieces, &mut table);
        spans.push(start..table.len());
    }
    if table.is_empty() {
        return Ok(None);
    }
    // The per-channel coefficients follow the tasks.
    let mut coefficients: Vec<f32> = Vec::new();
    let mut coefficient_at = Vec::with_capacity(jobs.len());
    for job in jobs {
        coefficient_at.push(coefficients.len());
        if let SmOp::Convert(c, _) = &job.op {
            let (scale, offset) = c.coefficients();
            coefficients.extend_from_slice(scale);
            coefficients.extend_from_slice(offset);
        }
    }
    let task_bytes = std::mem::size_of_val(table.as_slice());
    let bytes = task_bytes + std::mem::size_of_val(coefficients.as_slice());
    let block = Arc::new(pool.alloc(bytes)?);
    // SAFETY: the block was just allocated and nothing else refers to it; both parts fit in
    // `bytes`, the tasks first (the block is page-aligned, so aligned for them).
    unsafe {
        let p = block.as_ptr();
        std::ptr::copy_nonoverlapping(table.as_ptr().cast::<u8>(), p, task_bytes);
        std::ptr::copy_nonoverlapping(
            coefficients.as_ptr().cast::<u8>(),
            p.add(task_bytes),
            bytes - task_bytes,
        );
    }
    let stream = dev.copy_stream.cu_stream();
    // SAFETY: the stream is the device's live copy stream; its context is current (the caller
    // bound it).
    let on_device = unsafe { result::malloc_async(stream, bytes) }
        .map_err(|e| Error::driver("cuMemAllocAsync", e))?;
    // SAFETY: `bytes` of the pinned block (alive until the ready event, recorded by the
    // caller, completes) into the allocation just made, in stream order.
    let copied = unsafe {
        sys::cuMemcpyHtoDAsync_v2(on_device, block.as_ptr().cast(), bytes, stream).result()
    }
    .map_err(|e| Error::driver("cuMemcpyHtoDAsync", e));
    let launched = copied.and_then(|()| {
        jobs.iter()
            .zip(&spans)
            .zip(&coefficient_at)
            .try_for_each(|((job, span), &coef)| {
                let table_at = on_device + (span.start * size_of::<Task>()) as u64;
                let coef_at = on_device + (task_bytes + coef * size_of::<f32>()) as u64;
                // SAFETY: the table holds `span` tasks whose ranges the caller vouches for;
                // the coefficients follow it; forwarded preconditions.
                unsafe { launch_one(dev, kernels, job, &table[span.clone()], table_at, coef_at) }
            })
    });
    // Freed in stream order, after the kernels that read it (also when a launch failed: the
    // kernels already queued still run first).
    // SAFETY: allocated above on this stream; freed once.
    let freed = unsafe { result::free_async(on_device, stream) }
        .map_err(|e| Error::driver("cuMemFreeAsync", e));
    launched.and(freed).map(|()| Some(block))
}

/// Launches one job's kernel over its tasks, whose table is at `table_at` on the device.
///
/// # Safety
///
/// As [`launch`]; `table_at` holds `tasks` and `coef_at` the job's coefficients, on the device.
unsafe fn launch_one(
    dev: &CudaDevice,
    kernels: &Kernels,
    job: &SmJob,
    tasks: &[Task],
    table_at: u64,
    coef_at: u64,
) -> Result<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    let shift = lane_shift(tasks, job.op.in_size());
    let threads = (tasks.len() as u64) << shift;
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
            let channels = layout.channels as u32;
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
    let (mut table, mut n, mut lane_shift) = (table_at, tasks.len() as u64, shift);
    let mut params: Vec<*mut std::ffi::c_void> = vec![
        (&mut table as *mut u64).cast(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn piece(src: u64, count: usize, first: usize) -> SmPiece {
        SmPiece {
            src,
            dst: 1 << 40,
            count,
            first,
        }
    }

    #[test]
    fn large_pieces_are_cut_into_tasks_at_element_boundaries() {
        let c = Convert::cast(DType::I64);
        let layout = c.resolve(DType::U16, &[4]).unwrap();
        let op = SmOp::Convert(c, layout);
        let mut out = Vec::new();
        // 10000 u16 = 20000 bytes: one task of 8192 elements, then 1808.
        tasks(&op, &[piece(1000, 10_000, 5)], &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].src, out[0].count, out[0].first), (1000, 8192, 5));
        assert_eq!(
            (out[1].src, out[1].dst, out[1].count, out[1].first),
            (1000 + 16384, (1 << 40) + 8192 * 8, 1808, 8197)
        );
    }

    #[test]
    fn small_tasks_get_a_few_lanes_large_ones_a_warp() {
        let mut out = Vec::new();
        tasks(&SmOp::Copy, &[piece(0, 256, 0); 8], &mut out);
        assert_eq!(lane_shift(&out, 1), 2); // 16 chunks: 4 lanes of 4
        out.clear();
        tasks(&SmOp::Copy, &[piece(0, 1 << 20, 0)], &mut out);
        assert_eq!(out.len(), 64);
        assert_eq!(lane_shift(&out, 1), 5);
        out.clear();
        tasks(&SmOp::Copy, &[piece(0, 3, 0)], &mut out);
        assert_eq!(lane_shift(&out, 1), 0);
    }
}
