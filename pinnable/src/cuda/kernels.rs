//! The crate's own kernels (`pinnable/kernels/gather.cu`), shipped as PTX and loaded into a
//! device's context by the driver's JIT the first time a move needs them.
//!
//! Nothing here needs a CUDA toolkit: the PTX is embedded in the crate. If the module cannot be
//! loaded (a driver older than the PTX, a JIT failure) or the device cannot read pinned host
//! memory through the host's own addresses, moves use the copy engine and host staging instead:
//! that is said once, on standard error, and [`gather_kernels`] reports why.

use std::ffi::CStr;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys};

use super::{CudaDevice, Device};
use crate::dtype::DType;
use crate::error::result_name;

/// The PTX of `pinnable/kernels/gather.cu`, built by `scripts/ptx.sh`.
const GATHER_PTX: &str = concat!(include_str!("../../kernels/gather.ptx"), "\0");

/// A kernel entry point of a loaded module.
#[derive(Clone, Copy)]
pub(crate) struct Function(pub(crate) sys::CUfunction);

// SAFETY: a CUfunction is a handle the driver lets any thread launch with; the module it belongs
// to is never unloaded (see `Kernels`).
unsafe impl Send for Function {}
// SAFETY: as for Send; launching does not mutate the handle.
unsafe impl Sync for Function {}

/// The gather kernels of one device. The module stays loaded for the life of the process (it
/// belongs to the device's primary context, which this crate keeps retained).
pub(crate) struct Kernels {
    /// Bytes as they are.
    pub(crate) copy: Function,
    /// Integer casts: `[u8, u16, u32]` × `[i32, i64]`.
    cast: [[Function; 2]; 3],
    /// u8 affine maps to `[f32, f16, bf16]`.
    affine: [Function; 3],
    /// Multiprocessors on the device, for sizing grids.
    pub(crate) multiprocessors: u32,
}

impl Kernels {
    /// The cast kernel from `from` to `to`, if there is one.
    pub(crate) fn cast(&self, from: DType, to: DType) -> Option<Function> {
        let i = match from {
            DType::U8 => 0,
            DType::U16 => 1,
            DType::U32 => 2,
            _ => return None,
        };
        let j = match to {
            DType::I32 => 0,
            DType::I64 => 1,
            _ => return None,
        };
        Some(self.cast[i][j])
    }

    /// The affine kernel from u8 to `to`, if there is one.
    pub(crate) fn affine(&self, to: DType) -> Option<Function> {
        match to {
            DType::F32 => Some(self.affine[0]),
            DType::F16 => Some(self.affine[1]),
            DType::BF16 => Some(self.affine[2]),
            _ => None,
        }
    }
}

/// Per ordinal: the kernels, or why they are not there, once tried.
type Loaded = Arc<OnceLock<std::result::Result<Arc<Kernels>, String>>>;
static LOADED: Mutex<Vec<Loaded>> = Mutex::new(Vec::new());

/// The slot of `ordinal` (taken under the lock; loading happens outside it).
fn slot(ordinal: usize) -> Loaded {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if loaded.len() <= ordinal {
        loaded.resize_with(ordinal + 1, Default::default);
    }
    loaded[ordinal].clone()
}

/// The gather kernels of `dev`, loaded on first use; `None` (said once) when they cannot run.
pub(crate) fn kernels(dev: &CudaDevice) -> Option<Arc<Kernels>> {
    loaded(dev).as_ref().ok().cloned()
}

fn loaded(dev: &CudaDevice) -> std::result::Result<Arc<Kernels>, String> {
    slot(dev.ordinal)
        .get_or_init(|| {
            let result = load(dev);
            if let Err(why) = &result {
                eprintln!(
                    "pinnable: the gather kernels are off on cuda:{} ({why}); small pieces move \
                     by the copy engine and host staging instead",
                    dev.ordinal
                );
            }
            result
        })
        .clone()
}

/// Whether the gather kernels run on `device`: `Ok(())`, or why not (loading them if no move
/// has yet). See [`Device::gather_kernels`].
pub(crate) fn gather_kernels(device: &Device) -> std::result::Result<(), String> {
    let dev = device
        .cuda_device("gather_kernels")
        .map_err(|e| e.to_string())?;
    loaded(dev).map(|_| ())
}

fn load(dev: &CudaDevice) -> std::result::Result<Arc<Kernels>, String> {
    if std::env::var("PINNABLE_GATHER_KERNELS").as_deref() == Ok("0") {
        return Err("turned off by PINNABLE_GATHER_KERNELS=0".into());
    }
    // The kernels read pinned host memory at the host's own addresses.
    let attr = |a| dev.ctx.attribute(a).unwrap_or(0);
    if attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) != 1
        || attr(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
        ) != 1
    {
        return Err("the device cannot read pinned host memory at its host addresses".into());
    }
    dev.ctx
        .bind_to_thread()
        .map_err(|e| format!("cuCtxSetCurrent failed with {}", result_name(e.0)))?;
    // SAFETY: the PTX is NUL-terminated and lives for the process; a context is current.
    let module = unsafe { result::module::load_data(GATHER_PTX.as_ptr().cast()) }
        .map_err(|e| format!("cuModuleLoadData failed with {}", result_name(e.0)))?;
    let function = |name: &CStr| -> std::result::Result<Function, String> {
        let mut f = std::ptr::null_mut();
        // SAFETY: the module was just loaded and is never unloaded; the name is a C string.
        let r = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(Function(f))
        } else {
            Err(format!(
                "cuModuleGetFunction({name:?}) failed with {}",
                result_name(r)
            ))
        }
    };
    let multiprocessors =
        attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).max(1) as u32;
    Ok(Arc::new(Kernels {
        copy: function(c"gather_copy")?,
        cast: [
            [
                function(c"gather_cast_u8_i32")?,
                function(c"gather_cast_u8_i64")?,
            ],
            [
                function(c"gather_cast_u16_i32")?,
                function(c"gather_cast_u16_i64")?,
            ],
            [
                function(c"gather_cast_u32_i32")?,
                function(c"gather_cast_u32_i64")?,
            ],
        ],
        affine: [
            function(c"gather_affine_u8_f32")?,
            function(c"gather_affine_u8_f16")?,
            function(c"gather_affine_u8_bf16")?,
        ],
        multiprocessors,
    }))
}

/// The PTX of `pinnable/kernels/image.cu`, built by `scripts/ptx.sh`.
#[cfg(feature = "image")]
const IMAGE_PTX: &str = concat!(include_str!("../../kernels/image.ptx"), "\0");

/// The image kernels of one device (`formats::image::gpu`), loaded like the gather kernels.
#[cfg(feature = "image")]
pub(crate) struct ImageKernels {
    /// `image_rows`: the crop's rows filtered across.
    pub(crate) rows: Function,
    /// `image_out_b{1,2,4}`: filtered down and written, by output element size.
    pub(crate) out: [Function; 3],
}

#[cfg(feature = "image")]
type LoadedImage = Arc<OnceLock<std::result::Result<Arc<ImageKernels>, String>>>;
#[cfg(feature = "image")]
static LOADED_IMAGE: Mutex<Vec<LoadedImage>> = Mutex::new(Vec::new());

/// The image kernels of `dev`, loaded on first use, or why they cannot be.
#[cfg(feature = "image")]
pub(crate) fn image_kernels(dev: &CudaDevice) -> std::result::Result<Arc<ImageKernels>, String> {
    let slot = {
        let mut loaded = LOADED_IMAGE.lock().unwrap_or_else(|e| e.into_inner());
        if loaded.len() <= dev.ordinal {
            loaded.resize_with(dev.ordinal + 1, Default::default);
        }
        loaded[dev.ordinal].clone()
    };
    slot.get_or_init(|| {
        dev.ctx
            .bind_to_thread()
            .map_err(|e| format!("cuCtxSetCurrent failed with {}", result_name(e.0)))?;
        // SAFETY: the PTX is NUL-terminated and lives for the process; a context is current.
        let module =
            unsafe { result::module::load_data(IMAGE_PTX.as_ptr().cast()) }.map_err(|e| {
                format!(
                    "cuModuleLoadData(image.ptx) failed with {}",
                    result_name(e.0)
                )
            })?;
        let function = |name: &CStr| -> std::result::Result<Function, String> {
            let mut f = std::ptr::null_mut();
            // SAFETY: the module was just loaded and is never unloaded; the name is a C string.
            let r = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
            if r == sys::CUresult::CUDA_SUCCESS {
                Ok(Function(f))
            } else {
                Err(format!(
                    "cuModuleGetFunction({name:?}) failed with {}",
                    result_name(r)
                ))
            }
        };
        Ok(Arc::new(ImageKernels {
            rows: function(c"image_rows")?,
            out: [
                function(c"image_out_b1")?,
                function(c"image_out_b2")?,
                function(c"image_out_b4")?,
            ],
        }))
    })
    .clone()
}

/// The PTX of `pinnable/kernels/pack.cu`, built by `scripts/ptx.sh`.
const PACK_PTX: &str = concat!(include_str!("../../kernels/pack.ptx"), "\0");

/// The packing kernels of one device (`formats::tokens::PackedBatcher::on_device`), loaded
/// like the gather kernels: `pack_{u16,u32}_{i32,i64}`, by token type then output dtype.
pub(crate) struct PackKernels {
    pub(crate) pack: [[Function; 2]; 2],
}

type LoadedPack = Arc<OnceLock<std::result::Result<Arc<PackKernels>, String>>>;
static LOADED_PACK: Mutex<Vec<LoadedPack>> = Mutex::new(Vec::new());

/// The packing kernels of `dev`, loaded on first use, or why they cannot be.
pub(crate) fn pack_kernels(dev: &CudaDevice) -> std::result::Result<Arc<PackKernels>, String> {
    let slot = {
        let mut loaded = LOADED_PACK.lock().unwrap_or_else(|e| e.into_inner());
        if loaded.len() <= dev.ordinal {
            loaded.resize_with(dev.ordinal + 1, Default::default);
        }
        loaded[dev.ordinal].clone()
    };
    slot.get_or_init(|| {
        dev.ctx
            .bind_to_thread()
            .map_err(|e| format!("cuCtxSetCurrent failed with {}", result_name(e.0)))?;
        // SAFETY: the PTX is NUL-terminated and lives for the process; a context is current.
        let module =
            unsafe { result::module::load_data(PACK_PTX.as_ptr().cast()) }.map_err(|e| {
                format!(
                    "cuModuleLoadData(pack.ptx) failed with {}",
                    result_name(e.0)
                )
            })?;
        let function = |name: &CStr| -> std::result::Result<Function, String> {
            let mut f = std::ptr::null_mut();
            // SAFETY: the module was just loaded and is never unloaded; the name is a C string.
            let r = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
            if r == sys::CUresult::CUDA_SUCCESS {
                Ok(Function(f))
            } else {
                Err(format!(
                    "cuModuleGetFunction({name:?}) failed with {}",
                    result_name(r)
                ))
            }
        };
        Ok(Arc::new(PackKernels {
            pack: [
                [function(c"pack_u16_i32")?, function(c"pack_u16_i64")?],
                [function(c"pack_u32_i32")?, function(c"pack_u32_i64")?],
            ],
        }))
    })
    .clone()
}
