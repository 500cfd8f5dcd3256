"""rawgrad: a hardware-direct tensor runtime."""
from rawgrad.compiler.symbolic import Variable
from rawgrad.dtype import dtypes
from rawgrad.helpers import Context, GlobalCounters
from rawgrad.runtime.device import Device
from rawgrad.jit import jit
from rawgrad.tensor import Tensor

__all__ = ["Context", "Device", "GlobalCounters", "Tensor", "Variable", "dtypes", "jit"]
