//! nvJPEG, NVIDIA's JPEG codec library, loaded at run time: the few functions the device
//! decoder calls, declared with the C signatures of `nvjpeg.h` (CUDA 12 and 13 agree on them).
//!
//! Nothing is linked at build time. [`Library::load`] looks where [`search`] says: a path the
//! user names (`PINNABLE_NVJPEG`), the system loader's search, CUDA toolkits, and a Python
//! environment's NVIDIA wheels only when `PINNABLE_NVJPEG_FROM_PYTHON` asks for them.

use std::ffi::{c_int, c_uchar, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::search::{NAMES, search};

/// `nvjpegStatus_t`.
pub(crate) type Status = c_int;
pub(crate) const SUCCESS: Status = 0;
pub(crate) const INVALID_PARAMETER: Status = 2;
pub(crate) const ARCH_MISMATCH: Status = 7;

/// `nvjpegHandle_t`, `nvjpegJpegState_t`, `nvjpegJpegStream_t`: opaque pointers.
pub(crate) type Handle = *mut c_void;
pub(crate) type State = *mut c_void;
pub(crate) type JpegStream = *mut c_void;
/// `cudaStream_t`: the runtime's name for a driver `CUstream`.
pub(crate) type Stream = cudarc::driver::sys::CUstream;

/// `nvjpegBackend_t`.
pub(crate) const BACKEND_DEFAULT: c_int = 0;
pub(crate) const BACKEND_HARDWARE: c_int = 3;
/// `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION`: chroma upsampled by interpolation (as libjpeg's
/// and zune-jpeg's "fancy" upsampling) rather than by repetition; libraries older than the flag
/// refuse it, and are then opened without it.
pub(crate) const FLAGS_UPSAMPLING_WITH_INTERPOLATION: c_uint = 1 << 5;
/// `nvjpegOutputFormat_t::NVJPEG_OUTPUT_RGB`: planar RGB, one channel in each of
/// `channel[0..3]`.
pub(crate) const OUTPUT_RGB: c_int = 3;
/// `NVJPEG_MAX_COMPONENT`.
pub(crate) const MAX_COMPONENT: usize = 4;

/// `nvjpegImage_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ImageDesc {
    pub(crate) channel: [*mut c_uchar; MAX_COMPONENT],
    pub(crate) pitch: [usize; MAX_COMPONENT],
}

impl ImageDesc {
    /// Planar RGB from device address `ptr`: three planes of `width × height` bytes, one
    /// after the other.
    pub(crate) fn rgb_planes(ptr: u64, width: usize, height: usize) -> ImageDesc {
        let mut d = ImageDesc {
            channel: [std::ptr::null_mut(); MAX_COMPONENT],
            pitch: [0; MAX_COMPONENT],
        };
        for c in 0..3 {
            d.channel[c] = (ptr + (c * width * height) as u64) as *mut c_uchar;
            d.pitch[c] = width;
        }
        d
    }
}

/// The entry points called, with `nvjpeg.h`'s signatures.
pub(crate) struct Api {
    /// `nvjpegCreateEx(backend, dev_allocator*, pinned_allocator*, flags, handle*)`; both
    /// allocators null: the library's own (see the module `gpu` for why).
    pub(crate) create_ex:
        unsafe extern "C" fn(c_int, *mut c_void, *mut c_void, c_uint, *mut Handle) -> Status,
    pub(crate) destroy: unsafe extern "C" fn(Handle) -> Status,
    pub(crate) state_create: unsafe extern "C" fn(Handle, *mut State) -> Status,
    pub(crate) state_destroy: unsafe extern "C" fn(State) -> Status,
    /// `nvjpegGetImageInfo(handle, data, length, nComponents*, subsampling*, widths*, heights*)`.
    pub(crate) get_image_info: unsafe extern "C" fn(
        Handle,
        *const c_uchar,
        usize,
        *mut c_int,
        *mut c_int,
        *mut c_int,
        *mut c_int,
    ) -> Status,
    /// `nvjpegDecode(handle, state, data, length, output_format, destination*, stream)`.
    pub(crate) decode: unsafe extern "C" fn(
        Handle,
        State,
        *const c_uchar,
        usize,
        c_int,
        *mut ImageDesc,
        Stream,
    ) -> Status,
    /// `nvjpegDecodeBatchedInitialize(handle, state, batch_size, max_cpu_threads, format)`.
    pub(crate) batched_initialize:
        unsafe extern "C" fn(Handle, State, c_int, c_int, c_int) -> Status,
    /// `nvjpegDecodeBatched(handle, state, const data* const*, lengths*, destinations*, stream)`.
    pub(crate) decode_batched: unsafe extern "C" fn(
        Handle,
        State,
        *const *const c_uchar,
        *const usize,
        *mut ImageDesc,
        Stream,
    ) -> Status,
    /// `nvjpegDecodeBatchedSupported(handle, jpeg_stream, is_supported*)`: 0 means supported.
    pub(crate) batched_supported: unsafe extern "C" fn(Handle, JpegStream, *mut c_int) -> Status,
    pub(crate) stream_create: unsafe extern "C" fn(Handle, *mut JpegStream) -> Status,
    pub(crate) stream_destroy: unsafe extern "C" fn(JpegStream) -> Status,
    /// `nvjpegJpegStreamParseHeader(handle, data, length, jpeg_stream)`.
    pub(crate) stream_parse_header:
        unsafe extern "C" fn(Handle, *const c_uchar, usize, JpegStream) -> Status,
    /// `nvjpegGetProperty(libraryPropertyType, value*)`: 0 major, 1 minor, 2 patch.
    pub(crate) get_property: unsafe extern "C" fn(c_int, *mut c_int) -> Status,
}

/// The loaded library: its entry points and where it was found. Never unloaded.
pub(crate) struct Library {
    pub(crate) api: Api,
    pub(crate) path: PathBuf,
    /// Kept so that the entry points stay valid.
    _lib: libloading::Library,
}

/// The name of a status, for messages.
pub(crate) fn status_name(s: Status) -> String {
    let name = match s {
        0 => "NVJPEG_STATUS_SUCCESS",
        1 => "NVJPEG_STATUS_NOT_INITIALIZED",
        2 => "NVJPEG_STATUS_INVALID_PARAMETER",
        3 => "NVJPEG_STATUS_BAD_JPEG",
        4 => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        5 => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        6 => "NVJPEG_STATUS_EXECUTION_FAILED",
        7 => "NVJPEG_STATUS_ARCH_MISMATCH",
        8 => "NVJPEG_STATUS_INTERNAL_ERROR",
        9 => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        10 => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
        _ => return format!("nvJPEG status {s}"),
    };
    name.to_owned()
}

/// `Ok(())` for success, else the call's name and the status's.
pub(crate) fn check(call: &str, s: Status) -> Result<(), (String, Status)> {
    if s == SUCCESS {
        Ok(())
    } else {
        Err((format!("{call} failed with {}", status_name(s)), s))
    }
}

static LOADED: OnceLock<Result<Library, String>> = OnceLock::new();

impl Library {
    /// The library, loaded on first use; or why it cannot be (the same answer for the rest of
    /// the process).
    pub(crate) fn get() -> Result<&'static Library, String> {
        LOADED
            .get_or_init(|| {
                let env = |k: &str| std::env::var(k).ok();
                Library::load(&env)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Finds and loads the library where [`search`] says, reading variables with `env`.
    pub(crate) fn load(env: &dyn Fn(&str) -> Option<String>) -> Result<Library, String> {
        let search = search(env, Path::new("/"));
        if let Some(path) = &search.explicit {
            return Library::open(path).map_err(|e| {
                format!(
                    "PINNABLE_NVJPEG={} cannot be loaded ({e}); unset it or point it at \
                     libnvjpeg.so.13",
                    path.display()
                )
            });
        }
        let mut last = None;
        for name in NAMES {
            match Library::open(Path::new(name)) {
                Ok(l) => return Ok(l),
                Err(e) => last = Some(e),
            }
        }
        // A file that is there but does not load is the more useful error.
        for path in search.files.iter().filter(|p| p.is_file()) {
            match Library::open(path) {
                Ok(l) => return Ok(l),
                Err(e) => last = Some(e),
            }
        }
        Err(search.not_found(last.as_deref()))
    }

    fn open(path: &Path) -> Result<Library, String> {
        // SAFETY: loading runs the library's initialisers; nvJPEG's only set up its own state.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is declared above with the type `nvjpeg.h` gives it; the
                // library stays loaded as long as the `Library` (for good: it is static).
                *unsafe { lib.get($name) }.map_err(|e| {
                    format!(
                        "{}: no symbol {}: {e}",
                        path.display(),
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    )
                })?
            };
        }
        let api = Api {
            create_ex: sym!(b"nvjpegCreateEx\0"),
            destroy: sym!(b"nvjpegDestroy\0"),
            state_create: sym!(b"nvjpegJpegStateCreate\0"),
            state_destroy: sym!(b"nvjpegJpegStateDestroy\0"),
            get_image_info: sym!(b"nvjpegGetImageInfo\0"),
            decode: sym!(b"nvjpegDecode\0"),
            batched_initialize: sym!(b"nvjpegDecodeBatchedInitialize\0"),
            decode_batched: sym!(b"nvjpegDecodeBatched\0"),
            batched_supported: sym!(b"nvjpegDecodeBatchedSupported\0"),
            stream_create: sym!(b"nvjpegJpegStreamCreate\0"),
            stream_destroy: sym!(b"nvjpegJpegStreamDestroy\0"),
            stream_parse_header: sym!(b"nvjpegJpegStreamParseHeader\0"),
            get_property: sym!(b"nvjpegGetProperty\0"),
        };
        let path = if path.components().count() == 1 {
            PathBuf::from(format!("{} (the loader's search path)", path.display()))
        } else {
            path.to_path_buf()
        };
        Ok(Library {
            api,
            path,
            _lib: lib,
        })
    }

    /// `major.minor.patch` of the library.
    pub(crate) fn version(&self) -> String {
        let mut v = [0; 3];
        for (i, slot) in v.iter_mut().enumerate() {
            // SAFETY: the out-parameter is a live c_int.
            unsafe { (self.api.get_property)(i as c_int, slot) };
        }
        format!("{}.{}.{}", v[0], v[1], v[2])
    }
}
