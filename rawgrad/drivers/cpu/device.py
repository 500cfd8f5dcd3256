"""The CPU as an HCQ device: host memory is its memory, queues become native command buffers, run by the native
command processor and its worker pool (native.py) with no Python between commands."""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from rawgrad.compiler.render.llvmir import LLVMRenderer
from rawgrad.compiler.target import host_target
from rawgrad.drivers.cpu.native import (CommandBuffer, NativeRuntime, Op, aligned_words, native_store_signal,
                                        start_native_compile)
from rawgrad.drivers.cpu.program import CPUKernel
from rawgrad.runtime.compile import LLVMCompiler
from rawgrad.runtime.device import Allocator
from rawgrad.runtime.hcq import COMPUTE, SIGNAL_BYTES, DeviceFault, DeviceMemory, HCQDevice, HCQSignal, HWQueue

ALIGNMENT = 64  # vector loads never straddle a cache line needlessly
LAUNCH_WORDS = 8  # an untimed launch's commands: EXEC (4 words), the timeline's SIGNAL (3), one word to align the args
TIMED_LAUNCH_WORDS = 16  # TIMESTAMP (2), EXEC (4), TIMESTAMP (2), SIGNAL (3): 11; 3 to align; the 2 times' slots
# as plain ints: numpy converts an IntEnum member through a Python call
EXEC, SIGNAL, TIMESTAMP = int(Op.EXEC), int(Op.SIGNAL), int(Op.TIMESTAMP)


def host_allocation(nbytes: int, alignment: int = ALIGNMENT) -> DeviceMemory:
  """Host memory from numpy, aligned; the device address is the host address."""
  backing = np.empty(nbytes + alignment, dtype=np.uint8)
  offset = (-backing.ctypes.data) % alignment
  view = backing[offset:offset + nbytes]
  return DeviceMemory(view.ctypes.data, nbytes, view, backing)


def memory_bytes() -> int:
  """The host's physical memory: the CPU device's memory."""
  return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class CPUAllocator(Allocator):
  def __init__(self) -> None:
    super().__init__(capacity_bytes=memory_bytes())

  def _alloc(self, nbytes: int) -> DeviceMemory:
    return host_allocation(nbytes)

  def _free(self, memory: DeviceMemory, nbytes: int) -> None:
    del memory  # numpy owns the memory


class CPUDevice(HCQDevice):
  """Both engines feed the one native command processor, which runs its buffers in order."""
  shared_engines = True

  def __init__(self, name: str):
    target = host_target()
    super().__init__(name, target, CPUAllocator(), LLVMCompiler(target), LLVMRenderer(target), CPUKernel)
    self._runtime: NativeRuntime | None = None
    self.kernargs_words = self.kernargs.memory.host.view(np.uint64)  # the argument ring, for launches to write
    start_native_compile()  # the first kernel launch needs it

  @property
  def runtime(self) -> NativeRuntime:
    if self._runtime is None: self._runtime = NativeRuntime()
    return self._runtime

  @property
  def cores(self) -> int:
    return self.runtime.threads

  def host_memory(self, nbytes: int) -> DeviceMemory:
    return host_allocation(nbytes)

  def new_signal(self, value: int = 0, name: str = "signal") -> HCQSignal:
    words = aligned_words(ALIGNMENT // 8)  # a cache line to itself
    words[0] = value
    return HCQSignal(self, words[:SIGNAL_BYTES // 8], words.ctypes.data, name)

  def encode(self, queue: HWQueue, engine: str) -> CommandBuffer:
    commands = CommandBuffer()
    for command in queue.commands:
      operands = command.operands
      if command.kind == "exec":
        program, kernargs, global_size, _ = operands
        commands.exec(program, kernargs, global_size[0])
      elif command.kind == "copy": commands.copy(*operands)
      elif command.kind == "signal": commands.signal(operands[0].address, operands[1], keep=operands[0])
      elif command.kind == "wait": commands.wait(operands[0].address, operands[1], keep=operands[0])
      elif command.kind == "timestamp": commands.timestamp(operands[0])
      elif command.kind != "memory_barrier":  # one in-order processor: every write is visible to what follows
        raise ValueError(f"the CPU queue has no command {command.kind!r}")
    return commands

  def launch(self, program: Any, args: list[int], global_size: tuple[int, int, int],
             local_size: tuple[int, int, int], timed: bool = False) -> tuple[int, int] | None:
    """A launch writes its command words and its argument block together into the argument ring and submits them
    as they are: the words encode() would make of the queue, without building a queue and a command buffer for each
    launch (the eager launch path, and DEBUG=2's). Timed, the EXEC sits between two TIMESTAMPs into the two words
    before the arguments, and the launch waits for its signal and returns those times."""
    value = self.timeline_value + 1
    words = TIMED_LAUNCH_WORDS if timed else LAUNCH_WORDS
    start = self.kernargs.reserve(8 * (words + len(args)), self.kernargs_alignment)
    address, first = self.kernargs.memory.address + start, start // 8
    arguments = [arg & 0xFFFF_FFFF_FFFF_FFFF for arg in args]
    if timed:
      times = address + 8 * (words - 2)
      self.kernargs_words[first:first + words + len(args)] = [
        TIMESTAMP, times, EXEC, program.address, address + 8 * words, global_size[0], TIMESTAMP, times + 8,
        SIGNAL, self.timeline_signal.address, value, 0, 0, 0, 0, 0, *arguments]
      self.runtime.submit_words(address, 11)  # the commands, not the padding and slots after them
    else:
      self.kernargs_words[first:first + words + len(args)] = [
        EXEC, program.address, address + 8 * words, global_size[0],
        SIGNAL, self.timeline_signal.address, value, 0, *arguments]
      self.runtime.submit_words(address, LAUNCH_WORDS - 1)
    self.timeline_value, self.last_engine = value, COMPUTE
    if not timed: return None
    self.synchronize_after(value)
    return int(self.kernargs_words[first + words - 2]), int(self.kernargs_words[first + words - 1])

  def _submit(self, encoded: CommandBuffer, engine: str) -> None:
    self.runtime.submit(encoded)

  def set_signal(self, signal: HCQSignal, value: int) -> None:
    native_store_signal(signal.address, value)

  def wait_signal(self, signal: HCQSignal, value: int, timeout_s: float) -> None:
    if signal.value >= value and self._runtime is None: return
    try:
      self.runtime.wait_signal(signal, value, timeout_s)
    except RuntimeError as error:
      if isinstance(error, TimeoutError): raise
      raise DeviceFault(str(error)) from None

  def check_faults(self) -> None:
    if self._runtime is None: return
    try:
      self._runtime.check_faults()
    except RuntimeError as error:
      raise DeviceFault(str(error)) from None

  def describe_state(self) -> str:
    return f"; {self.runtime}" if self._runtime is not None else ""


def open_device(name: str) -> Any:
  return CPUDevice(name)
