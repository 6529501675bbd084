"""The tensor map alone: edge kinds, one edge per producer, finished tasks dropping out, host-wait lookups."""
from __future__ import annotations

import torch

from pypto_rt.aicpu import TaskAccess, Task, TensorMap, region_of


def _task(i: int, accesses) -> Task:
    return Task(i, f"t{i}", None, 1, tuple(accesses), None, 0)


def _add(tmap: TensorMap, i: int, *accesses: TaskAccess) -> tuple[Task, list]:
    task = _task(i, accesses)
    edges = tmap.edges_for(accesses)
    tmap.insert(task, accesses)
    return task, edges


def test_raw_waw_war_kinds():
    x = torch.zeros(8, 16)
    rows = region_of(x, (0, None), (4, None))
    tmap = TensorMap()
    writer, _ = _add(tmap, 0, TaskAccess(rows, "w"))
    reader, edges = _add(tmap, 1, TaskAccess(region_of(x, (2, None), (1, None)), "r"))
    assert edges == [(writer, "RAW")]
    _, edges = _add(tmap, 2, TaskAccess(region_of(x, (2, 5), (1, 1)), "w"))
    assert dict(edges) == {writer: "WAW", reader: "WAR"}


def test_readers_do_not_order_readers_and_disjoint_tiles_do_not_order():
    x = torch.zeros(8, 16)
    tmap = TensorMap()
    _add(tmap, 0, TaskAccess(region_of(x, (0, 0), (8, 8)), "r"))
    _, edges = _add(tmap, 1, TaskAccess(region_of(x, (0, 0), (8, 8)), "r"))
    assert edges == []
    _, edges = _add(tmap, 2, TaskAccess(region_of(x, (0, 8), (8, 8)), "w"))
    assert edges == []


def test_one_edge_per_producer_strongest_kind():
    x = torch.zeros(8, 16)
    tmap = TensorMap()
    inout, _ = _add(tmap, 0, TaskAccess(region_of(x, (0, None), (2, None)), "rw"),
                    TaskAccess(region_of(x, (4, None), (2, None)), "r"))
    _, edges = _add(tmap, 1, TaskAccess(region_of(x, (4, None), (1, None)), "w"),
                    TaskAccess(region_of(x, (1, None), (1, None)), "rw"))
    assert edges == [(inout, "RAW")]


def test_finished_tasks_stop_producing_edges_and_retire_drops_entries():
    x = torch.zeros(8, 16)
    whole = TaskAccess(region_of(x), "w")
    tmap = TensorMap()
    first, _ = _add(tmap, 0, whole)
    second, edges = _add(tmap, 1, whole)
    assert edges == [(first, "WAW")]
    first.state = "done"
    assert tmap.edges_for([whole]) == [(second, "WAW")]
    tmap.retire(second)
    assert tmap.edges_for([whole]) == []


def test_in_flight_for_host_reads_and_writes():
    x = torch.zeros(8, 16)
    tmap = TensorMap()
    writer, _ = _add(tmap, 0, TaskAccess(region_of(x, (0, None), (4, None)), "w"))
    reader, _ = _add(tmap, 1, TaskAccess(region_of(x, (4, None), (4, None)), "r"))
    assert tmap.in_flight(region_of(x), for_write=False) == [writer]
    assert set(tmap.in_flight(region_of(x), for_write=True)) == {writer, reader}
    assert tmap.in_flight(region_of(torch.zeros(3)), for_write=True) == []


def test_many_in_flight_tiles_stay_exact():
    x = torch.zeros(300, 4)
    tmap = TensorMap()
    tasks = [_add(tmap, i, TaskAccess(region_of(x, (i, None), (1, None)), "w"))[0] for i in range(300)]
    for t in tasks[::2]:
        t.state = "done"
    _, edges = _add(tmap, 300, TaskAccess(region_of(x, (100, None), (4, None)), "r"))
    assert sorted(t.id for t, _ in edges) == [101, 103]
