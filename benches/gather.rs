//! `Gather` on one GPU: 32 MiB batches of random rows of a 256 MiB pinned array, for rows from
//! 1 KiB to 1 MiB, by each route (one device copy a row straight from the array, or gathered
//! on the host into pinned staging first), against one raw `cuMemcpyHtoDAsync` of 32 MiB from
//! pinned memory (the ceiling). What `GatherRoute::Auto` chooses is marked. Prints a markdown
//! table and writes it to `$PINNABLE_BENCH_OUT/gather.md`. Without a GPU it prints `skipped: …`.

use pinnable::{DType, Gather, GatherRoute, Tensor, ToDevice};
use pinnable_harness::bench::{Table, raw_one_copy, time};
use pinnable_harness::{cuda_or_skip, random_tensor, rng};
use rand::Rng;

const SOURCE: usize = 256 << 20;
const BATCH: usize = 32 << 20;

fn main() {
    let Some(dev) = cuda_or_skip("bench gather") else {
        return;
    };
    let mut r = rng("bench gather");
    let ceiling = raw_one_copy(&dev, BATCH);
    let mut table = Table::new(&format!(
        "# Gather: {} MiB batches of random rows of a {} MiB pinned array, {} ({})\n",
        BATCH >> 20,
        SOURCE >> 20,
        dev.name(),
        dev.pcie_bus_id().unwrap_or_default()
    ));
    for row in [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20] {
        let n = SOURCE / row;
        let source = Tensor::pinned_from_fn(&[n, row], |i| (i % 251) as u8).expect("pinned");
        let rows: Vec<usize> = (0..BATCH / row).map(|_| r.random_range(0..n)).collect();
        for route in [GatherRoute::Direct, GatherRoute::Host] {
            let g = Gather::rows(&source, rows.iter().copied())
                .expect("rows")
                .route(route);
            let t = time(3, 15, || {
                g.to_device(&dev, false).expect("move");
            });
            let auto = (route == GatherRoute::Direct) == (row >= 256 << 10);
            table.row(
                &format!(
                    "{} KiB rows, {route:?}{}",
                    row >> 10,
                    if auto { " (Auto)" } else { "" }
                ),
                t,
                BATCH,
                Some(("raw copy of 32 MiB", ceiling)),
            );
        }
    }
    // A check that the bench moved what it timed.
    let source = random_tensor(&mut r, DType::U8, &[64, 4096]);
    let g = Gather::rows(&source, [5, 9]).expect("rows");
    let back = g
        .to_device(&dev, false)
        .and_then(|g| g.into_tensor()?.to_cpu(false));
    let want: Vec<u8> = [5usize, 9]
        .iter()
        .flat_map(|&i| source.narrow(0, i, 1).unwrap().to_vec::<u8>().unwrap())
        .collect();
    assert_eq!(
        back.expect("move back").to_vec::<u8>().expect("bytes"),
        want
    );
    table.note(&format!(
        "\nraw ceiling: {:.3} ms for 32 MiB\n",
        ceiling * 1e3
    ));
    table.save("gather.md");
}
