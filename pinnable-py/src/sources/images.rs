//! Pictures: `ImageCodec`, and the containers it decodes from (`ImageFolder`, `TarShards`).

use super::*;

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
        let on = pick(
            "decode_on",
            decode_on,
            &[
                ("auto", DecodeOn::Auto),
                ("host", DecodeOn::Host),
                ("device", DecodeOn::Device),
            ],
        )?;
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
        let device = crate::loader::parse_device(py, device)?;
        Ok(py.detach(|| self.codec.chosen(&device).to_string()))
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.codec)
    }
}

fn codec(c: Option<PyRef<'_, PyImageCodec>>) -> ImageCodec {
    c.map(|c| c.codec.clone()).unwrap_or_default()
}

pub(super) fn image_fields(b: (Tensor, Tensor)) -> pinnable::Result<Named> {
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
