"""Install torch's CPU build, pinned, into the running Python (scripts/example.sh, scripts/test.sh).

    python scripts/install_torch.py 2.13.0

1. torch of that version already imports here: nothing is installed.
2. PyTorch's CPU index (https://download.pytorch.org/whl/cpu) answers: pip installs from it
   (as an extra index: the CPU build, torch 2.13.0+cpu, wins over PyPI's).
3. Otherwise pip is asked (a dry run: metadata only, nothing downloaded) what `torch==VERSION`
   means with this machine's pip configuration. A CPU build (a local wheel or mirror named in
   pip.conf / PIP_FIND_LINKS / PIP_INDEX_URL, or a platform whose PyPI wheel is CPU-only) is
   installed; a CUDA build (it requires nvidia-* packages: several GB) is refused with what
   to do, unless CRYPTEN_LITE_ALLOW_CUDA_TORCH=1.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def say(text: str) -> None:
    print(f"install_torch: {text}", file=sys.stderr, flush=True)


def installed() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_index_answers(timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"{CPU_INDEX}/torch/", timeout=timeout) as reply:
            return reply.status == 200
    except Exception:  # noqa: BLE001 (unreachable, for whatever reason)
        return False


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], text=True, stdout=subprocess.PIPE)


def resolve(spec: str) -> tuple[str, list[str]]:
    """(URL, nvidia-* requirements) of what `pip install spec` would install here."""
    proc = pip("install", "-q", "--dry-run", "--no-deps", "--ignore-installed", "--report", "-", spec)
    if proc.returncode != 0:
        raise SystemExit(f"install_torch: pip cannot find {spec} (see pip's message above)")
    item = json.loads(proc.stdout)["install"][0]
    needs = [r for r in item["metadata"].get("requires_dist", []) if r.startswith("nvidia-")]
    return item["download_info"]["url"], needs


def main(argv: list[str]) -> int:
    version = argv[0] if argv else "2.13.0"
    spec = f"torch=={version}"
    have = installed()
    if have is not None and have.split("+")[0] == version:
        say(f"torch {have} is installed in {sys.prefix}")
        return 0
    if cpu_index_answers():
        say(f"installing {spec} (CPU build) from PyTorch's CPU index {CPU_INDEX}")
        return pip("install", "-q", "--extra-index-url", CPU_INDEX, spec).returncode
    url, needs = resolve(spec)
    where = url.rsplit("/", 1)[-1]
    if needs and os.environ.get("CRYPTEN_LITE_ALLOW_CUDA_TORCH") != "1":
        say(f"PyTorch's CPU index ({CPU_INDEX}) does not answer from here, and {spec} with this "
            f"machine's pip configuration is {where}, a CUDA build that pulls "
            f"{len(needs)} nvidia-* packages (several GB). Not installed. Either make a CPU wheel "
            f"reachable (PIP_FIND_LINKS=<folder holding torch-{version}+cpu-*.whl>, or "
            "PIP_INDEX_URL=<a mirror of the CPU index>) and rerun, or set "
            "CRYPTEN_LITE_ALLOW_CUDA_TORCH=1 to install the CUDA build anyway.")
        return 1
    say(f"installing {spec}: {where} ({'CUDA build, allowed' if needs else 'CPU build'}; "
        "PyTorch's CPU index does not answer from here, pip's configuration found this one)")
    return pip("install", "-q", spec).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
