"""What pypto-rt keeps per kernel function, as one typed object (`KernelFunction.state`). Imports nothing.

Each layer owns its fields and fills them on first use; nothing here runs. The artefacts depend only on the
kernel's source and its specialisation (like Triton's per-function cache), so every `pypto_rt.Runtime` shares
them; `clear()` forgets them all (the next call analyses and compiles again, from the disk cache if it can).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


NOT_SETTLED = object()   # what `KernelState.settled` gives for a call it does not run


@dataclass(eq=False)
class KernelState:
    """Per-kernel state, by owner."""
    # language / binding: evaluated annotations, the signature and its plain positional parameters
    annotations: dict | None = None
    signature: Any = None
    plain_params: Any = None
    shape_warnings: set = field(default_factory=set)      # (name, shape) keys already warned about
    # frontend: style notes already given (once per kernel and process)
    style_notes_given: set = field(default_factory=set)
    # reference executor: the function it runs, and the placements ("host" / "incore") already checked
    reference: Any = None
    reference_checked: set = field(default_factory=set)
    # incore compiler: the kernel compiled as InCore code throughout (plain, and the traced variant)
    incore_kernel: Any = None
    incore_kernel_traced: Any = None
    python_calls: Any = None                               # the plain-Python calls it makes (None: not looked at)
    # orchestration: host programs (plain, traced), one per PYPTO_COALESCE setting, and the inline kernel's
    # direction warning
    host_programs: dict = field(default_factory=dict)
    host_programs_traced: dict = field(default_factory=dict)
    inline_warned: bool = False
    # replay: specialisation -> its recording / policy; (replay.arguments.ArgumentMatch, specialisation) pairs,
    # the last matched first (None until one is replayed)
    replay: dict = field(default_factory=dict)
    replay_by_arguments: list | None = None
    # ... and the settled call (replay.settled `settle`): `settled(args)` replays the last matched specialisation
    # when nothing is left to decide, else gives NOT_SETTLED (and the call takes the driver); None when there is none
    settled: Any = None
    # ... and the compiled tier's families of specialisations sharing one graph (replay.tier_family; None until used)
    tier_families: Any = None

    def clear(self) -> None:
        """Forget everything (as a fresh process would)."""
        for f in fields(self):
            setattr(self, f.name, f.default_factory() if callable(f.default_factory) else f.default)
