//! Errors users raise and read: `?` on `std::io::Error` inside a `Dataset`, `Error::other`
//! with its source, misuse reported as misuse, and a `Debug` that keeps the advice `Display`
//! gives (what `?` in `main` prints).

use std::error::Error as _;
use std::path::PathBuf;

use pinnable::loader::{Dataset, Loader};
use pinnable::{DType, Error, PinnedPool, PoolConfig};
use pinnable_harness::rng;
use rand::Rng;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pinnable-errors-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One file of raw bytes a sample, read with `?` on `std::io::Error`.
struct Files {
    paths: Vec<PathBuf>,
}

impl Dataset for Files {
    type Sample = Vec<u8>;

    fn len(&self) -> usize {
        self.paths.len()
    }

    fn get(&self, index: usize) -> pinnable::Result<Vec<u8>> {
        Ok(std::fs::read(&self.paths[index])?)
    }
}

#[test]
fn dataset_get_reads_files_with_question_mark_and_a_missing_one_is_io_not_found() {
    let mut rng = rng("dataset_get_reads_files_with_question_mark");
    let dir = temp_dir("files");
    let row = 16;
    let n = rng.random_range(6..12usize);
    let missing = rng.random_range(0..n);
    let mut rows = Vec::new();
    let mut paths = Vec::new();
    for i in 0..n {
        let bytes: Vec<u8> = (0..row).map(|_| rng.random()).collect();
        let path = dir.join(format!("{i}.bin"));
        if i != missing {
            std::fs::write(&path, &bytes).unwrap();
        }
        rows.push(bytes);
        paths.push(path);
    }
    let loader = Loader::builder(Files { paths })
        .batch_size(1)
        .workers(2)
        .build_with(|samples: Vec<Vec<u8>>, c| {
            let slot = c.stack_scalars("bytes", samples.concat())?;
            c.finish()?.take(slot)
        })
        .unwrap();
    let results: Vec<_> = loader.run_epoch(0).collect();
    assert_eq!(
        results.len(),
        missing + 1,
        "the epoch ends at the failed sample"
    );
    for (i, r) in results[..missing].iter().enumerate() {
        assert_eq!(r.as_ref().unwrap().to_vec::<u8>().unwrap(), rows[i]);
    }
    let err = results[missing].as_ref().unwrap_err();
    let Error::Sample { index, source, .. } = err else {
        panic!("expected a sample error, got {err}");
    };
    assert_eq!(*index, missing);
    let Error::Io { path: None, source } = source.as_ref() else {
        panic!("expected an I/O error, got {source}");
    };
    assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
    assert!(
        err.to_string().starts_with(&format!(
            "sample {missing} failed while loading: input/output failed: "
        )),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn io_names_the_file_and_keeps_the_os_error_as_source() {
    let mut rng = rng("io_names_the_file");
    let path = temp_dir("io").join(format!("absent-{}.bin", rng.random::<u32>()));
    let err = std::fs::read(&path)
        .map_err(|e| Error::io(&path, e))
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("input/output failed on `{}`: ", path.display())),
        "{err}"
    );
    let source = err.source().unwrap().downcast_ref::<std::io::Error>();
    assert_eq!(source.unwrap().kind(), std::io::ErrorKind::NotFound);
}

#[derive(Debug)]
struct Checksum {
    expected: u32,
    found: u32,
}

impl std::fmt::Display for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "checksum {:#x}, expected {:#x}",
            self.found, self.expected
        )
    }
}

impl std::error::Error for Checksum {}

#[test]
fn other_wraps_the_callers_error_and_returns_it_as_source() {
    let mut rng = rng("other_wraps_the_callers_error");
    let (expected, found) = (rng.random::<u32>(), rng.random::<u32>());
    let err = Error::other(Checksum { expected, found });
    assert_eq!(
        err.to_string(),
        format!("checksum {found:#x}, expected {expected:#x}")
    );
    let source = err.source().unwrap().downcast_ref::<Checksum>().unwrap();
    assert_eq!((source.expected, source.found), (expected, found));
    // A message alone works too.
    let n = rng.random_range(0..1000u32);
    let err = Error::other(format!("record {n} is empty"));
    assert!(matches!(err, Error::Other { .. }));
    assert_eq!(err.to_string(), format!("record {n} is empty"));
}

#[test]
fn debug_prints_the_variant_and_the_advice_display_gives() {
    let mut rng = rng("debug_prints_the_variant_and_the_advice");
    let requested = rng.random_range(1..1 << 30usize);
    let err = Error::MemlockLimit {
        requested,
        limit: "65536 bytes".into(),
    };
    let debug = format!("{err:?}");
    assert_eq!(debug, format!("MemlockLimit: {err}"));
    assert!(debug.contains(&format!("cannot page-lock {requested} bytes")));
    assert!(
        debug.contains("raise it (e.g. `ulimit -l unlimited`"),
        "{debug}"
    );
    // What `?` in `main` prints for a nested error: the sample, then its cause.
    let index = rng.random_range(0..100usize);
    let err = Error::Sample {
        index,
        during: "loading",
        source: Box::new(Error::from(std::io::Error::from(
            std::io::ErrorKind::PermissionDenied,
        ))),
    };
    assert_eq!(
        format!("{err:?}"),
        format!(
            "Sample: sample {index} failed while loading: input/output failed: permission denied"
        )
    );
}

#[test]
fn cuda_unavailable_points_to_device_cpu() {
    let err = Error::CudaUnavailable {
        reason: "the CUDA driver is installed but sees no device".into(),
    };
    assert_eq!(
        err.to_string(),
        "CUDA is unavailable: the CUDA driver is installed but sees no device; to run without \
         a GPU, use `Device::cpu()` (batches stay pinned in host memory)"
    );
}

#[test]
fn collated_reports_misuse_not_a_shape_error() {
    let mut rng = rng("collated_reports_misuse");
    let pool = PinnedPool::new(PoolConfig::default());
    let n = rng.random_range(1..8usize);
    let values: Vec<f32> = (0..n).map(|_| rng.random()).collect();
    // A slot of a batch of two tensors, used on a batch of one.
    let mut c = pinnable::loader::Collator::new(&pool);
    c.stack_scalars("a", values.iter().copied()).unwrap();
    let foreign = c.empty("b", DType::F32, &[n]).unwrap();
    c.finish().unwrap();
    let slot = c.empty("x", DType::F32, &[n]).unwrap();
    let mut batch = c.finish().unwrap();
    let err = batch.take(foreign).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Misuse {
                call: "Collated::take",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("does not belong to this batch"),
        "{err}"
    );
    batch
        .view_mut(slot)
        .unwrap()
        .copy_from_slice(&values)
        .unwrap();
    assert_eq!(batch.take(slot).unwrap().to_vec::<f32>().unwrap(), values);
    let err = batch.view_mut(slot).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Misuse {
                call: "Collated::view_mut",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("before the first `take`"), "{err}");
}
