"""CrypTen's own unit tests run against crypten_lite.compat (docs/crypten_migration.md, "Measured").

    python benchmarks/crypten_compat_tests.py --crypten PATH_TO_CRYPTEN_CHECKOUT
        [--only test_mpc.TestTFP --only test_optim ...] [--timeout 3600] [--json docs/crypten_compat.json]

PATH is a checkout of facebookresearch/CrypTen (its `test/` folder is what is used; nothing of
CrypTen is installed, imported from the checkout's `crypten/` package, or copied into this
repository). The script:

1. copies the checkout's test files (test_mpc, test_gradients, test_nn, test_crypten,
   test_optim) into a temporary folder `test/`, unmodified, with an empty `__init__.py`;
2. writes `test/multiprocess_test_case.py`: `crypten` aliased to `crypten_lite.compat` by name
   (`crypten_lite.compat.testing.install_alias`), stand-ins for the three CrypTen-private modules
   the files import (`crypten.mpc.primitives`: two empty share classes; `crypten.common.rng`:
   random int64 tensors; `crypten.common.functions.pooling._pool2d_reshape`: the values of each
   pooling window, which test_max_pooling uses to check one-hot indices), and
   `crypten_lite.compat.testing.MultiProcessTestCase` (each test method runs in the parties of
   a persistent PartyPool: separate processes, real gRPC, the dealer for TTP);
3. runs every variant class (TestTFP, TestTTP, Test3PC, TestCrypten; not TestRSS) of each
   file in its own process, without the tests EXCLUDED below (they inspect CrypTen's private
   classes or state), and counts the passes.

One row per (file, variant), as docs/crypten_compat.json holds them: tests in the class, public
tests (less EXCLUDED), passed in this run, the failed tests' names. With --json the rows replace
those of the same file and variant in that file, each with this run's "run" (command, commits,
date, machine); the other rows are kept. Then `python scripts/gen_doc_figures.py` renders the
table and its totals.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
FILES = ("test_mpc", "test_gradients", "test_nn", "test_crypten", "test_optim", "test_privacy_models",
         "test_arithmetic", "test_binary")
VARIANTS = {"TestTFP": "TFP", "TestTTP": "TTP", "Test3PC": "3PC", "TestRSS": "RSS", "TestPTT": "PTT",
            "TestCrypten": "TTP", "TestPrivacyModels": "TTP", "TestArithmetic": "TTP", "TestBinary": "TTP"}
NOTES = {("test_mpc", "TFP"): "2 parties, insecure provider", ("test_mpc", "TTP"): "2 parties + dealer",
         ("test_mpc", "3PC"): "3 parties + dealer", ("test_mpc", "RSS"): "3 parties, crypten_lite's rss protocol",
         ("test_gradients", "PTT"): "plaintext tensors, one party in the test process",
         ("test_crypten", "TTP"): "its default", ("test_privacy_models", "TTP"): "its default"}
# Whole files that test CrypTen's internal share classes (every test builds an
# ArithmeticSharedTensor / BinarySharedTensor): counted, never run.
EXCLUDED_FILES = {
    "test_arithmetic": "every test builds CrypTen's internal ArithmeticSharedTensor",
    "test_binary": "every test builds CrypTen's internal BinarySharedTensor",
}
# Tests of CrypTen's internal share classes (docs/crypten_migration.md lists them): not run.
# Every other test counts, including those that inspect CrypTen's provider (test_tuple_cache)
# and those CrypTen itself skips (test_dropout_module, test_is_initialized: not passed).
# What the rows measured before the exclusions above were narrowed excluded (merge_reruns).
FORMERLY_EXCLUDED = {"test_mpc": ("test_from_shares", "test_ptype", "test_tuple_cache"),
                     "test_nn": ("test_from_shares", "test_dropout_module"), "test_gradients": ("test_batchnorm",)}
EXCLUDED = {
    "test_mpc": {"test_from_shares": "builds shares as CrypTen's ring elements and checks "
                                     "isinstance(x._tensor, ArithmeticSharedTensor / BinarySharedTensor)",
                 "test_ptype": "checks isinstance(x._tensor, ArithmeticSharedTensor / BinarySharedTensor)"},
    "test_nn": {"test_from_shares": "set_parameter_from_shares with shares built as CrypTen's "
                                    "ArithmeticSharedTensor ring elements"},
}

# Stand-ins for the CrypTen-private modules the test files import, one file each in the temporary
# folder (so the parties, separate processes, import them too), and test/multiprocess_test_case.py.
STAND_INS = {
    "crypten.mpc.primitives": ("_compat_primitives", '''
class ArithmeticSharedTensor:  # CrypTen's share classes: no crypten_lite tensor is one
    pass


class BinarySharedTensor:
    pass
'''),
    "crypten.common.rng": ("_compat_rng", '''
import torch


def generate_random_ring_element(size, ring_size=2 ** 64, generator=None, device=None, **kwargs):
    """Random int64 ring elements (test data only)."""
    return torch.randint(-2 ** 63, 2 ** 63 - 1, tuple(size), dtype=torch.long, generator=generator)


def generate_kbit_random_tensor(size, bitlength=None, generator=None, device=None, **kwargs):
    """Random non-negative int64 values of `bitlength` bits (test data only)."""
    bits = 62 if bitlength is None else min(int(bitlength), 62)
    return torch.randint(0, 2 ** bits, tuple(size), dtype=torch.long, generator=generator)
'''),
    "crypten.common.functions.pooling": ("_compat_pooling", '''
import torch
import torch.nn.functional as F


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _pool2d_reshape(x, kernel_size, padding=0, stride=None, dilation=1, ceil_mode=False, pad_value=0):
    """The values of every pooling window, (..., out_h, out_w, k_h * k_w), and the output size."""
    k, p, d = _pair(kernel_size), _pair(padding), _pair(dilation)
    s = _pair(stride if stride is not None else kernel_size)
    lead, (h, w) = x.shape[:-2], x.shape[-2:]
    out, extra = [], []
    for n, ki, pi, si, di in ((h, k[0], p[0], s[0], d[0]), (w, k[1], p[1], s[1], d[1])):
        span = n + 2 * pi - di * (ki - 1) - 1
        o = (-(-span // si) if ceil_mode else span // si) + 1
        if ceil_mode and (o - 1) * si >= n + pi:  # torch: the last window starts inside the input
            o -= 1
        out.append(o)
        extra.append(max(0, (o - 1) * si + di * (ki - 1) + 1 - (n + 2 * pi)))
    padded = F.pad(x.reshape(-1, 1, h, w).double(), (p[1], p[1] + extra[1], p[0], p[0] + extra[0]), value=pad_value)
    cols = F.unfold(padded, k, dilation=d, stride=s)  # (B, k_h * k_w, out_h * out_w)
    windows = cols.transpose(1, 2).reshape(*lead, out[0], out[1], k[0] * k[1]).to(x.dtype)
    return windows, torch.Size((*lead, out[0], out[1]))
'''),
}
HARNESS = f'''"""Written by benchmarks/crypten_compat_tests.py: CrypTen's test files on crypten_lite.compat."""
from crypten_lite.compat.testing import install_alias

install_alias({ {name: module for name, (module, _) in STAND_INS.items()}!r})

from crypten_lite.compat.testing import (MultiProcessTestCase, get_random_linear,  # noqa: E402,F401
                                         get_random_test_tensor, onehot)
'''

# Run in the temporary folder: one class, its public tests; prints one JSON line.
RUNNER = '''
import importlib, json, sys, unittest
import test.multiprocess_test_case  # the alias first: the files import crypten before it
module, cls_name, excluded = sys.argv[1], sys.argv[2], set(sys.argv[3:])
cls = getattr(importlib.import_module("test." + module), cls_name)
names = unittest.TestLoader().getTestCaseNames(cls)
public = [] if "*" in excluded else [n for n in names if n not in excluded]
result = unittest.TextTestRunner(stream=sys.stderr, verbosity=1).run(
    unittest.TestSuite(cls(n) for n in public))
failed = sorted({t.id().rsplit(".", 1)[-1] for t, _ in result.failures + result.errors})
skipped = sorted({t.id().rsplit(".", 1)[-1] for t, _ in result.skipped})
errors = {t.id().rsplit(".", 1)[-1]: tb[-1500:] for t, tb in result.failures + result.errors}
print("RESULT " + json.dumps({"tests_in_file": len(names), "public": len(public),
                              "passed": len(public) - len(failed) - len(skipped), "failed": failed,
                              "skipped": skipped, "errors": errors}))
'''

# Run in the temporary folder: the named tests of one class, each on its own (--rerun).
RUNNER_TESTS = '''
import importlib, json, sys, unittest
import test.multiprocess_test_case
module, cls_name, names = sys.argv[1], sys.argv[2], sys.argv[3:]
cls = getattr(importlib.import_module("test." + module), cls_name)
all_names = unittest.TestLoader().getTestCaseNames(cls)
result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(unittest.TestSuite(cls(n) for n in names))
failed = sorted({t.id().rsplit(".", 1)[-1] for t, _ in result.failures + result.errors})
skipped = sorted({t.id().rsplit(".", 1)[-1] for t, _ in result.skipped})
errors = {t.id().rsplit(".", 1)[-1]: tb[-1500:] for t, tb in result.failures + result.errors}
print("RESULT " + json.dumps({"tests_in_file": len(all_names), "ran": names, "failed": failed, "skipped": skipped,
                              "errors": errors}))
'''

VARIANT_CLASSES = '''
import importlib, json, sys, unittest
import test.multiprocess_test_case
module = importlib.import_module("test." + sys.argv[1])
print(json.dumps([n for n, c in vars(module).items() if isinstance(c, type) and issubclass(c, unittest.TestCase)
                  and c.__module__ == module.__name__]))
'''


def _test_source(crypten: pathlib.Path, f: str) -> bytes | None:
    """CrypTen's test/<f>.py from a checkout, or from a bare git directory (its HEAD)."""
    if (crypten / "test" / f"{f}.py").exists():
        return (crypten / "test" / f"{f}.py").read_bytes()
    done = subprocess.run(["git", "--git-dir", str(crypten), "show", f"HEAD:test/{f}.py"], capture_output=True)
    return done.stdout if done.returncode == 0 else None


def prepare(crypten: pathlib.Path, folder: pathlib.Path, files: list[str]) -> None:
    tests = crypten / "test"
    sources = {f: _test_source(crypten, f) for f in files}
    missing = [f for f, src in sources.items() if src is None]
    if missing:
        raise SystemExit(f"{tests}: no {', '.join(f + '.py' for f in missing)} (give a CrypTen checkout "
                         "or its bare git directory)")
    (folder / "test").mkdir()
    (folder / "test" / "__init__.py").write_text("")
    (folder / "test" / "multiprocess_test_case.py").write_text(HARNESS)
    for module, source in STAND_INS.values():
        (folder / f"{module}.py").write_text(source.lstrip())
    for f in files:
        (folder / "test" / f"{f}.py").write_bytes(sources[f])


def run_python(folder: pathlib.Path, code: str, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code, *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=timeout)


def run(crypten: pathlib.Path, only: list[str], timeout: float) -> list[dict]:
    files = [f for f in FILES if not only or any(o.split(".")[0] == f for o in only)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="crypten-compat-") as tmp:
        folder = pathlib.Path(tmp)
        prepare(crypten, folder, files)
        for f in files:
            found = run_python(folder, VARIANT_CLASSES, [f], 600)
            if found.returncode:  # the file does not import: every test of it counts as failed
                error = found.stderr.strip().splitlines()[-1] if found.stderr.strip() else "no output"
                print(f"{f}: cannot import it on crypten_lite.compat:\n{found.stderr[-3000:]}", file=sys.stderr)
                count = len(re.findall(r"^\s+def test", (folder / "test" / f"{f}.py").read_text(), re.M))
                rows.append({"file": f, "variant": "TTP", "variant_note": NOTES.get((f, "TTP"), ""),
                             "tests_in_file": count, "public": count, "first_run": 0, "verified": None,
                             "failed": [f"(the file does not import: {error})"], "seconds": 0.0})
                print(json.dumps(rows[-1]), flush=True)
                continue
            classes = [c for c in json.loads(found.stdout) if c in VARIANTS
                       and (f in only or f"{f}.{c}" in only or not only)]
            for cls in classes:
                start = time.perf_counter()
                excluded = ["*"] if f in EXCLUDED_FILES else sorted(EXCLUDED.get(f, {}))
                try:
                    done = run_python(folder, RUNNER, [f, cls, *excluded], timeout)
                    out, err, code = done.stdout, done.stderr, done.returncode
                except subprocess.TimeoutExpired as e:
                    out, err, code = (e.stdout or b"").decode(), (e.stderr or b"").decode(), "timeout"
                line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
                if line is None:  # the class did not finish: recorded as no test passed
                    print(f"{f}.{cls} gave no result (exit {code}):\n{err[-3000:]}", file=sys.stderr)
                    r = {"tests_in_file": None, "public": None, "passed": 0, "failed": ["(no result)"]}
                else:
                    r = json.loads(line[7:])
                variant = VARIANTS[cls]
                rows.append({"file": f, "variant": variant, "variant_note": NOTES.get((f, variant), ""),
                             "tests_in_file": r["tests_in_file"], "public": r["public"], "first_run": r["passed"],
                             "verified": None, "failed": r["failed"],
                             "seconds": round(time.perf_counter() - start, 1)})
                if r.get("errors"):  # each failing test's traceback (its end): diagnosable later
                    rows[-1]["errors"] = r["errors"]
                if f in EXCLUDED_FILES:
                    rows[-1]["excluded_reason"] = EXCLUDED_FILES[f]
                else:
                    rows[-1]["excluded"] = {n: EXCLUDED[f][n] for n in sorted(EXCLUDED.get(f, {}))}
                print(json.dumps(rows[-1]), flush=True)
    return rows


def rerun(crypten: pathlib.Path, tests: list[str], timeout: float) -> list[dict]:
    """Run single tests (FILE.CLASS.TEST) of a class on their own: one result per class with the
    tests run, failed and skipped (merged into that class's row by merge_reruns)."""
    by_class: dict = {}
    for t in tests:
        f, cls, name = t.split(".")
        by_class.setdefault((f, cls), []).append(name)
    out = []
    with tempfile.TemporaryDirectory(prefix="crypten-compat-") as tmp:
        folder = pathlib.Path(tmp)
        prepare(crypten, folder, sorted({f for f, _ in by_class}))
        for (f, cls), names in by_class.items():
            start = time.perf_counter()
            done = run_python(folder, RUNNER_TESTS, [f, cls, *names], timeout)
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"{f}.{cls} {names} gave no result:\n{done.stderr[-3000:]}", file=sys.stderr)
                r = {"tests_in_file": None, "ran": names, "failed": names, "skipped": []}
            else:
                r = json.loads(line[7:])
            r.update(file=f, variant=VARIANTS[cls], seconds=round(time.perf_counter() - start, 1))
            print(json.dumps(r), flush=True)
            out.append(r)
    return out


def merge_reruns(path: pathlib.Path, results: list[dict], run_info: dict) -> None:
    """Fold single-test runs into the rows. A test excluded when the row was measured (listed in
    the row's "excluded", or in FORMERLY_EXCLUDED for rows measured before that field) is counted
    from now on ("public" + 1, named in "newly_counted"). A test that passes on its own joins
    "verified_tests" ("verified" = first_run + those); one that fails or is skipped is listed in
    "failed" (which also keeps the whole-class run's failures). Each rerun keeps its own run record in "reruns"."""
    data = json.loads(path.read_text())
    rows = {(r["file"], r["variant"]): r for r in data["rows"]}
    for res in results:
        row = rows[(res["file"], res["variant"])]
        failed, verified = set(row["failed"]), set(row.get("verified_tests", []))
        newly = set(row.get("newly_counted", []))
        was_excluded = set(row.get("excluded", FORMERLY_EXCLUDED.get(res["file"], ())))
        for name in res["ran"]:
            if name in was_excluded and name not in newly:
                newly.add(name)
                row["public"] += 1
            if name in res["failed"] or name in res["skipped"]:
                failed.add(name)
                verified.discard(name)
            elif name in failed or name in newly:  # "failed" keeps the whole-class run's failures
                verified.add(name)
        row["failed"], row["verified_tests"] = sorted(failed), sorted(verified)
        row["verified"] = row["first_run"] + len(verified) if verified else None
        if newly:
            row["newly_counted"] = sorted(newly)
            row["excluded"] = {n: EXCLUDED.get(res["file"], {}).get(n, "") for n in sorted(was_excluded - newly)}
        row.setdefault("reruns", []).append({**run_info, "tests": res["ran"], "failed": res["failed"],
                                             "skipped": res["skipped"],
                                             **({"errors": res["errors"]} if res.get("errors") else {})})
    _write(path, data)


def _write(path: pathlib.Path, data: dict) -> None:
    rows_text = ",\n".join("  " + json.dumps(r) for r in data["rows"])
    head = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items() if k != "rows")
    path.write_text("{\n" + head + ',\n "rows": [\n' + rows_text + "\n ]\n}\n")


def tree_state() -> dict:
    """The commit and the uncommitted files of the library (crypten_lite/) right now: the
    classes import the working tree, which other work in the same checkout may be changing
    (a record names the commit at its start and any file that differed from it)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = [ln[3:] for ln in git("status", "--porcelain", "--untracked-files=no", "--", "crypten_lite").splitlines()]
    return {"commit_at_start": git("rev-parse", "--short", "HEAD") or "unknown", "uncommitted_at_start": dirty}


START: dict = {}


def run_record(crypten: pathlib.Path, argv: list[str]) -> dict:
    def git(*args: str, cwd: pathlib.Path) -> str:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
        return done.stdout.strip() or "unknown"
    return {"command": "python benchmarks/crypten_compat_tests.py " + " ".join(argv),
            "commit": git("rev-parse", "--short", "HEAD", cwd=REPO),
            "crypten_commit": git("--git-dir", str(crypten if (crypten / "HEAD").exists() else crypten / ".git"),
                                  "rev-parse", "--short", "HEAD", cwd=REPO),
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "machine": f"{os.cpu_count()} cores, 1-minute load average {os.getloadavg()[0]:.1f} at the end",
            **START}


def update(path: pathlib.Path, rows: list[dict], crypten: pathlib.Path, argv: list[str]) -> None:
    """Replace the rows of the same (file, variant) in docs/crypten_compat.json, each new row
    with its own "run" (how, when, where); the other rows keep theirs."""
    def git(*args: str, cwd: pathlib.Path) -> str:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
        return done.stdout.strip() or "unknown"
    run_info = {"command": "python benchmarks/crypten_compat_tests.py " + " ".join(argv),
                "commit": git("rev-parse", "--short", "HEAD", cwd=REPO),
                "crypten_commit": git("rev-parse", "--short", "HEAD", cwd=crypten),
                "date": time.strftime("%Y-%m-%d", time.gmtime()),
                "machine": f"{os.cpu_count()} cores, 1-minute load average {os.getloadavg()[0]:.1f} at the end",
                **START}
    data = json.loads(path.read_text())
    old = {(r["file"], r["variant"]): r for r in data["rows"]}
    for r in rows:
        note = old.get((r["file"], r["variant"]), {}).get("variant_note")
        old[(r["file"], r["variant"])] = {**r, "variant_note": note if note is not None else r["variant_note"],
                                          "run": run_info}
    order = [(f, v) for f in FILES for v in ("TFP", "TTP", "3PC", "RSS", "PTT")]
    data["rows"] = sorted(old.values(), key=lambda r: order.index((r["file"], r["variant"]))
                          if (r["file"], r["variant"]) in order else len(order))
    rows_text = ",\n".join("  " + json.dumps(r) for r in data["rows"])
    head = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items() if k != "rows")
    path.write_text("{\n" + head + ',\n "rows": [\n' + rows_text + "\n ]\n}\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--crypten", type=pathlib.Path, default=pathlib.Path("/work/.mirror/facebookresearch+CrypTen/repo"),
                        help="a checkout of facebookresearch/CrypTen, or its bare git directory")
    parser.add_argument("--only", action="append", default=[], metavar="FILE[.CLASS]",
                        help=f"run only these files or classes (files: {', '.join(FILES)})")
    parser.add_argument("--rerun", action="append", default=[], metavar="FILE.CLASS.TEST",
                        help="run these tests on their own and fold them into their rows (needs --json)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per class")
    parser.add_argument("--json", type=pathlib.Path, default=None,
                        help="update this JSON source (docs/crypten_compat.json) with the rows")
    args = parser.parse_args(argv)
    START.update(tree_state())
    unknown = [o for o in args.only if o.split(".")[0] not in FILES]
    if unknown:
        parser.error(f"unknown files {unknown}; known: {list(FILES)}")
    if args.rerun:
        bad = [t for t in args.rerun if t.count(".") != 2 or t.split(".")[0] not in FILES
               or t.split(".")[1] not in VARIANTS]
        if bad or not args.json:
            parser.error(f"--rerun takes FILE.CLASS.TEST with --json (bad: {bad})")
        results = rerun(args.crypten.resolve(), args.rerun, args.timeout)
        merge_reruns(args.json, results, run_record(args.crypten.resolve(), argv))
        return 0
    rows = run(args.crypten.resolve(), args.only, args.timeout)
    if args.json:
        update(args.json, rows, args.crypten.resolve(), argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
