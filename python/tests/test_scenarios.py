"""Error statuses as typed exceptions, init arguments, and leaving without
destroy_process_group: small jobs from scenarios.py."""

import re

import pytest

import harness

SCEN = [harness.PYTHON, str(harness.TESTS / "scenarios.py")]


def run(dcrun, n, name, *args, env=None, timeout=60):
    r = harness.run_dcrun(dcrun, n, SCEN + [name, *args], env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout
    oks = re.findall(r"^\[(\d+)\] OK (.*)$", r.stdout, re.M)
    return r, oks


@pytest.mark.parametrize("name,n", [
    ("timeout", 2), ("mismatch", 2), ("abort", 2), ("abort_from_thread", 2), ("peer_lost", 2),
    ("unavailable", 1), ("invalid_init", 1), ("reinit", 3), ("forked_child", 2),
])
def test_scenario(dcrun, name, n):
    r, oks = run(dcrun, n, name)
    assert oks, r.stdout


def test_timeout_message_names_the_peer(dcrun):
    r, oks = run(dcrun, 2, "timeout")
    msg = [m for _, m in oks if m.startswith("timeout")][0]
    assert "rank 1" in msg and "dc_recv" in msg, msg


def test_not_initialised():
    results = harness.launch(1, SCEN + ["not_initialized"], lambda r: {})
    assert results[0][0] == 0 and "OK" in results[0][1], harness.describe(results)


def test_environment_error_names_the_variable():
    results = harness.launch(1, SCEN + ["env_error"], lambda r: {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "RANK": "0"})
    assert results[0][0] == 0 and "WORLD_SIZE" in results[0][1], harness.describe(results)


def test_port_in_use_is_a_system_error():
    results = harness.launch(1, SCEN + ["port_in_use"], lambda r: {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1"})
    assert results[0][0] == 0, harness.describe(results)
    assert "DistSystemError DC_ERR_SYSTEM" in results[0][1], results[0][1]


def test_wrong_token_is_refused():
    port = str(harness.free_port())
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "DC_TIMEOUT_MS": "3000"}
    results = harness.launch(2, SCEN + ["rendezvous_error"], lambda r: {"RANK": str(r), "DC_TOKEN": f"token-{r}"}, env, timeout=60)
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    assert "DistRendezvousError" in results[1][1], harness.describe(results)  # the stranger


@pytest.mark.parametrize("same", [True, False])
def test_token_argument(same):
    # init_process_group(token=...) stands in for DC_TOKEN: equal tokens join, a different one is refused
    port = str(harness.free_port())
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "DC_TIMEOUT_MS": "3000"}
    tok = lambda r: "t-0" if same else f"t-{r}"  # noqa: E731
    results = harness.launch(2, SCEN + ["token_arg"], lambda r: {"RANK": str(r), "TEST_TOKEN": tok(r)}, env, timeout=60)
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    if same:
        assert all("OK joined" in out for _, out, _ in results), harness.describe(results)
    else:
        assert "OK refused DistRendezvousError" in results[1][1], harness.describe(results)


@pytest.mark.parametrize("method", ["tcp", "file"])
def test_init_arguments_without_launcher_variables(tmp_path, method):
    n = 3
    if method == "tcp":
        url = f"tcp://127.0.0.1:{harness.free_port()}"
        rank_args = lambda r: [str(r)]  # noqa: E731
    else:
        url = f"file://{tmp_path}/store"
        rank_args = lambda r: ["-1"]  # noqa: E731 - ranks assigned in arrival order
    procs = [SCEN + ["init_args", url, *rank_args(r), str(n)] for r in range(n)]
    results = []
    import subprocess

    ps = [subprocess.Popen(p, env=harness.clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for p in procs]
    for p in ps:
        out, _ = p.communicate(timeout=60)
        results.append((p.returncode, out, 0.0))
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    ranks = sorted(int(re.search(r"OK rank (\d+) of 3", out).group(1)) for _, out, _ in results)
    assert ranks == [0, 1, 2]


def test_exit_without_destroy_is_quick(dcrun):
    r, oks = run(dcrun, 3, "exit_without_destroy", timeout=30)
    assert len(oks) == 3 and "pending" not in r.stdout, r.stdout


def test_exit_with_pending_operations_does_not_hang(dcrun):
    import time

    t0 = time.monotonic()
    r, oks = run(dcrun, 2, "exit_with_pending", env={"DC_TIMEOUT_MS": "120000"}, timeout=60)
    took = time.monotonic() - t0
    assert len(oks) == 2 and took < 20, (took, r.stdout)
    assert "still pending at exit" in r.stdout, r.stdout


def test_an_exception_on_one_rank_fails_the_others_fast():
    """Rank 1 raises (its interpreter exits without destroy_process_group); rank 0, blocked in
    all_reduce with a 2-minute timeout, hears of it at once instead of waiting."""
    results = harness.env_launch(2, SCEN + ["raise_midway"], env={"DC_TIMEOUT_MS": "120000"}, timeout=60)
    (rc0, out0, t0), (rc1, out1, _) = results
    assert rc1 != 0 and "rank 1 fails" in out1, harness.describe(results)
    assert rc0 == 0 and "OK noticed" in out0 and t0 < 20, harness.describe(results)
