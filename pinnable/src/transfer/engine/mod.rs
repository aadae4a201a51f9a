//! The engines that move a batch's bytes, and the one place that chooses among them.
//!
//! - the **copy engine** ([`dma`]): one DMA copy per run, straight from memory it reads as it
//!   is (registered pinned memory, device memory). It pays several microseconds per copy, and
//!   leaves the SMs to the training step;
//! - the **SMs** ([`sm`]): the gather kernels read pieces of any size where they lie (mapped
//!   pinned memory, device memory) and convert elements on the way, one launch for many
//!   pieces;
//! - **host staging** ([`host`]): the copy threads gather pageable sources into pinned memory,
//!   which one of the two above then sends.
//!
//! A gather's path is chosen once, in the first walk ([`gather_path`]), since it decides what
//! the reservation holds; each piece read in place is given its engine when the copies are
//! issued ([`assign`]), after neighbouring pieces have been merged.

pub(super) mod dma;
pub(super) mod host;
pub(crate) mod sm;

use crate::pieces::{GATHER_DIRECT_MIN, GatherRoute, SM_MAX_PIECE};
use dma::{Dir, DirectCopy};
use sm::SmPiece;

/// Which engine moves a piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    /// One DMA copy per piece.
    CopyEngine,
    /// The gather kernels.
    Sms,
}

/// Where a gather's source lies, as far as the engines are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Memory on the target device (or another device).
    Device,
    /// Pinned memory registered with the driver: the copy engine reads it in place, and so do
    /// the SMs, through its device mapping, where the kernels run.
    Pinned,
    /// Memory only the host reads (pageable, memory-mapped files, `mlock`ed blocks).
    Host,
}

/// How a gather's pieces travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GatherPath {
    /// Read where they lie; each piece by the engine [`assign`] gives it, or the one named.
    InPlace(Option<Engine>),
    /// Gathered by the copy threads into pinned staging, compact, then sent by the copy engine
    /// (as they are) or converted from there by the SMs.
    Staged,
    /// Converted by the host into pinned staging (no kernels to do it), then sent.
    HostConverted,
}

/// The path of a gather of `bytes` in `runs` runs of consecutive rows from `source`, moved to a
/// CUDA device by `route`, converting or not, with or without the gather kernels there.
pub(crate) fn gather_path(
    source: Source,
    route: GatherRoute,
    converts: bool,
    kernels: bool,
    bytes: usize,
    runs: usize,
) -> GatherPath {
    let in_place = |engine| GatherPath::InPlace(engine);
    let staged = if converts && !kernels {
        GatherPath::HostConverted
    } else {
        GatherPath::Staged
    };
    match source {
        // Conversions need the kernels; without them the caller refuses device sources.
        Source::Device => in_place(None),
        Source::Host => staged,
        Source::Pinned => match route {
            GatherRoute::Host => staged,
            GatherRoute::Direct if !converts => in_place(Some(Engine::CopyEngine)),
            // The copy engine cannot convert: a conversion routed `Direct` runs on the SMs.
            GatherRoute::Kernel | GatherRoute::Direct if kernels => in_place(Some(Engine::Sms)),
            _ if kernels => in_place(None),
            // No kernels: the copy engine for large runs, the host for small ones.
            _ if converts => staged,
            _ if bytes >= GATHER_DIRECT_MIN.saturating_mul(runs) => in_place(None),
            _ => staged,
        },
    }
}

/// The engine that reads a gather's pieces in place: the one a route named; the SMs for a
/// conversion; else the SMs where the kernels run and runs of consecutive pieces average below
/// [`SM_MAX_PIECE`], the copy engine (one copy a run) otherwise.
pub(crate) fn in_place_engine(
    force: Option<Engine>,
    converts: bool,
    kernels: bool,
    run_bytes: usize,
) -> Engine {
    match force {
        _ if converts => Engine::Sms,
        Some(engine) if kernels || engine == Engine::CopyEngine => engine,
        _ if kernels && run_bytes < SM_MAX_PIECE => Engine::Sms,
        _ => Engine::CopyEngine,
    }
}

/// Splits merged direct copies between the copy engine and the SMs: host-to-device pieces
/// below [`SM_MAX_PIECE`] from mapped memory go to the SMs when `kernels` are there, unless a
/// route named the engine; everything else to the copy engine.
pub(super) fn assign(runs: Vec<DirectCopy>, kernels: bool) -> (Vec<DirectCopy>, Vec<SmPiece>) {
    if !kernels {
        return (runs, Vec::new());
    }
    let mut dma = Vec::with_capacity(runs.len());
    let mut sms = Vec::new();
    for run in runs {
        let by_sms = run.dir == Dir::HtoD
            && run.mapped
            && match run.force {
                Some(engine) => engine == Engine::Sms,
                None => run.bytes < SM_MAX_PIECE,
            };
        if by_sms {
            sms.push(SmPiece {
                src: run.src,
                dst: run.dst,
                count: run.bytes,
                first: 0,
            });
        } else {
            dma.push(run);
        }
    }
    (dma, sms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1 << 10;

    #[test]
    fn auto_reads_pinned_sources_in_place_whenever_the_kernels_run() {
        for converts in [false, true] {
            let p = gather_path(
                Source::Pinned,
                GatherRoute::Auto,
                converts,
                true,
                64 * KIB,
                64,
            );
            assert_eq!(p, GatherPath::InPlace(None));
        }
    }

    #[test]
    fn without_kernels_auto_keeps_the_copy_engine_for_large_runs_only() {
        let large = gather_path(Source::Pinned, GatherRoute::Auto, false, false, 1 << 20, 2);
        assert_eq!(large, GatherPath::InPlace(None));
        let small = gather_path(
            Source::Pinned,
            GatherRoute::Auto,
            false,
            false,
            64 * KIB,
            64,
        );
        assert_eq!(small, GatherPath::Staged);
        let converted = gather_path(Source::Pinned, GatherRoute::Auto, true, false, 1 << 30, 2);
        assert_eq!(converted, GatherPath::HostConverted);
    }

    #[test]
    fn host_sources_are_staged_and_converted_by_whatever_can() {
        for route in [GatherRoute::Auto, GatherRoute::Direct, GatherRoute::Kernel] {
            assert_eq!(
                gather_path(Source::Host, route, false, true, 1 << 30, 1),
                GatherPath::Staged
            );
            assert_eq!(
                gather_path(Source::Host, route, true, true, 1, 1),
                GatherPath::Staged
            );
            assert_eq!(
                gather_path(Source::Host, route, true, false, 1, 1),
                GatherPath::HostConverted
            );
        }
    }

    #[test]
    fn routes_name_the_engine_where_it_can_run() {
        let p = |route, converts, kernels| {
            gather_path(Source::Pinned, route, converts, kernels, KIB, 1)
        };
        assert_eq!(
            p(GatherRoute::Direct, false, true),
            GatherPath::InPlace(Some(Engine::CopyEngine))
        );
        assert_eq!(
            p(GatherRoute::Kernel, false, true),
            GatherPath::InPlace(Some(Engine::Sms))
        );
        assert_eq!(p(GatherRoute::Host, false, true), GatherPath::Staged);
        // The copy engine cannot convert: the SMs do.
        assert_eq!(
            p(GatherRoute::Direct, true, true),
            GatherPath::InPlace(Some(Engine::Sms))
        );
        // No kernels: the route falls back, never fails.
        assert_eq!(p(GatherRoute::Kernel, false, false), GatherPath::Staged);
        assert_eq!(
            p(GatherRoute::Kernel, true, false),
            GatherPath::HostConverted
        );
    }

    #[test]
    fn in_place_pieces_go_to_the_sms_unless_runs_are_large_or_a_route_says_otherwise() {
        assert_eq!(in_place_engine(None, false, true, 4 * KIB), Engine::Sms);
        assert_eq!(
            in_place_engine(None, false, true, SM_MAX_PIECE),
            Engine::CopyEngine
        );
        assert_eq!(
            in_place_engine(None, false, false, 4 * KIB),
            Engine::CopyEngine
        );
        assert_eq!(
            in_place_engine(Some(Engine::Sms), false, true, 1 << 30),
            Engine::Sms
        );
        assert_eq!(
            in_place_engine(Some(Engine::Sms), false, false, 1),
            Engine::CopyEngine
        );
        assert_eq!(
            in_place_engine(Some(Engine::CopyEngine), false, true, 1),
            Engine::CopyEngine
        );
        assert_eq!(
            in_place_engine(Some(Engine::CopyEngine), true, true, 1),
            Engine::Sms
        );
    }

    fn run(bytes: usize, mapped: bool, force: Option<Engine>) -> DirectCopy {
        DirectCopy {
            dir: Dir::HtoD,
            src: 1 << 20,
            dst: 1 << 40,
            bytes,
            src_id: 1,
            src_buffer: None,
            mapped,
            force,
        }
    }

    #[test]
    fn small_mapped_pieces_go_to_the_sms_large_and_unmapped_ones_to_the_copy_engine() {
        let runs = vec![
            run(4 * KIB, true, None),
            run(SM_MAX_PIECE, true, None),
            run(4 * KIB, false, None),
            run(8 * KIB, true, Some(Engine::CopyEngine)),
            run(4 << 20, true, Some(Engine::Sms)),
        ];
        let (dma, sms) = assign(runs, true);
        assert_eq!(
            dma.iter().map(|r| r.bytes).collect::<Vec<_>>(),
            [SM_MAX_PIECE, 4 * KIB, 8 * KIB]
        );
        assert_eq!(
            sms.iter().map(|p| p.count).collect::<Vec<_>>(),
            [4 * KIB, 4 << 20]
        );
        let (dma, sms) = assign(vec![run(4 * KIB, true, None)], false);
        assert_eq!((dma.len(), sms.len()), (1, 0));
    }
}
