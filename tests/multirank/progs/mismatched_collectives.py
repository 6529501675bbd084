"""Ranks call different collectives from plain Python: rank 0 all-reduces a [4] tensor, rank 1 an [8] one, and
rank 2 (if any) broadcasts. With PYPTO_COMM_CHECK=1 this is an error naming the ranks and their calls."""
import torch

import pypto.language.distributed as pld

rank = pld.rank()
if rank == 0:
    pld.allreduce(torch.ones(4))
elif rank == 1:
    pld.allreduce(torch.ones(8))
else:
    pld.broadcast(torch.ones(4), root=0)
print(f"rank {rank}: no error")
