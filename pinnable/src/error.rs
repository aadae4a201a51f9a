//! The one error type of the crate, and the names of the driver result codes it reports.

use std::path::Path;
use std::time::Duration;

/// A specialized `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while pinning or moving a batch.
///
/// Each variant carries the facts a caller needs to act on it: the field path
/// inside the batch, the bytes involved, the budget, the driver's result code.
///
/// Code called by the crate (a [`Dataset`](crate::loader::Dataset)'s `get`, a batcher, an
/// impl of the traits) raises its own failures with `?`: a [`std::io::Error`] converts into
/// [`Error::Io`], and [`Error::other`] wraps any other error, which stays reachable through
/// [`std::error::Error::source`].
///
/// `Debug` prints the variant's name and the same words as `Display`, so `?` in `main` shows
/// the advice too:
///
/// ```
/// let err = pinnable::Error::from(std::io::Error::other("disk on fire"));
/// assert_eq!(format!("{err:?}"), "Io: input/output failed: disk on fire");
/// ```
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor that is not dense CPU data was asked to be pinned.
    #[error(
        "cannot pin `{path}` ({dtype} tensor on {placement}): only dense CPU tensors can be pinned"
    )]
    NotDenseCpu {
        /// Where the tensor sits in the batch, e.g. `batch.extra["mask"]`.
        path: String,
        /// The tensor's element type, e.g. `i64`.
        dtype: String,
        /// Where the tensor lives, e.g. `cuda:0`, or its layout when that is the problem.
        placement: String,
    },

    /// No CUDA driver, no device, or the device ordinal does not exist.
    #[error(
        "CUDA is unavailable: {reason}; to run without a GPU, use `Device::cpu()` \
         (batches stay pinned in host memory)"
    )]
    CudaUnavailable {
        /// Why, in words: the driver library was not found, no device is visible, ...
        reason: String,
    },

    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed with {name} ({code}){}", at(path))]
    Driver {
        /// The driver function, e.g. `cuMemcpyHtoDAsync`.
        call: &'static str,
        /// The `CUresult` name, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`.
        name: String,
        /// The numeric `CUresult`.
        code: u32,
        /// The field being worked on, when there was one.
        path: Option<String>,
    },

    /// The device has too little free memory for the whole batch; nothing was copied.
    #[error(
        "out of memory on {device}: the batch needs {requested} bytes and {free} are free; \
         nothing was copied and the source is intact (move a smaller batch, or free device memory)"
    )]
    DeviceOutOfMemory {
        /// The device, e.g. `cuda:0`.
        device: String,
        /// Bytes the whole batch needs on the device (one allocation).
        requested: usize,
        /// Bytes the driver reported free when the allocation failed.
        free: usize,
    },

    /// Page-locking host memory failed because of the `RLIMIT_MEMLOCK` limit.
    #[error(
        "cannot page-lock {requested} bytes: the locked-memory limit (`ulimit -l`) is {limit}; \
         raise it (e.g. `ulimit -l unlimited`, or `memlock` in /etc/security/limits.conf) \
         or pin less at once"
    )]
    MemlockLimit {
        /// Bytes that were to be locked.
        requested: usize,
        /// The soft limit in force, in words (`65536 bytes`, `unlimited`).
        limit: String,
    },

    /// The operating system refused host memory.
    #[error("cannot allocate {requested} bytes of host memory: {source}")]
    HostAlloc {
        /// Bytes asked for.
        requested: usize,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// A pinned pool's byte budget would be exceeded, even after waiting.
    #[error(
        "pinned memory budget exceeded: {requested} bytes requested, {in_use} in use, \
         budget {budget} bytes (waited {waited:?}); drop pinned tensors sooner, raise \
         `PoolConfig::max_bytes`, or lengthen `PoolConfig::wait`"
    )]
    BudgetExceeded {
        /// Bytes asked for (after size-class rounding).
        requested: usize,
        /// Bytes handed out and not yet returned.
        in_use: usize,
        /// The pool's `max_bytes`.
        budget: usize,
        /// How long the request waited for memory to be returned.
        waited: Duration,
    },

    /// A shape, a length or a view does not fit the data.
    #[error("invalid shape: {0}")]
    Shape(String),

    /// A tensor was read as an element type it does not hold.
    #[error("dtype mismatch: the tensor holds {actual}, not {requested}")]
    DTypeMismatch {
        /// The tensor's element type.
        actual: crate::DType,
        /// The element type asked for.
        requested: crate::DType,
    },

    /// The operation needs the tensor somewhere else (e.g. host data read from a device tensor).
    #[error("`{op}` needs {needs}, but the tensor is on {placement}")]
    WrongPlacement {
        /// The operation, e.g. `to_vec`.
        op: &'static str,
        /// What it needs, e.g. `a host tensor`.
        needs: &'static str,
        /// Where the tensor is.
        placement: String,
    },

    /// The operation writes a tensor in place, but a clone or view shares its storage and would
    /// see the write.
    #[error(
        "`{op}` writes in place, but {tensors} tensors share this {placement} tensor's storage \
         (clones or views of it); drop the others first, or write into a tensor of its own"
    )]
    Shared {
        /// The operation, e.g. `cuda_view_mut`.
        op: &'static str,
        /// How many tensors share the storage, this one included.
        tensors: usize,
        /// Where the tensor is, e.g. `cuda:0`.
        placement: String,
    },

    /// A value of another library (an ndarray, a DLPack tensor, burn's `TensorData`) has no
    /// counterpart here, or ours none there.
    #[error("{library}: {message}")]
    Interop {
        /// The other side: `dlpack`, `burn`, ...
        library: &'static str,
        /// What has no counterpart and what to do instead.
        message: String,
    },

    /// An error raised by a user's or a library author's own impl, with the field path.
    #[error("`{path}`: {message}")]
    Field {
        /// Where in the batch.
        path: String,
        /// What went wrong.
        message: String,
    },

    /// A sample of a dataset could not be loaded or collated. The loader delivers it in the
    /// place of the batch the sample belongs to, and then ends the epoch.
    #[error("sample {index} failed while {during}: {source}")]
    Sample {
        /// The sample's index in the dataset (its position in the stream for a stream source).
        index: usize,
        /// `loading` (the dataset's `get`), `collating` (building the batch) or `writing in
        /// place` (the sample writing its own row, e.g. an image decoded into the batch).
        during: &'static str,
        /// What went wrong, with its own field path where it has one.
        source: Box<Error>,
    },

    /// User code called by the loader (a dataset's `get`, a batcher) or one of its threads
    /// panicked; the epoch was stopped.
    #[error("{what} panicked: {message}")]
    Panicked {
        /// Which code, e.g. `the batcher (batch 3)`.
        what: String,
        /// The panic's message, when it was a string.
        message: String,
    },

    /// A sample's `get` ran past the loader's
    /// [`sample_timeout`](crate::loader::LoaderBuilder::sample_timeout): the epoch ended with
    /// this error, and the worker, still inside the call, was left to finish it on its own
    /// (the loader joins it once it returns); the next epoch runs with every worker.
    #[error(
        "sample {index} timed out: worker {worker} has waited {waited:?} in the dataset's `get` \
         (the limit is {timeout:?}); the epoch ended, and the worker is left to finish the call; \
         find out what holds that sample up, or raise `sample_timeout`"
    )]
    Timeout {
        /// The sample's index in the dataset.
        index: usize,
        /// The worker thread loading it (`loader-w{worker}`).
        worker: usize,
        /// How long the call had run when the loader gave up on it.
        waited: Duration,
        /// The loader's limit.
        timeout: Duration,
    },

    /// An index past the end of a dataset.
    #[error("index {index} is out of range for a dataset of {len} samples")]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// The dataset's length.
        len: usize,
    },

    /// A loader setting that cannot work (a batch size of 0, a rank outside the world, ...).
    #[error("invalid loader setting `{setting}`: {problem}")]
    Config {
        /// The setting, e.g. `batch_size`.
        setting: &'static str,
        /// What is wrong with it and what to do.
        problem: String,
    },

    /// A variable that data-parallel launchers set (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`) is
    /// missing or malformed.
    #[error("launcher variable {variable}: {problem}")]
    Launcher {
        /// The variable, e.g. `WORLD_SIZE`.
        variable: &'static str,
        /// What is wrong with it and what to do.
        problem: String,
    },

    /// An image file that cannot be read or decoded (the `image` feature).
    #[error("cannot decode image `{path}`: {problem}")]
    Image {
        /// The file.
        path: String,
        /// What is wrong: the decoder's words, a truncation, a size over the limit, ...
        problem: String,
    },

    /// A folder that cannot serve as an image dataset (the `image` feature).
    #[error("cannot use `{path}` as an image folder: {problem}")]
    ImageFolder {
        /// The folder (or the class folder at fault).
        path: String,
        /// What is wrong and what to do.
        problem: String,
    },

    /// A file that cannot be read as a `.npy` array.
    #[error("cannot load `{path}` as a .npy array: {problem}")]
    Npy {
        /// The file.
        path: String,
        /// What is wrong and what to do.
        problem: String,
    },

    /// A file that cannot be read as a shard of tokens (raw, llm.c's format or `.npy`).
    #[error("cannot read token shard `{path}`: {field}: {problem}")]
    TokenShard {
        /// The file.
        path: String,
        /// The part of the file that is wrong, e.g. `header[1] (version)` or `file size`.
        field: String,
        /// What is wrong and what to do.
        problem: String,
    },

    /// A file or object that cannot be read: a local file that cannot be opened, a URL that
    /// cannot be reached or is refused, a URL without the `remote` feature.
    #[error("cannot read `{name}`: {problem}")]
    Storage {
        /// The path or URL.
        name: String,
        /// What is wrong and what to do.
        problem: String,
    },

    /// A tar shard (a WebDataset archive) that cannot be read: a damaged or truncated header,
    /// a member running past the end of the file, a sample with one extension twice.
    #[error("cannot read tar shard `{shard}` at byte {offset}: {problem}")]
    Tar {
        /// The shard: its path or URL.
        shard: String,
        /// The byte offset in the shard of the header or member that is wrong.
        offset: u64,
        /// What is wrong and what to do.
        problem: String,
    },

    /// A loader position (from [`Position::from_bytes`](crate::loader::Position::from_bytes)
    /// or its string form) that cannot be read.
    #[error("cannot read a loader position: {problem}")]
    Position {
        /// What is wrong with it.
        problem: String,
    },

    /// A position saved by a loader whose settings differ from this one's: resuming from it
    /// would deliver other batches than the interrupted run would have.
    #[error(
        "cannot resume from this position: it was saved by a loader with {setting} {saved}, \
         and this loader has {current}; build the loader as the run that saved it was built"
    )]
    Resume {
        /// The setting that differs: `dataset length`, `batch size`, `world size`, `rank`,
        /// `seed`, `drop_last`, or `batch` for a position past the end of its epoch.
        setting: &'static str,
        /// Its value in the position.
        saved: String,
        /// Its value in this loader.
        current: String,
    },

    /// Reading or writing a file (or another operating-system stream) failed. `?` on a
    /// [`std::io::Error`] gives this variant without a path; [`Error::io`] names the file.
    #[error("input/output failed{}: {source}", on(path))]
    Io {
        /// The file, when the caller named it.
        path: Option<String>,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// A failure of the caller's own code (a dataset, a batcher, an impl of the traits) that
    /// has no variant here, made by [`Error::other`]. The original error is the
    /// [`source`](std::error::Error::source), to downcast.
    #[error("{source}")]
    Other {
        /// The caller's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// An API was called in a way it does not allow (a handle of another batch, a call in the
    /// wrong order); a bug in the calling code, not a problem with the data.
    #[error("`{call}` was misused: {problem}")]
    Misuse {
        /// The method, e.g. `Collated::view_mut`.
        call: &'static str,
        /// What was wrong and what to do instead.
        problem: String,
    },
}

impl std::fmt::Debug for Error {
    /// The variant's name, then the `Display` text: what went wrong and what to do, as a
    /// `Result` returned from `main` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {self}", self.variant())
    }
}

fn on(path: &Option<String>) -> String {
    match path {
        Some(p) => format!(" on `{p}`"),
        None => String::new(),
    }
}

fn at(path: &Option<String>) -> String {
    match path {
        Some(p) => format!(" while copying `{p}`"),
        None => String::new(),
    }
}

impl Error {
    /// Wraps an error of the caller's own (a parser's, a network client's, a message) as
    /// [`Error::Other`], keeping it as the [`source`](std::error::Error::source).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::error::Error as _;
    ///
    /// fn parse(text: &str) -> pinnable::Result<u32> {
    ///     text.trim().parse::<u32>().map_err(pinnable::Error::other)
    /// }
    ///
    /// let err = parse("twelve").unwrap_err();
    /// assert_eq!(err.to_string(), "invalid digit found in string");
    /// assert!(err.source().unwrap().is::<std::num::ParseIntError>());
    /// ```
    pub fn other<E>(error: E) -> Self
    where
        E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    {
        Error::Other {
            source: error.into(),
        }
    }

    /// An [`Error::Io`] that names the file it happened on.
    ///
    /// # Examples
    ///
    /// ```
    /// let path = "no/such/file.bin";
    /// let err = std::fs::read(path).map_err(|e| pinnable::Error::io(path, e)).unwrap_err();
    /// assert!(err.to_string().starts_with("input/output failed on `no/such/file.bin`: "));
    /// ```
    pub fn io(path: impl AsRef<Path>, error: std::io::Error) -> Self {
        Error::Io {
            path: Some(path.as_ref().display().to_string()),
            source: error,
        }
    }

    /// The variant's name, as `Debug` prints it.
    fn variant(&self) -> &'static str {
        match self {
            Error::NotDenseCpu { .. } => "NotDenseCpu",
            Error::CudaUnavailable { .. } => "CudaUnavailable",
            Error::Driver { .. } => "Driver",
            Error::DeviceOutOfMemory { .. } => "DeviceOutOfMemory",
            Error::MemlockLimit { .. } => "MemlockLimit",
            Error::HostAlloc { .. } => "HostAlloc",
            Error::BudgetExceeded { .. } => "BudgetExceeded",
            Error::Shape(_) => "Shape",
            Error::DTypeMismatch { .. } => "DTypeMismatch",
            Error::WrongPlacement { .. } => "WrongPlacement",
            Error::Shared { .. } => "Shared",
            Error::Interop { .. } => "Interop",
            Error::Field { .. } => "Field",
            Error::Sample { .. } => "Sample",
            Error::Panicked { .. } => "Panicked",
            Error::Timeout { .. } => "Timeout",
            Error::IndexOutOfRange { .. } => "IndexOutOfRange",
            Error::Config { .. } => "Config",
            Error::Launcher { .. } => "Launcher",
            Error::Image { .. } => "Image",
            Error::ImageFolder { .. } => "ImageFolder",
            Error::Npy { .. } => "Npy",
            Error::TokenShard { .. } => "TokenShard",
            Error::Storage { .. } => "Storage",
            Error::Tar { .. } => "Tar",
            Error::Position { .. } => "Position",
            Error::Resume { .. } => "Resume",
            Error::Io { .. } => "Io",
            Error::Other { .. } => "Other",
            Error::Misuse { .. } => "Misuse",
        }
    }

    /// Builds a [`Error::Driver`] from a cudarc driver error without touching its `Debug`
    /// (which itself calls into the driver).
    pub(crate) fn driver(call: &'static str, err: cudarc::driver::DriverError) -> Self {
        let code = err.0 as u32;
        Error::Driver {
            call,
            name: result_name(err.0),
            code,
            path: None,
        }
    }

    /// Attaches a field path to errors that do not carry one yet.
    pub(crate) fn at_path(mut self, path: &str) -> Self {
        if let Error::Driver { path: p @ None, .. } = &mut self {
            *p = Some(path.to_owned());
        }
        self
    }
}

impl From<std::io::Error> for Error {
    /// An [`Error::Io`] without a path, for `?` on `std::fs` and `std::io` calls; use
    /// [`Error::io`] to name the file.
    fn from(error: std::io::Error) -> Self {
        Error::Io {
            path: None,
            source: error,
        }
    }
}

/// The name of a `CUresult`, e.g. `CUDA_ERROR_OUT_OF_MEMORY`, read without calling the driver.
pub(crate) fn result_name(code: cudarc::driver::sys::CUresult) -> String {
    format!("{code:?}")
}
