//! WebDataset tar shards: grouping equal to webdataset 1.0's on awkward archives (keys that are
//! not UTF-8 among them), equal batch counts on every rank, an order that does not depend on
//! the worker count, resuming, and damaged shards.

use std::collections::{BTreeMap, HashSet};

use pinnable::Error;
use pinnable::formats::tar::{TarNpyBatcher, TarSample, TarShards};
use pinnable::loader::{Collator, Dataset, Loader, PlanRequest};
use pinnable::{Result, Tensor, ToDevice};
use pinnable_harness::tar::{
    Sample, folder, member_bytes, random_sample, random_shards, shard, shown,
};
use pinnable_harness::{cuda_or_skip, rng};
use rand::Rng;

/// The archives Python's `tarfile` wrote, and webdataset's groupings of them.
fn data() -> std::path::PathBuf {
    pinnable_harness::fixture("tests/data/tar")
}

/// Our grouping of a shard in webdataset's expected-file format (see `make_archives.py`).
fn grouping(shards: &TarShards) -> (Vec<String>, Option<Error>) {
    let mut lines = Vec::new();
    for i in 0..shards.len() {
        match shards.get(i) {
            Ok(s) => {
                lines.push(format!("sample {}", shown(s.key_bytes())));
                for f in s.fields() {
                    let data = String::from_utf8(s.bytes(&f.ext).unwrap().into_owned()).unwrap();
                    lines.push(format!("field {} {data}", f.ext));
                }
            }
            Err(e) => return (lines, Some(e)),
        }
    }
    (lines, None)
}

#[test]
fn grouping_matches_webdataset_on_awkward_archives() {
    // Where Python's tarfile stops silently at a damaged header, webdataset yields the samples
    // before it (the one being assembled too) and nothing more: the same samples here, then
    // the damage as an error naming the header's offset.
    let damaged = [
        ("damaged_header", 4 * 1024),
        ("damaged_member", 3 * 1024),
        ("damaged_cut", 4 * 1024),
    ];
    let names = [
        "awkward_gnu",
        "pax",
        "ustar",
        "duplicate",
        "nonutf8",
        "nonutf8_pax",
    ];
    for name in names.into_iter().chain(damaged.map(|d| d.0)) {
        let expected = std::fs::read_to_string(data().join(format!("{name}.expected"))).unwrap();
        let mut want: Vec<&str> = expected.lines().collect();
        let error = want.last().is_some_and(|l| l.starts_with("error "));
        if error {
            want.pop();
        }
        let path = data().join(format!("{name}.tar")).display().to_string();
        let shards = TarShards::open([&path]).unwrap();
        let (got, err) = grouping(&shards);
        assert_eq!(got, want, "{name}");
        let damage = damaged.iter().find(|d| d.0 == name).map(|d| d.1);
        assert_eq!(err.is_some(), error || damage.is_some(), "{name}: {err:?}");
        if let Some(e) = err {
            let Error::Tar { shard, offset, .. } = &e else {
                panic!("{e}")
            };
            assert_eq!(shard, &path);
            if let Some(at) = damage {
                assert_eq!(*offset, at, "{name}: {e}");
                continue;
            }
            // webdataset: "b.JPG: duplicate file name in tar file jpg"
            assert_eq!(*offset, 2 * 1024, "the second b member's header: {e}");
            let text = e.to_string();
            assert!(text.contains("`b`") && text.contains("`.jpg`"), "{text}");
        }
    }
}

/// The key of every sample of an epoch for rank `rank` of `world`.
fn keys(
    shards: &TarShards,
    epoch: u64,
    seed: Option<u64>,
    rank: usize,
    world: usize,
    drop_last: bool,
) -> Vec<String> {
    let request = PlanRequest::new(epoch)
        .shard(rank, world)
        .drop_last(drop_last);
    let request = match seed {
        Some(seed) => request.shuffle(seed),
        None => request,
    };
    shards
        .plan(&request)
        .unwrap()
        .indices()
        .iter()
        .map(|&i| shards.get(i).unwrap().key().unwrap().to_owned())
        .collect()
}

#[test]
fn ranks_keys_are_disjoint_and_cover_every_key() {
    let mut r = rng("ranks_keys_are_disjoint_and_cover_every_key");
    let dir = folder("ranks");
    let counts: Vec<usize> = (0..r.random_range(1..7))
        .map(|_| r.random_range(0..40))
        .collect();
    let (pattern, written) = random_shards(&dir, &mut r, &counts);
    let all: HashSet<String> = written.iter().flatten().map(|s| s.0.clone()).collect();
    let shards = TarShards::open([&pattern])
        .unwrap()
        .shuffle_buffer(r.random_range(0..20));
    assert_eq!(shards.len(), all.len());
    let seed = r.random();
    for world in 1..=8 {
        for drop_last in [false, true] {
            let parts: Vec<Vec<String>> = (0..world)
                .map(|k| keys(&shards, 3, Some(seed), k, world, drop_last))
                .collect();
            let per = parts[0].len();
            assert!(
                parts.iter().all(|p| p.len() == per),
                "world {world}: {counts:?}"
            );
            let mut seen: BTreeMap<&String, usize> = BTreeMap::new();
            for k in parts.iter().flatten() {
                *seen.entry(k).or_default() += 1;
            }
            if drop_last {
                assert_eq!(per, all.len() / world);
                assert!(seen.values().all(|&n| n == 1), "world {world}: a key twice");
            } else {
                assert_eq!(per, all.len().div_ceil(world));
                assert_eq!(seen.len(), all.len(), "world {world}: a key missing");
                let repeats: usize = seen.values().map(|n| n - 1).sum();
                assert_eq!(repeats, per * world - all.len());
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn labels(samples: Vec<TarSample>, c: &mut Collator) -> Result<Tensor> {
    let y = c.stack_scalars(
        "labels",
        samples
            .iter()
            .map(|s| s.class("cls"))
            .collect::<Result<Vec<_>>>()?,
    )?;
    c.finish()?.take(y)
}

#[test]
fn every_rank_gets_the_same_number_of_batches() {
    let mut r = rng("every_rank_gets_the_same_number_of_batches");
    let dir = folder("equal");
    // Uneven shards, and (for worlds above 2) fewer shards than ranks.
    let counts = [r.random_range(1..30), r.random_range(30..90)];
    let (pattern, _) = random_shards(&dir, &mut r, &counts);
    let shards = TarShards::open([&pattern]).unwrap();
    let batch = r.random_range(1..9);
    for world in 1..=8 {
        for drop_last in [false, true] {
            let counts: Vec<usize> = (0..world)
                .map(|rank| {
                    let loader = Loader::builder(shards.clone())
                        .batch_size(batch)
                        .shuffle(11)
                        .drop_last(drop_last)
                        .shard(rank, world)
                        .workers(2)
                        .build_with(labels)
                        .unwrap();
                    let n = loader
                        .iter()
                        .inspect(|b| assert!(b.is_ok(), "{b:?}"))
                        .count();
                    assert_eq!(n, loader.len(), "len() is exact");
                    n
                })
                .collect();
            assert!(
                counts.iter().all(|&n| n == counts[0]),
                "world {world}: {counts:?}"
            );
            // With drop_last a rank's share can be smaller than one batch: zero batches, on
            // every rank alike.
            assert!(counts[0] > 0 || drop_last, "world {world}: no batch");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The epoch's batches as labels, with `workers` threads.
fn epoch_labels(shards: &TarShards, workers: usize, epoch: u64) -> Vec<Vec<i64>> {
    let loader = Loader::builder(shards.clone())
        .batch_size(5)
        .shuffle(99)
        .shard(1, 3)
        .workers(workers)
        .build_with(labels)
        .unwrap();
    loader
        .run_epoch(epoch)
        .map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect()
}

#[test]
fn order_does_not_depend_on_the_worker_count() {
    let mut r = rng("order_does_not_depend_on_the_worker_count");
    let dir = folder("workers");
    let counts: Vec<usize> = (0..5).map(|_| r.random_range(5..60)).collect();
    let (pattern, _) = random_shards(&dir, &mut r, &counts);
    let shards = TarShards::open([&pattern]).unwrap().shuffle_buffer(16);
    let one = epoch_labels(&shards, 1, 2);
    assert_eq!(epoch_labels(&shards, 3, 2), one);
    assert_eq!(epoch_labels(&shards, 8, 2), one);
    assert_ne!(
        epoch_labels(&shards, 1, 3),
        one,
        "another epoch, another order"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shuffle_mixes_shards_and_keeps_their_order_a_permutation() {
    let mut r = rng("shuffle_mixes_shards_and_keeps_their_order_a_permutation");
    let dir = folder("mix");
    let (pattern, _) = random_shards(&dir, &mut r, &[20, 20, 20, 20]);
    let shards = TarShards::open([&pattern]).unwrap().shuffle_buffer(8);
    let order = keys(&shards, 0, Some(5), 0, 1, false);
    // Shards in a shuffled order, their samples mixed within a shard and across the boundary
    // between consecutive shards.
    let shard_of = |k: &String| k[..k.find('/').unwrap()].to_owned();
    let (first, second) = (shard_of(&order[0]), shard_of(&order[order.len() - 1]));
    let first_keys: Vec<&String> = order.iter().filter(|k| shard_of(k) == first).collect();
    assert!(
        first_keys.windows(2).any(|w| w[0] > w[1]),
        "mixed within a shard"
    );
    let next = shard_of(&order[25]);
    let crossed = order.iter().position(|k| shard_of(k) == next).unwrap()
        < order.iter().rposition(|k| shard_of(k) == first).unwrap();
    assert!(crossed, "mixed across shards: {order:?}");
    assert_ne!(first, second);
    let sequential: Vec<String> = (0..shards.len())
        .map(|i| shards.get(i).unwrap().key().unwrap().to_owned())
        .collect();
    assert_ne!(order, sequential);
    let mut sorted = order.clone();
    sorted.sort();
    let mut want = sequential.clone();
    want.sort();
    assert_eq!(sorted, want);
    // Without a seed: the shards in list order, nothing mixed.
    assert_eq!(keys(&shards, 0, None, 0, 1, false), sequential);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resume_at_a_random_batch_with_another_worker_count_continues_the_run() {
    let mut r = rng("resume_at_a_random_batch_with_another_worker_count");
    let dir = folder("resume");
    let counts: Vec<usize> = (0..4).map(|_| r.random_range(10..50)).collect();
    let (pattern, _) = random_shards(&dir, &mut r, &counts);
    let shards = TarShards::open([&pattern]).unwrap().shuffle_buffer(10);
    let build = |workers| {
        Loader::builder(shards.clone())
            .batch_size(4)
            .shuffle(21)
            .shard(0, 2)
            .workers(workers)
    };
    let loader = build(3).build_with(labels).unwrap();
    loader.set_epoch(1);
    let all: Vec<Vec<i64>> = loader
        .iter()
        .map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect();
    let stop = r.random_range(0..all.len());
    loader.set_epoch(1);
    let mut epoch = loader.iter();
    for _ in 0..stop {
        epoch.next().unwrap().unwrap();
    }
    let saved = epoch.position().to_string();
    drop(epoch);
    let resumed = build(1)
        .resume(saved.parse().unwrap())
        .build_with(labels)
        .unwrap();
    let rest: Vec<Vec<i64>> = resumed
        .iter()
        .map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(rest, all[stop..], "stopped after {stop} batches");
    // Saved under another seed: refused, naming it.
    let err = Loader::builder(shards.clone())
        .batch_size(4)
        .shuffle(22)
        .shard(0, 2)
        .resume(saved.parse().unwrap())
        .build_with(labels)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Resume {
                setting: "seed",
                ..
            }
        ),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The ways a shard is damaged in the tests: where the shard is cut or a header spoiled, given
/// the offsets of sample `bad`'s two headers (its `.txt`, its `.cls`).
#[derive(Clone, Copy, Debug)]
enum Damage {
    /// A name byte of sample `bad`'s first header changed: its checksum fails.
    CorruptFirst,
    /// The shard cut inside sample `bad`'s first header.
    CutHeader,
    /// The shard cut after sample `bad`'s first header: its data is missing.
    CutData,
    /// Sample `bad`'s second header spoiled: `bad` is delivered with its `.txt` only.
    CorruptSecond,
    /// The shard cut after sample `bad`'s second header: `bad` lost a member, it is dropped.
    CutSecondData,
}

impl Damage {
    const ALL: [Damage; 5] = [
        Damage::CorruptFirst,
        Damage::CutHeader,
        Damage::CutData,
        Damage::CorruptSecond,
        Damage::CutSecondData,
    ];

    /// `bytes` damaged at sample `bad` (headers at `first` and `second`); the samples
    /// delivered whole, whether `bad` comes with its `.txt` only, and the error's offset.
    fn apply(self, bytes: &mut Vec<u8>, bad: usize, first: u64, second: u64) -> (usize, bool, u64) {
        let (first_, second_) = (first as usize, second as usize);
        match self {
            Damage::CorruptFirst => bytes[first_ + 3] ^= 0x55,
            Damage::CutHeader => bytes.truncate(first_ + 100),
            Damage::CutData => bytes.truncate(first_ + 512),
            Damage::CorruptSecond => bytes[second_ + 3] ^= 0x55,
            Damage::CutSecondData => bytes.truncate(second_ + 512),
        }
        match self {
            Damage::CorruptSecond => (bad, true, second),
            Damage::CutSecondData => (bad, false, second),
            _ => (bad, false, first),
        }
    }
}

/// The samples of `shards` read by index up to the first error, as (key, fields), and the
/// error.
fn read_all(shards: &TarShards) -> (Vec<Sample>, Option<Error>) {
    let mut got = Vec::new();
    for i in 0..shards.len() {
        match shards.get(i) {
            Ok(s) => got.push((
                s.key().unwrap().to_owned(),
                s.fields()
                    .iter()
                    .map(|f| (f.ext.clone(), s.bytes(&f.ext).unwrap().into_owned()))
                    .collect(),
            )),
            Err(e) => return (got, Some(e)),
        }
    }
    (got, None)
}

/// Every complete sample before the damage is delivered (webdataset yields even the one being
/// assembled at a bad header, where Python's tarfile stops; a sample whose own member is cut
/// short is dropped), then the damage as an error naming the shard and the header's offset;
/// through the loader, the whole batches before it, then the error.
#[test]
fn damaged_shards_deliver_every_complete_sample_then_the_error_naming_shard_and_offset() {
    let mut r = rng("damaged_shards_deliver_every_complete_sample");
    let dir = folder("damage");
    let samples: Vec<_> = (0..30).map(|i| random_sample(&mut r, 0, i)).collect();
    let (bytes, starts) = shard(&samples);
    let bad = r.random_range(1..samples.len());
    let second = starts[bad] + 512 + (samples[bad].1[0].1.len() as u64).next_multiple_of(512);
    for damage in Damage::ALL {
        let path = dir.join(format!("{damage:?}.tar"));
        let mut b = bytes.clone();
        let (whole, partial, offset) = damage.apply(&mut b, bad, starts[bad], second);
        std::fs::write(&path, b).unwrap();
        let shards = TarShards::open([path.to_str().unwrap()]).unwrap();
        let (got, err) = read_all(&shards);
        let mut want = samples[..whole].to_vec();
        if partial {
            want.push((samples[bad].0.clone(), samples[bad].1[..1].to_vec()));
        }
        assert_eq!(got, want, "{damage:?}");
        assert_eq!(
            shards.len(),
            want.len() + 1,
            "{damage:?}: the samples, then the damage"
        );
        let err = err.unwrap_or_else(|| panic!("{damage:?}: no error"));
        let Error::Tar {
            shard, offset: at, ..
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!(
            (shard.as_str(), *at),
            (path.to_str().unwrap(), offset),
            "{err}"
        );
        assert!(
            err.to_string().contains(&format!("at byte {offset}")),
            "{err}"
        );
        if partial {
            continue; // its batch fails for want of a `.cls`
        }
        let loader = Loader::builder(shards)
            .batch_size(4)
            .workers(2)
            .build_with(labels)
            .unwrap();
        let out: Vec<_> = loader.iter().collect();
        let batches = whole / 4;
        assert_eq!(
            out.len(),
            batches + 1,
            "{damage:?}: the epoch ends at the error"
        );
        for (k, b) in out[..batches].iter().enumerate() {
            let want: Vec<i64> = samples[4 * k..4 * k + 4]
                .iter()
                .map(|s| String::from_utf8_lossy(&s.1[1].1).parse().unwrap())
                .collect();
            assert_eq!(b.as_ref().unwrap().to_vec::<i64>().unwrap(), want);
        }
        let text = out[batches].as_ref().unwrap_err().to_string();
        assert!(
            text.contains(&format!("at byte {offset}")),
            "{damage:?}: {text}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Keys that differ only in bytes that are not UTF-8 are distinct samples, as Python's
/// tarfile (which decodes names with `surrogateescape`) and webdataset make them.
#[test]
fn keys_that_are_not_utf8_stay_distinct_samples() {
    let mut r = rng("keys_that_are_not_utf8_stay_distinct_samples");
    let dir = folder("non-utf8");
    // Bytes 0x80..=0xff alone are never UTF-8: after a shared stem, each makes its own key.
    let mut ends: Vec<u8> = (0x80..=0xff).collect();
    for i in (1..ends.len()).rev() {
        ends.swap(i, r.random_range(0..=i));
    }
    let n = r.random_range(2..40);
    let mut tar = Vec::new();
    let mut want = Vec::new();
    for &end in &ends[..n] {
        let mut key = "café/k".as_bytes().to_vec();
        key.push(end);
        if r.random_bool(0.5) {
            key.extend_from_slice("ü".as_bytes());
        }
        let class = r.random_range(0..1000i64);
        let text: Vec<u8> = (0..r.random_range(1..50)).map(|_| r.random()).collect();
        member_bytes(&mut tar, &[&key[..], b".txt"].concat(), &text);
        member_bytes(
            &mut tar,
            &[&key[..], b".CLS"].concat(),
            class.to_string().as_bytes(),
        );
        want.push((key, class, text));
    }
    tar.resize(tar.len() + 1024, 0);
    let path = dir.join("keys.tar");
    std::fs::write(&path, &tar).unwrap();
    let shards = TarShards::open([path.to_str().unwrap()]).unwrap();
    assert_eq!(shards.len(), n);
    for (i, (key, class, text)) in want.iter().enumerate() {
        let s = shards.get(i).unwrap();
        assert_eq!(s.key_bytes(), &key[..]);
        assert_eq!(s.key(), None);
        assert_eq!(s.class("cls").unwrap(), *class);
        assert_eq!(&*s.bytes("txt").unwrap(), &text[..]);
        assert!(format!("{s:?}").contains(&shown(key)), "{s:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `.npy` file of `u16` values `[2, 3]`.
fn npy(values: &[u16]) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    pinnable_harness::npy::npy_file("<u2", &[2, 3], false, &data)
}

#[test]
fn npy_members_land_in_their_rows_with_their_labels() {
    let mut r = rng("npy_members_land_in_their_rows_with_their_labels");
    let dir = folder("npy");
    let rows: Vec<Vec<u16>> = (0..7)
        .map(|_| (0..6).map(|_| r.random()).collect())
        .collect();
    let samples: Vec<_> = rows
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (
                format!("k{i}"),
                vec![
                    ("NPY".into(), npy(v)),
                    ("cls".into(), i.to_string().into_bytes()),
                ],
            )
        })
        .collect();
    std::fs::write(dir.join("a.tar"), shard(&samples).0).unwrap();
    let pattern = format!("{}/*.tar", dir.display());
    // Read (each member copied by a positioned read) and mapped (members viewed in place):
    // the same rows and labels.
    // SAFETY: the shard is written above and not changed while it is read.
    let mapped = unsafe { TarShards::open_mapped([&pattern]) }.unwrap();
    for shards in [TarShards::open([&pattern]).unwrap(), mapped] {
        let loader = Loader::builder(shards)
            .batch_size(3)
            .workers(2)
            .build(TarNpyBatcher::new("npy").label("cls"))
            .unwrap();
        let mut seen = 0;
        for batch in &loader {
            let (x, y) = batch.unwrap();
            let y = y.unwrap().to_vec::<i64>().unwrap();
            assert_eq!(x.shape(), &[y.len(), 2, 3]);
            let want: Vec<u16> = y.iter().flat_map(|&i| rows[i as usize].clone()).collect();
            assert_eq!(x.to_vec::<u16>().unwrap(), want);
            seen += y.len();
        }
        assert_eq!(seen, 7);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn batches_moved_to_the_gpu_equal_the_host_batches() {
    let Some(device) = cuda_or_skip("batches_moved_to_the_gpu_equal_the_host_batches") else {
        return;
    };
    let mut r = rng("batches_moved_to_the_gpu_equal_the_host_batches");
    let dir = folder("gpu");
    let rows: Vec<Vec<u16>> = (0..40)
        .map(|_| (0..6).map(|_| r.random()).collect())
        .collect();
    let mut samples: Vec<_> = rows
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (
                format!("k{i:03}"),
                vec![
                    ("npy".into(), npy(v)),
                    ("cls".into(), i.to_string().into_bytes()),
                ],
            )
        })
        .collect();
    std::fs::write(dir.join("b.tar"), shard(&samples.split_off(17)).0).unwrap();
    std::fs::write(dir.join("a.tar"), shard(&samples).0).unwrap();
    let shards = TarShards::open([format!("{}/{{a,b}}.tar", dir.display())]).unwrap();
    let seed = r.random();
    let run = |device| -> Vec<(Vec<u16>, Vec<i64>)> {
        Loader::builder(shards.clone())
            .batch_size(8)
            .shuffle(seed)
            .workers(3)
            .device(device)
            .build(TarNpyBatcher::new("npy").label("cls"))
            .unwrap()
            .iter()
            .map(|b| {
                let (x, y) = b.unwrap();
                let (x, y) = (x.to_cpu(false).unwrap(), y.unwrap().to_cpu(false).unwrap());
                (x.to_vec::<u16>().unwrap(), y.to_vec::<i64>().unwrap())
            })
            .collect()
    };
    let host = run(pinnable::Device::cpu());
    assert_eq!(host.len(), 5);
    for (x, y) in &host {
        let want: Vec<u16> = y.iter().flat_map(|&i| rows[i as usize].clone()).collect();
        assert_eq!(x, &want);
    }
    assert_eq!(run(device), host);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_position_saved_over_other_shards_of_the_same_length_is_refused() {
    let mut r = rng("a_position_saved_over_other_shards");
    let dir = folder("resume-list");
    // Two lists of the same number of samples: the same shards, listed in another order.
    let n = r.random_range(5..40);
    let (pattern, _) = random_shards(&dir, &mut r, &[n, n]);
    let reversed = pattern.replace("{000..001}", "{001..000}");
    let build = |pattern: &str| {
        Loader::builder(TarShards::open([pattern]).unwrap())
            .batch_size(3)
            .shuffle(4)
    };
    let loader = build(&pattern).build_with(labels).unwrap();
    let mut epoch = loader.iter();
    epoch.next().unwrap().unwrap();
    let saved = epoch.position().to_string();
    drop(epoch);
    // The same list resumes; the other one is refused, naming the shard list.
    build(&pattern)
        .resume(saved.parse().unwrap())
        .build_with(labels)
        .unwrap();
    let err = build(&reversed)
        .resume(saved.parse().unwrap())
        .build_with(labels)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Resume { setting, .. } if setting.contains("shard-list")),
        "{err}"
    );
    // The same files in another folder still resume: the hash is of file names.
    let moved = folder("resume-list-moved");
    for s in 0..2 {
        let name = format!("train-{s:03}.tar");
        std::fs::copy(dir.join(&name), moved.join(&name)).unwrap();
    }
    build(&pattern.replace(&dir.display().to_string(), &moved.display().to_string()))
        .resume(saved.parse().unwrap())
        .build_with(labels)
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&moved).unwrap();
}
