//! The SMs resampling decoded images: the images of a batch lie one after another in its
//! pinned block, each of its own size; one launch crops, resizes (PIL's antialiased bilinear
//! filter, in f32), flips and normalises every one of them into the batch's `[B, 3, S, S]`
//! result, reading the pixels through the block's device mapping (`resample_*` in
//! `gather.cu`).
//!
//! The per-image table (64 bytes an image) is copied to the device with the launch's other
//! tables; the pixels are read where they lie.

// Only the `image` feature makes resample jobs.
#![cfg_attr(not(feature = "image"), allow(dead_code))]

use super::launch_kernel;
use crate::cuda::{CudaDevice, Kernels};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Bytes of one image's entry in a launch's table (`ResampleImage` in `gather.cu`): `u64`
/// offset, then `u32` width, height, crop x, y, width, height, resized width, height, `i32`
/// corner x, y, `u32` flip, and three unused words.
pub(crate) const ENTRY_BYTES: usize = 64;

/// Output pixels of a tile, across and down (`TILE_W`, `TILE_H` in `gather.cu`).
const TILE_W: u32 = 32;
const TILE_H: u32 = 16;

/// One launch: every image of a batch into its result.
pub(crate) struct Resample {
    /// Device address the table's offsets count from: the pixels' first byte, in mapped
    /// pinned memory.
    pub(crate) src: u64,
    /// [`ENTRY_BYTES`] an image, checked against the pixels by the caller.
    pub(crate) table: std::sync::Arc<[u8]>,
    /// Device address of the `[count, 3, size, size]` result.
    pub(crate) dst: u64,
    pub(crate) size: u32,
    /// The result's element type: `U8`, or `F32`, `F16`, `BF16` as `fmaf(u8, scale, offset)`.
    pub(crate) dtype: DType,
    pub(crate) scale: [f32; 3],
    pub(crate) offset: [f32; 3],
}

impl Resample {
    /// Images.
    pub(crate) fn count(&self) -> usize {
        self.table.len() / ENTRY_BYTES
    }

    /// Tiles across and down one image.
    fn tiles(&self) -> (u32, u32) {
        (self.size.div_ceil(TILE_W), self.size.div_ceil(TILE_H))
    }

    /// Tiles of the launch: its units of work.
    pub(crate) fn units(&self) -> u64 {
        let (x, y) = self.tiles();
        self.count() as u64 * u64::from(x) * u64::from(y)
    }
}

/// `Resample` as the kernels take it (`struct Resample` in `gather.cu`), by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct Params {
    src: u64,
    images: u64,
    dst: u64,
    count: u32,
    size: u32,
    tiles_x: u32,
    tiles_y: u32,
    scale: [f32; 3],
    offset: [f32; 3],
}

const _: () = assert!(std::mem::size_of::<Params>() == 64);

/// Launches `r` on `dev`'s copy stream, its table at `table_at` on the device.
///
/// # Safety
///
/// 1. The table at `table_at` holds `r.table`, and every entry's pixels lie in mapped pinned
///    memory from `r.src` on that stays alive until the copy stream passes this point.
/// 2. `r.dst` starts `count * 3 * size * size` elements of `r.dtype` in a live device
///    allocation that nothing else reads or writes before the copy stream passes this point.
pub(super) unsafe fn launch_one(
    dev: &CudaDevice,
    kernels: &Kernels,
    r: &Resample,
    table_at: u64,
) -> Result<()> {
    let units = r.units();
    if units == 0 {
        return Ok(());
    }
    let function = kernels.resample(r.dtype).ok_or_else(|| Error::Config {
        setting: "resample",
        problem: format!("no kernel resamples into {}", r.dtype),
    })?;
    let (tiles_x, tiles_y) = r.tiles();
    let mut params = Params {
        src: r.src,
        images: table_at,
        dst: r.dst,
        count: u32::try_from(r.count()).map_err(|_| Error::Config {
            setting: "resample",
            problem: format!("{} images are too many for one launch", r.count()),
        })?,
        size: r.size,
        tiles_x,
        tiles_y,
        scale: r.scale,
        offset: r.offset,
    };
    // Enough blocks to keep reads in flight over the link on every SM; each takes tiles in
    // turn.
    let blocks = units.min(u64::from(kernels.multiprocessors) * 4) as u32;
    let mut args: Vec<*mut std::ffi::c_void> = vec![(&mut params as *mut Params).cast()];
    // SAFETY: the one parameter is the kernel's `Resample`, by value, alive for the call;
    // forwarded preconditions for what it reads and writes.
    unsafe { launch_kernel(dev, function, blocks, &mut args) }
}
