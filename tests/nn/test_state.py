"""State dicts and safetensors files: bit-exact round trips of every dtype, a header a hand-written parser reads, files
written by hand that we read, atomic saves that survive a SIGKILL mid-write, and load errors that name the key."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rawgrad import nn
from rawgrad.compiler.rangeify import buffer_base
from rawgrad.dtype import dtypes
from rawgrad.nn.state import (SAFETENSORS_DTYPES, get_parameters, get_state_dict, load_state_dict, safe_load,
                              safe_load_metadata, safe_save)
from rawgrad.tensor import Tensor

NUMPY_OF_CODE = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16, "U32": np.uint32,
                 "I32": np.int32, "U64": np.uint64, "I64": np.int64, "F16": np.float16, "BF16": np.uint16,
                 "F32": np.float32, "F64": np.float64}


def random_bits(code: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
  """Arbitrary bit patterns of the dtype (NaN payloads, infinities and subnormals included); bool is 0 or 1.
  bfloat16 is returned as its raw uint16 bits."""
  rng = np.random.default_rng(seed)
  np_dtype = np.dtype(NUMPY_OF_CODE[code])
  count = int(np.prod(shape))
  if code == "BOOL": return rng.integers(0, 2, count).astype(np.bool_).reshape(shape)
  raw = rng.integers(0, 256, count * np_dtype.itemsize, dtype=np.uint8)
  return raw.view(np_dtype).reshape(shape)


def make_tensor(code: str, bits: np.ndarray) -> Tensor:
  return Tensor(bits, dtype=SAFETENSORS_DTYPES[code])


def raw_bits(tensor: Tensor) -> np.ndarray:
  """The stored bits of a tensor as a uint8 array (bfloat16: the upper half of numpy()'s exact float32)."""
  values = tensor.numpy()
  if tensor.dtype == dtypes.bfloat16: values = (values.view(np.uint32) >> 16).astype(np.uint16)
  return np.ascontiguousarray(values).reshape(-1).view(np.uint8)


def parse_by_hand(path: Path) -> tuple[dict[str, Any], bytes]:
  """The safetensors format, read without rawgrad: u64 little-endian header size, JSON header, data."""
  data = path.read_bytes()
  (length,) = struct.unpack("<Q", data[:8])
  return json.loads(data[8:8 + length]), data[8 + length:]


def write_by_hand(path: Path, arrays: dict[str, tuple[str, np.ndarray]], order: list[str]) -> None:
  """A safetensors file laid out in `order`, with an unpadded header: how another writer might do it."""
  header: dict[str, Any] = {}
  blobs, offset = [], 0
  for name in order:
    code, array = arrays[name]
    blob = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
    header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
  encoded = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


SHAPES = [(3, 5), (), (0,), (2, 0, 3), (7,)]


# *** round trips ***

@pytest.mark.parametrize("code", list(SAFETENSORS_DTYPES))
def test_round_trip_is_bit_exact(tmp_path: Path, code: str) -> None:
  originals = {f"t{i}": random_bits(code, shape, seed=i) for i, shape in enumerate(SHAPES)}
  path = tmp_path / "model.safetensors"
  safe_save({name: make_tensor(code, bits) for name, bits in originals.items()}, path)
  loaded = safe_load(path)
  assert list(loaded) == list(originals)
  for name, bits in originals.items():
    assert loaded[name].dtype == SAFETENSORS_DTYPES[code]
    assert loaded[name].shape == bits.shape
    np.testing.assert_array_equal(raw_bits(loaded[name]), bits.reshape(-1).view(np.uint8), err_msg=name)


def test_header_and_data_follow_the_format(tmp_path: Path) -> None:
  originals = {code: random_bits(code, (2, 3), seed=5) for code in SAFETENSORS_DTYPES}
  originals["scalar"] = np.array(2.5, np.float32)
  path = tmp_path / "all.safetensors"
  tensors = {code: make_tensor(code, bits) for code, bits in originals.items() if code != "scalar"}
  tensors["scalar"] = make_tensor("F32", originals["scalar"])
  safe_save(tensors, path, metadata={"format": "pt", "epoch": "3"})
  header, data = parse_by_hand(path)
  assert (8 + len(json.dumps(header, separators=(",", ":")))) <= path.stat().st_size
  assert header.pop("__metadata__") == {"format": "pt", "epoch": "3"}
  assert (path.stat().st_size - len(data) - 8) % 8 == 0, "the header is padded to a multiple of 8 bytes"
  offset = 0
  for name, entry in header.items():
    code = name if name != "scalar" else "F32"
    bits = originals[name]
    assert entry["dtype"] == code
    assert entry["shape"] == list(bits.shape)
    begin, end = entry["data_offsets"]
    assert begin == offset, "tensors are stored back to back in header order"
    little_endian = np.ascontiguousarray(bits).astype(bits.dtype.newbyteorder("<")).tobytes()
    assert data[begin:end] == little_endian, name
    offset = end
  assert offset == len(data)
  assert safe_load_metadata(path) == {"format": "pt", "epoch": "3"}


def test_reads_files_written_by_another_writer(tmp_path: Path) -> None:
  arrays = {"b": ("BF16", np.array([0x3F80, 0x7FC1, 0xFF80, 0x0001], np.uint16)),
            "a": ("I64", np.array([[-1, 2**62], [3, -2**63]], np.int64)),
            "flag": ("BOOL", np.array([True, False, True])),
            "empty": ("F16", np.zeros((0, 4), np.float16)),
            "half": ("F16", np.array([1.5, -np.inf, 65504.0], np.float16))}
  path = tmp_path / "other.safetensors"
  write_by_hand(path, arrays, order=["half", "empty", "flag", "a", "b"])
  loaded = safe_load(path)
  assert set(loaded) == set(arrays)
  assert safe_load_metadata(path) == {}
  np.testing.assert_array_equal(raw_bits(loaded["b"]).view(np.uint16), arrays["b"][1])
  np.testing.assert_array_equal(loaded["b"].numpy()[:1], [1.0])
  np.testing.assert_array_equal(loaded["a"].numpy(), arrays["a"][1])
  np.testing.assert_array_equal(loaded["flag"].numpy(), arrays["flag"][1])
  assert loaded["empty"].shape == (0, 4)
  np.testing.assert_array_equal(loaded["half"].numpy(), arrays["half"][1])


def test_saves_lazy_and_viewed_tensors(tmp_path: Path) -> None:
  base = np.arange(12, dtype=np.float32).reshape(3, 4)
  tensors = {"lazy": Tensor(base) * 2 + 1, "view": Tensor(base).permute(1, 0)[1:3],
             "const": Tensor(7, dtype=dtypes.int16)}
  path = tmp_path / "lazy.safetensors"
  safe_save(tensors, path)
  loaded = safe_load(path)
  np.testing.assert_array_equal(loaded["lazy"].numpy(), base * 2 + 1)
  np.testing.assert_array_equal(loaded["view"].numpy(), base.T[1:3])
  assert loaded["const"].shape == () and loaded["const"].dtype == dtypes.int16 and loaded["const"].item() == 7


# *** atomic saving ***

CHILD_SAVE = textwrap.dedent("""
  import os, signal, sys
  import numpy as np
  from rawgrad.tensor import Tensor
  from rawgrad.nn.state import safe_save
  path, count, crash_at_replace = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
  big = Tensor(np.full(count, 7.0, np.float32))
  big.numpy()
  if crash_at_replace: os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
  print("saving", flush=True)
  safe_save({"big": big}, path)
  print("saved", flush=True)
""")


def write_old_file(path: Path) -> bytes:
  safe_save({"old": Tensor(np.arange(10, dtype=np.int32))}, path)
  return path.read_bytes()


def temporaries(directory: Path) -> list[Path]:
  return [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def assert_old_file_intact(path: Path, old_bytes: bytes) -> None:
  assert path.read_bytes() == old_bytes
  np.testing.assert_array_equal(safe_load(path)["old"].numpy(), np.arange(10))


def test_sigkill_in_the_middle_of_the_data_leaves_the_old_file(tmp_path: Path) -> None:
  path = tmp_path / "model.safetensors"
  old_bytes = write_old_file(path)
  count = 32 * 1024 * 1024  # 128 MB of float32: writing takes long enough to be caught in the middle
  child = subprocess.Popen([sys.executable, "-c", CHILD_SAVE, str(path), str(count), "0"], stdout=subprocess.PIPE)
  try:
    assert child.stdout is not None and child.stdout.readline() == b"saving\n"
    deadline, partial = time.monotonic() + 60, None
    while partial is None and time.monotonic() < deadline and child.poll() is None:
      partial = next((p for p in temporaries(tmp_path) if p.stat().st_size > 0), None)
    assert partial is not None, "never saw the temporary file being written"
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
  finally:
    if child.poll() is None: child.kill()
  written = partial.stat().st_size
  assert 0 < written < 8 + count * 4, f"the write was not interrupted: {written} bytes"
  assert_old_file_intact(path, old_bytes)


def test_sigkill_before_the_rename_leaves_the_old_file(tmp_path: Path) -> None:
  path = tmp_path / "model.safetensors"
  old_bytes = write_old_file(path)
  result = subprocess.run([sys.executable, "-c", CHILD_SAVE, str(path), "1000", "1"], capture_output=True, timeout=120)
  assert result.returncode == -signal.SIGKILL, result.stderr.decode()
  assert result.stdout == b"saving\n"
  [complete] = temporaries(tmp_path)
  assert complete.stat().st_size > 8 + 4000, "the temporary file was fully written before the crash"
  assert_old_file_intact(path, old_bytes)


def test_a_failing_save_removes_its_temporary_file(tmp_path: Path) -> None:
  path = tmp_path / "model.safetensors"
  old_bytes = write_old_file(path)
  with pytest.raises(TypeError, match="'bad' is a ndarray"):
    safe_save({"fine": Tensor(np.ones(3, np.float32)), "bad": np.ones(3)}, path)  # type: ignore[dict-item]
  assert_old_file_intact(path, old_bytes)
  assert temporaries(tmp_path) == []


def test_save_replaces_the_old_file(tmp_path: Path) -> None:
  path = tmp_path / "model.safetensors"
  write_old_file(path)
  safe_save({"new": Tensor(np.array([1.5], np.float32))}, path)
  assert list(safe_load(path)) == ["new"]
  assert temporaries(tmp_path) == []


# *** load errors ***

def corrupt(path: Path, header: Any, data: bytes = b"") -> None:
  encoded = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


@pytest.mark.parametrize("header, data, message", [
  ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8, r"'w'.*needs 8 bytes.*\[0, 4\)"),
  ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, r"'w'.*in 4 bytes of data"),
  ({"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8, r"'w' has unknown dtype 'C64'"),
  ({"w": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, r"'w' needs dtype, shape and data_offsets"),
  ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, r"'w' has an invalid shape"),
  ([1, 2], b"", r"header is a list"),
])
def test_malformed_files_raise(tmp_path: Path, header: Any, data: bytes, message: str) -> None:
  path = tmp_path / "bad.safetensors"
  corrupt(path, header, data)
  with pytest.raises(ValueError, match=message): safe_load(path)


def test_truncated_and_garbage_files_raise(tmp_path: Path) -> None:
  path = tmp_path / "bad.safetensors"
  path.write_bytes(b"\x01\x02")
  with pytest.raises(ValueError, match="not a safetensors file: 2 bytes"): safe_load(path)
  path.write_bytes(struct.pack("<Q", 1000) + b"{}")
  with pytest.raises(ValueError, match="header length 1000 does not fit in a file of 10 bytes"): safe_load(path)
  path.write_bytes(struct.pack("<Q", 4) + b"{{{{")
  with pytest.raises(ValueError, match="not valid JSON"): safe_load(path)


def test_save_rejects_what_it_cannot_store(tmp_path: Path) -> None:
  with pytest.raises(ValueError, match="invalid tensor name '__metadata__'"):
    safe_save({"__metadata__": Tensor([1.0])}, tmp_path / "x")
  with pytest.raises(TypeError, match="metadata must map str to str"):
    safe_save({"w": Tensor([1.0])}, tmp_path / "x", metadata={"epoch": 3})  # type: ignore[dict-item]


# *** state dicts ***

class Block:
  def __init__(self) -> None:
    self.conv = nn.Conv2d(2, 3, 3)
    self.norm = nn.BatchNorm2d(3)


class Model:
  def __init__(self) -> None:
    self.blocks = [Block(), Block()]
    self.heads = {"class": nn.Linear(4, 2), "box": nn.Linear(4, 4, bias=False)}
    self.scale = Tensor(np.ones(1, np.float32))
    self.name, self.sizes = "model", (1, 2)
    self.parent = self  # a cycle must not loop


def test_state_dict_keys_are_torch_style() -> None:
  keys = list(get_state_dict(Model()))
  block = ["conv.weight", "conv.bias", "norm.weight", "norm.bias", "norm.running_mean", "norm.running_var",
           "norm.num_batches_tracked"]
  assert keys == [f"blocks.{i}.{k}" for i in range(2) for k in block] + \
    ["heads.class.weight", "heads.class.bias", "heads.box.weight", "scale"]
  assert list(get_state_dict(nn.Linear(2, 2), prefix="fc")) == ["fc.weight", "fc.bias"]


def test_tied_tensors_appear_under_every_key_but_are_one_parameter() -> None:
  model = Model()
  model.heads["box"].weight = model.heads["class"].weight = Tensor(np.ones((2, 4), np.float32))
  state = get_state_dict(model)
  assert state["heads.class.weight"] is state["heads.box.weight"]
  parameters = get_parameters(model)
  assert len(parameters) == len(state) - 1
  assert len({id(p) for p in parameters}) == len(parameters)


def test_load_state_dict_writes_in_place_in_one_schedule() -> None:
  source, target = Model(), Model()
  for tensor in get_parameters(target): tensor.realize()
  buffers = {key: buffer_base(t.uop) for key, t in get_state_dict(target).items()}
  values = {key: t.numpy().copy() for key, t in get_state_dict(source).items()}
  load_state_dict(target, get_state_dict(source))
  for key, tensor in get_state_dict(target).items():
    np.testing.assert_array_equal(tensor.numpy(), values[key], err_msg=key)
    assert buffer_base(tensor.uop) is buffers[key], f"{key} lost its buffer"


def test_load_into_lazy_tensors_copies_instead_of_aliasing() -> None:
  layer = nn.Linear(3, 2)  # weights are lazy random numbers, not buffers yet
  state = {"weight": Tensor(np.ones((2, 3), np.float32)), "bias": np.array([1.0, 2.0])}
  load_state_dict(layer, state)
  np.testing.assert_array_equal(layer.bias.numpy(), [1.0, 2.0])
  assert layer.bias.dtype == dtypes.float32
  layer.weight.assign(layer.weight * 5).realize()
  np.testing.assert_array_equal(layer.weight.numpy(), np.full((2, 3), 5.0))
  np.testing.assert_array_equal(state["weight"].numpy(), np.ones((2, 3)))


def test_load_converts_dtypes() -> None:
  norm = nn.BatchNorm1d(2)
  state = {k: Tensor(t.numpy().astype(np.float64)) for k, t in get_state_dict(norm).items()}
  state["num_batches_tracked"] = Tensor(np.array(9, np.int32))
  state["running_var"] = Tensor(np.array([4.0, 5.0]))
  load_state_dict(norm, state)
  assert norm.num_batches_tracked.dtype == dtypes.int64 and norm.num_batches_tracked.item() == 9
  np.testing.assert_array_equal(norm.running_var.numpy(), [4.0, 5.0])


def test_load_errors_name_the_keys_and_shapes() -> None:
  layer = nn.Linear(3, 2)
  good = {"weight": Tensor(np.zeros((2, 3), np.float32)), "bias": Tensor(np.zeros(2, np.float32))}
  with pytest.raises(KeyError, match=r"missing keys \['bias'\], unexpected keys \[\]"):
    load_state_dict(layer, {"weight": good["weight"]})
  with pytest.raises(KeyError, match=r"missing keys \[\], unexpected keys \['extra'\]"):
    load_state_dict(layer, {**good, "extra": Tensor([1.0])})
  with pytest.raises(ValueError, match=r"weight: model has \(2, 3\), state_dict has \(3, 2\)"):
    load_state_dict(layer, {**good, "weight": Tensor(np.zeros((3, 2), np.float32))})
  with pytest.raises(ValueError, match=r"bias: model has \(2,\), state_dict has \(5,\)"):
    load_state_dict(layer, {"bias": np.zeros(5)}, strict=False)


def test_non_strict_load_skips_missing_and_unexpected() -> None:
  layer = nn.Linear(3, 2)
  layer.weight.realize()
  weight = layer.weight.numpy().copy()
  load_state_dict(layer, {"bias": Tensor(np.array([3.0, 4.0], np.float32)), "extra": Tensor([1.0])}, strict=False)
  np.testing.assert_array_equal(layer.bias.numpy(), [3.0, 4.0])
  np.testing.assert_array_equal(layer.weight.numpy(), weight)


def test_checkpoint_round_trip_through_a_file(tmp_path: Path) -> None:
  source, target = Model(), Model()
  source.blocks[0].norm(Tensor(np.random.default_rng(0).standard_normal((4, 3, 2, 2)).astype(np.float32)))
  path = tmp_path / "checkpoint.safetensors"
  safe_save(get_state_dict(source), path)
  load_state_dict(target, safe_load(path))
  for key, tensor in get_state_dict(target).items():
    np.testing.assert_array_equal(tensor.numpy(), get_state_dict(source)[key].numpy(), err_msg=key)
  assert target.blocks[0].norm.num_batches_tracked.item() == 1
  assert os.listdir(tmp_path) == ["checkpoint.safetensors"]
