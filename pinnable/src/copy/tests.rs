use super::*;
use crate::loader::SplitMix64;
use crate::pieces::StartTable;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn rng(test: &str) -> SplitMix64 {
    SplitMix64::for_test(test)
}

fn below(r: &mut SplitMix64, n: usize) -> usize {
    (r.next_u64() % n as u64) as usize
}

fn random_bytes(r: &mut SplitMix64, n: usize) -> Vec<u8> {
    (0..n).map(|_| r.next_u64() as u8).collect()
}

/// A copy of `count` rows of `len` bytes at random starts (in units of `stride` bytes) of
/// `src`, into `dst`; and the starts.
fn rows_copy(
    r: &mut SplitMix64,
    src: &[u8],
    stride: usize,
    len: usize,
    count: usize,
    dst: *mut u8,
) -> (HostCopy, Vec<usize>) {
    let units = (src.len() - len) / stride + 1;
    let starts: Vec<usize> = (0..count).map(|_| below(r, units)).collect();
    let copy = HostCopy {
        src: Src::RowCopies(RowCopies {
            base: src.as_ptr(),
            stride,
            len,
            starts: Arc::new(StartTable::new(&starts)),
        }),
        dst,
    };
    (copy, starts)
}

/// A contiguous view of `src[at..at + len]` copied to `dst`.
fn view_copy(src: &[u8], at: usize, len: usize, dst: *mut u8) -> HostCopy {
    HostCopy {
        src: Src::View(HostSrc::new(src[at..].as_ptr(), 1, &[len], &[1])),
        dst,
    }
}

/// Every copy's destination bytes, in the pieces' order: checks that the pieces write each
/// copy's bytes exactly once, in order, and returns the writes.
fn check_covers(copies: &[HostCopy], pieces: &[Piece]) -> Vec<(usize, Range<usize>)> {
    let writes: Vec<_> = pieces.iter().flat_map(|p| p.writes(copies)).collect();
    let mut at = vec![0; copies.len()];
    let mut last = 0;
    for (c, range) in &writes {
        assert!(*c >= last, "copies in order: {c} after {last}");
        last = *c;
        assert_eq!(
            range.start, at[*c],
            "copy {c} written in order, without gaps"
        );
        at[*c] = range.end;
    }
    for (c, copy) in copies.iter().enumerate() {
        assert_eq!(at[c], copy.src.bytes(), "copy {c} written whole");
    }
    writes
}

#[test]
fn many_small_rows_are_cut_between_rows_into_pieces_of_about_the_target() {
    let mut r = rng("rows plan");
    let src = random_bytes(&mut r, MIB);
    let (copy, _) = rows_copy(&mut r, &src, 4 * KIB, 4 * KIB, 8192, std::ptr::null_mut());
    let copies = [copy];
    let pieces = plan_for(&copies, 32 * MIB, 16);
    // 32 MiB over 16 threads, four pieces each: 512 KiB, 128 rows a piece.
    assert_eq!(pieces.len(), 64);
    for (k, p) in pieces.iter().enumerate() {
        assert_eq!(p.copies, 0..1);
        match &p.part {
            Part::RowCopies(rows) => assert_eq!(*rows, k * 128..(k + 1) * 128),
            _ => panic!("piece {k} is not a range of rows"),
        }
        assert_eq!(p.bytes(&copies), 512 * KIB);
    }
    check_covers(&copies, &pieces);
    // An odd row size and count: the last piece holds what is left.
    let (copy, _) = rows_copy(&mut r, &src, 1, 1000, 3001, std::ptr::null_mut());
    let copies = [copy];
    let pieces = plan_for(&copies, 3001 * 1000, 4);
    let per = (3001 * 1000 / 16).clamp(MIN_PIECE, MAX_PIECE) / 1000;
    assert_eq!(pieces.len(), 3001usize.div_ceil(per));
    check_covers(&copies, &pieces);
}

#[test]
fn rows_longer_than_a_piece_are_cut_within_each_row() {
    let mut r = rng("long rows plan");
    let src = random_bytes(&mut r, 8 * MIB);
    let len = 3 * MIB + 7;
    let (copy, starts) = rows_copy(&mut r, &src, 1, len, 3, std::ptr::null_mut());
    let copies = [copy];
    let pieces = plan_for(&copies, 3 * len, 16);
    let writes = check_covers(&copies, &pieces);
    // Every part lies within one row, and reads that row's bytes.
    for (p, (_, range)) in pieces.iter().zip(&writes) {
        let Part::Bytes(part, dst) = &p.part else {
            panic!("a long row is cut into parts of bytes")
        };
        assert_eq!(dst, range);
        let row = dst.start / len;
        assert_eq!((dst.end - 1) / len, row, "a part within one row");
        assert!(dst.len() <= MAX_PIECE);
        let expect = src[starts[row]..].as_ptr() as usize + dst.start % len;
        assert_eq!(part.ptr as usize, expect);
    }
}

#[test]
fn small_copies_are_grouped_with_small_copies_of_rows() {
    let mut r = rng("group plan");
    let src = random_bytes(&mut r, MIB);
    let null = std::ptr::null_mut();
    let copies = [
        view_copy(&src, 5, 100, null),
        rows_copy(&mut r, &src, 8, 64, 10, null).0,
        view_copy(&src, 0, 0, null),
        rows_copy(&mut r, &src, 4, 0, 10, null).0,
        rows_copy(&mut r, &src, 256, 256, 4096, null).0,
        view_copy(&src, 9, 700 * KIB, null),
    ];
    let total = copies.iter().map(|c| c.src.bytes()).sum();
    let pieces = plan_for(&copies, total, 8);
    check_covers(&copies, &pieces);
    assert_eq!(pieces[0].copies, 0..4);
    assert!(matches!(pieces[0].part, Part::Whole));
    // On one thread, everything is one piece.
    let one = plan_for(&copies, total, 1);
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].copies, 0..copies.len());
    check_covers(&copies, &one);
}

#[test]
fn rows_land_byte_equal_to_the_reference_at_every_size() {
    let mut r = rng("rows run");
    let src = random_bytes(&mut r, 16 * MIB + 13);
    for (stride, len, count) in [
        (1, 1, 5000),
        (3, 3, 4001),
        (1, 257, 1003),
        (256, 256, 16384),
        (4 * KIB, 4 * KIB, 2048),
        (64 * KIB, 64 * KIB, 40),
        (7, 3 * MIB + 5, 3),
        (16, 0, 100),
    ] {
        // Windows (stride below the length, overlapping) as well as rows.
        for stride in [stride, (stride / 2).max(1)] {
            let mut out = vec![0u8; len * count + 1];
            let sentinel = r.next_u64() as u8;
            out[len * count] = sentinel;
            let (copy, starts) = rows_copy(&mut r, &src, stride, len, count, out.as_mut_ptr());
            let copies = [copy];
            let total = len * count;
            for threads in [1, 4] {
                out[..total].fill(!sentinel);
                let pieces = plan_for(&copies, total, threads);
                // SAFETY: `src` outlives the call and is not written; `out` holds every row.
                unsafe { run_pieces(&copies, &pieces, Share::All, None) }.unwrap();
                for (k, &s) in starts.iter().enumerate() {
                    let at = s * stride;
                    assert!(
                        out[k * len..(k + 1) * len] == src[at..at + len],
                        "row {k} of {count} ({len} B at {at}), {threads} threads"
                    );
                }
                assert_eq!(out[total], sentinel, "nothing written past the rows");
            }
        }
    }
}

#[test]
fn every_piece_is_reported_once_and_an_error_reaches_the_caller() {
    let mut r = rng("rows report");
    let src = random_bytes(&mut r, 4 * MIB);
    let mut out = vec![0u8; 4 * MIB];
    let (copy, _) = rows_copy(&mut r, &src, KIB, KIB, 4096, out.as_mut_ptr());
    let copies = [copy];
    let pieces = plan_for(&copies, 4 * MIB, 16);
    assert!(pieces.len() > 4);
    let seen = Mutex::new(vec![0; pieces.len()]);
    let fail_at = below(&mut r, pieces.len());
    let on_piece = |i: usize| -> Result<()> {
        seen.lock().unwrap()[i] += 1;
        if i == fail_at {
            return Err(Error::Field {
                path: "test".into(),
                message: format!("piece {i} refused"),
            });
        }
        Ok(())
    };
    // SAFETY: as above.
    let got = unsafe { run_pieces(&copies, &pieces, Share::All, Some(&on_piece)) };
    assert!(
        got.unwrap_err()
            .to_string()
            .contains(&format!("piece {fail_at} refused"))
    );
    // Pieces run on after an error on the copy threads; on the calling thread alone they stop.
    let seen = seen.into_inner().unwrap();
    assert!(seen.iter().all(|&n| n <= 1), "{seen:?}");
    assert!(seen[..=fail_at].iter().all(|&n| n == 1), "{seen:?}");
}
