//! The sources a `Loader` reads, one Python class each (all subclasses of `Source`), and the
//! settings they take (`Storage`, `Budget`, `ImageCodec`). Each holds the Rust source it wraps,
//! opened when it is made, and knows its batcher and the names of its batch's fields.

use std::sync::Arc;
use std::time::Duration;

use pinnable::formats::image::{DecodeOn, ImageBatcher, ImageCodec, ImageFolder, Transform};
use pinnable::formats::tar::{TarImageBatcher, TarNpyBatcher, TarShards};
use pinnable::formats::tokens::{PackedBatch, PackedDocs, TokenShards, TokenWindows};
use pinnable::loader::{Budget, BudgetPlan, Mix, Position, Stop};
use pinnable::storage::Storage;
use pinnable::{DType, Tensor};
use pyo3::prelude::*;
use pyo3::types::{PyMapping, PyString};

use crate::errors::{IntoPy, config_error};
use crate::loader::{AnyLoader, Named, Options, Value, erase};
use crate::rows::{PyRows, Rows, StackRows};
use crate::tensor::{from_python, parse_dtype};

/// What a source is, for the loader: its length and how to build a loader over it.
pub(crate) trait Spec: Send + Sync {
    /// Samples (documents, samples in the shards).
    fn len(&self) -> usize;

    /// A loader over the source with `options`, resuming at `resume`.
    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>>;

    /// What a `Mix` can mix it with.
    fn mixable(&self) -> Mixable;

    /// Whether the loader's workers call Python code (and so take the GIL).
    fn calls_python(&self) -> bool {
        false
    }
}

/// The sources a `Mix` takes: those of one sample type and one batcher.
pub(crate) enum Mixable {
    Rows(Rows),
    Images(Arc<ImageFolder>, ImageCodec),
    No(&'static str),
}

/// What a `Loader` reads (`pinnable::loader::Source`): one of its subclasses.
#[pyclass(name = "Source", module = "pinnable", subclass, frozen)]
pub(crate) struct PySource {
    pub(crate) spec: Arc<dyn Spec>,
}

#[pymethods]
impl PySource {
    fn __len__(&self) -> usize {
        self.spec.len()
    }
}

fn source(spec: impl Spec + 'static) -> PyClassInitializer<PySource> {
    PyClassInitializer::from(PySource {
        spec: Arc::new(spec),
    })
}

/// One path, or a sequence of them (str or `os.PathLike`).
fn locations(obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let one = |o: &Bound<'_, PyAny>| -> PyResult<String> {
        let os = o.py().import("os")?;
        os.call_method1("fspath", (o,))?.extract::<String>()
    };
    if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
        return Ok(vec![one(obj)?]);
    }
    obj.try_iter()?.map(|o| one(&o?)).collect()
}

/// Where URLs are read from and how (`pinnable::storage::Storage`).
#[pyclass(name = "Storage", module = "pinnable", frozen)]
#[derive(Clone)]
pub(crate) struct PyStorage {
    storage: Storage,
}

#[pymethods]
impl PyStorage {
    #[new]
    #[pyo3(signature = (*, options=None, chunk_size=None, read_ahead=None, cache_bytes=None, retries=None, timeout=None, threads=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        options: Option<std::collections::BTreeMap<String, String>>,
        chunk_size: Option<usize>,
        read_ahead: Option<usize>,
        cache_bytes: Option<usize>,
        retries: Option<usize>,
        timeout: Option<f64>,
        threads: Option<usize>,
    ) -> PyResult<Self> {
        let mut s = Storage::new();
        for (k, v) in options.unwrap_or_default() {
            s = s.option(k, v);
        }
        if let Some(n) = chunk_size {
            s = s.chunk_size(n);
        }
        if let Some(n) = read_ahead {
            s = s.read_ahead(n);
        }
        if let Some(n) = cache_bytes {
            s = s.cache_bytes(n);
        }
        if let Some(n) = retries {
            s = s.retries(n);
        }
        if let Some(t) = timeout {
            s = s.timeout(seconds(t, "timeout")?);
        }
        if let Some(n) = threads {
            s = s.threads(n);
        }
        Ok(PyStorage { storage: s })
    }
}

/// A duration from seconds, refusing what is not a finite positive number.
pub(crate) fn seconds(t: f64, setting: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(t)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| config_error(format!("{setting}={t} is not a positive number of seconds")))
}

fn storage(s: Option<PyRef<'_, PyStorage>>) -> Storage {
    s.map(|s| s.storage.clone()).unwrap_or_default()
}

/// Columns from Python arrays, in the mapping's order.
fn columns(
    mapping: &Bound<'_, PyAny>,
    mut value: impl FnMut(&str, &Bound<'_, PyAny>) -> PyResult<Tensor>,
) -> PyResult<Vec<(String, Tensor)>> {
    let mapping = mapping.cast::<PyMapping>().map_err(|_| {
        config_error("pass a mapping of names to arrays, e.g. {\"x\": x, \"y\": y}")
    })?;
    let mut out = Vec::new();
    for item in mapping.items()?.iter() {
        let (k, v): (String, Bound<'_, PyAny>) = item.extract()?;
        let t = value(&k, &v)?;
        out.push((k, t));
    }
    Ok(out)
}

/// Names each tensor of a batch of rows.
fn named_rows(names: &[String], tensors: Vec<Tensor>) -> Named {
    names
        .iter()
        .cloned()
        .zip(tensors.into_iter().map(Value::Tensor))
        .collect()
}

struct RowsSpec(Rows);

impl Spec for RowsSpec {
    fn len(&self) -> usize {
        pinnable::loader::Dataset::len(&self.0)
    }

    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>> {
        let names = self.0.names.clone();
        let batcher = StackRows {
            names: names.clone(),
        };
        erase(self.0.clone(), batcher, options, resume, move |b| {
            Ok(named_rows(&names, b))
        })
    }

    fn mixable(&self) -> Mixable {
        Mixable::Rows(self.0.clone())
    }
}

/// Rows of in-memory arrays (`pinnable::loader::TensorRows`, one per key), shared without a copy.
#[pyclass(name = "Arrays", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyArrays;

#[pymethods]
impl PyArrays {
    #[new]
    fn new(arrays: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let cols = columns(arrays, |_, v| from_python(v))?;
        Ok(source(RowsSpec(Rows::new(cols)?)).add_subclass(PyArrays))
    }
}

/// Rows of `.npy` files (`pinnable::formats::npy::NpyArray`, one per key), paths or URLs.
#[pyclass(name = "Npy", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyNpy;

#[pymethods]
impl PyNpy {
    #[new]
    #[pyo3(signature = (files, *, storage=None))]
    fn new(
        py: Python<'_>,
        files: &Bound<'_, PyAny>,
        storage: Option<PyRef<'_, PyStorage>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let s = self::storage(storage);
        let cols = columns(files, |_, v| {
            let path = locations(v)?;
            let [path] = &path[..] else {
                return Err(config_error("each name takes one .npy file"));
            };
            let array = py
                .detach(|| pinnable::formats::npy::NpyArray::open_with(&s, path))
                .py_err()?;
            Ok(array.tensor().clone())
        })?;
        Ok(source(RowsSpec(Rows::new(cols)?)).add_subclass(PyNpy))
    }
}

fn open_shards(py: Python<'_>, shards: &Bound<'_, PyAny>, s: &Storage) -> PyResult<TokenShards> {
    let paths = locations(shards)?;
    py.detach(|| TokenShards::open_with(s, &paths)).py_err()
}

const TOKEN_DTYPES: [DType; 2] = [DType::I64, DType::I32];

struct WindowsSpec {
    windows: Arc<TokenWindows>,
    dtype: DType,
}

impl Spec for WindowsSpec {
    fn len(&self) -> usize {
        self.windows.len()
    }

    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>> {
        let batcher = self.windows.batcher(self.dtype).py_err()?;
        erase(self.windows.clone(), batcher, options, resume, |b| {
            Ok(vec![
                ("x".into(), Value::Tensor(b.x.tensor()?)),
                ("y".into(), Value::Tensor(b.y.tensor()?)),
            ])
        })
    }

    fn mixable(&self) -> Mixable {
        Mixable::No("TokenWindows")
    }
}

/// Windows of `context + 1` tokens from token shards (`pinnable::formats::tokens::TokenWindows`).
#[pyclass(name = "TokenWindows", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyTokenWindows {
    context: usize,
}

#[pymethods]
impl PyTokenWindows {
    #[new]
    #[pyo3(signature = (shards, context, *, dtype="int64", storage=None))]
    fn new(
        py: Python<'_>,
        shards: &Bound<'_, PyAny>,
        context: usize,
        dtype: &str,
        storage: Option<PyRef<'_, PyStorage>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let dtype = parse_dtype(dtype, "dtype", &TOKEN_DTYPES)?;
        let shards = open_shards(py, shards, &self::storage(storage))?;
        let windows = TokenWindows::new(shards, context).py_err()?;
        let spec = WindowsSpec {
            windows: Arc::new(windows),
            dtype,
        };
        Ok(source(spec).add_subclass(PyTokenWindows { context }))
    }

    #[getter]
    fn context(&self) -> usize {
        self.context
    }
}

/// What a batch of documents may hold (`pinnable::loader::Budget`).
#[pyclass(name = "Budget", module = "pinnable", frozen)]
#[derive(Clone)]
pub(crate) struct PyBudget {
    budget: Budget,
}

#[pymethods]
impl PyBudget {
    /// Documents packed (best fit) into `rows` rows of `row_tokens` tokens a batch.
    #[staticmethod]
    #[pyo3(signature = (row_tokens, rows=1))]
    fn packed(row_tokens: usize, rows: usize) -> Self {
        PyBudget {
            budget: Budget::Packed { row_tokens, rows },
        }
    }

    /// Whole documents up to `max_tokens` a batch.
    #[staticmethod]
    #[pyo3(signature = (max_tokens, *, count_padding=true))]
    fn tokens(max_tokens: usize, count_padding: bool) -> Self {
        PyBudget {
            budget: Budget::Tokens {
                max_tokens,
                count_padding,
            },
        }
    }

    fn __repr__(&self) -> String {
        match self.budget {
            Budget::Packed { row_tokens, rows } => {
                format!("Budget.packed({row_tokens}, rows={rows})")
            }
            Budget::Tokens {
                max_tokens,
                count_padding,
            } => format!(
                "Budget.tokens({max_tokens}, count_padding={})",
                if count_padding { "True" } else { "False" }
            ),
            _ => format!("{:?}", self.budget),
        }
    }
}

struct PackedSpec {
    packed: Arc<PackedDocs>,
    dtype: DType,
    fixed_shape: bool,
    seq_idx: bool,
}

fn packed_fields(b: PackedBatch) -> pinnable::Result<Named> {
    let mut out: Named = vec![
        ("input_ids".into(), Value::Tensor(b.input_ids.tensor()?)),
        ("labels".into(), Value::Tensor(b.labels)),
        ("position_ids".into(), Value::Tensor(b.position_ids)),
        ("cu_seqlens".into(), Value::Tensor(b.cu_seqlens)),
    ];
    if let Some(t) = b.seq_idx {
        out.push(("seq_idx".into(), Value::Tensor(t)));
    }
    if let Some(t) = b.padding_mask {
        out.push(("padding_mask".into(), Value::Tensor(t)));
    }
    out.push(("max_seqlen".into(), Value::Int(b.max_seqlen as i64)));
    out.push(("real_tokens".into(), Value::Int(b.real_tokens as i64)));
    Ok(out)
}

impl Spec for PackedSpec {
    fn len(&self) -> usize {
        self.packed.docs().len()
    }

    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>> {
        let batcher = self
            .packed
            .batcher(self.dtype)
            .py_err()?
            .fixed_shape(self.fixed_shape)
            .seq_idx(self.seq_idx);
        erase(self.packed.clone(), batcher, options, resume, packed_fields)
    }

    fn mixable(&self) -> Mixable {
        Mixable::No("PackedDocs")
    }
}

/// Documents of token shards batched under a token budget
/// (`pinnable::formats::tokens::PackedDocs`).
#[pyclass(name = "PackedDocs", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyPackedDocs {
    batches: usize,
}

#[pymethods]
impl PyPackedDocs {
    #[new]
    #[pyo3(signature = (shards, *, eot, budget, seed=0, sort_window=None, dtype="int64", fixed_shape=false, seq_idx=true, storage=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        shards: &Bound<'_, PyAny>,
        eot: u32,
        budget: PyRef<'_, PyBudget>,
        seed: u64,
        sort_window: Option<usize>,
        dtype: &str,
        fixed_shape: bool,
        seq_idx: bool,
        storage: Option<PyRef<'_, PyStorage>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let dtype = parse_dtype(dtype, "dtype", &TOKEN_DTYPES)?;
        let budget = budget.budget;
        let shards = open_shards(py, shards, &self::storage(storage))?;
        let packed = py
            .detach(|| -> pinnable::Result<PackedDocs> {
                let docs = shards.documents(eot)?;
                match sort_window {
                    None => PackedDocs::pack(docs, budget, seed),
                    Some(n) => {
                        let plan = BudgetPlan::options(budget)
                            .sort_window(n)
                            .shuffle(seed)
                            .build(docs.lengths().clone())?;
                        PackedDocs::new(docs, plan)
                    }
                }
            })
            .py_err()?;
        let batches = packed.plan().len();
        let spec = PackedSpec {
            packed: Arc::new(packed),
            dtype,
            fixed_shape,
            seq_idx,
        };
        Ok(source(spec).add_subclass(PyPackedDocs { batches }))
    }

    #[getter]
    fn batches(&self) -> usize {
        self.batches
    }
}

const IMAGE_DTYPES: [DType; 4] = [DType::U8, DType::F32, DType::F16, DType::BF16];

/// Every image setting in one place (`pinnable::formats::image::ImageCodec`).
#[pyclass(name = "ImageCodec", module = "pinnable", frozen)]
#[derive(Clone)]
pub(crate) struct PyImageCodec {
    codec: ImageCodec,
}

#[pymethods]
impl PyImageCodec {
    #[new]
    #[pyo3(signature = (*, crop=224, resize=Some(256), random_crop=false, flip=0.0, dtype="uint8", mean=None, std=None, decode_on="auto", max_pixels=None, cpu_share=0.0, engine_threads=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        crop: usize,
        resize: Option<usize>,
        random_crop: bool,
        flip: f64,
        dtype: &str,
        mean: Option<[f32; 3]>,
        std: Option<[f32; 3]>,
        decode_on: &str,
        max_pixels: Option<usize>,
        cpu_share: f64,
        engine_threads: Option<usize>,
    ) -> PyResult<Self> {
        let dtype = parse_dtype(dtype, "dtype", &IMAGE_DTYPES)?;
        let mut t = match (random_crop, resize) {
            (true, _) => Transform::random_resized_crop(crop),
            (false, Some(r)) => Transform::resized_center_crop(r, crop),
            (false, None) => Transform::center_crop(crop),
        };
        if flip != 0.0 {
            t = t.flip(flip);
        }
        if dtype != DType::U8 || mean.is_some() || std.is_some() {
            t = t
                .normalize(dtype, mean.unwrap_or([0.0; 3]), std.unwrap_or([1.0; 3]))
                .py_err()?;
        }
        let on = match decode_on {
            "auto" => DecodeOn::Auto,
            "host" => DecodeOn::Host,
            "device" => DecodeOn::Device,
            other => {
                return Err(config_error(format!(
                    "decode_on={other:?}: use \"auto\", \"host\" or \"device\""
                )));
            }
        };
        if !(0.0..1.0).contains(&cpu_share) {
            return Err(config_error(format!(
                "cpu_share={cpu_share}: the host's share of a GPU batch is in [0, 1)"
            )));
        }
        let mut codec = ImageCodec::new(t).decode_on(on).cpu_share(cpu_share);
        if let Some(n) = max_pixels {
            codec = codec.max_pixels(n);
        }
        if let Some(n) = engine_threads {
            codec = codec.engine_threads(n);
        }
        Ok(PyImageCodec { codec })
    }

    /// The JPEG decoder that makes batches for `device` and why
    /// (`pinnable::formats::image::ImageCodec::chosen`): the GPU's engines, nvJPEG's CUDA
    /// backend, or the host, with the library found or what was missing.
    #[pyo3(signature = (device=None))]
    fn decoder(&self, py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
        let device = crate::loader::parse_device(device)?;
        Ok(py.detach(|| self.codec.chosen(&device).to_string()))
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.codec)
    }
}

fn codec(c: Option<PyRef<'_, PyImageCodec>>) -> ImageCodec {
    c.map(|c| c.codec.clone()).unwrap_or_default()
}

fn image_fields(b: (Tensor, Tensor)) -> pinnable::Result<Named> {
    Ok(vec![
        ("images".into(), Value::Tensor(b.0)),
        ("labels".into(), Value::Tensor(b.1)),
    ])
}

struct FolderSpec {
    folder: Arc<ImageFolder>,
    codec: ImageCodec,
}

impl Spec for FolderSpec {
    fn len(&self) -> usize {
        self.folder.len()
    }

    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>> {
        let batcher = ImageBatcher::new(self.codec.clone());
        erase(self.folder.clone(), batcher, options, resume, image_fields)
    }

    fn mixable(&self) -> Mixable {
        Mixable::Images(self.folder.clone(), self.codec.clone())
    }
}

/// A folder with one sub-folder of pictures per class (`pinnable::formats::image::ImageFolder`).
#[pyclass(name = "ImageFolder", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyImageFolder {
    classes: Vec<String>,
}

#[pymethods]
impl PyImageFolder {
    #[new]
    #[pyo3(signature = (root, codec=None, *, storage=None))]
    fn new(
        py: Python<'_>,
        root: &Bound<'_, PyAny>,
        codec: Option<PyRef<'_, PyImageCodec>>,
        storage: Option<PyRef<'_, PyStorage>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let root = locations(root)?;
        let [root] = &root[..] else {
            return Err(config_error("ImageFolder takes one folder"));
        };
        let s = self::storage(storage);
        let folder = py.detach(|| ImageFolder::open_with(&s, root)).py_err()?;
        let classes = folder.classes().to_vec();
        let spec = FolderSpec {
            folder: Arc::new(folder),
            codec: self::codec(codec),
        };
        Ok(source(spec).add_subclass(PyImageFolder { classes }))
    }

    #[getter]
    fn classes(&self) -> Vec<String> {
        self.classes.clone()
    }
}

enum TarFields {
    Images(ImageCodec, String),
    Npy(String, Option<String>),
}

struct TarSpec {
    shards: Arc<TarShards>,
    fields: TarFields,
}

impl Spec for TarSpec {
    fn len(&self) -> usize {
        self.shards.len()
    }

    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>> {
        match &self.fields {
            TarFields::Images(codec, label) => {
                let batcher = TarImageBatcher::new(codec.clone()).label(label);
                erase(self.shards.clone(), batcher, options, resume, image_fields)
            }
            TarFields::Npy(ext, label) => {
                let mut batcher = TarNpyBatcher::new(ext);
                if let Some(l) = label {
                    batcher = batcher.label(l);
                }
                let (ext, label) = (ext.clone(), label.clone());
                erase(
                    self.shards.clone(),
                    batcher,
                    options,
                    resume,
                    move |(x, y)| {
                        let mut out = vec![(ext.clone(), Value::Tensor(x))];
                        if let (Some(name), Some(y)) = (&label, y) {
                            out.push((name.clone(), Value::Tensor(y)));
                        }
                        Ok(out)
                    },
                )
            }
        }
    }

    fn mixable(&self) -> Mixable {
        Mixable::No("TarShards")
    }
}

/// WebDataset tar shards, paths or URLs (`pinnable::formats::tar::TarShards`).
#[pyclass(name = "TarShards", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyTarShards;

const PICTURES: [&str; 3] = ["jpg", "jpeg", "png"];

#[pymethods]
impl PyTarShards {
    #[new]
    #[pyo3(signature = (shards, *, codec=None, image=None, label=Some("cls".to_owned()), npy=None, shuffle_buffer=None, storage=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        shards: &Bound<'_, PyAny>,
        codec: Option<PyRef<'_, PyImageCodec>>,
        image: Option<String>,
        label: Option<String>,
        npy: Option<String>,
        shuffle_buffer: Option<usize>,
        storage: Option<PyRef<'_, PyStorage>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let fields = match npy {
            Some(ext) => {
                if codec.is_some() || image.is_some() {
                    return Err(config_error(
                        "npy= reads arrays; codec= and image= are for pictures: give one or the other",
                    ));
                }
                TarFields::Npy(ext, label)
            }
            None => {
                if let Some(ext) = &image
                    && !PICTURES.contains(&ext.to_lowercase().as_str())
                {
                    return Err(config_error(format!(
                        "image={ext:?}: pictures are read from {PICTURES:?} members (the first one \
                         a sample has); for arrays use npy="
                    )));
                }
                let Some(label) = label else {
                    return Err(config_error(
                        "pictures need labels: give label= the extension of the label members \
                         (\"cls\" by default)",
                    ));
                };
                TarFields::Images(self::codec(codec), label)
            }
        };
        let patterns = locations(shards)?;
        let s = self::storage(storage);
        let mut tar = py.detach(|| TarShards::open_with(&s, &patterns)).py_err()?;
        if let Some(n) = shuffle_buffer {
            tar = tar.shuffle_buffer(n);
        }
        let spec = TarSpec {
            shards: Arc::new(tar),
            fields,
        };
        Ok(source(spec).add_subclass(PyTarShards))
    }
}

enum MixSpec {
    Rows(Arc<Mix<Rows>>, crate::rows::Names, usize),
    Images(Arc<Mix<Arc<ImageFolder>>>, ImageCodec, usize),
}

impl Spec for MixSpec {
    fn len(&self) -> usize {
        match self {
            MixSpec::Rows(.., n) | MixSpec::Images(.., n) => *n,
        }
    }

    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>> {
        match self {
            MixSpec::Rows(mix, names, _) => {
                let batcher = StackRows {
                    names: names.clone(),
                };
                let names = names.clone();
                erase(mix.clone(), batcher, options, resume, move |b| {
                    Ok(named_rows(&names, b))
                })
            }
            MixSpec::Images(mix, codec, _) => {
                let batcher = ImageBatcher::new(codec.clone());
                erase(mix.clone(), batcher, options, resume, image_fields)
            }
        }
    }

    fn mixable(&self) -> Mixable {
        Mixable::No("Mix")
    }
}

fn mix_of<D: pinnable::loader::Dataset>(
    sources: Vec<(D, f64)>,
    per_batch: bool,
    stop: Stop,
) -> PyResult<Mix<D>> {
    let mix = if per_batch {
        let counts = sources
            .into_iter()
            .map(|(d, w)| {
                if w.fract() != 0.0 || w < 1.0 {
                    return Err(config_error(format!(
                        "per_batch=True takes whole counts of samples per batch; {w} is not one"
                    )));
                }
                Ok((d, w as usize))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Mix::per_batch(counts)
    } else {
        Mix::weighted(sources)
    };
    mix.and_then(|m| m.stop(stop)).py_err()
}

/// Several sources of one kind read as one, in set proportions (`pinnable::loader::Mix`).
#[pyclass(name = "Mix", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyMix;

#[pymethods]
impl PyMix {
    #[new]
    #[pyo3(signature = (sources, *, per_batch=false, stop="all_exhausted"))]
    fn new(
        sources: Vec<(PyRef<'_, PySource>, f64)>,
        per_batch: bool,
        stop: &str,
    ) -> PyResult<PyClassInitializer<Self>> {
        let stop = match stop {
            "all_exhausted" => Stop::AllExhausted,
            "first_exhausted" => Stop::FirstExhausted,
            "each_once" => Stop::EachOnce,
            other => {
                return Err(config_error(format!(
                    "stop={other:?}: use \"all_exhausted\", \"first_exhausted\" or \"each_once\""
                )));
            }
        };
        let parts: Vec<(Mixable, f64)> = sources
            .iter()
            .map(|(s, w)| (s.spec.mixable(), *w))
            .collect();
        let spec = match parts.first() {
            None => return Err(config_error("a Mix needs at least one source")),
            Some((Mixable::Rows(first), _)) => {
                let names = first.names.clone();
                let rows = parts
                    .into_iter()
                    .enumerate()
                    .map(|(i, (m, w))| match m {
                        Mixable::Rows(r) if r.names == names => Ok((r, w)),
                        Mixable::Rows(r) => Err(config_error(format!(
                            "source {i} has fields {:?} and source 0 {:?}: mixed sources need \
                             the same fields",
                            r.names, names
                        ))),
                        _ => Err(config_error(format!(
                            "source {i} is not arrays like source 0: a Mix reads sources of \
                             one kind"
                        ))),
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                let mix = mix_of(rows, per_batch, stop)?;
                let n = pinnable::loader::Dataset::len(&mix);
                MixSpec::Rows(Arc::new(mix), names, n)
            }
            Some((Mixable::Images(_, codec), _)) => {
                let codec = codec.clone();
                let folders = parts
                    .into_iter()
                    .enumerate()
                    .map(|(i, (m, w))| match m {
                        Mixable::Images(f, c) if format!("{c:?}") == format!("{codec:?}") => {
                            Ok((f, w))
                        }
                        Mixable::Images(..) => Err(config_error(format!(
                            "source {i} has another ImageCodec than source 0: the images of a \
                             Mix are made with one codec"
                        ))),
                        _ => Err(config_error(format!(
                            "source {i} is not an image folder like source 0: a Mix reads \
                             sources of one kind"
                        ))),
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                let mix = mix_of(folders, per_batch, stop)?;
                let n = pinnable::loader::Dataset::len(&mix);
                MixSpec::Images(Arc::new(mix), codec, n)
            }
            Some((Mixable::No(kind), _)) => {
                return Err(config_error(format!(
                    "a Mix reads Arrays, Npy or ImageFolder sources; {kind} is not one (mix the \
                     files in one source instead)"
                )));
            }
        };
        Ok(source(spec).add_subclass(PyMix))
    }
}

struct PythonSpec(Arc<PyRows>);

impl Spec for PythonSpec {
    fn len(&self) -> usize {
        pinnable::loader::Dataset::len(&*self.0)
    }

    fn loader(&self, options: &Options, resume: Option<Position>) -> PyResult<Box<dyn AnyLoader>> {
        let names = self.0.names.clone();
        let batcher = StackRows {
            names: names.clone(),
        };
        erase(self.0.clone(), batcher, options, resume, move |b| {
            Ok(named_rows(&names, b))
        })
    }

    fn mixable(&self) -> Mixable {
        Mixable::No("Dataset")
    }

    fn calls_python(&self) -> bool {
        true
    }
}

/// A dataset written in Python (`pinnable::loader::Dataset` implemented by the object).
#[pyclass(name = "Dataset", module = "pinnable", extends = PySource, frozen)]
pub(crate) struct PyDataset;

#[pymethods]
impl PyDataset {
    #[new]
    fn new(dataset: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let rows = PyRows::new(dataset)?;
        Ok(source(PythonSpec(Arc::new(rows))).add_subclass(PyDataset))
    }
}

/// Adds the source classes and their settings to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySource>()?;
    m.add_class::<PyStorage>()?;
    m.add_class::<PyArrays>()?;
    m.add_class::<PyNpy>()?;
    m.add_class::<PyTokenWindows>()?;
    m.add_class::<PyBudget>()?;
    m.add_class::<PyPackedDocs>()?;
    m.add_class::<PyImageCodec>()?;
    m.add_class::<PyImageFolder>()?;
    m.add_class::<PyTarShards>()?;
    m.add_class::<PyMix>()?;
    m.add_class::<PyDataset>()?;
    Ok(())
}
