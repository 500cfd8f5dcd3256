"""The generated NVIDIA ctypes classes lay out exactly as gcc laid out the C structures they came from.

tools/autogen.py records gcc's sizeof/offsetof of every generated class in rawgrad/autogen/nv/layouts.json; these
tests need neither gcc nor the headers, only that record.
"""
from __future__ import annotations

import ctypes
import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

import rawgrad.autogen.nv as nv
from rawgrad.autogen import layout_mismatches

LAYOUTS = json.loads((Path(nv.__file__).parent / "layouts.json").read_text())
MODULES = sorted(LAYOUTS["modules"])


def module(name: str) -> ModuleType:
  return importlib.import_module(f"rawgrad.autogen.nv.{name}")


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


def test_the_modules_have_classes_and_fields_to_check():
  # an empty record would pass the tests above vacuously
  assert len(LAYOUTS["modules"]["nv_rm"]) > 500 and len(LAYOUTS["modules"]["nv_uvm"]) > 100
  assert sum(len(r["fields"]) for m in LAYOUTS["modules"].values() for r in m.values()) > 3000


def test_a_wrong_record_is_caught():
  record = LAYOUTS["modules"]["nv_rm"]["NVOS21_PARAMETERS"]
  assert layout_mismatches(module("nv_rm").NVOS21_PARAMETERS, record) == []
  offset, size = record["fields"]["status"]
  wrong = {**record, "size": record["size"] + 8, "fields": {**record["fields"], "status": [offset + 4, size * 2]}}
  assert len(layout_mismatches(module("nv_rm").NVOS21_PARAMETERS, wrong)) == 3


def test_a_wrong_bitfield_is_caught():
  class Flags(ctypes.Structure):
    _fields_ = [("low", ctypes.c_uint32, 3), ("high", ctypes.c_uint32, 5)]
  record = {"size": 4, "fields": {}, "bitfields": {"low": [0, 3], "high": [3, 5]}}
  assert layout_mismatches(Flags, record) == []
  assert layout_mismatches(Flags, {**record, "bitfields": {"high": [4, 5]}}) != []
