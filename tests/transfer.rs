//! Moving batches to a CUDA device and back, and from device to device through every GPU of
//! the machine: bit-exact round trips and the hazards of asynchronous copies. Every test skips
//! (printing `skipped: …`) without a GPU, and fails instead under `PINNABLE_REQUIRE_GPU=1`; on
//! a one-GPU machine the device-to-device test passes through that GPU twice (printing
//! `partly skipped: …`).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pinnable::{DType, Device, Error, Pinnable, Placement, Tensor, ToDevice};
use pinnable_harness::{
    bytes_of, cuda_or_skip, cuda_targets_or_skip, hold_stream, random_batch, random_tensor, rng,
};
use rand::Rng;
use rand::seq::SliceRandom;

/// The tests share one copy stream per device, and several hold it on purpose to race a copy;
/// a test running beside them (or a driver call that waits for the whole device) would skew
/// their timing, so they run one at a time even under a parallel test harness.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn copy_stream(d: &Device) -> &std::sync::Arc<cudarc::driver::CudaStream> {
    d.copy_stream().expect("a CUDA device has a copy stream")
}

#[test]
fn every_dtype_round_trips_bit_exactly() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("every_dtype_round_trips_bit_exactly") else {
        return;
    };
    let mut r = rng("every_dtype_round_trips_bit_exactly");
    for dtype in DType::ALL {
        for non_blocking in [false, true] {
            let shape = [r.random_range(1..64), r.random_range(1..64)];
            let t = random_tensor(&mut r, dtype, &shape);
            let on = t.to_device(&dev, non_blocking).unwrap();
            assert_eq!(on.placement(), Placement::Cuda(0));
            let back = on.to_cpu(non_blocking).unwrap();
            assert!(back.is_pinned());
            assert_eq!(
                bytes_of(&back),
                bytes_of(&t),
                "{dtype} non_blocking={non_blocking}"
            );
        }
    }
}

type Nested = (
    Vec<Tensor>,
    HashMap<String, Vec<Tensor>>,
    Option<Vec<Tensor>>,
    i32,
);

#[test]
fn random_nested_batches_round_trip_bit_exactly() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("random_nested_batches_round_trip_bit_exactly") else {
        return;
    };
    let mut r = rng("random_nested_batches_round_trip_bit_exactly");
    for i in 0..200 {
        let batch = (
            random_batch(&mut r, 6),
            HashMap::from([(format!("k{i}"), random_batch(&mut r, 3))]),
            Some(random_batch(&mut r, 2)),
            i,
        );
        let there = batch.to_device(&dev, r.random_bool(0.5)).unwrap();
        let back = there.to_cpu(r.random_bool(0.5)).unwrap();
        let flat = |b: &Nested| {
            let mut v: Vec<Tensor> = b.0.clone();
            v.extend(b.1.values().flatten().cloned());
            v.extend(b.2.iter().flatten().cloned());
            v
        };
        let (batch_flat, back_flat) = (flat(&batch), flat(&back));
        assert_eq!(back_flat.len(), batch_flat.len());
        for (src, got) in batch_flat.iter().zip(back_flat) {
            assert_eq!(got.shape(), src.shape());
            assert_eq!(bytes_of(&got), bytes_of(src), "batch {i}");
        }
        assert_eq!(back.3, i);
    }
}

#[test]
fn dropped_pinned_source_is_not_reused_while_its_copy_is_in_flight() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("dropped_pinned_source_is_not_reused_while_its_copy_is_in_flight")
    else {
        return;
    };
    let mut r = rng("dropped_pinned_source_is_not_reused_while_its_copy_is_in_flight");
    let n = 1 << 20;
    // Warm the pool's cache with blocks of this size, so that the scribbles below are cache
    // hits (a driver allocation would wait for the held stream and hide the race).
    let warm: Vec<Tensor> = (0..4)
        .map(|_| {
            Tensor::from_vec(vec![0f32; n], &[n])
                .unwrap()
                .pin_memory()
                .unwrap()
        })
        .collect();
    drop(warm);
    let src = random_tensor(&mut r, DType::F32, &[n])
        .pin_memory()
        .unwrap();
    let expected = bytes_of(&src);
    hold_stream(copy_stream(&dev), 300);
    let on = src.to_device(&dev, true).unwrap();
    drop(src);
    assert!(!on.is_ready(), "the copy should still be held back");
    // If the block went back to the pool now, these would take it and overwrite it.
    let mut scribbles = Vec::new();
    for _ in 0..5 {
        let mut t = Tensor::from_vec(vec![0f32; n], &[n])
            .unwrap()
            .pin_memory()
            .unwrap();
        t.as_mut_slice::<f32>().unwrap().fill(-1.0);
        scribbles.push(t);
    }
    let back = on.to_cpu(false).unwrap();
    assert_eq!(bytes_of(&back), expected);
    drop(scribbles);
}

#[test]
fn writing_a_pinned_source_waits_for_the_copy_reading_it() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("writing_a_pinned_source_waits_for_the_copy_reading_it") else {
        return;
    };
    let mut r = rng("writing_a_pinned_source_waits_for_the_copy_reading_it");
    let mut src = random_tensor(&mut r, DType::I64, &[1 << 18])
        .pin_memory()
        .unwrap();
    let old = bytes_of(&src);
    // Timed from before the hold: the copy cannot finish sooner than 300 ms after this, however
    // slowly the call below runs.
    let started = Instant::now();
    hold_stream(copy_stream(&dev), 300);
    let on = src.to_device(&dev, true).unwrap();
    src.as_mut_slice::<i64>().unwrap().fill(7);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300),
        "the write did not wait ({waited:?})"
    );
    assert_eq!(
        bytes_of(&on.to_cpu(false).unwrap()),
        old,
        "the device got a mix"
    );
    assert!(src.to_vec::<i64>().unwrap().iter().all(|&v| v == 7));
}

#[test]
fn host_reads_after_non_blocking_to_cpu_see_the_whole_copy() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("host_reads_after_non_blocking_to_cpu_see_the_whole_copy") else {
        return;
    };
    let mut r = rng("host_reads_after_non_blocking_to_cpu_see_the_whole_copy");
    for _ in 0..5 {
        let t = random_tensor(&mut r, DType::BF16, &[512, 1024]);
        let on = t.to_device(&dev, false).unwrap();
        hold_stream(copy_stream(&dev), 100);
        let back = on.to_cpu(true).unwrap();
        assert_eq!(bytes_of(&back), bytes_of(&t));
    }
}

#[test]
fn consumer_on_another_stream_waits_for_the_ready_event() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("consumer_on_another_stream_waits_for_the_ready_event") else {
        return;
    };
    let mut r = rng("consumer_on_another_stream_waits_for_the_ready_event");
    let ctx = dev.cuda_context().unwrap().clone();
    let user = ctx.new_stream().unwrap();
    for _ in 0..3 {
        let t = random_tensor(&mut r, DType::F32, &[1 << 20])
            .pin_memory()
            .unwrap();
        hold_stream(copy_stream(&dev), 200);
        let on = t.to_device(&dev, true).unwrap();
        let mut host = vec![0f32; 1 << 20];
        {
            let view = on.cuda_view::<f32>(&user).unwrap();
            view.copy_to_host(&mut host).unwrap();
        }
        user.synchronize().unwrap();
        assert_eq!(host, t.to_vec::<f32>().unwrap());
    }
}

#[test]
fn out_of_memory_fails_cleanly_and_the_next_batch_works() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("out_of_memory_fails_cleanly_and_the_next_batch_works") else {
        return;
    };
    let mut r = rng("out_of_memory_fails_cleanly_and_the_next_batch_works");
    // Take all but 768 MiB of the device, then move a 1 GiB pinned batch (four 256 MiB
    // tensors in one block).
    dev.empty_cache().unwrap();
    let stream = copy_stream(&dev);
    let hog_bytes = dev.free_memory().unwrap().saturating_sub(768 << 20);
    // SAFETY: the allocation is never read; it only takes device memory.
    let hog = unsafe { stream.alloc::<u8>(hog_bytes) }.unwrap();
    let chunk = 256usize << 20;
    let batch: Vec<Tensor> = (0..4)
        .map(|i| Tensor::from_vec(vec![i as u8; chunk], &[chunk]).unwrap())
        .collect::<Vec<_>>()
        .pin_memory()
        .unwrap();
    let err = batch.to_device(&dev, true).unwrap_err();
    match &err {
        Error::DeviceOutOfMemory {
            requested, free, ..
        } => {
            assert_eq!(*requested, 4 * chunk, "the whole batch, in one reservation");
            assert!(*free < *requested);
        }
        other => panic!("expected DeviceOutOfMemory, got {other}"),
    }
    assert!(
        batch
            .iter()
            .enumerate()
            .all(|(i, t)| t.to_vec::<u8>().unwrap()[chunk - 1] == i as u8)
    );
    drop(hog);
    println!("{err}");
    dev.synchronize().unwrap();
    drop(batch);
    let small = random_tensor(&mut r, DType::F16, &[1000, 33]);
    let back = small.to_device(&dev, true).unwrap().to_cpu(false).unwrap();
    assert_eq!(bytes_of(&back), bytes_of(&small));
}

#[test]
fn eight_threads_move_batches_to_one_device() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("eight_threads_move_batches_to_one_device") else {
        return;
    };
    let seed: u64 = rng("eight_threads_move_batches_to_one_device").random();
    std::thread::scope(|s| {
        for k in 0..8u64 {
            let dev = dev.clone();
            s.spawn(move || {
                use rand::SeedableRng;
                let mut r = rand::rngs::SmallRng::seed_from_u64(seed ^ k);
                for _ in 0..25 {
                    let batch = random_batch(&mut r, 8);
                    let back = batch.to_device(&dev, true).unwrap().to_cpu(true).unwrap();
                    assert_eq!(back.len(), batch.len());
                    for (a, b) in batch.iter().zip(&back) {
                        assert_eq!(bytes_of(b), bytes_of(a));
                    }
                }
            });
        }
    });
}

#[test]
fn same_device_shares_and_host_to_host_shares() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("same_device_shares_and_host_to_host_shares") else {
        return;
    };
    let mut r = rng("same_device_shares_and_host_to_host_shares");
    let t = random_tensor(&mut r, DType::U32, &[100]);
    let on = t.to_device(&dev, false).unwrap();
    assert!(on.to_device(&dev, true).unwrap().shares_storage_with(&on));
    assert!(t.to_cpu(true).unwrap().shares_storage_with(&t));
}

#[test]
fn pageable_and_pinned_batches_report_their_pinning_backend() {
    let _serial = serial();
    let Some(_dev) = cuda_or_skip("pageable_and_pinned_batches_report_their_pinning_backend")
    else {
        return;
    };
    let t = Tensor::from_vec(vec![1.0f64; 4096], &[4096])
        .unwrap()
        .pin_memory()
        .unwrap();
    let backend = t.pinned_block().unwrap().backend();
    println!("pinned through {backend}");
    assert_ne!(
        backend,
        pinnable::BackendKind::Mlock,
        "CUDA present: pinning must register with it"
    );
}

/// A hand-written impl that moves one more tensor on every call: the measuring walk and the
/// building walk disagree, and the extra tensor must still move correctly (outside the arena).
struct Growing {
    calls: std::cell::Cell<usize>,
    parts: Vec<Tensor>,
}

impl ToDevice for Growing {
    fn to_device_with(&self, cx: &mut pinnable::MoveContext<'_>) -> pinnable::Result<Self> {
        let n = self.calls.get().min(self.parts.len() - 1) + 1;
        self.calls.set(self.calls.get() + 1);
        let parts = self.parts[..n]
            .iter()
            .map(|t| cx.move_tensor(t))
            .collect::<pinnable::Result<_>>()?;
        Ok(Growing {
            calls: Default::default(),
            parts,
        })
    }
}

#[test]
fn a_walk_that_moves_more_than_it_measured_still_moves_right() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("a_walk_that_moves_more_than_it_measured_still_moves_right")
    else {
        return;
    };
    let mut r = rng("a_walk_that_moves_more_than_it_measured_still_moves_right");
    let parts = vec![
        random_tensor(&mut r, DType::F32, &[3000]),
        random_tensor(&mut r, DType::U8, &[70000])
            .pin_memory()
            .unwrap(),
        random_tensor(&mut r, DType::I64, &[500]),
    ];
    let g = Growing {
        calls: Default::default(),
        parts,
    };
    let on = g.to_device(&dev, true).unwrap();
    assert_eq!(on.parts.len(), 2);
    for (a, b) in g.parts.iter().zip(&on.parts) {
        assert_eq!(bytes_of(&b.to_cpu(false).unwrap()), bytes_of(a));
    }
}

#[test]
fn batches_move_from_device_to_device_through_every_gpu() {
    let _serial = serial();
    let test = "batches_move_from_device_to_device_through_every_gpu";
    let Some(devices) = cuda_targets_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    for i in 0..20 {
        let batch = random_batch(&mut r, 6);
        // Through every device in a new order, each hop's source dropped as soon as it is
        // enqueued; the last hop's values hold only if every hop's did.
        let mut path = devices.clone();
        path.shuffle(&mut r);
        let mut on = batch.to_device(&path[0], r.random_bool(0.5)).unwrap();
        for d in &path[1..] {
            on = on.to_device(d, r.random_bool(0.5)).unwrap();
            let ordinal = d.ordinal().expect("a CUDA device");
            for t in &on {
                assert_eq!(t.placement(), Placement::Cuda(ordinal), "batch {i}");
            }
        }
        let back = on.to_cpu(r.random_bool(0.5)).unwrap();
        assert_eq!(back.len(), batch.len());
        let through: Vec<String> = path.iter().map(ToString::to_string).collect();
        for (a, b) in batch.iter().zip(&back) {
            assert_eq!(bytes_of(b), bytes_of(a), "batch {i}, through {through:?}");
        }
    }
}

/// The tensors of a random batch, pinned into one block: the first holds bytes (a batch of
/// zero-size tensors alone needs no block to share), the others may be empty.
fn pinned_batch(r: &mut impl Rng, n: usize) -> Vec<Tensor> {
    (0..n)
        .map(|k| {
            let dtype = DType::ALL[r.random_range(0..DType::ALL.len())];
            let shape = [
                r.random_range(1..40),
                r.random_range(usize::from(k == 0)..40),
            ];
            random_tensor(r, dtype, &shape)
        })
        .collect::<Vec<_>>()
        .pin_memory()
        .unwrap()
}

#[test]
fn a_pinned_batch_moves_as_one_block_each_way() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("a_pinned_batch_moves_as_one_block_each_way") else {
        return;
    };
    let mut r = rng("a_pinned_batch_moves_as_one_block_each_way");
    for i in 0..100 {
        let n = r.random_range(1..30);
        let mut batch = pinned_batch(&mut r, n);
        assert!(batch.iter().all(|t| t.shares_block_with(&batch[0])));
        if i % 2 == 1 {
            // The walk order differs from the block's order: still one mirror of the block.
            batch.reverse();
        }
        let on = batch.to_device(&dev, r.random_bool(0.5)).unwrap();
        assert!(
            on.iter().all(|t| t.shares_block_with(&on[0])),
            "one device block"
        );
        let back = on.to_cpu(r.random_bool(0.5)).unwrap();
        assert!(
            back.iter()
                .all(|t| t.is_pinned() && t.shares_block_with(&back[0]))
        );
        assert_eq!(back.len(), batch.len());
        for (src, got) in batch.iter().zip(&back) {
            assert_eq!(got.shape(), src.shape());
            assert_eq!(bytes_of(got), bytes_of(src));
        }
    }
}

#[test]
fn moving_part_of_a_pinned_block_moves_just_those_tensors() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("moving_part_of_a_pinned_block_moves_just_those_tensors") else {
        return;
    };
    let mut r = rng("moving_part_of_a_pinned_block_moves_just_those_tensors");
    for _ in 0..50 {
        let batch = pinned_batch(&mut r, 12);
        let step = r.random_range(2..5);
        let some: Vec<Tensor> = batch.iter().step_by(step).cloned().collect();
        let back = some.to_device(&dev, true).unwrap().to_cpu(false).unwrap();
        assert_eq!(back.len(), some.len());
        for (src, got) in some.iter().zip(&back) {
            assert_eq!(bytes_of(got), bytes_of(src));
        }
    }
}

#[test]
fn clones_moved_in_one_batch_stay_one_storage() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("clones_moved_in_one_batch_stay_one_storage") else {
        return;
    };
    let mut r = rng("clones_moved_in_one_batch_stay_one_storage");
    let t = random_tensor(&mut r, DType::I32, &[64, 33])
        .pin_memory()
        .unwrap();
    let batch = vec![t.clone(), t.transpose(0, 1).unwrap(), t.clone()];
    let back = batch.to_device(&dev, true).unwrap().to_cpu(true).unwrap();
    assert!(back[0].shares_storage_with(&back[2]));
    let mut first = back[0].clone();
    drop(back[0].clone());
    first.as_mut_slice::<i32>().unwrap().fill(-5);
    assert_eq!(
        bytes_of(&back[2]),
        bytes_of(&t),
        "a write reached another tensor"
    );
    assert_eq!(bytes_of(&back[1]), bytes_of(&batch[1]));
}

#[test]
fn an_in_place_write_to_a_shared_block_waits_for_its_copy() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("an_in_place_write_to_a_shared_block_waits_for_its_copy") else {
        return;
    };
    let mut r = rng("an_in_place_write_to_a_shared_block_waits_for_its_copy");
    let mut pinned = vec![
        random_tensor(&mut r, DType::F32, &[1000]),
        random_tensor(&mut r, DType::I64, &[1 << 20]),
        random_tensor(&mut r, DType::U8, &[77]),
    ]
    .pin_memory()
    .unwrap();
    let old: Vec<Vec<u8>> = pinned.iter().map(bytes_of).collect();
    // Timed from before the hold, as in `writing_a_pinned_source_waits_for_the_copy_reading_it`.
    let start = Instant::now();
    hold_stream(copy_stream(&dev), 300);
    let on = pinned.to_device(&dev, true).unwrap();
    // In place (no clone shares it), so it must wait for the copy reading the block.
    pinned[1].as_mut_slice::<i64>().unwrap().fill(7);
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "the write did not wait for the copy"
    );
    assert!(pinned[1].shares_block_with(&pinned[0]), "written in place");
    let back = on.to_cpu(false).unwrap();
    assert_eq!(back.len(), old.len());
    for (o, b) in old.iter().zip(&back) {
        assert_eq!(o, &bytes_of(b), "the device got a mix");
    }
}

#[test]
fn batches_of_only_zero_size_tensors_move() {
    let _serial = serial();
    let Some(dev) = cuda_or_skip("batches_of_only_zero_size_tensors_move") else {
        return;
    };
    let pageable = vec![Tensor::from_vec(Vec::<f32>::new(), &[0, 3]).unwrap()];
    let pinned = pageable.pin_memory().unwrap();
    for batch in [pageable, pinned] {
        let on = batch.to_device(&dev, true).unwrap();
        assert_eq!(on[0].placement(), Placement::Cuda(0));
        let back = on.to_cpu(true).unwrap();
        assert_eq!(back[0].shape(), &[0, 3]);
    }
}
