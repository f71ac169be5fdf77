"""CrypTen's official tutorials (1-5 and 7) run on crypten_lite.compat under nbclient.

    python benchmarks/crypten_tutorials.py [--crypten PATH] [--only 2 --only 5 ...]
        [--timeout 600] [--json docs/crypten_tutorials.json] [--keep DIR]

PATH is CrypTen's repository: a checkout, or a bare git directory (read with `git show
HEAD:...`); default /work/.mirror/facebookresearch+CrypTen/repo. Nothing of CrypTen is
installed or copied into this repository: the files are extracted into a temporary folder laid
out as CrypTen's repository is (`tutorials/`, `tutorials/models/`, `examples/`), and each
notebook runs there with `tutorials/` as its working folder and the folder on PYTHONPATH (as
CrypTen's own install puts its `examples` package), in a kernel of this Python.

The rewrite is mechanical and minimal; it is exactly this, and nothing else is changed:

1. Import lines, in every notebook code cell and in the CrypTen files a tutorial imports
   (Tutorial 3's `examples` package: `examples/mpc_linear_svm/mpc_linear_svm.py`,
   `examples/meters.py`, `examples/multiprocess_launcher.py`, `examples/util.py`):
   `import crypten`                 -> `import crypten_lite.compat as crypten`
   `import crypten.X as Y`          -> `import crypten_lite.compat.X as Y`
   `from crypten import ...`        -> `from crypten_lite.compat import ...`
   `from crypten.X import ...`      -> `from crypten_lite.compat.X import ...`
2. Data (there is no internet here, and no torchvision): in `tutorials/mnist_utils.py` the
   line `from torchvision import datasets, transforms` is replaced by DATA_STAND_IN below:
   `datasets.MNIST(dir, download=True, train=...)` gives random uint8 images and random
   labels 0-9 of MNIST's shapes (60,000 / 10,000 x 28 x 28), and
   `transforms.functional.normalize(t, mean, std)` is (t - mean) / std. The rest of
   mnist_utils.py (normalising, splitting, saving to /tmp) runs unchanged.
3. Environment, no code: Tutorial 4 calls `torch.load` itself on CrypTen's model file, saved by
   torch 1.x in its legacy format (with the class's source), which only weights_only=False
   reads; torch 2.6 changed that default, so Tutorial 4's kernel gets
   TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (torch's own switch back to the old default). The
   crypten calls need nothing: load_from_party reads the owner's own file.

Each notebook runs with nbclient (allow_errors, `--timeout` seconds per cell, the kernel
interrupted at a timeout). One record per tutorial in the JSON: code cells, cells run, the cells
that failed with the first line of their error, seconds, and the semantic checks in CHECKS
(what the tutorial prints must follow CrypTen's semantics, e.g. each rank's shares differ).
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
KERNEL = "crypten-lite-tutorials"
MIRROR = pathlib.Path("/work/.mirror/facebookresearch+CrypTen/repo")
TUTORIALS = {
    1: "Tutorial_1_Basics_of_CrypTen_Tensors",
    2: "Tutorial_2_Inside_CrypTensors",
    3: "Tutorial_3_Introduction_to_Access_Control",
    4: "Tutorial_4_Classification_with_Encrypted_Neural_Networks",
    5: "Tutorial_5_Under_the_hood_of_Encrypted_Networks",
    7: "Tutorial_7_Training_an_Encrypted_Neural_Network",
}
# Files besides the notebooks, as they lie in CrypTen's repository (REWRITTEN: imports rewritten).
FILES = ["tutorials/mnist_utils.py", "tutorials/models/tutorial4_alice_model.pth",
         "examples/__init__.py", "examples/meters.py", "examples/multiprocess_launcher.py", "examples/util.py",
         "examples/mpc_linear_svm/mpc_linear_svm.py"]
REWRITTEN = {"examples/meters.py", "examples/multiprocess_launcher.py", "examples/util.py",
             "examples/mpc_linear_svm/mpc_linear_svm.py"}
# Environment of a tutorial's kernel (no code changed): Tutorial 4's own `torch.load` of CrypTen's
# model file (torch 1.x's legacy format, which stores the class's source) needs
# weights_only=False, torch's default before 2.6; this restores that default for its kernel.
ENVIRONMENT = {4: {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}}

IMPORTS = [  # (pattern, replacement), applied line by line
    (re.compile(r"^(\s*)import crypten\s*$"), r"\1import crypten_lite.compat as crypten"),
    (re.compile(r"^(\s*)import crypten\.([\w.]+) as (\w+)\s*$"), r"\1import crypten_lite.compat.\2 as \3"),
    (re.compile(r"^(\s*)from crypten import "), r"\1from crypten_lite.compat import "),
    (re.compile(r"^(\s*)from crypten\.([\w.]+) import "), r"\1from crypten_lite.compat.\2 import "),
]
TORCHVISION_LINE = "from torchvision import datasets, transforms"
DATA_STAND_IN = '''# crypten_lite's tutorial runner: random data of MNIST's shapes (no internet, no torchvision)
class _RandomMNIST:
    def __init__(self, dir, download=True, train=True):
        n = 60000 if train else 10000
        self.data = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8)
        self.targets = torch.randint(0, 10, (n,), dtype=torch.int64)


class datasets:
    MNIST = _RandomMNIST


class transforms:
    class functional:
        @staticmethod
        def normalize(t, mean, std):
            return (t - mean) / std'''


def rewrite_imports(source: str) -> tuple[str, int]:
    """The import substitution; returns the new source and how many lines it changed."""
    lines, changed = [], 0
    for line in source.split("\n"):
        new = line
        for pattern, repl in IMPORTS:
            new = pattern.sub(repl, new)
        changed += new != line
        lines.append(new)
    return "\n".join(lines), changed


def read(crypten: pathlib.Path, path: str) -> bytes:
    if (crypten / path).exists():
        return (crypten / path).read_bytes()
    done = subprocess.run(["git", "--git-dir", str(crypten), "show", f"HEAD:{path}"], capture_output=True)
    if done.returncode:
        raise SystemExit(f"{crypten}: cannot read {path}: {done.stderr.decode().strip()}")
    return done.stdout


def prepare(crypten: pathlib.Path, folder: pathlib.Path, numbers: list[int]) -> dict:
    """Extract and rewrite; returns {tutorial number: import lines changed}."""
    for path in FILES:
        data = read(crypten, path)
        if path in REWRITTEN:
            data = rewrite_imports(data.decode())[0].encode()
        elif path == "tutorials/mnist_utils.py":
            text = data.decode()
            if TORCHVISION_LINE not in text:
                raise SystemExit(f"{path}: no line {TORCHVISION_LINE!r} to replace (CrypTen changed it)")
            data = text.replace(TORCHVISION_LINE, DATA_STAND_IN).encode()
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    import nbformat
    changed = {}
    for n in numbers:
        nb = nbformat.reads(read(crypten, f"tutorials/{TUTORIALS[n]}.ipynb").decode(), as_version=4)
        changed[n] = 0
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.source, k = rewrite_imports(cell.source)
                changed[n] += k
        nbformat.write(nb, folder / "tutorials" / f"{TUTORIALS[n]}.ipynb")
    return changed


def _text(outputs) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


def _check_ranks_differ(outputs) -> tuple[bool, str]:
    """Tutorial 2: the share each rank prints differs (a tensor([...]) after 'Rank r')."""
    text = _text(outputs)
    shares = re.findall(r"Rank (\d+):\s*\n?\s*(?:MPCTensor\()?[^\n]*?_tensor=(tensor\([^)]*\))", text, re.S)
    if len(shares) < 2:
        shares = re.findall(r"Rank (\d+):[\s\S]*?(tensor\([^)]*\))", text)
    ranks = {r for r, _ in shares}
    values = {s for _, s in shares}
    return (len(ranks) >= 2 and len(values) == len(shares)), f"ranks {sorted(ranks)}, distinct shares {len(values)}"


def _check_contains(*needles: str):
    def check(outputs) -> tuple[bool, str]:
        text = _text(outputs)
        missing = [n for n in needles if n not in text]
        return not missing, ("printed " + ", ".join(repr(n) for n in needles)) if not missing else f"missing {missing}"
    return check


def _check_step_through(outputs) -> tuple[bool, str]:
    """Tutorial 5: each rank prints its own share after the first layer (they differ), every
    layer's output is encrypted, and the output decrypts."""
    text = _text(outputs)
    shares = re.findall(r"Rank: (\d+)\n\tShares after First Linear Layer:(tensor\([^)]*\))", text)
    ok = (len(shares) == 2 and shares[0][1] != shares[1][1] and "Output Encrypted: False" not in text.split(
        "Decrypted output")[0] and "Decrypted output" in text)
    return ok, f"ranks {[r for r, _ in shares]}, shares differ: {len({s for _, s in shares}) == len(shares)}"


# (tutorial, code cell index in the notebook, name, check): what the output must show.
CHECKS = [
    (1, 3, "decrypts what it encrypted", _check_contains("tensor([1., 2., 3.])", "tensor([4., 5., 6.])")),
    (2, 5, "each rank's arithmetic shares differ", _check_ranks_differ),
    (2, 7, "each rank's binary shares differ", _check_ranks_differ),
    (2, 9, "conversion keeps the value", _check_contains("plaintext: tensor([1., 2., 3.])")),
    (2, 11, "every source's value decrypts", _check_contains("Source 0: 0", "Source 1: 1", "Source 2: 2")),
    (3, 11, "data labeling: trained on the split data, tested", _check_contains("Test accuracy")),
    (3, 17, "model hiding: the hidden true model classifies the test set", _check_contains("Test accuracy 100.00%")),
    (4, 14, "the private model's output is encrypted", _check_contains("Output tensor encrypted: True")),
    (5, 5, "the encrypted layer's result decrypts", _check_contains("Decrypted result:")),
    (5, 8, "the scaling layer scales by 5", _check_contains("tensor([[5., 5., 5.],")),
    (5, 18, "the step-through's shares differ per rank", _check_step_through),
    (7, 9, "encrypted training prints each epoch's loss", _check_contains("Epoch: 0 Loss:", "Epoch: 1 Loss:")),
    (7, 11, "the feature split's sizes", _check_contains("torch.Size([100, 28, 20])", "torch.Size([100, 28, 8])")),
]


def run_one(folder: pathlib.Path, n: int, timeout: float) -> dict:
    import nbformat
    from nbclient import NotebookClient
    saved = {k: os.environ.get(k) for k in ENVIRONMENT.get(n, {})}
    os.environ.update(ENVIRONMENT.get(n, {}))
    try:
        return _run_one(folder, n, timeout, nbformat, NotebookClient)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_one(folder: pathlib.Path, n: int, timeout: float, nbformat, NotebookClient) -> dict:
    path = folder / "tutorials" / f"{TUTORIALS[n]}.ipynb"
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL, allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    error = None
    try:
        client.execute()
    except Exception as e:  # the kernel died or would not start: recorded, the next tutorial runs
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    failed = []
    for i, c in code:
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                first = (o.get("evalue") or "").strip().splitlines()
                failed.append({"cell": i, "error": f"{o.get('ename')}: {first[0] if first else ''}"[:300]})
    checks = []
    for t, i, name, check in CHECKS:
        if t == n:
            ok, detail = check(nb.cells[i].get("outputs", []))
            checks.append({"cell": i, "check": name, "ok": ok, "detail": detail})
    ran = sum(1 for _, c in code if c.get("execution_count") is not None)
    record = {"tutorial": n, "notebook": f"tutorials/{TUTORIALS[n]}.ipynb",
              "environment": ENVIRONMENT.get(n, {}), "code_cells": len(code),
              "cells_run": ran, "cells_failed": failed, "checks": checks,
              "seconds": round(time.perf_counter() - start, 1)}
    if error:
        record["runner_error"] = error
    nbformat.write(nb, path)  # the executed notebook, for --keep
    return record


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--crypten", type=pathlib.Path, default=MIRROR,
                        help="CrypTen's repository: a checkout or a bare git directory")
    parser.add_argument("--only", type=int, action="append", default=[], choices=sorted(TUTORIALS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per cell")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write the records here")
    parser.add_argument("--keep", type=pathlib.Path, default=None, help="run (and keep) the files in this folder")
    args = parser.parse_args(argv)
    numbers = args.only or sorted(TUTORIALS)
    with tempfile.TemporaryDirectory(prefix="crypten-tutorials-") as tmp:
        folder = args.keep or pathlib.Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        changed = prepare(args.crypten, folder, numbers)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(folder), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        # the kernel is this Python (a kernel spec of its own, found first on JUPYTER_PATH)
        spec = folder / "kernels" / "kernels" / KERNEL
        spec.mkdir(parents=True, exist_ok=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "crypten_lite tutorials", "language": "python"}))
        os.environ["JUPYTER_PATH"] = os.pathsep.join(
            p for p in (str(folder / "kernels"), os.environ.get("JUPYTER_PATH", "")) if p)
        records = []
        for n in numbers:
            record = run_one(folder, n, args.timeout)
            record["import_lines_rewritten"] = changed[n]
            records.append(record)
            print(json.dumps(record), flush=True)
    if args.json:
        def git(*a: str, git_dir: pathlib.Path | None = None) -> str:
            cmd = ["git", *(["--git-dir", str(git_dir)] if git_dir else []), *a]
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            return done.stdout.strip() or "unknown"
        old = json.loads(args.json.read_text())["tutorials"] if args.json.exists() else []
        new = {r["tutorial"]: r for r in old}
        new.update({r["tutorial"]: r for r in records})
        crypten_dir = args.crypten if (args.crypten / "HEAD").exists() else args.crypten / ".git"
        data = {"about": "CrypTen's tutorials on crypten_lite.compat, written by benchmarks/crypten_tutorials.py "
                         "(its docstring lists the rewrite: import lines, and MNIST replaced by random data)",
                "run": {"command": "python benchmarks/crypten_tutorials.py " + " ".join(argv),
                        "commit": git("rev-parse", "--short", "HEAD"),
                        "crypten_commit": git("rev-parse", "--short", "HEAD", git_dir=crypten_dir),
                        "date": time.strftime("%Y-%m-%d", time.gmtime()),
                        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end"},
                "tutorials": [new[k] for k in sorted(new)]}
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    bad = [r["tutorial"] for r in records if r["cells_failed"] or r.get("runner_error")
           or not all(c["ok"] for c in r["checks"]) or r["cells_run"] < r["code_cells"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
