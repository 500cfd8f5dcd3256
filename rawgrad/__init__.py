"""rawgrad: a hardware-direct tensor runtime."""
from rawgrad.compiler.symbolic import Variable
from rawgrad.dtype import dtypes
from rawgrad.helpers import Context

__all__ = ["Context", "Variable", "dtypes"]
