//! A launch's table on the host: laid out as it is filled, then written (the tasks of jobs of
//! pieces, the tables of starts placed there) before it is copied to the device.

use super::{Plan, SmJob, SmWork};

/// The host part of a launch's table, laid out as it is filled: each part 8-byte aligned.
#[derive(Default)]
pub(super) struct Layout {
    pub(super) len: usize,
}

impl Layout {
    /// Room for `bytes`; its offset.
    pub(super) fn take(&mut self, bytes: usize) -> usize {
        let at = self.len;
        self.len = (self.len + bytes).next_multiple_of(8);
        at
    }
}

/// Where a job's table lies: at this offset of the device table's host part, or of its part
/// copied from pinned tables of starts; or read by the kernels where it lies, at this device
/// address of mapped pinned memory.
#[derive(Clone, Copy)]
pub(super) enum Place {
    Host(usize),
    Pinned(usize),
    Mapped(u64),
}

/// Writes the host part of the table into `bytes`: the tasks (already laid out in `tasks`) of
/// jobs of pieces, and the tables of starts of indexed jobs placed there.
pub(super) fn write_table(jobs: &[SmJob], plans: &[Plan], tasks: &[u64], bytes: &mut [u8]) {
    let mut tasks = tasks.iter();
    for (job, plan) in jobs.iter().zip(plans) {
        let Place::Host(at) = plan.at else {
            continue;
        };
        let mut out = &mut bytes[at..];
        match &job.work {
            SmWork::Pieces(_) => {
                for (t, w) in tasks
                    .by_ref()
                    .take(plan.n as usize * 4)
                    .zip(out.chunks_exact_mut(8))
                {
                    w.copy_from_slice(&t.to_ne_bytes());
                }
            }
            SmWork::Indexed(ix) => {
                for t in &ix.starts {
                    let n = t.bytes();
                    out[..n].copy_from_slice(t.as_bytes());
                    out = &mut out[n..];
                }
            }
        }
    }
}
