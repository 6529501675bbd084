"""MoEBuffer dispatch and combine in launched jobs on the shm communicator (tests/kernels/moe/progs/).

dispatch_combine.py checks, on every rank and for three calls on one buffer with token counts that differ per
rank and call (one rank with none): recv.counts against the job's route counts, recv.x's live rows in (rank,
token) order, combine against out[t] = sum_k w[t, k] * x[t] * (e[t, k] + 1), and that no call read data on the
host.
"""
import mmap
import os
import re
import subprocess
import sys

import pytest

from tests.kernels.moe.launched_configs import SharedJobs
from tests.multirank.launched import launch

PROGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs")
DISPATCH_COMBINE = os.path.join(PROGS, "dispatch_combine.py")
ERRORS = os.path.join(PROGS, "moe_errors.py")
# the module's 2-rank dispatch_combine.py checks (each of a layout of its own) run as one job, a rank's start-up paid
# once (tests/kernels/moe/launched_configs.py); each test checks its configuration's lines
TWO_RANKS = ((), ("--dtype", "fp32", "--top-k", "3", "--experts-per-rank", "3"),
             ("--form", "live", "--top-k", "3", "--experts-per-rank", "3", "--inf-row"))

# the 2-rank steady checks, one job: the fixed form, then the live form at another hidden size (layouts differ)
STEADY = {form: ("--form", form, "--steady", "--calls", "6", "--routing", "uniform") + hidden
          for form, hidden in (("fixed", ()), ("live", ("--hidden", "16", "--staging", "live")))}
LAYERS = (("--names", "deepseek"), ("--quantize",))   # the 2-rank moe_layer.py checks (one job)
# the compiled tier's checks, one job: each form with rows wide enough for its narrow products to be unrolled, the
# live one with each of its sums (each at another hidden size: layouts differ; the first's blocks are whole pages,
# so its staging is the peers' windows, dispatch.peer_staging)
TIERED = tuple(("--form", form, "--steady", "--calls", "8", "--hidden", hidden, "--top-k", "3", "--experts-per-rank",
                "3", "--inf-row", "--tier", "--sums", sums, "--routing", "mixed", "--staging", staging)
               for form, hidden, sums, staging in (("fixed", "256", "default", "auto"),
                                                   ("live", "128", "every", "pairs"), ("live", "96", "live", "live")))


@pytest.fixture(scope="module")
def jobs():
    return SharedJobs(limit_s=170)


def _dispatch_combine(jobs, nproc: int, args: tuple):
    configs = TWO_RANKS if nproc == 2 and args in TWO_RANKS else (args,)
    return jobs.job(nproc, DISPATCH_COMBINE, ("--timeout-s", "90"), configs, configs.index(args))


def _all_pass(job, nproc: int, checks: int):
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    for rank in range(nproc):
        passed = re.findall(rf"\brank {rank}/{nproc}: PASS ", job.out)
        assert len(passed) == checks, job.out[-3000:]
    assert "FAIL" not in job.out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nproc, args", [
    (2, ()),
    (2, ("--dtype", "fp32", "--top-k", "3", "--experts-per-rank", "3")),
    (4, ("--routing", "skewed")),
    (8, ("--top-k", "6", "--max-tokens", "8", "--staging", "live")),
], ids=["2-bf16", "2-fp32-k3", "4-skewed", "8-k6"])
def test_dispatch_combine_is_exact_on_every_rank(jobs, nproc, args):
    job = _dispatch_combine(jobs, nproc, args)
    _all_pass(job, nproc, checks=12)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nproc, form", [(2, "fixed"), (2, "live"), (4, "fixed")])
def test_both_forms_replay_with_the_routing_changing_every_call_and_stay_exact(jobs, nproc, form):
    """Steady token counts, new routing every call: from the fifth call both calls replay (the counts region's
    signals as recorded calls, the fixed form's receive side as recorded torch calls reading the windows, the live
    form's too (its row counts computed by the call: replay.late_rows); the third call's recording is refused
    inside the exchange and the return, which the fourth calls as they are) and every call still matches the
    golden. The two 2-rank forms share a job (the live form's hidden size another, so its layout is its own)."""
    args = STEADY[form] if nproc == 2 else ("--form", form, "--steady", "--calls", "6", "--routing", "uniform")
    configs = tuple(STEADY.values()) if nproc == 2 else (args,)
    job = jobs.job(nproc, DISPATCH_COMBINE, ("--timeout-s", "90"), configs, configs.index(args))
    _all_pass(job, nproc, checks=6 * 4 + 2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", [0, 1, 2], ids=["fixed", "live-every-slot", "live-sums"])
def test_the_compiled_dispatch_and_combine_stay_exact_and_an_inf_row_gives_inf(jobs, form):
    """Under PYPTO_TIER=eager every kernel compiled (replay.tier: the word views undone, the weighted sums of
    gathered rows unrolled into one loop, replay.tier_passes) and swapped in from the sixth call; a live layout's
    combine is either two kernels (its sums over every route slot, dispatch.combine_send_kernel: the default) or
    one summing live routes only (its rows counted by the call: replay.late_rows), all compiled. Every call still
    matches the golden, and the token whose live route reads a +inf expert row combines to +inf (the select that
    zeroes a dead slot's stand-in row survives the passes; 0 * inf would be NaN). The routing turns skewed every
    other call, so the row counts the compiled code takes jump between a few rows and every arrival slot."""
    job = jobs.job(2, DISPATCH_COMBINE, ("--timeout-s", "150"), TIERED, form)
    _all_pass(job, 2, checks=8 * 4 + 1)


@pytest.mark.timeout(180)
def test_the_live_form_sums_live_routes_only_so_an_inf_row_gives_inf_not_nan(jobs):
    """The live form's combine groups arrivals by how many of their routes live on the rank (1..K at top-3, 3 experts
    per rank) and sums exactly those rows, one batched matmul per group: a token whose live route reads a +inf
    expert row combines to +inf. The fixed form's
    stand-in for a dead route slot (a live row of the token, weight 0) made that 0 * inf = NaN."""
    job = _dispatch_combine(jobs, 2, ("--form", "live", "--top-k", "3", "--experts-per-rank", "3", "--inf-row"))
    _all_pass(job, 2, checks=12)


@pytest.mark.timeout(180)
def test_the_send_staging_and_the_sums_are_the_peers_windows_where_a_block_is_whole_pages(jobs):
    """dispatch.peer_staging: where a rank's block of the token windows is whole pages (8 tokens of 256 bf16
    columns: 4 KiB), the send staging and the combine's sums are those blocks of every rank's window, mapped side by
    side here (collective.peer_blocks), so the replayed puts copy no token row (only the count and meta rows cross
    by copy); at 16 columns the blocks are not pages, both are plain tensors and the puts copy the live rows. Both
    stay exact and replay (the steady test above runs the same job)."""
    mapped, plain = (jobs.job(2, DISPATCH_COMBINE, ("--timeout-s", "90"), tuple(STEADY.values()), i) for i in (0, 1))
    if 4096 % mmap.PAGESIZE:
        pytest.skip(f"this machine's pages are {mmap.PAGESIZE} bytes: a 4 KiB block is not whole pages")
    for rank in range(2):
        assert f"rank {rank}/2: staging peer-mapped, one-sided copies of a token row or more: 0" in mapped.out, \
            mapped.out[-3000:]
        assert re.search(rf"rank {rank}/2: staging plain, one-sided copies of a token row or more: [1-9]", plain.out), \
            plain.out[-3000:]


@pytest.mark.timeout(180)
def test_the_fixed_form_gives_inf_not_nan_for_an_inf_row_behind_a_dead_route_slot():
    """The fixed form (decode sizes) reads a stand-in row for each dead route slot in the expert sums, which a
    select zeroes (it once weighed 0: 0 * inf = NaN); the home rank's sum of what came back reads back_in's zero
    row for a rank the token has no route on."""
    job = launch(2, DISPATCH_COMBINE, "--timeout-s", "90", args=("--form", "fixed", "--top-k", "3",
                                                                 "--experts-per-rank", "3", "--inf-row"), limit_s=170)
    _all_pass(job, 2, checks=12)


def test_mistakes_raise_before_communicating_and_the_buffer_keeps_working():
    job = launch(2, ERRORS, "--timeout-s", "60", args=("recover",))
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    for rank in range(2):
        caught = dict(re.findall(rf"\] rank {rank}: CAUGHT (\w+): (.*)$", job.out, re.M))
        assert set(caught) == {"tokens", "expert_range", "duplicate_expert", "dtype", "hidden", "weights_shape",
                               "combine_without_dispatch", "dispatch_twice", "combine_twice"}, job.out
        assert all(m.startswith(f"rank {rank}: MoEBuffer.") for m in caught.values()), caught
        assert "over max_tokens_per_rank=4" in caught["tokens"]
        assert "topk_idx[1, 0] = 4 is not an expert id" in caught["expert_range"]
        assert "routes to expert" in caught["duplicate_expert"]
        assert "combine has not run" in caught["dispatch_twice"]
        assert "combine already ran" in caught["combine_twice"]
        assert f"rank {rank}: PASS nothing was sent" in job.out
        assert f"rank {rank}: PASS the call after the mistakes" in job.out


@pytest.mark.timeout(420)
def test_a_mistake_on_one_rank_names_that_rank_and_the_users_line():
    job = launch(2, ERRORS, "--timeout-s", "300", args=("uncaught",), limit_s=400)
    assert job.rc != 0
    summary = job.err.split("pypto-launch: job", 1)[-1]
    assert "rank 0 failed first" in summary, job.err[-3000:]
    assert "rank 0: MoEBuffer.dispatch: x has 5 tokens, over max_tokens_per_rank=4" in summary
    assert "moe_errors.py" in summary and "buf.dispatch(x, idx, w)" in summary
    assert job.seconds < 150, job.seconds   # the launcher ends rank 1's wait, not the 300 s deadline (56 s at load 19)


@pytest.mark.timeout(120)
def test_a_peer_that_never_dispatches_ends_in_the_wait_report():
    job = launch(2, ERRORS, "--timeout-s", "4", args=("absent",))
    assert job.rc != 0
    summary = job.err.split("pypto-launch: job", 1)[-1]
    assert "rank 0 failed first" in summary, job.err[-3000:]
    assert re.search(r"rank 0 waits in `wait` \(label moe_exchange\) for cell \[1, 0\] of window '\w+' \(seen 0, "
                     r"expected >= 1\), which rank 1 would set", summary), summary


@pytest.mark.timeout(120)
def test_a_world_size_that_does_not_divide_the_experts_is_named_on_every_rank():
    job = launch(3, ERRORS, "--timeout-s", "30", args=("world",))
    assert job.rc == 0, job.out[-3000:] + job.err[-3000:]
    for rank in range(3):
        assert f"rank {rank}: CAUGHT world: rank {rank}: MoEBuffer: world size 3 does not divide num_experts=4" \
            in job.out


@pytest.mark.timeout(120)
def test_the_kernels_run_in_a_host_form_program_with_windows_it_allocates():
    """The library's factory-made kernels dispatched with device=r (a rank finds them by creation serial), every
    buffer and window of the shape the kernels declare (back_in with its zero row): no EntryShapeWarning."""
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "pypto-run"),
                           os.path.join(PROGS, "dispatch_host_form.py")], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "'out' PASS" in proc.stdout
    assert "EntryShapeWarning" not in proc.stdout + proc.stderr, proc.stderr[-3000:]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nproc, args", [(2, ("--names", "deepseek")), (2, ("--quantize",)),
                                         (4, ("--names", "deepseek", "--quantize"))],
                         ids=["2-deepseek-bf16", "2-mixtral-int8", "4-deepseek-int8"])
def test_moe_layer_matches_its_golden_and_loads_only_its_experts(jobs, nproc, args):
    """MoELayer.from_state_dict + three calls (router, gate, dispatch, experts, combine + shared expert). The two
    2-rank layers are checked in one job (two layers of one model), each test on its layer's lines."""
    configs = LAYERS if nproc == 2 and args in LAYERS else (args,)
    job = jobs.job(nproc, os.path.join(PROGS, "moe_layer.py"), ("--timeout-s", "90"), configs, configs.index(args))
    _all_pass(job, nproc, checks=4)
