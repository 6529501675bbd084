"""The job's shared memory: every `/dev/shm/<prefix>+*` entry, where the prefix is `pypto-<job id>`.

Ranks create the segments; the launcher owns them and removes them all when the job ends, so a rank that
crashes, is killed, or forgets to unlink leaks nothing past its job. `+` ends the prefix in every segment name
and no job id holds it, so the clean-up of job `ab` never touches job `abc`'s segments (the naming rule of
pypto_rt.collective.segments, which this module does not import: the launcher stays free of torch).
"""
from __future__ import annotations

import os
import sys

from pypto_rt.launch.contract import SHM_DIR

SEPARATOR = "+"   # = pypto_rt.collective.segments.SEPARATOR


def remove_segments(prefix: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every entry of `shm_dir` named `<prefix>+...`; returns the names removed."""
    if not prefix or SEPARATOR in prefix:
        raise ValueError(f"bad shared-memory prefix {prefix!r}: it must be non-empty, without '{SEPARATOR}'")
    try:
        names = os.listdir(shm_dir)
    except OSError:  # no /dev/shm on this system: nothing can have been created there
        return []
    removed = []
    for name in sorted(n for n in names if n.startswith(prefix + SEPARATOR)):
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed.append(name)
        except FileNotFoundError:
            pass
        except OSError as e:
            print(f"pypto-launch: could not remove shared memory {os.path.join(shm_dir, name)}: {e}", file=sys.stderr)
    return removed
