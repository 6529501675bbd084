"""A `run_function` rank: `python -m pypto_rt.launch.rank_main -m pypto_rt.launch.function_main PAYLOAD`.

PAYLOAD is base64 of pickle((fn, args, kwargs)). The return value is pickled to `rank<R>.result.pkl` beside the
rank's error record (PYPTO_ERROR_FILE's folder), where the launcher or the rank's Ray actor finds it; an exception
propagates to rank_main, which records it as the rank's failure.
"""
from __future__ import annotations

import base64
import os
import pickle
import sys

from pypto_rt import knobs
from pypto_rt.launch.contract import RESULT_FILE


def main(payload: str) -> None:
    fn, args, kwargs = pickle.loads(base64.b64decode(payload))
    value = fn(*args, **kwargs)
    path = os.path.join(os.path.dirname(knobs.ERROR_FILE.raw()), RESULT_FILE.format(rank=knobs.RANK.raw()))
    with open(path + ".tmp", "wb") as f:
        pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main(sys.argv[1])
