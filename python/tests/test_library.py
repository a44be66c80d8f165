"""The package without a job: finding the library, errors, types, the API surface."""

import os
import subprocess

import numpy as np
import pytest

import distcomm as dist
import harness


def python(code: str, **env) -> subprocess.CompletedProcess:
    e = harness.clean_env()
    e.update(env)
    return subprocess.run([harness.PYTHON, "-c", code], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=60)


def test_library_found_and_versioned():
    assert dist.is_available()
    path = dist.library_path()
    assert os.path.basename(path).startswith("libdistcomm.so")
    assert dist.library_version() >= (0, 1, 0)
    if os.environ.get("DISTCOMM_LIBRARY"):
        assert os.path.realpath(os.environ["DISTCOMM_LIBRARY"]) == os.path.realpath(path)


def test_library_directory_in_variable():
    lib = dist.library_path()
    r = python("import distcomm; print(distcomm.library_path())", DISTCOMM_LIBRARY=os.path.dirname(lib))
    assert r.returncode == 0 and r.stdout.strip() == lib, r.stdout


def test_loader_path_fallback():
    lib = dist.library_path()
    r = python("import distcomm; print(distcomm.library_path())", DISTCOMM_LIBRARY="",
               LD_LIBRARY_PATH=os.path.dirname(lib))
    assert r.returncode == 0 and r.stdout.strip() == lib, r.stdout


def test_missing_library_is_a_clear_error(tmp_path):
    code = ("import distcomm\nassert not distcomm.is_available()\n"
            "try:\n    distcomm.init_process_group()\nexcept distcomm.DistUnavailableError as e:\n    print(e)\n")
    r = python(code, DISTCOMM_LIBRARY=str(tmp_path / "nope.so"))
    assert r.returncode == 0, r.stdout
    assert "DISTCOMM_LIBRARY" in r.stdout and "nope.so: no such file" in r.stdout, r.stdout
    # not set and nowhere to be found: the message lists the places tried
    r = python(code, DISTCOMM_LIBRARY="", LD_LIBRARY_PATH="")
    if "cannot find libdistcomm" in r.stdout:
        assert "Looked at:" in r.stdout and "/usr/local/lib/" in r.stdout and "libdistcomm.so.0" in r.stdout, r.stdout


def test_not_a_library(tmp_path):
    bad = tmp_path / "libdistcomm.so"
    bad.write_text("not an ELF file")
    r = python("import distcomm\ntry:\n    distcomm.library_path()\nexcept distcomm.DistUnavailableError as e:\n    print(e)",
               DISTCOMM_LIBRARY=str(bad))
    assert r.returncode == 0 and str(bad) in r.stdout, r.stdout


def test_status_names_match_the_library():
    from distcomm import _lib
    from distcomm._errors import STATUS_NAMES, error_for_status

    lib = _lib.load()
    # Both ways: every status the library names is in the table, and nothing else is.
    known = {c: lib.dc_status_name(c).decode() for c in range(256)}
    assert {c: n for c, n in known.items() if n != "DC_ERR_UNKNOWN"} == STATUS_NAMES
    for code, name in STATUS_NAMES.items():
        if code:
            e = error_for_status(code, "m")
            assert e.status == code and e.status_name == name and isinstance(e, dist.DistError)
    assert type(error_for_status(99, "x")) is dist.DistError


def test_every_declared_function_exists():
    from distcomm import _lib

    lib = _lib.load()
    for name, (restype, argtypes) in _lib.SIGNATURES.items():
        fn = getattr(lib, name)
        assert fn.argtypes == argtypes and fn.restype == restype, name


def test_public_api_surface():
    for name in ["init_process_group", "is_available", "is_initialized", "get_rank", "get_world_size", "get_backend",
                 "new_group", "destroy_process_group", "barrier", "broadcast", "all_reduce", "reduce", "all_gather",
                 "all_gather_object", "broadcast_object_list", "scatter_object_list", "gather", "scatter",
                 "reduce_scatter", "all_to_all", "all_to_all_single", "alltoall_single", "send", "recv", "isend",
                 "irecv", "ReduceOp", "Work", "ProcessGroup", "DistError", "DistTimeoutError", "DistPeerLostError",
                 "DistMismatchError", "DistAbortedError", "DistUnavailableError", "DistInvalidArgument"]:
        assert hasattr(dist, name), name
        assert name in dist.__all__, name
    assert [int(dist.ReduceOp.__members__[n]) for n in ("SUM", "PRODUCT", "MAX", "MIN", "AVG", "BAND", "BOR", "BXOR", "PROD")] == \
        [0, 1, 2, 3, 4, 5, 6, 7, 1]
    import distcomm.distributed as dd

    assert dd.all_reduce is dist.all_reduce


def test_dtype_mapping():
    from distcomm._core import _dc_dtype

    want = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6, "float32": 7, "float64": 8}
    for name, code in want.items():
        assert _dc_dtype(np.dtype(name), "x") == code
    assert _dc_dtype(np.dtype(np.intc), "x") == 2 and _dc_dtype(np.dtype(np.longlong), "x") == 4
    for bad in ("int16", "bool", "complex128", ">i4", "datetime64[s]", "V8"):
        with pytest.raises(dist.DistInvalidArgument):
            _dc_dtype(np.dtype(bad), "x")
    try:
        import ml_dtypes
    except ImportError:
        return
    assert _dc_dtype(np.dtype(ml_dtypes.bfloat16), "x") == 9


def test_timeouts():
    import datetime

    from distcomm._core import _timeout_ms

    assert _timeout_ms(None) == 0
    assert _timeout_ms(datetime.timedelta(minutes=2)) == 120000
    assert _timeout_ms(1.5) == 1500 and _timeout_ms(2) == 2000
    for bad in (0, -1, float("nan"), float("inf"), "10", True):
        with pytest.raises(dist.DistInvalidArgument):
            _timeout_ms(bad)


def test_backend_names():
    from distcomm._core import _backend_arg

    assert _backend_arg(None) is None and _backend_arg("gloo") is None and _backend_arg("GLOO") is None
    assert _backend_arg("cpu:gloo,cuda:nccl") is None
    assert _backend_arg("socket") == "socket" and _backend_arg("nccl") == "nccl"
    with pytest.raises(dist.DistUnavailableError):
        _backend_arg("mpi")


def test_uninitialised_state():
    assert not dist.is_initialized()
    with pytest.raises(dist.DistInvalidUsage, match="init_process_group"):
        dist.get_rank()
    with pytest.raises(dist.DistInvalidUsage):
        dist.barrier()


def test_installed_package_under_test():
    """scripts/test.sh sets DISTCOMM_EXPECT_INSTALLED=1: the tests must exercise what
    `pip install ./python` installed, not the source tree."""
    import os

    if os.environ.get("DISTCOMM_EXPECT_INSTALLED") != "1":
        pytest.skip("only checked by scripts/test.sh")
    assert "site-packages" in dist.__file__, dist.__file__
    assert not dist.__file__.startswith(str(harness.REPO / "python")), dist.__file__
