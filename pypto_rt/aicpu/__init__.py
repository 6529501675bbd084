"""pypto_rt.aicpu: the task-graph engine under the compiled runtime.

The orchestrator (host thread) submits tasks with their tensor accesses; the engine derives RAW/WAW/WAR edges from
byte regions, runs ready task blocks on a pool of worker threads (one per runtime: `EngineResources`), bounds
in-flight tasks with a scoped ring, and turns kernel failures, stalls and ring overflows into PyptoErrors on the
host. Imports only pypto_rt.errors, pypto_rt.config and pypto_rt.run_stats from pypto_rt.
"""
from .engine import Engine
from .failures import RingOverflowError, StallError, TaskFailedError, TaskPoisoned
from .regions import MemoryRegion, overlaps, region_of
from .resources import EngineResources
from .task import Task
from .tensormap import TaskAccess, TensorMap

__all__ = ["Engine", "EngineResources", "MemoryRegion", "RingOverflowError", "StallError", "Task", "TaskAccess",
           "TaskFailedError", "TaskPoisoned", "TensorMap", "overlaps", "region_of"]
