"""The CPU driver: host memory, kernels loaded by our ELF loader, a native command processor (see device.py)."""
from rawgrad.drivers.cpu.device import CPUDevice, memory_bytes, open_device
from rawgrad.drivers.cpu.program import CPUKernel, CPUProgram

__all__ = ["CPUDevice", "CPUKernel", "CPUProgram", "memory_bytes", "open_device"]
