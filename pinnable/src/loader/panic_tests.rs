//! Panics in user code on the loader's threads (a sample's or a batch's `Drop`, a stream's
//! `next`) reach the consumer as [`Error::Panicked`] for the batch being made, never as a hang.
//! Each epoch runs under a watchdog, so a regression fails the test instead of hanging the run.
//! Over the heap test-double pool, so these run under Miri too (`scripts/miri.sh`).

use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::Duration;

use super::*;
use crate::alloc::{PinnedPool, PoolConfig};
use crate::transfer::MoveContext;
use crate::{Error, Result, Tensor, ToDevice};

fn pool() -> PinnedPool {
    PinnedPool::heap(PoolConfig::default())
}

/// Runs `f` on a thread of its own and returns what it returns, or fails the test if it takes
/// longer than a minute (the epoch hung).
fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = channel();
    let runner = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(v) => {
            runner.join().expect("the runner returned");
            v
        }
        Err(RecvTimeoutError::Disconnected) => match runner.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("the runner sends before it returns"),
        },
        Err(RecvTimeoutError::Timeout) => {
            panic!("the epoch hung: a loader thread died without delivering its batch")
        }
    }
}

/// A sample whose `Drop` panics while armed (a batcher defuses what it takes).
struct Bomb {
    value: u32,
    armed: bool,
}

impl Drop for Bomb {
    fn drop(&mut self) {
        if self.armed {
            panic!("sample {} panicked when dropped", self.value);
        }
    }
}

/// A batch whose `Drop` panics while armed.
struct Boom {
    values: Tensor,
    armed: bool,
}

impl Drop for Boom {
    fn drop(&mut self) {
        if self.armed {
            panic!("a batch panicked when dropped");
        }
    }
}

impl ToDevice for Boom {
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self> {
        Ok(Boom {
            values: self.values.to_device_with(cx)?,
            armed: false,
        })
    }
}

/// Defuses every sample and stacks their values; the batch is armed when `arm` says so.
fn stack(samples: Vec<Bomb>, c: &mut Collator, arm: impl Fn(&[u32]) -> bool) -> Result<Boom> {
    let values: Vec<u32> = samples.iter().map(|s| s.value).collect();
    for mut s in samples {
        s.armed = false;
        drop(s);
    }
    let x = c.stack_scalars("values", values.iter().copied())?;
    Ok(Boom {
        values: c.finish()?.take(x)?,
        armed: arm(&values),
    })
}

/// Each batch's values, or its error; the batches are defused once read.
fn drain(epoch: impl Iterator<Item = Result<Boom>>) -> Vec<Result<Vec<u32>>> {
    epoch
        .map(|b| {
            b.map(|mut b| {
                b.armed = false;
                b.values.to_vec::<u32>().unwrap()
            })
        })
        .collect()
}

fn assert_panicked(r: &Result<Vec<u32>>, batch: usize, message: &str) {
    match r {
        Err(Error::Panicked { what, message: m }) => {
            assert!(what.contains(&format!("batch {batch}")), "{what}");
            assert_eq!(m, message);
        }
        other => panic!("batch {batch}: expected a panic error, got {other:?}"),
    }
}

#[test]
fn a_sample_whose_drop_panics_after_a_failed_get_fails_its_batch() {
    for workers in [2, 3, 1] {
        let results = within(move || {
            // Batch 2 holds samples 8..12; sample 10 fails after 8 and 9 loaded, and 9's
            // `Drop` panics.
            // More batches than the loader's permits, so the others cannot drain the epoch.
            let data = FnDataset::new(64, |i| match i {
                10 => Err(Error::Shape("an unreadable record".into())),
                _ => Ok(Bomb {
                    value: i as u32,
                    armed: i == 9,
                }),
            });
            let loader = Loader::builder(data)
                .batch_size(4)
                .workers(workers)
                .prefetch(1)
                .pool(pool())
                .build_with(|s, c: &mut Collator| stack(s, c, |_| false))
                .unwrap();
            drain(loader.iter())
        });
        assert_eq!(results.len(), 3, "{workers} workers: {results:?}");
        assert_eq!(results[0].as_ref().unwrap(), &[0, 1, 2, 3]);
        assert_eq!(results[1].as_ref().unwrap(), &[4, 5, 6, 7]);
        assert_panicked(&results[2], 2, "sample 9 panicked when dropped");
    }
}

#[test]
fn a_stream_sample_whose_drop_panics_on_the_error_path_fails_its_batch() {
    for workers in [2, 3, 1] {
        let results = within(move || {
            // Batch 1 reads positions 4..8: 5 panics when dropped, 6 is an error.
            let source = IterSource::new(|_| {
                (0..64u32).map(|i| match i {
                    6 => Err(Error::Shape("a bad line".into())),
                    _ => Ok(Bomb {
                        value: i,
                        armed: i == 5,
                    }),
                })
            });
            let loader = Loader::builder(source)
                .batch_size(4)
                .workers(workers)
                .prefetch(1)
                .pool(pool())
                .build_with(|s, c: &mut Collator| stack(s, c, |_| false))
                .unwrap();
            drain(loader.iter())
        });
        assert_eq!(results.len(), 2, "{workers} workers: {results:?}");
        assert_eq!(results[0].as_ref().unwrap(), &[0, 1, 2, 3]);
        assert_panicked(&results[1], 1, "sample 5 panicked when dropped");
    }
}

#[test]
fn a_stream_that_panics_in_next_fails_the_batch_being_read() {
    let results = within(|| {
        let source = IterSource::new(|_| {
            (0..12u32).map(|i| {
                assert!(i != 9, "the stream broke at 9");
                Ok(Bomb {
                    value: i,
                    armed: false,
                })
            })
        });
        let loader = Loader::builder(source)
            .batch_size(4)
            .workers(2)
            .pool(pool())
            .build_with(|s, c: &mut Collator| stack(s, c, |_| false))
            .unwrap();
        drain(loader.iter())
    });
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(results[1].as_ref().unwrap(), &[4, 5, 6, 7]);
    match &results[2] {
        Err(Error::Panicked { what, message }) => {
            assert!(what.contains("stream"), "{what}");
            assert_eq!(message, "the stream broke at 9");
        }
        other => panic!("expected a panic error, got {other:?}"),
    }
}

#[test]
fn many_panicking_drops_at_once_neither_abort_nor_hang() {
    // Every sample loaded before the failed get panics when dropped (one `Vec` of them: a
    // panic in each), and every batch after the failed one panics when dropped on the
    // loader's threads (undelivered, once the epoch has ended).
    let results = within(|| {
        let data = FnDataset::new(24, |i| match i {
            7 => Err(Error::Shape("an unreadable record".into())),
            _ => Ok(Bomb {
                value: i as u32,
                armed: (4..7).contains(&i),
            }),
        });
        let loader = Loader::builder(data)
            .batch_size(4)
            .workers(3)
            .prefetch(2)
            .pool(pool())
            .build_with(|s, c: &mut Collator| stack(s, c, |v| v[0] >= 8))
            .unwrap();
        drain(loader.iter())
    });
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0].as_ref().unwrap(), &[0, 1, 2, 3]);
    assert_panicked(&results[1], 1, "sample 4 panicked when dropped");
}

#[test]
fn dropping_an_epoch_whose_batches_panic_when_dropped_joins_its_threads() {
    let pool = pool();
    let p = pool.clone();
    let outcome = within(move || {
        let data = FnDataset::new(64, |i| {
            Ok(Bomb {
                value: i as u32,
                armed: false,
            })
        });
        let loader = Loader::builder(data)
            .batch_size(4)
            .workers(2)
            .prefetch(2)
            .pool(p)
            .build_with(|s, c: &mut Collator| stack(s, c, |v| v[0] >= 4))
            .unwrap();
        let mut epoch = loader.iter();
        let first = epoch
            .next()
            .unwrap()
            .map(|b| b.values.to_vec::<u32>().unwrap());
        std::thread::sleep(Duration::from_millis(20)); // let the workers fill the pipeline
        // The batches in flight panic when the epoch drops them, undelivered: each panic is
        // caught where it happens, and every loader thread is joined before `drop` returns.
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(epoch)));
        (first, dropped.is_ok())
    });
    assert_eq!(outcome.0.unwrap(), &[0, 1, 2, 3]);
    assert!(outcome.1, "a batch's panic escaped the epoch's drop");
    assert_eq!(pool.stats().in_use_bytes, 0, "every block returned");
}
