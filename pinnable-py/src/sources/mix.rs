//! `Mix`: sources of one kind read as one, in set proportions.

use super::arrays::rows_loader;
use super::images::image_fields;
use super::*;

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
            MixSpec::Rows(mix, names, _) => rows_loader(mix.clone(), names, options, resume),
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
        let stop = pick(
            "stop",
            stop,
            &[
                ("all_exhausted", Stop::AllExhausted),
                ("first_exhausted", Stop::FirstExhausted),
                ("each_once", Stop::EachOnce),
            ],
        )?;
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
