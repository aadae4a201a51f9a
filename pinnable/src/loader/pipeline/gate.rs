//! The permits that bound the batches in flight, and which workers may take them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::lock;

/// The permits (`prefetch + workers` of them) and the workers allowed to take one: those
/// numbered below `active`. Both change while the epoch runs when they are tuned.
pub(super) struct Gate {
    state: Mutex<State>,
    /// Active workers waiting for a permit: one is woken for each permit given back.
    cv: Condvar,
    /// Workers past the active count, waiting to be let in: woken only when the count
    /// changes (or the epoch ends), never for a permit.
    idle: Condvar,
    stopped: AtomicBool,
    /// The epoch's jobs are all taken: workers waiting for a permit leave.
    drained: AtomicBool,
}

struct State {
    /// Permits free; below zero after the slots shrank while more were held.
    free: isize,
    /// Slots in all: permits free and held.
    slots: usize,
    /// Workers numbered below this take jobs; the others wait.
    active: usize,
}

impl Gate {
    /// `slots` permits, for workers numbered below `active`.
    pub(super) fn new(slots: usize, active: usize) -> Gate {
        Gate {
            state: Mutex::new(State {
                free: slots as isize,
                slots,
                active,
            }),
            cv: Condvar::new(),
            idle: Condvar::new(),
            stopped: AtomicBool::new(false),
            drained: AtomicBool::new(false),
        }
    }

    /// A permit for worker `worker`, waiting while it is not active or none is free; `None`
    /// once stopped, or once the jobs are all taken.
    pub(super) fn acquire(self: &Arc<Self>, worker: usize) -> Option<Permit> {
        let mut state = lock(&self.state);
        loop {
            if self.is_stopped() || self.drained.load(Ordering::SeqCst) {
                return None;
            }
            if worker >= state.active {
                // A permit's wake-up that reached a worker the count left out goes on to an
                // active one.
                if state.free > 0 {
                    self.cv.notify_one();
                }
                state = self.idle.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if state.free > 0 {
                state.free -= 1;
                return Some(Permit {
                    _held: Arc::new(PermitInner { gate: self.clone() }),
                });
            }
            state = self.cv.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// From now on, `slots` permits and `active` workers. Permits held past a smaller count
    /// are given back as usual; new ones are handed out once the count is under it.
    pub(super) fn resize(&self, slots: usize, active: usize) {
        let mut state = lock(&self.state);
        state.free += slots as isize - state.slots as isize;
        state.slots = slots;
        state.active = active;
        self.cv.notify_all();
        self.idle.notify_all();
    }

    /// The jobs are all taken: every worker still waiting for a permit (an inactive one
    /// among them) returns, so the transfer thread sees the epoch end.
    pub(super) fn drain(&self) {
        self.release(&self.drained);
    }

    /// The epoch is over: every waiting worker returns, and none takes another permit.
    pub(super) fn stop(&self) {
        self.release(&self.stopped);
    }

    /// Raises `flag` and wakes every waiting worker to see it.
    fn release(&self, flag: &AtomicBool) {
        flag.store(true, Ordering::SeqCst);
        let _guard = lock(&self.state);
        self.cv.notify_all();
        self.idle.notify_all();
    }

    pub(super) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

/// One batch's place in the bound; given back when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct Permit {
    _held: Arc<PermitInner>,
}

struct PermitInner {
    gate: Arc<Gate>,
}

impl Drop for PermitInner {
    fn drop(&mut self) {
        lock(&self.gate.state).free += 1;
        // One active waiter: waking every worker for each batch costs more than the batch
        // when batches take microseconds.
        self.gate.cv.notify_one();
    }
}
