"""distcomm as a torch.distributed backend (distcomm.torch), in real jobs.

Needs torch: skipped with a message where it is not installed, except when
DISTCOMM_EXPECT_TORCH=1 (scripts/test.sh sets it after installing torch): then its absence fails.
"""

import os
import re
import subprocess

import pytest

import harness

if os.environ.get("DISTCOMM_EXPECT_TORCH") == "1":
    import torch  # noqa: F401  (must be there)
else:
    torch = pytest.importorskip("torch", reason="torch is not installed: the distcomm.torch tests skip")

EX = harness.EXAMPLES
PYTEST = [harness.PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error::pytest.PytestUnraisableExceptionWarning"]


def _passed(out: str) -> int:
    m = re.findall(r"(\d+) passed", out)
    return int(m[-1]) if m else 0


@pytest.mark.parametrize("n", [2, 3])
def test_every_call_against_gloo(n):
    """python/tests/torch_ranks: every collective and p2p call, compared with Gloo's results."""
    results = harness.env_launch(n, PYTEST + ["python/tests/torch_ranks/rank_vs_gloo.py"], timeout=300)
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    counts = {_passed(out) for _, out, _ in results}
    assert len(counts) == 1 and counts.pop() >= 60, harness.describe(results)


def test_part_one_tensors_in_the_array_api():
    """ranks/rank_torch.py: torch tensors through DLPack in the package's own array API (its
    own job: distcomm's env:// takes MASTER_PORT, which torch's store would take too)."""
    results = harness.env_launch(2, PYTEST + ["python/tests/ranks/rank_torch.py"], timeout=200)
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    assert all(_passed(out) == 3 for _, out, _ in results), harness.describe(results)


def _weights(path):
    return torch.load(path)


def _max_diff(a, b) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def single_process():
    """The example's training on one process, on the whole batch (here, in the test process)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("torch_ddp", EX / "torch_ddp.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    net = ex.model()
    ex.train(net, 0, 1, 50, 0.05)
    return net.state_dict()


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_matches_one_process_and_gloo(single_process, tmp_path, n):
    """DDP, 50 steps of a small MLP: the weights match training on one process on the whole
    batch (float tolerance: the gradients are averaged in another order) and a Gloo run."""
    out = tmp_path / "w.pt"
    results = harness.env_launch(n, [harness.PYTHON, "python/tests/torch_ddp_job.py", str(out)], timeout=300)
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    dc, gl = _weights(out)
    assert _max_diff(dc, single_process) < 1e-5
    assert _max_diff(dc, gl) < 1e-6


def test_ddp_under_dcrun_and_torchrun(dcrun, single_process, tmp_path):
    out = tmp_path / "dcrun.pt"
    r = harness.run_dcrun(dcrun, 2, [harness.PYTHON, str(EX / "torch_ddp.py"), "--out", str(out)],
                          options=["--rank0-store"], timeout=300)
    assert r.returncode == 0, r.stdout
    assert "[0] ranks agree: True" in r.stdout, r.stdout
    assert _max_diff(_weights(out), single_process) < 1e-5
    out2 = tmp_path / "torchrun.pt"
    r = subprocess.run([harness.PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                        str(harness.free_port()), str(EX / "torch_ddp.py"), "--out", str(out2)],
                       env=harness.clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300, cwd=str(harness.REPO))
    assert r.returncode == 0, r.stdout
    assert "ranks agree: True" in r.stdout, r.stdout
    assert _max_diff(_weights(out2), single_process) < 1e-5


def test_tutorial_only_the_backend_name_differs(tmp_path):
    """The tutorial-style script (2 spawned processes) on distcomm and, with BACKEND = "gloo",
    on Gloo: the same lines (sorted: the processes share stdout) but for the backend's name."""
    src = (EX / "torch_tutorial.py").read_text()
    assert src.count('BACKEND = "distcomm"') == 1
    gloo = tmp_path / "torch_tutorial_gloo.py"
    gloo.write_text(src.replace('BACKEND = "distcomm"', 'BACKEND = "gloo"'))
    outs = {}
    for name, path in (("distcomm", EX / "torch_tutorial.py"), ("gloo", gloo)):
        env = harness.clean_env({"MASTER_PORT": str(harness.free_port())})
        r = subprocess.run([harness.PYTHON, str(path), "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=200, cwd=str(harness.REPO))
        assert r.returncode == 0, r.stdout
        outs[name] = sorted(line.replace(name, "BACKEND") for line in r.stdout.splitlines() if line.startswith("rank "))
    assert len(outs["distcomm"]) == 2 * 15 and outs["distcomm"] == outs["gloo"], outs


def test_init_methods_file_then_tcp(tmp_path):
    """file:// and tcp:// init methods, one after the other in the same processes."""
    urls = [f"file://{tmp_path / 'store'}", f"tcp://127.0.0.1:{harness.free_port()}"]
    results = harness.launch(2, [harness.PYTHON, "python/tests/torch_init_job.py", *urls],
                             lambda r: {"RANK": str(r), "WORLD_SIZE": "2"}, timeout=200)
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    for r, (_, out, _) in enumerate(results):
        assert f"rank {r}: file init ok" in out and f"rank {r}: tcp init ok" in out, out


def test_import_registers_the_backend():
    import torch.distributed as d

    import distcomm.torch

    assert "distcomm" in d.Backend.backend_list
    assert d.Backend.backend_capability["distcomm"] == ["cpu", "cuda"]
    assert distcomm.torch.BACKEND_NAME == "distcomm"


def test_native_backend_that_cannot_be_built(tmp_path):
    """Where the native backend cannot be built (here: a compiler that fails), a warning and the
    Python backend; under DISTCOMM_TORCH_NATIVE=1 an error that says why."""
    code = "\n".join([
        "import os, warnings",
        "import distcomm.torch._native as native",
        "with warnings.catch_warnings(record=True) as seen:",
        "    warnings.simplefilter('always')",
        "    assert native.module() is None",
        "assert any('could not be built' in str(w.message) for w in seen), [str(w.message) for w in seen]",
        "os.environ['DISTCOMM_TORCH_NATIVE'] = '1'",
        "try:",
        "    native.module()",
        "except Exception as e:",
        "    print('refused:', type(e).__name__, e)",
    ])
    env = harness.clean_env({"CXX": "false", "DISTCOMM_TORCH_NATIVE_CACHE": str(tmp_path), "DISTCOMM_TORCH_NATIVE": ""})
    r = subprocess.run([harness.PYTHON, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    assert "refused: DistcommUnavailableError" in r.stdout and "compiling" in r.stdout, r.stdout


def test_native_backend_takes_the_fast_forms_itself():
    """torch_native_job.py: with the Python backend's methods for the fast forms made to fail,
    every fast form still runs (DISTCOMM_TORCH_NATIVE=1), at 3 ranks."""
    results = harness.env_launch(3, [harness.PYTHON, "python/tests/torch_native_job.py"],
                                 env={"DISTCOMM_TORCH_NATIVE": "1"}, timeout=300)
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    assert all(f"rank {r}: every fast form native" in out for r, (_, out, _) in enumerate(results)), harness.describe(results)
