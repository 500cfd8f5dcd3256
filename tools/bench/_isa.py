"""With CPU_ISA=avx2 the references are limited to AVX2 as well, so that a run on an AVX-512 machine measures what
an AVX2-only machine would see: numpy's OpenBLAS picks its Haswell kernels, torch its AVX2 kernels and oneDNN's
convolutions stop at AVX2. Imported by the benchmarks before numpy and torch load (they read these once). A
variable already set is left as it is."""
import os

AVX2_REFERENCES = {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                   "MKL_ENABLE_INSTRUCTIONS": "AVX2"}

if os.environ.get("CPU_ISA", "").lower() == "avx2":
  for name, value in AVX2_REFERENCES.items(): os.environ.setdefault(name, value)
