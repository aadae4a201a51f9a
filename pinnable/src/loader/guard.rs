//! Guards around user code on the loader's threads: a panic in a dataset, a batcher, a stream
//! or a sample's or batch's `Drop` becomes an [`Error::Panicked`] (or, for a value the
//! consumer never receives, is caught and let go) instead of unwinding through a loader thread,
//! which would leave the batch it claimed undelivered and the epoch waiting for it.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{Error, Result};

/// The text of a panic's payload.
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// Runs `f`, turning a panic into [`Error::Panicked`] naming `what`.
pub(super) fn guarded<R>(
    what: impl FnOnce() -> String,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let message = panic_message(&*p);
        discard(p);
        Err(Error::Panicked {
            what: what(),
            message,
        })
    })
}

/// Drops `value` where a panic in its `Drop` (user code: a sample, a batch) cannot unwind
/// through the loader; the panic comes back as [`Error::Panicked`] naming `what`.
pub(super) fn drop_guarded<V>(what: impl FnOnce() -> String, value: V) -> Result<()> {
    guarded(what, move || {
        drop(value);
        Ok(())
    })
}

/// Drops every item on its own, so a panic in one `Drop` leaves the others to be dropped (a
/// second panic while the first unwinds would abort the process); the first panic comes back
/// as an error naming `what`.
pub(super) fn drop_each<V>(
    what: impl Fn() -> String,
    items: impl IntoIterator<Item = V>,
) -> Result<()> {
    let mut first = Ok(());
    for item in items {
        let dropped = drop_guarded(&what, item);
        if first.is_ok() {
            first = dropped;
        }
    }
    first
}

/// Drops a value that never reaches the consumer (the epoch ended before it): a panic in its
/// `Drop` is caught and, with nowhere to deliver it, let go (the panic hook has reported it).
pub(super) fn drop_quietly<V>(value: V) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        discard(payload);
    }
}

/// Drops a panic's payload, whose own `Drop` could panic too.
pub(super) fn discard(payload: Box<dyn std::any::Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

/// A value made by user code (a batch) travelling between the loader's threads: wherever it is
/// dropped undelivered (a channel discarding it, the batches waiting for their turn, a send to
/// a thread that has stopped), its `Drop` runs under [`drop_quietly`], so a panic there never
/// unwinds through a loader thread or the consumer's shutdown.
pub(super) struct Held<T>(Option<T>);

impl<T> Held<T> {
    pub(super) fn new(value: T) -> Held<T> {
        Held(Some(value))
    }

    /// The value, now the caller's to drop.
    pub(super) fn into_inner(mut self) -> T {
        self.0.take().expect("a held value is taken once")
    }
}

impl<T> Drop for Held<T> {
    fn drop(&mut self) {
        if let Some(value) = self.0.take() {
            drop_quietly(value);
        }
    }
}
