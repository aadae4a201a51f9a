//! The hash of every fingerprint a [`Position`](crate::loader::Position) carries (packing
//! plans, mixes, tar shard lists): FNV-1a 64, written here and fixed for every release, so a
//! position saved under one toolchain resumes under another (the standard library's default hasher
//! promises no such thing).
//!
//! What is fed is fixed too, independent of the machine: integers as little-endian bytes of
//! a stated width (`usize` as 64 bits), booleans and tags as one byte, floats as their IEEE
//! bits, and byte strings after their length, so that `("ab", "c")` and `("a", "bc")` differ.
//! Nothing here implements [`std::hash::Hasher`]: a derived `Hash` feeds what its compiler
//! chooses (native-endian `usize`, discriminants of its width), which no release keeps fixed.

/// FNV-1a's 64-bit offset basis.
const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a's 64-bit prime.
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// A fingerprint being computed: FNV-1a 64 over what the methods feed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fingerprint(u64);

impl Fingerprint {
    /// The fingerprint of nothing yet (FNV-1a's offset basis).
    pub(crate) const fn new() -> Fingerprint {
        Fingerprint(OFFSET)
    }

    /// Feeds `bytes` as they are, without their length: for fixed-width fields, and for
    /// sequences whose end is marked otherwise.
    pub(crate) fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(PRIME);
        }
        self
    }

    /// Feeds one byte (a tag, a variant).
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.raw(&[v])
    }

    /// Feeds `v` as 4 little-endian bytes.
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    /// Feeds `v` as 8 little-endian bytes.
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    /// Feeds `v` as 8 little-endian bytes on every machine.
    pub(crate) fn usize(&mut self, v: usize) -> &mut Self {
        self.u64(v as u64)
    }

    /// Feeds 1 for true, 0 for false.
    pub(crate) fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(u8::from(v))
    }

    /// Feeds `v`'s IEEE 754 bits as 8 little-endian bytes.
    pub(crate) fn f64(&mut self, v: f64) -> &mut Self {
        self.u64(v.to_bits())
    }

    /// Feeds 0 for `None`, or 1 and the value as [`u64`](Self::u64) does.
    pub(crate) fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            None => self.u8(0),
            Some(v) => self.u8(1).u64(v),
        }
    }

    /// Feeds the length of `bytes` (8 little-endian bytes), then `bytes`.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "the feed for strings; no fingerprint holds one yet"
        )
    )]
    pub(crate) fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        self.usize(bytes.len()).raw(bytes)
    }

    /// The 64-bit digest.
    pub(crate) fn finish(&self) -> u64 {
        self.0
    }

    /// The digest shifted right by 1, below 2⁶³: positions print it, and a number that fits
    /// a signed 64-bit integer reads the same in every tool.
    pub(crate) fn finish63(&self) -> u64 {
        self.0 >> 1
    }
}

#[cfg(test)]
mod tests {
    use super::Fingerprint;
    use crate::loader::SplitMix64;

    fn of(bytes: &[u8]) -> u64 {
        Fingerprint::new().raw(bytes).finish()
    }

    /// FNV-1a 64's published test vectors (the FNV authors' test suite).
    #[test]
    fn published_vectors() {
        assert_eq!(of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(of(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(of(b"b"), 0xaf63_df4c_8601_f1a5);
        assert_eq!(of(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// Integers are fed little-endian at their width, whatever the machine; strings after
    /// their length.
    #[test]
    fn fixed_feeds() {
        let mut r = SplitMix64::for_test("fixed_feeds");
        let v = r.next_u64();
        let mut a = Fingerprint::new();
        a.u64(v);
        assert_eq!(a.finish(), of(&v.to_le_bytes()));
        let mut b = Fingerprint::new();
        b.usize(v as usize);
        assert_eq!(b.finish(), a.finish());
        let w = v as u32;
        assert_eq!(Fingerprint::new().u32(w).finish(), of(&w.to_le_bytes()));
        let x = f64::from_bits(r.next_u64() >> 12);
        assert_eq!(
            Fingerprint::new().f64(x).finish(),
            of(&x.to_bits().to_le_bytes())
        );
        let mut s = Fingerprint::new();
        s.bytes(b"abc");
        let mut want = 3u64.to_le_bytes().to_vec();
        want.extend_from_slice(b"abc");
        assert_eq!(s.finish(), of(&want));
        assert_eq!(s.finish63(), s.finish() >> 1);
        // Pinned: the values positions carry must never change.
        assert_eq!(
            Fingerprint::new().u64(1).bytes(b"pinnable").finish(),
            0x3419_aeee_0058_2eab
        );
    }

    /// Where one string ends is part of what is fed: moving a byte from one string to the
    /// next, or an option from present to absent, changes the digest.
    #[test]
    fn boundaries_count() {
        let two = |a: &[u8], b: &[u8]| Fingerprint::new().bytes(a).bytes(b).finish();
        assert_ne!(two(b"ab", b"c"), two(b"a", b"bc"));
        assert_ne!(two(b"", b"x"), two(b"x", b""));
        assert_ne!(
            Fingerprint::new().opt_u64(None).u64(0).finish(),
            Fingerprint::new().opt_u64(Some(0)).finish()
        );
        let mut r = SplitMix64::for_test("boundaries_count");
        let bytes: Vec<u8> = (0..64).map(|_| r.next_u64() as u8).collect();
        let cut = 1 + r.below(62) as usize;
        assert_ne!(
            two(&bytes[..cut], &bytes[cut..]),
            two(&bytes[..cut - 1], &bytes[cut - 1..])
        );
    }

    /// The fingerprints of fixed settings, pinned: a change here makes every saved position of
    /// such a setting refuse to resume. The mixes' and the tar shard list's are the values
    /// positions saved by earlier releases hold (tests/data/positions).
    #[test]
    fn pinned_fingerprints() {
        use crate::formats::tar::names_hash;
        use crate::loader::{Budget, BudgetPlan, Dataset, Mix, PlanRequest};

        let lengths: Vec<u32> = (0..120u64)
            .map(|i| (1 + (7 * i * i + 13 * i) % 150) as u32)
            .collect();
        let packed = BudgetPlan::options(Budget::Packed {
            row_tokens: 160,
            rows: 2,
        })
        .shuffle(11)
        .sort_window(16);
        // Also computed from the layout `digest` documents by a separate script.
        assert_eq!(
            packed.build(lengths.clone()).unwrap().digest(),
            263_395_865_236_236_627
        );
        let tokens = BudgetPlan::options(Budget::Tokens {
            max_tokens: 300,
            count_padding: true,
        })
        .split_long(true)
        .max_pieces_per_row(3);
        assert_eq!(
            tokens.build(lengths).unwrap().digest(),
            2_571_310_268_774_792_562
        );

        let source = |s: i64, len: i64| (0..len).map(|i| s * 1_000_000 + i).collect::<Vec<_>>();
        let weighted = Mix::weighted(vec![
            (source(0, 40), 0.5),
            (source(1, 70), 0.3),
            (source(2, 25), 0.2),
        ])
        .unwrap();
        assert_eq!(
            weighted
                .plan(&PlanRequest::new(0))
                .unwrap()
                .fingerprint()
                .unwrap()
                .1,
            5_772_349_297_078_180_729
        );
        let per_batch = Mix::per_batch(vec![(source(0, 30), 2), (source(1, 50), 3)]).unwrap();
        assert_eq!(
            per_batch
                .plan(&PlanRequest::new(0))
                .unwrap()
                .fingerprint()
                .unwrap()
                .1,
            3_025_356_918_671_458_057
        );

        // Only the last component of each path counts.
        let names = ["data/ustar.tar", "pax.tar", "s3://bucket/x/awkward_gnu.tar"];
        assert_eq!(
            names_hash(names.into_iter()),
            (16_602_696_042_651_058_180u64 >> 32) as u32
        );
    }

    /// Every setting of a token-budget plan, and every length, changes its fingerprint.
    #[test]
    fn every_plan_setting_counts() {
        use crate::loader::{Budget, BudgetOptions, BudgetPlan};

        let mut r = SplitMix64::for_test("every_plan_setting_counts");
        let n = 2 + r.below(200) as usize;
        let lengths: Vec<u32> = (0..n).map(|_| 1 + r.below(100) as u32).collect();
        let (tokens, rows) = (100 + r.below(100) as usize, 1 + r.below(4) as usize);
        let base = || {
            BudgetPlan::options(Budget::Packed {
                row_tokens: tokens,
                rows,
            })
        };
        let digest = |o: BudgetOptions, l: &[u32]| o.build(l.to_vec()).unwrap().digest();
        let d = digest(base(), &lengths);
        let seed = r.next_u64();
        let mut longer = lengths.clone();
        longer[r.below(n as u64) as usize] += 1;
        let mut fewer = lengths.clone();
        fewer.pop();
        let others = [
            digest(base().shuffle(seed), &lengths),
            digest(base().shuffle(seed ^ 1), &lengths),
            digest(base().sort_window(7), &lengths),
            digest(base().split_long(true), &lengths),
            digest(base().max_pieces_per_row(5), &lengths),
            digest(
                BudgetPlan::options(Budget::Packed {
                    row_tokens: tokens + 1,
                    rows,
                }),
                &lengths,
            ),
            digest(
                BudgetPlan::options(Budget::Tokens {
                    max_tokens: tokens,
                    count_padding: false,
                }),
                &lengths,
            ),
            digest(base(), &longer),
            digest(base(), &fewer),
        ];
        for (i, o) in others.iter().enumerate() {
            assert_ne!(*o, d, "setting {i}");
            assert!(*o < 1 << 63);
        }
        assert_eq!(digest(base(), &lengths), d);
    }
}
