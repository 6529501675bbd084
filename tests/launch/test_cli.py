"""Flags and their PYPTO_* environment forms -> LaunchConfig, and the usage errors (no ranks started)."""
from __future__ import annotations

import pytest

from pypto_rt.launch import cli


@pytest.fixture
def prog(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text("pass\n")
    return str(path)


@pytest.mark.timeout(10)
def test_defaults(prog):
    cfg = cli.parse([prog, "a", "--b"])
    assert (cfg.nproc, cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port) == (1, 1, 0, "127.0.0.1", None)
    assert (cfg.comm, cfg.backend, cfg.log_dir, cfg.tee, cfg.timeout_s) == ("shm", "local", None, False, None)
    assert cfg.args == ("a", "--b") and len(cfg.job_id) == 12


@pytest.mark.timeout(10)
def test_every_flag_has_an_environment_form_and_the_flag_wins(prog, monkeypatch):
    env = {"PYPTO_NPROC": "3", "PYPTO_NNODES": "2", "PYPTO_NODE_RANK": "1", "PYPTO_MASTER_ADDR": "10.0.0.1",
           "PYPTO_MASTER_PORT": "29500", "PYPTO_LOG_DIR": "/tmp/x", "PYPTO_COMM": "hccl", "PYPTO_TIMEOUT_S": "7.5",
           "PYPTO_JOB_ID": "j1", "PYPTO_TEE": "1", "PYPTO_LAUNCH_BACKEND": "local", "PYPTO_JOB_SECRET": "s3cr3t",
           "PYPTO_RAY_ADDRESS": "auto", "PYPTO_PLACEMENT": "spread", "PYPTO_RANK_RESOURCES": "CPU=2"}
    assert sorted(cli.ENVIRONMENT) == sorted(env)   # what the CLI says it reads
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = cli.parse([prog])
    assert (cfg.nproc, cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port) == (3, 2, 1, "10.0.0.1", 29500)
    assert (cfg.log_dir, cfg.comm, cfg.timeout_s, cfg.job_id, cfg.tee) == ("/tmp/x", "hccl", 7.5, "j1", True)
    assert cfg.secret == "s3cr3t" and "s3cr3t" not in repr(cfg)
    cfg = cli.parse(["--nproc", "5", "--node_rank", "0", "--comm", "gloo", "--master-port", "0", prog])
    assert (cfg.nproc, cfg.node_rank, cfg.comm, cfg.master_port) == (5, 0, "gloo", 0)
    cfg = cli.parse(["--nnodes", "1", "--node-rank", "0", "--backend", "ray", "--placement", "pack", prog])
    assert (cfg.address, cfg.placement, cfg.rank_resources) == ("auto", "pack", (("CPU", 2.0),))


@pytest.mark.timeout(10)
def test_comm_defaults_to_gloo_across_hosts(prog, monkeypatch):
    monkeypatch.setenv("PYPTO_JOB_SECRET", "s")
    assert cli.parse(["--nnodes", "2", "--master-addr", "10.0.0.1", prog]).comm == "gloo"


@pytest.mark.timeout(10)
def test_a_one_host_job_gets_a_random_secret(prog):
    one, two = cli.parse([prog]), cli.parse([prog])
    assert len(one.secret) == 32 and one.secret != two.secret


@pytest.mark.timeout(10)
@pytest.mark.parametrize("argv,env,expected", [
    (["--nproc", "0"], {}, "--nproc must be an integer >= 1, got '0'"),
    ([], {"PYPTO_NPROC": "many"}, "PYPTO_NPROC must be an integer >= 1, got 'many'"),
    (["--comm", "mpi"], {}, "--comm must be one of shm, gloo, nccl, hccl, got 'mpi'"),
    (["--nnodes", "2", "--comm", "shm"], {}, "--comm shm works within one host only; use --comm gloo"),
    (["--nnodes", "2", "--node-rank", "1"], {}, "--node-rank 1 needs --master-port"),
    (["--nnodes", "2", "--node-rank", "2", "--master-port", "5"], {}, "--node-rank 2 is not below --nnodes 2"),
    (["--timeout-s", "-1"], {}, "--timeout-s must be a positive number of seconds"),
    (["--job-id", "a/b"], {}, "--job-id may hold only letters"),
    (["--master-port", "70000"], {}, "--master-port must be an integer between 0 and 65535"),
    (["--nnodes", "2"], {"PYPTO_JOB_SECRET": "s"}, "--nnodes 2 needs --master-addr: node 0's address"),
    (["--nnodes", "2", "--master-addr", "10.0.0.1"], {}, "--nnodes 2 needs PYPTO_JOB_SECRET in the environment"),
])
def test_usage_errors_say_what_and_how(prog, monkeypatch, capsys, argv, env, expected):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main([*argv, prog]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pypto-launch: ") and expected in err and err.count("\n") == 1


@pytest.mark.timeout(10)
def test_backend_ray_without_ray_installed_says_how_to_install_it_in_one_sentence(prog, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert cli.main(["--backend", "ray", prog]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--backend ray: Ray is not installed; install it with pip install 'pypto-rt[ray]'" in err


@pytest.mark.timeout(10)
def test_backend_ray_flags_parse_into_the_config(prog):
    cfg = cli.parse(["--backend", "ray", "--nproc", "4", "--address", "auto", "--placement", "spread",
                     "--rank-resources", "CPU=0.5,node_a=1", prog])
    assert (cfg.backend, cfg.nproc, cfg.address, cfg.placement) == ("ray", 4, "auto", "spread")
    assert cfg.rank_resources == (("CPU", 0.5), ("node_a", 1.0))
    assert cli.parse(["--backend", "ray", prog]).rank_resources == (("CPU", 1.0),)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("argv, expected", [
    (["--address", "auto"], "--address applies to --backend ray only"),
    (["--backend", "ray", "--placement", "strict"], "--placement must be pack or spread, got 'strict'"),
    (["--backend", "ray", "--rank-resources", "CPU"], "--rank-resources: 'CPU' is not NAME=AMOUNT"),
    (["--backend", "ray", "--nnodes", "2", "--master-addr", "h"], "--backend ray: Ray places the ranks on its nodes"),
])
def test_backend_ray_usage_errors_say_what_and_how(prog, monkeypatch, capsys, argv, expected):
    monkeypatch.setenv("PYPTO_JOB_SECRET", "s")
    assert cli.main([*argv, prog]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pypto-launch: ") and expected in err and err.count("\n") == 1


@pytest.mark.timeout(10)
def test_missing_program(tmp_path, capsys):
    assert cli.main(["--nproc", "2", str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert "no program given" in capsys.readouterr().err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("comm", ["nccl", "hccl"])
def test_an_accelerator_communicator_this_machine_lacks_is_refused_before_any_rank_starts(comm, program, launch):
    from pypto_rt.collective.torch_backend import missing_library
    if missing_library(comm) is None:
        pytest.skip(f"this machine can run {comm}")   # a GPU/NPU machine: nothing to refuse
    job = launch("--nproc", "2", "--comm", comm, program("raise SystemExit('a rank ran')"))
    assert job.rc == 2
    assert f"--comm {comm}:" in job.err and "a rank ran" not in job.out + job.err
    assert job.err.count("\n") == 1   # one sentence
