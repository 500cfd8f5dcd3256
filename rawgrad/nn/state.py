"""Finding a model's tensors, state dicts, and the safetensors file format.

`get_state_dict` walks any object (attributes, lists, tuples, dicts) and names each Tensor it reaches with torch's
dotted keys: `layers.0.weight`. A safetensors file is an 8-byte little-endian header length, a JSON header mapping
each name to its dtype code, shape and [begin, end) byte offsets in the data (plus an optional string-to-string
`__metadata__`), then the tensors' bytes, contiguous and little-endian.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
import types
from typing import Any

import numpy as np

from rawgrad.compiler.rangeify import buffer_base
from rawgrad.dtype import DType, dtypes
from rawgrad.tensor import Tensor

SAFETENSORS_DTYPES: dict[str, DType] = {
  "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "U16": dtypes.uint16, "I16": dtypes.int16,
  "U32": dtypes.uint32, "I32": dtypes.int32, "U64": dtypes.uint64, "I64": dtypes.int64, "F16": dtypes.float16,
  "BF16": dtypes.bfloat16, "F32": dtypes.float32, "F64": dtypes.float64,
}
_CODE_OF = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors reference refuses larger headers too
_WRITE_CHUNK_BYTES = 16 * 1024 * 1024


# *** walking objects for tensors ***

def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
  """Every Tensor reachable from obj through attributes, lists, tuples and dicts, under torch-style dotted keys.
  A tensor reached by two paths (tied weights) appears under both keys; cycles are followed once."""
  found: dict[str, Tensor] = {}
  _collect(obj, prefix, found, set())
  return found


def _collect(obj: Any, key: str, found: dict[str, Tensor], visiting: set[int]) -> None:
  if isinstance(obj, Tensor):
    found[key] = obj
    return
  if id(obj) in visiting: return
  if isinstance(obj, dict): children = [(str(name), value) for name, value in obj.items()]
  elif isinstance(obj, (list, tuple)): children = [(str(i), value) for i, value in enumerate(obj)]
  elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType)): children = list(vars(obj).items())
  else: return
  visiting.add(id(obj))
  for name, value in children: _collect(value, f"{key}.{name}" if key else name, found, visiting)
  visiting.remove(id(obj))


def get_parameters(obj: Any) -> list[Tensor]:
  """The distinct tensors of get_state_dict(obj), in key order (a tied tensor once)."""
  unique: dict[int, Tensor] = {}
  for tensor in get_state_dict(obj).values(): unique.setdefault(id(tensor), tensor)
  return list(unique.values())


def load_state_dict(model: Any, state_dict: dict[str, Any], strict: bool = True) -> None:
  """Copy the values of state_dict into the model's tensors, in place, in one schedule.

  With strict, keys the model has but state_dict lacks and keys state_dict has but the model lacks are errors;
  a shape that differs is always one. Values are converted to the model tensor's dtype."""
  targets = get_state_dict(model)
  missing = [key for key in targets if key not in state_dict]
  unexpected = [key for key in state_dict if key not in targets]
  if strict and (missing or unexpected):
    raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
  mismatched = [f"{key}: model has {tuple(targets[key].shape)}, state_dict has {_shape_of(value)}"
                for key, value in state_dict.items() if key in targets and
                tuple(_shape_of(value)) != tuple(targets[key].shape)]
  if mismatched: raise ValueError("load_state_dict: shape mismatch for " + "; ".join(mismatched))
  loaded = []
  for key, value in state_dict.items():
    if key not in targets: continue
    target = targets[key]
    value = value if isinstance(value, Tensor) else Tensor(np.asarray(value), target.device, target.dtype)
    _copy_into(target, value)
    loaded.append(target)
  if loaded: Tensor.realize(*loaded)


def _shape_of(value: Any) -> tuple:
  return tuple(value.shape) if isinstance(value, Tensor) else np.shape(value)


def _copy_into(target: Tensor, value: Tensor) -> None:
  """Write value into target's buffer; a target without a buffer of its own yet gets a fresh copy of value (never
  value's buffer itself, which an in-place update of target would then change)."""
  if buffer_base(target.uop) is None:
    # contiguous() of a buffer would be that same buffer: assign into a new one to copy
    target.uop = Tensor.empty(*target.shape, dtype=target.dtype, device=target.device).uop  # assign files it lazy
  target.assign(value)


# *** safetensors ***

def safe_save(tensors: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
  """Write tensors to a safetensors file, atomically: the bytes go to a temporary file in the same directory,
  which is flushed, fsynced and then renamed over path. A crash at any point leaves the old file intact."""
  header, arrays = _safetensors_header(tensors, metadata)
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
  try:
    with os.fdopen(handle, "wb") as file:
      file.write(struct.pack("<Q", len(header)))
      file.write(header)
      for array in arrays: _write_chunked(file, array)
      file.flush()
      os.fsync(file.fileno())
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary): os.unlink(temporary)
    raise
  _fsync_directory(directory)


def _safetensors_header(tensors: dict[str, Tensor], metadata: dict[str, str] | None) -> tuple[bytes, list]:
  """The JSON header (padded with spaces to a multiple of 8 bytes, as the reference writer does) and each tensor's
  little-endian bytes as a numpy array, in file order."""
  entries: dict[str, Any] = {}
  if metadata is not None:
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
      raise TypeError(f"safe_save: metadata must map str to str, got {metadata!r}")
    entries["__metadata__"] = dict(metadata)
  arrays, offset = [], 0
  for name, tensor in tensors.items():
    if not isinstance(name, str) or name == "__metadata__":
      raise ValueError(f"safe_save: invalid tensor name {name!r}")
    if not isinstance(tensor, Tensor):
      raise TypeError(f"safe_save: {name!r} is a {type(tensor).__name__}, not a Tensor")
    if tensor.dtype not in _CODE_OF:
      raise TypeError(f"safe_save: {name!r} has dtype {tensor.dtype}, which safetensors cannot store")
    array = _raw_little_endian(tensor)
    entries[name] = {"dtype": _CODE_OF[tensor.dtype], "shape": list(tensor.shape),
                     "data_offsets": [offset, offset + array.nbytes]}
    arrays.append(array)
    offset += array.nbytes
  header = json.dumps(entries, separators=(",", ":")).encode()
  return header + b" " * (-len(header) % 8), arrays


def _raw_little_endian(tensor: Tensor) -> np.ndarray:
  values = tensor.numpy()
  # numpy() widens bfloat16 to float32 exactly; its raw bits are the float32's upper half
  if tensor.dtype == dtypes.bfloat16: values = (values.view(np.uint32) >> 16).astype(np.uint16)
  return np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))


def _write_chunked(file: Any, array: np.ndarray) -> None:
  data = memoryview(array.reshape(-1).view(np.uint8))
  for start in range(0, len(data), _WRITE_CHUNK_BYTES): file.write(data[start:start + _WRITE_CHUNK_BYTES])


def _fsync_directory(directory: str) -> None:
  """Make the rename itself durable; not every platform can open a directory."""
  try:
    handle = os.open(directory, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(handle)
  except OSError:
    pass
  finally:
    os.close(handle)


def safe_load(path: str | os.PathLike) -> dict[str, Tensor]:
  """The tensors of a safetensors file, each in a buffer of its own."""
  with open(path, "rb") as file: data = file.read()
  header, start = _read_header(data, os.fspath(path))
  return {name: _tensor_from(name, entry, data, start, os.fspath(path)) for name, entry in header.items()
          if name != "__metadata__"}


def safe_load_metadata(path: str | os.PathLike) -> dict[str, str]:
  """The `__metadata__` of a safetensors file ({} when it has none), without reading the tensors."""
  with open(path, "rb") as file:
    prefix = file.read(8)
    if len(prefix) < 8: raise ValueError(f"{os.fspath(path)}: not a safetensors file: {len(prefix)} bytes long")
    length = struct.unpack("<Q", prefix)[0]
    if length > _MAX_HEADER_BYTES: raise ValueError(f"{os.fspath(path)}: header length {length} is too large")
    header, _ = _read_header(prefix + file.read(length), os.fspath(path))
  return header.get("__metadata__", {})


def _read_header(data: bytes, path: str) -> tuple[dict[str, Any], int]:
  """The parsed JSON header and the offset where the tensor data begins."""
  if len(data) < 8: raise ValueError(f"{path}: not a safetensors file: {len(data)} bytes long")
  length = struct.unpack("<Q", data[:8])[0]
  if length > min(_MAX_HEADER_BYTES, len(data) - 8):
    raise ValueError(f"{path}: header length {length} does not fit in a file of {len(data)} bytes")
  try:
    header = json.loads(data[8:8 + length].decode())
  except (UnicodeDecodeError, json.JSONDecodeError) as error:
    raise ValueError(f"{path}: header is not valid JSON: {error}") from None
  if not isinstance(header, dict): raise ValueError(f"{path}: header is a {type(header).__name__}, not an object")
  return header, 8 + length


def _tensor_from(name: str, entry: Any, data: bytes, start: int, path: str) -> Tensor:
  if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
    raise ValueError(f"{path}: entry {name!r} needs dtype, shape and data_offsets, got {entry!r}")
  code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
  if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
    raise ValueError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
  if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
    raise ValueError(f"{path}: tensor {name!r} has invalid data_offsets {offsets!r}")
  shape, (begin, end) = tuple(shape), offsets
  if code not in SAFETENSORS_DTYPES:
    raise ValueError(f"{path}: tensor {name!r} has unknown dtype {code!r}; known: {sorted(SAFETENSORS_DTYPES)}")
  dtype = SAFETENSORS_DTYPES[code]
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if not 0 <= begin <= end <= len(data) - start or end - begin != expected:
    raise ValueError(f"{path}: tensor {name!r} of dtype {code} and shape {shape} needs {expected} bytes, but its "
                     f"data_offsets are [{begin}, {end}) in {len(data) - start} bytes of data")
  storage = dtypes.to_numpy(dtype).newbyteorder("<")
  values = np.frombuffer(data, dtype=storage, count=expected // dtype.itemsize, offset=start + begin)
  # bfloat16 goes in as its raw uint16 bits, which is how rawgrad stores it
  return Tensor(values.reshape(shape).astype(storage.newbyteorder("=")), dtype=dtype)


__all__ = ["SAFETENSORS_DTYPES", "get_parameters", "get_state_dict", "load_state_dict", "safe_load",
           "safe_load_metadata", "safe_save"]
