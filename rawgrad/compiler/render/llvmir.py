"""Render a linear program as LLVM IR text (for the host CPU through llvmlite)."""
from __future__ import annotations

import re
import struct

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType, PtrDType, dtypes

_LLVM_TYPES = {"bool": "i1", "int8": "i8", "uint8": "i8", "int16": "i16", "uint16": "i16", "int32": "i32",
               "uint32": "i32", "int64": "i64", "uint64": "i64", "index": "i64", "float16": "half",
               "bfloat16": "bfloat", "float32": "float", "float64": "double"}
_INTRINSIC_SUFFIX = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}
_UNARY_INTRINSICS = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}


def llvm_type(dtype: DType | PtrDType, in_memory: bool = False) -> str:
  if isinstance(dtype, PtrDType): return "ptr"
  if dtype == dtypes.bool and in_memory: return "i8"
  return _LLVM_TYPES[dtype.name]


def llvm_constant(value: object, dtype: DType) -> str:
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
  """program (from codegen.linearize) -> LLVM IR module text with one function `name`."""

  def render(self, name: str, program: list[UOp]) -> str:
    return _FunctionWriter(_symbol(name), program).write()


def _symbol(name: str) -> str:
  return re.sub(r"[^A-Za-z0-9_]", "_", name)


class _FunctionWriter:
  def __init__(self, name: str, program: list[UOp]):
    self.name, self.program = name, program
    self.names: dict[UOp, str] = {}
    self.lines: list[str] = []
    self.allocas: list[str] = []
    self.declarations: set[str] = set()
    self.counter = 0

  def fresh(self, hint: str = "v") -> str:
    self.counter += 1
    return f"%{hint}{self.counter}"

  def value(self, node: UOp) -> str:
    if node.op is Ops.CONST: return llvm_constant(node.arg, node.dtype)
    if node not in self.names: raise ValueError(f"LLVM renderer: {node.op} is used before it is computed")
    return self.names[node]

  def emit(self, text: str) -> None:
    self.lines.append("  " + text)

  def write(self) -> str:
    """The kernel body as an internal function with noalias parameters, and the entry point the runtime calls:
    `void name(ptr args, i64 core, i64 cores)`, where args holds 8-byte slots: the addresses of the buffers the
    program uses (in DEFINE_GLOBAL order), then its variables' values (sorted by name)."""
    params = sorted(dict.fromkeys(u for u in self.program if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    variables = sorted({u for u in self.program if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0])
    for param in params: self.names[param] = f"%data{param.arg}"
    for variable in variables: self.names[variable] = f"%var_{_symbol(variable.arg[0])}"
    self.names.update({CORE: "%core", CORES: "%cores"})
    for instruction in self.program: self.instruction(instruction)
    signature = [f"ptr noalias {self.names[p]}" for p in params] + [f"i64 {self.names[v]}" for v in variables]
    signature += ["i64 %core", "i64 %cores"]
    body = "\n".join(self.allocas + self.lines)
    declarations = "\n".join(sorted(self.declarations))
    kernel = (f"define internal void @{self.name}.body({', '.join(signature)}) #0 {{\nentry:\n{body}\n  ret void\n}}\n")
    return f"{declarations}\n\n{kernel}\n{self.entry_point(params, variables)}\n" \
           'attributes #0 = { nounwind alwaysinline "frame-pointer"="none" }\n' \
           'attributes #1 = { nounwind "frame-pointer"="none" }\n'

  def entry_point(self, params: list[UOp], variables: list[UOp]) -> str:
    lines, arguments = [], []
    for slot, node in enumerate(params + variables):
      kind = "ptr" if node.op is Ops.DEFINE_GLOBAL else "i64"
      lines.append(f"  %slot{slot} = getelementptr inbounds i64, ptr %args, i64 {slot}")
      lines.append(f"  %arg{slot} = load {kind}, ptr %slot{slot}, align 8")
      arguments.append(f"{kind} %arg{slot}")
    arguments += ["i64 %core", "i64 %cores"]
    call = f"  call void @{self.name}.body({', '.join(arguments)})"
    return f"define void @{self.name}(ptr %args, i64 %core, i64 %cores) #1 {{\nentry:\n" + "\n".join(lines + [call]) + \
      "\n  ret void\n}\n"

  # *** instructions ***

  def instruction(self, node: UOp) -> None:
    op = node.op
    if op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CONST, Ops.SINK, Ops.SPECIAL): return
    handler = getattr(self, f"op_{op.name.lower()}", None)
    if handler is not None: handler(node)
    elif op in _BINARY or op in (Ops.MAX, Ops.CMPLT, Ops.CMPNE): self.binary(node)
    elif op in _UNARY_INTRINSICS: self.unary_intrinsic(node)
    else: raise NotImplementedError(f"LLVM renderer has no rule for {op}")

  def define(self, node: UOp, text: str, hint: str = "v") -> str:
    name = self.fresh(hint)
    self.names[node] = name
    self.emit(f"{name} = {text}")
    return name

  def op_range(self, node: UOp) -> None:
    label = self.fresh("loop")[1:]
    counter = f"%{label}.i"
    self.names[node] = counter
    self.emit(f"br label %{label}.pre")
    self.lines.append(f"{label}.pre:")
    self.emit(f"br label %{label}.head")
    self.lines.append(f"{label}.head:")
    self.emit(f"{counter} = phi i64 [0, %{label}.pre], [{counter}.next, %{label}.latch]")
    self.emit(f"{counter}.ok = icmp slt i64 {counter}, {self.value(node.src[0])}")
    self.emit(f"br i1 {counter}.ok, label %{label}.body, label %{label}.exit")
    self.lines.append(f"{label}.body:")

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
    self.allocas.append(f"  {register} = alloca {llvm_type(node.dtype)}")
    self.emit(f"store {llvm_type(node.dtype)} {llvm_constant(node.arg[1], node.dtype)}, ptr {register}")

  def op_index(self, node: UOp) -> None:
    buffer, index = node.src[0], self.value(node.src[1])
    if len(node.src) > 2:
      # an invalid (padded) access reads element 0 instead, and the load replaces the value by 0
      safe = self.fresh("safe")
      self.emit(f"{safe} = select i1 {self.value(node.src[2])}, i64 {index}, i64 0")
      index = safe
    element = llvm_type(node.dtype.base, in_memory=True)
    self.define(node, f"getelementptr inbounds {element}, ptr {self.value(buffer)}, i64 {index}", "addr")

  def op_load(self, node: UOp) -> None:
    pointer = node.src[0]
    if pointer.op is Ops.DEFINE_REG:
      self.define(node, f"load {llvm_type(node.dtype)}, ptr {self.value(pointer)}")
      return
    stored = llvm_type(node.dtype, in_memory=True)
    loaded = self.define(node, f"load {stored}, ptr {self.value(pointer)}, align {node.dtype.itemsize}")
    if node.dtype == dtypes.bool: loaded = self.define(node, f"icmp ne i8 {loaded}, 0")
    if len(pointer.src) > 2:
      zero = llvm_constant(0, node.dtype)
      self.define(node, f"select i1 {self.value(pointer.src[2])}, {llvm_type(node.dtype)} {loaded}, "
                        f"{llvm_type(node.dtype)} {zero}")

  def op_store(self, node: UOp) -> None:
    pointer, value = node.src
    dtype = value.dtype
    text = self.value(value)
    if pointer.op is Ops.DEFINE_REG:
      self.emit(f"store {llvm_type(dtype)} {text}, ptr {self.value(pointer)}")
      return
    if dtype == dtypes.bool:
      widened = self.fresh()
      self.emit(f"{widened} = zext i1 {text} to i8")
      text = widened
    self.emit(f"store {llvm_type(dtype, in_memory=True)} {text}, ptr {self.value(pointer)}, align {dtype.itemsize}")

  def op_where(self, node: UOp) -> None:
    condition, a, b = node.src
    t = llvm_type(node.dtype)
    self.define(node, f"select i1 {self.value(condition)}, {t} {self.value(a)}, {t} {self.value(b)}")

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
    t = llvm_type(node.dtype)
    function = self.intrinsic(_UNARY_INTRINSICS[node.op], node.dtype, 1)
    self.define(node, f"call {t} {function}({t} {self.value(node.src[0])})")

  def intrinsic(self, base: str, dtype: DType, arity: int) -> str:
    t = llvm_type(dtype)
    name = f"@llvm.{base}.{_INTRINSIC_SUFFIX[dtype.name]}"
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
      if dtype == dtypes.bool:
        self.define(node, f"or i1 {x}, {y}")
        return
      bigger = self.fresh()
      self.emit(f"{bigger} = icmp {'sgt' if _is_signed(dtype) else 'ugt'} {t} {x}, {y}")
      self.define(node, f"select i1 {bigger}, {t} {x}, {t} {y}")
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
    if {source, node.dtype} == {dtypes.float16, dtypes.bfloat16}:
      # no instruction converts between the two 16-bit formats; float holds both exactly
      widened = self.fresh()
      self.emit(f"{widened} = fpext {llvm_type(source)} {value} to float")
      source, value = dtypes.float32, widened
    self.define(node, _cast_text(value, source, node.dtype))

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
  if target == dtypes.bool:
    if dtypes.is_float(source): return f"fcmp une {from_type} {value}, {llvm_constant(0.0, source)}"
    return f"icmp ne {from_type} {value}, 0"
  if source == dtypes.bool:
    return f"uitofp i1 {value} to {to_type}" if dtypes.is_float(target) else f"zext i1 {value} to {to_type}"
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


def _float_bits(dtype: DType) -> int:
  return {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}[dtype.name]


