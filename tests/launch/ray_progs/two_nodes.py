"""Ranks on two nodes (pypto-launch --backend ray, placed 2 + 2): node-local shared-memory windows and
collectives across nodes through gloo (prints PASS / raises per rank).

Checks that a job-wide shared-memory communicator (what the first window allocation makes) is refused naming
each node's ranks, the layout the launcher gives (PYPTO_RANK_NODES, LOCAL_RANK / LOCAL_WORLD_SIZE counting the node's ranks, a
shared-memory prefix per node), that each node's window lives in that node's namespace and is seen by its node's
ranks only, and an allreduce and allgather over all four ranks.
"""
import os

import torch

from pypto_rt.collective import CommError, create_communicator, create_node_communicator, list_segments

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
nodes = [int(n) for n in os.environ["PYPTO_RANK_NODES"].split(",")]
node = nodes[rank]
peers = [r for r in range(world) if nodes[r] == node]
assert (int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])) == (peers.index(rank), len(peers))
prefix = os.environ["PYPTO_SHM_PREFIX"]
assert prefix.endswith(f".n{node}"), prefix

try:
    create_communicator("shm")
    raise AssertionError("a shared-memory communicator spanning two nodes was built")
except CommError as e:
    by_node = "; ".join(f"node {n}: ranks {', '.join(str(r) for r in range(world) if nodes[r] == n)}" for n in (0, 1))
    assert f"shared-memory windows need their ranks on one node, but this job's 4 ranks span 2 nodes ({by_node})" \
        in str(e) and "use --comm gloo" in str(e), str(e)

across = create_communicator("gloo")
local = create_node_communicator()
assert (local.rank, local.world_size) == (peers.index(rank), len(peers))
win = local.alloc_window(64)
for p in range(local.world_size):   # every rank of the node adds rank + 1 to each node peer's cell 0
    local.notify(win, peer=p, byte_offset=0, value=rank + 1, op="atomic_add")
local.wait(win, 0, expected=sum(r + 1 for r in peers), cmp="ge", label="node_sum")
node_sum = int(local.remote_load(win, local.rank, 0, 4, dtype=torch.int32)[0])
assert node_sum == sum(r + 1 for r in peers), node_sum
assert any(name.startswith(prefix + "+") for name in list_segments(prefix)), "the window is not in the node's /dev/shm"

total = torch.tensor([float(node_sum)])
across.allreduce(total, "sum")   # each node's sum counted once per rank of that node
expected = sum(sum(r + 1 for r in range(world) if nodes[r] == n) * nodes.count(n) for n in set(nodes))
assert total.item() == expected, (total.item(), expected)
gathered = torch.zeros(world, 1)
across.allgather(gathered, torch.tensor([float(node)]))
assert gathered.flatten().tolist() == [float(n) for n in nodes], gathered
local.close()
across.close()
print(f"rank {rank}/{world} node {node} local {peers.index(rank)}/{len(peers)}: PASS node_sum={node_sum} "
      f"total={total.item():g}")
