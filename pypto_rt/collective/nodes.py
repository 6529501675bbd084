"""Which node each rank runs on, when a job spans nodes (`pypto-launch --backend ray`: PYPTO_RANK_NODES).

Shared-memory windows need their ranks on one node: `span_problem` says why a job-wide shm communicator cannot
be built (checked before any segment is made, so the job fails at once rather than waiting for peers that can
never map it), and `node_ranks` gives the ranks a node-local communicator spans.
"""
from __future__ import annotations

from pypto_rt import knobs


def rank_nodes() -> list[int] | None:
    """Each rank's node index, by rank; None when the launcher did not say (one node)."""
    raw = knobs.RANK_NODES.raw().strip()
    if not raw:
        return None
    try:
        return [int(part) for part in raw.split(",")]
    except ValueError:
        return None


def node_ranks(rank: int) -> list[int]:
    """The global ranks on `rank`'s node, in order (every rank of the job when nodes are unknown)."""
    nodes = rank_nodes()
    world = knobs.get_int(knobs.WORLD_SIZE) or 1
    if nodes is None:
        return list(range(world))
    return [r for r, node in enumerate(nodes) if node == nodes[rank]]


def span_problem(rank: int, world_size: int) -> str | None:
    """Why a job-wide shared-memory communicator (rank `rank` of `world_size`) cannot work here, or None."""
    nodes = rank_nodes()
    if nodes is None or len(nodes) != world_size or len(set(nodes)) == 1:
        return None
    by_node: dict[int, list[int]] = {}
    for r, node in enumerate(nodes):
        by_node.setdefault(node, []).append(r)
    where = "; ".join(f"node {n}: ranks {', '.join(map(str, rs))}" for n, rs in sorted(by_node.items()))
    return (f"rank {rank}: shared-memory windows need their ranks on one node, but this job's {world_size} ranks "
            f"span {len(by_node)} nodes ({where})")


SPAN_HINT = ("use --comm gloo (or nccl/hccl) for collectives across nodes, and keep windows within a node "
             "(pypto_rt.collective.create_node_communicator() over the node's ranks); or place every rank on one "
             "node (--placement pack on a node that holds every bundle)")
