"""Prints this rank's thread counts: torch's at start, after pypto_rt.golden's import, and the variables."""
import json
import os

import torch

before = torch.get_num_threads()
import pypto_rt.golden  # noqa: E402,F401 - sets its own count at import

print(f"[rank {os.environ['RANK']}] THREADS", json.dumps({
    "torch": before, "golden": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
    "golden_env": os.environ.get("PYPTO_GOLDEN_NUM_THREADS")}), flush=True)
