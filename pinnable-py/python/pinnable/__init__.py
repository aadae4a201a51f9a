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

import os as _os
import sys as _sys

# nvJPEG (for JPEGs decoded on the GPU) is looked for where the user names it (PINNABLE_NVJPEG),
# by the system's loader, in CUDA toolkits, and, from Python, in this interpreter's own
# environment: the NVIDIA wheels PyTorch installed there. That environment's code already runs
# in this process, so its libraries add no new trust; set the variable to name another
# environment.
_os.environ.setdefault("PINNABLE_NVJPEG_FROM_PYTHON", _sys.prefix)

import atexit as _atexit

from ._pinnable import _shutdown as _stop_every_epoch
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

# Epochs still running when the interpreter exits are stopped first, while their threads can
# still finish what they are doing (a Python Dataset's __getitem__ needs the interpreter).
_atexit.register(_stop_every_epoch)
