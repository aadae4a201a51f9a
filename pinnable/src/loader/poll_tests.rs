//! Taking batches without waiting, or waiting with a deadline: `Epoch::try_next` and
//! `Epoch::next_within` against `next()`.

use super::*;
use crate::alloc::{PinnedPool, PoolConfig};
use crate::{Error, Tensor};

/// Samples per test dataset.
const N: usize = 101;

fn pool() -> PinnedPool {
    PinnedPool::heap(PoolConfig::default())
}

#[test]
fn try_next_takes_the_same_batches_as_next_and_never_waits() {
    let mut r = SplitMix64::for_test("try_next_takes_the_same_batches");
    let pool = pool();
    let bad = 3 + r.below(N as u64 - 6) as usize;
    let seed = r.next_u64();
    let make = || {
        let data = FnDataset::new(N, move |i| {
            if i == bad {
                Err(Error::Shape(format!("sample {i} is bad")))
            } else {
                Ok(Tensor::from_vec1(vec![i as u32; 3]))
            }
        });
        Loader::builder(data)
            .batch_size(2)
            .shuffle(seed)
            .workers(2)
            .pool(pool.clone())
            .build(Stack)
            .unwrap()
    };
    let (a, b) = (make(), make());
    let values = |t: crate::Result<Tensor>| t.map(|t| t.to_vec::<u32>().unwrap());
    let waited: Vec<_> = a.iter().map(values).collect();
    let mut polled = Vec::new();
    let mut epoch = b.iter();
    loop {
        match epoch.try_next() {
            std::task::Poll::Ready(Some(item)) => polled.push(values(item)),
            std::task::Poll::Ready(None) => break,
            std::task::Poll::Pending => std::thread::yield_now(),
        }
    }
    assert_eq!(waited.len(), polled.len(), "bad sample {bad}");
    for (w, p) in waited.iter().zip(&polled) {
        match (w, p) {
            (Ok(w), Ok(p)) => assert_eq!(w, p),
            (Err(Error::Sample { index, .. }), Err(Error::Sample { index: j, .. })) => {
                assert_eq!((index, j), (&bad, &bad));
            }
            other => panic!("bad sample {bad}: {other:?}"),
        }
    }
    assert!(
        polled.last().is_some_and(Result::is_err),
        "the error ends the epoch"
    );
    assert!(matches!(epoch.try_next(), std::task::Poll::Ready(None)));
}

#[test]
fn next_within_gives_up_at_its_timeout_and_then_takes_the_same_batches() {
    let pool = pool();
    let slow = FnDataset::new(8, |i| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        Ok(Tensor::from_vec1(vec![i as u32; 2]))
    });
    let loader = Loader::builder(slow)
        .batch_size(2)
        .workers(1)
        .pool(pool.clone())
        .build(Stack)
        .unwrap();
    let mut epoch = loader.iter();
    // The first batch takes two 20 ms samples: 1 ms is not enough.
    assert!(
        epoch
            .next_within(std::time::Duration::from_millis(1))
            .is_pending()
    );
    let mut got = Vec::new();
    let mut pending = 0;
    loop {
        match epoch.next_within(std::time::Duration::from_millis(2)) {
            std::task::Poll::Ready(Some(b)) => got.push(b.unwrap().to_vec::<u32>().unwrap()),
            std::task::Poll::Ready(None) => break,
            std::task::Poll::Pending => pending += 1,
        }
    }
    let want: Vec<Vec<u32>> = (0..4u32)
        .map(|b| vec![2 * b, 2 * b, 2 * b + 1, 2 * b + 1])
        .collect();
    assert_eq!(got, want);
    assert!(pending > 0, "every batch took 40 ms to make");
    let waited = loader.stats().unwrap().waited;
    assert!(waited >= std::time::Duration::from_millis(60), "{waited:?}");
}
