"""distcomm.rpc (paddle.distributed.rpc's API) as a real job, and the parameter-server example."""

import pytest

import harness


@pytest.mark.parametrize("n", [3, 4])
def test_rpc_job(dcrun, n):
    r = harness.run_dcrun(dcrun, n, [harness.PYTHON, str(harness.TESTS / "rpc_job.py")], timeout=180)
    assert r.returncode == 0, r.stdout
    assert r.stdout.count("rpc job ok") == n, r.stdout


def test_parameter_server_example(dcrun):
    r = harness.run_dcrun(dcrun, 3, [harness.PYTHON, str(harness.EXAMPLES / "param_server.py")], timeout=180)
    assert r.returncode == 0, r.stdout
    assert "trainers agree" in r.stdout, r.stdout


def test_call_reaching_a_worker_while_it_finishes_init_rpc(dcrun):
    r = harness.run_dcrun(dcrun, 3, [harness.PYTHON, str(harness.TESTS / "rpc_early_call_job.py")], timeout=120)
    assert r.returncode == 0, r.stdout
    assert r.stdout.count("early call ok") == 3, r.stdout
