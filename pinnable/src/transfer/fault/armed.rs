//! The armed side of the fault: a count per test thread.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::{DriverError, sys};

use crate::error::{Error, Result};

/// Fails the `fail_at`-th enqueue counted (from 1), and no other.
pub(crate) struct Plan {
    fail_at: usize,
    seen: AtomicUsize,
}

impl Plan {
    pub(super) fn enqueue(&self, call: &'static str) -> Result<()> {
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_at {
            return Err(Error::driver(
                call,
                DriverError(sys::CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
            ));
        }
        Ok(())
    }
}

thread_local! {
    static PLAN: RefCell<Option<Arc<Plan>>> = const { RefCell::new(None) };
}

pub(super) fn current() -> Option<Arc<Plan>> {
    PLAN.with(|p| p.borrow().clone())
}

/// Arms the calling thread: its `k`-th enqueue from now (1 for the next) fails. Disarmed when
/// the guard drops.
pub(crate) fn fail_nth(k: usize) -> Armed {
    let plan = Arc::new(Plan {
        fail_at: k,
        seen: AtomicUsize::new(0),
    });
    PLAN.with(|p| *p.borrow_mut() = Some(plan.clone()));
    Armed { plan }
}

/// An armed plan; dropping it disarms the thread.
pub(crate) struct Armed {
    plan: Arc<Plan>,
}

impl Armed {
    /// Enqueues counted so far, the failed one included.
    pub(crate) fn seen(&self) -> usize {
        self.plan.seen.load(Ordering::SeqCst)
    }

    /// Whether the armed enqueue was reached (and failed).
    pub(crate) fn fired(&self) -> bool {
        self.seen() >= self.plan.fail_at
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        PLAN.with(|p| *p.borrow_mut() = None);
    }
}
