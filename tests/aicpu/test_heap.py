"""pypto_rt.aicpu.heap: the C heap a run's tiles come from (glibc only)."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")


def test_a_prefill_sized_tile_comes_from_the_kept_heap_not_a_fresh_mapping():
    # M_TOP_PAD turns glibc's dynamic mmap threshold off: left at 128 KiB, every tile of 128 KiB or more was
    # mapped (and page-faulted in) afresh at every run. mallinfo2's hblks counts the blocks malloc mapped.
    code = """if True:
        import ctypes
        import torch
        from pypto_rt.aicpu import Engine

        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = MallInfo2
        Engine(num_workers=1).close()          # the first engine applies the heap knobs
        before = libc.mallinfo2().hblks
        tiles = [torch.empty(1024, 1024, dtype=torch.float32) for _ in range(3)]   # 4 MiB each
        print(libc.mallinfo2().hblks - before)
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYPTO_HEAP_PAD_MB", "GLIBC_TUNABLES")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    if "mallinfo2" in done.stderr:
        pytest.skip("this libc has no mallinfo2 (glibc < 2.33)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"], f"blocks mapped for three 4 MiB tiles: {done.stdout.strip()}"
