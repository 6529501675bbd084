"""`make demo`: run the bundled example kernels through `pypto-run` on the CPU, checked against goldens.

Prints one line per kernel (PASS/FAIL, kernel time, wall time including interpreter start, and the
compiled runtime's task/edge counts from PYPTO_STATS) and exits non-zero if any kernel fails.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = ["scaled_residual.py", "row_softmax.py", "gemm_bf16.py", "row_topk.py", "moe_dispatch_combine.py"]


def _runner() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "pypto-run")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "pypto_rt.pypto_run"]


def main() -> int:
    from pypto_rt import config
    executor = config.EXECUTOR.get()
    print(f"pypto-rt demo: {len(KERNELS)} example kernels on the CPU (executor: {executor})\n")
    failed = 0
    for name in KERNELS:
        path = os.path.join(HERE, "kernels", name)
        start = time.perf_counter()
        proc = subprocess.run([*_runner(), path, "-p", "cpu"], capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, PYPTO_STATS="1"))
        elapsed = time.perf_counter() - start
        ok = proc.returncode == 0
        failed += not ok
        lines = [ln.strip().removeprefix("[RUN]").strip() for ln in proc.stdout.splitlines()]
        checks = [ln for ln in lines if "' PASS" in ln or "' FAIL" in ln]
        kernel_time = next((ln.split("(")[-1].rstrip(")") for ln in lines if ln.startswith("runtime done")), "?")
        stats = [ln.split(": ", 1)[1].split(" · ")[:2] for ln in proc.stderr.splitlines() if "stats [" in ln]
        graph = f"  [{' · '.join(stats[-1])}]" if stats else ""
        print(f"{'PASS' if ok else 'FAIL'}  {name:<20} kernel {kernel_time:>6}  process {elapsed:5.2f}s{graph}   "
              + "; ".join(checks))
        if not ok:
            print(proc.stdout[-2000:] + proc.stderr[-2000:])
    print(f"\n{len(KERNELS) - failed}/{len(KERNELS)} example kernels match their torch goldens")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
