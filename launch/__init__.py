"""pypto-launch: starts the ranks of a multi-rank program and reports failures; installed as pypto_rt.launch.

Modules, one job each: `cli` (flags and PYPTO_* variables -> `LaunchConfig`), `config` (that dataclass),
`contract` (the environment every rank gets), `job` (one job: store, ranks, report, cleanup), `job_store`
(the TCPStore node 0 hosts), `gateway` (authenticated store connections between hosts), `supervisor` (rank processes: start, watch, end), `output` (rank output to logs
and terminal), `signals` (Ctrl-C/SIGTERM to the launcher), `report` (first failure and the summary), `job_segments`
(the job's /dev/shm segments), `files` (the log folder's checks and link-proof opens), `rank_main` (the entry each
rank runs). Importing this package is cheap:
ranks import it, and must not pay for torch.
"""
from pypto_rt.launch.config import LaunchConfig

__all__ = ["LaunchConfig"]
