"""Host-side tests: each test starts a job (dcrun, or processes with a launcher's variables)
and checks what it did. The rank-side tests in ranks/ are run by test_jobs.py.

Environment: DISTCOMM_LIBRARY (the library under test), DCRUN (else dcrun from PATH, next to the
library, or target/release), DC_TEST_STRICT=1 (fail instead of skipping when dcrun is missing).
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

collect_ignore = ["ranks", "torch_ranks", "torch_init_job.py"]


@pytest.fixture(scope="session")
def dcrun() -> str:
    path = harness.find_dcrun()
    if path is None:
        msg = "dcrun not found (set DCRUN, put it on PATH, or build it: cargo build --release)"
        if os.environ.get("DC_TEST_STRICT") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return path
