//! Where a move's work is enqueued, and (in the crate's own tests) a fault that fails the k-th
//! enqueue, so every error path after partial work can be exercised on a GPU.
//!
//! Every engine asks [`Faults::enqueue`] right before it enqueues a copy or a kernel. In a
//! normal build that is a no-op the compiler removes. In the crate's unit tests, a test arms a
//! count on its own thread ([`fail_nth`]); the copy threads that stage bytes for a move carry
//! the plan of the thread that started it ([`Faults::current`], taken before they start), so
//! tests running side by side never fail each other's enqueues.

use crate::error::Result;

#[cfg(test)]
mod armed;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use armed::fail_nth;

/// The fault plan of the thread that started a move: carried to the threads that enqueue part
/// of its work.
#[derive(Clone, Default)]
pub(crate) struct Faults {
    #[cfg(test)]
    plan: Option<std::sync::Arc<armed::Plan>>,
}

impl Faults {
    /// The calling thread's plan.
    #[inline]
    pub(crate) fn current() -> Faults {
        Faults {
            #[cfg(test)]
            plan: armed::current(),
        }
    }

    /// Counts one enqueue of `call`; an error in place of the enqueue when it is the one the
    /// plan fails (never outside the crate's tests).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`](crate::Error::Driver) for `call`, in tests only.
    #[inline]
    pub(crate) fn enqueue(&self, call: &'static str) -> Result<()> {
        #[cfg(test)]
        if let Some(plan) = &self.plan {
            return plan.enqueue(call);
        }
        let _ = call;
        Ok(())
    }
}

/// Counts one enqueue of `call` made on the calling thread (see [`Faults::enqueue`]).
///
/// # Errors
///
/// As [`Faults::enqueue`].
#[inline]
pub(crate) fn enqueue(call: &'static str) -> Result<()> {
    Faults::current().enqueue(call)
}
