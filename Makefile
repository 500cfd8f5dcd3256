PYTHON ?= python3

.PHONY: install test lint bench demo autogen

install:
	$(PYTHON) -m pip install -q -e '.[test]'

# the op suite (forward and backward), the jit and the runtime, again on each GPU path without a GPU: SIM with kernels
# lowered for sm_90 and gfx1100 and run by the interpreter, then the NV and AMD drivers against their emulated kernel
# interfaces, which decode the real command bytes (EMULATE=1)
DEVICE_SUITE = tests/tensor_ops tests/test_tensor.py tests/test_tensor_jit.py tests/compiler/test_gradient.py \
               tests/nn/test_modules.py tests/nn/test_optim.py tests/engine/test_realize.py tests/runtime/test_memory.py \
               tests/engine/test_argument_table.py

# on an AVX-512 machine, the op suite and the codegen tests again with kernels for AVX2 only (CPU_ISA=avx2): what an
# AVX2 machine would run (bfloat16 once failed to load there alone)
test: install
	SPEC=1 $(PYTHON) -m pytest tests
	DEVICE=SIM SIM_ARCH=sm_90 SPEC=1 $(PYTHON) -m pytest $(DEVICE_SUITE)
	DEVICE=SIM SIM_ARCH=gfx1100 SPEC=1 $(PYTHON) -m pytest $(DEVICE_SUITE)
	DEVICE=NV EMULATE=1 SPEC=1 $(PYTHON) -m pytest $(DEVICE_SUITE)
	DEVICE=AMD EMULATE=1 SPEC=1 $(PYTHON) -m pytest $(DEVICE_SUITE)
	DEVICE=AMD EMULATE=1 AMD_ARCH=gfx942 SPEC=1 $(PYTHON) -m pytest $(DEVICE_SUITE)
	if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then \
	  CPU_ISA=avx2 SPEC=1 $(PYTHON) -m pytest $(DEVICE_SUITE) tests/compiler/codegen tests/test_dtype.py; fi

lint: install
	$(PYTHON) -m ruff check rawgrad tests tools

bench: install
	@for f in tools/bench/*.py; do echo "== $$f"; $(PYTHON) $$f || true; done

demo:
	$(PYTHON) -m pip install -q -e '.[demo]'
	$(PYTHON) tools/demo.py

# Regenerates rawgrad/autogen/ (nv/, amd/) from the real C headers; see the top of tools/autogen.py for where they
# come from (amd reads the Debian packages linux-libc-dev, libhsa-runtime-dev, linux-source-6.1 and llvm-14-dev,
# installed or fetched with apt-get download).
autogen:
	$(PYTHON) -m pip install -q -e '.[autogen]'
	$(PYTHON) tools/autogen.py nv
	$(PYTHON) tools/autogen.py amd
