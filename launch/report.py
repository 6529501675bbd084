"""What the launcher tells the user when a job does not pass: which rank failed first, its error, what became of
every other rank, and the merged cross-rank wait picture. Pure formatting over `RankResult`s; no processes.

First failure: the earliest failure *time*: the `time` in the rank's error file, else the moment the rank's
process ended (the launcher hears of it at once). Never the last (or first) rank reaped: a rank whose error is
written first may exit last. A rank whose error says a peer's abort, death or exit ended it (`peer_caused`)
is a root cause only when no other rank failed: the peer it waited on failed first, even when that peer died
without a record and the launcher timed its death a little late.
"""
from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass

from pypto_rt.launch import files

FAILED, KILLED, PASSED = "failed", "killed", "passed"


@dataclass(frozen=True)
class RankResult:
    """One rank after the job: exit status, the launcher's signal if any, and its error record if it wrote one."""
    rank: int
    local_rank: int
    pid: int
    returncode: int
    ended_at: float  # when the launcher saw it exit (wall clock)
    signalled: int | None = None  # the last signal the launcher sent it
    signalled_at: float | None = None
    record: dict | None = None  # its error file (see rank_main)
    log: str | None = None  # its stderr log, if any
    left_processes: bool = False
    stack: str | None = None  # its stacks (faulthandler's text) when the launcher asked before ending it
    stderr_tail: str = ""  # the end of its stderr

    @property
    def state(self) -> str:
        if self.returncode == 0:
            return PASSED
        if self.signalled_at is None:
            return FAILED
        own_error = self.record is not None and isinstance(self.record.get("time"), (int, float))
        return FAILED if own_error and self.record["time"] < self.signalled_at else KILLED

    @property
    def peer_caused(self) -> bool:
        return bool((self.record or {}).get("peer_caused"))

    @property
    def failed_at(self) -> float:
        t = (self.record or {}).get("time")
        return t if isinstance(t, (int, float)) else self.ended_at

    @property
    def message(self) -> str:
        if self.record and self.record.get("message"):
            return str(self.record["message"])
        if self.returncode < 0:
            text = f"rank {self.rank} was killed by {signal_name(-self.returncode)}"
        else:
            text = f"rank {self.rank} exited with code {self.returncode}"
        said = last_words(self.stderr_tail)
        return "\n".join([text + "; its stderr ended with:"] + ["  " + line for line in said]) if said else text


def read_record(path: str) -> dict | None:
    """A rank's error file, or None when it wrote none; a damaged file yields a record saying so."""
    try:
        record = json.loads(files.read_own(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return {"message": f"(its error file {path} is unreadable: {e})"}
    return record if isinstance(record, dict) else None


MAX_LAST_WORDS = 6
_NATIVE_TRACE = ("Exception raised from ", "frame #")


def last_words(tail: str) -> list[str]:
    """What a rank that left no error record last said on stderr: a C++ exception's `terminate called ...` and
    `what():` lines when there are some (gloo's "collective mismatch", say; not the native backtrace after them),
    else its last lines; at most MAX_LAST_WORDS lines."""
    lines = [line.rstrip() for line in tail.splitlines() if line.strip()]
    start = max((i for i, line in enumerate(lines) if line.startswith("terminate called ")), default=None)
    if start is None:
        return lines[-MAX_LAST_WORDS:]
    said = []
    for line in lines[start:]:
        if line.startswith(_NATIVE_TRACE):
            break
        said.append(line)
    return said[:MAX_LAST_WORDS]


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def first_failure(results: list[RankResult]) -> RankResult | None:
    failed = [r for r in results if r.state == FAILED]
    return min(failed, key=lambda r: (r.peer_caused, r.failed_at, r.ended_at, r.rank)) if failed else None


def summarize(results: list[RankResult], job_id: str, interrupted: int | None = None) -> str:
    """The one report of a job that failed or was interrupted."""
    first = first_failure(results)
    lines = ["=" * 20 + f" pypto-launch: job {job_id} " + "=" * 20]
    if interrupted is not None:
        lines.append(f"interrupted by {signal_name(interrupted)}: the launcher ended every rank")
    if first is not None:
        lines.append(f"rank {first.rank} failed first ({_status(first)}, at {_clock(first.failed_at)}):")
        lines.extend("    " + line for line in first.message.splitlines())
    others = [r for r in results if r is not first]
    if others:
        lines.append("other ranks:" if first is not None else "ranks:")
        lines.extend(f"  rank {r.rank}: {_fate(r, first)}" for r in sorted(others, key=lambda r: r.rank))
    waits = [r.record["wait"] for r in results if r.record and isinstance(r.record.get("wait"), dict)]
    if waits:
        lines.append("cross-rank waits (who waits for whom):")
        lines.extend("  " + line for line in merge_waits(waits).splitlines())
    lines.extend(_awaited_stacks(results, waits))
    logs = [r.log for r in sorted(results, key=lambda r: r is not first) if r.log and r.state == FAILED]
    if logs:
        lines.append(f"logs: {logs[0]}" + (f" (and {len(logs) - 1} more failed ranks' logs there)" if logs[1:] else ""))
    lines.append("=" * len(lines[0]))
    return "\n".join(lines)


def _status(r: RankResult) -> str:
    code = (r.record or {}).get("exit_code")
    if not isinstance(code, int) or code == r.returncode:
        return _exit_status(r.returncode)
    # it reported its error, then something ended it before it could exit (the launcher, while tearing down)
    how = f"the launcher's {signal_name(r.signalled)}" if r.signalled else _exit_status(r.returncode)
    return f"exit code {code}; {how} ended it while it was exiting"


def _exit_status(returncode: int) -> str:
    return f"killed by {signal_name(-returncode)}" if returncode < 0 else f"exit code {returncode}"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


def _fate(r: RankResult, first: RankResult | None) -> str:
    note = "; it left processes running, which the launcher ended" if r.left_processes else ""
    if r.state == PASSED:
        return "exited 0" + note
    if r.state == KILLED:
        how = signal_name(r.signalled) if r.signalled else "a signal"
        frames = main_thread_frames(r.stack)
        note = (f"; it was at {frames[0]}" if frames else "") + note
        if r.returncode < 0 and -r.returncode == r.signalled:
            return f"killed by the launcher ({how})" + note
        return f"ended by the launcher's {how} ({_exit_status(r.returncode)})" + note
    later = f" {r.failed_at - first.failed_at:.2f} s later" if first is not None else ""
    return f"failed{later} ({_status(r)}): {headline(r.message, (r.record or {}).get('where'))}" + note


MAX_FRAMES = 12


def _awaited_stacks(results: list[RankResult], waits: list[dict]) -> list[str]:
    """The stacks of ranks others waited on that the launcher had to end: where a hung rank hung."""
    awaited = {p for w in waits for p in (w.get("peers") or []) if isinstance(p, int)}
    lines = []
    for r in sorted(results, key=lambda r: r.rank):
        frames = main_thread_frames(r.stack) if r.rank in awaited and r.state == KILLED else []
        if frames:
            lines.append(f"where rank {r.rank}, which others waited on, was when ended (most recent call first):")
            lines.extend("    " + f for f in frames[:MAX_FRAMES])
            if len(frames) > MAX_FRAMES:
                lines.append(f"    ... {len(frames) - MAX_FRAMES} more frames")
    return lines


def main_thread_frames(dump: str | None) -> list[str]:
    """The frames (`File "f", line N in fn`, innermost first) of the last thread in a faulthandler dump: the
    main thread, which faulthandler lists last."""
    frames: list[str] = []
    for line in (dump or "").splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            frames = []
        elif line.startswith("  File "):
            frames.append(line.strip())
    return frames


def headline(message: str, where: str | None = None) -> str:
    """One line of an error message: a rendered error's `error:` line, else a traceback's last line."""
    lines = [line for line in message.splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    line = next((line for line in lines if line.startswith("error:")), lines[-1]).strip()
    return f"{line} (at {where})" if where else line


def merge_waits(waits: list[dict]) -> str:
    """The communicator layer's merged wait-for picture; one line per rank if that layer is missing or fails."""
    try:
        from pypto_rt.collective.waits import merge_reports
    except Exception:  # noqa: BLE001 - absent or broken: the plain listing still names every wait
        merge_reports = None
    if merge_reports is not None:
        try:
            return str(merge_reports(waits)).rstrip()
        except Exception as e:  # noqa: BLE001 - never lose the failure report to a broken merger
            return "\n".join([f"(merging the wait reports failed: {e!r})"] + [_wait_line(w) for w in waits])
    return "\n".join(_wait_line(w) for w in sorted(waits, key=lambda w: str(w.get("rank", ""))))


_WAIT_KEYS = ("rank", "op", "label", "window", "cell", "seen", "expected", "cmp", "peers", "waited_s")


def _wait_line(w: dict) -> str:
    if all(k in w for k in _WAIT_KEYS):
        return (f"rank {w['rank']}: {w['op']} {w['label']!r} waited {_secs(w['waited_s'])} on {w['window']}"
                f"[{w['cell']}] for {w['cmp']} {w['expected']} (saw {w['seen']}) from peers {w['peers']}")
    return "rank {}: {}".format(w.get("rank", "?"), ", ".join(f"{k}={v}" for k, v in w.items() if k != "rank"))


def _secs(value) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) else f"{value} s"
