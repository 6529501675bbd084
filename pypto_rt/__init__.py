"""pypto-rt: runs PyPTO (pl DSL) kernels on the CPU."""
from __future__ import annotations

import os


def use_deterministic_algorithms(mode: bool = True) -> None:
    """Like torch.use_deterministic_algorithms: with `mode`, atomic adds into a target are applied in program order
    (PYPTO_DETERMINISTIC=1, see README 'Knobs'). Sets the variable in this process's environment, so rank
    processes it starts later inherit it; a `config.scope(DETERMINISTIC=...)` still overrides it."""
    os.environ["PYPTO_DETERMINISTIC"] = "1" if mode else "0"


def are_deterministic_algorithms_enabled() -> bool:
    from pypto_rt import config

    return config.DETERMINISTIC.get() == "1"
