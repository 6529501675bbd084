"""Atomic adds (`pl.assemble(..., atomic=Add)`): atomic across threads, and kept then applied in block order."""
from __future__ import annotations

import threading

import torch

from pypto_rt.language import dtypes as D
from pypto_rt.language.enums import AtomicType
from pypto_rt.ops import accumulate, views
from pypto_rt.ops.value import TensorValue

ROUNDS = 100


def _add_in_step(target: TensorValue, tile: TensorValue, meet: threading.Barrier, errors: list):
    try:
        for _ in range(ROUNDS):
            meet.wait(timeout=10)   # both threads start each add together: their read-modify-writes overlap
            views.assemble(target, tile, [0, 0], atomic=AtomicType.Add)
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def test_atomic_adds_from_threads_running_at_once_lose_no_update():
    # torch's add_ runs outside the interpreter lock: without a lock around it, one thread's add overwrites the
    # other's (a 2M-element add takes ~1 ms, so two started together overlap)
    target = TensorValue(torch.zeros(1024, 2048), D.FP32)
    tile = TensorValue(torch.ones(1024, 2048), D.FP32)
    meet, errors = threading.Barrier(2), []
    threads = [threading.Thread(target=_add_in_step, args=(target, tile, meet, errors)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert torch.equal(target.data, torch.full((1024, 2048), 2.0 * ROUNDS))


def test_collected_adds_wait_for_apply_and_land_in_block_order():
    # in float32 the order of these adds decides the result: block order gives (1 + 1e8) - 1e8 = 0, reversed 1
    target = torch.zeros(1, 4)
    parts = [[], [], []]
    for block in (2, 1, 0):   # blocks finishing in reverse order
        with accumulate.collecting(parts[block]):
            views.assemble(TensorValue(target, D.FP32), TensorValue(torch.full((1, 4), (1.0, 1e8, -1e8)[block]),
                                                                    D.FP32), [0, 0], atomic=AtomicType.Add)
        assert torch.equal(target, torch.zeros(1, 4))   # nothing lands before the task's last block applies
    accumulate.apply(parts)
    assert torch.equal(target, torch.zeros(1, 4))


def test_a_collected_add_keeps_the_values_it_was_given():
    target, tile = torch.zeros(2), torch.ones(2)
    parts = []
    with accumulate.collecting(parts):
        accumulate.atomic_add_(target, tile)
    tile.fill_(5.0)   # the kernel reuses its tile after the add
    accumulate.apply([parts])
    assert torch.equal(target, torch.ones(2))
