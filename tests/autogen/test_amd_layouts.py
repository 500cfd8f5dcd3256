"""The generated AMD ctypes classes lay out exactly as gcc laid out the C structures they came from.

tools/autogen.py amd records gcc's sizeof/offsetof of every generated class in rawgrad/autogen/amd/layouts.json; these
tests need neither gcc nor the Debian packages the headers came from, only that record.
"""
from __future__ import annotations

import ctypes
import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

import rawgrad.autogen.amd as amd
from rawgrad.autogen import layout_mismatches

LAYOUTS = json.loads((Path(amd.__file__).parent / "layouts.json").read_text())
MODULES = sorted(LAYOUTS["modules"])


def module(name: str) -> ModuleType:
  return importlib.import_module(f"rawgrad.autogen.amd.{name}")


def ctypes_classes(name: str) -> set[str]:
  mod = module(name)
  return {value.__name__ for value in vars(mod).values() if isinstance(value, type)
          and issubclass(value, (ctypes.Structure, ctypes.Union)) and value.__module__ == mod.__name__}


@pytest.mark.parametrize("name", MODULES)
def test_every_class_matches_gcc(name: str):
  problems = []
  for class_name, record in LAYOUTS["modules"][name].items():
    cls = getattr(module(name), class_name, None)
    problems += [f"{class_name}: in layouts.json, not in the module"] if cls is None else layout_mismatches(cls, record)
  assert not problems, f"{len(problems)} layout mismatches in {name}:\n" + "\n".join(problems[:50])


@pytest.mark.parametrize("name", MODULES)
def test_every_class_is_recorded(name: str):
  unrecorded = sorted(ctypes_classes(name) - set(LAYOUTS["modules"][name]))
  assert not unrecorded, f"classes in {name} without a gcc layout in layouts.json: {unrecorded}"


def test_the_record_covers_every_module_with_classes():
  # an empty record would pass the tests above vacuously
  assert {"kfd", "hsa"} <= set(MODULES)
  assert len(LAYOUTS["modules"]["kfd"]) >= 40 and len(LAYOUTS["modules"]["hsa"]) >= 10
  assert sum(len(r["fields"]) for m in LAYOUTS["modules"].values() for r in m.values()) > 300
  assert set(LAYOUTS["sources"]) == {"linux-libc-dev", "libhsa-runtime-dev", "linux-source-6.1", "llvm-14-dev"}
  assert LAYOUTS["modules"]["kernel_descriptor"]["kernel_descriptor_t"]["size"] == 64


def test_a_wrong_record_is_caught():
  record = LAYOUTS["modules"]["kfd"]["kfd_ioctl_create_queue_args"]
  assert layout_mismatches(module("kfd").kfd_ioctl_create_queue_args, record) == []
  offset, size = record["fields"]["doorbell_offset"]
  wrong = {**record, "size": record["size"] + 8, "fields": {**record["fields"], "doorbell_offset": [offset + 4, 4]}}
  assert len(layout_mismatches(module("kfd").kfd_ioctl_create_queue_args, wrong)) == 3
