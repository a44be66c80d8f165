"""Jobs started with only a launcher's variables (plus MASTER_ADDR/MASTER_PORT), as srun,
mpirun (Open MPI), mpiexec (MPICH Hydra) and paddle's launcher set them."""

import pytest

import harness

LAUNCHERS = {
    "slurm": lambda r, n: {"SLURM_PROCID": str(r), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(r),
                           "SLURM_JOB_ID": "4242", "SLURM_NODEID": "0"},
    "openmpi": lambda r, n: {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(n),
                             "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": str(n)},
    "hydra": lambda r, n: {"PMI_RANK": str(r), "PMI_SIZE": str(n), "MPI_LOCALRANKID": str(r)},
    "paddle": lambda r, n: {"PADDLE_TRAINER_ID": str(r), "PADDLE_TRAINERS_NUM": str(n)},
    # mpirun inside a Slurm allocation: every process also carries the batch step's SLURM_PROCID=0
    "openmpi-in-slurm": lambda r, n: {**LAUNCHERS["openmpi"](r, n), "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
}


def launch_as(kind: str, n: int, argv):
    port = str(harness.free_port())
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    return harness.launch(n, argv, lambda r: LAUNCHERS[kind](r, n), common, timeout=120)


@pytest.mark.parametrize("kind", sorted(LAUNCHERS))
def test_python_job_with_launcher_variables(kind):
    n = 3
    results = launch_as(kind, n, [harness.PYTHON, str(harness.TESTS / "scenarios.py"), "launcher_env"])
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    for r, (_, out, _) in enumerate(results):
        assert f"OK rank {r} of {n}" in out, out


@pytest.mark.parametrize("kind", ["slurm", "openmpi", "hydra"])
def test_example_with_launcher_variables(kind):
    results = launch_as(kind, 2, [harness.PYTHON, str(harness.EXAMPLES / "train_dp.py"), "--steps", "30"])
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    assert "trained on 2 ranks: OK" in results[0][1]
