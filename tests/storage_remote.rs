//! Every format read through the storage layer from a URL as from a path (feature `remote`):
//! token shards, `.npy` arrays, image folders and tar shards served by a local HTTP server
//! (tests/support/http.rs) and by an S3-compatible server (moto, when it can be started), each
//! byte-equal to the local read of fresh random files; and several ranks streaming one remote
//! tar source at once.

use std::path::Path;
use std::time::Duration;

use pinnable::formats::npy::NpyArray;
use pinnable::formats::tar::TarShards;
use pinnable::formats::tokens::{ShardFormat, TokenShards};
use pinnable::loader::{Dataset, PlanRequest};
use pinnable::storage::Storage;
use pinnable::{DType, Error};
use pinnable_harness::http::Server;
use pinnable_harness::npy::npy_file;
use pinnable_harness::rng;
use pinnable_harness::s3::Moto;
use pinnable_harness::tar::{contents, folder, random_shards, read_sample};
use pinnable_harness::tokens::{random_tokens, shard_file};
use rand::Rng;

/// Small chunks, so that a shard is read in several ranged `GET`s with some in flight.
fn storage() -> Storage {
    Storage::new()
        .chunk_size(64 << 10)
        .read_ahead(2)
        .timeout(Duration::from_secs(5))
        .retries(2)
}

/// The files every test reads: token shards, an `.npy` array, an image folder (with the
/// `image` feature) and tar shards, under `dir`, each a path relative to it.
struct Files {
    tokens: Vec<(String, Vec<u16>)>,
    npy: (String, Vec<f32>),
    tar: usize,
    #[cfg(feature = "image")]
    images: Vec<(String, i64)>,
}

fn write_files(dir: &Path, r: &mut impl Rng) -> Files {
    let tokens = (0..r.random_range(1..4))
        .map(|i| {
            let len = r.random_range(1..200_000);
            let t = random_tokens(r, len, 50_000);
            let name = format!("tok{i}.bin");
            std::fs::write(
                dir.join(&name),
                shard_file(ShardFormat::LlmC, DType::U16, &t),
            )
            .unwrap();
            (name, t.into_iter().map(|t| t as u16).collect())
        })
        .collect();
    let rows = r.random_range(1..3000);
    let values: Vec<f32> = (0..rows * 7).map(|_| r.random()).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(
        dir.join("arr.npy"),
        npy_file("<f4", &[rows, 7], false, &bytes),
    )
    .unwrap();
    let tar = r.random_range(1..4);
    let counts: Vec<usize> = (0..tar).map(|_| r.random_range(5..120)).collect();
    random_shards(dir, r, &counts);
    #[cfg(feature = "image")]
    let images = {
        let root = dir.join("images");
        let classes = r.random_range(1..4);
        let per_class = r.random_range(1..4);
        pinnable_harness::images::write_folder(r, &root, classes, per_class, (40, 30));
        let local = pinnable::formats::image::ImageFolder::open(&root).unwrap();
        (0..local.len())
            .map(|i| {
                let p = local.path(i).unwrap().strip_prefix(dir).unwrap();
                (p.display().to_string(), local.label(i).unwrap())
            })
            .collect()
    };
    Files {
        tokens,
        npy: ("arr.npy".into(), values),
        tar,
        #[cfg(feature = "image")]
        images,
    }
}

/// Each shard's tokens.
fn tokens_of(shards: &TokenShards) -> Vec<Vec<u16>> {
    shards
        .shards()
        .iter()
        .map(|s| s.tokens().to_vec::<u16>().unwrap())
        .collect()
}

/// Reads every format from `base` (a URL the files of `dir` are under) and from `dir`, and
/// checks the two reads equal and equal to what was written.
fn check_formats(storage: &Storage, dir: &Path, base: &str, files: &Files) {
    let url = |name: &str| format!("{base}/{name}");
    // Token shards: read into pinned memory from both.
    let local = TokenShards::open(files.tokens.iter().map(|(n, _)| dir.join(n))).unwrap();
    let remote = TokenShards::open_with(storage, files.tokens.iter().map(|(n, _)| url(n))).unwrap();
    let written: Vec<Vec<u16>> = files.tokens.iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(tokens_of(&local), written);
    assert_eq!(tokens_of(&remote), written);
    // `.npy`.
    let local = NpyArray::open(dir.join(&files.npy.0)).unwrap();
    let remote = NpyArray::open_with(storage, url(&files.npy.0)).unwrap();
    assert_eq!(local.tensor().to_vec::<f32>().unwrap(), files.npy.1);
    assert_eq!(remote.tensor().to_vec::<f32>().unwrap(), files.npy.1);
    assert_eq!(remote.tensor().shape(), local.tensor().shape());
    // Tar shards, brace ranges expanded in the URL.
    let pattern = |at: &str| format!("{at}/train-{{000..{:03}}}.tar", files.tar - 1);
    let local = TarShards::open([pattern(&dir.display().to_string())]).unwrap();
    let remote = TarShards::open_with(storage, [pattern(base)]).unwrap();
    assert_eq!(contents(&remote), contents(&local));
    assert!(!local.is_empty());
    // Images, from a list of URLs with labels: the same pixels as the local files'.
    #[cfg(feature = "image")]
    {
        use pinnable::formats::image::ImageFolder;
        use pinnable::loader::SplitMix64;
        let local = ImageFolder::from_list(files.images.iter().map(|(p, l)| (dir.join(p), *l)));
        let remote =
            ImageFolder::from_list_with(storage, files.images.iter().map(|(p, l)| (url(p), *l)));
        for i in 0..local.len() {
            let (a, b) = (local.get(i).unwrap(), remote.get(i).unwrap());
            assert_eq!(a.label(), b.label());
            let codec = pinnable::formats::image::ImageCodec::default();
            let load = |f: pinnable::formats::image::ImageFile| {
                let bytes = f.bytes().unwrap();
                let image = codec.load(&bytes, f.path(), SplitMix64::new(7)).unwrap();
                image.to_vec::<u8>().unwrap()
            };
            assert_eq!(load(a), load(b), "image {i}");
        }
    }
}

#[test]
fn every_format_over_http_reads_as_from_a_path() {
    let mut r = rng("every_format_over_http_reads_as_from_a_path");
    let dir = folder("storage-http");
    let files = write_files(&dir, &mut r);
    let server = Server::start(&dir);
    check_formats(&storage(), &dir, &server.url(), &files);
    // A web server gives no listing: an image folder at an HTTP URL says what works.
    #[cfg(feature = "image")]
    {
        let err = pinnable::formats::image::ImageFolder::open(format!("{}/images", server.url()))
            .unwrap_err();
        assert!(err.to_string().contains("from_list_with"), "{err}");
    }
    // A missing object: an error naming its URL and the status, for each format.
    let missing = format!("{}/nothing.bin", server.url());
    let err = TokenShards::open_with(&storage(), [&missing]).unwrap_err();
    assert!(
        matches!(&err, Error::TokenShard { path, .. } if *path == missing),
        "{err}"
    );
    assert!(err.to_string().contains("404"), "{err}");
    let err = NpyArray::open_with(&storage(), &missing).unwrap_err();
    assert!(
        matches!(&err, Error::Npy { path, .. } if *path == missing),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_format_from_s3_reads_as_from_a_path() {
    let Some(mut moto) = Moto::start_or_skip("every_format_from_s3_reads_as_from_a_path") else {
        return;
    };
    let mut r = rng("every_format_from_s3_reads_as_from_a_path");
    let dir = folder("storage-s3");
    let files = write_files(&dir, &mut r);
    let mut objects = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let key = p.strip_prefix(&dir).unwrap().display().to_string();
                objects.push((format!("data/{key}"), std::fs::read(&p).unwrap()));
            }
        }
    }
    moto.put("formats", &objects);
    let storage = moto.storage().chunk_size(64 << 10).read_ahead(2);
    check_formats(&storage, &dir, "s3://formats/data", &files);
    // An image folder in a bucket is listed: the classes, labels and files of the local one.
    #[cfg(feature = "image")]
    {
        use pinnable::formats::image::ImageFolder;
        let local = ImageFolder::open(dir.join("images")).unwrap();
        let remote = ImageFolder::open_with(&storage, "s3://formats/data/images").unwrap();
        assert_eq!(remote.classes(), local.classes());
        assert_eq!(remote.len(), local.len());
        for i in 0..local.len() {
            assert_eq!(remote.label(i), local.label(i));
            let rel = local.path(i).unwrap().strip_prefix(&dir).unwrap();
            assert_eq!(
                remote.path(i).unwrap(),
                Path::new(&format!("s3://formats/data/{}", rel.display()))
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two ranks' epochs over one remote source, planned before either reads: each rank's
/// samples still stream in chunks (before the plans were kept per rank, the second plan
/// retired the first, and every sample of rank 0 came by a request of its own).
#[test]
fn two_ranks_stream_one_remote_source_at_once() {
    let mut r = rng("two_ranks_stream_one_remote_source_at_once");
    let dir = folder("storage-ranks");
    let shards_n = r.random_range(2..5);
    let counts: Vec<usize> = (0..shards_n).map(|_| r.random_range(150..400)).collect();
    let (pattern, _) = random_shards(&dir, &mut r, &counts);
    let server = Server::start(&dir);
    let url = format!("{}/train-{{000..{:03}}}.tar", server.url(), shards_n - 1);
    let remote = TarShards::open_with(&storage().read_ahead(1), [url]).unwrap();
    let local = TarShards::open([pattern]).unwrap();
    let expected = contents(&local);
    let n = remote.len();
    let seed = r.random();
    let before = server.log().len();
    let requests: Vec<PlanRequest> = (0..2)
        .map(|rank| PlanRequest::new(0).shuffle(seed).shard(rank, 2))
        .collect();
    let plans: Vec<_> = requests.iter().map(|q| remote.plan(q).unwrap()).collect();
    // Planning reads nothing: it is a pure function of the request.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        server.log().len(),
        before,
        "planning an epoch sent requests"
    );
    // Both ranks' reads start, each rank's plan kept beside the other's.
    for (q, p) in requests.iter().zip(&plans) {
        remote.prefetch(q, p);
    }
    let orders: Vec<Vec<usize>> = plans.iter().map(|p| p.indices().to_vec()).collect();
    for order in &orders {
        for &i in order {
            assert_eq!(read_sample(&remote.get(i).unwrap()), expected[i]);
        }
    }
    let gets = server.log()[before..]
        .iter()
        .filter(|l| l.method == "GET")
        .count();
    // Samples are at most ~600 bytes: a 64 KiB chunk holds about a hundred of them.
    assert!(
        gets * 8 < n,
        "{gets} requests for {n} samples: a rank's samples were not streamed"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
