//! Gathers of any piece size, windows and conversions: on the host against a plain reference
//! written here, and on a CUDA device (skipping, with `skipped: …` on its own line, without one)
//! by every route, with the source overwritten right after each non-blocking call, read by a
//! kernel of the test's own on a stream of its own.

use pinnable::{Convert, DType, Gather, GatherRoute, Placement, Tensor, ToDevice};
use pinnable_harness::kernels::Kernels;
use pinnable_harness::{bytes_of, cuda_or_skip, random_tensor, rng};
use rand::Rng;
use rand::rngs::SmallRng;

/// One random gather and the bytes it must stack.
struct Case {
    source: Tensor,
    gather: Gather,
    want: Vec<u8>,
    what: String,
}

/// A row size in bytes, log-uniform from 1 B to `max`.
fn log_uniform(r: &mut SmallRng, max: usize) -> usize {
    let bits = r.random_range(0.0..(max as f64).log2());
    (2f64.powf(bits) as usize).clamp(1, max)
}

/// The elements of `t` (a host tensor of an integer dtype up to 32 bits) as i64.
fn ints(t: &Tensor) -> Vec<i64> {
    match t.dtype() {
        DType::U8 => t
            .to_vec::<u8>()
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect(),
        DType::U16 => t
            .to_vec::<u16>()
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect(),
        DType::U32 => t
            .to_vec::<u32>()
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect(),
        other => unreachable!("no integer source of {other}"),
    }
}

/// `values` cast to `to` as Rust's `as` does, as bytes.
fn cast_bytes(values: &[i64], to: DType) -> Vec<u8> {
    match to {
        DType::I32 => values
            .iter()
            .flat_map(|&v| (v as i32).to_ne_bytes())
            .collect(),
        DType::I64 => values.iter().flat_map(|&v| v.to_ne_bytes()).collect(),
        other => unreachable!("no cast to {other}"),
    }
}

/// u8 `values` of a `[n, C, inner]` tensor mapped per channel, as bytes of `to`.
fn affine_bytes(
    values: &[i64],
    c: usize,
    inner: usize,
    scale: &[f32],
    offset: &[f32],
    to: DType,
) -> Vec<u8> {
    values
        .iter()
        .enumerate()
        .flat_map(|(i, &x)| {
            let ch = i / inner % c;
            let y = (x as f32).mul_add(scale[ch], offset[ch]);
            match to {
                DType::F32 => y.to_ne_bytes().to_vec(),
                DType::F16 => half::f16::from_f32(y).to_ne_bytes().to_vec(),
                DType::BF16 => half::bf16::from_f32(y).to_ne_bytes().to_vec(),
                other => unreachable!("no affine map to {other}"),
            }
        })
        .collect()
}

/// TensorRows of a source with rows of 1 B to `max_row` bytes (odd sizes, any dtype), at most
/// `budget` bytes of source.
fn rows_case(r: &mut SmallRng, max_row: usize, budget: usize, pinned: bool) -> Case {
    let row = log_uniform(r, max_row);
    let dtype = [DType::U8, DType::U16, DType::F32, DType::I64][r.random_range(0..4)];
    let elems = row.div_ceil(dtype.size());
    let n = r.random_range(1..=(budget / (elems * dtype.size())).clamp(1, 200));
    let source = maybe_pin(random_tensor(r, dtype, &[n, elems]), pinned);
    let count = r.random_range(0..=n.min(64));
    let rows: Vec<usize> = (0..count).map(|_| r.random_range(0..n)).collect();
    let want = rows
        .iter()
        .flat_map(|&i| bytes_of(&source.narrow(0, i, 1).unwrap()))
        .collect();
    Case {
        gather: Gather::rows(&source, rows.iter().copied()).unwrap(),
        want,
        what: format!("{count} rows of {elems} {dtype} of {n}"),
        source,
    }
}

/// Token windows at arbitrary starts of a 1-D u16 or u32 array, widened or not.
fn windows_case(r: &mut SmallRng, pinned: bool) -> Case {
    let dtype = if r.random_bool(0.7) {
        DType::U16
    } else {
        DType::U32
    };
    let n = r.random_range(1..200_000);
    let source = maybe_pin(random_tensor(r, dtype, &[n]), pinned);
    let len = r.random_range(0..=n.min(5000));
    let count = r.random_range(0..64);
    let starts: Vec<usize> = (0..count).map(|_| r.random_range(0..=n - len)).collect();
    let values = ints(&source);
    let picked: Vec<i64> = starts
        .iter()
        .flat_map(|&s| values[s..s + len].to_vec())
        .collect();
    let gather = Gather::windows(&source, starts.iter().copied(), len).unwrap();
    let (gather, want, conv) = match r.random_range(0..3) {
        0 => {
            let want = starts
                .iter()
                .flat_map(|&s| bytes_of(&source.narrow(0, s, len).unwrap()))
                .collect();
            (gather, want, "as they are".to_string())
        }
        k => {
            let to = if k == 1 { DType::I64 } else { DType::I32 };
            let g = gather.convert(Convert::cast(to)).unwrap();
            (g, cast_bytes(&picked, to), format!("cast to {to}"))
        }
    };
    assert_eq!(gather.shape(), vec![count, len]);
    Case {
        gather,
        want,
        what: format!("{count} windows of {len} {dtype} of {n}, {conv}"),
        source,
    }
}

/// TensorRows of u8 images `[n, C, H, W]` mapped per channel to f32, f16 or bf16.
fn images_case(r: &mut SmallRng, pinned: bool) -> Case {
    let c = r.random_range(1..5);
    let (h, w) = (r.random_range(1..40), r.random_range(1..40));
    let n = r.random_range(1..40);
    let source = maybe_pin(random_tensor(r, DType::U8, &[n, c, h, w]), pinned);
    let rows: Vec<usize> = (0..r.random_range(0..=n))
        .map(|_| r.random_range(0..n))
        .collect();
    let to = [DType::F32, DType::F16, DType::BF16][r.random_range(0..3)];
    let scale: Vec<f32> = (0..c).map(|_| r.random_range(-0.1..0.1)).collect();
    let offset: Vec<f32> = (0..c).map(|_| r.random_range(-3.0..3.0)).collect();
    let values: Vec<i64> = rows
        .iter()
        .flat_map(|&i| ints(&source.narrow(0, i, 1).unwrap()))
        .collect();
    let want = affine_bytes(&values, c, h * w, &scale, &offset, to);
    let conv = Convert::affine(to, &scale, &offset, 1).unwrap();
    Case {
        gather: Gather::rows(&source, rows.iter().copied())
            .unwrap()
            .convert(conv)
            .unwrap(),
        want,
        what: format!("{} images [{c}, {h}, {w}] of {n} to {to}", rows.len()),
        source,
    }
}

fn random_case(r: &mut SmallRng, max_row: usize, pinned: bool) -> Case {
    match r.random_range(0..4) {
        0 | 1 => rows_case(r, max_row, 16 << 20, pinned),
        2 => windows_case(r, pinned),
        _ => images_case(r, pinned),
    }
}

/// `t`, or a pinned copy of it that no other tensor shares.
fn maybe_pin(t: Tensor, pinned: bool) -> Tensor {
    if pinned { pin_alone(&t) } else { t }
}

#[test]
fn host_gathers_of_rows_windows_and_conversions_equal_a_plain_reference() {
    let mut r = rng("host_gathers_of_rows_windows_and_conversions_equal_a_plain_reference");
    for i in 0..300 {
        let pinned = r.random_bool(0.5);
        let mut case = random_case(&mut r, 64 << 10, pinned);
        if r.random_bool(0.5) {
            case.gather = Gather::from(case.gather.clone().tensor().unwrap())
                .to_cpu(false)
                .unwrap();
        }
        let t = case.gather.tensor().unwrap();
        assert!(t.is_pinned() && t.is_contiguous());
        assert_eq!(t.shape(), &case.gather.shape()[..]);
        assert_eq!(t.dtype(), case.gather.dtype());
        assert_eq!(bytes_of(&t), case.want, "case {i}: {}", case.what);
    }
}

#[test]
fn normalize_is_torchvisions_formula_within_an_ulp() {
    let mean = [0.485f32, 0.456, 0.406];
    let std = [0.229f32, 0.224, 0.225];
    let pixels: Vec<u8> = (0..=255).flat_map(|v| [v, v, v]).collect();
    // [1, 3, 256]: channel planes of 256 values each.
    let mut planar = vec![0u8; 768];
    for (i, p) in pixels.chunks(3).enumerate() {
        for c in 0..3 {
            planar[c * 256 + i] = p[c];
        }
    }
    let t = Tensor::from_vec(planar.clone(), &[1, 3, 256]).unwrap();
    let g = Gather::rows(&t, [0])
        .unwrap()
        .convert(Convert::normalize(DType::F32, &mean, &std).unwrap())
        .unwrap();
    let got = g.tensor().unwrap().to_vec::<f32>().unwrap();
    for (i, (&x, &y)) in planar.iter().zip(&got).enumerate() {
        let c = i / 256;
        let want = (f32::from(x) / 255.0 - mean[c]) / std[c];
        assert!(
            (y - want).abs() <= 2.0 * f32::EPSILON * want.abs().max(1.0),
            "{x} in channel {c}: {y} against {want}"
        );
    }
}

#[test]
fn windows_and_conversions_refuse_what_they_cannot_do() {
    let t = Tensor::from_vec(vec![1u16; 12], &[4, 3]).unwrap();
    let e = Gather::windows(&t, [0], 2).unwrap_err().to_string();
    assert!(e.contains("1-D") && e.contains("[12]"), "{e}");
    let flat = t.reshape(&[12]).unwrap();
    let e = Gather::windows(&flat, [0, 9], 4).unwrap_err().to_string();
    assert!(e.contains("from 9") && e.contains("12"), "{e}");
    let e = Gather::windows(&flat, [usize::MAX], 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("runs past the end"), "{e}");
    let g = Gather::windows(&flat, [1], 4).unwrap();
    let e = g
        .clone()
        .convert(Convert::cast(DType::F32))
        .unwrap_err()
        .to_string();
    assert!(e.contains("u16") && e.contains("i32 or i64"), "{e}");
    let norm = Convert::normalize(DType::F32, &[0.5; 3], &[0.5; 3]).unwrap();
    let e = g.convert(norm).unwrap_err().to_string();
    assert!(e.contains("u16"), "{e}");
    let stacked = Gather::from(flat.clone());
    assert!(stacked.convert(Convert::cast(DType::I64)).is_err());
}

#[test]
fn gathers_of_any_piece_size_reach_the_device_by_every_route() {
    let test = "gathers_of_any_piece_size_reach_the_device_by_every_route";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    println!("gather kernels: {:?}", dev.gather_kernels());
    let mut r = rng(test);
    let routes = [
        GatherRoute::Auto,
        GatherRoute::Kernel,
        GatherRoute::Direct,
        GatherRoute::Host,
    ];
    for i in 0..500 {
        let pinned = r.random_bool(0.7);
        let Case {
            mut source,
            gather,
            want,
            what,
        } = random_case(&mut r, 4 << 20, pinned);
        let gather = gather.route(routes[i % routes.len()]);
        let moved = gather.to_device(&dev, r.random_bool(0.8)).unwrap();
        drop(gather);
        // The source is this test's alone again: overwritten in place, at once.
        overwrite(&mut source);
        let t = moved.tensor().unwrap();
        assert_eq!(t.placement(), Placement::Cuda(0));
        let back = t.to_cpu(false).unwrap();
        assert_eq!(
            bytes_of(&back),
            want,
            "case {i} ({what}, pinned {pinned}, {:?})",
            routes[i % routes.len()]
        );
    }
}

/// A pinned copy of `t` that no other tensor shares.
fn pin_alone(t: &Tensor) -> Tensor {
    let bytes = bytes_of(t);
    let mut out = Tensor::empty_pinned(t.dtype(), t.shape()).unwrap();
    macro_rules! fill {
        ($ty:ty) => {{
            let dst = out.as_mut_slice::<$ty>().unwrap();
            for (d, s) in dst.iter_mut().zip(bytes.chunks_exact(size_of::<$ty>())) {
                *d = <$ty>::from_ne_bytes(s.try_into().unwrap());
            }
        }};
    }
    match t.dtype() {
        DType::U8 => fill!(u8),
        DType::U16 => fill!(u16),
        DType::U32 => fill!(u32),
        DType::F32 => fill!(f32),
        DType::I64 => fill!(i64),
        other => unreachable!("no source of {other}"),
    }
    out
}

/// Writes new values over every element, in place (the tensor is its storage's only user).
fn overwrite(t: &mut Tensor) {
    macro_rules! fill {
        ($ty:ty, $v:expr) => {
            if t.is_pinned() {
                t.as_mut_slice::<$ty>().unwrap().fill($v)
            }
        };
    }
    match t.dtype() {
        DType::U8 => fill!(u8, 0xAB),
        DType::U16 => fill!(u16, 0xABCD),
        DType::U32 => fill!(u32, 7),
        DType::F32 => fill!(f32, 9.5),
        DType::I64 => fill!(i64, -3),
        other => unreachable!("no source of {other}"),
    }
}

#[test]
fn many_small_pinned_tensors_move_together_and_a_user_kernel_reads_them() {
    let test = "many_small_pinned_tensors_move_together_and_a_user_kernel_reads_them";
    let Some(dev) = cuda_or_skip(test) else {
        return;
    };
    let mut r = rng(test);
    // 1000 tensors of 4 KiB in blocks of their own: one kernel launch moves them all.
    let tensors: Vec<Tensor> = (0..1000)
        .map(|_| pin_alone(&random_tensor(&mut r, DType::F32, &[1024])))
        .collect();
    let moved = tensors.to_device(&dev, true).unwrap();
    for (a, b) in tensors.iter().zip(&moved) {
        assert_eq!(bytes_of(&b.to_cpu(false).unwrap()), bytes_of(a));
    }
    // Small integer values and a sum below 2^24, so the f32 sum is exact whatever the order.
    let pixels = Tensor::pinned_from_fn(&[8, 3, 32, 32], |i| (i * 7 % 251) as u8).unwrap();
    let g = Gather::rows(&pixels, (0..8).rev())
        .unwrap()
        .convert(Convert::affine(DType::F32, &[1.0, 2.0, 3.0], &[0.0; 3], 1).unwrap())
        .unwrap();
    let x = g.to_device(&dev, true).unwrap().into_tensor().unwrap();
    let want: f64 = affine_bytes(
        &ints(&pixels),
        3,
        1024,
        &[1.0, 2.0, 3.0],
        &[0.0; 3],
        DType::F32,
    )
    .chunks_exact(4)
    .map(|b| f64::from(f32::from_ne_bytes(b.try_into().unwrap())))
    .sum();
    let Some(kernels) = Kernels::load(&dev) else {
        println!(
            "partly skipped: no test kernels (PINNABLE_KERNELS_PTX unset); the device read is not checked"
        );
        return;
    };
    let ctx = dev.cuda_context().unwrap();
    let stream = ctx.new_stream().unwrap();
    let mut out = Tensor::from_vec(vec![0f32], &[1])
        .unwrap()
        .to_device(&dev, false)
        .unwrap();
    {
        let xv = x.cuda_view::<f32>(&stream).unwrap();
        let ov = out.cuda_view_mut::<f32>(&stream).unwrap();
        kernels.read_sum(&stream, xv.device_ptr(), x.numel(), ov.device_ptr());
    }
    let got = out.to_cpu(false).unwrap().to_vec::<f32>().unwrap()[0];
    assert_eq!(
        f64::from(got),
        want,
        "the sum a kernel on a stream of its own read"
    );
}

/// Inputs and targets: two gathers sharing one table of starts, moved together as `(x, y)` and
/// widened, equal to two plain gathers of windows; on the host, then on the device (one launch
/// reading the shared table where it lies), with the source overwritten right after the call.
#[test]
fn inputs_and_targets_equal_windows_and_the_windows_one_later() {
    let test = "inputs_and_targets_equal_windows_and_the_windows_one_later";
    let mut r = rng(test);
    let dev = cuda_or_skip(test);
    for i in 0..200 {
        let dtype = if r.random_bool(0.7) {
            DType::U16
        } else {
            DType::U32
        };
        let n = r.random_range(2..100_000);
        let mut source = pin_alone(&random_tensor(&mut r, dtype, &[n]));
        let len = r.random_range(0..n.min(4097));
        let count = r.random_range(0..300);
        let starts: Vec<usize> = (0..count).map(|_| r.random_range(0..n - len)).collect();
        let values = ints(&source);
        let to = if r.random_bool(0.5) {
            DType::I64
        } else {
            DType::I32
        };
        let want = |shift: usize| -> Vec<u8> {
            let v: Vec<i64> = starts
                .iter()
                .flat_map(|&s| values[s + shift..s + shift + len].to_vec())
                .collect();
            cast_bytes(&v, to)
        };
        let (x, y) = Gather::inputs_and_targets(&source, &starts, len).unwrap();
        let (x, y) = (
            x.convert(Convert::cast(to)).unwrap(),
            y.convert(Convert::cast(to)).unwrap(),
        );
        let what = format!("case {i}: {count} windows of {len} {dtype} of {n} to {to}");
        assert_eq!(
            bytes_of(&x.tensor().unwrap()),
            want(0),
            "{what}, x on the host"
        );
        assert_eq!(
            bytes_of(&y.tensor().unwrap()),
            want(1),
            "{what}, y on the host"
        );
        let Some(dev) = &dev else {
            continue;
        };
        let (mx, my) = (x, y).to_device(dev, true).unwrap();
        overwrite(&mut source);
        for (moved, shift, name) in [(mx, 0, "x"), (my, 1, "y")] {
            let t = moved.tensor().unwrap();
            assert_eq!(t.placement(), Placement::Cuda(0));
            assert_eq!(
                bytes_of(&t.to_cpu(false).unwrap()),
                want(shift),
                "{what}, {name} on the device"
            );
        }
    }
    let tokens = Tensor::pinned_from_fn(&[10], |i| i as u16).unwrap();
    let e = Gather::inputs_and_targets(&tokens, &[5], 5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("runs past the end"), "{e}");
}
