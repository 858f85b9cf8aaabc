"""The test vectors' safetensors files, as numpy arrays (SPEC 4.5.8).

The format: an 8-byte little-endian unsigned header length ``N``, then ``N`` bytes of UTF-8 JSON
mapping each tensor's name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into
the data that follows the header) and optionally ``"__metadata__"`` to a map of strings, then the
tensors' raw little-endian bytes, row-major.

Reading is the ``safetensors`` package's (``safe_open`` with numpy arrays), which checks the header
and every tensor's offsets against the file before it hands out data. bfloat16 is
``ml_dtypes.bfloat16``: importing ml_dtypes registers the numpy dtype named ``bfloat16``, the one
safetensors builds a ``BF16`` tensor's array with. Neither package imports torch, so
``gefen-conformance vectors check`` runs without it.

Writing stays here, in a few lines, because an export must be byte-reproducible (the manifest
records each file's SHA-256, and two exports of one suite version are compared by it): the
package's writer (``safetensors.numpy.save_file``, 0.8) serialises ``__metadata__`` from a hash map
whose key order changes from one process to the next, so the same vector gets another digest on
every export. The files here hold their tensors in name order, contiguous, the header's keys sorted
and padded with spaces to a multiple of 8 bytes; any safetensors reader, and a C or CUDA test that
parses the header itself, reads them.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
#: safetensors dtype name -> the numpy dtype of its arrays.
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": BFLOAT16,
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class SafetensorsError(ValueError):
    """A file that is not a readable safetensors file, or a tensor that cannot be written."""


def dtype_name(array: np.ndarray) -> str:
    """The safetensors dtype name of ``array``'s dtype; SafetensorsError for one the format lacks."""
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    if dtype not in _NAMES:
        raise SafetensorsError(f"numpy dtype {array.dtype} has no safetensors dtype here")
    return _NAMES[dtype]


def read(path) -> tuple[dict, dict]:
    """``({name: numpy array}, metadata)`` of the safetensors file ``path``; SafetensorsError naming
    the file and what is wrong with it (OSError when it cannot be opened)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="np") as f:
            metadata = f.metadata() or {}
            tensors = {name: np.array(f.get_tensor(name)) for name in f.keys()}
    except (SafetensorError, TypeError, ValueError) as error:
        raise SafetensorsError(f"{path}: not a readable safetensors file: {error}") from None
    for name, array in tensors.items():
        if array.dtype not in _NAMES:
            known = ", ".join(DTYPES)
            raise SafetensorsError(f"{path}: tensor {name!r}: dtype {array.dtype} is not one of {known}")
    return tensors, metadata


def write(path, tensors: dict, metadata: dict | None = None) -> None:
    """Write ``tensors`` (``{name: numpy array}``, bfloat16 as :data:`BFLOAT16`) to ``path`` as one
    safetensors file, in name order, with ``metadata`` (``{str: str}``) as its ``__metadata__``."""
    header: dict = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("metadata maps strings to strings")
        header["__metadata__"] = dict(sorted(metadata.items()))
    chunks, offset = [], 0
    for name in sorted(tensors):
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise SafetensorsError(f"tensor name {name!r} is not allowed")
        array = np.asarray(tensors[name])
        try:
            dtype = dtype_name(array)
        except SafetensorsError as error:
            raise SafetensorsError(f"{name}: {error}") from None
        data = np.ascontiguousarray(array, dtype=DTYPES[dtype]).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": [int(n) for n in array.shape],
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for chunk in chunks:
            out.write(chunk)
