//! [`Event`]: a recorded point on a device's stream, which tensors' ready states, pinned
//! blocks' fences and other libraries' streams wait on.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::CudaDevice;
use crate::error::{Error, Result};

impl CudaDevice {
    /// Records the copy stream's current work into a pooled event.
    pub(crate) fn record(self: &Arc<Self>) -> Result<Event> {
        let event = self.pooled_event()?;
        event
            .record(&self.copy_stream)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        Ok(Event {
            event: Some(event),
            device: self.clone(),
            open: None,
        })
    }

    /// An event from the pool, or a new one.
    fn pooled_event(&self) -> Result<CudaEvent> {
        let pooled = self.events.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match pooled {
            Some(e) => Ok(e),
            None => self
                .ctx
                .new_event(None)
                .map_err(|e| Error::driver("cuEventCreate", e)),
        }
    }
}

/// A recorded point on a device's stream. Dropping it returns the event to its device's pool.
pub struct Event {
    event: Option<CudaEvent>,
    device: Arc<CudaDevice>,
    /// Set for an event made before the work it stands for is enqueued (a writable view's):
    /// until that work is recorded, waiting for it means waiting for the whole context.
    open: Option<Open>,
}

/// The state of an event made before its work: see [`Event::open`].
struct Open {
    /// Whether the work has been recorded, or the context synchronised since.
    settled: AtomicBool,
    /// The context of the stream the work is enqueued on.
    ctx: Arc<CudaContext>,
}

impl Event {
    /// Records `stream`'s current work (a stream of `device`'s context) twice: as an `Event`
    /// for readers to wait on, and as a plain event for a buffer's reader list.
    #[cfg(any(feature = "candle-cuda", feature = "image"))]
    pub(crate) fn record_on(
        device: &Arc<CudaDevice>,
        stream: &CudaStream,
    ) -> Result<(Event, CudaEvent)> {
        let event = device.pooled_event()?;
        event
            .record(stream)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        let reader = stream
            .record_event(None)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        Ok((
            Event {
                event: Some(event),
                device: device.clone(),
                open: None,
            },
            reader,
        ))
    }

    /// An event for work not enqueued yet on `stream`, recorded later by
    /// [`close`](Self::close). Until then, or if it never is (its guard was leaked), whoever
    /// waits for it waits for everything on `stream`'s context instead, so no reader can miss
    /// the work whatever safe code does with the guard.
    pub(crate) fn open(device: &Arc<CudaDevice>, stream: &CudaStream) -> Result<Event> {
        Ok(Event {
            event: Some(device.pooled_event()?),
            device: device.clone(),
            open: Some(Open {
                settled: AtomicBool::new(false),
                ctx: stream.context().clone(),
            }),
        })
    }

    /// Records the work enqueued on `stream` so far as the work of an event made with
    /// [`open`](Self::open).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the event cannot be recorded; it then stays open (waiters wait for
    /// the whole context).
    pub(crate) fn close(&self, stream: &CudaStream) -> Result<()> {
        if let (Some(e), Some(open)) = (&self.event, &self.open) {
            e.record(stream)
                .map_err(|e| Error::driver("cuEventRecord", e))?;
            open.settled.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Whether the work is still to be recorded (an open event not closed).
    fn unsettled(&self) -> Option<&Open> {
        self.open
            .as_ref()
            .filter(|o| !o.settled.load(Ordering::Acquire))
    }

    /// For an open event not closed: waits for the whole context, after which the event stands
    /// for nothing left to do (its guard is gone, so no more work can be enqueued for it).
    fn settle(&self) -> Result<()> {
        if let Some(open) = self.unsettled() {
            open.ctx
                .synchronize()
                .map_err(|e| Error::driver("cuCtxSynchronize", e))?;
            open.settled.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// The driver's handle of the recorded event (`None` when there is nothing to wait for).
    #[cfg(feature = "dlpack")]
    pub(crate) fn handle(&self) -> Option<cudarc::driver::sys::CUevent> {
        self.event.as_ref().map(|e| e.cu_event())
    }

    /// Makes a raw stream wait for the recorded work (for streams another library owns).
    ///
    /// # Safety
    ///
    /// 1. `stream` is a live stream of this event's device (or one of the special handles
    ///    `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`, or null for the legacy default stream).
    #[cfg(feature = "dlpack")]
    pub(crate) unsafe fn wait_on_raw(&self, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        use cudarc::driver::{result, sys};
        self.settle()?;
        let Some(e) = &self.event else { return Ok(()) };
        let _current = super::KeepCurrent::bind(&self.device.ctx)
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        // SAFETY: the event is live (owned by `self`); the stream is valid (caller).
        unsafe {
            result::stream::wait_event(
                stream,
                e.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| Error::driver("cuStreamWaitEvent", e))
    }

    /// Whether the work recorded before this event has finished. A driver error reads as not
    /// finished: memory guarded by the event is held back rather than reused while a copy may
    /// still touch it, and the next synchronising call reports the error.
    ///
    /// The event of a writable device view that was leaked rather than dropped cannot be
    /// polled: asking waits for every stream of the view's context once.
    pub fn is_complete(&self) -> bool {
        if self.unsettled().is_some() && self.settle().is_err() {
            return false;
        }
        match &self.event {
            Some(e) => e.try_is_complete().unwrap_or(false),
            None => true,
        }
    }

    /// Blocks the calling thread until the recorded work has finished.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the work failed.
    pub fn synchronize(&self) -> Result<()> {
        self.settle()?;
        match &self.event {
            Some(e) => e
                .synchronize()
                .map_err(|e| Error::driver("cuEventSynchronize", e)),
            None => Ok(()),
        }
    }

    /// Makes `stream` wait for the recorded work before it runs anything enqueued after this call.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] if the driver refuses.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<()> {
        self.settle()?;
        match &self.event {
            Some(e) => stream
                .wait(e)
                .map_err(|e| Error::driver("cuStreamWaitEvent", e)),
            None => Ok(()),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            let mut pool = self.device.events.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < 1024 {
                pool.push(e);
            }
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Event(cuda:{}, complete: {})",
            self.device.ordinal,
            self.is_complete()
        )
    }
}
