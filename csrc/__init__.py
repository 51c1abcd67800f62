"""appo_ipc: the shared memory the trainer's processes talk through. The C++ module (_native: ipc.h,
ipc.cpp, module.cpp) supplies the queue, the shared buffers and the slots' control."""

from ._native import CRASH_POINTS, Closed, Queue, SharedBuffer, SlotControl, _arm_crash_point  # noqa: F401
