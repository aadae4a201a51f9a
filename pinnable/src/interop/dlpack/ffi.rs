//! The DLPack C ABI (version 1.1 of `dlpack.h`), as `#[repr(C)]` Rust types.
//!
//! The ABI is small and stable: a major version change is the only thing that may change these
//! layouts, and a consumer must then only call the deleter. Sizes are checked at compile time
//! on 64-bit targets.

use std::ffi::c_void;

/// The DLPack version these types follow.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// The minor version of what this crate produces (it uses nothing newer than 1.0).
pub const DLPACK_MINOR_VERSION: u32 = 0;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const FLAG_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy the consumer owns alone.
pub const FLAG_IS_COPIED: u64 = 1 << 1;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Changes when the layout of [`DLManagedTensorVersioned`] changes.
    pub major: u32,
    /// Changes when codes are added.
    pub minor: u32,
}

/// `DLDeviceType` (a C enum: an `int32_t`).
pub type DLDeviceType = i32;
/// `kDLCPU`: ordinary host memory.
pub const KDL_CPU: DLDeviceType = 1;
/// `kDLCUDA`: memory of a CUDA device.
pub const KDL_CUDA: DLDeviceType = 2;
/// `kDLCUDAHost`: page-locked host memory from `cudaMallocHost`.
pub const KDL_CUDA_HOST: DLDeviceType = 3;
/// `kDLCUDAManaged`: CUDA managed (unified) memory.
pub const KDL_CUDA_MANAGED: DLDeviceType = 13;

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    /// One of the `KDL_*` codes.
    pub device_type: DLDeviceType,
    /// The device ordinal; 0 for host memory.
    pub device_id: i32,
}

/// `kDLInt`.
pub const KDL_INT: u8 = 0;
/// `kDLUInt`.
pub const KDL_UINT: u8 = 1;
/// `kDLFloat` (IEEE).
pub const KDL_FLOAT: u8 = 2;
/// `kDLBfloat`.
pub const KDL_BFLOAT: u8 = 4;
/// `kDLComplex`.
pub const KDL_COMPLEX: u8 = 5;
/// `kDLBool` (one byte per element).
pub const KDL_BOOL: u8 = 6;

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    /// One of the `KDL_*` type codes.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`: a view of memory that it does not manage.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// The data (a host or device address); may be null when the tensor is empty.
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// The element type.
    pub dtype: DLDataType,
    /// `ndim` sizes.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or null for a row-major layout (allowed before DLPack 1.2).
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor` (the legacy, unversioned form).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done; frees `self` too.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The ABI version of this struct.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done; frees `self` too.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `FLAG_*` bits.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<DLDevice>() == 8);
    assert!(size_of::<DLDataType>() == 4);
    assert!(size_of::<DLTensor>() == 48);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
    assert!(std::mem::offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
};
