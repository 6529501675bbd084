"""pld.rank() / pld.world_size() in plain Python of a launched rank are RANK / WORLD_SIZE."""
import os

import pypto.language.distributed as pld

assert os.environ["PYPTO_LAUNCHED"] == "1"
assert (pld.rank(), pld.world_size()) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])), (
    pld.rank(), pld.world_size(), os.environ["RANK"], os.environ["WORLD_SIZE"])
print(f"rank {pld.rank()} of {pld.world_size()}")
