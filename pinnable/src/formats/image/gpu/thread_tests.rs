//! Tests of what the decoding threads share: their states kept across threads, their turns in
//! the engines, and a batch's files read into one block.

use super::tests::seed;
use crate::loader::SplitMix64;

#[test]
fn a_thread_s_decoding_state_outlives_it_until_the_cache_is_emptied() {
    use super::worker::{parked_for, with_worker};
    let test = "a_thread_s_decoding_state_outlives_it_until_the_cache_is_emptied";
    let Some(device) = crate::cuda::cuda_or_skip(test) else {
        return;
    };
    let dev = device.cuda_device(test).unwrap().clone();
    let stream = |w: &mut super::worker::Worker| Ok(w.stream.cu_stream() as usize);
    // A thread's state, once the thread ended, is the next thread's.
    let on_a_thread = || {
        std::thread::scope(|s| s.spawn(|| with_worker(&dev, stream)).join())
            .unwrap()
            .unwrap()
    };
    let first = on_a_thread();
    assert!(parked_for(dev.ordinal) >= 1, "parked when its thread ended");
    let second = on_a_thread();
    assert_eq!(first, second, "the next thread took the parked state");
    // Two threads at once never share one.
    let both = std::sync::Barrier::new(2);
    let (a, b) = std::thread::scope(|s| {
        let hold = || {
            with_worker(&dev, |w| {
                both.wait();
                stream(w)
            })
            .unwrap()
        };
        let a = s.spawn(hold);
        let b = s.spawn(hold);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_ne!(a, b, "two threads at once, two states");
    assert!(parked_for(dev.ordinal) >= 2);
    device.empty_cache().unwrap();
    assert_eq!(
        parked_for(dev.ordinal),
        0,
        "empty_cache frees the parked states"
    );
}

#[test]
fn at_most_the_asked_threads_and_never_over_two_are_in_a_device_s_engines() {
    use super::backend::engine_turn;
    use std::sync::atomic::{AtomicUsize, Ordering};
    // A device ordinal no other test decodes on.
    let ordinal = 7;
    for (asked, allowed) in [(1, 1), (2, 2), (5, 2), (0, 1)] {
        let (inside, most, done) = (
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| {
                    for _ in 0..20 {
                        let _turn = engine_turn(ordinal, asked);
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_micros(200));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(done.load(Ordering::SeqCst), 120, "every turn was had");
        assert_eq!(most.load(Ordering::SeqCst), allowed, "{asked} asked");
    }
    // Another device's engines are not this one's: a turn there is free at once.
    let _a = engine_turn(ordinal, 1);
    let _other = engine_turn(ordinal + 1, 1);
}

#[test]
fn engine_turns_are_had_in_the_order_they_were_asked_for() {
    use super::backend::{engine_turn, turns_asked};
    use std::sync::Mutex;
    // A device ordinal no other test decodes on.
    let ordinal = 9;
    let order = Mutex::new(Vec::new());
    let held = engine_turn(ordinal, 1);
    let base = turns_asked(ordinal);
    let n = 5 + (seed("engine turns") % 4) as usize;
    std::thread::scope(|s| {
        // Waiters arrive one after another while the turn is held (each seen waiting first).
        for k in 0..n {
            let order = &order;
            s.spawn(move || {
                let _turn = engine_turn(ordinal, 1);
                order.lock().unwrap().push(k);
            });
            while turns_asked(ordinal) < base + k as u64 + 1 {
                std::thread::yield_now();
            }
        }
        drop(held);
    });
    assert_eq!(*order.lock().unwrap(), (0..n).collect::<Vec<_>>());
}

#[test]
fn a_batch_s_files_are_read_whole_into_one_block_past_the_files_held_open() {
    use crate::alloc::PinnedPool;
    use crate::loader::{Collator, Dataset};
    let seed = seed("read_files");
    let mut rng = SplitMix64::new(seed);
    let root = std::env::temp_dir().join(format!("pinnable-read-files-{seed}"));
    std::fs::create_dir_all(&root).unwrap();
    // More files than a batch holds open at once, of random sizes (some empty).
    let n = 300 + (rng.next_u64() % 40) as usize;
    let mut want = Vec::with_capacity(n);
    let mut list = Vec::with_capacity(n);
    for i in 0..n {
        let len = (rng.next_u64() % 3000) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let path = root.join(format!("{i}.jpg"));
        std::fs::write(&path, &bytes).unwrap();
        want.push(bytes);
        list.push((path, i as i64));
    }
    let folder = crate::formats::image::ImageFolder::from_list(list.clone());
    let samples: Vec<_> = (0..n).map(|i| folder.get(i).unwrap()).collect();
    let c = Collator::new(PinnedPool::global());
    let (block, ranges) = super::inputs::read_files(&samples, &c).unwrap();
    assert_eq!(ranges.len(), n);
    // SAFETY: the block is ours and holds the ranges read into it.
    let got = unsafe { std::slice::from_raw_parts(block.as_ptr(), block.len()) };
    for (i, &(at, len)) in ranges.iter().enumerate() {
        assert_eq!(&got[at..at + len], &want[i][..], "file {i} (seed {seed})");
    }
    // A file missing past the ones held open: the error names it, whichever way it was read.
    for gone in [3, n - 2] {
        std::fs::remove_file(&list[gone].0).unwrap();
        let e = super::inputs::read_files(&samples, &c)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("{gone}.jpg")), "{e}");
        std::fs::write(&list[gone].0, &want[gone]).unwrap();
    }
    std::fs::remove_dir_all(&root).unwrap();
}
