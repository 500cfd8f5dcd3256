"""AMD GPUs driven directly through the amdkfd kernel driver (no ROCm): see device.py for the device. With EMULATE=1
the same code talks to an emulated KFD and GPU (emulated.py; AMD_ARCH=gfx942 picks MI300, gfx1100 is the default)."""
from rawgrad.drivers.amd.device import AMDDevice, open_device

__all__ = ["AMDDevice", "open_device"]
