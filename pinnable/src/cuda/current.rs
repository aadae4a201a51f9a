//! Calls made on a caller's thread leave its current CUDA context as they found it.

use cudarc::driver::{CudaContext, DriverError, result, sys};

/// The context current on this thread before [`KeepCurrent::bind`], put back when dropped: the
/// crate's calls on a caller's thread (a DLPack consumer's deleter, a wait enqueued for it)
/// leave the caller's current device (torch's, say) as they found it.
pub(crate) struct KeepCurrent(Option<Option<sys::CUcontext>>);

impl KeepCurrent {
    /// Makes `ctx` current, remembering the context it replaces (if another).
    pub(crate) fn bind(ctx: &CudaContext) -> std::result::Result<KeepCurrent, DriverError> {
        let previous = result::ctx::get_current()?;
        if previous == Some(ctx.cu_ctx()) {
            return Ok(KeepCurrent(None));
        }
        ctx.bind_to_thread()?;
        Ok(KeepCurrent(Some(previous)))
    }
}

impl Drop for KeepCurrent {
    fn drop(&mut self) {
        if let Some(previous) = self.0 {
            // SAFETY: the context was current on this thread when `bind` ran, and contexts the
            // crate binds are primary contexts it keeps retained; another library's stays
            // alive while it is current (it was the caller's). Null unbinds.
            let _ = unsafe { result::ctx::set_current(previous.unwrap_or(std::ptr::null_mut())) };
        }
    }
}
