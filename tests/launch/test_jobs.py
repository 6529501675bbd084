"""pypto-launch end to end: real rank processes, the launcher run in this process (`cli.main`)."""
from __future__ import annotations

import json
import os
import uuid

import pytest

from tests.launch.conftest import pid_gone

RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYPTO_LAUNCHED",
            "PYPTO_COMM", "PYPTO_JOB_ID", "PYPTO_SHM_PREFIX", "PYPTO_ERROR_FILE", "PYPTO_START_TIME",
            "PYPTO_TIMEOUT_S", "TORCHELASTIC_USE_AGENT_STORE")

# each rank writes its contract variables to OUT/rank<N>.json
DUMP_ENV = f"""
    import json, os, sys
    names = {RANK_ENV!r}
    env = {{k: os.environ.get(k) for k in names}}
    env["argv"] = sys.argv[1:]
    env["torch_loaded"] = "torch" in sys.modules
    with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".json"), "w") as f:
        json.dump(env, f)
"""


def _dumps(folder) -> dict[int, dict]:
    return {int(p.name[4:-5]): json.loads(p.read_text()) for p in folder.glob("rank*.json")}


@pytest.mark.timeout(90)
def test_four_ranks_pass_with_torchrun_env_and_a_store_they_can_join(tmp_path, program, launch):
    prog = program(DUMP_ENV + """
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=30))
    store.set(f"hello/{rank}", str(rank * 10))
    assert [int(store.get(f"hello/{r}")) for r in range(world)] == [r * 10 for r in range(world)]
    # torch's own env:// rendezvous joins the launcher's store as a client (TORCHELASTIC_USE_AGENT_STORE)
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=30))
    t = torch.ones(1) * rank
    dist.all_reduce(t)
    assert t.item() == sum(range(world)), t
    dist.destroy_process_group()
    """)
    out = tmp_path / "out"
    out.mkdir()
    job = launch("--nproc", "4", prog, str(out), "extra")
    assert job.rc == 0, job.err
    dumps = _dumps(out)
    assert sorted(dumps) == [0, 1, 2, 3]
    ports = {d["MASTER_PORT"] for d in dumps.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, d in dumps.items():
        assert (d["RANK"], d["LOCAL_RANK"], d["WORLD_SIZE"], d["LOCAL_WORLD_SIZE"]) == (str(rank), str(rank), "4", "4")
        assert (d["MASTER_ADDR"], d["PYPTO_LAUNCHED"], d["PYPTO_COMM"]) == ("127.0.0.1", "1", "shm")
        assert d["PYPTO_SHM_PREFIX"] == "pypto-" + d["PYPTO_JOB_ID"]
        assert d["PYPTO_ERROR_FILE"].endswith(f"rank{rank}.error.json")
        assert d["PYPTO_TIMEOUT_S"] is None and d["PYPTO_START_TIME"] is None   # never read, so not set
        assert d["argv"] == [str(out), "extra"] and not d["torch_loaded"]
    assert len({d["PYPTO_JOB_ID"] for d in dumps.values()}) == 1


@pytest.mark.timeout(60)
def test_a_rank_raising_at_start_ends_the_job_naming_rank_error_and_line(program, launch):
    prog = program("""
    import os, time
    if os.environ["RANK"] == "1":
        raise ValueError("boom from rank 1")
    time.sleep(120)
    """)
    job = launch("--nproc", "4", prog)
    assert job.rc == 1
    assert job.seconds < 30
    assert "rank 1 failed first (exit code 1" in job.err
    assert f'File "{prog}", line 3' in job.err and "ValueError: boom from rank 1" in job.err
    for rank in (0, 2, 3):
        assert f"rank {rank}: killed by the launcher (SIGTERM)" in job.err
    assert "rank_main" not in job.err and "runpy" not in job.err


@pytest.mark.timeout(60)
def test_first_failure_is_the_earliest_error_not_the_first_rank_to_exit(program, launch):
    # rank 2 fails first but lingers on exit; rank 0 fails after seeing rank 2's error file, and exits first
    prog = program("""
    import atexit, os, time
    rank = int(os.environ["RANK"])
    if rank == 2:
        atexit.register(time.sleep, 20)
        raise RuntimeError("rank 2 broke first")
    if rank == 0:
        theirs = os.path.join(os.path.dirname(os.environ["PYPTO_ERROR_FILE"]), "rank2.error.json")
        while not os.path.exists(theirs):
            time.sleep(0.02)
        raise RuntimeError("rank 0 broke later")
    time.sleep(120)
    """)
    job = launch("--nproc", "4", prog)
    assert job.rc == 1
    assert "rank 2 failed first (exit code 1; the launcher's SIGTERM ended it while it was exiting" in job.err
    assert "RuntimeError: rank 2 broke first" in job.err
    assert "rank 0: failed" in job.err and "later (exit code 1): RuntimeError: rank 0 broke later" in job.err
    assert "rank 1: killed by the launcher (SIGTERM)" in job.err


@pytest.mark.timeout(60)
def test_system_exit_1_is_a_failure_with_an_error_file(tmp_path, program, launch):
    # rank 1 fails only once rank 0 has exited 0 (else the launcher may end rank 0 while it is exiting)
    prog = program("""
    import os, sys, time
    ok = os.environ["RANK"] != "1"
    print("rank", os.environ["RANK"], "PASS" if ok else "FAIL")
    done = os.path.join(sys.argv[1], "rank0.done")
    if ok:
        open(done, "w").close()
    else:
        while not os.path.exists(done):
            time.sleep(0.01)
        time.sleep(1.0)
    raise SystemExit(0 if ok else 1)
    """)
    logs = tmp_path / "logs"
    job = launch("--nproc", "2", "--log-dir", str(logs), prog, str(tmp_path))
    assert job.rc == 1
    assert "rank 1 failed first (exit code 1" in job.err and "rank 1 exited with code 1" in job.err
    assert "rank 0: exited 0" in job.err
    assert f"logs: {logs / 'rank1.stderr.log'}" in job.err
    record = json.loads((logs / "rank1.error.json").read_text())
    assert set(record) == {"rank", "local_rank", "pid", "time", "exit_code", "error_type", "message", "where", "wait",
                           "peer_caused"}
    assert record["peer_caused"] is False
    assert (record["rank"], record["local_rank"], record["exit_code"]) == (1, 1, 1)
    assert (record["error_type"], record["wait"]) == ("SystemExit", None)
    assert not (logs / "rank0.error.json").exists()
    assert (logs / "rank1.stdout.log").read_text() == "rank 1 FAIL\n"


@pytest.mark.timeout(60)
def test_a_rank_killed_by_a_signal_is_reported_with_its_name(program, launch):
    prog = program("""
    import os, signal, time
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
    """)
    job = launch("--nproc", "2", prog)
    assert job.rc == 1
    assert "rank 1 failed first (killed by SIGKILL" in job.err and "rank 1 was killed by SIGKILL" in job.err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
def test_the_jobs_shared_memory_is_removed_when_it_ends(program, launch, fail):
    job_id = f"test-{uuid.uuid4().hex[:10]}"
    bystander = f"/dev/shm/pypto-other-{job_id}"
    open(bystander, "w").close()
    prog = program(f"""
    import os
    with open("/dev/shm/" + os.environ["PYPTO_SHM_PREFIX"] + "+x" + os.environ["RANK"], "w") as f:
        f.write("segment")
    if {fail} and os.environ["RANK"] == "1":
        raise RuntimeError("failing after creating a segment")
    """)
    try:
        job = launch("--nproc", "2", "--job-id", job_id, prog)
        assert job.rc == (1 if fail else 0), job.err
        assert [n for n in os.listdir("/dev/shm") if n.startswith(f"pypto-{job_id}")] == []
        assert os.path.exists(bystander)
    finally:
        os.unlink(bystander)


@pytest.mark.timeout(60)
def test_env_variables_set_flags_and_flags_win(tmp_path, program, launch, monkeypatch):
    prog = program(DUMP_ENV)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("PYPTO_NPROC", "3")
    monkeypatch.setenv("PYPTO_COMM", "gloo")
    monkeypatch.setenv("PYPTO_TIMEOUT_S", "7")
    monkeypatch.setenv("PYPTO_JOB_ID", "envjob")
    job = launch("--nproc", "2", prog, str(out))
    assert job.rc == 0, job.err
    dumps = _dumps(out)
    assert sorted(dumps) == [0, 1]
    assert {(d["PYPTO_COMM"], d["PYPTO_TIMEOUT_S"], d["PYPTO_JOB_ID"]) for d in dumps.values()} == {
        ("gloo", "7.0", "envjob")}
    monkeypatch.delenv("PYPTO_NPROC")
    for f in out.iterdir():
        f.unlink()
    assert launch(prog, str(out)).rc == 0
    assert sorted(_dumps(out)) == [0]


@pytest.mark.timeout(60)
def test_output_goes_to_log_files_and_with_tee_to_the_terminal_prefixed(tmp_path, program, launch):
    prog = program("""
    import os, sys
    print("out of", os.environ["RANK"])
    print("err of", os.environ["RANK"], file=sys.stderr)
    sys.stdout.write("no newline")
    """)
    plain = launch("--nproc", "2", prog)
    assert plain.rc == 0
    assert {"[rank 0] out of 0", "[rank 1] out of 1", "[rank 0] no newline"} <= set(plain.out.splitlines())
    assert {"[rank 0] err of 0", "[rank 1] err of 1"} <= set(plain.err.splitlines())
    logs = tmp_path / "logs"
    quiet = launch("--nproc", "2", "--log-dir", str(logs), prog)
    assert quiet.rc == 0 and "[rank" not in quiet.out + quiet.err
    assert (logs / "rank1.stdout.log").read_text() == "out of 1\nno newline"
    assert (logs / "rank1.stderr.log").read_text() == "err of 1\n"
    tee = launch("--nproc", "2", "--log-dir", str(logs), "--tee", prog)
    assert tee.rc == 0 and "[rank 1] out of 1" in tee.out and "[rank 0] err of 0" in tee.err
    assert (logs / "rank0.stdout.log").read_text() == "out of 0\nno newline"


@pytest.mark.timeout(60)
def test_wait_reports_of_failed_ranks_are_merged_into_one_picture(program, launch):
    # rank 1 gives up 0.3 s after rank 0: the launcher lets it report (settle) before ending it
    prog = program("""
    import os, time
    rank = int(os.environ["RANK"])

    class StallError(Exception):
        pass

    class TaskFailed(Exception):
        def __init__(self, error):
            super().__init__(f"task failed: {error}")
            self.error = error

    time.sleep(0.3 * rank)
    stall = StallError(f"rank {rank} stalled")
    stall.wait = {"rank": rank, "op": "wait", "label": "allgather", "window": "signal", "cell": [1 - rank, 0],
                  "seen": 0, "expected": 1, "cmp": "Ge", "peers": [1 - rank], "waited_s": 5.0}
    raise TaskFailed(stall)
    """)
    job = launch("--nproc", "2", prog)
    assert job.rc == 1
    assert "rank 0 failed first" in job.err and "TaskFailed: task failed: rank 0 stalled" in job.err
    assert "cross-rank waits" in job.err
    assert "rank 1: failed" in job.err
    picture = job.err.split("cross-rank waits", 1)[1]
    assert "rank 0" in picture and "rank 1" in picture and "allgather" in picture


@pytest.mark.timeout(60)
def test_module_form_runs_a_module_as_main(tmp_path, program, launch, monkeypatch):
    program("""
    import os, sys
    print("module rank", os.environ["RANK"], sys.argv[1:], __name__)
    """, name="rankmod.py")
    monkeypatch.chdir(tmp_path)
    job = launch("--nproc", "1", "-m", "rankmod", "x")
    assert job.rc == 0, job.err
    assert "[rank 0] module rank 0 ['x'] __main__" in job.out


@pytest.mark.timeout(60)
def test_processes_a_passing_rank_left_behind_are_ended(tmp_path, program, launch):
    pid_file = tmp_path / "child.pid"
    prog = program(f"""
    import subprocess
    child = subprocess.Popen(["sleep", "120"])
    open({str(pid_file)!r}, "w").write(str(child.pid))
    """)
    job = launch("--nproc", "1", prog)
    assert job.rc == 0, job.err
    assert "rank(s) 0 exited 0 but left processes running; the launcher ended them" in job.err
    assert pid_gone(int(pid_file.read_text()))


# rank 2 ends without an error record mid-run; the others notice within 50 ms, as the shm communicator's watch
# does, and fail with the communicator's PeerAbortedError (the launcher knows it by name: no torch needed here)
SILENT_DEATH = """
    import os, signal, sys, time
    rank, folder, how = int(os.environ["RANK"]), sys.argv[1], sys.argv[2]

    class PeerAbortedError(Exception):
        pass

    if rank == 2:
        with open(os.path.join(folder, "pid2.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(folder, "pid2.tmp"), os.path.join(folder, "pid2"))
        time.sleep(0.3)
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    while not os.path.exists(os.path.join(folder, "pid2")):
        time.sleep(0.01)
    pid = open(os.path.join(folder, "pid2")).read()

    def gone():
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
        except FileNotFoundError:
            return True

    while not gone():
        time.sleep(0.05)
    raise PeerAbortedError(f"rank 2 died (process {pid} exited without closing its communicator)")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how, status", [("exit", "exit code 3"), ("kill", "killed by SIGKILL")])
def test_a_rank_dying_without_a_record_is_the_root_cause_not_the_ranks_that_noticed(tmp_path, program, launch,
                                                                                    how, status):
    prog = program(SILENT_DEATH)
    for attempt in range(5):
        folder = tmp_path / f"run{attempt}"
        folder.mkdir()
        job = launch("--nproc", "4", prog, str(folder), how)
        assert job.rc == 1
        headline = next(line for line in job.err.splitlines() if "failed first" in line)
        assert headline.startswith(f"rank 2 failed first ({status}"), (attempt, job.err)


@pytest.mark.timeout(60)
def test_the_report_shows_where_a_rank_others_waited_on_was_stuck(tmp_path, program, launch):
    prog = program("""
    import os, sys, time
    rank = int(os.environ["RANK"])

    class CommTimeoutError(Exception):
        pass

    def stuck_here():
        time.sleep(60)

    if rank == 1:
        open(sys.argv[1], "w").close()
        stuck_here()
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    time.sleep(0.5)
    error = CommTimeoutError("rank 0 waited 1 s for rank 1")
    error.wait = {"rank": 0, "op": "wait", "label": "allgather", "window": "signal", "cell": [1, 0], "seen": 0,
                  "expected": 1, "cmp": "Ge", "peers": [1], "waited_s": 1.0}
    raise error
    """)
    job = launch("--nproc", "2", prog, str(tmp_path / "rank1.stuck"))
    assert job.rc == 1 and "rank 0 failed first" in job.err
    stuck_line, sleep_line = f'File "{prog}", line 8 in stuck_here', f'File "{prog}", line 12 in <module>'
    assert f"rank 1: killed by the launcher (SIGTERM); it was at {stuck_line}" in job.err
    where = job.err.split("where rank 1, which others waited on, was when ended (most recent call first):", 1)[1]
    assert where.splitlines()[1:3] == ["    " + stuck_line, "    " + sleep_line]


def _summary(err: str) -> str:
    """The launcher's report alone (rank output echoed to the terminal comes before it)."""
    return err[err.index("==================== pypto-launch: job"):]


@pytest.mark.timeout(120)
def test_a_gloo_collective_mismatch_names_the_aborting_rank_and_quotes_gloo(tmp_path, program, launch):
    # gloo aborts rank 0 inside the allreduce (EnforceNotMet: SIGABRT, no error record); rank 1 then sees its
    # connection reset: the report must blame rank 0 and say what gloo said
    prog = program("""
    import os, torch
    from pypto_rt.collective import process
    rank = int(os.environ["RANK"])
    process.communicator("test").allreduce(torch.ones(4 if rank == 0 else 8))
    """)
    job = launch("--nproc", "2", "--comm", "gloo", "--timeout-s", "30", "--log-dir", str(tmp_path / "logs"), prog)
    assert job.rc == 1 and job.seconds < 60
    report = _summary(job.err)
    assert "rank 0 failed first (killed by SIGABRT" in report, report
    quoted = report.split("rank 0 was killed by SIGABRT; its stderr ended with:", 1)[1]
    assert "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in quoted
    assert "collective mismatch" in quoted and "frame #" not in quoted
    assert "rank 1: failed" in report and "a peer left the job" in report


@pytest.mark.timeout(60)
def test_a_rank_aborting_without_a_record_has_its_last_stderr_lines_in_the_report(program, launch):
    prog = program("""
    import os, sys, time
    if os.environ["RANK"] == "1":
        print("early noise", file=sys.stderr)
        sys.stderr.write("terminate called after throwing an instance of 'std::runtime_error'\\n"
                         "  what():  the native layer gave up\\n"
                         "Exception raised from somewhere (most recent call first):\\nframe #0: 0x1 in libx.so\\n")
        sys.stderr.flush()
        os.abort()
    time.sleep(60)
    """)
    job = launch("--nproc", "2", prog)
    assert job.rc == 1
    report = _summary(job.err)
    assert "rank 1 failed first (killed by SIGABRT" in report
    lines = report.split("its stderr ended with:\n", 1)[1].splitlines()
    assert lines[:2] == ["      terminate called after throwing an instance of 'std::runtime_error'",
                         "        what():  the native layer gave up"]
    assert "early noise" not in report and "frame #0" not in report


# each rank reports how the job's store listens and where its secret is; rank 0 also tries the store with a
# wrong secret
STORE_PROBE = """
    import json, os, socket, sys
    rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            addr, p = fields[1].rsplit(":", 1)
            if int(p, 16) == port and fields[3] == "0A":
                listening.append(addr)
    refused = None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))   # no packet: only picks this host's outgoing address
            outside = probe.getsockname()[0]
        except OSError:
            outside = None
    if outside and not outside.startswith("127."):
        try:
            socket.create_connection((outside, port), timeout=2).close()
            refused = False
        except OSError:
            refused = True
    wrong = None
    if rank == 0:
        from pypto_rt.collective import store_rendezvous
        from pypto_rt.errors import PyptoError
        os.environ["PYPTO_JOB_SECRET"] = "not-the-secret"
        try:
            store_rendezvous.open_store(rank, 2, start_timeout_s=10)
        except PyptoError as e:
            wrong = str(e)
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"listening": listening, "outside": outside, "refused": refused, "wrong": wrong,
                   "addr": os.environ["MASTER_ADDR"], "cmdline": open("/proc/self/cmdline").read(),
                   "parent": open(f"/proc/{os.getppid()}/cmdline").read()}, f)
    open(os.path.join(sys.argv[1], f"secret{rank}"), "w").write(open("/proc/self/environ").read())
"""


@pytest.mark.timeout(90)
def test_the_store_listens_on_loopback_only_and_its_secret_travels_in_the_environment(tmp_path, program, launch):
    out = tmp_path / "out"
    out.mkdir()
    job = launch("--nproc", "2", program(STORE_PROBE), str(out))
    assert job.rc == 0, job.err
    dumps = _dumps(out)
    for rank, d in dumps.items():
        assert d["listening"] == ["0100007F"] and d["addr"] == "127.0.0.1", d   # 127.0.0.1, not 0.0.0.0 or ::
        assert d["refused"] in (True, None) and (d["refused"] or not d["outside"]), d
        environ = dict(v.split("=", 1) for v in (out / f"secret{rank}").read_text().split("\0") if "=" in v)
        secret = environ["PYPTO_JOB_SECRET"]
        assert len(secret) >= 32 and secret not in d["cmdline"] and secret not in d["parent"]
    assert "is not this job's, or PYPTO_JOB_SECRET differs" in dumps[0]["wrong"]


@pytest.mark.timeout(100)
def test_a_rank_exiting_0_before_its_communicator_ends_the_job_at_once_naming_it(tmp_path, program, launch):
    # rank 0 waits in its communicator's start rendezvous for rank 1, which has exited: before, it waited out
    # PYPTO_START_TIMEOUT_S (120 s) whatever --timeout-s said
    prog = program("""
    import os, sys, time
    if os.environ["RANK"] == "1":
        raise SystemExit(0)
    import torch
    from pypto_rt.collective import process
    open(sys.argv[1], "w").write(repr(time.time()))
    process.communicator("test")
    """)
    logs, stamp = tmp_path / "logs", tmp_path / "stamp"
    job = launch("--nproc", "2", "--timeout-s", "10", "--log-dir", str(logs), prog, str(stamp))
    assert job.rc == 1, job.err
    waited = json.loads((logs / "rank0.error.json").read_text())["time"] - float(stamp.read_text())
    assert waited < 5, waited   # torch imported: what is left is the rendezvous
    report = _summary(job.err)
    assert "rank 0 failed first" in report
    assert "rank 1 exited (exit code 0) before creating its communicator, so it can never join this one" in report
    assert "rank 1: exited 0" in report
