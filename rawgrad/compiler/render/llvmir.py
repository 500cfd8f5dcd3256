"""Render a linear program as LLVM IR text: for the host CPU, for NVIDIA GPUs (NVPTX) and for AMD GPUs (AMDGPU).

One writer serves all three; the targets differ in the kernel's signature (the CPU's entry point reads its
argument block, a GPU kernel takes its 8-byte parameters directly: buffer addresses, then variables), in address
spaces (GPU buffers are global memory, addrspace 1; shared memory is addrspace 3; AMD's registers live in
addrspace 5), in the grid and thread indices (SPECIAL) and in the block barrier.
"""
from __future__ import annotations

import math
import re
import struct

from rawgrad.compiler.codegen.linearize import argument_table, kernel_parameters
from rawgrad.compiler.ir import GroupOp, Ops, UOp
from rawgrad.compiler.program_text import program_comment
from rawgrad.compiler.target import Target
from rawgrad.dtype import DType, PtrDType, dtypes

_LLVM_TYPES = {"bool": "i1", "int8": "i8", "uint8": "i8", "int16": "i16", "uint16": "i16", "int32": "i32",
               "uint32": "i32", "int64": "i64", "uint64": "i64", "index": "i64", "float16": "half",
               "bfloat16": "bfloat", "float32": "float", "float64": "double"}
_INTRINSIC_SUFFIX = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}
_UNARY_INTRINSICS = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}


def llvm_type(dtype: DType | PtrDType, in_memory: bool = False) -> str:
  """The LLVM type of a value (a vector type for a vector dtype); booleans are i8 in memory and i1 in registers."""
  if isinstance(dtype, PtrDType): return "ptr"
  scalar = "i8" if dtype.scalar == dtypes.bool and in_memory else _LLVM_TYPES[dtype.name]
  return f"<{dtype.count} x {scalar}>" if dtype.count > 1 else scalar


def llvm_constant(value: object, dtype: DType) -> str:
  """A constant of the dtype; for a vector dtype, value is the tuple of its lanes or one value for every lane."""
  if dtype.count > 1:
    lanes = value if isinstance(value, tuple) else (value,) * dtype.count
    scalar = dtype.scalar
    return "<" + ", ".join(f"{llvm_type(scalar)} {llvm_constant(lane, scalar)}" for lane in lanes) + ">"
  if dtype == dtypes.bool: return "true" if value else "false"
  if dtypes.is_int(dtype):
    bits = 8 * dtype.itemsize
    value = int(value) & ((1 << bits) - 1)
    return str(value - (1 << bits) if value >= 1 << (bits - 1) else value)
  value = float(value)
  if dtype == dtypes.float16: return "0xH%04X" % struct.unpack("<H", struct.pack("<e", value))[0]
  if dtype == dtypes.bfloat16: return "0xR%04X" % (struct.unpack("<I", struct.pack("<f", value))[0] >> 16)
  # LLVM writes float and double constants as the 64-bit pattern of the double holding the value
  return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]


def _is_signed(dtype: DType) -> bool:
  return dtype.kind == "int"


# the slice of the parallel work a call runs, and how many slices there are (kernel parameters)
CORE = UOp(Ops.SPECIAL, dtypes.index, arg="core")
CORES = UOp(Ops.SPECIAL, dtypes.index, arg="cores")


class LLVMRenderer:
  """program (from codegen.linearize) -> LLVM IR module text with one function `name`, for the target."""

  def __init__(self, target: Target | None = None, embed_program: bool = False):
    self.target, self.embed_program = target, embed_program

  def render(self, name: str, program: list[UOp]) -> str:
    """The module; with embed_program, the program follows as comment lines (for the emulated GPUs' compilers)."""
    kind = self.target.kind if self.target is not None else "cpu"
    module = _FunctionWriter(kernel_symbol(name), program, kind).write()
    return module + "\n" + program_comment(program) + "\n" if self.embed_program else module


class NVPTXRenderer(LLVMRenderer):
  """LLVM IR for `nvptx64-nvidia-cuda`: PTXCompiler turns it into PTX and a cubin."""


class AMDGPURenderer(LLVMRenderer):
  """LLVM IR for `amdgcn-amd-amdhsa`: LLVMCompiler turns it into a code object."""


# the intrinsics that read a GPU thread's grid (block) and block (thread) indices, per dimension
_SPECIAL_INTRINSICS = {
  "nv": {"gidx": "llvm.nvvm.read.ptx.sreg.ctaid.{}", "lidx": "llvm.nvvm.read.ptx.sreg.tid.{}"},
  "amd": {"gidx": "llvm.amdgcn.workgroup.id.{}", "lidx": "llvm.amdgcn.workitem.id.{}"},
}
_REGISTER_SPACE = {"cpu": 0, "nv": 0, "amd": 5}  # where allocas live
_AMD_DATA_LAYOUT = ("e-p:64:64-p1:64:64-p2:32:32-p3:32:32-p4:64:64-p5:32:32-p6:32:32-p7:160:256:256:32-p8:128:128-"
                    "p9:192:256:256:32-i64:64-v16:16-v24:32-v32:32-v48:64-v96:128-v192:256-v256:256-v512:512-"
                    "v1024:1024-v2048:2048-n32:64-S32-A5-G1-ni:7:8:9")


def known_divisor(index: UOp) -> int:
  """A number the index is always a multiple of (0: it is always 0)."""
  if index.op is Ops.CONST and isinstance(index.arg, int): return abs(index.arg)
  if index.op is Ops.ADD: return math.gcd(known_divisor(index.src[0]), known_divisor(index.src[1]))
  if index.op is Ops.MUL: return known_divisor(index.src[0]) * known_divisor(index.src[1])
  return 1


def kernel_symbol(name: str) -> str:
  """The kernel's name as a symbol of the object file."""
  return re.sub(r"[^A-Za-z0-9_]", "_", name)


def variable_slot_name(variable: UOp) -> str:
  """The i64 parameter that carries a variable's argument slot."""
  return f"%var_{kernel_symbol(variable.arg[0])}"


class _FunctionWriter:
  def __init__(self, name: str, program: list[UOp], kind: str = "cpu"):
    self.name, self.program, self.kind = name, program, kind
    self.gpu = kind != "cpu"
    self.names: dict[UOp, str] = {}
    self.lines: list[str] = []
    self.allocas: list[str] = []
    self.declarations: set[str] = set()
    self.counter = 0
    self.streams = False
    self.table = argument_table(program)
    self.table_words: dict[UOp, int] = {}  # with an argument table: each buffer's word in it
    # a GPU kernel loads its words from the table where it uses them; a CPU kernel's entry point loads them all and
    # passes them to its body as it passes an argument block's, the buffers as noalias parameters: a buffer address
    # loaded from memory could alias any other, and LLVM would then keep every load in the loops where it is used
    # (cross entropy's gradient, 21 words: each row's values loaded and its log1p formed again for every element)
    self.body_reads_table = self.table is not None and self.gpu
    # on a CPU, a vector stored a lane at a time to scattered addresses is one masked scatter (scattered_stores)
    self.scatters, self.folded = ({}, set()) if self.gpu else scattered_stores(program)

  def fresh(self, hint: str = "v") -> str:
    self.counter += 1
    return f"%{hint}{self.counter}"

  def value(self, node: UOp) -> str:
    if node.op is Ops.CONST: return llvm_constant(node.arg, node.dtype)
    if node.op is Ops.VECTORIZE and node not in self.names and all(s.op is Ops.CONST for s in node.src):
      return llvm_constant(tuple(s.arg for s in node.src), node.dtype)
    if node not in self.names: raise ValueError(f"LLVM renderer: {node.op} is used before it is computed")
    return self.names[node]

  def emit(self, text: str) -> None:
    self.lines.append("  " + text)

  def write(self) -> str:
    return self.write_gpu() if self.gpu else self.write_cpu()

  def write_gpu(self) -> str:
    """One kernel function taking its 8-byte parameters: the buffers the program uses (in DEFINE_GLOBAL order, as
    global pointers), then its variables (sorted by name); or, with an argument table, the table's address alone."""
    params, variables = self.name_parameters()
    shared = self.shared_globals()
    for instruction in self.program: self.instruction(instruction)
    if self.table is not None: signature = [self.table_parameter()]
    else:
      signature = [f"ptr addrspace(1) noalias {self.names[p]}" for p in params]
      signature += [f"i64 {variable_slot_name(v)}" for v in variables]
    body = "\n".join(self.allocas + self.lines)
    declarations = "\n".join(sorted(self.declarations) + shared)
    if self.kind == "nv":
      header, attributes = "target triple = \"nvptx64-nvidia-cuda\"", 'attributes #0 = { nounwind }'
      convention = "ptx_kernel"
    else:
      header = f"target triple = \"amdgcn-amd-amdhsa\"\ntarget datalayout = \"{_AMD_DATA_LAYOUT}\""
      # no implicit arguments: the kernel reads nothing but its own parameters
      attributes = ('attributes #0 = { nounwind "amdgpu-no-implicitarg-ptr" "amdgpu-flat-work-group-size"="1,1024" '
                    '"uniform-work-group-size"="true" }')
      convention = "amdgpu_kernel"
    kernel = (f"define {convention} void @{self.name}({', '.join(signature)}) #0 {{\nentry:\n{body}\n"
              "  ret void\n}\n")
    return f"{header}\n{declarations}\n\n{kernel}\n{attributes}\n{self.table_metadata()}"

  def name_parameters(self) -> tuple[list[UOp], list[UOp]]:
    params, variables = kernel_parameters(self.program)
    if self.body_reads_table: self.table_words = {param: word for word, param in enumerate(params)}
    else: self.names.update({param: f"%data{param.arg}" for param in params})
    for word, variable in enumerate(variables, start=len(params)):
      slot = self.names[variable] = variable_slot_name(variable)
      if self.body_reads_table:
        self.emit(f"{slot} = load i64, {self.table_word(word)}, align 8, !invariant.load !1")
      if variable.dtype == dtypes.float64:  # a parameterized constant: its slot holds the float's bits
        self.names[variable] = f"{slot}.value"
        self.emit(f"{slot}.value = bitcast i64 {slot} to double")
    return params, variables

  # ** the argument table: words the kernel loads where it uses them (they never change during a launch)

  def table_parameter(self) -> str:
    return f"{self.pointer(self.table)} noalias readonly align 8 dereferenceable({8 * self.table.dtype.size}) %table"

  def table_word(self, word: int) -> str:
    """A pointer to a word of the argument table, as the operand of a load."""
    address = self.fresh("word")
    self.emit(f"{address} = getelementptr inbounds i64, {self.pointer(self.table)} %table, i64 {word}")
    return f"{self.pointer(self.table)} {address}"

  def buffer_address(self, buffer: UOp) -> str:
    """A buffer's base address: the kernel's parameter, or a load from the argument table."""
    if buffer not in self.table_words: return self.value(buffer)
    return self.define(buffer, f"load {self.pointer(buffer)}, {self.table_word(self.table_words[buffer])}, align 8, "
                               "!invariant.load !1", "data")

  def table_metadata(self) -> str:
    return "!1 = !{}\n" if self.body_reads_table else ""

  def shared_globals(self) -> list[str]:
    """GPU shared memory (DEFINE_LOCAL) as addrspace(3) module globals; their contents start undefined."""
    found = []
    for node in dict.fromkeys(u for u in self.program if u.op is Ops.DEFINE_LOCAL):
      self.names[node] = f"@{self.name}.shared{node.arg}"
      element = llvm_type(node.dtype.base, in_memory=True)
      found.append(f"{self.names[node]} = internal addrspace(3) global [{node.dtype.size} x {element}] undef, "
                   "align 16")
    return found

  def space(self, node: UOp) -> int:
    """The address space a pointer value (a buffer, an element address, a register) points into."""
    while node.op in (Ops.INDEX, Ops.AFTER, Ops.BARRIER): node = node.src[0]
    if node.op is Ops.DEFINE_REG: return _REGISTER_SPACE[self.kind]
    if not self.gpu: return 0
    return {Ops.DEFINE_GLOBAL: 1, Ops.DEFINE_LOCAL: 3}.get(node.op, 0)

  def pointer(self, node: UOp) -> str:
    """The LLVM type of a pointer into node's memory: `ptr`, or `ptr addrspace(n)`."""
    space = self.space(node)
    return "ptr" if space == 0 else f"ptr addrspace({space})"

  def write_cpu(self) -> str:
    """The kernel body as an internal function with noalias parameters, and the entry point the runtime calls:
    `void name(ptr args, i64 core, i64 cores)`, where args holds 8-byte slots: the addresses of the buffers the
    program uses (in DEFINE_GLOBAL order), then its variables' values (sorted by name); or, with an argument table,
    the table's address alone, and the entry point loads those words from the table."""
    params, variables = self.name_parameters()
    self.names.update({CORE: "%core", CORES: "%cores"})
    globals_ = self.scratch_globals()
    for instruction in self.program: self.instruction(instruction)
    signature = [f"ptr noalias {self.names[p]}" for p in params]
    signature += [f"i64 {variable_slot_name(v)}" for v in variables]
    signature += ["i64 %core", "i64 %cores"]
    # non-temporal stores are weakly ordered: make them visible before whoever waits for the kernel reads them
    fence = "\n  fence seq_cst" if self.streams else ""
    # a slice that does not finish a GROUP leaves early, through the same exit
    body = "\n".join(self.allocas + self.lines + ["  br label %exit", "exit:"])
    declarations = "\n".join(sorted(self.declarations) + globals_)
    kernel = (f"define internal void @{self.name}.body({', '.join(signature)}) #0 {{\nentry:\n{body}{fence}\n"
              "  ret void\n}\n")
    metadata = ("!0 = !{i32 1}\n" if self.streams else "") + self.table_metadata()
    return f"{declarations}\n\n{kernel}\n{self.entry_point(params, variables)}\n{metadata}" \
           'attributes #0 = { nounwind alwaysinline "frame-pointer"="none" }\n' \
           'attributes #1 = { nounwind "frame-pointer"="none" }\n'

  def scratch_globals(self) -> list[str]:
    """Module globals for the program's scratch arrays and, per BARRIER, its count of finished chunks: zeroed in the
    loaded image (.bss), aligned to cache lines."""
    found = []
    for node in dict.fromkeys(u for u in self.program if u.op is Ops.DEFINE_SCRATCH):
      self.names[node] = f"@{self.name}.scratch{node.arg}"
      element = llvm_type(node.dtype.base, in_memory=True)
      found.append(f"{self.names[node]} = internal global [{node.dtype.size} x {element}] zeroinitializer, align 64")
    for node in dict.fromkeys(u for u in self.program if u.op is Ops.BARRIER):
      found.append(f"{self.counter_of(node)} = internal global i64 0, align 64")
    return found

  def counter_of(self, barrier: UOp) -> str:
    return f"@{self.name}.finished{barrier.src[0].arg}"

  def entry_point(self, params: list[UOp], variables: list[UOp]) -> str:
    # the words are in the argument block, or in the table whose address is the block's only word
    lines, arguments, words = [], [], "%args"
    if self.table is not None:
      lines.append("  %table = load ptr, ptr %args, align 8")
      words = "%table"
    for slot, node in enumerate(params + variables):
      kind = "ptr" if node.op is Ops.DEFINE_GLOBAL else "i64"
      lines.append(f"  %slot{slot} = getelementptr inbounds i64, ptr {words}, i64 {slot}")
      lines.append(f"  %arg{slot} = load {kind}, ptr %slot{slot}, align 8")
      arguments.append(f"{kind} %arg{slot}")
    arguments += ["i64 %core", "i64 %cores"]
    call = f"  call void @{self.name}.body({', '.join(arguments)})"
    return f"define void @{self.name}(ptr %args, i64 %core, i64 %cores) #1 {{\nentry:\n" + "\n".join(lines + [call]) + \
      "\n  ret void\n}\n"

  # *** instructions ***

  def instruction(self, node: UOp) -> None:
    if node in self.folded: return
    op = node.op
    if op is Ops.SPECIAL and self.gpu: return self.op_special(node)
    if op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_SCRATCH, Ops.DEFINE_VAR, Ops.CONST, Ops.SINK, Ops.SPECIAL): return
    if not self.gpu and node.dtype.scalar == dtypes.bfloat16 and op in GroupOp.ALU and op is not Ops.WHERE:
      return self.bfloat16_math(node)
    handler = getattr(self, f"op_{op.name.lower()}", None)
    if handler is not None: handler(node)
    elif op in _BINARY or op in (Ops.MAX, Ops.CMPLT, Ops.CMPNE): self.binary(node)
    elif op in _UNARY_INTRINSICS: self.unary_intrinsic(node)
    else: raise NotImplementedError(f"LLVM renderer has no rule for {op}")

  def bfloat16_math(self, node: UOp) -> None:
    """bfloat16 arithmetic on a CPU, written out as LLVM would do it, in float32 rounded once, but rounded here
    (round_to_bfloat16): LLVM's own rounding is a library call or an instruction that flushes denormals."""
    self.counter += 1
    widened = []
    for source in node.src:
      if source.dtype.scalar != dtypes.bfloat16:
        widened.append(source)
        continue
      # a node of its own (the tag), named by the widening emitted here: an equal node elsewhere in the program may
      # be inside a loop this instruction is not
      single = UOp(Ops.CAST, dtypes.float32.vec(source.dtype.count), (source,), tag=("bfloat16 math", self.counter))
      self.names[single] = self.widen_bfloat16(self.value(source), source.dtype.count)
      widened.append(single)
    wide = UOp(node.op, dtypes.float32.vec(node.dtype.count), tuple(widened), node.arg, ("bfloat16 math", self.counter))
    self.instruction(wide)
    self.define(node, self.round_to_bfloat16(self.value(wide), wide.dtype))

  def define(self, node: UOp, text: str, hint: str = "v") -> str:
    name = self.fresh(hint)
    self.names[node] = name
    self.emit(f"{name} = {text}")
    return name

  def op_range(self, node: UOp) -> None:
    label = self.fresh("loop")[1:]
    counter = f"%{label}.i"
    self.names[node] = counter
    start, end = "0", self.value(node.src[0])
    if node.arg[1] == "parallel": start, end = self.slice_bounds(label, end)
    if node.arg[1] == "last":  # one iteration in the last slice
      self.emit(f"%{label}.core1 = add i64 %core, 1")
      self.emit(f"%{label}.last = icmp eq i64 %{label}.core1, %cores")
      self.emit(f"%{label}.end = zext i1 %{label}.last to i64")
      end = f"%{label}.end"
    self.emit(f"br label %{label}.pre")
    self.lines.append(f"{label}.pre:")
    self.emit(f"br label %{label}.head")
    self.lines.append(f"{label}.head:")
    self.emit(f"{counter} = phi i64 [{start}, %{label}.pre], [{counter}.next, %{label}.latch]")
    self.emit(f"{counter}.ok = icmp slt i64 {counter}, {end}")
    self.emit(f"br i1 {counter}.ok, label %{label}.body, label %{label}.exit")
    self.lines.append(f"{label}.body:")

  def slice_bounds(self, label: str, size: str) -> tuple[str, str]:
    """The iterations of a parallel loop of `size` that slice `core` of `cores` runs: [size*core/cores,
    size*(core+1)/cores)."""
    self.emit(f"%{label}.scaled = mul i64 {size}, %core")
    self.emit(f"%{label}.start = udiv i64 %{label}.scaled, %cores")
    self.emit(f"%{label}.core1 = add i64 %core, 1")
    self.emit(f"%{label}.scaled1 = mul i64 {size}, %{label}.core1")
    self.emit(f"%{label}.end = udiv i64 %{label}.scaled1, %cores")
    return f"%{label}.start", f"%{label}.end"

  def op_special(self, node: UOp) -> None:
    """A grid (gidx) or thread (lidx) index of a GPU launch, read from the hardware and widened to 64 bits."""
    kind, dimension = node.arg[:4], "xyz"[int(node.arg[4])]
    intrinsic = _SPECIAL_INTRINSICS[self.kind][kind].format(dimension)
    self.declarations.add(f"declare i32 @{intrinsic}()")
    narrow = self.fresh("id")
    self.emit(f"{narrow} = call i32 @{intrinsic}()")
    self.define(node, f"zext i32 {narrow} to i64")

  def block_barrier(self, node: UOp) -> None:
    """Every thread of the block waits here; shared-memory writes before it are seen by reads after it."""
    if self.kind == "nv":
      self.declarations.add("declare void @llvm.nvvm.barrier0()")
      self.emit("call void @llvm.nvvm.barrier0()")
    else:
      self.declarations.add("declare void @llvm.amdgcn.s.barrier()")
      self.emit('fence syncscope("workgroup") release')
      self.emit("call void @llvm.amdgcn.s.barrier()")
      self.emit('fence syncscope("workgroup") acquire')
    self.names[node] = self.value(node.src[0])

  def op_barrier(self, node: UOp) -> None:
    """Add the chunks this slice did to the count (acq_rel: its stores are published, and the slice that completes
    the count sees everyone's); that slice resets the count for the next launch and goes on, the others leave. A
    slice with no chunks never goes on: it may add 0 after the count was completed."""
    if node.src[0].op is Ops.DEFINE_LOCAL: return self.block_barrier(node)
    label = self.fresh("barrier")[1:]
    counter, total = self.counter_of(node), node.arg
    start, end = self.slice_bounds(label, str(total))
    self.emit(f"%{label}.mine = sub i64 {end}, {start}")
    self.emit(f"%{label}.before = atomicrmw add ptr {counter}, i64 %{label}.mine acq_rel, align 8")
    self.emit(f"%{label}.after = add i64 %{label}.before, %{label}.mine")
    self.emit(f"%{label}.complete = icmp eq i64 %{label}.after, {total}")
    self.emit(f"%{label}.worked = icmp ne i64 %{label}.mine, 0")
    self.emit(f"%{label}.last = and i1 %{label}.complete, %{label}.worked")
    self.emit(f"br i1 %{label}.last, label %{label}.go, label %exit")
    self.lines.append(f"{label}.go:")
    self.emit(f"store atomic i64 0, ptr {counter} monotonic, align 8")
    self.names[node] = self.value(node.src[0])

  def op_end(self, node: UOp) -> None:
    counter = self.value(node.src[0])
    label = counter[1:-2]
    self.emit(f"br label %{label}.latch")
    self.lines.append(f"{label}.latch:")
    self.emit(f"{counter}.next = add nuw nsw i64 {counter}, 1")
    self.emit(f"br label %{label}.head")
    self.lines.append(f"{label}.exit:")

  def op_define_reg(self, node: UOp) -> None:
    register = f"%acc{node.arg[0]}"
    self.names[node] = register
    space = _REGISTER_SPACE[self.kind]
    self.allocas.append(f"  {register} = alloca {llvm_type(node.dtype)}" + (f", addrspace({space})" if space else ""))
    self.emit(f"store {llvm_type(node.dtype)} {llvm_constant(node.arg[1], node.dtype)}, {self.pointer(node)} "
              f"{register}")

  def op_define_local(self, node: UOp) -> None:
    if self.gpu: return  # a module global (shared_globals)
    # a second loop nest (a peeled remainder) fills the same local buffer again: one stack allocation serves both
    if node in self.names: return
    register = f"%local{node.arg}"
    self.names[node] = register
    self.allocas.append(f"  {register} = alloca [{node.dtype.size} x {llvm_type(node.dtype.base, in_memory=True)}], "
                        "align 64")

  def op_index(self, node: UOp) -> None:
    buffer, index = node.src[0], self.value(node.src[1])
    if len(node.src) > 2 and node.src[2].dtype.count == 1:
      # an invalid (padded) access reads element 0 instead, and the load replaces the value by 0
      safe = self.fresh("safe")
      self.emit(f"{safe} = select i1 {self.value(node.src[2])}, i64 {index}, i64 0")
      index = safe
    element = llvm_type(node.dtype.base, in_memory=True)
    address = self.buffer_address(buffer)
    self.define(node, f"getelementptr inbounds {element}, {self.pointer(buffer)} {address}, i64 {index}", "addr")

  def op_load(self, node: UOp) -> None:
    pointer = node.src[0]
    if pointer.op is Ops.DEFINE_REG:
      self.define(node, f"load {llvm_type(node.dtype)}, {self.pointer(pointer)} {self.value(pointer)}")
      return
    stored, gate = llvm_type(node.dtype, in_memory=True), pointer.src[2] if len(pointer.src) > 2 else None
    align = self.alignment(pointer, node.dtype)
    if gate is not None and gate.dtype.count > 1:
      # lanes whose gate is false touch no memory and read 0
      function = self.masked("load", node.dtype, self.space(pointer))
      address = f"{self.pointer(pointer)} align {align} {self.value(pointer)}"
      loaded = self.define(node, f"call {stored} {function}({address}, {llvm_type(gate.dtype)} {self.value(gate)}, "
                                 f"{stored} zeroinitializer)")
    else:
      loaded = self.define(node, f"load {stored}, {self.pointer(pointer)} {self.value(pointer)}, align {align}")
    if node.dtype.scalar == dtypes.bool: loaded = self.define(node, f"icmp ne {stored} {loaded}, zeroinitializer"
                                                             if node.dtype.count > 1 else f"icmp ne i8 {loaded}, 0")
    if gate is not None and gate.dtype.count == 1:
      t = llvm_type(node.dtype)
      self.define(node, f"select i1 {self.value(gate)}, {t} {loaded}, {t} {llvm_constant(0, node.dtype)}")

  def alignment(self, pointer: UOp, dtype: DType) -> int:
    """The alignment a GPU access of a whole vector may assume: buffers start 64-byte aligned, so a vector at an
    element index that is a multiple of its lanes is aligned to its size (the GPU then moves it in one instruction).
    CPUs access vectors unaligned at no cost: their alignment stays the element's."""
    if not self.gpu or dtype.count == 1 or pointer.op is not Ops.INDEX: return dtype.itemsize
    if known_divisor(pointer.src[1]) % dtype.count: return dtype.itemsize
    return min(dtype.nbytes, 16)

  def op_store(self, node: UOp) -> None:
    if node in self.scatters: return self.scatter(*self.scatters[node])
    pointer, value = node.src
    dtype = value.dtype
    text = self.value(value)
    if pointer.op is Ops.DEFINE_REG:
      self.emit(f"store {llvm_type(dtype)} {text}, {self.pointer(pointer)} {self.value(pointer)}")
      return
    if dtype.scalar == dtypes.bool:
      widened = self.fresh()
      self.emit(f"{widened} = zext {llvm_type(dtype)} {text} to {llvm_type(dtype, in_memory=True)}")
      text = widened
    stored, gate = llvm_type(dtype, in_memory=True), pointer.src[2] if len(pointer.src) > 2 else None
    address = self.value(pointer)
    if gate is not None and gate.dtype.count > 1:
      function = self.masked("store", dtype, self.space(pointer))
      self.emit(f"call void {function}({stored} {text}, {self.pointer(pointer)} align {self.alignment(pointer, dtype)} "
                f"{address}, "
                f"{llvm_type(gate.dtype)} {self.value(gate)})")
      return
    if node.arg == "stream" and gate is None and _streamable(dtype) and not self.gpu:
      self.stream_store(stored, text, address, dtype.nbytes)
      return
    if gate is not None:
      # an invalid (out of range) element is not written at all
      label = self.fresh("store")[1:]
      self.emit(f"br i1 {self.value(gate)}, label %{label}.do, label %{label}.done")
      self.lines.append(f"{label}.do:")
      self.emit(f"store {stored} {text}, {self.pointer(pointer)} {address}, align {dtype.itemsize}")
      self.emit(f"br label %{label}.done")
      self.lines.append(f"{label}.done:")
      return
    self.emit(f"store {stored} {text}, {self.pointer(pointer)} {address}, align {self.alignment(pointer, dtype)}")

  def scatter(self, vector: UOp, stores: list[UOp]) -> None:
    """Every lane of `vector` stored to its own address (the stores' pointers, in lane order) by one masked
    scatter, all lanes on: LLVM turns it into scatter instructions (AVX-512) or the lanes' stores (AVX2)."""
    count, dtype = len(stores), vector.dtype
    pointers = "poison"
    for lane, store in enumerate(stores):
      pointers_now = self.fresh("lanes")
      self.emit(f"{pointers_now} = insertelement <{count} x ptr> {pointers}, ptr {self.value(store.src[0])}, "
                f"i64 {lane}")
      pointers = pointers_now
    name = f"@llvm.masked.scatter.{_vector_suffix(dtype)}.v{count}p0"
    t, mask = llvm_type(dtype), f"<{count} x i1>"
    self.declarations.add(f"declare void {name}({t}, <{count} x ptr>, i32, {mask})")
    everywhere = ", ".join(["i1 true"] * count)
    self.emit(f"call void {name}({t} {self.value(vector)}, <{count} x ptr> {pointers}, i32 {dtype.itemsize}, "
              f"{mask} <{everywhere}>)")

  def stream_store(self, stored: str, text: str, address: str, nbytes: int) -> None:
    """A non-temporal store (it bypasses the caches) where the address is aligned to the vector, a plain one
    elsewhere. Streamed stores are ordered with a fence before the kernel returns."""
    label = self.fresh("stream")[1:]
    self.emit(f"%{label}.address = ptrtoint ptr {address} to i64")
    self.emit(f"%{label}.offset = and i64 %{label}.address, {nbytes - 1}")
    self.emit(f"%{label}.aligned = icmp eq i64 %{label}.offset, 0")
    self.emit(f"br i1 %{label}.aligned, label %{label}.fast, label %{label}.plain")
    self.lines.append(f"{label}.fast:")
    self.emit(f"store {stored} {text}, ptr {address}, align {nbytes}, !nontemporal !0")
    self.emit(f"br label %{label}.done")
    self.lines.append(f"{label}.plain:")
    self.emit(f"store {stored} {text}, ptr {address}, align 1")
    self.emit(f"br label %{label}.done")
    self.lines.append(f"{label}.done:")
    self.streams = True

  def masked(self, what: str, dtype: DType, space: int) -> str:
    stored = llvm_type(dtype, in_memory=True)
    mask = f"<{dtype.count} x i1>"
    pointer = "ptr" if space == 0 else f"ptr addrspace({space})"
    name = f"@llvm.masked.{what}.{_vector_suffix(dtype, in_memory=True)}.p{space}"
    if what == "load": self.declarations.add(f"declare {stored} {name}({pointer}, {mask}, {stored})")
    else: self.declarations.add(f"declare void {name}({stored}, {pointer}, {mask})")
    return name

  # *** vectors ***

  def op_vectorize(self, node: UOp) -> None:
    t, scalar = llvm_type(node.dtype), llvm_type(node.dtype.scalar)
    if all(source.op is Ops.CONST for source in node.src):
      self.names[node] = llvm_constant(tuple(source.arg for source in node.src), node.dtype)
      return
    if all(source is node.src[0] for source in node.src):
      single = self.fresh()
      self.emit(f"{single} = insertelement <1 x {scalar}> poison, {scalar} {self.value(node.src[0])}, i64 0")
      self.define(node, f"shufflevector <1 x {scalar}> {single}, <1 x {scalar}> poison, "
                        f"<{node.dtype.count} x i32> zeroinitializer")
      return
    current = "poison"
    for lane, source in enumerate(node.src):
      current = self.define(node, f"insertelement {t} {current}, {scalar} {self.value(source)}, i64 {lane}")

  def op_gep(self, node: UOp) -> None:
    source = node.src[0]
    t = llvm_type(source.dtype)
    if len(node.arg) == 1:
      self.define(node, f"extractelement {t} {self.value(source)}, i64 {node.arg[0]}")
      return
    mask = ", ".join(f"i32 {lane}" for lane in node.arg)
    second = self.value(node.src[1]) if len(node.src) > 1 else "poison"
    self.define(node, f"shufflevector {t} {self.value(source)}, {t} {second}, <{len(node.arg)} x i32> <{mask}>")

  def op_where(self, node: UOp) -> None:
    condition, a, b = node.src
    t = llvm_type(node.dtype)
    self.define(node, f"select {llvm_type(condition.dtype)} {self.value(condition)}, {t} {self.value(a)}, "
                      f"{t} {self.value(b)}")

  def op_mulacc(self, node: UOp) -> None:
    a, b, c = (self.value(s) for s in node.src)
    t = llvm_type(node.dtype)
    if dtypes.is_float(node.dtype):
      self.define(node, f"call {t} {self.intrinsic('fma', node.dtype, 3)}({t} {a}, {t} {b}, {t} {c})")
      return
    product = self.fresh()
    self.emit(f"{product} = mul {t} {a}, {b}")
    self.define(node, f"add {t} {product}, {c}")

  def op_reciprocal(self, node: UOp) -> None:
    t = llvm_type(node.dtype)
    self.define(node, f"fdiv {t} {llvm_constant(1.0, node.dtype)}, {self.value(node.src[0])}")

  def unary_intrinsic(self, node: UOp) -> None:
    """A function the target computes itself (see Target.native_math; the math rules expand the others)."""
    t = llvm_type(node.dtype)
    function = self.intrinsic(_UNARY_INTRINSICS[node.op], node.dtype, 1)
    self.define(node, f"call {t} {function}({t} {self.value(node.src[0])})")

  def intrinsic(self, base: str, dtype: DType, arity: int) -> str:
    t = llvm_type(dtype)
    name = f"@llvm.{base}.{_vector_suffix(dtype)}"
    self.declarations.add(f"declare {t} {name}({', '.join([t] * arity)})")
    return name

  def binary(self, node: UOp) -> None:
    a, b = node.src
    dtype = a.dtype
    t, x, y = llvm_type(dtype), self.value(a), self.value(b)
    if node.op is Ops.MAX:
      if dtypes.is_float(dtype):
        self.define(node, f"call {t} {self.intrinsic('maximum', dtype, 2)}({t} {x}, {t} {y})")
        return
      if dtype.scalar == dtypes.bool:
        self.define(node, f"or {t} {x}, {y}")
        return
      bigger = self.fresh()
      self.emit(f"{bigger} = icmp {'sgt' if _is_signed(dtype) else 'ugt'} {t} {x}, {y}")
      self.define(node, f"select {llvm_type(dtypes.bool.vec(dtype.count))} {bigger}, {t} {x}, {t} {y}")
      return
    if node.op is Ops.CMPLT:
      if dtypes.is_float(dtype): self.define(node, f"fcmp olt {t} {x}, {y}")
      else: self.define(node, f"icmp {'slt' if _is_signed(dtype) else 'ult'} {t} {x}, {y}")
      return
    if node.op is Ops.CMPNE:
      self.define(node, f"fcmp une {t} {x}, {y}" if dtypes.is_float(dtype) else f"icmp ne {t} {x}, {y}")
      return
    float_name, signed_name, unsigned_name = _BINARY[node.op]
    if dtypes.is_float(dtype): instruction = float_name
    else: instruction = signed_name if _is_signed(dtype) else unsigned_name
    if instruction is None: raise NotImplementedError(f"{node.op} is not defined for {dtype}")
    self.define(node, f"{instruction} {t} {x}, {y}")

  def op_cast(self, node: UOp) -> None:
    source, value = node.src[0].dtype, self.value(node.src[0])
    # a CPU converts bfloat16 in integer operations (see widen_bfloat16 and round_to_bfloat16)
    if not self.gpu and source.scalar == dtypes.bfloat16 and node.dtype.scalar != dtypes.bool:
      source, value = dtypes.float32.vec(source.count), self.widen_bfloat16(value, source.count)
    if not self.gpu and node.dtype.scalar == dtypes.bfloat16:
      self.define(node, self.round_to_bfloat16(value, source))
      return
    if {source.scalar, node.dtype.scalar} == {dtypes.float16, dtypes.bfloat16}:
      # no instruction converts between the two 16-bit formats; float holds both exactly
      widened = self.fresh()
      wide = dtypes.float32.vec(source.count)
      self.emit(f"{widened} = fpext {llvm_type(source)} {value} to {llvm_type(wide)}")
      source, value = wide, widened
    if source.scalar == dtypes.float64 and node.dtype.scalar in (dtypes.float16, dtypes.bfloat16):
      # through float32, as PyTorch converts: no instruction narrows a double to 16 bits (LLVM calls libgcc, whose
      # __truncdfbf2 many lack)
      single = self.fresh()
      wide = dtypes.float32.vec(source.count)
      self.emit(f"{single} = fptrunc {llvm_type(source)} {value} to {llvm_type(wide)}")
      source, value = wide, single
    self.define(node, _cast_text(value, source, node.dtype))

  def widen_bfloat16(self, value: str, count: int) -> str:
    """bfloat16 -> float32 on a CPU in integer operations: an `fpext` lets LLVM move exact operations (max) to the
    narrow type, which it then computes through the library call again."""
    halves, words = dtypes.uint16.vec(count), dtypes.uint32.vec(count)
    half, word, shifted = self.fresh(), self.fresh(), self.fresh()
    self.emit(f"{half} = bitcast {llvm_type(dtypes.bfloat16.vec(count))} {value} to {llvm_type(halves)}")
    self.emit(f"{word} = zext {llvm_type(halves)} {half} to {llvm_type(words)}")
    self.emit(f"{shifted} = shl {llvm_type(words)} {word}, {llvm_constant(16, words)}")
    single = self.fresh()
    self.emit(f"{single} = bitcast {llvm_type(words)} {shifted} to {llvm_type(dtypes.float32.vec(count))}")
    return single

  def round_to_bfloat16(self, value: str, source: DType) -> str:
    """A CPU's conversion to bfloat16 in integer operations, as dtypes.bfloat16_bits rounds: through float32, to
    nearest with ties to even, nan kept nan. LLVM's own `fptrunc` to bfloat calls __truncsfbf2 without AVX-512 BF16
    (libgcc before 13 lacks it) and with it is VCVTNEPS2BF16, which flushes denormals to 0 (PyTorch keeps them)."""
    single = dtypes.float32.vec(source.count)
    if source.scalar != dtypes.float32:
      widened = self.fresh()
      self.emit(f"{widened} = {_cast_text(value, source, single)}")
      value = widened
    words, t = dtypes.uint32.vec(source.count), llvm_type(dtypes.uint32.vec(source.count))
    bits, low, odd, bias, rounded, top, quiet, nan, chosen, half = (self.fresh() for _ in range(10))
    for line in (f"{bits} = bitcast {llvm_type(single)} {value} to {t}",
                 f"{low} = lshr {t} {bits}, {llvm_constant(16, words)}",
                 f"{odd} = and {t} {low}, {llvm_constant(1, words)}",
                 f"{bias} = add {t} {odd}, {llvm_constant(0x7FFF, words)}", f"{rounded} = add {t} {bits}, {bias}",
                 f"{top} = lshr {t} {rounded}, {llvm_constant(16, words)}",
                 f"{quiet} = or {t} {low}, {llvm_constant(0x40, words)}",
                 f"{nan} = fcmp uno {llvm_type(single)} {value}, {value}",
                 f"{chosen} = select {llvm_type(dtypes.bool.vec(source.count))} {nan}, {t} {quiet}, {t} {top}",
                 f"{half} = trunc {t} {chosen} to {llvm_type(dtypes.uint16.vec(source.count))}"):
      self.emit(line)
    halves = llvm_type(dtypes.uint16.vec(source.count))
    return f"bitcast {halves} {half} to {llvm_type(dtypes.bfloat16.vec(source.count))}"

  def op_bitcast(self, node: UOp) -> None:
    source = node.src[0]
    self.define(node, f"bitcast {llvm_type(source.dtype)} {self.value(source)} to {llvm_type(node.dtype)}")


# op -> (float instruction, signed integer instruction, unsigned integer instruction)
_BINARY = {
  Ops.ADD: ("fadd", "add", "add"), Ops.MUL: ("fmul", "mul", "mul"), Ops.FDIV: ("fdiv", None, None),
  Ops.IDIV: (None, "sdiv", "udiv"), Ops.MOD: (None, "srem", "urem"), Ops.AND: (None, "and", "and"),
  Ops.OR: (None, "or", "or"), Ops.XOR: (None, "xor", "xor"), Ops.SHL: (None, "shl", "shl"),
  Ops.SHR: (None, "ashr", "lshr"),
}


def _cast_text(value: str, source: DType, target: DType) -> str:
  from_type, to_type = llvm_type(source), llvm_type(target)
  if target.scalar == dtypes.bool:
    return f"{'fcmp une' if dtypes.is_float(source.scalar) else 'icmp ne'} {from_type} {value}, zeroinitializer"
  source, target = source.scalar, target.scalar
  if source == dtypes.bool:
    return f"uitofp {from_type} {value} to {to_type}" if dtypes.is_float(target) else \
      f"zext {from_type} {value} to {to_type}"
  if dtypes.is_float(source) and dtypes.is_float(target):
    if from_type == to_type: return f"bitcast {from_type} {value} to {to_type}"
    widening = _float_bits(target) > _float_bits(source)
    return f"{'fpext' if widening else 'fptrunc'} {from_type} {value} to {to_type}"
  if dtypes.is_float(source):
    return f"{'fptosi' if _is_signed(target) else 'fptoui'} {from_type} {value} to {to_type}"
  if dtypes.is_float(target):
    return f"{'sitofp' if _is_signed(source) else 'uitofp'} {from_type} {value} to {to_type}"
  from_bits, to_bits = 8 * source.itemsize, 8 * target.itemsize
  if from_bits == to_bits: return f"bitcast {from_type} {value} to {to_type}"
  if from_bits > to_bits: return f"trunc {from_type} {value} to {to_type}"
  return f"{'sext' if _is_signed(source) else 'zext'} {from_type} {value} to {to_type}"


def scattered_stores(program: list[UOp]) -> tuple[dict[UOp, tuple[UOp, list[UOp]]], set[UOp]]:
  """Groups of ungated stores that write every lane of one vector (each an extracted lane) to its own address in one
  buffer, with nothing between the group's first and last store but arithmetic, addresses and accesses of other
  buffers: by the group's last store, the vector and its stores in lane order; and the nodes not rendered. Each
  group renders as one masked scatter: LLVM's dead-store and combining passes spent about a fifth of MNIST's
  compile on a convolution's hundreds of lone lane stores (its output channels are lanes, each stored a row apart).
  The group's other stores are not rendered, nor the lanes' extracts that nothing else uses."""
  users: dict[UOp, int] = {}
  for node in program:
    for source in node.src: users[source] = users.get(source, 0) + 1
  candidates: dict[tuple[UOp, UOp], list[int]] = {}
  for position, node in enumerate(program):
    if node.op is not Ops.STORE or (lane := node.src[1]).op is not Ops.GEP or len(lane.arg) != 1: continue
    pointer, vector = node.src[0], lane.src[0]
    if pointer.op is not Ops.INDEX or len(pointer.src) != 2: continue
    if pointer.src[0].op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_SCRATCH): continue
    if vector.dtype.scalar in (dtypes.bool, dtypes.bfloat16) or len(lane.src) != 1: continue
    candidates.setdefault((vector, pointer.src[0]), []).append(position)
  groups: dict[UOp, tuple[UOp, list[UOp]]] = {}
  for (vector, buffer), positions in candidates.items():
    stores = sorted((program[p] for p in positions), key=lambda store: store.src[1].arg[0])
    if [store.src[1].arg[0] for store in stores] != list(range(vector.dtype.count)): continue
    members = set(stores)
    between = program[positions[0]:positions[-1] + 1]
    if all(node in members or _passes_a_scatter(node, buffer) for node in between):
      groups[program[positions[-1]]] = (vector, stores)
  # the group's other stores, and the extracts nothing else uses, are not rendered
  folded = {node for vector, stores in groups.values() for store in stores
            for node in (store, store.src[1]) if node.op is Ops.STORE or users[node] == 1} - set(groups)
  return groups, folded


def _passes_a_scatter(node: UOp, buffer: UOp) -> bool:
  """A node a scatter into `buffer` may move past (it is rendered at its group's last store)."""
  if node.op in (Ops.LOAD, Ops.STORE):
    pointer = node.src[0]
    return pointer.op is Ops.DEFINE_REG or pointer.op is Ops.INDEX and pointer.src[0] is not buffer
  return node.op in GroupOp.ALU or node.op in (Ops.INDEX, Ops.GEP, Ops.CONST, Ops.VECTORIZE, Ops.CAST, Ops.BITCAST)


def _vector_suffix(dtype: DType, in_memory: bool = False) -> str:
  """The type suffix of an intrinsic's name: f32, v16f32, v16i8, ..."""
  if dtypes.is_float(dtype.scalar): scalar = _INTRINSIC_SUFFIX[dtype.scalar.name]
  elif dtype.scalar == dtypes.bool: scalar = "i8" if in_memory else "i1"
  else: scalar = f"i{8 * dtype.itemsize}"
  return f"v{dtype.count}{scalar}" if dtype.count > 1 else scalar


def _streamable(dtype: DType) -> bool:
  """A vector the CPU can store non-temporally: a power of two of at least 16 bytes."""
  return dtype.count > 1 and dtype.nbytes >= 16 and dtype.nbytes & (dtype.nbytes - 1) == 0 and dtype.nbytes <= 64


def _float_bits(dtype: DType) -> int:
  return {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}[dtype.name]


