use super::*;
use crate::dtype::DType;

fn piece(src: u64, count: usize, first: usize) -> SmPiece {
    SmPiece {
        src,
        dst: 1 << 40,
        count,
        first,
    }
}

#[test]
fn large_pieces_are_cut_into_tasks_at_element_boundaries() {
    let c = Convert::cast(DType::I64);
    let layout = c.resolve(DType::U16, &[4]).unwrap();
    let op = SmOp::Convert(c, layout);
    let mut out = Vec::new();
    // 10000 u16 = 20000 bytes: one task of 8192 elements, then 1808.
    tasks(&op, &[piece(1000, 10_000, 5)], &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!((out[0].src, out[0].count, out[0].first), (1000, 8192, 5));
    assert_eq!(
        (out[1].src, out[1].dst, out[1].count, out[1].first),
        (1000 + 16384, (1 << 40) + 8192 * 8, 1808, 8197)
    );
}

fn indexed(values: &[usize], dst: u64) -> SmJob {
    SmJob {
        op: SmOp::Copy,
        work: SmWork::Indexed(Indexed {
            src: 1 << 20,
            dst,
            piece: 4,
            stride: 4,
            starts: vec![Arc::new(StartTable::new(values))],
        }),
    }
}

#[test]
fn jobs_whose_results_follow_each_other_merge_and_their_starts_follow_too() {
    let jobs = merged(vec![
        indexed(&[3, 1], 1000),
        indexed(&[0, 2, 5], 1008),
        indexed(&[7], 5000), // not where the last one ends
    ]);
    assert_eq!(jobs.len(), 2);
    let plans = [
        Plan {
            at: Place::Host(0),
            n: 5,
            shift: 0,
            indexed: None,
        },
        Plan {
            at: Place::Host(24),
            n: 1,
            shift: 0,
            indexed: None,
        },
    ];
    let mut bytes = vec![0xffu8; 32];
    write_table(&jobs, &plans, &[], &mut bytes);
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(words, [3, 1, 0, 2, 5, u32::MAX, 7, u32::MAX]);
}

#[test]
fn small_tasks_get_a_few_lanes_large_ones_a_warp() {
    let mut out = Vec::new();
    let shift = |out: &[Task]| lane_shift(out.iter().map(|t| t.count).sum(), out.len());
    tasks(&SmOp::Copy, &[piece(0, 256, 0); 8], &mut out);
    assert_eq!(shift(&out), 2); // 16 chunks: 4 lanes of 4
    out.clear();
    tasks(&SmOp::Copy, &[piece(0, 1 << 20, 0)], &mut out);
    assert_eq!(out.len(), 64);
    assert_eq!(shift(&out), 5);
    out.clear();
    tasks(&SmOp::Copy, &[piece(0, 3, 0)], &mut out);
    assert_eq!(shift(&out), 0);
}

#[test]
fn an_affine_map_over_more_channels_than_the_kernels_index_is_refused() {
    let mut r = crate::loader::SplitMix64::for_test("affine channels");
    let fits = 1 + (r.next_u64() % u64::from(u32::MAX)) as usize;
    let inner = 1 + (r.next_u64() % 64) as usize;
    let layout = |channels| Resolved {
        from: DType::U8,
        to: DType::F32,
        channels,
        inner,
    };
    assert_eq!(affine_channels(&layout(fits)).unwrap() as usize, fits);
    assert_eq!(
        affine_channels(&layout(u32::MAX as usize)).unwrap(),
        u32::MAX
    );
    let over = u32::MAX as usize + 1 + (r.next_u64() % (1 << 20)) as usize;
    let e = affine_channels(&layout(over)).unwrap_err().to_string();
    assert!(e.contains(&format!("{over} channels")), "{e}");
    assert!(e.contains("convert"), "{e}");
}
