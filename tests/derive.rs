//! What `#[derive(Pinnable, ToDevice)]` does at run time: values round-trip exactly through
//! `pin_memory()`, every tensor ends up pinned, plain and skipped data is carried over, the
//! source is untouched, and errors name the field path.

use std::collections::HashMap;

use pinnable::TensorMeta;
use pinnable::{
    DType, Device, MoveContext, PinContext, Pinnable, Placement, Result, Tensor, ToDevice, Walk,
};
use pinnable_harness::{bytes_of, random_tensor, rng};
use rand::Rng;
use rand::rngs::SmallRng;

/// Not `Pinnable`: carried over by `#[pinnable(skip)]`.
#[derive(Clone, Debug, PartialEq)]
struct Tokenizer {
    vocab: Vec<String>,
}

#[derive(Pinnable, ToDevice)]
struct Batch<T> {
    images: Tensor,
    labels: Tensor,
    masks: Option<Vec<T>>,
    extra: HashMap<String, T>,
    samples: Vec<Sample<T>>,
    pair: (Tensor, Box<T>),
    crops: [T; 2],
    ids: Vec<String>,
    step: u64,
    #[pinnable(skip)]
    tokenizer: Tokenizer,
}

#[derive(Pinnable, ToDevice)]
enum Sample<T> {
    Empty,
    Single(T),
    Pair(Tensor, T),
    Named { image: T, label: i64 },
}

fn tensor(rng: &mut SmallRng) -> Tensor {
    const DTYPES: [DType; 5] = [DType::F32, DType::I64, DType::Bool, DType::F16, DType::U8];
    let dtype = DTYPES[rng.random_range(0..DTYPES.len())];
    let shape = [rng.random_range(1..5), rng.random_range(1..7)];
    random_tensor(rng, dtype, &shape)
}

fn batch(rng: &mut SmallRng) -> Batch<Tensor> {
    let n = rng.random_range(1..4);
    Batch {
        images: random_tensor(rng, DType::F32, &[2, 3, 4, 4]),
        labels: random_tensor(rng, DType::I64, &[2]),
        masks: Some((0..n).map(|_| tensor(rng)).collect()),
        extra: (0..n).map(|i| (format!("k{i}"), tensor(rng))).collect(),
        samples: vec![
            Sample::Empty,
            Sample::Single(tensor(rng)),
            Sample::Pair(tensor(rng), tensor(rng)),
            Sample::Named {
                image: tensor(rng),
                label: rng.random(),
            },
        ],
        pair: (tensor(rng), Box::new(tensor(rng))),
        crops: [tensor(rng), tensor(rng)],
        ids: (0..n)
            .map(|i| format!("id-{i}-{}", rng.random::<u32>()))
            .collect(),
        step: rng.random(),
        tokenizer: Tokenizer {
            vocab: vec![format!("w{}", rng.random::<u16>())],
        },
    }
}

/// Every tensor of a batch, in a fixed order (map entries by key), with its path.
fn tensors(b: &Batch<Tensor>) -> Vec<(String, &Tensor)> {
    let mut out = vec![
        ("images".to_owned(), &b.images),
        ("labels".to_owned(), &b.labels),
    ];
    for (i, t) in b.masks.iter().flatten().enumerate() {
        out.push((format!("masks[{i}]"), t));
    }
    let mut keys: Vec<_> = b.extra.keys().collect();
    keys.sort();
    for k in keys {
        out.push((format!("extra[{k}]"), &b.extra[k]));
    }
    for (i, s) in b.samples.iter().enumerate() {
        match s {
            Sample::Empty => {}
            Sample::Single(t) => out.push((format!("samples[{i}].0"), t)),
            Sample::Pair(a, c) => {
                out.push((format!("samples[{i}].0"), a));
                out.push((format!("samples[{i}].1"), c));
            }
            Sample::Named { image, .. } => out.push((format!("samples[{i}].image"), image)),
        }
    }
    out.push(("pair.0".to_owned(), &b.pair.0));
    out.push(("pair.1".to_owned(), &*b.pair.1));
    out.push(("crops[0]".to_owned(), &b.crops[0]));
    out.push(("crops[1]".to_owned(), &b.crops[1]));
    out
}

/// Each tensor's path, dtype, shape and bytes.
fn snapshot(b: &Batch<Tensor>) -> Vec<(String, DType, Vec<usize>, Vec<u8>)> {
    tensors(b)
        .into_iter()
        .map(|(p, t)| (p, t.dtype(), t.shape().to_vec(), bytes_of(t)))
        .collect()
}

fn labels(samples: &[Sample<Tensor>]) -> Vec<Option<i64>> {
    samples
        .iter()
        .map(|s| match s {
            Sample::Named { label, .. } => Some(*label),
            _ => None,
        })
        .collect()
}

#[test]
fn pin_memory_round_trips_nested_generic_batch_exactly() {
    let mut rng = rng("pin_memory_round_trips_nested_generic_batch_exactly");
    let source = batch(&mut rng);
    let before = snapshot(&source);

    let pinned = source.pin_memory().unwrap();

    assert_eq!(
        snapshot(&pinned),
        before,
        "pinned values differ from the source"
    );
    for (path, t) in tensors(&pinned) {
        assert!(t.is_pinned(), "`{path}` is not pinned");
    }
    assert_eq!(snapshot(&source), before, "the source changed");
    for (path, t) in tensors(&source) {
        assert!(!t.is_pinned(), "source `{path}` became pinned");
    }
    assert_eq!(tensors(&pinned).len(), tensors(&source).len());
    assert!(matches!(pinned.samples[0], Sample::Empty));
}

#[test]
fn pin_memory_carries_plain_and_skipped_fields_unchanged() {
    let mut rng = rng("pin_memory_carries_plain_and_skipped_fields_unchanged");
    let source = batch(&mut rng);

    let pinned = source.pin_memory().unwrap();

    assert_eq!(pinned.ids, source.ids);
    assert_eq!(pinned.step, source.step);
    assert_eq!(pinned.tokenizer, source.tokenizer);
    assert_eq!(labels(&pinned.samples), labels(&source.samples));
    let mut keys: Vec<_> = pinned.extra.keys().collect();
    let mut source_keys: Vec<_> = source.extra.keys().collect();
    keys.sort();
    source_keys.sort();
    assert_eq!(keys, source_keys);
}

#[test]
fn pin_memory_of_enum_at_root_pins_the_variant_fields() {
    let mut rng = rng("pin_memory_of_enum_at_root_pins_the_variant_fields");
    let (a, b) = (tensor(&mut rng), tensor(&mut rng));
    let source: Sample<Tensor> = Sample::Pair(a, b);

    let Sample::Pair(pa, pb) = source.pin_memory().unwrap() else {
        panic!("the variant changed");
    };

    let Sample::Pair(a, b) = &source else {
        unreachable!()
    };
    assert!(pa.is_pinned() && pb.is_pinned());
    assert_eq!(bytes_of(&pa), bytes_of(a));
    assert_eq!(bytes_of(&pb), bytes_of(b));
    assert!(!a.is_pinned() && !b.is_pinned());
}

#[test]
fn to_cpu_walks_every_field_and_shares_host_tensors() {
    let mut rng = rng("to_cpu_walks_every_field_and_shares_host_tensors");
    let source = batch(&mut rng);

    let moved = source.to_device(&Device::cpu(), false).unwrap();

    assert_eq!(snapshot(&moved), snapshot(&source));
    for ((path, m), (_, s)) in tensors(&moved).into_iter().zip(tensors(&source)) {
        assert!(m.shares_storage_with(s), "`{path}` was copied, not shared");
    }
    assert_eq!(moved.ids, source.ids);
    assert_eq!(moved.tokenizer, source.tokenizer);
}

/// A labelled tensor from "another crate": pinned and moved through `#[pinnable(with)]`.
struct Labelled {
    tensor: Tensor,
    via_module: bool,
}

mod labelled {
    use super::Labelled;
    use pinnable::{MoveContext, PinContext, Pinnable, Result, ToDevice};

    pub fn pin_with(l: &Labelled, cx: &mut PinContext<'_>) -> Result<Labelled> {
        Ok(Labelled {
            tensor: l.tensor.pin_with(cx)?,
            via_module: true,
        })
    }

    pub fn to_device_with(l: &Labelled, cx: &mut MoveContext<'_>) -> Result<Labelled> {
        Ok(Labelled {
            tensor: l.tensor.to_device_with(cx)?,
            via_module: true,
        })
    }
}

mod reexport {
    pub use pinnable as renamed;
}

#[derive(Pinnable, ToDevice)]
#[pinnable(crate = reexport::renamed)]
struct WithBatch {
    #[pinnable(with = labelled)]
    labelled: Labelled,
    plain: Tensor,
}

#[test]
fn with_module_and_crate_rename_are_used_at_run_time() {
    let mut rng = rng("with_module_and_crate_rename_are_used_at_run_time");
    let source = WithBatch {
        labelled: Labelled {
            tensor: tensor(&mut rng),
            via_module: false,
        },
        plain: tensor(&mut rng),
    };

    let pinned = source.pin_memory().unwrap();
    let moved = source.to_cpu(false).unwrap();

    assert!(pinned.labelled.via_module && moved.labelled.via_module);
    assert!(pinned.labelled.tensor.is_pinned() && pinned.plain.is_pinned());
    assert_eq!(
        bytes_of(&pinned.labelled.tensor),
        bytes_of(&source.labelled.tensor)
    );
    assert_eq!(bytes_of(&pinned.plain), bytes_of(&source.plain));
    assert!(!source.labelled.via_module && !source.labelled.tensor.is_pinned());
}

/// A test double for a tensor that lives on `cuda:0` (this machine has no GPU): pinning it runs
/// the real dense-CPU check; moving it fails with the context's field-path error.
#[derive(Clone, Debug)]
struct Fake {
    dtype: &'static str,
    placement: Placement,
}

impl Fake {
    fn host() -> Fake {
        Fake {
            dtype: "f32",
            placement: Placement::Pageable,
        }
    }

    fn cuda(dtype: &'static str) -> Fake {
        Fake {
            dtype,
            placement: Placement::Cuda(0),
        }
    }
}

impl TensorMeta for Fake {
    fn dtype_name(&self) -> String {
        self.dtype.to_owned()
    }

    fn placement(&self) -> Placement {
        self.placement
    }
}

impl Pinnable for Fake {
    fn pin_with(&self, cx: &mut PinContext<'_>) -> Result<Self> {
        pinnable::dense_cpu(self, cx.path())?;
        Ok(self.clone())
    }
}

impl ToDevice for Fake {
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self> {
        match self.placement {
            Placement::Cuda(_) => Err(cx.error("fake device tensor")),
            _ => Ok(self.clone()),
        }
    }
}

fn host_batch(rng: &mut SmallRng) -> Batch<Fake> {
    Batch {
        images: tensor(rng),
        labels: tensor(rng),
        masks: Some(vec![Fake::host(); 3]),
        extra: HashMap::from([("image".to_owned(), Fake::host())]),
        samples: vec![
            Sample::Empty,
            Sample::Pair(tensor(rng), Fake::host()),
            Sample::Named {
                image: Fake::host(),
                label: 1,
            },
        ],
        pair: (tensor(rng), Box::new(Fake::host())),
        crops: [Fake::host(), Fake::host()],
        ids: vec![],
        step: 0,
        tokenizer: Tokenizer { vocab: vec![] },
    }
}

type Placer = fn(&mut Batch<Fake>);

/// Where to put the device tensor, and the path the error must name.
const DEVICE_TENSOR_AT: [(&str, Placer); 6] = [
    (r#"batch.extra["mask"]"#, |b| {
        b.extra.insert("mask".into(), Fake::cuda("i64"));
    }),
    ("batch.masks[2]", |b| {
        b.masks.as_mut().unwrap()[2] = Fake::cuda("i64")
    }),
    ("batch.samples[1]<Sample::Pair>.1", |b| {
        b.samples[1] = Sample::Pair(Tensor::from_vec1(vec![0u8]), Fake::cuda("i64"));
    }),
    ("batch.samples[2]<Sample::Named>.image", |b| {
        b.samples[2] = Sample::Named {
            image: Fake::cuda("i64"),
            label: 2,
        };
    }),
    ("batch.pair.1", |b| *b.pair.1 = Fake::cuda("i64")),
    ("batch.crops[1]", |b| b.crops[1] = Fake::cuda("i64")),
];

#[test]
fn pin_rejects_device_tensor_with_field_path() {
    let mut rng = rng("pin_rejects_device_tensor_with_field_path");
    assert!(
        host_batch(&mut rng).pin_memory().is_ok(),
        "an all-host batch must pin"
    );
    for (path, place) in DEVICE_TENSOR_AT {
        let mut b = host_batch(&mut rng);
        place(&mut b);

        let err = b
            .pin_memory()
            .err()
            .unwrap_or_else(|| panic!("`{path}` was pinned"));

        assert_eq!(
            err.to_string(),
            format!(
                "cannot pin `{path}` (i64 tensor on cuda:0): only dense CPU tensors can be pinned"
            )
        );
    }
}

#[test]
fn to_device_error_names_the_field_path() {
    let mut rng = rng("to_device_error_names_the_field_path");
    for (path, place) in DEVICE_TENSOR_AT {
        let mut b = host_batch(&mut rng);
        place(&mut b);

        let err = b
            .to_cpu(false)
            .err()
            .unwrap_or_else(|| panic!("`{path}` was moved"));

        assert_eq!(err.to_string(), format!("`{path}`: fake device tensor"));
    }
}

#[test]
fn pin_rejects_device_tensor_in_root_enum_with_variant_path() {
    let tensor = Tensor::from_vec1(vec![1.5f32]);
    let err = Sample::Pair(tensor, Fake::cuda("i64"))
        .pin_memory()
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "cannot pin `Sample::Pair.1` (i64 tensor on cuda:0): only dense CPU tensors can be pinned"
    );

    let err = Sample::Named {
        image: Fake::cuda("bf16"),
        label: 3,
    }
    .pin_memory()
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        "cannot pin `Sample::Named.image` (bf16 tensor on cuda:0): only dense CPU tensors can be pinned"
    );
}

#[derive(Pinnable)]
struct TrainBatch2D(Tensor, Vec<Fake>);

#[test]
fn root_is_the_snake_case_type_name_and_tuple_fields_are_numbered() {
    let err = TrainBatch2D(
        Tensor::from_vec1(vec![1u8]),
        vec![Fake::host(), Fake::cuda("u8")],
    )
    .pin_memory()
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        "cannot pin `train_batch2d.1[1]` (u8 tensor on cuda:0): only dense CPU tensors can be pinned"
    );
}
