"""`JobResult`: what one launched job came to, as data (the exit code the CLI returns, each rank's end, the root
cause the report names, the report's text), so that a caller in Python need not parse stderr.

Built from the launcher's `RankResult`s by `job_result`; the root cause is the rank the printed report says
"failed first" (`report.first_failure`).
"""
from __future__ import annotations

from dataclasses import dataclass

from pypto_rt.launch.report import FAILED, RankResult, headline


@dataclass(frozen=True)
class RankExit:
    """How one rank ended.

    Attributes:
        rank: its global rank.
        local_rank: its index on this host.
        exit_code: its exit status; None when a signal ended it (see `signal`).
        signal: the signal that ended it, or None when it exited.
        state: "passed" (exit 0), "failed" (its own error), or "killed" (the launcher ended it).
        root_cause: True for the one rank the report names as failing first.
        error: one line saying why it did not pass ("" when it passed).
        message: its whole error (traceback, or its last stderr lines; "" when it passed).
        log: its stderr log file with `log_dir`, else None.
    """
    rank: int
    local_rank: int
    exit_code: int | None
    signal: int | None
    state: str
    root_cause: bool
    error: str
    message: str
    log: str | None


@dataclass(frozen=True)
class JobResult:
    """One job's outcome.

    Attributes:
        exit_code: the launcher's exit code, the one `pypto-launch` returns: 0 every rank passed, 1 a rank failed
            (or could not start), 2 the job could not be set up, 128+N the launcher got signal N.
        job_id: the job's id (names its shared memory and its report).
        ranks: every rank of this host, by rank; empty when the job never started its ranks.
        interrupted_by: the signal (SIGINT, SIGTERM, SIGHUP) that ended the job, or None.
        report: what the launcher prints at the end (the failure summary, or a setup error); "" for a clean pass.
    """
    exit_code: int
    job_id: str
    ranks: tuple[RankExit, ...] = ()
    interrupted_by: int | None = None
    report: str = ""

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def root_cause(self) -> RankExit | None:
        """The rank that failed first (the report's "rank N failed first"), or None when none of this host did."""
        return next((r for r in self.ranks if r.root_cause), None)

    def check(self) -> JobResult:
        """This result when the job passed; else raises `JobFailed` carrying it (as `subprocess`'s `check=True`)."""
        if not self.passed:
            raise JobFailed(self)
        return self


class JobFailed(Exception):
    """A launched job that did not pass; `.result` is its `JobResult`, the message its report."""

    def __init__(self, result: JobResult):
        super().__init__(result.report or f"pypto-launch: job {result.job_id} ended with exit code "
                                          f"{result.exit_code}")
        self.result = result


def job_result(exit_code: int, job_id: str, ranks: list[RankResult], root: RankResult | None,
               interrupted_by: int | None = None, report: str = "") -> JobResult:
    """The `JobResult` of a job whose ranks ended as `ranks` (the launcher's own records of them); `root` is the
    one the report names as failing first (`report.first_failure`), or None."""
    return JobResult(exit_code=exit_code, job_id=job_id, interrupted_by=interrupted_by, report=report,
                     ranks=tuple(_rank_exit(r, r is root) for r in sorted(ranks, key=lambda r: r.rank)))


def _rank_exit(r: RankResult, root_cause: bool) -> RankExit:
    passed = r.returncode == 0
    where = (r.record or {}).get("where") if r.state == FAILED else None
    return RankExit(rank=r.rank, local_rank=r.local_rank,
                    exit_code=r.returncode if r.returncode >= 0 else None,
                    signal=-r.returncode if r.returncode < 0 else None, state=r.state, root_cause=root_cause,
                    error="" if passed else headline(r.message, where), message="" if passed else r.message,
                    log=r.log)
