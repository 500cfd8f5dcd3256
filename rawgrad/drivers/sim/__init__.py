"""SIM: a small device in pure Python that proves the runtime is device-neutral, and runs GPU-lowered kernels on
machines without a GPU.

Its memory is an arena of host memory behind device addresses of its own, which the host cannot write directly:
copies go through staging buffers and its copy engine, as on a GPU whose memory the CPU cannot map. It also reaches
pinned host memory (signals, argument blocks, staging) at the host's own addresses, as a GPU reaches mapped system
memory. Queues are encoded as 64-bit words (below); each engine, compute and copy, is a Python thread that decodes
its buffers after a doorbell and runs them in order. Kernels are lowered for a GPU target (SIM_ARCH, sm_90 by
default) and "compiled" to their linear program as text, which the compute engine reads back from device memory at
the EXEC's program address and runs with the GPU program interpreter (runtime/interpreter.py).

  opcode     operands
  1 EXEC     program address, argument block address, grid x, y, z, block x, y, z
  2 SIGNAL   signal address, value        (writes the value, then the time at +8)
  3 WAIT     signal address, value        (until the value at the address is at least value)
  4 TIMESTAMP address
  5 COPY     dest address, src address, bytes
  6 BARRIER                               (memory barrier: nothing to do for an engine that runs in order)

A bad command, an unmapped address or a fault in a kernel stops the buffer; the fault is raised by the host's next
wait or check.
"""
from __future__ import annotations

import bisect
import os
import threading
import time
import weakref
from collections import deque
from typing import Any

import numpy as np

from rawgrad.compiler.codegen.linearize import argument_block_words
from rawgrad.compiler.codegen.lower import format_program
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.target import Target, gpu_target
from rawgrad.runtime.device import Allocator
from rawgrad.runtime.hcq import SIGNAL_BYTES, DeviceFault, DeviceMemory, HCQDevice, HWQueue
from rawgrad.compiler.program_text import deserialize_program, serialize_program
from rawgrad.helpers import round_up
from rawgrad.runtime.interpreter import InterpreterError, run_program
from rawgrad.runtime.memory import release_range

EXEC, SIGNAL, WAIT, TIMESTAMP, COPY, BARRIER = 1, 2, 3, 4, 5, 6
OPERANDS = {EXEC: 8, SIGNAL: 2, WAIT: 2, TIMESTAMP: 1, COPY: 3, BARRIER: 0}
NAMES = {EXEC: "EXEC", SIGNAL: "SIGNAL", WAIT: "WAIT", TIMESTAMP: "TIMESTAMP", COPY: "COPY", BARRIER: "BARRIER"}
ARENA_BASE = 0x1000_0000_0000      # device memory addresses start here
ARENA_ALIGNMENT = 256
WAIT_LIMIT_S = 60.0                # an engine gives up a WAIT after this (the host's own waits time out sooner)
PROGRAM_MAGIC = b"RGSIMPRG"


class SimCompiler:
  """The "machine code" of a SIM kernel: its linear program as text, behind a magic word."""
  cache_key = "SimCompiler v1"

  def compile(self, src: str) -> bytes:
    return PROGRAM_MAGIC + src.encode()

  def assembly(self, src: str) -> str:
    """SIM's machine code is the program itself (DEBUG=5 shows it as a listing)."""
    return src


class SimRenderer:
  """A program as the text SimCompiler wraps (one JSON instruction a line); DEBUG=6 shows the readable listing."""

  def __init__(self, target: Target):
    self.target = target

  def render(self, name: str, program: list[UOp]) -> str:
    return serialize_program(program)

  def listing(self, name: str, program: list[UOp]) -> str:
    return format_program(name, program, self.target)


class _Arena:
  """Device memory: first fit over one host array, with freed blocks merged with their neighbours."""

  def __init__(self, nbytes: int):
    self.memory = np.zeros(nbytes, dtype=np.uint8)  # zero pages are only backed once written
    self.free: list[tuple[int, int]] = [(0, nbytes)]  # (offset, size), sorted by offset

  def alloc(self, nbytes: int) -> int:
    size = round_up(max(nbytes, 1), ARENA_ALIGNMENT)
    for i, (offset, free) in enumerate(self.free):
      if free >= size:
        self.free[i:i + 1] = [(offset + size, free - size)] if free > size else []
        return offset
    raise MemoryError(f"SIM device memory is exhausted: no {size} free bytes of {self.memory.nbytes} "
                      "(set SIM_MEMORY_MB for more)")

  def release(self, offset: int, nbytes: int) -> None:
    release_range(self.free, offset, round_up(max(nbytes, 1), ARENA_ALIGNMENT))


class SimAllocator(Allocator):
  def __init__(self, arena: _Arena):
    super().__init__()
    self.arena = arena

  def _alloc(self, nbytes: int) -> DeviceMemory:
    offset = self.arena.alloc(nbytes)
    return DeviceMemory(ARENA_BASE + offset, nbytes, None, None)

  def _free(self, memory: DeviceMemory, nbytes: int) -> None:
    self.arena.release(memory.address - ARENA_BASE, nbytes)


class SimProgram:
  """A kernel uploaded to device memory: 8 bytes of length, then the compiled bytes."""

  def __init__(self, device: SimDevice, name: str, lib: bytes):
    if not lib.startswith(PROGRAM_MAGIC): raise ValueError(f"{name}: not a SIM program (no {PROGRAM_MAGIC!r} header)")
    self.device, self.name = device, name
    blob = np.frombuffer(len(lib).to_bytes(8, "little") + lib, dtype=np.uint8)
    self.memory = device.allocator.alloc(blob.nbytes)
    device.copyin(self.memory, memoryview(blob))
    self.address = self.memory.address
    weakref.finalize(self, device.allocator.free, self.memory, blob.nbytes)

  def __repr__(self) -> str:
    return f"<SimProgram {self.name} at {self.address:#x}>"


class _Engine:
  """One engine: a thread that runs the encoded buffers its doorbell hands it, in order."""

  def __init__(self, device: SimDevice, name: str):
    self.device, self.name = device, name
    self.pending: deque[np.ndarray] = deque()
    self.doorbell = threading.Condition()
    self.position = ""  # what the engine is doing, for timeout messages
    self.thread = threading.Thread(target=self.run, name=f"{device.name} {name} engine", daemon=True)
    self.thread.start()

  def ring(self, words: np.ndarray) -> None:
    with self.doorbell:
      self.pending.append(words)
      self.doorbell.notify()

  def run(self) -> None:
    while True:
      with self.doorbell:
        while not self.pending: self.doorbell.wait()
        words = self.pending[0]
      try:
        self.device.execute(words, self)
      except Exception as error:  # noqa: BLE001 - any failure of a buffer is the device's fault to report
        self.device.record_fault(f"{self.device.name} {self.name} engine: {self.position}: {error}")
      with self.doorbell:
        self.pending.popleft()
        self.position = "idle"


class SimDevice(HCQDevice):
  def __init__(self, name: str, arch: str | None = None, memory_mb: int | None = None):
    arch = arch or os.environ.get("SIM_ARCH", "sm_90")
    memory_mb = memory_mb or int(os.environ.get("SIM_MEMORY_MB", "1024"))
    self.arena = _Arena(memory_mb << 20)
    self.host_ranges: list[tuple[int, int, np.ndarray]] = []   # (start, end, array) of pinned host memory
    self.faults: deque[str] = deque()
    self.programs: dict[int, tuple[bytes, list[UOp]]] = {}      # program address -> (its bytes, the program)
    self.engines: dict[str, _Engine] = {}
    target = gpu_target(arch)
    super().__init__(name, target, SimAllocator(self.arena), SimCompiler(), SimRenderer(target), SimProgram)
    self.engines = {engine: _Engine(self, engine) for engine in ("compute", "copy")}

  # ** memory the engines reach

  def host_memory(self, nbytes: int) -> DeviceMemory:
    backing = np.zeros(nbytes + 64, dtype=np.uint8)
    offset = (-backing.ctypes.data) % 64
    view = backing[offset:offset + nbytes]
    start = view.ctypes.data
    entry = (start, start + nbytes, view)
    bisect.insort(self.host_ranges, entry, key=lambda e: e[0])
    weakref.finalize(backing, self._unregister, start)
    return DeviceMemory(start, nbytes, view, backing)

  def _unregister(self, start: int) -> None:
    self.host_ranges = [entry for entry in self.host_ranges if entry[0] != start]

  def resolve(self, address: int, nbytes: int) -> np.ndarray:
    """The bytes at a device address: device memory, or pinned host memory."""
    offset = address - ARENA_BASE
    if 0 <= offset and offset + nbytes <= self.arena.memory.nbytes: return self.arena.memory[offset:offset + nbytes]
    i = bisect.bisect_right([entry[0] for entry in self.host_ranges], address) - 1
    if i >= 0:
      start, end, view = self.host_ranges[i]
      if address + nbytes <= end: return view[address - start:address - start + nbytes]
    raise InterpreterError(f"address {address:#x} (+{nbytes} bytes) is not mapped on {self.name}")

  # ** signals

  # ** queues

  def encode(self, queue: HWQueue, engine: str) -> np.ndarray:
    words: list[int] = []
    for command in queue.commands:
      operands = command.operands
      if command.kind == "exec":
        program, kernargs, global_size, local_size = operands
        words += [EXEC, program.address, kernargs, *global_size, *local_size]
      elif command.kind == "copy": words += [COPY, *operands]
      elif command.kind in ("signal", "wait"): words += [SIGNAL if command.kind == "signal" else WAIT,
                                                         operands[0].address, operands[1]]
      elif command.kind == "timestamp": words += [TIMESTAMP, operands[0]]
      elif command.kind == "memory_barrier": words += [BARRIER]
      else: raise ValueError(f"the SIM queue has no command {command.kind!r}")
    return np.array(words, dtype=np.uint64)

  def _submit(self, encoded: np.ndarray, engine: str) -> None:
    self.engines[engine].ring(encoded)

  def execute(self, words: np.ndarray, engine: _Engine) -> None:
    """Decode and run one buffer (on the engine's thread)."""
    position = 0
    while position < len(words):
      opcode = int(words[position])
      if opcode not in OPERANDS: raise DeviceFault(f"unknown opcode {opcode} at word {position}")
      count = OPERANDS[opcode]
      if position + 1 + count > len(words): raise DeviceFault(f"{NAMES[opcode]} at word {position} is cut short")
      operands = [int(w) for w in words[position + 1:position + 1 + count]]
      engine.position = f"{NAMES[opcode]} at word {position}"
      if opcode == EXEC: self.run_kernel(*operands)
      elif opcode == SIGNAL: self._write_signal(operands[0], operands[1])
      elif opcode == WAIT: self._wait(operands[0], operands[1], engine)
      elif opcode == TIMESTAMP: self.resolve(operands[0], 8).view(np.uint64)[0] = time.monotonic_ns()
      elif opcode == COPY:
        dest, src, nbytes = operands
        if nbytes: self.resolve(dest, nbytes)[:] = self.resolve(src, nbytes)
      position += 1 + count

  def _write_signal(self, address: int, value: int) -> None:
    words = self.resolve(address, SIGNAL_BYTES).view(np.uint64)
    words[1] = time.monotonic_ns()
    words[0] = value

  def _wait(self, address: int, value: int, engine: _Engine) -> None:
    word = self.resolve(address, 8).view(np.uint64)
    deadline = time.monotonic() + WAIT_LIMIT_S
    while int(word[0]) < value:
      if time.monotonic() > deadline:
        raise DeviceFault(f"WAIT for {value} at {address:#x} gave up after {WAIT_LIMIT_S}s (it is {int(word[0])})")
      time.sleep(20e-6)

  def run_kernel(self, address: int, kernargs: int, gx: int, gy: int, gz: int, lx: int, ly: int, lz: int) -> None:
    program = self.program_at(address)
    count = argument_block_words(program)
    args = [int(w) for w in self.resolve(kernargs, 8 * max(count, 1)).view(np.uint64)[:count]]
    run_program(program, (gx, gy, gz), (lx, ly, lz), args, self.resolve)

  def program_at(self, address: int) -> list[UOp]:
    """The program whose bytes are at the address (read from device memory; parsed once while they stay)."""
    length = int(self.resolve(address, 8).view(np.uint64)[0])
    blob = self.resolve(address + 8, length).tobytes()
    if not blob.startswith(PROGRAM_MAGIC): raise DeviceFault(f"no SIM program at {address:#x}")
    cached = self.programs.get(address)
    if cached is None or cached[0] != blob:
      cached = self.programs[address] = (blob, deserialize_program(blob[len(PROGRAM_MAGIC):].decode()))
    return cached[1]

  # ** faults and waits

  def record_fault(self, message: str) -> None:
    self.faults.append(message)

  def check_faults(self) -> None:
    if self.faults: raise DeviceFault(self.faults.popleft())

  def describe_state(self) -> str:
    return "; " + ", ".join(f"{name}: {engine.position or 'idle'} ({len(engine.pending)} buffers queued)"
                            for name, engine in self.engines.items())


def open_device(name: str) -> Any:
  return SimDevice(name)
