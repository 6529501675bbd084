"""Peer blocks: one local tensor whose block d *is* rank d's bytes [offset, offset + block) of a shm window, the
blocks mapped side by side (MAP_SHARED | MAP_FIXED into one reserved range), then a private tail.

What it is for: a program that stages, per destination rank d, the rows it will put into d's window at this rank's
block (MoE dispatch's send staging, the combine's sums: DeepEP's layout, one block per source in every receiver)
writes them straight into the destinations when its staging is such a mapping; the puts then find their source and
target the same bytes (`same_run`) and copy nothing. The program stays what it says (stage, then put, then
signal): on a communicator without mapped windows (torch.distributed) the staging is a plain tensor and the puts
copy. What the mapping adds is that the staging writes land in the peer at once, before the put: a program may
use it only where no peer reads that block between its previous call's last read and this call's signal, which
the caller states (kernels.moe: a rank writes a peer's blocks for call i + 1 only after that peer's combine rows of
call i arrived, sent after it read them).

A block must be whole pages at a page-aligned offset (`map_peer_blocks` returns None otherwise, and off Linux).
The mapping lives as long as any tensor view of it (torch.frombuffer keeps its buffer alive), then is unmapped;
the segments' files may be unlinked meanwhile (a mapping keeps its pages)."""
from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import weakref

import torch

from pypto_rt.collective.segments import path_of

_MAP_FIXED = 0x10   # Linux's value (the mmap module does not export it)
PAGE = mmap.PAGESIZE   # a mapping's offset and length: whole pages of this machine
_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
_FAILED = ctypes.c_void_p(-1).value

_lock = threading.Lock()
_live: dict[int, tuple[int, int, list[tuple[str, int]]]] = {}   # base -> (blocks' bytes, block bytes, [(segment
#                                                                   name, file offset) of each block])


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _map(libc, address, nbytes: int, prot: int, flags: int, fd: int, offset: int) -> int:
    got = libc.mmap(address, nbytes, prot, flags, fd, offset)
    if got in (None, _FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {nbytes} bytes: {os.strerror(err)}")
    return got


def _unmap(libc, base: int, total: int) -> None:
    with _lock:
        _live.pop(base, None)
    libc.munmap(base, total)


def map_peer_blocks(window, byte_offset: int, block_bytes: int, tail_bytes: int) -> torch.Tensor | None:
    """A uint8 tensor of world * block_bytes + tail_bytes: block d is rank d's bytes [byte_offset, byte_offset +
    block_bytes) of `window` (a shm window: one segment per rank), the tail private zeros. None where the window
    has no segments to map (another communicator) or the block is not whole pages at a page-aligned offset."""
    segments = getattr(window, "segments", None)
    if (not sys.platform.startswith("linux") or not segments or block_bytes <= 0 or block_bytes % PAGE
            or byte_offset % PAGE or byte_offset + block_bytes > min(s.size for s in segments)):
        return None
    libc, blocks = _libc(), len(segments) * block_bytes
    total = blocks + max(PAGE, -(-tail_bytes // PAGE) * PAGE)
    base = _map(libc, None, total, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)   # the range, reserved
    try:
        for d, segment in enumerate(segments):
            fd = os.open(path_of(segment.name), os.O_RDWR)
            try:
                _map(libc, base + d * block_bytes, block_bytes, _PROT_RW, mmap.MAP_SHARED | _MAP_FIXED, fd,
                     byte_offset)
            finally:
                os.close(fd)
        _map(libc, base + blocks, total - blocks, _PROT_RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
    except BaseException:
        libc.munmap(base, total)
        raise
    holder = (ctypes.c_uint8 * total).from_address(base)
    with _lock:
        _live[base] = (blocks, block_bytes, [(s.name, byte_offset) for s in segments])
    weakref.finalize(holder, _unmap, libc, base, total)
    return torch.frombuffer(holder, dtype=torch.uint8)[:blocks + tail_bytes]


def same_run(source_address: int, segment_name: str, file_offset: int) -> int:
    """How many bytes from `source_address` on are the very bytes of segment `segment_name` from `file_offset` on
    (the rest of a peer block that maps them), 0 where none are."""
    with _lock:
        for base, (blocks, block, files) in _live.items():
            if base <= source_address < base + blocks:
                d, within = divmod(source_address - base, block)
                name, offset = files[d]
                return block - within if name == segment_name and offset + within == file_offset else 0
    return 0
