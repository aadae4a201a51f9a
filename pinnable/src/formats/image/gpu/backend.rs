//! One nvJPEG handle on one backend, with the objects a worker decodes with.

use std::ffi::c_int;
use std::sync::{Condvar, Mutex, MutexGuard};

use super::nvjpeg::{self, Library};

/// One nvJPEG handle on one backend, with its decode state and a parsed-stream object, used
/// by one thread at a time.
pub(super) struct Backend {
    pub(super) lib: &'static Library,
    pub(super) handle: nvjpeg::Handle,
    pub(super) state: nvjpeg::State,
    stream: nvjpeg::JpegStream,
    /// The batch size `nvjpegDecodeBatchedInitialize` was last called with.
    pub(super) batch: usize,
}

// SAFETY: nvJPEG's handle may be used from any thread; its state and parsed-stream objects
// may not be used by two threads at once, and are not: a `Backend` is reached only through
// `&mut` (one thread's decoding state, or a parked one no thread holds), so moving it to
// another thread moves the only access with it.
unsafe impl Send for Backend {}

/// Held while handles are created or destroyed: one thread at a time sets the library up or
/// tears it down (rare, and cheap to wait for), so the library's own set-up never races.
static SETUP: Mutex<()> = Mutex::new(());

fn setup() -> MutexGuard<'static, ()> {
    SETUP.lock().unwrap_or_else(|e| e.into_inner())
}

/// Threads at most in the engines' batched decode of one device at once, whatever a batcher
/// asks. The call keeps its thread busy until the engines are done (nvJPEG waits for them
/// itself, whatever the context's scheduling flags), so every thread inside is a core spent
/// waiting: one at a time (a batcher's default), the next batches' files are read and parsed by
/// other workers while the engines decode. Four or more callers at once can stop inside
/// nvJPEG, every thread waiting in the call; two cannot.
const ENGINE_CALLERS: usize = 2;

/// The engines' turns of one device: taken in the order they were asked for, so a worker's
/// batch is never passed over by later ones (batches leave the loader in order: one left
/// behind holds up all that follow).
#[derive(Default, Clone, Copy)]
struct Turns {
    /// Tickets handed out.
    asked: u64,
    /// Tickets let in.
    admitted: u64,
    /// Threads inside now.
    inside: usize,
}

/// The turns of each device, by ordinal.
static IN_ENGINES: Mutex<Vec<Turns>> = Mutex::new(Vec::new());
static ENGINES_FREED: Condvar = Condvar::new();

/// A thread's turn in the engines of device `ordinal`, until dropped.
pub(super) struct EngineTurn(usize);

/// Waits for a turn in the engines of device `ordinal`, first come first served, while fewer
/// than `most` threads are inside (never more than [`ENGINE_CALLERS`]).
pub(super) fn engine_turn(ordinal: usize, most: usize) -> EngineTurn {
    let most = most.clamp(1, ENGINE_CALLERS);
    let mut turns = IN_ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    if turns.len() <= ordinal {
        turns.resize(ordinal + 1, Turns::default());
    }
    let ticket = turns[ordinal].asked;
    turns[ordinal].asked += 1;
    while turns[ordinal].admitted != ticket || turns[ordinal].inside >= most {
        turns = ENGINES_FREED.wait(turns).unwrap_or_else(|e| e.into_inner());
    }
    turns[ordinal].admitted += 1;
    turns[ordinal].inside += 1;
    let room = turns[ordinal].inside < most;
    drop(turns);
    // The next ticket may be let in beside this one while this caller's limit leaves room.
    // Without room, waking the waiters would only put them back to sleep: the next leaving
    // turn wakes them (a waiter that allows more than this caller enters then).
    if room {
        ENGINES_FREED.notify_all();
    }
    EngineTurn(ordinal)
}

/// Turns asked for on device `ordinal` so far (tests watch a waiter arrive).
#[cfg(test)]
pub(super) fn turns_asked(ordinal: usize) -> u64 {
    let turns = IN_ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    turns.get(ordinal).map_or(0, |t| t.asked)
}

impl Drop for EngineTurn {
    fn drop(&mut self) {
        let mut turns = IN_ENGINES.lock().unwrap_or_else(|e| e.into_inner());
        turns[self.0].inside -= 1;
        drop(turns);
        // Every waiter checks its ticket (a handful of workers at most).
        ENGINES_FREED.notify_all();
    }
}

impl Backend {
    /// A handle on `backend` (the library's default allocators), its state and a parsed-stream
    /// object; the failing call and its status otherwise.
    pub(super) fn open(
        lib: &'static Library,
        backend: c_int,
    ) -> std::result::Result<Backend, (String, nvjpeg::Status)> {
        let _setup = setup();
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
        let _setup = setup();
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
