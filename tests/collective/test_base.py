"""Op names, argument checks, segments and backend selection (no rank processes)."""
from __future__ import annotations

import threading

import pytest
import torch

from pypto_rt.collective import (BackendUnavailableError, available_backends, create_communicator, list_segments,
                                 remove_segments)
from pypto_rt.collective.base import check_all_to_all_v, check_allgather, notify_op, reduce_op, wait_cmp
from pypto_rt.collective.segments import Segment, SegmentMissing, segment_name
from pypto_rt.errors import PlatformError, PyptoError
from pypto_rt.language.enums import NotifyOp, ReduceOp, WaitCmp
from tests.collective.harness import new_prefix


def test_op_names_accept_strings_and_the_pld_enums():
    assert [reduce_op(o) for o in ("sum", "MAX", ReduceOp.Min)] == ["sum", "max", "min"]
    assert [notify_op(o) for o in ("set", "atomic_add", NotifyOp.AtomicAdd, NotifyOp.Set)] == \
        ["set", "atomic_add", "atomic_add", "set"]
    assert [wait_cmp(c) for c in ("eq", WaitCmp.Ge)] == ["eq", "ge"]
    with pytest.raises(PyptoError, match="reduce op 'avg' is not one of sum, max, min"):
        reduce_op("avg")


class _Comm:
    rank, world_size = 1, 2


def test_argument_checks_say_what_is_wrong():
    with pytest.raises(PyptoError, match=r"allgather out has shape \(3, 4\), expected \(2, 4\)"):
        check_allgather(_Comm, torch.empty(3, 4), torch.empty(4))
    with pytest.raises(PyptoError, match="2 non-negative send and recv counts"):
        check_all_to_all_v(_Comm, torch.empty(4, 2), torch.empty(4, 2), [1, 1, 1], [1, 1])
    with pytest.raises(PyptoError, match="sends 5 rows from 4"):
        check_all_to_all_v(_Comm, torch.empty(4, 2), torch.empty(4, 2), [4, 1], [1, 1])
    with pytest.raises(PyptoError, match="sends 3 rows to itself but expects 1 from itself"):
        check_all_to_all_v(_Comm, torch.empty(4, 2), torch.empty(4, 2), [1, 3], [1, 1])


def test_segments_are_zeroed_page_sized_exclusive_and_removed_by_prefix():
    prefix = new_prefix()
    a = segment_name(prefix, "a")
    try:
        seg = Segment.create(a, 10)
        assert seg.size == 4096 and int(seg.tensor.sum()) == 0
        seg.tensor[0] = 9
        peer = Segment.attach(a)
        assert int(peer.tensor[0]) == 9                       # the same memory
        with pytest.raises(PyptoError, match="already exists"):
            Segment.create(a, 10)
        with pytest.raises(SegmentMissing, match="does not exist"):
            Segment.attach(segment_name(prefix, "b"))
    finally:
        removed = remove_segments(prefix)
    assert removed == [a] and list_segments(prefix) == []
    with pytest.raises(PyptoError, match="bad shared-memory prefix"):
        list_segments("")


def test_the_lock_excludes_another_mapping_in_the_same_process():
    prefix = new_prefix()
    try:
        a = Segment.create(segment_name(prefix, "x"), 8)
        b = Segment.attach(segment_name(prefix, "x"))   # e.g. another rank's communicator in the host form's threads
        entered = threading.Event()

        def take():
            with b.locked():
                entered.set()
        with a.locked():
            t = threading.Thread(target=take)
            t.start()
            t.join(0.2)
            assert not entered.is_set()
        t.join(2)
        assert entered.is_set()
    finally:
        remove_segments(prefix)


def test_backends_this_machine_lacks_fail_in_one_sentence():
    found = available_backends()
    assert found[:2] == ["shm", "gloo"]
    if "nccl" not in found:
        with pytest.raises(BackendUnavailableError) as e:
            create_communicator("nccl", 0, 1)
        assert isinstance(e.value, PlatformError)
        assert "nccl" in e.value.message and "use backend 'gloo' (CPU, any host) or 'shm'" in e.value.message
    if "hccl" not in found:
        with pytest.raises(BackendUnavailableError, match="needs torch_npu .* use backend 'gloo'"):
            create_communicator("hccl", 0, 1)
    with pytest.raises(BackendUnavailableError, match="unknown communicator backend 'mpi'"):
        create_communicator("mpi", 0, 1)


def test_a_world_needs_a_store_or_the_launcher_environment(monkeypatch):
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(PyptoError, match="rank is unknown: pass rank= or set RANK"):
        create_communicator("shm")
    with pytest.raises(PyptoError, match="needs a store: MASTER_ADDR/MASTER_PORT are not set"):
        create_communicator("shm", 0, 2)
