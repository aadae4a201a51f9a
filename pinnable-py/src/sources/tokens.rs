//! Token shards: `TokenWindows`, and documents batched under a `Budget` (`PackedDocs`).

use super::*;

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
