//! Streams mixed into one (`Mix::streams`): each stream's order and share, every item once,
//! resuming mid-epoch when every stream can seek, and the settings a stream cannot honour.

use pinnable::Error;
use pinnable::loader::{Collator, IterSource, Loader, Mix, Stop};
use pinnable_harness::rng;
use rand::Rng;

/// A stream's items, from a start.
type Tagged = std::vec::IntoIter<pinnable::Result<u64>>;

/// A stream of `len` items tagged `tag * 1_000_000 + i`, seekable.
fn tagged(
    tag: u64,
    len: u64,
) -> IterSource<impl Fn(u64) -> Tagged + Send + Sync, impl Fn(u64, u64) -> Tagged + Send + Sync> {
    let items = move |from: u64| -> Tagged {
        (from..len)
            .map(|i| Ok(tag * 1_000_000 + i))
            .collect::<Vec<_>>()
            .into_iter()
    };
    IterSource::new(move |_epoch| items(0)).seekable(move |_epoch, item| items(item))
}

#[test]
fn a_mix_of_streams_keeps_each_streams_order_and_its_share() {
    let mut r = rng("a_mix_of_streams_keeps_each_streams_order_and_its_share");
    let (na, nb) = (r.random_range(200..3000u64), r.random_range(200..3000u64));
    let w: f64 = r.random_range(0.2..0.8);
    let seed = r.random();
    for stop in [Stop::FirstExhausted, Stop::EachOnce] {
        let mix = Mix::streams(seed)
            .add(tagged(1, na), w)
            .add(tagged(2, nb), 1.0 - w)
            .stop(stop)
            .build()
            .unwrap();
        let epoch = r.random_range(0..5);
        let items: Vec<u64> = mix.open(epoch).map(|i| i.unwrap()).collect();
        let again: Vec<u64> = mix.open(epoch).map(|i| i.unwrap()).collect();
        assert_eq!(items, again, "the same epoch draws the same");
        let other: Vec<u64> = mix.open(epoch + 1).map(|i| i.unwrap()).collect();
        assert_ne!(items, other, "another epoch draws anew");
        let part = |tag: u64| -> Vec<u64> {
            items
                .iter()
                .filter(|&&i| i / 1_000_000 == tag)
                .map(|&i| i % 1_000_000)
                .collect()
        };
        let (a, b) = (part(1), part(2));
        // Each stream read in its own order, from its start.
        assert_eq!(a, (0..a.len() as u64).collect::<Vec<_>>(), "{stop:?}");
        assert_eq!(b, (0..b.len() as u64).collect::<Vec<_>>(), "{stop:?}");
        match stop {
            Stop::EachOnce => assert_eq!((a.len() as u64, b.len() as u64), (na, nb)),
            _ => {
                // Ended by the stream that ran out, the other read part-way.
                assert!(
                    a.len() as u64 == na || b.len() as u64 == nb,
                    "{} {}",
                    a.len(),
                    b.len()
                );
                // Each item a draw of weight w: the share within 6 standard deviations.
                let n = items.len() as f64;
                let sd = (w * (1.0 - w) / n).sqrt();
                let share = a.len() as f64 / n;
                // The last draw ended a stream: one item's worth of slack besides.
                assert!(
                    (share - w).abs() <= 6.0 * sd + 1.0 / n,
                    "share {share} of weight {w}, {n} items"
                );
            }
        }
    }
}

#[test]
fn a_loader_over_a_mix_of_seekable_streams_resumes_mid_epoch() {
    let mut r = rng("a_loader_over_a_mix_of_seekable_streams_resumes_mid_epoch");
    let seed = r.random();
    let (na, nb, nc) = (
        r.random_range(100..900u64),
        r.random_range(100..900u64),
        r.random_range(100..900u64),
    );
    let weights = [
        r.random_range(0.1..1.0),
        r.random_range(0.1..1.0),
        r.random_range(0.1..1.0),
    ];
    let mix = || {
        Mix::streams(seed)
            .add(tagged(1, na), weights[0])
            .add(tagged(2, nb), weights[1])
            .add(tagged(3, nc), weights[2])
            .build()
            .unwrap()
    };
    let batch = r.random_range(1..17);
    let collect = |items: Vec<u64>, _c: &mut Collator| Ok(items);
    let loader = Loader::builder(mix())
        .batch_size(batch)
        .workers(r.random_range(1..4))
        .build_with(collect)
        .unwrap();
    let epoch = r.random_range(0..4);
    let whole: Vec<Vec<u64>> = loader.run_epoch(epoch).map(|b| b.unwrap()).collect();
    assert!(!whole.is_empty());
    let k = r.random_range(0..whole.len());
    let mut e = loader.run_epoch(epoch);
    for _ in 0..k {
        e.next().unwrap().unwrap();
    }
    let position = e.position();
    drop(e);
    let resumed = Loader::builder(mix())
        .batch_size(batch)
        .workers(r.random_range(1..4))
        .resume(position)
        .build_with(collect)
        .unwrap();
    let rest: Vec<Vec<u64>> = resumed.run_epoch(epoch).map(|b| b.unwrap()).collect();
    assert_eq!(
        rest,
        whole[k..].to_vec(),
        "resumed after {k} of {} batches",
        whole.len()
    );

    // A stream that cannot seek: the mix resumes at an epoch's start only, said at build.
    if k > 0 {
        let plain = Mix::streams(seed)
            .add(tagged(1, na), 1.0)
            .add(IterSource::new(move |_| (0..nb).map(Ok)), 1.0)
            .build()
            .unwrap();
        let e = Loader::builder(plain)
            .batch_size(batch)
            .resume(position)
            .build_with(collect)
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Config {
                    setting: "resume",
                    ..
                }
            ),
            "{e}"
        );
    }
}

#[test]
fn a_mix_of_streams_refuses_what_it_cannot_do() {
    let cases = [
        Mix::streams::<u64>(1).build().map(|_| ()),
        Mix::streams(1).add(tagged(1, 5), 0.0).build().map(|_| ()),
        Mix::streams(1)
            .add(tagged(1, 5), f64::NAN)
            .build()
            .map(|_| ()),
        Mix::streams(1)
            .add(tagged(1, 5), 1.0)
            .stop(Stop::AllExhausted)
            .build()
            .map(|_| ()),
        Mix::streams(1)
            .add(tagged(1, 5), 1.0)
            .stop(Stop::Forever { samples: 10 })
            .build()
            .map(|_| ()),
    ];
    for (k, result) in cases.into_iter().enumerate() {
        let e = result.unwrap_err();
        assert!(
            matches!(&e, Error::Config { setting: "mix", .. }),
            "case {k}: {e}"
        );
    }
}
