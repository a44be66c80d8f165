"""Helpers of the host-side tests: start jobs with dcrun or by hand (with a launcher's variables)."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parents[1]
EXAMPLES = REPO / "examples" / "python"
PYTHON = sys.executable

# Variables of launchers and of distcomm's own env:// that must not leak from the environment
# the tests run in (a CI job under Slurm, say) into the jobs they start.
_LEAKY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
          "MASTER_ADDR", "MASTER_PORT", "DC_TOKEN", "DC_LAUNCHER_STORE", "DC_TRANSPORT", "DC_SOCKET_IFNAME")
_LEAKY_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "PADDLE_", "HYDRA_", "MPI_LOCAL")


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LEAKY and not k.startswith(_LEAKY_PREFIXES)}
    env.setdefault("DC_TIMEOUT_MS", "60000")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def find_dcrun() -> Optional[str]:
    """dcrun from DCRUN, PATH, next to DISTCOMM_LIBRARY (PREFIX/lib -> PREFIX/bin), or the build."""
    cands = [os.environ.get("DCRUN", ""), shutil.which("dcrun") or ""]
    lib = os.environ.get("DISTCOMM_LIBRARY", "")
    if lib:
        d = lib if os.path.isdir(lib) else os.path.dirname(lib)
        cands.append(os.path.join(d, "..", "bin", "dcrun"))
    cands.append(str(REPO / "target" / "release" / "dcrun"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_dcrun(dcrun: str, n: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
              timeout: float = 120, options: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Runs `dcrun -n N [options] ARGV`; stdout and stderr together in .stdout."""
    cmd = [dcrun, "-n", str(n), *options, *argv]
    try:
        return subprocess.run(cmd, env=clean_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, cwd=str(REPO))
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise AssertionError(f"{' '.join(cmd)} did not finish in {timeout} s; output:\n{out}") from None


def launch(n: int, argv: Sequence[str], rank_env: Callable[[int], Dict[str, str]],
           env: Optional[Dict[str, str]] = None, timeout: float = 120) -> List[Tuple[int, str, float]]:
    """Starts N processes of ARGV by hand, rank r with rank_env(r) added to the environment;
    returns (exit status, output, seconds) per rank. Kills them all if they outlast timeout."""
    procs = []
    start = time.monotonic()
    for r in range(n):
        f = tempfile.TemporaryFile()
        p = subprocess.Popen(list(argv), env=clean_env({**(env or {}), **rank_env(r)}), stdout=f,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO))
        procs.append((p, f))
    results: List[Tuple[int, str, float]] = []
    deadline = start + timeout
    timed_out = False
    for p, f in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    for p, f in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
        f.seek(0)
        results.append((p.returncode, f.read().decode(errors="replace"), time.monotonic() - start))
        f.close()
    if timed_out:
        outs = "\n".join(f"--- rank {r} (status {rc}):\n{out}" for r, (rc, out, _) in enumerate(results))
        raise AssertionError(f"{' '.join(argv)} did not finish in {timeout} s:\n{outs}")
    return results


def env_launch(n: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
               timeout: float = 120) -> List[Tuple[int, str, float]]:
    """A job started like torch's env:// by hand: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    (rank 0 serves the store)."""
    port = str(free_port())
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(n)}
    return launch(n, argv, lambda r: {"RANK": str(r)}, {**common, **(env or {})}, timeout)


def describe(results: List[Tuple[int, str, float]]) -> str:
    return "\n".join(f"--- rank {r} (status {rc}, {t:.1f} s):\n{out}" for r, (rc, out, t) in enumerate(results))
