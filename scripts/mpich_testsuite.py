#!/usr/bin/env python3
"""MPICH's own test suite (test/mpi of github.com/pmodels/mpich), built unmodified with
distcomm's installed mpicc and run by its mpiexec, test list by test list.

    scripts/mpich_testsuite.py --src MPICH/test/mpi --prefix DIR [--dirs "pt2pt coll comm"]
                               [--max-np 8] [--timeout 60] [--out DIR] [--mpich VENV] [--only NAME]

--src: the test/mpi folder of an MPICH source tree (not fetched here: CI machines reach only
package registries; nothing of it is copied into this repository). --prefix: a `make install
PREFIX=DIR` of this repository. The suite's configure step is replaced by a few headers written
into --out (mpitestconf.h and friends: what a Linux/glibc build of it would define).

Each line of a folder's testlist.in runs once (`name ranks arg=... env=...`); lines that need
MPICH's own control variables (env=MPIR_CVAR_...) or more than --max-np ranks are skipped. A
test passes when it exits 0 and prints "No Errors", or, where its line says resultTest=TestStatus
or TestErrFatal (a rank that exits non-zero, an error handler that must end the job, a job
stopped by its time limit), when the job ends with a non-zero status, as MPICH's runtests
judges them. Every job gets MPIEXEC_TIMEOUT (timeLimit=, else --timeout), as runtests sets
it; a job still running 10 s later is killed here (TIMEOUT). MPICH's own expected failures (xfail=) are
reported as such. With --mpich VENV (an `pip install mpich` venv: lib/libmpi_abi.so.1,
bin/mpiexec), a test that fails on distcomm is run again on MPICH's library (the binary is the
standard ABI's, so it runs on either): "fails on MPICH too" tells the test's expectation apart
from ours. Prints one line per test and a summary; exits 1 if a test failed that MPICH passes.
"""
import argparse
import os
import re
import subprocess
import sys
import time

CONF = """/* What the suite's configure would find on Linux with glibc and this MPI (written by
   scripts/mpich_testsuite.py). */
#define HAVE_STRING_H 1
#define HAVE_UNISTD_H 1
#define HAVE_STDLIB_H 1
#define HAVE_STDARG_H 1
#define HAVE_SYS_TIME_H 1
#define HAVE_SYS_RESOURCE_H 1
#define HAVE_GETRUSAGE 1
#define HAVE_INTTYPES_H 1
#define HAVE_STDINT_H 1
#define HAVE_PTHREAD_H 1
#define HAVE_PTHREAD_BARRIER_INIT 1
#define THREAD_PACKAGE_NAME THREAD_PACKAGE_POSIX
#define HAVE_MPI_WIN_CREATE 1
#define HAVE_MPI_IO 1
#define HAVE_LONG_DOUBLE 1
#define HAVE_LONG_LONG 1
#define HAVE__BOOL 1
#define HAVE_FLOAT__COMPLEX 1
#define HAVE_DOUBLE__COMPLEX 1
#define HAVE_LONG_DOUBLE__COMPLEX 1
#define USE_LONG_DOUBLE_COMPLEX 1
#define SIZEOF_INT 4
#define SIZEOF_LONG 8
#define SIZEOF_LONG_LONG 8
#define SIZEOF_VOID_P 8
#define SIZEOF_MPI_OFFSET 8
#define POINTERINT_t intptr_t
"""


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--dirs", default="pt2pt coll comm group datatype")
    ap.add_argument("--max-np", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=60)
    ap.add_argument("--out", default="build/mpich-testsuite")
    ap.add_argument("--mpich", default="")
    ap.add_argument("--only", default="", help="run only the tests of this name")
    a = ap.parse_args()
    src, pfx, out = (os.path.abspath(p) for p in (a.src, a.prefix, a.out))
    mpich = os.path.abspath(a.mpich) if a.mpich else ""  # the tests run in out/run
    mpicc, mpiexec = f"{pfx}/bin/mpicc", f"{pfx}/bin/mpiexec"
    if not os.path.exists(f"{src}/include/mpitest.h") or not os.access(mpicc, os.X_OK):
        sys.exit("--src must be MPICH's test/mpi folder and --prefix a distcomm install")

    # The configure step: headers into out/include (and dtpools' beside it), then the suite's
    # helper objects (mtest, dtpools, the main of the single-function tests).
    inc, dtp, obj, bindir, rundir = (f"{out}/{d}" for d in ("include", "dtp/include", "obj", "bin", "run"))
    for d in (inc, dtp, obj, bindir, rundir):
        os.makedirs(d, exist_ok=True)
    with open(f"{inc}/mpitestconf.h", "w") as f:
        f.write(CONF)
    open(f"{inc}/mtest_mpix.h", "w").close()
    with open(f"{out}/dtp/dtpoolsconf.h", "w") as f:
        f.write("#define HAVE_STRDUP 1\n")
    # The neighbourhood tests test the standard's functions only where MPICH is defined (a
    # guard from before MPI 3); with another library they would pass without testing.
    cflags = ["-O1", "-w", "-DTEST_NEIGHB_COLL=1", f"-I{inc}", f"-I{dtp}", f"-I{src}/include", f"-I{src}/dtpools/include"]
    helpers = [f"{src}/util/{n}.c" for n in ("mtest", "mtest_common", "dtypes")]
    helpers += [f"{src}/dtpools/src/{n}" for n in sorted(os.listdir(f"{src}/dtpools/src")) if n.endswith(".c")]
    objs = []
    for c in helpers:
        o = f"{obj}/{os.path.basename(c)[:-2]}.o"
        r = run([mpicc, *cflags, "-c", c, "-o", o])
        if r.returncode:
            sys.exit(f"building {c} failed:\n{r.stderr}")
        objs.append(o)
    # MPICH's main for tests that define only run() (coll's, mostly), and the thread package:
    # none (mtest_single) but for the threads folder's tests.
    extra = {}
    for n in ("run_mpitests", "mtest_single", "mtest_thread"):
        o = f"{obj}/extra_{n}.o"
        r = run([mpicc, *cflags, "-c", f"{src}/util/{n}.c", "-o", o])
        if r.returncode:
            sys.exit(f"building util/{n}.c failed:\n{r.stderr}")
        extra[n] = o

    def automake(d, name):
        """A program's sources and defines from its folder's Makefile.am (name_SOURCES,
        name_CPPFLAGS), for tests made of shared sources (threads/pt2pt's mt_*); else None."""
        mk = f"{src}/{d}/Makefile.am"
        if not os.path.exists(mk):
            return None
        text = open(mk, errors="replace").read().replace("\\\n", " ")
        var = lambda v: (re.search(rf"^{re.escape(name)}_{v}\s*=(.*)$", text, re.M) or [None, None])[1]
        sources = var("SOURCES")
        if sources is None:
            return None
        defines = [f for f in (var("CPPFLAGS") or "").split() if f.startswith(("-D", "-I")) and "$(" not in f]
        return [f"{src}/{d}/{f}" for f in sources.split()], defines

    def build(d, name):
        exe = f"{bindir}/{d.replace('/', '_')}_{name}"  # (threads/pt2pt: one flat folder)
        c = f"{src}/{d}/{name}.c"
        sources, defines = [c], []
        if not os.path.exists(c):
            made = automake(d, name)
            if made is None:
                return None, "no source"
            sources, defines = made
        text = "".join(open(f, errors="replace").read() for f in sources)
        main = [] if re.search(r"\bmain\s*\(", text) else [extra["run_mpitests"]]
        threads = extra["mtest_thread" if d.startswith("threads") else "mtest_single"]
        r = run([mpicc, *cflags, *defines, f"-I{src}/{d}", *sources, *main, threads, *objs, "-lm", "-lpthread", "-o", exe])
        return (exe, "") if r.returncode == 0 else (None, (r.stderr.strip().splitlines() or ["?"])[-1][:160])

    def attempt(exe, np, args, env, launcher, limit, fails_job):
        t0 = time.time()
        try:
            env = dict(env, MPIEXEC_TIMEOUT=str(limit))
            r = run(["timeout", "-k", "5", str(limit + 10), *launcher, "-n", str(np), exe, *args], env=env, cwd=rundir)
        except OSError as e:
            return "FAIL", str(e)
        text = r.stdout + r.stderr
        tail = " | ".join(text.strip().splitlines()[-3:])[:300]
        if r.returncode in (124, 137) and time.time() - t0 >= limit + 9:
            return "TIMEOUT", tail
        if fails_job:
            return ("pass", "") if r.returncode != 0 else ("FAIL", "exited 0 where the job should fail | " + tail)
        if r.returncode in (124, 137) and time.time() - t0 >= limit - 1:
            return "TIMEOUT", tail  # (stopped by its mpiexec at MPIEXEC_TIMEOUT)
        if r.returncode == 0 and re.search(r"No Errors", text, re.IGNORECASE):
            return "pass", ""
        return "FAIL", tail

    counts, regressions = {}, 0
    for d in a.dirs.split():
        tl = f"{src}/{d}/testlist.in"
        if not os.path.exists(tl):
            tl = f"{src}/{d}/testlist"
        for line in open(tl):
            line = line.strip()
            tok = line.split()
            if not tok or line.startswith("#") or "@" in line or len(tok) < 2 or not tok[1].isdigit():
                continue
            name, np, opts = tok[0], int(tok[1]), tok[2:]
            if (a.only and name != a.only) or any(o.startswith(("env=MPIR_", "env=MPIX_")) for o in opts):
                continue
            exe = None
            if np > a.max_np:
                verdict, why = "skipped", f"{np} ranks"
            else:
                args = [o[4:] for o in opts if o.startswith("arg=")]
                env = dict(os.environ, **dict(o[4:].split("=", 1) for o in opts if o.startswith("env=")))
                limit = min([int(o.split("=")[1]) for o in opts if o.startswith("timeLimit=")] + [a.timeout])
                exe, why = build(d, name)
                t0 = time.time()
                if exe is None:
                    verdict = "BUILD"
                else:
                    fails_job = any(o in ("resultTest=TestStatus", "resultTest=TestErrFatal") for o in opts)
                    verdict, why = attempt(exe, np, args, env, [mpiexec], limit, fails_job)
                    if verdict != "pass" and mpich:
                        menv = dict(env, FI_PROVIDER="shm", LD_LIBRARY_PATH=f"{mpich}/lib")
                        theirs, _ = attempt(exe, np, args, menv, [f"{mpich}/bin/mpiexec"], limit, fails_job)
                        why = ("[fails on MPICH too] " if theirs != "pass" else "[MPICH passes] ") + why
                        regressions += theirs == "pass" and not any(o.startswith("xfail=") for o in opts)
                if exe:
                    why = f"{time.time() - t0:.1f}s {why}"
            if any(o.startswith("xfail=") for o in opts) and verdict != "pass":
                verdict = "xfail"
            counts[(d, verdict)] = counts.get((d, verdict), 0) + 1
            print(f"{verdict:8} {d}: {line}  {why if verdict != 'pass' else ''}", flush=True)
    print("summary:", ", ".join(f"{d} {v} {n}" for (d, v), n in sorted(counts.items())))
    sys.exit(1 if regressions else 0)


if __name__ == "__main__":
    main()
