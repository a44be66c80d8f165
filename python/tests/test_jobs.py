"""The rank-side suite (ranks/rank_*.py) run as real jobs at 2, 3 and 4 ranks."""

import re

import pytest

import harness

RANK_FILES = sorted(str(p.relative_to(harness.REPO)) for p in (harness.TESTS / "ranks").glob("rank_*.py"))
PYTEST = [harness.PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error::pytest.PytestUnraisableExceptionWarning"]


def passed_counts(out: str) -> dict:
    """{rank: passed} from the '[r] N passed' summary lines of every rank."""
    counts = {}
    for m in re.finditer(r"^\[(\d+)\] (?:=+ )?(\d+) passed", out, re.M):
        counts[int(m.group(1))] = int(m.group(2))
    return counts


@pytest.mark.parametrize("n", [2, 3, 4])
def test_rank_suite_under_dcrun(dcrun, n):
    r = harness.run_dcrun(dcrun, n, PYTEST + RANK_FILES, timeout=300)
    assert r.returncode == 0, r.stdout
    counts = passed_counts(r.stdout)
    assert sorted(counts) == list(range(n)), r.stdout
    assert len(set(counts.values())) == 1 and min(counts.values()) > 100, counts
    print(f"{n} ranks: {counts[0]} rank-side tests passed on every rank")


def test_rank_suite_launched_by_hand():
    """env:// as torch users start it by hand: rank 0 serves the store, no dcrun."""
    results = harness.env_launch(2, PYTEST + RANK_FILES, timeout=300)
    assert all(rc == 0 for rc, _, _ in results), harness.describe(results)
    for _, out, _ in results:
        assert re.search(r"\d+ passed", out), out
