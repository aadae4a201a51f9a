"""Type stubs of pinnable's Python package (the native module `pinnable._pinnable`).

Every class wraps one item of the Rust crate `pinnable`, named in its docstring.
"""

from collections.abc import Iterator, Mapping, Sequence
from os import PathLike
from typing import Any, Literal

__version__: str

StrPath = str | PathLike[str]
Batch = dict[str, Any]
"""A batch: tensor fields (``torch.Tensor``, ``numpy.ndarray`` or :class:`Tensor`, as the loader's
``output`` says) and, for packed documents, two host integers (``max_seqlen``, ``real_tokens``)."""

class Error(RuntimeError):
    """An error of the Rust crate (`pinnable::Error`): its message, with the field path, file
    and byte offset where the crate names them."""

class ConfigError(Error, ValueError):
    """A setting refused (`Error::Config`), or a saved position that does not match the loader
    (`Error::Resume`), naming the setting."""

def cuda_available() -> bool:
    """Whether a CUDA device can be used (`pinnable::Device::is_available`)."""

def device_count() -> int:
    """The CUDA devices there are (`pinnable::Device::count`); 0 without a driver."""

class Tensor:
    """One tensor of a batch (`pinnable::Tensor`), pinned on the host or on a CUDA device, handed
    to any DLPack consumer without a copy (``torch.from_dlpack``, ``numpy.from_dlpack``, CuPy,
    JAX). Batches hold these when the loader's ``output`` is ``"dlpack"``."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str:
        """``"float32"``, ``"int64"``, ``"uint8"``, ... (NumPy's names)."""
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    @property
    def data_ptr(self) -> int:
        """The address of the first element: what ``torch.Tensor.data_ptr()`` of the consumer's
        tensor equals."""
    @property
    def is_pinned(self) -> bool: ...
    @property
    def nbytes(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule (``dltensor_versioned`` when ``max_version >= (1, 0)``, else
        ``dltensor``). For a CUDA tensor, ``stream`` is the consumer's stream (1: the legacy
        default stream, 2: the per-thread default stream, else a ``cudaStream_t``): it is made to
        wait for the copy that fills the tensor, without a host synchronisation, and the memory
        is reused only after the work queued on it when the consumer frees the tensor. That
        stream must outlive the consumer's tensor (torch's streams do; destroy your own only
        after freeing what you made under it). A copy (``copy=True``), another device,
        ``stream=-1`` or another negative stream are refused (``BufferError``)."""
    def __dlpack_device__(self) -> tuple[int, int]: ...

class Storage:
    """Where URLs are read from and how (`pinnable::storage::Storage`): options of the object
    store (``"aws_endpoint"``, ``"aws_region"``, ``"aws_access_key_id"``, ``"allow_http"``, ...),
    chunk size, read-ahead, memory cap, retries, timeout and receiving threads. Paths need
    none of it. ``None`` keeps the crate's default: the read-ahead grows from 4 chunks while
    the workers wait for data (within ``cache_bytes``), and the receiving threads are half the
    cores, 2 to 8; a number fixes it."""

    def __init__(
        self,
        *,
        options: Mapping[str, str] | None = None,
        chunk_size: int | None = None,
        read_ahead: int | None = None,
        cache_bytes: int | None = None,
        retries: int | None = None,
        timeout: float | None = None,
        threads: int | None = None,
    ) -> None: ...

class Source:
    """What a :class:`Loader` reads (`pinnable::loader::Source`): one of the classes below."""

    def __len__(self) -> int:
        """Samples (documents for packed documents, samples in the shards for tar)."""

class Arrays(Source):
    """Rows of in-memory arrays (`pinnable::loader::TensorRows`, one per key): NumPy arrays or
    CPU torch tensors with the same first dimension, shared without a copy through DLPack
    (a C-contiguous or strided array; kept alive while the loader lives). Batch keys are the
    mapping's keys, each ``[batch, *row_shape]``."""

    def __init__(self, arrays: Mapping[str, Any]) -> None: ...

class Npy(Source):
    """Rows of ``.npy`` files (`pinnable::formats::npy::NpyArray`, one per key), from paths or
    URLs. Batch keys are the mapping's keys."""

    def __init__(self, files: Mapping[str, StrPath], *, storage: Storage | None = None) -> None: ...

class TokenWindows(Source):
    """Windows of ``context + 1`` tokens from token shards (nanoGPT ``.bin`` of uint16, llm.c
    ``.bin``, ``.npy``), paths or URLs (`pinnable::formats::tokens::TokenWindows`). Batch:
    ``x`` and ``y`` (``y`` one token later), ``[batch, context]`` of ``dtype``; on a GPU only the
    shard's own tokens cross the link and are widened there."""

    def __init__(
        self,
        shards: StrPath | Sequence[StrPath],
        context: int,
        *,
        dtype: Literal["int64", "int32"] = "int64",
        storage: Storage | None = None,
    ) -> None: ...
    @property
    def context(self) -> int: ...

class Budget:
    """What a batch of documents may hold (`pinnable::loader::Budget`)."""

    @staticmethod
    def packed(row_tokens: int, rows: int = 1) -> Budget:
        """Documents packed (best fit) into ``rows`` rows of ``row_tokens`` tokens a batch."""
    @staticmethod
    def tokens(max_tokens: int, *, count_padding: bool = True) -> Budget:
        """Whole documents up to ``max_tokens`` a batch (with ``count_padding``: the longest
        document times their number)."""

class PackedDocs(Source):
    """Documents of token shards, cut after each ``eot`` token, batched under a token budget
    (`pinnable::formats::tokens::PackedDocs`, planned by `BudgetPlan`): the source cuts its own
    batches (no ``batch_size``), the same batches on every rank and epoch count. Batch:
    ``input_ids``, ``labels`` (-100 where a document ends), ``position_ids`` ``[1, total]`` of
    ``dtype``, ``cu_seqlens`` int32 ``[documents + 1]``, ``seq_idx`` int32 ``[1, total]`` (each
    token's document; ``seq_idx=False`` leaves it out), ``max_seqlen`` and ``real_tokens``
    (ints); with
    ``fixed_shape=True`` every batch ``[1, rows * row_tokens]`` plus ``padding_mask`` uint8."""

    def __init__(
        self,
        shards: StrPath | Sequence[StrPath],
        *,
        eot: int,
        budget: Budget,
        seed: int = 0,
        sort_window: int | None = None,
        dtype: Literal["int64", "int32"] = "int64",
        fixed_shape: bool = False,
        seq_idx: bool = True,
        storage: Storage | None = None,
    ) -> None: ...
    @property
    def batches(self) -> int:
        """Batches an epoch holds (all ranks together)."""

class ImageCodec:
    """Every image setting in one place (`pinnable::formats::image::ImageCodec`): the transform
    (``resize`` then ``crop``: a centre crop, or with ``random_crop`` torchvision's
    ``RandomResizedCrop(crop)``), ``flip`` probability, normalisation to ``dtype`` with
    ``mean``/``std`` (in 0–1, as torchvision's ``Normalize`` takes them), where JPEGs are decoded (``"auto"``: the GPU's engines when
    the loader's device is a GPU and nvJPEG is there), the largest picture, the host
    workers' share of a GPU batch (``cpu_share``) and the engines' threads.
    Batches: ``images`` ``[batch, 3, crop, crop]`` and ``labels`` int64 ``[batch]``."""

    def __init__(
        self,
        *,
        crop: int = 224,
        resize: int | None = 256,
        random_crop: bool = False,
        flip: float = 0.0,
        dtype: Literal["uint8", "float32", "float16", "bfloat16"] = "uint8",
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        decode_on: Literal["auto", "host", "device"] = "auto",
        max_pixels: int | None = None,
        cpu_share: float = 0.0,
        engine_threads: int | None = None,
    ) -> None: ...
    def decoder(self, device: Any = None) -> str:
        """The JPEG decoder that makes batches for ``device`` (as :class:`Loader` takes it), and why
        (`ImageCodec::chosen`): the GPU's engines, nvJPEG's CUDA backend or the host, with the
        library found or what was missing."""

class ImageFolder(Source):
    """A folder with one sub-folder of JPEG/PNG files per class, labelled by the sub-folders'
    sorted names (torchvision's ``ImageFolder``; `pinnable::formats::image::ImageFolder`), a path
    or a URL. Batch: ``images``, ``labels``."""

    def __init__(
        self, root: StrPath, codec: ImageCodec | None = None, *, storage: Storage | None = None
    ) -> None: ...
    @property
    def classes(self) -> list[str]: ...

class TarShards(Source):
    """WebDataset tar shards (``.tar``, ``.tar.gz``; brace patterns), paths or URLs
    (`pinnable::formats::tar::TarShards`): images decoded by ``codec`` from the members
    ``image`` names (``"jpg"``, ``"png"``, ...) with labels from ``label`` (batch ``images``,
    ``labels``), or, with ``npy``, the arrays of that member (batch keyed by ``npy`` and
    ``label``). Shards are read in a shuffled order with a shuffle buffer of
    ``shuffle_buffer`` samples."""

    def __init__(
        self,
        shards: str | Sequence[str],
        *,
        codec: ImageCodec | None = None,
        image: str | None = None,
        label: str | None = "cls",
        npy: str | None = None,
        shuffle_buffer: int | None = None,
        storage: Storage | None = None,
    ) -> None: ...

class Mix(Source):
    """Several sources of one kind read as one, in set proportions (`pinnable::loader::Mix`):
    each sample drawn by weight, or with ``per_batch=True`` each batch holding exactly the
    given counts. ``stop``: when an epoch ends."""

    def __init__(
        self,
        sources: Sequence[tuple[Source, float]],
        *,
        per_batch: bool = False,
        stop: Literal["all_exhausted", "first_exhausted", "each_once"] = "all_exhausted",
    ) -> None: ...

class Dataset(Source):
    """A dataset written in Python: an object with ``__len__`` and ``__getitem__(i)`` returning
    a mapping of names to arrays (NumPy, torch CPU tensors, anything with ``__dlpack__`` or
    the buffer protocol) of the same shapes for every ``i``. The slow path: each sample takes
    the GIL on a worker thread and is copied; use the classes above where they fit."""

    def __init__(self, dataset: Any) -> None: ...

class Loader:
    """The loader (`pinnable::loader::Loader`): workers read and collate samples into pinned
    host memory and move each batch to ``device`` with stream-ordered copies, ahead of the
    training step, in a fixed order that resumes exactly.

    - ``device``: ``"cuda:N"``, an int, a ``torch.device``, ``"cpu"`` (pinned host batches),
      or ``None``: torch's current GPU once torch has set up CUDA, else ``cuda:LOCAL_RANK``,
      when CUDA is available; else the host.
    - ``rank``/``world_size``: ``None`` reads ``torch.distributed`` when it is initialised, else
      ``RANK``/``WORLD_SIZE``.
    - ``workers``/``prefetch``: ``None`` tunes them while each epoch runs — more workers
      while the training loop waits for data and each step raises the rate, batches ahead
      following them — within ``cores`` (``None``: the cores this process may use, less an
      eighth left to the training step). A number fixes it. :meth:`stats` lists the changes
      and their reasons.
    - ``output``: ``"torch"`` (``torch.Tensor`` over the loader's memory, zero copy),
      ``"numpy"`` (host batches only) or ``"dlpack"`` (:class:`Tensor`).

    Iterating runs the next epoch (:meth:`set_epoch` sets it). The GIL is released while a
    batch is waited for and while the workers work; Ctrl-C interrupts a wait. Host batches
    (``device="cpu"``) are reused once Python frees them: copy them to a GPU with
    ``non_blocking=False``, or let the loader move them (``device="cuda"``). Not picklable, and not usable in a forked
    child: make it in the process that iterates."""

    def __init__(
        self,
        source: Source,
        *,
        batch_size: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        workers: int | None = None,
        prefetch: int | None = None,
        cores: int | None = None,
        device: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        in_order: bool = True,
        sample_timeout: float | None = None,
        output: Literal["torch", "numpy", "dlpack"] = "torch",
    ) -> None: ...
    def __iter__(self) -> BatchIterator: ...
    def __len__(self) -> int:
        """Batches of this rank in an epoch."""
    def set_epoch(self, epoch: int) -> None: ...
    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
    @property
    def device(self) -> str: ...
    @property
    def stream(self) -> int | None:
        """The raw ``cudaStream_t`` the loader copies batches on (``None`` on the host): a
        consumer never needs it (every batch is ordered before the consumer's stream), but a
        test can delay it with ``torch.cuda.ExternalStream``."""
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def workers(self) -> int: ...
    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands (`pinnable::loader::Position`): after the last batch
        delivered. torchdata's ``Stateful`` protocol."""
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Goes on from a saved position: the next iteration starts after the batch it was
        saved at. Iterators still running are stopped. A position saved by a loader with other
        settings raises :class:`ConfigError` naming the setting."""
    def stats(self) -> dict[str, Any] | None:
        """The last epoch's figures (`pinnable::loader::EpochStats`): ``batches``, ``samples``,
        ``bytes``, ``elapsed_s``, ``waited_s``, ``load_s``, ``collate_s``, ``transfer_s``,
        ``workers``, ``prefetch``, ``tuning`` (the changes the tuning made to them: dicts of
        ``at_s``, ``workers`` and ``prefetch`` as (before, after), and ``reason``),
        ``batches_per_second``, ``gigabytes_per_second``, ``wait_share``,
        ``pinned_peak_bytes``, ``pinned_bound_bytes``, ``batch_bytes``, and ``report``, the
        crate's printed table."""
    def memory(self) -> dict[str, int]:
        """Bytes held: ``device_used``/``device_reserved`` in the device pool batches are
        allocated from (`Device::pool_memory`; 0 on the host; torch's allocator is not
        involved), ``pinned_in_use``/``pinned_held`` in the loader's pinned pool, and
        ``pinned_bound``, the bound the last epoch stated ((prefetch + workers + 1) batches)."""
    def close(self) -> None:
        """Stops every epoch its iterators run, joins their threads, frees what the loader
        holds."""
    def __enter__(self) -> Loader: ...
    def __exit__(self, *exc: object) -> None: ...

class BatchIterator(Iterator[Batch]):
    """One epoch's batches (`pinnable::loader::Epoch`)."""

    def __next__(self) -> Batch: ...
    def __len__(self) -> int:
        """Batches still to come."""
    def close(self) -> None: ...
