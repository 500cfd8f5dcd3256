"""Every kernel of the MNIST training step (tools/mnist.py), lowered for sm_90, is accepted by ptxas; lowered for
gfx1100 and gfx942 it makes a code object our ELF loader reads (entry, kernel descriptor, sizes)."""
import os
import sys

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.codegen.lower import lower_kernel
from rawgrad.compiler.render.llvmir import AMDGPURenderer, NVPTXRenderer, kernel_symbol
from rawgrad.compiler.target import gpu_target
from rawgrad.runtime.compile import CompileError, LLVMCompiler, PTXCompiler, find_ptxas, split_embedded_program
from rawgrad.runtime.elf import load_amd_kernel
from rawgrad.compiler.codegen.linearize import kernel_parameters

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools"))
from mnist import MnistCNN, make_train_step  # noqa: E402
from rawgrad.nn.optim import Adam  # noqa: E402


def _has_ptxas() -> bool:
  try:
    return bool(find_ptxas())
  except CompileError:
    return False


@pytest.fixture(scope="module")
def mnist_kernels() -> list:
  """The kernel ASTs of one MNIST training step (batch 4), recorded as the CPU runs it."""
  import rawgrad.tensor as tensor_module
  recorded, original = [], tensor_module.cached_schedule

  def recording(outputs, on_kernel=None):
    schedule = original(outputs, on_kernel)
    recorded.extend(item.ast for item in schedule.items if item.ast.op.name != "COPY")
    return schedule
  tensor_module.cached_schedule = recording
  try:
    model = MnistCNN()
    step = make_train_step(model, Adam(__import__("rawgrad").nn.state.get_parameters(model), lr=1e-3))
    rng = np.random.default_rng(0)
    step(Tensor(rng.random((4, 1, 28, 28), dtype=np.float32)), Tensor(rng.integers(0, 10, 4).astype(np.int32)))
  finally:
    tensor_module.cached_schedule = original
  kernels = list(dict.fromkeys(recorded))
  assert len(kernels) > 50
  return kernels


@pytest.mark.skipif(not _has_ptxas(), reason="ptxas is missing: `pip install nvidia-cuda-nvcc` (CI installs it)")
def test_every_mnist_kernel_assembles_for_sm_90(mnist_kernels: list) -> None:
  target = gpu_target("sm_90")
  renderer, compiler = NVPTXRenderer(target, embed_program=True), PTXCompiler(target, embed_program=True)
  for ast in mnist_kernels:
    program = lower_kernel(ast, None, target).program
    cubin, embedded = split_embedded_program(compiler.compile(renderer.render(ast.arg, program)))
    assert cubin[:4] == b"\x7fELF" and embedded is not None, ast.arg
    assert f".text.{kernel_symbol(ast.arg)}".encode() in cubin


@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
def test_every_mnist_kernel_makes_an_amd_code_object(mnist_kernels: list, arch: str) -> None:
  target = gpu_target(arch)
  renderer, compiler = AMDGPURenderer(target), LLVMCompiler(target)
  for ast in mnist_kernels:
    lowered = lower_kernel(ast, None, target)
    kernel = load_amd_kernel(compiler.compile(renderer.render(ast.arg, lowered.program)), kernel_symbol(ast.arg))
    buffers, variables = kernel_parameters(lowered.program)
    assert kernel.kernarg_size == 8 * (len(buffers) + len(variables)), ast.arg
    assert kernel.code_offset < kernel.descriptor_offset < len(kernel.image)
    shared = sum(u.dtype.size * u.dtype.base.itemsize for u in set(lowered.program) if u.op.name == "DEFINE_LOCAL")
    assert kernel.group_segment_size >= shared
