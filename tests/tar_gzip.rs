//! Gzip-compressed tar shards (`.tar.gz`, as webdataset reads them): read sample for sample
//! equal to their plain `.tar`, told by their bytes rather than their names, in the same
//! epoch order; damaged ones give the samples before the damage, then an error naming gzip.

use pinnable::Error;
use pinnable::formats::tar::{TarSample, TarShards};
use pinnable::loader::{Collator, Dataset, Loader};
use pinnable::{Result, Tensor};
use pinnable_harness::rng;
use pinnable_harness::tar::{
    Sample, contents, folder, gzip, random_sample, random_shards, read_sample, shard,
};
use rand::Rng;

/// A batch's `.txt` lengths and labels, in batch order.
fn batch(samples: Vec<TarSample>, c: &mut Collator) -> Result<Tensor> {
    let mut rows = Vec::new();
    for s in &samples {
        rows.push(s.bytes("txt")?.len() as i64);
        rows.push(s.class("cls")?);
    }
    let y = c.stack_scalars("rows", rows)?;
    c.finish()?.take(y)
}

/// One epoch's batches: shuffled with a shuffle buffer, rank 1 of 2.
fn epoch(shards: &TarShards, workers: usize, seed: u64) -> Vec<Vec<i64>> {
    Loader::builder(shards.clone().shuffle_buffer(16))
        .batch_size(5)
        .shuffle(seed)
        .shard(1, 2)
        .workers(workers)
        .build_with(batch)
        .unwrap()
        .run_epoch(2)
        .map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect()
}

#[test]
fn gzip_shards_read_sample_for_sample_equal_to_their_tar() {
    let mut r = rng("gzip_shards_read_sample_for_sample_equal_to_their_tar");
    let dir = folder("gzip-same");
    let counts: Vec<usize> = (0..r.random_range(2..6))
        .map(|_| r.random_range(1..300))
        .collect();
    let (pattern, _) = random_shards(&dir, &mut r, &counts);
    let mut compressed = Vec::new();
    let mut mixed = Vec::new();
    for s in 0..counts.len() {
        let plain = dir.join(format!("train-{s:03}.tar"));
        let bytes = std::fs::read(&plain).unwrap();
        // Told by its first bytes: one compressed shard keeps the name `.tar`.
        let name = if s == 0 {
            "gz-000.tar".into()
        } else {
            format!("gz-{s:03}.tar.gz")
        };
        let path = dir.join(name);
        // One shard in two gzip members, as `cat a.gz b.gz` writes it (as `gzip -d` reads it).
        let gz = if s == 1 {
            let cut = r.random_range(0..bytes.len());
            [gzip(&bytes[..cut], 6), gzip(&bytes[cut..], 1)].concat()
        } else {
            gzip(&bytes, r.random_range(0..=9))
        };
        std::fs::write(&path, gz).unwrap();
        compressed.push(path.display().to_string());
        mixed.push(if s % 2 == 0 { path } else { plain });
    }
    let mixed: Vec<String> = mixed.iter().map(|p| p.display().to_string()).collect();
    let plain = TarShards::open([&pattern]).unwrap();
    let want = contents(&plain);
    assert_eq!(want.len(), counts.iter().sum::<usize>());
    let gz = TarShards::open(&compressed).unwrap();
    for (s, &n) in counts.iter().enumerate() {
        assert_eq!(gz.shard_len(s), Some(n), "shard {s}");
    }
    assert_eq!(contents(&gz), want, "read in index order");
    // Read by hand in any order: a sample before the decoder's place starts it again.
    let mut order: Vec<usize> = (0..want.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, r.random_range(0..=i));
    }
    for &i in order.iter().take(50) {
        assert_eq!(read_sample(&gz.get(i).unwrap()), want[i], "sample {i}");
    }
    // SAFETY: the files are written once above and only read while mapped.
    let mapped = unsafe { TarShards::open_mapped(&compressed) }.unwrap();
    assert_eq!(contents(&mapped), want, "mapped");
    let seed = r.random();
    let epochs = epoch(&plain, 1, seed);
    assert!(!epochs.is_empty());
    assert_eq!(
        epoch(&gz, 3, seed),
        epochs,
        "the plain order, with 3 workers"
    );
    assert_eq!(epoch(&gz, 1, seed), epochs, "and with 1");
    // Plain and compressed shards in one list.
    let mixed = TarShards::open(&mixed).unwrap();
    assert_eq!(contents(&mixed), want, "plain and compressed");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_gzip_shards_give_the_samples_before_the_damage_then_an_error_naming_gzip() {
    let mut r = rng("damaged_gzip_shards_give_the_samples_before_the_damage");
    let dir = folder("gzip-damage");
    let samples: Vec<Sample> = (0..r.random_range(20..60))
        .map(|i| random_sample(&mut r, 0, i))
        .collect();
    let (bytes, _) = shard(&samples);
    let whole = gzip(&bytes, 6);
    // Cut short: the samples whose bytes came before the cut, then an error.
    let cut = r.random_range(whole.len() / 4..whole.len() * 3 / 4);
    let path = dir.join("cut.tar.gz");
    std::fs::write(&path, &whole[..cut]).unwrap();
    let shards = TarShards::open([path.to_str().unwrap()]).unwrap();
    let n = shards.len() - 1;
    assert!(n < samples.len(), "{n} of {}", samples.len());
    let got = contents_until_error(&shards);
    assert_eq!(got.len(), n);
    // The last one was being assembled where the stream ends: its members read before.
    if let Some((last, before)) = got.split_last() {
        assert_eq!(before, &samples[..n - 1]);
        assert_eq!(last.0, samples[n - 1].0);
        assert!(samples[n - 1].1.starts_with(&last.1), "{last:?}");
    }
    let err = shards.get(n).unwrap_err().to_string();
    assert!(err.contains("gzip"), "{err}");
    assert!(err.contains("truncated"), "{err}");
    // A flipped bit in the deflate data: samples or errors, never a panic.
    let mut spoiled = whole.clone();
    let at = r.random_range(20..spoiled.len() - 8);
    spoiled[at] ^= 1 << r.random_range(0..8);
    let path = dir.join("spoiled.tar.gz");
    std::fs::write(&path, &spoiled).unwrap();
    let shards = TarShards::open([path.to_str().unwrap()]).unwrap();
    // Every index answers, a sample or an error.
    let read = (0..shards.len()).filter(|&i| shards.get(i).is_ok()).count();
    assert!(read <= samples.len());
    // Another compression is named, with what to do.
    let path = dir.join("x.tar.xz");
    std::fs::write(&path, b"\xfd7zXZ\0\0\x04\xe6\xd6\xb4\x46\x02\0\x21\x01").unwrap();
    let err = TarShards::open([path.to_str().unwrap()])
        .unwrap()
        .get(0)
        .unwrap_err();
    let Error::Tar { problem, .. } = &err else {
        panic!("{err}")
    };
    assert!(
        problem.contains("xz") && problem.contains("gzip"),
        "{problem}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The samples read by index up to the first error.
fn contents_until_error(shards: &TarShards) -> Vec<Sample> {
    (0..shards.len())
        .map_while(|i| shards.get(i).ok())
        .map(|s| read_sample(&s))
        .collect()
}
