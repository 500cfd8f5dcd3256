"""A buffer collected by the garbage collector together with its memory's owner, for the drivers' tests."""
import gc

from rawgrad.dtype import dtypes
from rawgrad.runtime.device import Buffer, Device
from rawgrad.runtime.hcq import HWQueue


def buffer_after_a_collected_cycle(device: str, nbytes: int) -> Buffer:
  """A buffer of `nbytes` allocated right after one of the same size was collected in a garbage cycle (the
  collector then runs the memory owner's finalizer before Buffer.__del__), once the device is past the submission
  the freed memory waited for."""
  gc.collect()
  doomed = Buffer(device, nbytes, dtypes.uint8).ensure_allocated()
  cycle: list = [doomed]
  cycle.append(cycle)
  del doomed, cycle
  gc.collect()
  buffer = Buffer(device, nbytes, dtypes.uint8).ensure_allocated()
  Device[device].synchronize()
  Device[device].submit(HWQueue())
  Device[device].synchronize()
  return buffer
