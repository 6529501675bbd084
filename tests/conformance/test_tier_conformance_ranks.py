"""The multi-rank conformance kernels (c08 host-form allreduce, c09 launched allgather) give their golden results
with the compiled tier on (issue 17, PYPTO_TIER=eager), and the tier says why they stay replayed.

Each rank (forked, tests.collective.harness; c08 is written for 4 ranks, c09 runs at 2) calls the file's chip kernel
itself, as its host body or main would, on fresh windows and fresh inputs every call (their signals count one
notify per call), until its calls replay; every call is checked against the file's golden. A host-form job forks
its ranks per host call, so a rank of `pypto-run c08_allreduce_host.py` never calls the kernel twice: the ranks
here call it repeatedly to reach the replay and the tier.

What the tier does with them: nothing compiled. Both kernels read peers' rows with `pld.tile.remote_load` inside
their block, which has no recorded form (replay.comm_block): the recording is refused inside the block and the
replay calls the block as it is, which the tier does not compile (`tier replay (it calls 1 kernel blocks as they
are)`). Their torch work between communication lines is one or two calls (a store, an add per peer), below
`tier_min_segment_calls`, so a recorded remote_load would not give them a compiled segment either.
"""
from __future__ import annotations

import contextlib
import io
import os

import pytest
import torch

from pypto_rt.golden.files import load_kernel_file
from tests.collective.harness import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
CALLS = 4   # recorded (refused inside the block), recorded again with the block called as it is, then replays
# record at the first call, keep the replay (no engine trial), compile at the first replay (eager)
KEEP = dict(normal_runs=0, slower=float("inf"), parallel=float("inf"), trial_replays=0, tier_after_replays=0,
            tier_trial_calls=1 << 30)
REFUSED = "refused inside a block: pld.tile.remote_load communicates with other ranks ({file}:{line})"


def _windows(shape: list, world: int):
    """A fresh data window of `shape` and a fresh [world, 1] signal window (collective: every rank, same order)."""
    import pypto.language as pl
    import pypto.language.distributed as pld

    data = pld.window(pld.alloc_window_buffer(shape, dtype=pl.FP32), shape, dtype=pl.FP32)
    return data, pld.window(pld.alloc_window_buffer([world, 1], dtype=pl.INT32), [world, 1], dtype=pl.INT32)


def _c08_call(module, me: int, world: int, gen) -> bool:
    values = {"inputs": torch.randn(world, 1, module.SIZE, generator=gen), "outputs": torch.zeros(world, 1, module.SIZE)}
    data, signal = _windows([1, module.SIZE], world)
    got = torch.zeros(1, module.SIZE)
    module.allreduce(values["inputs"][me].clone(), got, data, signal, me)
    module.golden_allreduce(values)
    return torch.allclose(got, values["outputs"][me], rtol=1e-5, atol=1e-5)


def _c09_call(module, me: int, world: int, gen) -> bool:
    rows = torch.randn(world, module.ROWS, module.D, generator=gen)
    data, signal = _windows([module.ROWS, module.D], world)
    gathered = torch.zeros(world, module.ROWS, module.D)
    module.allgather_rows(rows[me].clone(), gathered, data, signal)
    return torch.equal(gathered, rows)


PROGRAMS = {  # file: (ranks, entry, one checked call)
    "c08_allreduce_host": (4, "allreduce", _c08_call),
    "c09_allgather_launched": (2, "allgather_rows", _c09_call),
}


def _rank_fn(name: str):
    def rank_fn(rank):
        from pypto_rt import config
        from pypto_rt.collective import process
        from pypto_rt.replay.policy import policy_scope
        from pypto_rt.replay.tier import tiers

        os.environ["PYPTO_TIMEOUT_S"] = "60"
        module = load_kernel_file(os.path.join(HERE, f"{name}.py"), f"{name}_tiered")
        _, entry, call = PROGRAMS[name]
        process.install(rank.comm())
        try:
            stats = io.StringIO()
            with config.scope(TIER="eager", STATS="1"), policy_scope(**KEEP), contextlib.redirect_stderr(stats):
                gen = torch.Generator().manual_seed(17)   # (every rank draws the whole job's inputs)
                matched = [call(module, rank.rank, rank.world_size, gen) for _ in range(CALLS)]
            return matched, [(t.state, t.why) for t in tiers(getattr(module, entry))], \
                stats.getvalue()
        finally:
            process.close()
    return rank_fn


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, line", [("c08_allreduce_host", 38), ("c09_allgather_launched", 48)])
def test_a_multirank_conformance_kernel_matches_its_golden_with_the_tier_on_and_says_why_it_stays_replayed(
        name, line):
    outcome = run_ranks(_rank_fn(name), PROGRAMS[name][0], deadline_s=100).ok()
    for rank, (matched, found, stats) in outcome.items():
        assert all(matched), (rank, matched)
        # one specialisation: its replay calls the block as it is, and around it no run of torch calls is long enough
        # to compile (replay.tier_segments)
        assert len(found) == 1 and found[0][0] == "replay", (rank, found)
        why = found[0][1]
        assert why.startswith("it calls 1 kernel blocks as they are, and no run of torch calls between those"), why
        assert REFUSED.format(file=f"{name}.py", line=line) in stats, stats[-3000:]
        replayed = [s for s in stats.splitlines() if ": replayed: " in s]
        assert len(replayed) == CALLS - 2 and all("tier replay (it calls 1 kernel blocks" in s for s in replayed), \
            stats[-3000:]
