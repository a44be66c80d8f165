"""The examples in examples/python, run as the README says."""

import pytest

import harness

EX = harness.EXAMPLES


@pytest.mark.parametrize("n", [2, 4])
def test_train_dp(dcrun, n):
    r = harness.run_dcrun(dcrun, n, [harness.PYTHON, str(EX / "train_dp.py"), "--steps", "60"])
    assert r.returncode == 0, r.stdout
    assert "[0] step    0  loss" in r.stdout and "ranks agree: True" in r.stdout, r.stdout
    assert f"trained on {n} ranks: OK" in r.stdout, r.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_objects_demo(dcrun, n):
    r = harness.run_dcrun(dcrun, n, [harness.PYTHON, str(EX / "objects_demo.py")])
    assert r.returncode == 0, r.stdout
    assert "objects demo: OK" in r.stdout and "ring: start -> rank0" in r.stdout, r.stdout


@pytest.mark.parametrize("n", [2, 3, 4])
def test_torch_style_script_under_dcrun(dcrun, n):
    r = harness.run_dcrun(dcrun, n, [harness.PYTHON, str(EX / "torch_api_tour.py")])
    assert r.returncode == 0, r.stdout
    assert f"script on {n} ranks" in r.stdout, r.stdout


def test_torch_style_script_spawning_its_own_ranks():
    """As the torch tutorials start it: multiprocessing 'spawn', MASTER_ADDR/PORT, gloo."""
    import subprocess

    env = harness.clean_env({"MASTER_PORT": str(harness.free_port()), "NPROC": "3"})
    r = subprocess.run([harness.PYTHON, str(EX / "torch_api_tour.py")], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    assert "script on 3 ranks" in r.stdout, r.stdout


def test_torch_style_script_differs_from_torch_only_in_imports():
    src = (EX / "torch_api_tour.py").read_text()
    imports = [line for line in src.splitlines() if line.startswith(("import ", "from "))]
    assert "import distcomm as dist  # was: import torch.distributed as dist" in imports
    assert not any("torch" in line for line in imports if "# was" not in line)
