"""`from pypto.ir.distributed_compiled_program import DistributedConfig` works as in real PyPTO."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DistributedConfig"]


@dataclass
class DistributedConfig:
    """Which devices a host program spans (`device_ids`) and how ranks talk; read by the multi-rank runtime."""
    device_ids: list[int] = field(default_factory=lambda: [0])
    rootinfo_path: str | None = None
    comm_backend: str | None = None
    extra: dict = field(default_factory=dict)

    def __init__(self, device_ids=None, **kwargs):
        self.device_ids = list(device_ids) if device_ids is not None else [0]
        self.rootinfo_path = kwargs.pop("rootinfo_path", None)
        self.comm_backend = kwargs.pop("comm_backend", None)
        self.extra = kwargs

    @property
    def world_size(self) -> int:
        return len(self.device_ids)
