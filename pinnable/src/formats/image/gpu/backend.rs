//! One nvJPEG handle on one backend, with the objects a worker decodes with.

use std::ffi::c_int;

use super::nvjpeg::{self, Library};

/// One nvJPEG handle on one backend, with its decode state and a parsed-stream object, owned
/// by one thread.
pub(super) struct Backend {
    pub(super) lib: &'static Library,
    pub(super) handle: nvjpeg::Handle,
    pub(super) state: nvjpeg::State,
    stream: nvjpeg::JpegStream,
    /// The batch size `nvjpegDecodeBatchedInitialize` was last called with.
    pub(super) batch: usize,
}

impl Backend {
    /// A handle on `backend` (the library's default allocators), its state and a parsed-stream
    /// object; the failing call and its status otherwise.
    pub(super) fn open(
        lib: &'static Library,
        backend: c_int,
    ) -> std::result::Result<Backend, (String, nvjpeg::Status)> {
        let mut handle = std::ptr::null_mut();
        let create = |flags, handle: &mut nvjpeg::Handle| {
            // SAFETY: null allocators select the library's own; `handle` is an out-parameter.
            unsafe {
                (lib.api.create_ex)(
                    backend,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    flags,
                    handle,
                )
            }
        };
        let mut s = create(nvjpeg::FLAGS_UPSAMPLING_WITH_INTERPOLATION, &mut handle);
        if s == nvjpeg::INVALID_PARAMETER {
            s = create(0, &mut handle);
        }
        nvjpeg::check(&format!("nvjpegCreateEx(backend {backend})"), s)?;
        let mut b = Backend {
            lib,
            handle,
            state: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            batch: 0,
        };
        // SAFETY: the handle was just created; `state` is an out-parameter.
        let s = unsafe { (lib.api.state_create)(b.handle, &mut b.state) };
        nvjpeg::check("nvjpegJpegStateCreate", s)?;
        // SAFETY: as above.
        let s = unsafe { (lib.api.stream_create)(b.handle, &mut b.stream) };
        nvjpeg::check("nvjpegJpegStreamCreate", s)?;
        Ok(b)
    }

    /// The size nvJPEG reads in `bytes`' headers, if it reads them.
    pub(super) fn image_size(&self, bytes: &[u8]) -> Option<(usize, usize)> {
        let (mut comps, mut css) = (0, 0);
        let (mut w, mut h) = ([0; nvjpeg::MAX_COMPONENT], [0; nvjpeg::MAX_COMPONENT]);
        // SAFETY: the handle is live; the bytes outlive the call; the out-arrays hold
        // `NVJPEG_MAX_COMPONENT` values each, as the call writes.
        let s = unsafe {
            (self.lib.api.get_image_info)(
                self.handle,
                bytes.as_ptr(),
                bytes.len(),
                &mut comps,
                &mut css,
                w.as_mut_ptr(),
                h.as_mut_ptr(),
            )
        };
        (s == nvjpeg::SUCCESS && w[0] > 0 && h[0] > 0).then(|| (w[0] as usize, h[0] as usize))
    }

    /// Whether the engines take `bytes` (headers parsed by nvJPEG).
    pub(super) fn batched_supported(&self, bytes: &[u8]) -> bool {
        // SAFETY: the handle and stream object are live; the bytes outlive the call.
        let s = unsafe {
            (self.lib.api.stream_parse_header)(
                self.handle,
                bytes.as_ptr(),
                bytes.len(),
                self.stream,
            )
        };
        if s != nvjpeg::SUCCESS {
            return false;
        }
        let mut unsupported: c_int = 1;
        // SAFETY: the stream object holds the headers just parsed.
        let s =
            unsafe { (self.lib.api.batched_supported)(self.handle, self.stream, &mut unsupported) };
        s == nvjpeg::SUCCESS && unsupported == 0
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: each object was created by this handle and is destroyed once, before it.
        unsafe {
            if !self.stream.is_null() {
                (self.lib.api.stream_destroy)(self.stream);
            }
            if !self.state.is_null() {
                (self.lib.api.state_destroy)(self.state);
            }
            (self.lib.api.destroy)(self.handle);
        }
    }
}
