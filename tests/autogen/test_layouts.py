"""The generated ctypes classes (rawgrad/autogen/nv and amd) lay out exactly as gcc laid out the C structures they
came from.

tools/autogen.py records gcc's sizeof/offsetof of every generated class in each package's layouts.json; these tests
need neither gcc nor the headers (or the Debian packages they came from), only that record.
"""
from __future__ import annotations

import ctypes
import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

from rawgrad.autogen import layout_mismatches

PACKAGES = ("nv", "amd")
LAYOUTS = {package: json.loads((Path(importlib.import_module(f"rawgrad.autogen.{package}").__file__).parent /
                                "layouts.json").read_text()) for package in PACKAGES}
MODULES = [(package, name) for package in PACKAGES for name in sorted(LAYOUTS[package]["modules"])]


def module(package: str, name: str) -> ModuleType:
  return importlib.import_module(f"rawgrad.autogen.{package}.{name}")


def ctypes_classes(package: str, name: str) -> set[str]:
  mod = module(package, name)
  return {value.__name__ for value in vars(mod).values() if isinstance(value, type)
          and issubclass(value, (ctypes.Structure, ctypes.Union)) and value.__module__ == mod.__name__}


@pytest.mark.parametrize("package, name", MODULES)
def test_every_class_matches_gcc(package: str, name: str):
  problems = []
  for class_name, record in LAYOUTS[package]["modules"][name].items():
    cls = getattr(module(package, name), class_name, None)
    problems += [f"{class_name}: in layouts.json, not in the module"] if cls is None else layout_mismatches(cls, record)
  assert not problems, f"{len(problems)} layout mismatches in {package}/{name}:\n" + "\n".join(problems[:50])


@pytest.mark.parametrize("package, name", MODULES)
def test_every_class_is_recorded(package: str, name: str):
  unrecorded = sorted(ctypes_classes(package, name) - set(LAYOUTS[package]["modules"][name]))
  assert not unrecorded, f"classes in {package}/{name} without a gcc layout in layouts.json: {unrecorded}"


def fields(package: str) -> int:
  return sum(len(record["fields"]) for records in LAYOUTS[package]["modules"].values() for record in records.values())


def test_the_records_cover_the_modules_with_classes():
  # an empty record would pass the tests above vacuously
  nv, amd = LAYOUTS["nv"]["modules"], LAYOUTS["amd"]["modules"]
  assert len(nv["nv_rm"]) > 500 and len(nv["nv_uvm"]) > 100 and fields("nv") > 3000
  assert {"kfd", "hsa"} <= set(amd) and len(amd["kfd"]) >= 40 and len(amd["hsa"]) >= 10 and fields("amd") > 300
  assert set(LAYOUTS["amd"]["sources"]) == {"linux-libc-dev", "libhsa-runtime-dev", "linux-source-6.1", "llvm-14-dev"}
  assert amd["kernel_descriptor"]["kernel_descriptor_t"]["size"] == 64


@pytest.mark.parametrize("package, name, struct, field", [("nv", "nv_rm", "NVOS21_PARAMETERS", "status"),
                                                          ("amd", "kfd", "kfd_ioctl_create_queue_args",
                                                           "doorbell_offset")])
def test_a_wrong_record_is_caught(package: str, name: str, struct: str, field: str):
  record = LAYOUTS[package]["modules"][name][struct]
  cls = getattr(module(package, name), struct)
  assert layout_mismatches(cls, record) == []
  offset, size = record["fields"][field]
  wrong = {**record, "size": record["size"] + 8, "fields": {**record["fields"], field: [offset + 4, size * 2]}}
  assert len(layout_mismatches(cls, wrong)) == 3


def test_a_wrong_bitfield_is_caught():
  class Flags(ctypes.Structure):
    _fields_ = [("low", ctypes.c_uint32, 3), ("high", ctypes.c_uint32, 5)]
  record = {"size": 4, "fields": {}, "bitfields": {"low": [0, 3], "high": [3, 5]}}
  assert layout_mismatches(Flags, record) == []
  assert layout_mismatches(Flags, {**record, "bitfields": {"high": [4, 5]}}) != []
