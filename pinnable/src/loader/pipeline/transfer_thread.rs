//! The transfer thread: puts finished batches back in order (unless `in_order` is off),
//! moves each to the device and hands it to the consumer.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::time::{Duration, Instant};

use super::{Done, Gate, Permit, Ready};
use crate::cuda::{Device, Event};
use crate::error::{Error, Result};
use crate::loader::guard::{Held, drop_guarded, guarded};
use crate::loader::stats::Counters;
use crate::transfer::ToDevice;

/// The transfer thread's way out: the consumer's channel and what moving a batch needs.
pub(super) struct Out<T> {
    pub(super) tx: SyncSender<Ready<T>>,
    pub(super) device: Device,
    pub(super) gate: Arc<Gate>,
    pub(super) counters: Arc<Counters>,
}

impl<T: ToDevice> Out<T> {
    /// Moves a finished batch and hands it to the consumer; `false` when the epoch is over
    /// (the consumer is gone, or the batch failed).
    fn deliver(&self, done: Done<T>, copying: &mut VecDeque<(Arc<Event>, Permit)>) -> bool {
        let Done {
            batch,
            result,
            samples,
            permit,
        } = done;
        let result = result.and_then(|held| {
            let start = Instant::now();
            let moved = move_batch(held, batch, &self.device, &permit, copying);
            self.counters.add_transfer(start.elapsed());
            moved
        });
        let failed = result.is_err();
        let ready = Ready {
            batch,
            result,
            samples,
            _permit: Some(permit),
        };
        if self.tx.send(ready).is_err() || failed {
            self.gate.stop();
            return false;
        }
        true
    }
}

/// How often the transfer thread, waiting for a worker, checks that the epoch still runs (a
/// worker stuck past the timeout keeps the channel open).
const STOP_CHECK: Duration = Duration::from_millis(20);

/// How often the transfer thread, with nothing to move, looks whether the oldest copy is done
/// (which frees its permit): it waits for the next batch meanwhile, asleep, rather than
/// spinning a core in the driver until the copy ends.
const COPY_POLL: Duration = Duration::from_micros(100);

/// The transfer thread: reorders finished batches (unless `in_order` is off), moves each to
/// the device (non-blocking, on its copy stream) and hands it to the consumer.
pub(super) fn transfer<T: ToDevice>(rx: Receiver<Done<T>>, out: Out<T>, in_order: bool) {
    let mut next = 0;
    let mut waiting: BTreeMap<usize, Done<T>> = BTreeMap::new();
    // Batches handed on whose copies may still run, with their permits.
    let mut copying: VecDeque<(Arc<Event>, Permit)> = VecDeque::new();
    loop {
        while copying.front().is_some_and(|(e, _)| e.is_complete()) {
            copying.pop_front();
        }
        while let Some(done) = waiting.remove(&next) {
            next += 1;
            if !out.deliver(done, &mut copying) {
                return;
            }
        }
        let done = match copying.front() {
            None => loop {
                match rx.recv_timeout(STOP_CHECK) {
                    Ok(done) => break Some(done),
                    Err(mpsc::RecvTimeoutError::Disconnected) => break None,
                    Err(mpsc::RecvTimeoutError::Timeout) if out.gate.is_stopped() => return,
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                }
            },
            Some(_) => match rx.recv_timeout(COPY_POLL) {
                Ok(done) => Some(done),
                // Nothing to move yet: the loop's top frees the permits of copies done.
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => None,
            },
        };
        match done {
            Some(done) if in_order => {
                waiting.insert(done.batch, done);
            }
            Some(done) => {
                if !out.deliver(done, &mut copying) {
                    return;
                }
            }
            None => {
                // Every worker has returned. Batches still missing mean one died undelivered.
                if !waiting.is_empty() && !out.gate.is_stopped() {
                    let _ = out.tx.send(Ready {
                        batch: next,
                        result: Err(Error::Panicked {
                            what: "a loader worker".into(),
                            message: format!("batch {next} was never delivered"),
                        }),
                        samples: 0,
                        _permit: None,
                    });
                }
                return;
            }
        }
    }
}

/// `batch` on `device`: itself on the host; otherwise moved without blocking, the move's ready
/// event keeping the batch's permit until its copies have finished. The host
/// batch is dropped here, and its `Drop` may be the user's: a panic there fails batch `number`.
fn move_batch<T: ToDevice>(
    batch: Held<T>,
    number: usize,
    device: &Device,
    permit: &Permit,
    copying: &mut VecDeque<(Arc<Event>, Permit)>,
) -> Result<Held<T>> {
    if device.is_cpu() {
        return Ok(batch);
    }
    let batch = batch.into_inner();
    let moved = guarded(
        || format!("moving batch {number} to the device"),
        || {
            crate::transfer::MoveContext::run_ready(
                device,
                true,
                crate::alloc::PinnedPool::global(),
                |cx| batch.measure_with(cx),
                |cx| batch.to_device_with(cx),
            )
            .map(|(moved, ready)| (Held::new(moved), ready))
        },
    );
    // The source batch goes back to the pool here; the pool holds its block until the copy
    // recorded on it completes.
    let dropped = drop_guarded(
        || format!("dropping batch {number}'s host copy after its move"),
        batch,
    );
    let (moved, ready) = dropped.and(moved)?;
    // The move's ready event follows its last copy: until it completes, the permit is held.
    if let Some(event) = ready {
        copying.push_back((event, permit.clone()));
    }
    Ok(moved)
}
