"""A job over several nodes (PYPTO_RANK_NODES, set by `pypto-launch --backend ray`): a shared-memory communicator
spanning nodes is refused before it makes a segment or touches the store, naming each node's ranks; one within a
node, or on a one-node job, is not."""
from __future__ import annotations

import pytest

from pypto_rt.collective import CommError, create_communicator, list_segments, nodes


@pytest.fixture
def two_nodes(monkeypatch):
    monkeypatch.setenv("PYPTO_RANK_NODES", "0,1,0,1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("MASTER_ADDR", raising=False)   # no store: the refusal must come before any rendezvous
    monkeypatch.setenv("PYPTO_SHM_PREFIX", "pypto-spantest.n0")


def test_a_job_wide_shm_communicator_over_two_nodes_is_refused_naming_the_ranks(two_nodes):
    with pytest.raises(CommError) as refused:
        create_communicator("shm", rank=2, world_size=4)
    message = str(refused.value)
    assert ("rank 2: shared-memory windows need their ranks on one node, but this job's 4 ranks span 2 nodes "
            "(node 0: ranks 0, 2; node 1: ranks 1, 3)") in message
    assert "use --comm gloo" in message and "create_node_communicator" in message
    assert list_segments("pypto-spantest.n0") == []


def test_node_ranks_are_the_ranks_of_the_callers_node(two_nodes):
    assert nodes.node_ranks(1) == [1, 3] and nodes.node_ranks(2) == [0, 2]
    assert nodes.span_problem(0, 2) is None   # a node-local communicator's world: not the job's


def test_one_node_or_no_layout_is_no_problem(monkeypatch):
    monkeypatch.delenv("PYPTO_RANK_NODES", raising=False)
    assert nodes.span_problem(0, 4) is None and nodes.rank_nodes() is None
    monkeypatch.setenv("PYPTO_RANK_NODES", "0,0,0")
    assert nodes.span_problem(1, 3) is None
