"""--log-dir safety: links planted in the log folder are never followed, and a folder others may write in (or
that another user owns) is refused before any rank starts."""
from __future__ import annotations

import os

import pytest

FAILING_RANK_0 = """
import os
print("rank", os.environ["RANK"])
if os.environ["RANK"] == "0":
    raise RuntimeError("rank 0 fails, so it writes its error file")
"""


@pytest.mark.timeout(60)
def test_links_planted_in_the_log_folder_are_replaced_not_followed(tmp_path, program, launch):
    logs, victims = tmp_path / "logs", tmp_path / "victims"
    logs.mkdir()
    victims.mkdir()
    planted = ["rank0.stdout.log", "rank0.stderr.log", "rank1.stdout.log", "rank0.error.json.tmp",
               "rank0.error.json"]
    for name in planted:
        (victims / name).write_text("precious\n")
        os.symlink(victims / name, logs / name)
    os.symlink(victims / "absent", logs / "rank1.stderr.log")   # a dangling link: following it would create a file
    job = launch("--nproc", "2", "--log-dir", str(logs), "--tee", program(FAILING_RANK_0))
    assert job.rc == 1 and "rank 0 failed first" in job.err and "rank 0 fails" in job.err
    assert all((victims / name).read_text() == "precious\n" for name in planted)
    assert not (victims / "absent").exists()
    for name in ("rank0.stdout.log", "rank0.stderr.log", "rank1.stdout.log", "rank1.stderr.log", "rank0.error.json"):
        path = logs / name
        assert not path.is_symlink() and oct(path.stat().st_mode & 0o777) == oct(0o600), name
    assert (logs / "rank0.stdout.log").read_text() == "rank 0\n"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_log_folder_others_may_write_in_is_refused(tmp_path, program, launch, mode):
    logs = tmp_path / "shared"
    logs.mkdir()
    os.chmod(logs, mode)
    job = launch("--nproc", "2", "--log-dir", str(logs), program("print('ran')\n"))
    assert job.rc == 2 and "ran" not in job.out
    assert f"--log-dir {logs} is writable by other users (mode {mode:04o})" in job.err
    assert "chmod go-w" in job.err and len(job.err.strip().splitlines()) == 1
    assert os.listdir(logs) == []


@pytest.mark.timeout(30)
def test_a_sticky_log_folder_of_ones_own_is_accepted(tmp_path, program, launch):
    logs = tmp_path / "sticky"
    logs.mkdir()
    os.chmod(logs, 0o1777)
    job = launch("--nproc", "1", "--log-dir", str(logs), program("print('ran')\n"))
    assert job.rc == 0, job.err
    assert (logs / "rank0.stdout.log").read_text() == "ran\n"


@pytest.mark.timeout(30)
@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_log_folder_of_another_user_is_refused(tmp_path, program, launch):
    logs = tmp_path / "theirs"
    logs.mkdir()
    os.chown(logs, 65534, 65534)
    job = launch("--nproc", "1", "--log-dir", str(logs), program("print('ran')\n"))
    assert job.rc == 2 and f"--log-dir {logs} belongs to another user (uid 65534)" in job.err
