//! How a gather's pieces are described and routed, shared by the gather that lists them, the
//! move that carries them and the copy threads that stage them: the route a user picks
//! ([`GatherRoute`]) and the thresholds behind its `Auto` choice, a source's runs as views
//! ([`parts_of`]), and the tables of piece starts the gather kernels and copy threads read
//! ([`StartTable`]).

mod starts;

use std::ops::Range;

use crate::tensor::Tensor;

pub(crate) use starts::StartTable;

/// How a move to a CUDA device gathers pieces of a pinned source. (Device sources are read in
/// place; pageable ones are always gathered on the host first.)
///
/// Whatever the route, a move never fails for want of the gather kernels (an old driver, a JIT
/// failure, `PINNABLE_GATHER_KERNELS=0`): it takes the copy engine and host staging instead,
/// and [`Device::gather_kernels`](crate::Device::gather_kernels) says why.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum GatherRoute {
    /// Each run of consecutive pieces read where it lies: by the gather kernels below 512 KiB,
    /// by the copy engine (one copy) from 512 KiB up, where it is as fast and leaves the SMs to
    /// the training step. Without the kernels: the copy engine for runs of at least 256 KiB on
    /// average, host staging below.
    #[default]
    Auto,
    /// One copy-engine copy a run, straight from the source: host memory is read once and no SM
    /// is used, but each copy costs the copy engine microseconds of its own. (Conversions, which
    /// the copy engine cannot make, run on the SMs.)
    Direct,
    /// Every run read in place by the gather kernels, whatever its size.
    Kernel,
    /// Gathered into pinned staging by the copy threads, then sent in a few large copies: each
    /// byte crosses host memory three times.
    Host,
}

/// Runs of at least this many bytes on average are copied straight from the source by
/// [`GatherRoute::Auto`] when the gather kernels do not run; smaller ones are gathered on the
/// host first. Each copy costs the copy engine some time of its own even when the copies go in
/// one batched call: on an H100 over PCIe Gen5, 32 MiB of random rows took 1.29 ms as 64 KiB
/// copies, 0.83 ms as 256 KiB ones and 0.70 ms as 1 MiB ones, against 1.13–1.19 ms, 0.95–1.13 ms
/// and 0.88–0.97 ms gathered on the host and 0.61–0.65 ms for one copy (two machine instances);
/// the routes cross between 64 and 256 KiB.
pub(crate) const GATHER_DIRECT_MIN: usize = 256 << 10;

/// Pieces of at least this many bytes go to the copy engine, smaller ones to the SMs (when
/// they can read them). Measured on an H100 over PCIe Gen5 (32 MiB batches of random rows of a
/// pinned array): the kernels reach 0.9× one large copy from 256 B rows up, the copy engine
/// only from about 512 KiB rows (batched), and leaves the SMs free.
pub(crate) const SM_MAX_PIECE: usize = 512 << 10;

/// Views of `source`, one per run, in order.
pub(crate) fn parts_of(source: &Tensor, runs: &[Range<usize>]) -> Vec<Tensor> {
    runs.iter()
        .map(|r| {
            source
                .narrow(0, r.start, r.len())
                .expect("runs lie within the source")
        })
        .collect()
}

const _: () = assert!(
    GATHER_DIRECT_MIN == 256 << 10,
    "GatherRoute::Auto's docs name it"
);
const _: () = assert!(
    SM_MAX_PIECE == 512 << 10,
    "GatherRoute::Auto's docs name it"
);
