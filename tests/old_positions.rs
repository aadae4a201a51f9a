//! Positions saved by an earlier release (tests/data/positions, README there): each resumes
//! exactly, delivering the batch that release delivered next and then the rest of the epoch as
//! an uninterrupted run gives it, or (a packing plan, whose fingerprint that release took from
//! the standard library's default hasher) is refused with an error naming the format version and what to do.
//! Positions saved now carry fingerprints pinned here.

use pinnable::formats::tar::{TarSample, TarShards};
use pinnable::formats::tokens::{PackedDocs, TokenDocs};
use pinnable::loader::{Budget, BudgetPlan, Collator, Loader, Mix, Position};
use pinnable::{DType, Error, Result, Tensor, ToDevice};

/// The repository's `tests/data`, wherever the tests run (`pinnable_harness::fixture`).
fn fixtures() -> std::path::PathBuf {
    pinnable_harness::fixture("tests/data")
}

fn ints(samples: Vec<i64>, c: &mut Collator) -> Result<Tensor> {
    let values = c.stack_scalars("values", samples)?;
    c.finish()?.take(values)
}

type Ints = fn(Vec<i64>, &mut Collator) -> Result<Tensor>;

/// `shuffled`: 103 samples `0..103`, batches of 8, shuffled from seed 42, rank 1 of 2.
fn shuffled() -> pinnable::loader::LoaderBuilder<Vec<i64>> {
    Loader::builder((0..103).collect::<Vec<i64>>())
        .batch_size(8)
        .shuffle(42)
        .shard(1, 2)
        .workers(2)
}

/// Source `s` of the mixes: `s · 1_000_000 + i` for `i` below `len`.
fn source(s: i64, len: i64) -> Vec<i64> {
    (0..len).map(|i| s * 1_000_000 + i).collect()
}

/// `mix_weighted`: three sources of 40, 70 and 25 samples weighted 0.5, 0.3 and 0.2, batches
/// of 5, shuffled from seed 7.
fn mix_weighted() -> pinnable::loader::LoaderBuilder<Mix<Vec<i64>>> {
    let mix = Mix::weighted(vec![
        (source(0, 40), 0.5),
        (source(1, 70), 0.3),
        (source(2, 25), 0.2),
    ])
    .unwrap();
    Loader::builder(mix).batch_size(5).shuffle(7).workers(2)
}

/// `mix_per_batch`: sources of 30 and 50 samples, 2 and 3 of each in every batch, shuffled
/// from seed 9.
fn mix_per_batch() -> pinnable::loader::LoaderBuilder<Mix<Vec<i64>>> {
    let mix = Mix::per_batch(vec![(source(0, 30), 2), (source(1, 50), 3)]).unwrap();
    Loader::builder(mix).batch_size(5).shuffle(9).workers(2)
}

/// The documents of `packed`: 120 of them, document `i` of `1 + (7i² + 13i) mod 150` u16
/// tokens, token `j` being `(31i + 7j) mod 50257`.
fn documents() -> TokenDocs {
    let docs: Vec<Tensor> = (0..120u64)
        .map(|i| {
            let len = 1 + (7 * i * i + 13 * i) % 150;
            Tensor::from_vec1(
                (0..len)
                    .map(|j| ((31 * i + 7 * j) % 50257) as u16)
                    .collect::<Vec<u16>>(),
            )
        })
        .collect();
    TokenDocs::from_dataset(docs).unwrap()
}

/// `packed`: [`documents`] packed into 2 rows of 160 tokens a batch, shuffled from seed 11,
/// sorted in windows of 16.
fn packed() -> PackedDocs {
    let docs = documents();
    let plan = BudgetPlan::options(Budget::Packed {
        row_tokens: 160,
        rows: 2,
    })
    .shuffle(11)
    .sort_window(16)
    .build(docs.lengths().clone())
    .unwrap();
    PackedDocs::new(docs, plan).unwrap()
}

fn packed_builder(p: &PackedDocs) -> pinnable::loader::LoaderBuilder<PackedDocs> {
    Loader::builder(p.clone()).workers(2)
}

/// `tar`: `ustar.tar`, `pax.tar` and `awkward_gnu.tar` of tests/data/tar in that order, a
/// shuffle buffer of 4, batches of 2, shuffled from seed 5.
fn tar() -> pinnable::loader::LoaderBuilder<TarShards> {
    let dir = fixtures().join("tar");
    let shards = ["ustar.tar", "pax.tar", "awkward_gnu.tar"]
        .map(|f| dir.join(f).to_str().unwrap().to_owned());
    Loader::builder(TarShards::open(shards).unwrap().shuffle_buffer(4))
        .batch_size(2)
        .shuffle(5)
        .workers(2)
}

/// A tar batch: each sample's key, as bytes summed into a number (FNV-1a, 63 bits).
fn keys(samples: Vec<TarSample>, c: &mut Collator) -> Result<Tensor> {
    let k = samples.iter().map(|s| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in s.key_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        (h >> 1) as i64
    });
    let v = c.stack_scalars("keys", k.collect::<Vec<_>>())?;
    c.finish()?.take(v)
}

/// The saved position `name`, in both forms (they must agree), and the batch the release
/// that saved it delivered next, one line of numbers a field.
fn saved(name: &str) -> (Position, Vec<Vec<i64>>) {
    let dir = fixtures().join("positions");
    let read = |ext: &str| {
        let path = dir.join(format!("{name}.{ext}"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let from_bytes = Position::from_bytes(&read("bin")).unwrap();
    let text = String::from_utf8(read("txt")).unwrap();
    let from_text: Position = text.trim().parse().unwrap();
    assert_eq!(from_bytes, from_text, "{name}");
    // Read back as written: the old format version is kept.
    assert_eq!(from_bytes.to_bytes(), read("bin"), "{name}");
    assert_eq!(from_text.to_string(), text.trim(), "{name}");
    let next = String::from_utf8(read("next"))
        .unwrap()
        .lines()
        .map(|l| l.split(' ').map(|v| v.parse().unwrap()).collect())
        .collect();
    (from_bytes, next)
}

fn values(t: Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap()
}

/// Resumes `builder()` from `name`'s position: its first batch is the saved next batch, and the
/// rest of the epoch is what an uninterrupted run of epoch `epoch` delivers past `batch`.
macro_rules! resumes_exactly {
    ($name:expr, $builder:expr, $build:ident($batcher:expr), ($epoch:expr, $batch:expr)) => {{
        let (position, next) = saved($name);
        assert_eq!((position.epoch(), position.batch()), ($epoch, $batch));
        let whole = $builder.$build($batcher).unwrap();
        let all: Vec<Vec<i64>> = whole
            .run_epoch($epoch)
            .map(|b| values(b.unwrap()))
            .collect();
        let resumed = $builder
            .workers(3)
            .resume(position)
            .$build($batcher)
            .unwrap();
        let rest: Vec<Vec<i64>> = resumed.iter().map(|b| values(b.unwrap())).collect();
        assert_eq!(rest[0], next[0], "{}", $name);
        assert_eq!(rest, all[$batch as usize..], "{}", $name);
        assert!(resumed.position().epoch() == $epoch + 1);
        position
    }};
}

#[test]
fn a_shuffled_loader_resumes_exactly() {
    let p = resumes_exactly!("shuffled", shuffled(), build(ints as Ints), (1, 3));
    assert_eq!(p.plan(), None);
}

#[test]
fn mixes_resume_exactly_and_keep_their_fingerprints() {
    let p = resumes_exactly!("mix_weighted", mix_weighted(), build(ints as Ints), (2, 4));
    let now = mix_weighted().build(ints as Ints).unwrap().position();
    assert_eq!(now.plan(), p.plan());
    assert!(now.to_string().starts_with("pinnable-position/3 "), "{now}");
    let p = resumes_exactly!(
        "mix_per_batch",
        mix_per_batch(),
        build(ints as Ints),
        (1, 3)
    );
    let now = mix_per_batch().build(ints as Ints).unwrap().position();
    assert_eq!(now.plan(), p.plan());
}

#[test]
fn tar_shards_resume_exactly_and_keep_their_fingerprint() {
    let p = resumes_exactly!("tar", tar(), build_with(keys), (1, 2));
    let now = tar().build_with(keys).unwrap().position();
    assert_eq!(now.plan(), p.plan());
}

/// The old packing plan's fingerprint cannot be checked: refused, naming the format version
/// and the ways to go on; the position the error offers (this release's fingerprint) resumes
/// exactly, and a position saved now carries the pinned fingerprint in format version 3.
#[test]
fn a_packing_plan_of_format_2_is_refused_with_what_to_do() {
    let (position, next) = saved("packed");
    assert_eq!((position.epoch(), position.batch()), (1, 3));
    let p = packed();
    let batcher = || p.batcher(DType::I64).unwrap();
    let err = packed_builder(&p)
        .resume(position)
        .build(batcher())
        .map(|_| ())
        .unwrap_err();
    let Error::Position { problem } = &err else {
        panic!("{err:?}")
    };
    for want in [
        "format version 2",
        "packing plan",
        "default hasher",
        "set_epoch(1)",
        "3 of its batches",
    ] {
        assert!(problem.contains(want), "{want:?} is not in: {err}");
    }
    assert!(!matches!(err, Error::Resume { .. }));

    const PINNED: u64 = 263_395_865_236_236_627;
    let offered: Position = problem.rsplit('`').nth(1).unwrap().parse().unwrap();
    assert_eq!(offered.plan(), Some(PINNED));
    assert_eq!((offered.epoch(), offered.batch()), (1, 3));
    let fresh = packed_builder(&p).build(batcher()).unwrap();
    assert_eq!(fresh.position().plan(), Some(PINNED));
    assert!(
        fresh
            .position()
            .to_string()
            .starts_with("pinnable-position/3 ")
    );
    let all: Vec<_> = fresh.run_epoch(1).map(|b| b.unwrap()).collect();
    let resumed = packed_builder(&p).resume(offered).build(batcher()).unwrap();
    let rest: Vec<_> = resumed.iter().map(|b| b.unwrap()).collect();
    assert_eq!(rest.len(), all.len() - 3);
    let host = |t: &Tensor| t.to_cpu(false).unwrap();
    let ids = |b: &pinnable::formats::tokens::PackedBatch| {
        host(&b.input_ids.tensor().unwrap())
            .to_vec::<i64>()
            .unwrap()
    };
    let cu = |b: &pinnable::formats::tokens::PackedBatch| {
        let v = host(&b.cu_seqlens).to_vec::<i32>().unwrap();
        v.into_iter().map(i64::from).collect::<Vec<_>>()
    };
    assert_eq!(
        (ids(&rest[0]), cu(&rest[0])),
        (next[0].clone(), next[1].clone())
    );
    for (a, b) in rest.iter().zip(&all[3..]) {
        assert_eq!((ids(a), cu(a)), (ids(b), cu(b)));
    }
}
