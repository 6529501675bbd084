"""Peer blocks (collective.peer_blocks): one local tensor whose block d is rank d's bytes of a shm window."""
from __future__ import annotations

import gc

from pypto_rt.collective import peer_blocks
from tests.collective.harness import run_ranks

PAGE = peer_blocks.PAGE


def blocks_rank(ctx):
    w, me = ctx.world_size, ctx.rank
    block = 2 * PAGE
    with ctx.comm() as comm:
        window = comm.alloc_window(w * block, "rows")
        staging = peer_blocks.map_peer_blocks(window, me * block, block, 100)
        assert staging is not None and staging.numel() == w * block + 100
        for d in range(w):   # block d: this rank's block of rank d's window
            staging[d * block:(d + 1) * block] = 10 * me + d
        staging[w * block:] = 255   # the tail is private: no rank's window holds it
        comm.barrier()
        mine = window.local
        got = [int(mine[s * block:(s + 1) * block].unique()[0]) for s in range(w)]   # block s: rank s wrote it
        assert got == [10 * s + me for s in range(w)], got
        assert int(mine.sum()) == sum((10 * s + me) * block for s in range(w))   # nothing of the tail landed

        # a peer's bytes in its mapping here and the same bytes in the staging, from any row of the block on
        peer = (me + 1) % w
        target = window.peer(peer)[me * block:].data_ptr()
        source = staging[peer * block:].data_ptr()
        assert window.same_run(peer, target, source) == block
        assert window.same_run(peer, target + 512, source + 512) == block - 512
        assert window.same_run(peer, target + 512, source) == 0   # other bytes of the block
        assert window.same_run(me, window.local[me * block:].data_ptr(), source) == (block if w == 1 else 0)
        assert window.same_run(peer, target, window.local.data_ptr()) == 0   # not a staging

        # only whole pages at a page-aligned offset map; the mapping goes with its last view
        assert peer_blocks.map_peer_blocks(window, 100, block, 0) is None
        assert peer_blocks.map_peer_blocks(window, 0, block + 100, 0) is None
        assert peer_blocks.map_peer_blocks(window, w * block, block, 0) is None   # past the window
        view = staging[:8]
        del staging
        gc.collect()
        assert window.same_run(peer, target, source) == block   # a view keeps it mapped
        del view
        gc.collect()
        assert window.same_run(peer, target, source) == 0
        comm.barrier()
    return "ok"


def test_block_d_is_rank_ds_window_and_the_mapping_goes_with_its_last_view():
    assert run_ranks(blocks_rank, 3).ok() == {0: "ok", 1: "ok", 2: "ok"}


def test_a_window_without_segments_maps_nothing():
    """The torch.distributed communicator's windows (or any without per-rank segments): a plain staging instead."""
    class Plain:
        nbytes = 4 * PAGE
    assert peer_blocks.map_peer_blocks(Plain(), 0, PAGE, 0) is None
    assert peer_blocks.map_peer_blocks(None, 0, PAGE, 0) is None
