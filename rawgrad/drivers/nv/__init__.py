"""NVIDIA GPUs driven directly through the kernel driver's RM and UVM ioctls (no CUDA): see device.py for the device,
docs/nv-driver-notes.md for the facts it rests on. With EMULATE=1 the same code talks to an emulated H100
(emulated.py) instead of the kernel."""
from rawgrad.drivers.nv.device import NVDevice, open_device

__all__ = ["NVDevice", "open_device"]
