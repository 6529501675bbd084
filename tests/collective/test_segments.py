"""Segment names belong to exactly one job, and a segment removed under a running job is named as such."""
from __future__ import annotations

import functools
import os
import traceback
import uuid

import pytest
import torch

from pypto_rt.collective import create_communicator, list_segments, remove_segments
from pypto_rt.collective import segments
from pypto_rt.collective.segments import SegmentMissing
from pypto_rt.errors import PyptoError
from pypto_rt.launch import job_segments
from tests.collective.harness import run_ranks


def _job_ids() -> tuple[str, str]:
    """Two fresh job ids, one a prefix of the other (`ab` and `abc`)."""
    ab = "t" + uuid.uuid4().hex[:10]
    return ab, ab + "c"


@pytest.mark.parametrize("cleanup", [remove_segments, job_segments.remove_segments], ids=["collective", "launcher"])
def test_cleaning_up_job_ab_leaves_job_abc_segments(cleanup):
    ab, abc = _job_ids()
    victim = create_communicator("shm", 0, 1, prefix=f"pypto-{abc}", owner_unlinks=False)
    try:
        window = victim.alloc_window(64)
        victim.allreduce(torch.ones(4))
        before = list_segments(f"pypto-{abc}")
        assert len(before) == 3   # control, window, one staging half
        assert cleanup(f"pypto-{ab}") == []
        assert list_segments(f"pypto-{abc}") == before
        victim.notify(window, 0, 0, 1, op="atomic_add")   # a locked update: needs its file
        victim.close()
    finally:
        remove_segments(f"pypto-{abc}")
    assert list_segments(f"pypto-{abc}") == []


def test_a_prefix_cannot_hold_the_separator():
    with pytest.raises(PyptoError, match="without '/' or '\\+'"):
        segments.segment_name("pypto-a+b", "c0")
    with pytest.raises(ValueError, match="without '\\+'"):
        job_segments.remove_segments("pypto-a+b")
    assert job_segments.SEPARATOR == segments.SEPARATOR


def test_a_segment_removed_under_a_running_rank_names_it_the_rank_and_what_happened():
    prefix = f"pypto-{_job_ids()[0]}"
    comm = create_communicator("shm", 0, 1, prefix=prefix, owner_unlinks=True)
    try:
        window = comm.alloc_window(64)
        name = window.segments[0].name
        os.unlink(segments.path_of(name))   # what another job's clean-up did before the fix
        with pytest.raises(SegmentMissing) as caught:
            comm.notify(window, 0, 0, 1, op="atomic_add")
        err = caught.value
        assert (f"rank 0: shared-memory segment /dev/shm/{name} was removed while the job still uses it"
                in err.message)
        assert "something outside this job unlinked it" in err.hint
        frames = [f.filename for f in traceback.extract_tb(err.__traceback__)]
        assert not any(f.endswith("contextlib.py") for f in frames), frames   # not reported at a stdlib line
        comm.close()
    finally:
        remove_segments(prefix)


def _removing_peer(ctx, doomed: str):
    """Rank 1's window segment vanishes right after rank 1 creates it; rank 0 then cannot map it."""
    if ctx.rank == 1:
        create = segments.Segment.create

        def create_then_lose(name, nbytes, *rank):
            seg = create(name, nbytes, *rank)
            if name.endswith(doomed):
                os.unlink(segments.path_of(name))
            return seg
        segments.Segment.create = create_then_lose   # this forked rank's own copy of the module
    with ctx.comm() as comm:
        comm.alloc_window(64, "data")


@pytest.mark.timeout(60)
def test_a_peer_segment_removed_before_this_rank_maps_it_is_named_as_removed():
    outcome = run_ranks(functools.partial(_removing_peer, doomed="-w0-r1"), 2)
    err = outcome.errors[0]
    assert err["type"] == "SegmentMissing", err
    assert "rank 0: shared-memory segment /dev/shm/" in err["text"] and "-w0-r1 was removed while the job still " \
        "uses it, so this rank cannot map rank 1's segment" in err["text"]
