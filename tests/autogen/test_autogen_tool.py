"""tools/autogen.py: its pure helpers always; the whole pipeline (libclang, gcc probe, ctypes check) on a small
header full of layout traps when libclang and gcc are installed (`pip install -e '.[autogen]'`)."""
from __future__ import annotations

import ctypes
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "autogen.py"


def load_tool():
  spec = importlib.util.spec_from_file_location("autogen_tool", TOOL)
  tool = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = tool  # dataclasses look their module up while the class is being made
  spec.loader.exec_module(tool)
  return tool


autogen = load_tool()


# ---- macro bodies -> Python

def test_arithmetic_macro_bodies_become_python():
  names = {"BASE"}
  assert autogen.macro_function_body(["(", "BASE", "+", "(", "i", ")", "*", "0x10U", ")"], ("i",), names) == \
    "(BASE + (i) * 0x10)"
  assert autogen.macro_function_body(["(", "i", ")", "/", "010"], ("i",), names) == "(i) // 0o10"


def test_range_macro_bodies_become_hi_lo_tuples():
  body = ["MW", "(", "(", "1055", "+", "(", "i", ")", "*", "64", ")", ":", "(", "1024", "+", "(", "i", ")", "*",
          "64", ")", ")"]
  python = autogen.macro_function_body(body, ("i",), set())
  assert eval(f"lambda i: {python}")(2) == (1055 + 128, 1024 + 128)
  assert autogen.macro_function_body(["31", ":", "(", "i", ")"], ("i",), set()) == "(31, (i))"


def test_other_macro_bodies_are_refused():
  assert autogen.macro_function_body(["sizeof", "(", "i", ")"], ("i",), set()) is None
  assert autogen.macro_function_body(["(", "i", ")", "?", "1", ":", "2"], ("i",), set()) is None
  assert autogen.macro_function_body(["UNKNOWN", "+", "i"], ("i",), set()) is None
  assert autogen.macro_function_body(['"text"'], ("i",), set()) is None


# ---- ctypes placement

def field(name: str, offset: int, size: int, align: int):
  return autogen.Field(name, f"ctypes.c_uint{size * 8}", offset, size, align)


def test_gaps_become_padding():
  # uint8 a; uint32 b __attribute__((aligned(8))): b sits at 8, where ctypes alone would put it at 4
  placed, align = autogen.place_fields([field("a", 0, 1, 1), field("b", 8, 4, 4)], 16, union=False, pack=None)
  assert [(f.name, f.offset, f.size) for f in placed] == [("a", 0, 1), ("_pad0", 1, 7), ("b", 8, 4), ("_pad1", 12, 4)]
  assert align == 4


def test_packed_layouts_need_a_pack():
  fields = [field("a", 0, 1, 1), field("b", 1, 4, 4)]
  assert autogen.place_fields(fields, 5, union=False, pack=None) is None
  placed, align = autogen.place_fields(fields, 5, union=False, pack=1)
  assert [f.name for f in placed] == ["a", "b"] and align == 1


# ---- the whole pipeline on trap-filled headers

TRICKY_HEADER = r"""
#include <stdint.h>
#define TRICKY_MAGIC 'F'
#define TRICKY_BASE 200
#define TRICKY_NR (TRICKY_BASE + 3)
#define TRICKY_ALL_ONES (~0U)
#define TRICKY_NEGATIVE (-5)
#define TRICKY_BIG 0xFFFFFFFFFFFFFFFFULL
#define TRICKY_FIELD 31:16
#define TRICKY_QMD_FIELD MW(7:4)
#define TRICKY_AT(i) (0x100 + (i) * 8)
#define TRICKY_BYTE(i) ((i) * 8 + 7):((i) * 8)
#define TRICKY_TYPE uint32_t
#define TRICKY_CAST_TYPE (uint32_t)
#define TRICKY_TEXT "text"
#define TRICKY_SIZE sizeof(TrickyAligned)
enum tricky_enum { TRICKY_A = 1, TRICKY_B = 0x10 };
typedef struct __attribute__((packed)) { uint8_t a; uint32_t b; uint16_t c; } TrickyPacked;
typedef struct { uint8_t p; uint32_t x __attribute__((aligned(8))); uint8_t y; } TrickyAligned;
typedef struct { uint32_t before; TrickyAligned aligned; } TrickyHolder;
typedef struct { uint32_t low : 3; uint32_t high : 5; uint32_t rest : 24; } TrickyBits;
typedef struct {
  uint32_t kind;
  union { uint64_t u; struct { uint32_t lo, hi; }; };
  struct { uint16_t v; uint8_t w[3]; } items[3];
  int (*callback)(void);
  volatile uint32_t doorbell;
  uint8_t tail[];
} TrickyNested;
typedef struct tricky_tag { uint64_t q; TrickyPacked packed[2]; } tricky_t, tricky_other_t;
typedef tricky_t tricky_again_t;
"""


def generate(tmp_path: Path, header: str):
  if autogen.cindex is None or shutil.which("gcc") is None:
    pytest.skip("needs libclang (pip install -e '.[autogen]') and gcc")
  repo = autogen.Repository("rawgrad/synthetic", "--synthetic-src", "--synthetic-rev", "SYNTHETIC", "test", (),
                            ("include",))
  (tmp_path / "synthetic" / "include").mkdir(parents=True)
  (tmp_path / "synthetic" / "include" / "tricky.h").write_text(header)
  module = autogen.Module("tricky", "traps", ((repo, "include"),), (autogen.Header(repo, "include/tricky.h"),),
                          preamble="#define MW(x) x")
  result = autogen.build_module(module, tmp_path, tmp_path)
  revisions = {r.name: ("test", "0" * 40) for r in (repo, autogen.NVIDIA_KERNEL, autogen.NVIDIA_DOC)}
  source = autogen.render_module(result, autogen.Provenance(revisions))
  autogen.check_ctypes(result, source)  # raises where ctypes and gcc disagree
  namespace: dict = {}
  exec(source, namespace)
  return result, namespace


def test_pipeline_values(tmp_path: Path):
  _, ns = generate(tmp_path, TRICKY_HEADER)
  assert (ns["TRICKY_MAGIC"], ns["TRICKY_NR"], ns["TRICKY_ALL_ONES"], ns["TRICKY_NEGATIVE"]) == (70, 203, 2**32 - 1, -5)
  assert ns["TRICKY_BIG"] == 2**64 - 1 and ns["TRICKY_SIZE"] == 16
  assert (ns["TRICKY_A"], ns["TRICKY_B"]) == (1, 16)
  assert ns["TRICKY_FIELD"] == (31, 16) and ns["TRICKY_QMD_FIELD"] == (7, 4)
  assert ns["TRICKY_AT"](3) == 0x118 and ns["TRICKY_BYTE"](2) == (23, 16)
  assert not {"TRICKY_TYPE", "TRICKY_CAST_TYPE", "TRICKY_TEXT"} & set(ns)


def test_pipeline_layouts(tmp_path: Path):
  result, ns = generate(tmp_path, TRICKY_HEADER)
  assert ctypes.sizeof(ns["TrickyPacked"]) == 7 and ns["TrickyPacked"]._pack_ == 1
  assert ns["TrickyAligned"].x.offset == 8 and ctypes.sizeof(ns["TrickyAligned"]) == 16
  assert ns["TrickyHolder"].aligned.offset == 8  # C aligns the member to 8, ctypes alone would say 4
  nested = ns["TrickyNested"]
  assert (nested.u.offset, nested.hi.offset, nested.items.offset, nested.callback.offset) == (8, 12, 16, 40)
  assert ns["tricky_t"] is ns["tricky_tag"] is ns["tricky_other_t"] is ns["tricky_again_t"]
  layouts = autogen.layouts_of(result)
  assert layouts["TrickyBits"]["bitfields"] == {"low": [0, 3], "high": [3, 5], "rest": [8, 24]}
  assert layouts["TrickyNested_items"] == {"size": 6, "fields": {"v": [0, 2], "w": [2, 3]}}
  assert layouts["TrickyNested"]["fields"]["tail"] == [52, None]  # a flexible array has no sizeof


# ---- what the AMD headers need: mask/shift field families, 32-bit words, two unnamed unions in one struct

PACKET_HEADER = r"""
#include <stdint.h>
#define PKT_HEADER_op_offset 0
#define PKT_HEADER_op_mask 0x000000FF
#define PKT_HEADER_op_shift 0
#define PKT_COUNT_count_offset 1
#define PKT_COUNT_count_mask 0x003FFFFF
#define PKT_COUNT_count_shift 0
#define PKT_COUNT_COUNT(x) (((x) & PKT_COUNT_count_mask) << PKT_COUNT_count_shift)
#define PKT_POLL_mem_offset 0
#define PKT_POLL_mem_mask 0x00000001
#define PKT_POLL_mem_shift 31
#define PKT_POLL_MEM(x) (((x) & PKT_POLL_mem_mask) << PKT_POLL_mem_shift)
#define FLAG_TOP (1 << 31)
#define NEGATIVE_WORD_SHIFT(x) ((x) << 30)
typedef struct {
  int64_t kind;
  union { int64_t value; uint64_t *pointer; };
  uint64_t mailbox;
  union { void *queue; uint64_t reserved; };
} TwoUnions;
"""


def generate_module(tmp_path: Path, header: str, **options: object):
  if autogen.cindex is None or shutil.which("gcc") is None:
    pytest.skip("needs libclang (pip install -e '.[autogen]') and gcc")
  stubs = autogen.StubHeaders("synthetic", (("packet.h", header),))
  autogen.write_stubs(stubs, tmp_path)
  module = autogen.Module("packet", "packets", ((stubs, ""),), (autogen.Header(stubs, "packet.h"),), preamble="",
                          **options)
  result = autogen.build_module(module, tmp_path, tmp_path)
  source = autogen.render_module(result, autogen.Provenance({stubs.name: ("test", "none")}, "amd"))
  autogen.check_ctypes(result, source)
  namespace: dict = {}
  exec(source, namespace)
  return namespace


def test_mask_families_become_hi_lo_over_the_packet():
  assert autogen.mask_range(1, 0x3FFFFF, 0, "count") == (53, 32)
  assert autogen.mask_range(0, 1, 31, "mem") == (31, 31)
  with pytest.raises(autogen.AutogenError, match="not a field inside one dword"):
    autogen.mask_range(0, 0xF0, 0, "holes")
  with pytest.raises(autogen.AutogenError, match="not a field inside one dword"):
    autogen.mask_range(0, 0xFF, 28, "straddles")


def test_packet_headers_through_the_pipeline(tmp_path: Path):
  ns = generate_module(tmp_path, PACKET_HEADER, mask_ranges=True, words32=True)
  assert (ns["PKT_HEADER_op"], ns["PKT_COUNT_count"], ns["PKT_POLL_mem"]) == ((7, 0), (53, 32), (31, 31))
  assert ns["PKT_COUNT_count_offset"] == 1 and ns["PKT_COUNT_COUNT"](5) == 5
  # bit 31 of a 32-bit word: C's int says negative, the word it builds is this
  assert ns["FLAG_TOP"] == 1 << 31 and ns["PKT_POLL_MEM"](1) == 1 << 31 and ns["NEGATIVE_WORD_SHIFT"](3) == 3 << 30


def test_without_words32_a_negative_c_value_stays_negative(tmp_path: Path):
  ns = generate_module(tmp_path, PACKET_HEADER)
  assert ns["FLAG_TOP"] == -(1 << 31) and "PKT_POLL_MEM" not in ns and "PKT_HEADER_op" not in ns


def test_two_unnamed_unions_of_one_struct_stay_apart(tmp_path: Path):
  two = generate_module(tmp_path, PACKET_HEADER)["TwoUnions"]
  assert (two.value.offset, two.pointer.offset, two.mailbox.offset, two.queue.offset, two.reserved.offset) == \
    (8, 8, 16, 24, 24)
  assert ctypes.sizeof(two) == 32


CPP_HEADER = r"""
#include <cstdint>
namespace outer { namespace inner {
enum : int32_t { ENTRY_SHIFT = 3, ENTRY_WIDTH = 2, ENTRY = 3 << 3 };
struct descriptor_t { uint32_t size; uint8_t reserved[4]; int64_t entry; uint16_t flags; uint8_t tail[6]; };
} }
"""


def test_cpp_headers_give_namespaced_records_and_enumerators(tmp_path: Path):
  if shutil.which("g++") is None: pytest.skip("needs g++'s C++ headers")
  ns = generate_module(tmp_path, CPP_HEADER, language="c++")
  descriptor = ns["descriptor_t"]
  assert ctypes.sizeof(descriptor) == 24 and (descriptor.entry.offset, descriptor.flags.offset) == (8, 16)
  assert (ns["ENTRY_SHIFT"], ns["ENTRY_WIDTH"], ns["ENTRY"]) == (3, 2, 24)
