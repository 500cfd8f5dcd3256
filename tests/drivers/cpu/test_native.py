"""The native CPU runtime: hand-written LLVM IR kernels with the `void kernel(ptr args, i64 core, i64 cores)` ABI run
by the command processor and its worker pool; results are checked against numpy, ordering and timing against the
host's clock. Every wait has a timeout, so a broken runtime fails these tests instead of hanging them."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from rawgrad.drivers.cpu import CPUProgram
from rawgrad.runtime.compile import LLVMCompiler
from rawgrad.runtime.elf import load_elf, relocate
from rawgrad.helpers import cpu_threads
from rawgrad.drivers.cpu.native import (
  RING_ENTRIES, CommandBuffer, NativeRuntime, Op, Signal, aligned_words, kernel_args, native_source,
)

KERNELS = r"""
declare i32 @clock_gettime(i32, ptr)
declare i64 @pthread_self()

define internal i64 @now_ns() {
  %ts = alloca [2 x i64], align 8
  %r = call i32 @clock_gettime(i32 1, ptr %ts)
  %sec = load i64, ptr %ts
  %nsec_ptr = getelementptr [2 x i64], ptr %ts, i64 0, i64 1
  %nsec = load i64, ptr %nsec_ptr
  %sec_ns = mul i64 %sec, 1000000000
  %ns = add i64 %sec_ns, %nsec
  ret i64 %ns
}

define internal i64 @arg(ptr %args, i64 %slot) {
  %p = getelementptr i64, ptr %args, i64 %slot
  %v = load i64, ptr %p
  ret i64 %v
}

; [n * core / cores, n * (core + 1) / cores): the slice of [0, n) that core runs
define internal i64 @slice_start(i64 %n, i64 %core, i64 %cores) {
  %scaled = mul i64 %n, %core
  %start = udiv i64 %scaled, %cores
  ret i64 %start
}

; args: a, b, out (float32), n
define void @vector_add(ptr %args, i64 %core, i64 %cores) {
entry:
  %a_int = call i64 @arg(ptr %args, i64 0)
  %b_int = call i64 @arg(ptr %args, i64 1)
  %out_int = call i64 @arg(ptr %args, i64 2)
  %n = call i64 @arg(ptr %args, i64 3)
  %a = inttoptr i64 %a_int to ptr
  %b = inttoptr i64 %b_int to ptr
  %out = inttoptr i64 %out_int to ptr
  %start = call i64 @slice_start(i64 %n, i64 %core, i64 %cores)
  %next_core = add i64 %core, 1
  %end = call i64 @slice_start(i64 %n, i64 %next_core, i64 %cores)
  %nonempty = icmp ult i64 %start, %end
  br i1 %nonempty, label %loop, label %exit
loop:
  %i = phi i64 [%start, %entry], [%i_next, %loop]
  %pa = getelementptr float, ptr %a, i64 %i
  %pb = getelementptr float, ptr %b, i64 %i
  %po = getelementptr float, ptr %out, i64 %i
  %va = load float, ptr %pa
  %vb = load float, ptr %pb
  %sum = fadd float %va, %vb
  store float %sum, ptr %po
  %i_next = add i64 %i, 1
  %done = icmp eq i64 %i_next, %end
  br i1 %done, label %exit, label %loop
exit:
  ret void
}

; args: src, dst (int64), n, delay_ns. dst[i] = 3 * src[i] + 1; the last slice first busy-waits delay_ns, so a
; processor that did not wait for every slice would hand the next command a half-written dst
define void @chain_step(ptr %args, i64 %core, i64 %cores) {
entry:
  %src_int = call i64 @arg(ptr %args, i64 0)
  %dst_int = call i64 @arg(ptr %args, i64 1)
  %n = call i64 @arg(ptr %args, i64 2)
  %delay = call i64 @arg(ptr %args, i64 3)
  %src = inttoptr i64 %src_int to ptr
  %dst = inttoptr i64 %dst_int to ptr
  %last_core = sub i64 %cores, 1
  %is_last = icmp eq i64 %core, %last_core
  br i1 %is_last, label %delay_start, label %body
delay_start:
  %t0 = call i64 @now_ns()
  %until = add i64 %t0, %delay
  br label %delay_loop
delay_loop:
  %t = call i64 @now_ns()
  %waiting = icmp ult i64 %t, %until
  br i1 %waiting, label %delay_loop, label %body
body:
  %start = call i64 @slice_start(i64 %n, i64 %core, i64 %cores)
  %next_core = add i64 %core, 1
  %end = call i64 @slice_start(i64 %n, i64 %next_core, i64 %cores)
  %nonempty = icmp ult i64 %start, %end
  br i1 %nonempty, label %loop, label %exit
loop:
  %i = phi i64 [%start, %body], [%i_next, %loop]
  %ps = getelementptr i64, ptr %src, i64 %i
  %pd = getelementptr i64, ptr %dst, i64 %i
  %v = load i64, ptr %ps
  %v3 = mul i64 %v, 3
  %r = add i64 %v3, 1
  store i64 %r, ptr %pd
  %i_next = add i64 %i, 1
  %done = icmp eq i64 %i_next, %end
  br i1 %done, label %exit, label %loop
exit:
  ret void
}

; args: cores_seen, threads, arrived, together (int64 arrays of cores entries, arrived one counter), patience_ns.
; cores_seen[core] = core + 1, threads[core] = pthread_self(); then every slice waits (at most patience_ns) until all
; slices have arrived and sets together[core] = 1 if they did: only slices running at the same time can all arrive
define void @record_core(ptr %args, i64 %core, i64 %cores) {
entry:
  %seen_int = call i64 @arg(ptr %args, i64 0)
  %threads_int = call i64 @arg(ptr %args, i64 1)
  %arrived_int = call i64 @arg(ptr %args, i64 2)
  %together_int = call i64 @arg(ptr %args, i64 3)
  %patience = call i64 @arg(ptr %args, i64 4)
  %seen = inttoptr i64 %seen_int to ptr
  %threads = inttoptr i64 %threads_int to ptr
  %arrived = inttoptr i64 %arrived_int to ptr
  %together = inttoptr i64 %together_int to ptr
  %ps = getelementptr i64, ptr %seen, i64 %core
  %core1 = add i64 %core, 1
  store i64 %core1, ptr %ps
  %self = call i64 @pthread_self()
  %pt = getelementptr i64, ptr %threads, i64 %core
  store i64 %self, ptr %pt
  %old = atomicrmw add ptr %arrived, i64 1 seq_cst
  %t0 = call i64 @now_ns()
  %deadline = add i64 %t0, %patience
  br label %wait
wait:
  %count = load atomic i64, ptr %arrived acquire, align 8
  %all = icmp eq i64 %count, %cores
  br i1 %all, label %exit, label %check
check:
  %t = call i64 @now_ns()
  %late = icmp uge i64 %t, %deadline
  br i1 %late, label %exit, label %wait
exit:
  %flag = zext i1 %all to i64
  %pg = getelementptr i64, ptr %together, i64 %core
  store i64 %flag, ptr %pg
  ret void
}

; args: ns. Busy-waits ns nanoseconds in every slice.
define void @busy_wait(ptr %args, i64 %core, i64 %cores) {
entry:
  %ns = call i64 @arg(ptr %args, i64 0)
  %t0 = call i64 @now_ns()
  %until = add i64 %t0, %ns
  br label %loop
loop:
  %t = call i64 @now_ns()
  %waiting = icmp ult i64 %t, %until
  br i1 %waiting, label %loop, label %exit
exit:
  ret void
}
"""
TIMEOUT = 5.0


@pytest.fixture(scope="module")
def kernels() -> dict[str, CPUProgram]:
  obj = LLVMCompiler().compile(KERNELS)
  return {name: CPUProgram(name, obj) for name in ("vector_add", "chain_step", "record_core", "busy_wait")}


@pytest.fixture(scope="module")
def runtime() -> Iterator[NativeRuntime]:
  with NativeRuntime(threads=2) as rt:
    yield rt


def run(runtime: NativeRuntime, commands: CommandBuffer, timeout_s: float = TIMEOUT) -> Signal:
  """Submits commands followed by a SIGNAL and waits for it."""
  done = Signal(name="done")
  commands.signal(done, 1)
  runtime.submit(commands)
  runtime.wait_signal(done, 1, timeout_s)
  return done


def vector_add_args(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
  return kernel_args([a.ctypes.data, b.ctypes.data, out.ctypes.data, len(out)])


def record_core_args(*arrays: np.ndarray, patience_ns: int = 2_000_000_000) -> np.ndarray:
  return kernel_args([x.ctypes.data for x in arrays] + [patience_ns])


def task_count() -> int:
  return len(os.listdir("/proc/self/task"))


# *** the runtime's own code

@pytest.mark.parametrize("machine, triple", [("x86_64", "x86_64-unknown-linux-gnu"),
                                             ("aarch64", "aarch64-unknown-linux-gnu")])
def test_runtime_code_loads_on_both_machines(machine: str, triple: str) -> None:
  """Whatever the host, the runtime for either machine compiles and our loader can relocate all of it."""
  image = load_elf(LLVMCompiler(triple).compile(native_source(machine)))
  assert {"command_processor", "pool_worker", "submit_commands", "store_signal", "shutdown_runtime"} <= set(
    image.functions)
  externals: set[str] = set()
  relocate(image, 0x7F00_0000_0000, lambda name: externals.add(name) or 0x1000_0000_0000)
  assert externals <= {"syscall", "clock_gettime", "sched_yield", "memcpy"}, externals


# *** kernels across cores

@pytest.mark.parametrize("n", [0, 1, 7, 1000, 12345])
@pytest.mark.parametrize("cores", [1, 2, 3, 8])
def test_vector_add_split_over_cores(runtime: NativeRuntime, kernels: dict[str, CPUProgram], n: int,
                                     cores: int) -> None:
  rng = np.random.default_rng(n * 10 + cores)
  a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  out = np.full(n + 1, 7.0, np.float32)  # one sentinel past the end
  commands = CommandBuffer()
  commands.exec(kernels["vector_add"], kernel_args([a.ctypes.data, b.ctypes.data, out.ctypes.data, n]), cores)
  run(runtime, commands)
  np.testing.assert_array_equal(out[:n], a + b)
  assert out[n] == 7.0


def test_both_cores_run_at_once(runtime: NativeRuntime, kernels: dict[str, CPUProgram]) -> None:
  seen, threads, arrived, together = (np.zeros(2, np.int64) for _ in range(4))
  commands = CommandBuffer()
  commands.exec(kernels["record_core"], record_core_args(seen, threads, arrived, together), 2)
  run(runtime, commands)
  assert seen.tolist() == [1, 2]
  assert arrived[0] == 2
  assert together.tolist() == [1, 1], "the two slices never ran at the same time"
  assert threads[0] != threads[1] and 0 not in threads


def test_more_slices_than_threads(runtime: NativeRuntime, kernels: dict[str, CPUProgram]) -> None:
  args = [np.zeros(2, np.float32) for _ in range(3)]
  seen, threads, arrived, together = (np.zeros(6, np.int64) for _ in range(4))
  commands = CommandBuffer()
  commands.exec(kernels["vector_add"], vector_add_args(*args), 5)  # an EXEC with more cores than slices of data
  # the slices of record_core wait for each other, and 6 of them cannot all run at once on 2 threads
  commands.exec(kernels["record_core"], record_core_args(seen, threads, arrived, together, patience_ns=10_000_000), 6)
  run(runtime, commands, timeout_s=30)
  assert seen.tolist() == [1, 2, 3, 4, 5, 6] and arrived[0] == 6
  assert len(set(threads.tolist())) <= 2


def test_commands_run_in_order(runtime: NativeRuntime, kernels: dict[str, CPUProgram]) -> None:
  n, steps = 1001, 12
  values = [np.arange(n, dtype=np.int64)] + [np.zeros(n, np.int64) for _ in range(steps)]
  commands = CommandBuffer()
  for step in range(steps):  # each step reads what the one before wrote; its last slice is the slowest
    args = kernel_args([values[step].ctypes.data, values[step + 1].ctypes.data, n, 300_000])
    commands.exec(kernels["chain_step"], args, 2 if step % 3 else 1)
  run(runtime, commands)
  expected = np.arange(n, dtype=np.int64)
  for _ in range(steps):
    expected = expected * 3 + 1
  np.testing.assert_array_equal(values[-1], expected)


def test_order_holds_across_submissions(runtime: NativeRuntime, kernels: dict[str, CPUProgram]) -> None:
  n = 257
  values = [np.arange(n, dtype=np.int64)] + [np.zeros(n, np.int64) for _ in range(6)]
  for step in range(6):
    commands = CommandBuffer()
    commands.exec(kernels["chain_step"], kernel_args([values[step].ctypes.data, values[step + 1].ctypes.data, n,
                                                      100_000]), 2)
    runtime.submit(commands)
  runtime.synchronize(TIMEOUT)
  np.testing.assert_array_equal(values[-1], np.arange(n, dtype=np.int64) * 729 + 364)


# *** signals, timestamps, copies

def test_signal_and_wait_between_buffers(runtime: NativeRuntime, kernels: dict[str, CPUProgram]) -> None:
  ready, finished = Signal(name="ready"), Signal(name="finished")
  src, dst = np.arange(100, dtype=np.uint8), np.zeros(100, np.uint8)
  setting = CommandBuffer()
  setting.exec(kernels["busy_wait"], kernel_args([1_000_000]))
  setting.copy(src, np.arange(100, 200, dtype=np.uint8), 100)
  setting.signal(ready, 3)
  waiting = CommandBuffer()
  waiting.wait(ready, 3)
  waiting.copy(dst, src, 100)
  waiting.signal(finished, 7)
  runtime.submit(setting)
  runtime.submit(waiting)
  runtime.wait_signal(finished, 7, TIMEOUT)
  assert ready.value == 3 and finished.value == 7 and ready.timestamp <= finished.timestamp
  np.testing.assert_array_equal(dst, np.arange(100, 200, dtype=np.uint8))


def test_wait_for_the_host(runtime: NativeRuntime) -> None:
  gate, finished = Signal(name="gate"), Signal(name="finished")
  commands = CommandBuffer()
  commands.wait(gate, 2)
  commands.signal(finished, 1)
  runtime.submit(commands)
  time.sleep(0.01)
  runtime.set_signal(gate, 1)  # not enough
  time.sleep(0.01)
  assert finished.value == 0
  runtime.set_signal(gate, 2)
  runtime.wait_signal(finished, 1, TIMEOUT)


def test_wait_across_two_runtimes(runtime: NativeRuntime, kernels: dict[str, CPUProgram]) -> None:
  produced, consumed = Signal(name="produced"), Signal(name="consumed")
  a, b = np.full(64, 2.0, np.float32), np.full(64, 0.5, np.float32)
  total, copied = np.zeros(64, np.float32), np.zeros(64, np.float32)
  with NativeRuntime(threads=1) as consumer:
    second = CommandBuffer()
    second.wait(produced, 1)
    second.copy(copied, total, total.nbytes)
    second.signal(consumed, 1)
    consumer.submit(second)  # submitted first: it must wait for the other queue
    time.sleep(0.01)
    assert consumed.value == 0
    first = CommandBuffer()
    first.exec(kernels["busy_wait"], kernel_args([2_000_000]))
    first.exec(kernels["vector_add"], vector_add_args(a, b, total), 2)
    first.signal(produced, 1)
    runtime.submit(first)
    consumer.wait_signal(consumed, 1, TIMEOUT)
  np.testing.assert_array_equal(copied, np.full(64, 2.5, np.float32))


def test_timestamps_bracket_a_kernel(runtime: NativeRuntime, kernels: dict[str, CPUProgram]) -> None:
  stamps, ns = aligned_words(2), 5_000_000
  commands = CommandBuffer()
  commands.timestamp(stamps.ctypes.data)
  commands.exec(kernels["busy_wait"], kernel_args([ns]), 2)
  commands.timestamp(stamps.ctypes.data + 8)
  before = time.monotonic_ns()
  done = run(runtime, commands)
  after = time.monotonic_ns()
  start, end = int(stamps[0]), int(stamps[1])
  assert before <= start <= end <= done.timestamp <= after, (before, start, end, done.timestamp, after)
  assert ns <= end - start < ns + 500_000_000


def test_copy_bytes(runtime: NativeRuntime) -> None:
  rng = np.random.default_rng(0)
  commands, cases = CommandBuffer(), []
  for nbytes in (0, 1, 3, 64, 1000, 1 << 20):
    src, dst = rng.integers(0, 256, nbytes + 5, np.uint8), np.zeros(nbytes + 5, np.uint8)
    commands.copy(dst.ctypes.data + 1, src.ctypes.data + 2, nbytes)  # unaligned on both sides
    cases.append((nbytes, src, dst))
  run(runtime, commands)
  for nbytes, src, dst in cases:
    np.testing.assert_array_equal(dst[1:1 + nbytes], src[2:2 + nbytes])
    assert not dst[0] and not dst[1 + nbytes:].any()


def test_prebuilt_buffer_patched_between_runs(runtime: NativeRuntime, kernels: dict[str, CPUProgram]) -> None:
  a, b = np.arange(8, dtype=np.float32), np.ones(8, np.float32)
  outs = [np.zeros(8, np.float32) for _ in range(3)]
  signal = Signal(name="timeline")
  commands = CommandBuffer()
  exec_at = commands.exec(kernels["vector_add"], vector_add_args(a, b, outs[0]), 2)
  signal_at = commands.signal(signal, 0)
  blocks = [vector_add_args(a, b, out) for out in outs]
  for value, block in enumerate(blocks, start=1):  # the jit's way: swap the args block, bump the timeline value
    commands.words[exec_at + 2] = block.ctypes.data
    commands.words[signal_at + 2] = value
    runtime.submit(commands)
    runtime.wait_signal(signal, value, TIMEOUT)
  for out in outs:
    np.testing.assert_array_equal(out, a + b)
  assert repr(signal) == f"Signal('timeline', value=3, address={signal.address:#x})"


# *** hangs and faults

def test_wait_on_unset_signal_times_out_then_recovers(runtime: NativeRuntime) -> None:
  never, done = Signal(name="never"), Signal(name="done")
  commands = CommandBuffer()
  commands.wait(never, 1)
  commands.signal(done, 1)
  runtime.submit(commands)
  start = time.perf_counter()
  with pytest.raises(TimeoutError, match=r"done at 0x[0-9a-f]+ is 0, waited for 1.*word 0 \(WAIT"):
    runtime.wait_signal(done, 1, timeout_s=0.2)
  assert 0.2 <= time.perf_counter() - start < 1.0
  cpu = time.process_time()
  time.sleep(0.3)  # the processor is stuck in the WAIT: it must sleep, not spin
  assert time.process_time() - cpu < 0.1
  runtime.set_signal(never, 1)
  runtime.wait_signal(done, 1, TIMEOUT)
  runtime.synchronize(TIMEOUT)


def test_wait_sees_a_plain_store(runtime: NativeRuntime) -> None:
  """A signal written without a wake-up (another device, say) is still seen by a sleeping WAIT."""
  external, done = Signal(name="external"), Signal(name="done")
  commands = CommandBuffer()
  commands.wait(external, 1)
  commands.signal(done, 1)
  runtime.submit(commands)
  time.sleep(0.05)
  external._memory[0] = 1
  runtime.wait_signal(done, 1, TIMEOUT)


def test_unknown_opcode_is_a_runtime_error(runtime: NativeRuntime, kernels: dict[str, CPUProgram]) -> None:
  a, b, out = np.ones(4, np.float32), np.ones(4, np.float32), np.zeros(4, np.float32)
  after = Signal(name="after")
  commands = CommandBuffer()
  commands.exec(kernels["vector_add"], vector_add_args(a, b, out))
  words = np.concatenate([commands.words, np.array([99, 0, 0, Op.SIGNAL, after.address, 1], np.uint64)])
  runtime.submit(words)
  with pytest.raises(RuntimeError, match=r"command buffer #\d+ faulted at word 4: unknown opcode 99"):
    runtime.synchronize(TIMEOUT)
  np.testing.assert_array_equal(out, a + b)  # commands before the fault ran
  assert after.value == 0  # the rest of the buffer was skipped
  runtime.check_faults()  # reported once
  commands = CommandBuffer()
  commands.signal(after, 2)
  run(runtime, commands)  # the queue still works
  assert after.value == 2


@pytest.mark.parametrize("words, message", [
  ([Op.SIGNAL, 64], r"word 0: SIGNAL command runs past the end"),
  ([Op.TIMESTAMP, 12], r"word 0: TIMESTAMP command has a null or misaligned address"),
  ([Op.EXEC, 4096, 0, 0], r"word 0: EXEC command has a null or misaligned address or bad cores"),
  ([Op.EXEC, 0, 0, 1], r"word 0: EXEC command has a null"),
  ([Op.COPY, 0, 4096, 8], r"word 0: COPY command has a null"),
  ([0], r"word 0: unknown opcode 0"),
])
def test_malformed_commands_are_runtime_errors(runtime: NativeRuntime, words: list[int], message: str) -> None:
  runtime.submit(np.array(words, np.uint64))
  with pytest.raises(RuntimeError, match=message):
    runtime.synchronize(TIMEOUT)


def test_builder_rejects_bad_operands() -> None:
  commands = CommandBuffer()
  with pytest.raises(ValueError, match="cores must be in"):
    commands.exec(4096, 0, cores=0)
  with pytest.raises(ValueError, match="not 8-byte aligned"):
    commands.signal(4097, 1)
  with pytest.raises(ValueError, match="does not fit"):
    commands.signal(Signal(), -1)
  with pytest.raises(TypeError, match="must be an address"):
    commands.copy("dest", 4096, 8)
  assert len(commands) == 0


def test_full_ring_makes_submit_wait(runtime: NativeRuntime) -> None:
  gate, done = Signal(name="gate"), Signal(name="done")
  blocked = CommandBuffer()
  blocked.wait(gate, 1)
  runtime.submit(blocked)
  empty = np.zeros(0, np.uint64)
  for _ in range(RING_ENTRIES - 1):
    runtime.submit(empty)
  with pytest.raises(TimeoutError, match="space in the submission ring"):
    runtime.submit(empty, timeout_s=0.1)
  gate.set(1)
  last = CommandBuffer()
  last.signal(done, 1)
  runtime.submit(last, timeout_s=TIMEOUT)
  runtime.wait_signal(done, 1, TIMEOUT)


# *** threads

def test_idle_threads_do_not_spin(runtime: NativeRuntime, kernels: dict[str, CPUProgram]) -> None:
  a, b, out = np.ones(1 << 16, np.float32), np.ones(1 << 16, np.float32), np.zeros(1 << 16, np.float32)
  commands = CommandBuffer()
  for _ in range(20):
    commands.exec(kernels["vector_add"], vector_add_args(a, b, out), 2)
  run(runtime, commands)
  time.sleep(0.05)  # longer than the spin before sleeping
  cpu = time.process_time()
  time.sleep(0.5)
  assert time.process_time() - cpu < 0.1


def test_threads_from_environment(monkeypatch: pytest.MonkeyPatch, kernels: dict[str, CPUProgram]) -> None:
  monkeypatch.setenv("CPU_THREADS", "3")
  baseline = task_count()
  with NativeRuntime() as rt:
    assert rt.threads == 3
    assert task_count() == baseline + 3
    seen, threads, arrived, together = (np.zeros(3, np.int64) for _ in range(4))
    commands = CommandBuffer()
    commands.exec(kernels["record_core"], record_core_args(seen, threads, arrived, together), 3)
    run(rt, commands)
    assert seen.tolist() == [1, 2, 3] and together.tolist() == [1, 1, 1] and len(set(threads.tolist())) == 3
  assert task_count() == baseline  # close joined every thread
  monkeypatch.setenv("CPU_THREADS", "zero")
  with pytest.raises(ValueError, match="CPU_THREADS must be a positive integer"):
    cpu_threads()


def test_close_gives_up_a_stuck_wait() -> None:
  baseline = task_count()
  rt = NativeRuntime(threads=2)
  commands = CommandBuffer()
  commands.wait(Signal(name="never"), 1)
  rt.submit(commands)
  time.sleep(0.01)
  start = time.perf_counter()
  rt.close()
  assert time.perf_counter() - start < 1.0
  assert task_count() == baseline
  with pytest.raises(RuntimeError, match="closed"):
    rt.submit(commands)
  rt.close()  # twice is fine


def test_interpreter_exits_with_a_busy_runtime(tmp_path: os.PathLike) -> None:
  """Threads stuck in a WAIT, sleeping or spinning must not keep the process alive: exit stops and joins them."""
  script = """
import numpy as np
from rawgrad.drivers.cpu.native import CommandBuffer, NativeRuntime, Signal
idle, busy = NativeRuntime(threads=2), NativeRuntime(threads=2, spin_us=1e6)
commands = CommandBuffer()
commands.wait(Signal(), 1)
busy.submit(commands)
print("started", idle.threads + busy.threads)
"""
  env = dict(os.environ, RAWGRAD_CACHE_DIR=str(tmp_path))
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "started 4" and "Warning" not in result.stderr


def test_forked_child_cannot_submit(runtime: NativeRuntime) -> None:
  pid = os.fork()
  if pid == 0:  # the child: report through the exit code, never run pytest's teardown
    try:
      runtime.submit(CommandBuffer())
      code = 1
    except RuntimeError as e:
      code = 0 if "forked process" in str(e) else 2
    os._exit(code)
  _, status = os.waitpid(pid, 0)
  assert os.waitstatus_to_exitcode(status) == 0
  runtime.synchronize(TIMEOUT)


def test_hcq_signal_wait_times_out_instead_of_hanging() -> None:
  """Through the device-neutral HCQ interface: waiting for a value nobody signals raises, naming both values."""
  import time as _time

  from rawgrad.runtime.device import Device
  device = Device["CPU"]
  start = _time.monotonic()
  with pytest.raises(TimeoutError, match="waited for"):
    device.timeline_signal.wait(device.timeline_value + 1000, timeout_s=0.2)
  assert _time.monotonic() - start < 5


def test_a_fault_ends_a_host_wait_on_the_signal_it_skipped(runtime: NativeRuntime) -> None:
  after = Signal(name="after")
  runtime.submit(np.array([99, Op.SIGNAL, after.address, 1], np.uint64))
  with pytest.raises(RuntimeError, match=r"unknown opcode 99"):
    runtime.wait_signal(after, 1, TIMEOUT)  # raised from the fault, long before the timeout
  assert after.value == 0


def test_a_host_wait_sleeping_on_a_signal_wakes_when_it_is_set(runtime: NativeRuntime) -> None:
  signal = Signal(name="later")
  setter = threading.Timer(0.05, lambda: runtime.set_signal(signal, 3))  # after the host has gone to sleep
  setter.start()
  runtime.wait_signal(signal, 3, TIMEOUT)
  setter.join()
  assert signal.value == 3


def test_the_runtime_compiles_in_the_background_from_when_a_device_opens(monkeypatch: pytest.MonkeyPatch) -> None:
  import rawgrad.drivers.cpu.native as native
  from rawgrad.drivers.cpu.device import CPUDevice
  started: list[int] = []
  monkeypatch.setattr(native, "_native_object", lambda pid: started.append(pid))
  CPUDevice("CPU:background")
  assert started == [os.getpid()]
  monkeypatch.undo()
  object_future = native._native_object(os.getpid())
  assert object_future.result(timeout=120) == LLVMCompiler().compile(native.native_source())
  assert native._native_object(os.getpid()) is object_future  # compiled once per process


def test_a_failed_runtime_compile_is_raised_where_the_runtime_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
  import rawgrad.drivers.cpu.native as native
  from rawgrad.runtime.compile import CompileError
  def failing(compiler: object, source: str) -> bytes:
    raise CompileError("LLVM said no to the runtime")
  monkeypatch.setattr(native, "compile_cached", failing)
  failed = native._native_object(-1)  # a process id of its own: the real one keeps its compiled runtime
  with pytest.raises(CompileError, match="LLVM said no to the runtime"):
    failed.result(timeout=60)
