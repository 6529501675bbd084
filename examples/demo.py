"""`make demo`: run the bundled example kernels through `pypto-run` on the CPU, checked against goldens, then the
serving flagship (examples/serve/serve.py) under `pypto-launch --nproc 4`.

Prints one line per kernel (PASS/FAIL, kernel time, wall time including interpreter start, and the
compiled runtime's task/edge counts from PYPTO_STATS), then the flagship's progress, metrics and golden check,
and exits non-zero if any kernel or the flagship fails. `python -m examples.demo --kernels-only` skips the
flagship; `--serve-nproc N` and any arguments after `--` go to it.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = ["scaled_residual.py", "row_softmax.py", "gemm_bf16.py", "row_topk.py", "moe_dispatch_combine.py"]


def _runner() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "pypto-run")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "pypto_rt.pypto_run"]


def run_kernels() -> int:
    """The example kernels; returns how many failed."""
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
    return failed


def run_flagship(nproc: int, args: list[str]) -> bool:
    """examples/serve/serve.py on `nproc` ranks through pypto-launch, its output printed as it comes."""
    launcher = os.path.join(os.path.dirname(sys.executable), "pypto-launch")
    cmd = [launcher] if os.path.exists(launcher) else [sys.executable, "-m", "pypto_rt.launch.cli"]
    cmd += ["--nproc", str(nproc), os.path.join(HERE, "serve", "serve.py"), *args]
    shown = " ".join(["pypto-launch --nproc", str(nproc), "examples/serve/serve.py", *args])
    print(f"\nserving flagship: {shown}\n", flush=True)
    start = time.perf_counter()
    code = subprocess.run(cmd, timeout=1800).returncode
    print(f"\nserving flagship {'PASS' if code == 0 else f'FAIL (exit {code})'} in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return code == 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description="the example kernels, then the serving flagship")
    parser.add_argument("--kernels-only", action="store_true", help="skip the serving flagship")
    parser.add_argument("--serve-nproc", type=int, default=4, help="ranks of the serving flagship (default 4)")
    opts = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    failed = run_kernels()
    served = opts.kernels_only or run_flagship(opts.serve_nproc, serve_args)
    return 1 if failed or not served else 0


if __name__ == "__main__":
    raise SystemExit(main())
