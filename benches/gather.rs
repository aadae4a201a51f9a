//! `Gather` on one GPU, every engine side by side in one run, against one raw
//! `cuMemcpyHtoDAsync` of the same bytes from pinned memory (the ceiling):
//!
//! 1. 32 MiB batches of random rows of a 256 MiB pinned array, rows of 256 B to 1 MiB, by each
//!    route: the gather kernels, one copy-engine copy a run, host staging, and what `Auto`
//!    picks;
//! 2. conversions on the way: u16 token windows to i64 `x` and `y` (nanoGPT's batch shapes) and
//!    u8 images to normalised f32, against moving the wide values;
//! 3. 1000 pinned tensors of 4 KiB, each in a block of its own, `to_device(true)` + sync;
//! 4. beside a compute kernel that keeps every SM busy on another stream: what that kernel loses,
//!    and the batches' throughput for 4 KiB rows (kernels) and 1 MiB rows (copy engine).
//!
//! Each figure is the median of repeats of one synchronised call (not a stream of batches).
//! Prints markdown tables and writes them to `$PINNABLE_BENCH_OUT/gather.md`. Without a GPU it
//! prints `skipped: …`.

use cudarc::driver::sys;
use pinnable::{Convert, DType, Device, Gather, GatherRoute, Pinnable, Tensor, ToDevice};
use pinnable_harness::bench::{Table, raw_one_copy, time};
use pinnable_harness::kernels::Kernels;
use pinnable_harness::{bytes_of, cuda_or_skip, random_tensor, rng};
use rand::Rng;
use rand::rngs::SmallRng;

const SOURCE: usize = 256 << 20;
const BATCH: usize = 32 << 20;
const ROWS: [usize; 7] = [
    256,
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
];

fn main() {
    let Some(dev) = cuda_or_skip("bench gather") else {
        return;
    };
    let mut r = rng("bench gather");
    println!("gather kernels: {:?}", dev.gather_kernels());
    let ceiling = raw_one_copy(&dev, BATCH);
    // `PINNABLE_BENCH_ONLY=small` runs the small tensors' figure alone; `=beside` the figures
    // beside a compute kernel alone (of the routes `PINNABLE_BENCH_ROUTES` lists, if set).
    match std::env::var("PINNABLE_BENCH_ONLY").as_deref() {
        Ok("small") => {
            let mut table = Table::new("# Gather: small tensors only\n");
            small_tensors(&dev, &mut r, &mut table);
            return;
        }
        Ok("beside") => {
            let mut table = Table::new("# Gather: beside a compute kernel only\n");
            let source = Tensor::pinned_from_fn(&[SOURCE], |i| (i % 251) as u8).expect("pinned");
            beside_compute(&dev, &source, &mut r, &mut table);
            return;
        }
        _ => {}
    }
    let mut table = Table::new(&format!(
        "# Gather: {} MiB batches of random rows of a {} MiB pinned array, {} ({})\n",
        BATCH >> 20,
        SOURCE >> 20,
        dev.name(),
        dev.pcie_bus_id().unwrap_or_default()
    ));
    let source = Tensor::pinned_from_fn(&[SOURCE], |i| (i % 251) as u8).expect("pinned");
    // `PINNABLE_BENCH_ROWS` (row sizes in bytes) and `PINNABLE_BENCH_ROUTES` (route names, in
    // order, repeats allowed) narrow the sweep, to look at one figure closely.
    let listed = |var: &str| {
        std::env::var(var)
            .ok()
            .map(|v| v.split(',').map(str::to_owned).collect::<Vec<_>>())
    };
    let row_sizes: Vec<usize> = listed("PINNABLE_BENCH_ROWS")
        .map(|v| v.iter().filter_map(|s| s.parse().ok()).collect())
        .unwrap_or(ROWS.to_vec());
    let routes: Vec<GatherRoute> = listed_routes().unwrap_or(vec![
        GatherRoute::Kernel,
        GatherRoute::Direct,
        GatherRoute::Host,
        GatherRoute::Auto,
    ]);
    // Host staging's rows last: on some instances the routes that read pinned memory in place
    // ran slower for a while after it in the same process (BENCHMARKS.md, `gather`).
    let (host, others): (Vec<GatherRoute>, Vec<GatherRoute>) = routes
        .iter()
        .partition(|&&route| route == GatherRoute::Host);
    let passes = [others, host];
    for (&row, routes) in passes
        .iter()
        .flat_map(|routes| row_sizes.iter().map(move |row| (row, routes)))
    {
        let n = SOURCE / row;
        let src = source.reshape(&[n, row]).expect("rows");
        let rows: Vec<usize> = (0..BATCH / row).map(|_| r.random_range(0..n)).collect();
        check(&dev, &src, &rows);
        for &route in routes {
            let g = Gather::rows(&src, rows.iter().copied())
                .expect("rows")
                .route(route);
            let t = time(3, 15, || {
                g.to_device(&dev, false).expect("move");
            });
            table.row(
                &format!("{} rows, {route:?}", size(row)),
                t,
                BATCH,
                Some(("raw copy of 32 MiB", ceiling)),
            );
        }
    }
    if std::env::var_os("PINNABLE_BENCH_ROUTES").is_some() {
        return;
    }
    backends(&dev, &mut r, &mut table, ceiling);
    table.note(&format!(
        "\nraw ceiling: {:.3} ms for 32 MiB; routes: Kernel = the gather kernels, Direct = one \
         copy-engine copy a run, Host = host staging; Auto picks the kernels below 512 KiB\n\n",
        ceiling * 1e3
    ));
    conversions(&dev, &mut r, &mut table);
    small_tensors(&dev, &mut r, &mut table);
    beside_compute(&dev, &source, &mut r, &mut table);
    table.save("gather.md");
}

/// The routes `PINNABLE_BENCH_ROUTES` names, in order (repeats allowed), if it is set.
fn listed_routes() -> Option<Vec<GatherRoute>> {
    let v = std::env::var("PINNABLE_BENCH_ROUTES").ok()?;
    Some(
        v.split(',')
            .filter_map(|s| match s {
                "Kernel" => Some(GatherRoute::Kernel),
                "Direct" => Some(GatherRoute::Direct),
                "Host" => Some(GatherRoute::Host),
                "Auto" => Some(GatherRoute::Auto),
                _ => None,
            })
            .collect(),
    )
}

/// The kernels by the source's backend (a block of `cuMemHostAlloc` or of `cuMemHostRegister`),
/// and how much of a move is the host's planning (a non-blocking call's return).
fn backends(dev: &Device, r: &mut SmallRng, table: &mut Table, ceiling: f64) {
    use pinnable::{BackendChoice, PinnedPool, PoolConfig};
    for backend in [
        BackendChoice::CudaHostAlloc,
        BackendChoice::CudaHostRegister,
    ] {
        let mut config = PoolConfig::default();
        config.backend = backend;
        let pool = PinnedPool::new(config);
        let source = pinnable::PinContext::run(&pool, |cx| {
            cx.pin_tensor(&Tensor::from_vec(vec![7u8; SOURCE], &[SOURCE])?)
        })
        .expect("pinned source");
        for row in [256, 1 << 10, 4 << 10] {
            let n = SOURCE / row;
            let src = source.reshape(&[n, row]).expect("rows");
            let rows: Vec<usize> = (0..BATCH / row).map(|_| r.random_range(0..n)).collect();
            let g = Gather::rows(&src, rows.iter().copied())
                .expect("rows")
                .route(GatherRoute::Kernel);
            let t = time(3, 15, || {
                g.to_device(dev, false).expect("move");
            });
            table.row(
                &format!(
                    "{} rows, Kernel, source from {backend:?} (a non-blocking call returns in \
                     {:.3} ms)",
                    size(row),
                    plan_time(dev, &g) * 1e3
                ),
                t,
                BATCH,
                Some(("raw copy of 32 MiB", ceiling)),
            );
        }
    }
}

/// How long a non-blocking move takes to return (the host's share: planning and issuing).
fn plan_time(dev: &Device, g: &Gather) -> f64 {
    let mut v = Vec::new();
    for _ in 0..10 {
        let t = std::time::Instant::now();
        let moved = g.to_device(dev, true).expect("move");
        v.push(t.elapsed().as_secs_f64());
        dev.synchronize().expect("sync");
        drop(moved);
    }
    pinnable_harness::bench::median(v)
}

fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// The gathered rows on the device equal the rows of the source.
fn check(dev: &Device, src: &Tensor, rows: &[usize]) {
    let rows = &rows[..rows.len().min(64)];
    let g = Gather::rows(src, rows.iter().copied()).expect("rows");
    let back = g
        .to_device(dev, false)
        .and_then(|g| g.into_tensor()?.to_cpu(false))
        .expect("move back");
    let want: Vec<u8> = rows
        .iter()
        .flat_map(|&i| bytes_of(&src.narrow(0, i, 1).unwrap()))
        .collect();
    assert_eq!(bytes_of(&back), want, "a gather the bench times is wrong");
}

/// Token windows widened to i64 and images normalised to f32 on the way, against moving
/// batches already wide (one pinned copy of the wide bytes: what collating on the host gives).
fn conversions(dev: &Device, r: &mut SmallRng, table: &mut Table) {
    table.note("## Conversions on the way (median of 15 synchronised moves)\n\n");
    let tokens =
        Tensor::pinned_from_fn(&[100 << 20], |i| (i * 2654435761 % 50257) as u16).expect("tokens");
    for (b, ctx) in [(12, 1024), (64, 2048), (256, 4096)] {
        let starts: Vec<usize> = (0..b)
            .map(|_| r.random_range(0..tokens.numel() - ctx - 1))
            .collect();
        let batch = |route| {
            let x = Gather::windows(&tokens, starts.iter().copied(), ctx)?
                .convert(Convert::cast(DType::I64))?
                .route(route);
            let y = Gather::windows(&tokens, starts.iter().map(|s| s + 1), ctx)?
                .convert(Convert::cast(DType::I64))?
                .route(route);
            Ok::<_, pinnable::Error>((x, y))
        };
        let wide = 2 * b * ctx * 8;
        let raw = raw_one_copy(dev, wide);
        for route in [GatherRoute::Auto, GatherRoute::Host] {
            let xy = batch(route).expect("windows");
            let t = time(3, 15, || {
                xy.to_device(dev, false).expect("move");
            });
            table.row(
                &format!("x, y of {b}×{ctx} u16 tokens → i64, {route:?}"),
                t,
                wide,
                Some(("raw copy of the i64 x, y", raw)),
            );
        }
        // A check: x's first window widened.
        let (x, _) = batch(GatherRoute::Auto)
            .expect("windows")
            .to_device(dev, false)
            .expect("move");
        let got = x.into_tensor().unwrap().to_cpu(false).unwrap();
        let want: Vec<i64> = tokens
            .narrow(0, starts[0], ctx)
            .unwrap()
            .to_vec::<u16>()
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect();
        assert_eq!(&got.to_vec::<i64>().unwrap()[..ctx], &want[..]);
    }
    let images = random_tensor(r, DType::U8, &[64, 3, 224, 224])
        .pin_memory()
        .expect("pin");
    let norm =
        Convert::normalize(DType::F32, &[0.485, 0.456, 0.406], &[0.229, 0.224, 0.225]).unwrap();
    let wide = images.numel() * 4;
    let raw = raw_one_copy(dev, wide);
    for route in [GatherRoute::Auto, GatherRoute::Host] {
        let g = Gather::rows(&images, 0..64)
            .unwrap()
            .convert(norm.clone())
            .unwrap()
            .route(route);
        let t = time(3, 15, || {
            g.to_device(dev, false).expect("move");
        });
        table.row(
            &format!("64×3×224×224 u8 images → normalised f32, {route:?}"),
            t,
            wide,
            Some(("raw copy of the f32 batch", raw)),
        );
    }
    table.note("\n");
}

/// 1000 pinned tensors of 4 KiB moved together: each in a block of its own, and as every other
/// row of one block (the same pieces, one mapping); and how long the call takes to return.
fn small_tensors(dev: &Device, r: &mut SmallRng, table: &mut Table) {
    let own: Vec<Tensor> = (0..1000)
        .map(|_| {
            let t = random_tensor(r, DType::F32, &[1024]);
            let mut p = Tensor::empty_pinned(DType::F32, &[1024]).unwrap();
            p.as_mut_slice::<f32>()
                .unwrap()
                .copy_from_slice(&t.to_vec::<f32>().unwrap());
            p
        })
        .collect();
    let block = random_tensor(r, DType::F32, &[2000, 1024])
        .pin_memory()
        .unwrap();
    let rows: Vec<Tensor> = (0..1000)
        .map(|i| block.narrow(0, 2 * i, 1).unwrap())
        .collect();
    let raw = raw_one_copy(dev, 1000 << 12);
    table.note(&format!(
        "## 1000 pinned tensors of 4 KiB, `to_device(true)` + sync (median of 30; gather \
         kernels {})\n\n",
        if dev.gather_kernels().is_ok() {
            "on"
        } else {
            "off"
        }
    ));
    for (what, tensors) in [
        ("each in a block of its own", &own),
        ("every other row of one block", &rows),
    ] {
        let back = tensors.to_device(dev, true).expect("move");
        assert_eq!(
            bytes_of(&back[999].to_cpu(false).unwrap()),
            bytes_of(&tensors[999]),
            "a move the bench times is wrong"
        );
        let t = time(5, 30, || {
            tensors.to_device(dev, true).expect("move");
            dev.synchronize().expect("sync");
        });
        let mut returns = Vec::new();
        for _ in 0..30 {
            let start = std::time::Instant::now();
            let moved = tensors.to_device(dev, true).expect("move");
            returns.push(start.elapsed().as_secs_f64());
            dev.synchronize().expect("sync");
            drop(moved);
        }
        let returned = pinnable_harness::bench::median(returns);
        table.row(
            &format!(
                "1000 × 4 KiB pinned tensors, {what} (the call returns in {:.3} ms)",
                returned * 1e3
            ),
            t,
            1000 << 12,
            Some(("raw copy of 4 MB", raw)),
        );
    }
    table.note("\n");
}

/// A compute kernel keeps every SM busy on a stream of its own while 32 MiB batches are
/// gathered: its time against its time alone, and the batches' throughput meanwhile.
fn beside_compute(dev: &Device, source: &Tensor, r: &mut SmallRng, table: &mut Table) {
    let Some(kernels) = Kernels::load(dev) else {
        table.note("beside compute: skipped (no bench kernels: PINNABLE_KERNELS_PTX unset)\n");
        return;
    };
    let ctx = dev.cuda_context().unwrap();
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .unwrap() as u32;
    let compute = ctx.new_stream().unwrap();
    let out = Tensor::from_vec(vec![0f32], &[1])
        .unwrap()
        .to_device(dev, false)
        .unwrap();
    // The kernel never writes `out` (see `busy`); the view only names its address.
    let out_ptr = out.cuda_view::<f32>(&compute).unwrap().device_ptr();
    let events = || {
        let f = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        (ctx.new_event(f).unwrap(), ctx.new_event(f).unwrap())
    };
    // Calibrate the kernel to about 60 ms alone.
    let busy_ms = |iters: u64, blocks_per_sm: u32| {
        let (a, b) = events();
        a.record(&compute).unwrap();
        kernels.busy(&compute, sms, blocks_per_sm, iters, out_ptr);
        b.record(&compute).unwrap();
        compute.synchronize().unwrap();
        f64::from(a.elapsed_ms(&b).unwrap())
    };
    busy_ms(1000, 4);
    let iters = (1e5 * 60.0 / busy_ms(100_000, 4)) as u64;
    let alone: Vec<f64> = (0..5).map(|_| busy_ms(iters, 4)).collect();
    let alone = pinnable_harness::bench::median(alone);
    let full: Vec<f64> = (0..5).map(|_| busy_ms(iters, 8)).collect();
    let alone_full = pinnable_harness::bench::median(full);
    table.note(&format!(
        "## Beside a compute kernel on every SM ({sms} SMs × 4 blocks of 256 threads, half the \
         threads an SM holds: {alone:.1} ms alone; × 8 blocks, every thread slot: {alone_full:.1} \
         ms)\n\n| rows | route | blocks a SM | batches/s while busy | × ceiling | compute \
         kernel's slowdown |\n| --- | --- | --- | --- | --- | --- |\n"
    ));
    let copy = dev.copy_stream().unwrap().clone();
    let ceiling = raw_one_copy(dev, BATCH);
    for (row, route, blocks_per_sm) in [
        (4 << 10, GatherRoute::Auto, 4),
        (4 << 10, GatherRoute::Direct, 4),
        (4 << 10, GatherRoute::Host, 4),
        (1 << 20, GatherRoute::Auto, 4),
        (1 << 20, GatherRoute::Kernel, 4),
        (4 << 10, GatherRoute::Auto, 8),
        (4 << 10, GatherRoute::Host, 8),
        (1 << 20, GatherRoute::Auto, 8),
    ] {
        if listed_routes().is_some_and(|routes| !routes.contains(&route)) {
            continue;
        }
        let n = SOURCE / row;
        let src = source.reshape(&[n, row]).unwrap();
        let rows: Vec<usize> = (0..BATCH / row).map(|_| r.random_range(0..n)).collect();
        let g = Gather::rows(&src, rows.iter().copied())
            .unwrap()
            .route(route);
        let idle = time(1, 3, || {
            g.to_device(dev, false).unwrap();
        });
        let (ca, cb) = events();
        let alone = if blocks_per_sm == 4 {
            alone
        } else {
            alone_full
        };
        // Batches while the kernel runs: as many as take about half its time when idle; only
        // those finished before the kernel count.
        let batches = ((alone / 2.0) / (idle * 1e3)).max(2.0) as usize;
        // The same burst once before, so the pools hold the staging and batch memory a burst
        // keeps in flight (a steady state, not the pools' growth).
        let warm: Vec<Gather> = (0..batches)
            .map(|_| g.to_device(dev, true).unwrap())
            .collect();
        copy.synchronize().unwrap();
        drop(warm);
        ca.record(&compute).unwrap();
        kernels.busy(&compute, sms, blocks_per_sm, iters, out_ptr);
        cb.record(&compute).unwrap();
        let mut kept = Vec::with_capacity(batches);
        let mut done = Vec::with_capacity(batches);
        for _ in 0..batches {
            kept.push(g.to_device(dev, true).unwrap());
            let (e, _) = events();
            e.record(&copy).unwrap();
            done.push(e);
        }
        compute.synchronize().unwrap();
        copy.synchronize().unwrap();
        let busy = f64::from(ca.elapsed_ms(&cb).unwrap());
        let at = |e: &cudarc::driver::CudaEvent| f64::from(ca.elapsed_ms(e).unwrap());
        let inside: Vec<f64> = done.iter().map(at).filter(|&t| t <= busy).collect();
        if inside.len() < 2 {
            table.note(&format!(
                "| {} | {route:?} | {blocks_per_sm} | fewer than 2 batches finished inside the \
                 kernel | | |\n",
                size(row)
            ));
            continue;
        }
        let gathered = (inside[inside.len() - 1] - inside[0]) / 1e3 / (inside.len() - 1) as f64;
        let line = format!(
            "| {} | {route:?} | {blocks_per_sm} | {:.0} ({:.3} ms a batch) | {:.2}× | {:+.1}% |\n",
            size(row),
            1.0 / gathered,
            gathered * 1e3,
            ceiling / gathered,
            (busy / alone - 1.0) * 100.0
        );
        table.note(&line);
        drop(kept);
    }
    table.note(
        "\nThe batches are issued right after the compute kernel; their window ends with the \
         last batch, inside the kernel's run. Slowdown: the kernel's time beside the batches \
         against alone.\n",
    );
}
