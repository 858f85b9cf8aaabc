"""A small reader and writer of safetensors files, on numpy alone (SPEC 4.5.8).

The format: an 8-byte little-endian unsigned header length ``N``, then ``N`` bytes of UTF-8 JSON
mapping each tensor's name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into
the data that follows the header) and optionally ``"__metadata__"`` to a map of strings, then the
tensors' raw little-endian bytes, row-major. This module writes the header padded with spaces to
a multiple of 8 bytes, the tensors in name order and contiguous, so any safetensors reader (and a
C or CUDA test that parses the header itself) reads the files; it reads what it writes and any
file of the dtypes below, checking every offset against the file before it touches the data.

bfloat16 has no numpy dtype: a ``BF16`` tensor is held as its ``uint16`` bit patterns
(:meth:`Stored.values` widens them to float64 exactly). The module imports neither torch nor
anything of the project, so ``gefen-conformance vectors check`` runs without torch.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: safetensors dtype name -> the numpy dtype that holds it (``BF16``: its bit patterns).
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items() if name != "BF16"}
#: The largest header this reader accepts (the format's own limit is 100 MB).
HEADER_LIMIT = 100_000_000


class SafetensorsError(ValueError):
    """A file that is not a readable safetensors file, or a tensor that cannot be written."""


@dataclass(frozen=True)
class Stored:
    """One tensor of a file: its safetensors ``dtype`` and its values (``BF16``: bit patterns)."""

    dtype: str
    array: np.ndarray

    def values(self) -> np.ndarray:
        """The values as float64 (integers and booleans converted; ``BF16`` widened exactly)."""
        if self.dtype == "BF16":
            return (self.array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return self.array.astype(np.float64)


def bfloat16(bits: np.ndarray) -> Stored:
    """A ``BF16`` tensor from its ``uint16`` bit patterns."""
    return Stored("BF16", np.ascontiguousarray(bits, dtype=np.uint16))


def write(path, tensors: dict, metadata: dict | None = None) -> None:
    """Write ``tensors`` (``{name: numpy array or Stored}``) to ``path`` as one safetensors file,
    with ``metadata`` (``{str: str}``) as its ``__metadata__``."""
    header: dict = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("metadata maps strings to strings")
        header["__metadata__"] = dict(metadata)
    chunks, offset = [], 0
    for name in sorted(tensors):
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise SafetensorsError(f"tensor name {name!r} is not allowed")
        stored = as_stored(name, tensors[name])
        data = np.ascontiguousarray(stored.array, dtype=DTYPES[stored.dtype]).tobytes()
        header[name] = {
            "dtype": stored.dtype,
            "shape": [int(n) for n in stored.array.shape],
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


def as_stored(name: str, array) -> Stored:
    """``array`` (a numpy array, or already a :class:`Stored`) as the tensor ``name`` of a file."""
    if isinstance(array, Stored):
        return array
    array = np.asarray(array)
    dtype = _NAMES.get(array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype)
    if dtype is None:
        raise SafetensorsError(f"{name}: numpy dtype {array.dtype} has no safetensors dtype here")
    return Stored(dtype, array)


def read(path) -> tuple[dict, dict]:
    """``({name: Stored}, metadata)`` of the safetensors file ``path``; SafetensorsError naming the
    file and what is wrong with it (OSError when it cannot be opened)."""
    path = Path(path)
    raw = path.read_bytes()
    if len(raw) < 8:
        raise SafetensorsError(f"{path}: {len(raw)} bytes, shorter than the 8-byte header length")
    (size,) = struct.unpack("<Q", raw[:8])
    if size > min(HEADER_LIMIT, len(raw) - 8):
        raise SafetensorsError(f"{path}: header length {size} exceeds the file ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8 : 8 + size].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SafetensorsError(f"{path}: header is not JSON: {error}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise SafetensorsError(f"{path}: __metadata__ is not an object")
    data = memoryview(raw)[8 + size :]
    tensors = {}
    for name, entry in header.items():
        tensors[name] = _tensor(path, name, entry, data)
    return tensors, metadata


def _tensor(path: Path, name: str, entry, data: memoryview) -> Stored:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise SafetensorsError(f"{where}: needs dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise SafetensorsError(f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise SafetensorsError(f"{where}: shape {shape!r} is not a list of sizes")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(n) is int for n in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= len(data)
    ):
        raise SafetensorsError(f"{where}: data_offsets {offsets!r} outside the {len(data)} data bytes")
    expected = math.prod(shape) * DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != expected:
        raise SafetensorsError(
            f"{where}: {offsets[1] - offsets[0]} bytes for {dtype} {shape}, which needs {expected}"
        )
    array = np.frombuffer(data[offsets[0] : offsets[1]], dtype=DTYPES[dtype]).reshape(shape).copy()
    return Stored(dtype, array)
