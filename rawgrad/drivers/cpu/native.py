"""The native CPU runtime: a command processor and a pool of worker threads, written in LLVM IR, compiled by llvmlite,
loaded by our ELF loader and started with libc's pthread_create. No Python runs between the commands of a buffer.

Kernel ABI. Every kernel is `void kernel(ptr args, i64 core, i64 cores)`. `args` points to the kernel-argument
block: 8-byte slots, buffer addresses first, then integer variable values. The kernel runs slice `core` of `cores`
slices of its outermost parallel loop; with cores == 1 it runs everything. Slices of one EXEC may run in any order,
at the same time, on any thread (the processor's included), so they must not depend on each other.

Commands. A command buffer is an array of 64-bit words; each command is an opcode word followed by its operands:

  opcode       word 1          word 2        word 3
  1 EXEC       kernel address  args address  cores    kernel(args, c, cores) for every c in [0, cores)
  2 SIGNAL     signal address  value                  store the time at signal+8, then release-store value at signal
  3 WAIT       signal address  value                  wait until the value at signal >= value (unsigned)
  4 TIMESTAMP  address                                store the CLOCK_MONOTONIC time in ns (time.monotonic_ns's clock)
  5 COPY       dest address    src address   nbytes   memcpy

Commands of one queue run in order: all slices of an EXEC finish before the next command starts. SIGNAL, WAIT and
TIMESTAMP addresses must be 8-byte aligned. A malformed command (unknown opcode, operands past the end of the buffer,
a null or misaligned address, cores not in [1, 2**31)) ends its buffer: the processor records the first such fault
(a Fault code, the opcode, the word position, the submission number) in the control block and goes on with the next
buffer; the host raises it as a RuntimeError from its next wait.

Signals. A signal is 16 bytes of 8-byte aligned host memory: the 64-bit timeline value, then the CLOCK_MONOTONIC ns
time of the SIGNAL that last set it. A WAIT spins for spin_us, then futex-waits on the value's low 32 bits; SIGNAL
(and Signal.set from Python) wakes it when the process-wide count of sleeping WAITs is nonzero. A value written with a
plain store (another device, say) is still seen, within WAIT_BACKOFF_MAX_NS.

Submission. The control block (byte offsets below) holds a ring of RING_ENTRIES (commands address, word count)
entries. The host writes an entry, stores WRITE_POINTER + 1, bumps DOORBELL and futex-wakes the processor if
PROCESSOR_SLEEPING; the processor runs the buffer and stores READ_POINTER + 1. Both sides are native code
(`submit_commands` is called through ctypes), so the handshakes use real atomics.

Threads. Thread 0 is the command processor, threads 1..n-1 are pool workers. An EXEC with cores > 1 publishes a job
(kernel, args, cores, and CLAIM = generation << 32 | slices left), bumps GENERATION and futex-wakes sleeping workers;
every participant, the processor included, claims slices with a compare-and-swap on CLAIM until none are left (the
processor usually takes slice 0), and the processor waits until DONE == cores. If the workers are slow to wake, the
processor simply runs the remaining slices itself, so a tiny kernel asking for cores it does not need costs about one
futex wake. Idle threads spin for spin_us (pausing for PURE_SPIN_NS, then yielding the CPU on every step), then sleep
on a futex: an idle runtime uses no CPU.

Python API: `NativeRuntime(threads=None, spin_us=200)` (threads from CPU_THREADS, else the usable cores) with
`submit`, `wait_signal`, `synchronize`, `set_signal`, `check_faults`, `close`; `CommandBuffer` with `exec`, `signal`,
`wait`, `timestamp`, `copy`, each returning the word position of its command so a prebuilt buffer can be patched in
place through `.words` between runs; `Signal`; `kernel_args`.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import signal as os_signal
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from concurrent.futures import Future
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from string import Template
from typing import Any, Callable, Union

import numpy as np

from rawgrad.drivers.cpu.program import CPUProgram
from rawgrad.helpers import cpu_threads
from rawgrad.runtime.compile import LLVMCompiler, compile_cached
from rawgrad.runtime.elf import load_elf


class Op(IntEnum):
  EXEC = 1
  SIGNAL = 2
  WAIT = 3
  TIMESTAMP = 4
  COPY = 5


COMMAND_WORDS = {Op.EXEC: 4, Op.SIGNAL: 3, Op.WAIT: 3, Op.TIMESTAMP: 2, Op.COPY: 4}


class Fault(IntEnum):
  UNKNOWN_OPCODE = 1
  TRUNCATED_COMMAND = 2  # the command's operands run past the end of the buffer
  BAD_OPERAND = 3        # null or misaligned address, or cores not in [1, 2**31)


# *** the control block shared by Python and the native threads: byte offsets. Fields written by different parties
# sit on different cache lines; 32-bit fields are futex words.
WRITE_POINTER = 0            # u64, submissions published by the host
READ_POINTER = 64            # u64, submissions finished by the processor
CURRENT_POSITION = 72        # u64, word position of the command the processor is executing (for hang reports)
DOORBELL = 128               # u32, bumped on every submit; the processor sleeps on it
PROCESSOR_SLEEPING = 132     # u32, 1 while the processor sleeps on the doorbell
STOP = 192                   # u32, set once at shutdown
GENERATION = 256             # u32, bumped for every parallel job; workers sleep on it
WORKER_SLEEPERS = 260        # u32, workers sleeping on GENERATION
CLAIM = 320                  # u64, generation << 32 | slices not yet claimed
JOB_KERNEL = 384             # u64
JOB_ARGS = 392               # u64
JOB_CORES = 400              # u64
DONE = 448                   # u32, slices of the current job finished
PROCESSOR_WAITING = 452      # u32, 1 while the processor sleeps on DONE
ERROR_CODE = 512             # u64, a Fault or 0; the processor writes it last, the host clears it after reading
ERROR_OPCODE = 520
ERROR_POSITION = 528
ERROR_SUBMISSION = 536
ERROR_COUNT = 544            # u64, faults ever recorded
SPIN_NS = 576                # u64, how long an idle thread spins before it sleeps
SIGNAL_SLEEPERS = 584        # u64, address of the process-wide u32 count of WAITs sleeping on a signal
RING = 1024                  # RING_ENTRIES entries of 16 bytes: command buffer address, number of words
RING_ENTRIES = 256
CONTROL_BYTES = RING + 16 * RING_ENTRIES
SIGNAL_BYTES = 64            # a signal uses 16 bytes; it gets a cache line to itself
PURE_SPIN_NS = 2_000         # spin loops pause this long, then yield the CPU on every step
WAIT_BACKOFF_MIN_NS = 50_000  # a sleeping WAIT rechecks its signal after this, doubling up to the maximum
WAIT_BACKOFF_MAX_NS = 1_000_000
HOST_SPIN_NS = 50_000        # the host spins this long for a signal (a tiny kernel's whole run), then sleeps

SYS_FUTEX = {"x86_64": 202, "aarch64": 98}
PAUSE = {  # (declaration, call) of the spin-loop hint
  "x86_64": ("declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()"),
  "aarch64": ("declare void @llvm.aarch64.hint(i32)", "call void @llvm.aarch64.hint(i32 1)"),
}


# *** the native code. Loop variables live in allocas that mem2reg turns into registers; atomics are seq_cst where a
# store must be ordered before a later load of another word (the sleep/wake handshakes), release/acquire elsewhere.

_SOURCE = Template(r"""
declare i64 @syscall(i64, ...)
declare i32 @clock_gettime(i32, ptr)
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
$pause_declaration

declare i32 @sched_yield()

define internal void @cpu_relax() {
  $pause_call
  ret void
}

; one step of a spin loop that has run for `elapsed` ns: a pause at first, then give the CPU to any thread that has
; real work, since the spinning threads (and the Python host) may outnumber the cores
define internal void @spin_step(i64 %elapsed) {
entry:
  %early = icmp ult i64 %elapsed, $PURE_SPIN_NS
  br i1 %early, label %pause, label %yield
pause:
  call void @cpu_relax()
  ret void
yield:
  %r = call i32 @sched_yield()
  ret void
}

define internal i64 @now_ns() {
  %ts = alloca [2 x i64], align 8
  %r = call i32 @clock_gettime(i32 1, ptr %ts)  ; CLOCK_MONOTONIC
  %sec = load i64, ptr %ts, align 8
  %nsec_ptr = getelementptr inbounds [2 x i64], ptr %ts, i64 0, i64 1
  %nsec = load i64, ptr %nsec_ptr, align 8
  %sec_ns = mul i64 %sec, 1000000000
  %ns = add i64 %sec_ns, %nsec
  ret i64 %ns
}

; sleeps while *addr == expected, at most timeout_ns (forever if negative); may return early for any reason
define internal void @futex_wait(ptr %addr, i32 %expected, i64 %timeout_ns) {
entry:
  %ts = alloca [2 x i64], align 8
  %bounded = icmp sge i64 %timeout_ns, 0
  br i1 %bounded, label %fill, label %call
fill:
  %sec = udiv i64 %timeout_ns, 1000000000
  %nsec = urem i64 %timeout_ns, 1000000000
  store i64 %sec, ptr %ts, align 8
  %nsec_ptr = getelementptr inbounds [2 x i64], ptr %ts, i64 0, i64 1
  store i64 %nsec, ptr %nsec_ptr, align 8
  br label %call
call:
  %ts_or_null = select i1 %bounded, ptr %ts, ptr null
  %a = ptrtoint ptr %addr to i64
  %e = zext i32 %expected to i64
  %t = ptrtoint ptr %ts_or_null to i64
  %r = call i64 (i64, ...) @syscall(i64 $sys_futex, i64 %a, i64 128, i64 %e, i64 %t, i64 0, i64 0)  ; FUTEX_WAIT_PRIVATE
  ret void
}

define internal void @futex_wake(ptr %addr, i32 %count) {
  %a = ptrtoint ptr %addr to i64
  %c = zext i32 %count to i64
  %r = call i64 (i64, ...) @syscall(i64 $sys_futex, i64 %a, i64 129, i64 %c, i64 0, i64 0, i64 0)  ; FUTEX_WAKE_PRIVATE
  ret void
}

define internal i1 @bad_address(i64 %address) {
  %null = icmp eq i64 %address, 0
  %low = and i64 %address, 7
  %misaligned = icmp ne i64 %low, 0
  %bad = or i1 %null, %misaligned
  ret i1 %bad
}

; *** signals

define void @store_signal(ptr %signal, i64 %value, ptr %sleepers) {
entry:
  %now = call i64 @now_ns()
  %timestamp = getelementptr inbounds i8, ptr %signal, i64 8
  store atomic i64 %now, ptr %timestamp monotonic, align 8
  store atomic i64 %value, ptr %signal release, align 8
  fence seq_cst
  %count = load atomic i32, ptr %sleepers seq_cst, align 4
  %any = icmp ne i32 %count, 0
  br i1 %any, label %wake, label %done
wake:
  call void @futex_wake(ptr %signal, i32 2147483647)
  br label %done
done:
  ret void
}

define i64 @load_acquire(ptr %address) {
  %v = load atomic i64, ptr %address acquire, align 8
  ret i64 %v
}

; one sleep on a signal's futex: count ourselves as a sleeper (so SIGNAL wakes us), then sleep at most timeout_ns
; unless the signal has reached target meanwhile; true when it had (the caller rechecks after a sleep)
define internal i1 @sleep_on_signal(ptr %signal, ptr %sleepers, i64 %target, i64 %timeout_ns) {
entry:
  %s0 = atomicrmw add ptr %sleepers, i32 1 seq_cst
  %v = load atomic i64, ptr %signal seq_cst, align 8
  %ready = icmp uge i64 %v, %target
  br i1 %ready, label %leave, label %sleep
sleep:
  %low = trunc i64 %v to i32
  call void @futex_wait(ptr %signal, i32 %low, i64 %timeout_ns)
  br label %leave
leave:
  %s1 = atomicrmw sub ptr %sleepers, i32 1 seq_cst
  ret i1 %ready
}

; returns false when the runtime stops before the signal reaches target
define internal i1 @wait_signal(ptr %rt, ptr %signal, i64 %target) {
entry:
  %timeout_slot = alloca i64, align 8
  %v0 = load atomic i64, ptr %signal acquire, align 8
  %ready0 = icmp uge i64 %v0, %target
  br i1 %ready0, label %ready, label %spin_start
spin_start:
  %spin_field = getelementptr inbounds i8, ptr %rt, i64 $SPIN_NS
  %spin_ns = load i64, ptr %spin_field, align 8
  %stop_field = getelementptr inbounds i8, ptr %rt, i64 $STOP
  %start = call i64 @now_ns()
  br label %spin
spin:
  %v1 = load atomic i64, ptr %signal acquire, align 8
  %ready1 = icmp uge i64 %v1, %target
  br i1 %ready1, label %ready, label %spin_stop
spin_stop:
  %stop_spinning = load atomic i32, ptr %stop_field monotonic, align 4
  %stopping_spin = icmp ne i32 %stop_spinning, 0
  br i1 %stopping_spin, label %stopped, label %spin_check
spin_check:
  %now = call i64 @now_ns()
  %elapsed = sub i64 %now, %start
  %spinning = icmp ult i64 %elapsed, %spin_ns
  br i1 %spinning, label %relax, label %sleep_start
relax:
  call void @spin_step(i64 %elapsed)
  br label %spin
sleep_start:
  store i64 $WAIT_BACKOFF_MIN_NS, ptr %timeout_slot, align 8
  %sleepers_field = getelementptr inbounds i8, ptr %rt, i64 $SIGNAL_SLEEPERS
  %sleepers_int = load i64, ptr %sleepers_field, align 8
  %sleepers = inttoptr i64 %sleepers_int to ptr
  br label %sleep
sleep:
  %stop = load atomic i32, ptr %stop_field acquire, align 4
  %stopping = icmp ne i32 %stop, 0
  br i1 %stopping, label %stopped, label %do_sleep
do_sleep:
  %timeout = load i64, ptr %timeout_slot, align 8
  %ready2 = call i1 @sleep_on_signal(ptr %signal, ptr %sleepers, i64 %target, i64 %timeout)
  br i1 %ready2, label %ready, label %backoff
backoff:
  %doubled = shl i64 %timeout, 1
  %capped = icmp ugt i64 %doubled, $WAIT_BACKOFF_MAX_NS
  %next_timeout = select i1 %capped, i64 $WAIT_BACKOFF_MAX_NS, i64 %doubled
  store i64 %next_timeout, ptr %timeout_slot, align 8
  %v3 = load atomic i64, ptr %signal acquire, align 8
  %ready3 = icmp uge i64 %v3, %target
  br i1 %ready3, label %ready, label %sleep
ready:
  ret i1 true
stopped:
  ret i1 false
}

; the host's wait, called through ctypes (other Python threads run meanwhile): 1 once the signal reaches target, 0
; after timeout_ns, 2 when the processor has recorded a fault. Spins for spin_ns (pausing, then yielding), then sleeps
; on the signal's futex, which SIGNAL wakes, at most WAIT_BACKOFF_MAX_NS at a time so a fault is noticed. Unlike a
; Python polling loop, it takes no CPU from the kernels it waits for.
define i64 @host_wait(ptr %rt, ptr %signal, i64 %target, i64 %spin_ns, i64 %timeout_ns) {
entry:
  %error_field = getelementptr inbounds i8, ptr %rt, i64 $ERROR_CODE
  %sleepers_field = getelementptr inbounds i8, ptr %rt, i64 $SIGNAL_SLEEPERS
  %sleepers_int = load i64, ptr %sleepers_field, align 8
  %sleepers = inttoptr i64 %sleepers_int to ptr
  %start = call i64 @now_ns()
  br label %check
check:
  %v = load atomic i64, ptr %signal acquire, align 8
  %ready = icmp uge i64 %v, %target
  br i1 %ready, label %done, label %check_fault
check_fault:
  %error = load atomic i64, ptr %error_field acquire, align 8
  %faulted = icmp ne i64 %error, 0
  br i1 %faulted, label %fault, label %check_time
check_time:
  %now = call i64 @now_ns()
  %elapsed = sub i64 %now, %start
  %late = icmp uge i64 %elapsed, %timeout_ns
  br i1 %late, label %timeout, label %choose
choose:
  %spinning = icmp ult i64 %elapsed, %spin_ns
  br i1 %spinning, label %spin, label %sleep
spin:
  call void @spin_step(i64 %elapsed)
  br label %check
sleep:
  %ready2 = call i1 @sleep_on_signal(ptr %signal, ptr %sleepers, i64 %target, i64 $WAIT_BACKOFF_MAX_NS)
  br i1 %ready2, label %done, label %check
done:
  ret i64 1
timeout:
  ret i64 0
fault:
  ret i64 2
}

; *** parallel jobs

; claims slices of the published job until none are left; the processor and every worker run this
define internal void @run_slices(ptr %rt) {
entry:
  %claim_field = getelementptr inbounds i8, ptr %rt, i64 $CLAIM
  %done_field = getelementptr inbounds i8, ptr %rt, i64 $DONE
  br label %claim
claim:
  %word = load atomic i64, ptr %claim_field acquire, align 8
  %left = and i64 %word, 4294967295
  %none = icmp eq i64 %left, 0
  br i1 %none, label %out, label %take
take:
  %taken = sub i64 %word, 1
  %swap = cmpxchg ptr %claim_field, i64 %word, i64 %taken acq_rel acquire, align 8
  %won = extractvalue { i64, i1 } %swap, 1
  br i1 %won, label %run, label %claim
run:
  ; the job stays as published until all its slices, ours included, are done
  %kernel_field = getelementptr inbounds i8, ptr %rt, i64 $JOB_KERNEL
  %args_field = getelementptr inbounds i8, ptr %rt, i64 $JOB_ARGS
  %cores_field = getelementptr inbounds i8, ptr %rt, i64 $JOB_CORES
  %kernel_int = load i64, ptr %kernel_field, align 8
  %args_int = load i64, ptr %args_field, align 8
  %cores = load i64, ptr %cores_field, align 8
  %kernel = inttoptr i64 %kernel_int to ptr
  %args = inttoptr i64 %args_int to ptr
  %core = sub i64 %cores, %left
  call void %kernel(ptr %args, i64 %core, i64 %cores)
  %before = atomicrmw add ptr %done_field, i32 1 seq_cst
  %after = add i32 %before, 1
  %cores32 = trunc i64 %cores to i32
  %last = icmp eq i32 %after, %cores32
  br i1 %last, label %maybe_wake, label %claim
maybe_wake:
  %waiting_field = getelementptr inbounds i8, ptr %rt, i64 $PROCESSOR_WAITING
  %waiting = load atomic i32, ptr %waiting_field seq_cst, align 4
  %asleep = icmp ne i32 %waiting, 0
  br i1 %asleep, label %wake, label %claim
wake:
  call void @futex_wake(ptr %done_field, i32 1)
  br label %claim
out:
  ret void
}

define internal void @wait_done(ptr %rt, i32 %cores) {
entry:
  %done_field = getelementptr inbounds i8, ptr %rt, i64 $DONE
  %waiting_field = getelementptr inbounds i8, ptr %rt, i64 $PROCESSOR_WAITING
  %spin_field = getelementptr inbounds i8, ptr %rt, i64 $SPIN_NS
  %spin_ns = load i64, ptr %spin_field, align 8
  %d0 = load atomic i32, ptr %done_field acquire, align 4
  %finished0 = icmp eq i32 %d0, %cores
  br i1 %finished0, label %finished, label %spin_start
spin_start:
  %start = call i64 @now_ns()
  br label %spin
spin:
  %d1 = load atomic i32, ptr %done_field acquire, align 4
  %finished1 = icmp eq i32 %d1, %cores
  br i1 %finished1, label %finished, label %spin_check
spin_check:
  %now = call i64 @now_ns()
  %elapsed = sub i64 %now, %start
  %spinning = icmp ult i64 %elapsed, %spin_ns
  br i1 %spinning, label %relax, label %sleep
relax:
  call void @spin_step(i64 %elapsed)
  br label %spin
sleep:
  store atomic i32 1, ptr %waiting_field seq_cst, align 4
  %d2 = load atomic i32, ptr %done_field seq_cst, align 4
  %finished2 = icmp eq i32 %d2, %cores
  br i1 %finished2, label %wake_up, label %do_sleep
do_sleep:
  call void @futex_wait(ptr %done_field, i32 %d2, i64 -1)
  br label %wake_up
wake_up:
  store atomic i32 0, ptr %waiting_field monotonic, align 4
  %d3 = load atomic i32, ptr %done_field acquire, align 4
  %finished3 = icmp eq i32 %d3, %cores
  br i1 %finished3, label %finished, label %sleep
finished:
  ret void
}

define internal void @parallel_exec(ptr %rt, i64 %kernel, i64 %args, i64 %cores) {
entry:
  %kernel_field = getelementptr inbounds i8, ptr %rt, i64 $JOB_KERNEL
  %args_field = getelementptr inbounds i8, ptr %rt, i64 $JOB_ARGS
  %cores_field = getelementptr inbounds i8, ptr %rt, i64 $JOB_CORES
  %done_field = getelementptr inbounds i8, ptr %rt, i64 $DONE
  %claim_field = getelementptr inbounds i8, ptr %rt, i64 $CLAIM
  %generation_field = getelementptr inbounds i8, ptr %rt, i64 $GENERATION
  %sleepers_field = getelementptr inbounds i8, ptr %rt, i64 $WORKER_SLEEPERS
  store i64 %kernel, ptr %kernel_field, align 8
  store i64 %args, ptr %args_field, align 8
  store i64 %cores, ptr %cores_field, align 8
  store atomic i32 0, ptr %done_field monotonic, align 4
  %generation = load atomic i32, ptr %generation_field monotonic, align 4
  %next = add i32 %generation, 1
  %next64 = zext i32 %next to i64
  %high = shl i64 %next64, 32
  %word = or i64 %high, %cores
  store atomic i64 %word, ptr %claim_field release, align 8  ; publishes the job
  store atomic i32 %next, ptr %generation_field seq_cst, align 4
  %sleepers = load atomic i32, ptr %sleepers_field seq_cst, align 4
  %any = icmp ne i32 %sleepers, 0
  br i1 %any, label %wake, label %work
wake:
  %cores32 = trunc i64 %cores to i32
  %helpers = sub i32 %cores32, 1
  call void @futex_wake(ptr %generation_field, i32 %helpers)
  br label %work
work:
  call void @run_slices(ptr %rt)
  %total = trunc i64 %cores to i32
  call void @wait_done(ptr %rt, i32 %total)
  ret void
}

define ptr @pool_worker(ptr %rt) {
entry:
  %seen_slot = alloca i32, align 4
  %start_slot = alloca i64, align 8
  %generation_field = getelementptr inbounds i8, ptr %rt, i64 $GENERATION
  %sleepers_field = getelementptr inbounds i8, ptr %rt, i64 $WORKER_SLEEPERS
  %stop_field = getelementptr inbounds i8, ptr %rt, i64 $STOP
  %spin_field = getelementptr inbounds i8, ptr %rt, i64 $SPIN_NS
  %spin_ns = load i64, ptr %spin_field, align 8
  %g0 = load atomic i32, ptr %generation_field acquire, align 4
  store i32 %g0, ptr %seen_slot, align 4
  br label %loop
loop:
  %stop = load atomic i32, ptr %stop_field acquire, align 4
  %stopping = icmp ne i32 %stop, 0
  br i1 %stopping, label %exit, label %work
work:
  call void @run_slices(ptr %rt)
  %start = call i64 @now_ns()
  store i64 %start, ptr %start_slot, align 8
  br label %spin
spin:
  %seen = load i32, ptr %seen_slot, align 4
  %g = load atomic i32, ptr %generation_field acquire, align 4
  %new = icmp ne i32 %g, %seen
  br i1 %new, label %new_job, label %spin_check
new_job:
  store i32 %g, ptr %seen_slot, align 4
  br label %loop
spin_check:
  %now = call i64 @now_ns()
  %started = load i64, ptr %start_slot, align 8
  %elapsed = sub i64 %now, %started
  %spinning = icmp ult i64 %elapsed, %spin_ns
  br i1 %spinning, label %relax, label %sleep
relax:
  call void @spin_step(i64 %elapsed)
  br label %spin
sleep:
  %s0 = atomicrmw add ptr %sleepers_field, i32 1 seq_cst
  %g2 = load atomic i32, ptr %generation_field seq_cst, align 4
  %stop2 = load atomic i32, ptr %stop_field seq_cst, align 4
  %same = icmp eq i32 %g2, %seen
  %running = icmp eq i32 %stop2, 0
  %quiet = and i1 %same, %running
  br i1 %quiet, label %do_sleep, label %woken
do_sleep:
  call void @futex_wait(ptr %generation_field, i32 %seen, i64 -1)
  br label %woken
woken:
  %s1 = atomicrmw sub ptr %sleepers_field, i32 1 seq_cst
  %stop3 = load atomic i32, ptr %stop_field acquire, align 4
  %stopping3 = icmp ne i32 %stop3, 0
  br i1 %stopping3, label %exit, label %spin
exit:
  ret ptr null
}

; *** the command processor

define internal void @record_fault(ptr %rt, i64 %code, i64 %opcode, i64 %position, i64 %submission) {
entry:
  %count_field = getelementptr inbounds i8, ptr %rt, i64 $ERROR_COUNT
  %c0 = atomicrmw add ptr %count_field, i64 1 seq_cst
  %code_field = getelementptr inbounds i8, ptr %rt, i64 $ERROR_CODE
  %pending = load atomic i64, ptr %code_field acquire, align 8
  %unreported = icmp ne i64 %pending, 0
  br i1 %unreported, label %out, label %record
record:  ; the first fault the host has not read yet wins
  %opcode_field = getelementptr inbounds i8, ptr %rt, i64 $ERROR_OPCODE
  %position_field = getelementptr inbounds i8, ptr %rt, i64 $ERROR_POSITION
  %submission_field = getelementptr inbounds i8, ptr %rt, i64 $ERROR_SUBMISSION
  store i64 %opcode, ptr %opcode_field, align 8
  store i64 %position, ptr %position_field, align 8
  store i64 %submission, ptr %submission_field, align 8
  store atomic i64 %code, ptr %code_field release, align 8
  br label %out
out:
  ret void
}

define internal void @run_buffer(ptr %rt, ptr %commands, i64 %words, i64 %submission) {
entry:
  %position_slot = alloca i64, align 8
  store i64 0, ptr %position_slot, align 8
  %current_field = getelementptr inbounds i8, ptr %rt, i64 $CURRENT_POSITION
  %sleepers_field = getelementptr inbounds i8, ptr %rt, i64 $SIGNAL_SLEEPERS
  %sleepers_int = load i64, ptr %sleepers_field, align 8
  %sleepers = inttoptr i64 %sleepers_int to ptr
  br label %next
next:
  %position = load i64, ptr %position_slot, align 8
  %more = icmp ult i64 %position, %words
  br i1 %more, label %decode, label %finish
decode:
  store atomic i64 %position, ptr %current_field monotonic, align 8
  %command = getelementptr inbounds i64, ptr %commands, i64 %position
  %opcode = load i64, ptr %command, align 8
  %operand1_ptr = getelementptr inbounds i64, ptr %command, i64 1
  %operand2_ptr = getelementptr inbounds i64, ptr %command, i64 2
  %operand3_ptr = getelementptr inbounds i64, ptr %command, i64 3
  %left = sub i64 %words, %position
  switch i64 %opcode, label %unknown [
    i64 $EXEC, label %exec
    i64 $SIGNAL, label %signal
    i64 $WAIT, label %wait
    i64 $TIMESTAMP, label %timestamp
    i64 $COPY, label %copy
  ]

exec:
  %exec_fits = icmp uge i64 %left, 4
  br i1 %exec_fits, label %exec_check, label %truncated
exec_check:
  %kernel = load i64, ptr %operand1_ptr, align 8
  %args = load i64, ptr %operand2_ptr, align 8
  %cores = load i64, ptr %operand3_ptr, align 8
  %kernel_null = icmp eq i64 %kernel, 0
  %cores_less_one = add i64 %cores, -1
  %cores_bad = icmp uge i64 %cores_less_one, 2147483647
  %exec_bad = or i1 %kernel_null, %cores_bad
  br i1 %exec_bad, label %bad_operand, label %exec_dispatch
exec_dispatch:
  %single = icmp eq i64 %cores, 1
  br i1 %single, label %exec_single, label %exec_parallel
exec_single:
  %kernel_ptr = inttoptr i64 %kernel to ptr
  %args_ptr = inttoptr i64 %args to ptr
  call void %kernel_ptr(ptr %args_ptr, i64 0, i64 1)
  br label %advance4
exec_parallel:
  call void @parallel_exec(ptr %rt, i64 %kernel, i64 %args, i64 %cores)
  br label %advance4

signal:
  %signal_fits = icmp uge i64 %left, 3
  br i1 %signal_fits, label %signal_check, label %truncated
signal_check:
  %signal_address = load i64, ptr %operand1_ptr, align 8
  %signal_value = load i64, ptr %operand2_ptr, align 8
  %signal_bad = call i1 @bad_address(i64 %signal_address)
  br i1 %signal_bad, label %bad_operand, label %signal_run
signal_run:
  %signal_ptr = inttoptr i64 %signal_address to ptr
  call void @store_signal(ptr %signal_ptr, i64 %signal_value, ptr %sleepers)
  br label %advance3

wait:
  %wait_fits = icmp uge i64 %left, 3
  br i1 %wait_fits, label %wait_check, label %truncated
wait_check:
  %wait_address = load i64, ptr %operand1_ptr, align 8
  %wait_value = load i64, ptr %operand2_ptr, align 8
  %wait_bad = call i1 @bad_address(i64 %wait_address)
  br i1 %wait_bad, label %bad_operand, label %wait_run
wait_run:
  %wait_ptr = inttoptr i64 %wait_address to ptr
  %reached = call i1 @wait_signal(ptr %rt, ptr %wait_ptr, i64 %wait_value)
  br i1 %reached, label %advance3, label %finish

timestamp:
  %timestamp_fits = icmp uge i64 %left, 2
  br i1 %timestamp_fits, label %timestamp_check, label %truncated
timestamp_check:
  %timestamp_address = load i64, ptr %operand1_ptr, align 8
  %timestamp_bad = call i1 @bad_address(i64 %timestamp_address)
  br i1 %timestamp_bad, label %bad_operand, label %timestamp_run
timestamp_run:
  %timestamp_ptr = inttoptr i64 %timestamp_address to ptr
  %now = call i64 @now_ns()
  store atomic i64 %now, ptr %timestamp_ptr release, align 8
  br label %advance2

copy:
  %copy_fits = icmp uge i64 %left, 4
  br i1 %copy_fits, label %copy_check, label %truncated
copy_check:
  %dest = load i64, ptr %operand1_ptr, align 8
  %source = load i64, ptr %operand2_ptr, align 8
  %bytes = load i64, ptr %operand3_ptr, align 8
  %dest_null = icmp eq i64 %dest, 0
  %source_null = icmp eq i64 %source, 0
  %some_null = or i1 %dest_null, %source_null
  %nonempty = icmp ne i64 %bytes, 0
  %copy_bad = and i1 %some_null, %nonempty
  br i1 %copy_bad, label %bad_operand, label %copy_run
copy_run:
  %dest_ptr = inttoptr i64 %dest to ptr
  %source_ptr = inttoptr i64 %source to ptr
  call void @llvm.memcpy.p0.p0.i64(ptr %dest_ptr, ptr %source_ptr, i64 %bytes, i1 false)
  br label %advance4

advance2:
  %position2 = add i64 %position, 2
  store i64 %position2, ptr %position_slot, align 8
  br label %next
advance3:
  %position3 = add i64 %position, 3
  store i64 %position3, ptr %position_slot, align 8
  br label %next
advance4:
  %position4 = add i64 %position, 4
  store i64 %position4, ptr %position_slot, align 8
  br label %next

unknown:
  call void @record_fault(ptr %rt, i64 $UNKNOWN_OPCODE, i64 %opcode, i64 %position, i64 %submission)
  br label %finish
truncated:
  call void @record_fault(ptr %rt, i64 $TRUNCATED_COMMAND, i64 %opcode, i64 %position, i64 %submission)
  br label %finish
bad_operand:
  call void @record_fault(ptr %rt, i64 $BAD_OPERAND, i64 %opcode, i64 %position, i64 %submission)
  br label %finish
finish:
  ret void
}

define ptr @command_processor(ptr %rt) {
entry:
  %read_slot = alloca i64, align 8
  %last_slot = alloca i64, align 8
  %write_field = getelementptr inbounds i8, ptr %rt, i64 $WRITE_POINTER
  %read_field = getelementptr inbounds i8, ptr %rt, i64 $READ_POINTER
  %doorbell_field = getelementptr inbounds i8, ptr %rt, i64 $DOORBELL
  %sleeping_field = getelementptr inbounds i8, ptr %rt, i64 $PROCESSOR_SLEEPING
  %stop_field = getelementptr inbounds i8, ptr %rt, i64 $STOP
  %ring = getelementptr inbounds i8, ptr %rt, i64 $RING
  %spin_field = getelementptr inbounds i8, ptr %rt, i64 $SPIN_NS
  %spin_ns = load i64, ptr %spin_field, align 8
  %r0 = load atomic i64, ptr %read_field acquire, align 8
  store i64 %r0, ptr %read_slot, align 8
  %t0 = call i64 @now_ns()
  store i64 %t0, ptr %last_slot, align 8
  br label %loop
loop:
  %stop = load atomic i32, ptr %stop_field acquire, align 4
  %stopping = icmp ne i32 %stop, 0
  br i1 %stopping, label %exit, label %poll
poll:
  %read = load i64, ptr %read_slot, align 8
  %write = load atomic i64, ptr %write_field acquire, align 8
  %pending = icmp ne i64 %read, %write
  br i1 %pending, label %run, label %spin_check
run:
  %slot = and i64 %read, $RING_MASK
  %offset = shl i64 %slot, 4
  %ring_entry = getelementptr inbounds i8, ptr %ring, i64 %offset
  %commands_int = load i64, ptr %ring_entry, align 8
  %words_ptr = getelementptr inbounds i8, ptr %ring_entry, i64 8
  %words = load i64, ptr %words_ptr, align 8
  %commands = inttoptr i64 %commands_int to ptr
  call void @run_buffer(ptr %rt, ptr %commands, i64 %words, i64 %read)
  %read_next = add i64 %read, 1
  store i64 %read_next, ptr %read_slot, align 8
  store atomic i64 %read_next, ptr %read_field release, align 8
  %t1 = call i64 @now_ns()
  store i64 %t1, ptr %last_slot, align 8
  br label %loop
spin_check:
  %now = call i64 @now_ns()
  %last = load i64, ptr %last_slot, align 8
  %elapsed = sub i64 %now, %last
  %spinning = icmp ult i64 %elapsed, %spin_ns
  br i1 %spinning, label %relax, label %sleep
relax:
  call void @spin_step(i64 %elapsed)
  br label %loop
sleep:
  %ring_count = load atomic i32, ptr %doorbell_field acquire, align 4
  store atomic i32 1, ptr %sleeping_field seq_cst, align 4
  %write2 = load atomic i64, ptr %write_field seq_cst, align 8
  %stop2 = load atomic i32, ptr %stop_field seq_cst, align 4
  %empty = icmp eq i64 %write2, %read
  %running = icmp eq i32 %stop2, 0
  %quiet = and i1 %empty, %running
  br i1 %quiet, label %do_sleep, label %woken
do_sleep:
  call void @futex_wait(ptr %doorbell_field, i32 %ring_count, i64 -1)
  br label %woken
woken:
  store atomic i32 0, ptr %sleeping_field monotonic, align 4
  %t2 = call i64 @now_ns()
  store i64 %t2, ptr %last_slot, align 8
  br label %loop
exit:
  ret ptr null
}

; *** host side

; publishes a command buffer; returns its submission number, or -1 when the ring is full
define i64 @submit_commands(ptr %rt, i64 %commands, i64 %words) {
entry:
  %write_field = getelementptr inbounds i8, ptr %rt, i64 $WRITE_POINTER
  %read_field = getelementptr inbounds i8, ptr %rt, i64 $READ_POINTER
  %write = load atomic i64, ptr %write_field monotonic, align 8
  %read = load atomic i64, ptr %read_field acquire, align 8
  %used = sub i64 %write, %read
  %full = icmp uge i64 %used, $RING_ENTRIES
  br i1 %full, label %reject, label %publish
reject:
  ret i64 -1
publish:
  %slot = and i64 %write, $RING_MASK
  %offset = shl i64 %slot, 4
  %ring = getelementptr inbounds i8, ptr %rt, i64 $RING
  %ring_entry = getelementptr inbounds i8, ptr %ring, i64 %offset
  store i64 %commands, ptr %ring_entry, align 8
  %words_ptr = getelementptr inbounds i8, ptr %ring_entry, i64 8
  store i64 %words, ptr %words_ptr, align 8
  %write_next = add i64 %write, 1
  store atomic i64 %write_next, ptr %write_field seq_cst, align 8
  %doorbell_field = getelementptr inbounds i8, ptr %rt, i64 $DOORBELL
  %rung = atomicrmw add ptr %doorbell_field, i32 1 seq_cst
  %sleeping_field = getelementptr inbounds i8, ptr %rt, i64 $PROCESSOR_SLEEPING
  %sleeping = load atomic i32, ptr %sleeping_field seq_cst, align 4
  %asleep = icmp ne i32 %sleeping, 0
  br i1 %asleep, label %wake, label %done
wake:
  call void @futex_wake(ptr %doorbell_field, i32 1)
  br label %done
done:
  ret i64 %write
}

define void @shutdown_runtime(ptr %rt) {
  %stop_field = getelementptr inbounds i8, ptr %rt, i64 $STOP
  store atomic i32 1, ptr %stop_field seq_cst, align 4
  %generation_field = getelementptr inbounds i8, ptr %rt, i64 $GENERATION
  %g = atomicrmw add ptr %generation_field, i32 1 seq_cst
  call void @futex_wake(ptr %generation_field, i32 2147483647)
  %doorbell_field = getelementptr inbounds i8, ptr %rt, i64 $DOORBELL
  %d = atomicrmw add ptr %doorbell_field, i32 1 seq_cst
  call void @futex_wake(ptr %doorbell_field, i32 2147483647)
  ret void
}
""")


@functools.cache
def _machine() -> str:
  machine = {"AMD64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())
  if not sys.platform.startswith("linux") or machine not in PAUSE:
    raise RuntimeError(f"the native runtime needs Linux on x86_64 or aarch64, not {sys.platform} on {machine}")
  return machine


def native_source(machine: str | None = None) -> str:
  """The runtime's LLVM IR for machine ("x86_64" or "aarch64"), by default this one."""
  machine = _machine() if machine is None else machine
  constants = {name: value for name, value in globals().items() if name.isupper() and isinstance(value, int)}
  return _SOURCE.substitute(constants, RING_MASK=RING_ENTRIES - 1, sys_futex=SYS_FUTEX[machine],
                            pause_declaration=PAUSE[machine][0], pause_call=PAUSE[machine][1],
                            **{op.name: op.value for op in Op}, **{fault.name: fault.value for fault in Fault})


@dataclass(frozen=True)
class _NativeCode:
  """The loaded runtime image: entry addresses for pthread_create and ctypes callables for the host side."""
  image: CPUProgram  # keeps the code mapped; it is never unmapped, so a thread that outlives a runtime stays safe
  command_processor: int
  pool_worker: int
  submit_commands: Callable[[int, int, int], int]
  store_signal: Callable[[int, int, int], None]
  load_acquire: Callable[[int], int]
  host_wait: Callable[[int, int, int, int, int], int]
  shutdown_runtime: Callable[[int], None]
  signal_sleepers: np.ndarray  # the process-wide u32 count of WAITs sleeping on a signal
  signal_sleepers_address: int


def start_native_compile() -> None:
  """Start compiling the runtime in the background (in a compile worker, where there are workers): a device opened
  now first lowers and compiles a kernel, and the runtime it launches that kernel on compiles meanwhile."""
  _native_object(os.getpid())


@functools.cache
def _native_object(pid: int) -> Future[bytes]:
  # by process id: a child forked while the parent's compile thread ran would wait for a thread it does not have
  compiled: Future[bytes] = Future()

  def compile_runtime() -> None:
    try:
      compiled.set_result(compile_cached(LLVMCompiler(), native_source()))
    except BaseException as error:  # raised where the runtime is needed
      compiled.set_exception(error)
  threading.Thread(target=compile_runtime, name="rawgrad-native-compile", daemon=True).start()
  return compiled


@functools.cache
def _native_code() -> _NativeCode:
  obj = _native_object(os.getpid()).result()  # its compile's waits have timeouts (see compile_worker.py)
  image = CPUProgram("command_processor", obj)
  address = {name: image.base + offset for name, offset in load_elf(obj).functions.items()}
  sleepers = aligned_words(SIGNAL_BYTES // 8)
  u64, ptr = ctypes.c_uint64, ctypes.c_void_p
  return _NativeCode(
    image=image, command_processor=address["command_processor"], pool_worker=address["pool_worker"],
    submit_commands=ctypes.CFUNCTYPE(ctypes.c_int64, ptr, u64, u64)(address["submit_commands"]),
    store_signal=ctypes.CFUNCTYPE(None, ptr, u64, ptr)(address["store_signal"]),
    load_acquire=ctypes.CFUNCTYPE(u64, ptr)(address["load_acquire"]),
    host_wait=ctypes.CFUNCTYPE(ctypes.c_int64, ptr, ptr, u64, u64, u64)(address["host_wait"]),
    shutdown_runtime=ctypes.CFUNCTYPE(None, ptr)(address["shutdown_runtime"]),
    signal_sleepers=sleepers, signal_sleepers_address=sleepers.ctypes.data)


# *** host memory


def aligned_words(count: int, alignment: int = 64) -> np.ndarray:
  """count zeroed uint64 words whose first byte is aligned to `alignment` bytes."""
  backing = np.zeros(count * 8 + alignment, dtype=np.uint8)
  offset = (-backing.ctypes.data) % alignment
  return backing[offset:offset + count * 8].view(np.uint64)


def kernel_args(values: Sequence[int]) -> np.ndarray:
  """A kernel-argument block: one 8-byte slot per value (buffer addresses, then integer variables)."""
  block = aligned_words(max(len(values), 1))
  block[:len(values)] = [value & (2**64 - 1) for value in values]  # negative variables are stored two's complement
  return block


class Signal:
  """A timeline signal: the 64-bit value at `address`, the monotonic ns time of the SIGNAL that last set it at +8."""

  def __init__(self, value: int = 0, name: str = "signal") -> None:
    self.name, self._memory = name, aligned_words(SIGNAL_BYTES // 8)
    self._memory[0] = value
    self.address: int = self._memory.ctypes.data  # cached: numpy's .ctypes.data costs a microsecond

  @property
  def value(self) -> int:
    return int(self._memory[0])

  @property
  def timestamp(self) -> int:
    return int(self._memory[1])

  def set(self, value: int) -> None:
    """Stores value (and the time) like a SIGNAL command, waking any WAIT sleeping on this signal."""
    native_store_signal(self.address, value)

  def __repr__(self) -> str:
    return f"Signal({self.name!r}, value={self.value}, address={self.address:#x})"


def native_store_signal(address: int, value: int) -> None:
  """Store a signal's value (and the time) at `address` like a SIGNAL command, waking any WAIT sleeping on it."""
  code = _native_code()
  code.store_signal(address, _word(value, "signal value"), code.signal_sleepers_address)


# *** command buffers

Addressable = Union[int, np.ndarray, Signal, Any]  # Any: objects with an `.address`, e.g. CPUProgram


def _word(value: int, what: str) -> int:
  if not 0 <= value < 2**64:
    raise ValueError(f"{what} {value} does not fit in an unsigned 64-bit word")
  return value


def _address(obj: Addressable, what: str) -> int:
  if isinstance(obj, np.ndarray):
    return obj.ctypes.data
  address = obj if isinstance(obj, int) else getattr(obj, "address", None)
  if not isinstance(address, int):
    raise TypeError(f"{what} must be an address, a numpy array or have an .address, not {type(obj).__name__}")
  return _word(address, what)


def _aligned(address: int, what: str) -> int:
  if address == 0 or address % 8:
    raise ValueError(f"{what} {address:#x} is null or not 8-byte aligned")
  return address


class CommandBuffer:
  """Builds a command buffer. Every method appends one command and returns its word position, so a prebuilt buffer
  can be patched in place (`buffer.words[position + k] = ...`) between runs. The buffer keeps the objects it was
  given (kernels, argument blocks, signals, arrays) alive for as long as it lives."""

  def __init__(self) -> None:
    self._words: list[int] = []
    self._array: np.ndarray | None = None
    self._array_address = 0
    self._keep: list[Any] = []

  def _append(self, op: Op, *operands: int, keep: tuple[Any, ...] = ()) -> int:
    if self._array is not None:  # appending after .words was used: patches made through it are kept
      self._words, self._array = [int(w) for w in self._array], None
    position = len(self._words)
    self._words += [op.value, *operands]
    self._keep += [obj for obj in keep if obj is not None and not isinstance(obj, int)]
    return position

  def exec(self, kernel: Addressable, args: Addressable, cores: int = 1) -> int:
    if not 1 <= cores < 2**31:
      raise ValueError(f"cores must be in [1, 2**31), not {cores}")
    kernel_address = _address(kernel, "kernel")
    if kernel_address == 0:
      raise ValueError("kernel address is null")
    return self._append(Op.EXEC, kernel_address, _address(args, "kernel args"), cores, keep=(kernel, args))

  def signal(self, signal: Signal | int, value: int, keep: Any = None) -> int:
    """`keep`: an object that must live as long as the buffer (what owns the signal's memory)."""
    address = _aligned(_address(signal, "signal"), "signal")
    return self._append(Op.SIGNAL, address, _word(value, "signal value"), keep=(signal, keep))

  def wait(self, signal: Signal | int, value: int, keep: Any = None) -> int:
    address = _aligned(_address(signal, "signal"), "signal")
    return self._append(Op.WAIT, address, _word(value, "wait value"), keep=(signal, keep))

  def timestamp(self, dest: Addressable) -> int:
    return self._append(Op.TIMESTAMP, _aligned(_address(dest, "timestamp"), "timestamp"), keep=(dest,))

  def copy(self, dest: Addressable, src: Addressable, nbytes: int) -> int:
    dest_address, src_address = _address(dest, "copy destination"), _address(src, "copy source")
    if nbytes and (dest_address == 0 or src_address == 0):
      raise ValueError(f"copy of {nbytes} bytes from {src_address:#x} to {dest_address:#x} uses a null address")
    return self._append(Op.COPY, dest_address, src_address, _word(nbytes, "copy size"), keep=(dest, src))

  def _materialize(self) -> np.ndarray:
    if self._array is None:
      self._array = np.array(self._words, dtype=np.uint64)
      self._array_address = self._array.ctypes.data
    return self._array

  @property
  def words(self) -> np.ndarray:
    """The commands as uint64 words; patch this array in place, never while a submission of it may still run."""
    return self._materialize()

  @property
  def address(self) -> int:
    """Where .words starts."""
    self._materialize()
    return self._array_address

  def __len__(self) -> int:
    return len(self._words) if self._array is None else len(self._array)


def describe_commands(words: np.ndarray) -> list[str]:
  """One line per command, for errors and debugging."""
  lines, position = [], 0
  while position < len(words):
    opcode = int(words[position])
    if opcode not in Op._value2member_map_:
      lines.append(f"{position}: unknown opcode {opcode}")
      break
    size = COMMAND_WORDS[Op(opcode)]
    operands = ", ".join(f"{int(w):#x}" for w in words[position + 1:position + size])
    lines.append(f"{position}: {Op(opcode).name}({operands})")
    position += size
  return lines


# *** threads

@functools.cache
def _libc() -> ctypes.CDLL:
  libc = ctypes.CDLL(None, use_errno=True)
  libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
  libc.pthread_create.restype = ctypes.c_int
  libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
  libc.pthread_join.restype = ctypes.c_int
  if hasattr(libc, "pthread_timedjoin_np"):
    libc.pthread_timedjoin_np.argtypes = [ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p]
    libc.pthread_timedjoin_np.restype = ctypes.c_int
  return libc


def _start_thread(entry: int, argument: int) -> int:
  handle = ctypes.c_ulong()
  # native threads take no signals: Ctrl-C must reach Python's main thread, and a futex wait is never interrupted
  blocked = os_signal.pthread_sigmask(os_signal.SIG_BLOCK, os_signal.valid_signals())
  try:
    err = _libc().pthread_create(ctypes.byref(handle), None, entry, argument)
  finally:
    os_signal.pthread_sigmask(os_signal.SIG_SETMASK, blocked)
  if err != 0:
    raise OSError(err, f"pthread_create failed: {os.strerror(err)}")
  return handle.value


def _join_thread(handle: int, timeout_s: float) -> bool:
  libc = _libc()
  if not hasattr(libc, "pthread_timedjoin_np"):
    return libc.pthread_join(handle, None) == 0
  deadline = time.time() + timeout_s  # pthread_timedjoin_np takes an absolute CLOCK_REALTIME time
  timespec = (ctypes.c_int64 * 2)(int(deadline), int(deadline % 1 * 1e9))
  return libc.pthread_timedjoin_np(handle, None, timespec) == 0


_UNJOINED: list[Any] = []  # runtimes whose threads did not stop: their memory must outlive them


@dataclass
class _Threads:
  """What the native threads use; kept apart from NativeRuntime so its finalizer holds no reference to it."""
  code: _NativeCode
  control: np.ndarray
  handles: list[int]
  pid: int  # a forked child has the memory but none of the threads
  stopped: bool = False

  def stop(self, timeout_s: float = 5.0) -> None:
    if self.stopped:
      return
    self.stopped = True
    if os.getpid() != self.pid:
      return
    self.code.shutdown_runtime(self.control.ctypes.data)
    stuck = [handle for handle in self.handles if not _join_thread(handle, timeout_s)]
    if stuck:
      _UNJOINED.append(self)
      warnings.warn(f"{len(stuck)} native runtime thread(s) did not stop within {timeout_s}s (a kernel still "
                    "running?); their memory is kept", RuntimeWarning, stacklevel=2)


# *** the runtime


class NativeRuntime:
  """One command queue run by a native command processor thread, plus threads-1 pool workers for multi-core EXECs.

  submit() never blocks on the work itself; wait_signal() and synchronize() poll from Python with a timeout and raise
  TimeoutError naming what they waited for, never hang. Faults the processor records are raised as RuntimeError by
  the next wait, synchronize or check_faults.
  """

  def __init__(self, threads: int | None = None, spin_us: float = 200.0) -> None:
    self.threads = cpu_threads() if threads is None else threads
    if self.threads < 1:
      raise ValueError(f"a native runtime needs at least one thread, not {self.threads}")
    code = _native_code()
    self._control = aligned_words(CONTROL_BYTES // 8, alignment=4096)
    self._control[SPIN_NS // 8] = int(spin_us * 1000)
    self._control[SIGNAL_SLEEPERS // 8] = code.signal_sleepers_address
    self._state = _Threads(code, self._control, [], os.getpid())
    self._finalizer = weakref.finalize(self, self._state.stop)  # also runs at interpreter exit
    self._lock = threading.Lock()
    self._in_flight: deque[tuple[int, Any]] = deque()  # (submission, commands) until the processor is past them
    self._submitted = 0
    self._control_address = address = self._control.ctypes.data
    try:
      self._state.handles.append(_start_thread(code.command_processor, address))
      for _ in range(self.threads - 1):
        self._state.handles.append(_start_thread(code.pool_worker, address))
    except OSError:
      self.close()
      raise

  # ** submission

  def submit(self, commands: CommandBuffer | np.ndarray, timeout_s: float = 10.0) -> int:
    """Queues a command buffer; returns its submission number. The buffer must not change until it has run."""
    if isinstance(commands, CommandBuffer):
      words, address = commands.words, commands.address
    elif isinstance(commands, np.ndarray) and commands.dtype == np.uint64 and commands.flags.c_contiguous:
      words, address = commands, commands.ctypes.data
    else:
      raise TypeError(f"commands must be a CommandBuffer or a contiguous uint64 array, not {type(commands).__name__}"
                      f"{f' of {commands.dtype}' if isinstance(commands, np.ndarray) else ''}")
    return self.submit_words(address, len(words), commands, timeout_s)

  def submit_words(self, address: int, count: int, keep: Any = None, timeout_s: float = 10.0) -> int:
    """Queues the `count` command words at `address`; returns the submission number. `keep` (the words' owner) is
    held until the processor is past them; the words must not change until then."""
    if self._state.stopped:
      raise RuntimeError("the native runtime is closed")
    if os.getpid() != self._state.pid:
      raise RuntimeError(f"the native runtime was started by process {self._state.pid}; its threads are not in this "
                         f"forked process {os.getpid()}: make a new runtime here")
    with self._lock:
      while (submission := self._state.code.submit_commands(self._control_address, address, count)) < 0:
        self._wait_until(lambda: self.completed + RING_ENTRIES > self._submitted, timeout_s,
                         lambda: f"space in the submission ring ({RING_ENTRIES} entries)")
      self._submitted = submission + 1
      if keep is not None: self._in_flight.append((submission, keep))
      if len(self._in_flight) > 32:  # amortized: the references only cost memory
        self._release_finished()
    return submission

  @property
  def completed(self) -> int:
    """How many submissions the processor has finished."""
    return int(self._control[READ_POINTER // 8])

  def _release_finished(self) -> None:
    completed = self.completed
    while self._in_flight and self._in_flight[0][0] < completed:
      self._in_flight.popleft()

  # ** waiting

  def wait_signal(self, signal: Any, value: int, timeout_s: float = 10.0) -> None:
    """Returns once signal >= value (a Signal, or anything with .value, .address and .name); raises TimeoutError
    after timeout_s, RuntimeError on a recorded fault."""
    if signal.value < value:
      deadline = time.perf_counter() + timeout_s
      # native waits in slices, so Ctrl-C still gets through between them
      while (status := self._state.code.host_wait(self._control_address, signal.address, value, HOST_SPIN_NS,
                                                  int(min(max(deadline - time.perf_counter(), 0), 0.1) * 1e9))) != 1:
        if status == 2: self.check_faults()
        if time.perf_counter() >= deadline:
          raise TimeoutError(f"timed out after {timeout_s}s: {signal.name} at {signal.address:#x} is {signal.value}, "
                             f"waited for {value}; {self._queue_state()}")
    self._acquire(signal.address)
    self.check_faults()
    with self._lock:  # what ran before the signal is done: its buffers (and the programs they launch) may go now
      self._release_finished()

  def synchronize(self, timeout_s: float = 10.0) -> None:
    """Returns once every submitted buffer has run."""
    submitted = self._submitted
    self._wait_until(lambda: self.completed >= submitted, timeout_s,
                     lambda: f"{self.completed} of {submitted} submissions finished")
    self._acquire(self._control_address + READ_POINTER)
    with self._lock:
      self._release_finished()
    self.check_faults()

  def set_signal(self, signal: Signal, value: int) -> None:
    signal.set(value)

  def _acquire(self, address: int) -> None:
    # x86 loads already have acquire semantics; elsewhere the host must not read results ahead of the signal
    if _machine() != "x86_64":
      self._state.code.load_acquire(address)

  def _wait_until(self, ready: Callable[[], bool], timeout_s: float, describe: Callable[[], str]) -> None:
    """Polls, yielding the CPU between polls for 1 ms, then sleeps with a doubling backoff up to 100 us (a longer
    cap left multi-millisecond kernels finished but unnoticed for up to a millisecond).

    Yielding from the first poll matters: the scheduler often puts the processor thread on this thread's core, and
    the kernel we wait for cannot run there while we spin."""
    start = time.perf_counter()
    deadline, delay = start + timeout_s, 20e-6
    while not ready():
      if self._control[ERROR_CODE // 8]:
        self.check_faults()
      now = time.perf_counter()
      if now >= deadline:
        raise TimeoutError(f"timed out after {timeout_s}s: {describe()}; {self._queue_state()}")
      if now - start < 1e-3:
        os.sched_yield()
        continue
      time.sleep(min(delay, max(deadline - now, 0)))
      delay = min(delay * 2, 1e-4)

  def _queue_state(self) -> str:
    completed, position = self.completed, int(self._control[CURRENT_POSITION // 8])
    if completed >= self._submitted:
      return f"the queue is idle after {completed} submissions"
    commands = next((c for s, c in self._in_flight if s == completed), None)
    words = commands.words if isinstance(commands, CommandBuffer) else commands
    where = ""
    if words is not None and position < len(words):
      command = describe_commands(words[position:])
      where = f" ({command[0].split(': ', 1)[1]})" if command else ""
    return f"the queue is at submission {completed} of {self._submitted}, word {position}{where}"

  # ** faults

  def check_faults(self) -> None:
    """Raises the first fault the processor recorded since the last check, as a RuntimeError."""
    code = int(self._control[ERROR_CODE // 8])
    if code == 0:
      return
    self._acquire(self._control_address + ERROR_CODE)
    opcode, position = int(self._control[ERROR_OPCODE // 8]), int(self._control[ERROR_POSITION // 8])
    submission, count = int(self._control[ERROR_SUBMISSION // 8]), int(self._control[ERROR_COUNT // 8])
    self._control[ERROR_CODE // 8] = 0
    what = {Fault.UNKNOWN_OPCODE: f"unknown opcode {opcode}",
            Fault.TRUNCATED_COMMAND: f"{_op_name(opcode)} command runs past the end of the buffer",
            Fault.BAD_OPERAND: f"{_op_name(opcode)} command has a null or misaligned address or bad cores"}
    raise RuntimeError(f"command buffer #{submission} faulted at word {position}: {what.get(code, f'fault {code}')}; "
                       f"the rest of that buffer was skipped ({count} faults recorded so far)")

  # ** lifetime

  def close(self, timeout_s: float = 5.0) -> None:
    """Stops and joins the threads. The buffer running finishes (a WAIT in it gives up); later ones are dropped."""
    if self._finalizer.alive:
      self._finalizer.detach()
      self._state.stop(timeout_s)

  def __enter__(self) -> NativeRuntime:
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()

  def __repr__(self) -> str:
    return (f"NativeRuntime(threads={self.threads}, submitted={self._submitted}, completed={self.completed}"
            f"{', closed' if self._state.stopped else ''})")


def _op_name(opcode: int) -> str:
  return Op(opcode).name if opcode in Op._value2member_map_ else f"opcode {opcode}"
