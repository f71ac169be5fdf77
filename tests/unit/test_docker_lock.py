"""The container image installs only pinned, hashed Python packages (issue 28).

docker/requirements.lock (made by scripts/lock_docker_deps.sh from docker/requirements.in)
must pin every dependency the image needs besides torch: pyproject.toml's dependencies and
its `examples` extra, torch's own requirements (torch goes in alone, --no-deps, checked
against TORCH_SHA256) and the build backend; each entry one version with at least one sha256.
The Dockerfile must install both with --require-hashes. The container test
(tests/integration/test_compose_docker.py) builds the image for real.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCK = ROOT / "docker" / "requirements.lock"


def _lock() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of every entry of the lock."""
    text = LOCK.read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        assert m, f"not a pinned and hashed entry: {line[:120]}"
        out[canonicalize_name(m.group(1))] = (m.group(2), re.findall(r"sha256:([0-9a-f]{64})", m.group(3)))
    return out


def test_every_entry_is_pinned_with_hashes():
    lock = _lock()
    assert lock and all(hashes for _, hashes in lock.values())


def _names(requirements) -> set[str]:
    out = set()
    for r in requirements:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.add(canonicalize_name(req.name))
    return out


def test_lock_covers_the_package_torch_and_the_build_backend():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = _names(project["project"]["dependencies"] + project["project"]["optional-dependencies"]["examples"])
    needed |= _names(project["build-system"]["requires"])
    needed |= _names(importlib.metadata.requires("torch") or [])
    needed.discard("torch")
    missing = needed - set(_lock())
    assert not missing, f"not in docker/requirements.lock: {sorted(missing)}; run scripts/lock_docker_deps.sh"


def test_dockerfile_installs_only_hashed_packages():
    text = (ROOT / "Dockerfile").read_text()
    installs = [line for line in text.replace("\\\n", " ").splitlines()
                if re.search(r"\bpip install\b", line) and not line.lstrip().startswith("#")]
    assert len(installs) == 3, installs
    torch_line, lock_line, package_line = installs
    assert "--require-hashes" in torch_line and "--no-deps" in torch_line and "TORCH_SHA256" in torch_line
    assert "--require-hashes" in lock_line and "docker/requirements.lock" in lock_line
    assert "--no-deps" in package_line and "--no-build-isolation" in package_line and "pip check" in package_line
    assert re.search(r"ARG TORCH_SHA256=[0-9a-f]{64}\b", text)


def test_nothing_refers_to_the_removed_py_spy_wheel():
    import subprocess
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        path = ROOT / name
        if not name or path == pathlib.Path(__file__) or not path.is_file() or path.stat().st_size > 4 << 20:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        assert "py_spy" not in text and "py-spy" not in text.lower(), path
