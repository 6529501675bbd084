"""Copies by address between mapped memory (a window's bytes, a CPU tensor's): what a one-sided put or store whose
boxes are contiguous runs of whole rows comes to (ops.distributed keeps the addresses in its plan). Here, outside
`pypto_rt.ops`, because the op library may call torch only where a recording sees it (tests/replay)."""
from __future__ import annotations

import ctypes

copy = ctypes.memmove   # (target address, source address, bytes); ~1 us a call, against ~8 us for a torch view and copy
