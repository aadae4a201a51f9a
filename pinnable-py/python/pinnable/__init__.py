"""pinnable: batches for PyTorch from a Rust loader.

Workers collate samples into pinned host memory, each batch moves to the GPU with a
stream-ordered copy, and torch receives it without a copy (DLPack): the tensors' memory is the
loader's, and the stream that consumes them waits for the copy on the GPU, not on the host.

    import pinnable
    loader = pinnable.Loader(pinnable.TokenWindows("train.bin", 1024), batch_size=12,
                             shuffle=True, seed=42)
    for batch in loader:          # {"x": LongTensor [12, 1024] on cuda:LOCAL_RANK, "y": ...}
        ...

Every class wraps one item of the Rust crate `pinnable` (its docstring names it); errors are
:class:`Error` (settings: :class:`ConfigError`) with the crate's message.
"""

from ._pinnable import (
    Arrays,
    BatchIterator,
    Budget,
    ConfigError,
    Dataset,
    Error,
    ImageCodec,
    ImageFolder,
    Loader,
    Mix,
    Npy,
    PackedDocs,
    Source,
    Storage,
    TarShards,
    Tensor,
    TokenWindows,
    __version__,
    cuda_available,
    device_count,
)

__all__ = [
    "Arrays",
    "BatchIterator",
    "Budget",
    "ConfigError",
    "Dataset",
    "Error",
    "ImageCodec",
    "ImageFolder",
    "Loader",
    "Mix",
    "Npy",
    "PackedDocs",
    "Source",
    "Storage",
    "TarShards",
    "Tensor",
    "TokenWindows",
    "__version__",
    "cuda_available",
    "device_count",
]
