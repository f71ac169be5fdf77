"""docker-compose.yml for real: the image built from the Dockerfile, the documented command.

1. A Docker engine: scripts/docker_engine.sh installs Debian's docker.io, docker-compose,
   containerd, runc, iptables and debootstrap when missing, and starts dockerd when none
   answers (this test stops the dockerd it started, at the end).
2. The base image: no image registry is reachable on the CI machines, so
   scripts/docker_base_image.sh builds a stand-in for python:3.11-slim with debootstrap
   (Debian 12, Python 3.11), once; it stays in the engine as crypten-lite-base:bookworm.
3. The image: `docker build` of the repository's Dockerfile with BASE_IMAGE set to that base
   and torch from where this machine's pip finds it (`pip download torch==<installed>`, served
   to the build over HTTP on the docker bridge), which here is the CPU-only wheel, as the
   Dockerfile's default index gives users. Docker's layer cache makes a second build fast.
4. The run: exactly the command README.md and docs/deployment.md give (they must agree), less
   `--build` (the image of step 3 stands in for compose's own build, which would need the
   public base image and PyTorch's index): the certs job, the dealer (healthy before the
   parties start), party1 (healthy before party0 starts), party0, which prints the private
   predictions; exit code 0 from every finished container, each service seeing only its own
   key, then `down --volumes`, after which no container, volume or network of the project is
   left.
5. The rss variant (docker-compose.rss.yml: three parties, protocol rss, no dealer) with the
   same image, not rebuilt, under its own project name: every service exits 0, party0's
   predictions equal plaintext torch's on all three parties, then `down --volumes`.

This test changes the machine (system packages, a root dockerd, a few GB in Docker's data folder
and in /var/tmp/crypten-lite-docker), so it runs only with CRYPTEN_LITE_SYSTEM_TESTS=1 (.ci/run sets
it; tests/conftest.py's `system_tests` marker); otherwise it is skipped, saying so.
CRYPTEN_LITE_SKIP_DOCKER=1 still switches it off. Where it is on and the engine cannot run, it
FAILS with the reason. Other variables:
CRYPTEN_LITE_DOCKER_BASE (a base image to use instead of building one, e.g. python:3.11-slim
where a registry is reachable), CRYPTEN_LITE_COMPOSE ("docker compose" or "docker-compose";
default: v2 when the docker CLI has it, else v1).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import threading
from typing import Iterator

import pytest

import compose_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600), pytest.mark.system_tests(
    "apt-installs docker.io, docker-compose, containerd, runc, iptables and debootstrap, starts a "
    "root dockerd and keeps about 3 GB of images")]

REPO = pathlib.Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCS = (REPO / "README.md", REPO / "docs" / "deployment.md")
IMAGE = "crypten-lite:latest"  # docker-compose.yml's image name
BASE_IMAGE = "crypten-lite-base:bookworm"
TORCH_CACHE = pathlib.Path("/var/tmp/crypten-lite-docker/torch")
WHEEL_PORT = 38765  # fixed, so that the torch layer's build arguments (and cache) stay the same
# Docker's CLI is Debian's /usr/bin/docker; another docker CLI may come first on PATH.
ENV = {**os.environ, "PATH": "/usr/bin:/usr/sbin:/bin:/sbin:" + os.environ.get("PATH", "")}
BUILD_TIMEOUT = 2400
UP_TIMEOUT = 900
PREDICTION = re.compile(r"private prediction: (\[[\d, ]*\])")

if os.environ.get("CRYPTEN_LITE_SKIP_DOCKER") == "1":
    pytestmark.append(pytest.mark.skip(reason="CRYPTEN_LITE_SKIP_DOCKER=1"))


def _run(argv: list[str], timeout: float, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, env=ENV, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output
        pytest.fail(f"{shlex.join(argv)} did not finish within {timeout} s:\n{out}")
    if check and proc.returncode != 0:
        pytest.fail(f"{shlex.join(argv)} exited {proc.returncode}:\n{proc.stdout[-6000:]}")
    return proc


def documented_command() -> list[str]:
    """The `docker compose up ...` command of README.md and docs/deployment.md (equal)."""
    found = {}
    for doc in DOCS:
        lines = [line.split("#")[0].strip() for line in doc.read_text().splitlines()
                 if line.startswith("docker compose up")]
        assert len(lines) == 1, f"{doc.name}: expected one `docker compose up` line, got {lines}"
        found[doc.name] = lines[0]
    assert len(set(found.values())) == 1, f"the docs disagree on the command: {found}"
    header = COMPOSE_FILE.read_text()
    command = found[DOCS[0].name]
    assert f"#   {command}\n" in header, "docker-compose.yml's header gives another command"
    return shlex.split(command)


@pytest.fixture(scope="module")
def engine(announce) -> Iterator[None]:
    """A Docker engine that answers (started here if needed, and then stopped at the end)."""
    announce("container test: making a Docker engine answer (scripts/docker_engine.sh: installs "
             "Debian's docker.io & co. with apt-get where missing, starts dockerd; minutes the "
             "first time)")
    proc = _run(["bash", str(REPO / "scripts" / "docker_engine.sh")], timeout=1500, check=False)
    if proc.returncode != 0:
        pytest.fail("no Docker engine (unset CRYPTEN_LITE_SYSTEM_TESTS on machines that cannot "
                    f"run one):\n{proc.stdout[-4000:]}")
    words = proc.stdout.split()
    started = int(words[-1]) if words[-2:-1] == ["started"] else None
    yield
    if started is not None:
        subprocess.run(["kill", str(started)], env=ENV, check=False)
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(["tail", f"--pid={started}", "-f", "/dev/null"], env=ENV, timeout=60)


def _torch_wheel() -> pathlib.Path:
    """The torch wheel this machine's pip installs for the installed torch version."""
    import torch

    version = torch.__version__.split("+")[0]
    TORCH_CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(TORCH_CACHE.glob(f"torch-{version}*-cp{sys.version_info[0]}"
                                     f"{sys.version_info[1]}-*.whl"))
    if not wheels:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
              "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}",
              "-d", str(TORCH_CACHE), f"torch=={version}"], timeout=1200)
        wheels = sorted(TORCH_CACHE.glob(f"torch-{version}*.whl"))
    assert wheels, f"pip download torch=={version} left no wheel in {TORCH_CACHE}"
    return wheels[-1]


@contextlib.contextmanager
def _serve(folder: pathlib.Path, host: str) -> Iterator[str]:
    """An HTTP server for `folder` on `host` (the docker bridge), as a find-links URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer((host, WHEEL_PORT), handler)
    except OSError:  # the fixed port is taken: any port (the torch layer is rebuilt)
        server = http.server.ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def image(engine: None, announce) -> dict[str, float | int]:
    """Build IMAGE from the Dockerfile; returns its size in bytes."""
    base = os.environ.get("CRYPTEN_LITE_DOCKER_BASE", "")
    if not base:
        announce(f"container test: the base image {BASE_IMAGE} (scripts/docker_base_image.sh: "
                 "debootstrap of Debian 12: minutes the first time, then kept in the engine)")
        base = _run(["bash", str(REPO / "scripts" / "docker_base_image.sh"), BASE_IMAGE],
                    timeout=1800).stdout.split()[-1]
    wheel = _torch_wheel()
    version = wheel.name.split("-")[1]  # e.g. 2.13.0+cpu
    announce(f"container test: docker build -t {IMAGE} (torch {version}; minutes the first time, "
             "then Docker's layer cache)")
    gateway = _bridge_address()
    with _serve(wheel.parent, gateway) as url:
        _run(["docker", "build", "--force-rm", "--build-arg", f"BASE_IMAGE={base}",
              "--build-arg", f"TORCH_VERSION={version}",
              "--build-arg", f"TORCH_PIP_ARGS=--find-links {url} --trusted-host {gateway}",
              "--build-arg", f"TORCH_SHA256={_sha256(wheel)}",   # the Dockerfile checks it
              "-t", IMAGE, str(REPO)], timeout=BUILD_TIMEOUT)
    size = int(_run(["docker", "image", "inspect", IMAGE, "-f", "{{.Size}}"], timeout=60).stdout)
    print(f"image {IMAGE}: {size / 1e9:.2f} GB, torch {version}", flush=True)
    return {"size": size}


def _sha256(path: pathlib.Path) -> str:
    import hashlib
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _bridge_address() -> str:
    """This machine's address on docker's default bridge (where `docker build` runs)."""
    gateway = _run(["docker", "network", "inspect", "bridge", "-f",
                    "{{range .IPAM.Config}}{{.Gateway}}{{end}}"], timeout=60).stdout.strip()
    if not gateway:  # dockerd does not always record it: the bridge interface's address
        bridge = _run(["docker", "network", "inspect", "bridge", "-f",
                       '{{index .Options "com.docker.network.bridge.name"}}'],
                      timeout=60).stdout.strip() or "docker0"
        out = _run(["ip", "-4", "-o", "addr", "show", "dev", bridge], timeout=60).stdout
        found = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
        assert found, f"no IPv4 address on {bridge}: {out}"
        gateway = found.group(1)
    return gateway


def _compose_cli() -> list[str]:
    forced = os.environ.get("CRYPTEN_LITE_COMPOSE")
    if forced:
        return shlex.split(forced)
    v2 = subprocess.run(["docker", "compose", "version"], env=ENV, capture_output=True)
    return ["docker", "compose"] if v2.returncode == 0 else ["docker-compose"]


def _project_objects(project: str) -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={project}"
    found = {}
    for kind, argv in (("containers", ["docker", "ps", "-a", "-q", "--filter", label]),
                       ("volumes", ["docker", "volume", "ls", "-q", "--filter", label]),
                       ("networks", ["docker", "network", "ls", "-q", "--filter", label])):
        found[kind] = _run(argv, timeout=60).stdout.split()
    # Also by name (compose names them <project>_...), whatever their labels.
    volumes = _run(["docker", "volume", "ls", "-q"], timeout=60).stdout.split()
    found["volumes"] += [v for v in volumes if v.startswith(f"{project}_")]
    networks = _run(["docker", "network", "ls", "--format", "{{.Name}}"], timeout=60).stdout.split()
    found["networks"] += [n for n in networks if n.startswith(f"{project}_")]
    return found


def _containers(project: str) -> dict[str, dict]:
    """``{service: docker inspect}`` of the project's containers."""
    ids = _run(["docker", "ps", "-a", "-q", "--filter",
                f"label=com.docker.compose.project={project}"], timeout=60).stdout.split()
    assert ids, f"no containers of project {project}"
    inspected = json.loads(_run(["docker", "inspect", *ids], timeout=60).stdout)
    return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in inspected}


def _wait_exited(project: str, names: tuple[str, ...]) -> dict[str, dict]:
    """`up ... party0` returns when party0 exits; the other parties finish their own shutdown
    on their own time (seen: party1 still running right after `up` returned, its work done).
    `docker wait` on each (a hang guard, not a timing assumption), then inspect again."""
    for name, c in _containers(project).items():
        if name in names:
            _run(["docker", "wait", c["Id"]], timeout=UP_TIMEOUT)
    return _containers(project)


def _volume_files(volume: str) -> list[str]:
    """`ls -ln` of a volume, from a throwaway container of the image."""
    out = _run(["docker", "run", "--rm", "--entrypoint", "ls", "-v", f"{volume}:/x:ro", IMAGE,
                "-ln", "/x"], timeout=120).stdout
    return [line for line in out.splitlines() if not line.startswith("total")]


def test_compose_up_with_docker(image: dict, tmp_path: pathlib.Path) -> None:
    command = documented_command()
    assert command[:3] == ["docker", "compose", "up"], command
    args = [a for a in command[3:] if a != "--build"]  # the image is built above
    project = f"cltest{os.getpid()}"
    compose = [*_compose_cli(), "-p", project, "-f", str(COMPOSE_FILE)]
    services = compose_env.services(COMPOSE_FILE)
    try:
        up = _run([*compose, "up", "--no-color", *args], timeout=UP_TIMEOUT, check=False)
        log = up.stdout
        print(log[-6000:], flush=True)
        containers = (_wait_exited(project, ("certs", "party0", "party1")) if up.returncode == 0
                      else _containers(project))
        logs = {name: _run(["docker", "logs", c["Id"]], timeout=60).stdout
                for name, c in containers.items()}
        assert up.returncode == 0, f"`up` exited {up.returncode}:\n{log[-6000:]}\n{logs}"

        # Every service ran; the one-shot ones exited 0; the dealer still serves. That party0
        # ran at all shows the dealer and party1 passed their health checks: compose starts
        # party0 only then (depends_on: service_healthy), else `up` fails naming the service.
        # (The probes' own log is not asserted: it keeps the last 5 only, whose outcome
        # depends on load.)
        assert set(containers) == set(services), sorted(containers)
        for name in ("certs", "party0", "party1"):
            state = containers[name]["State"]
            assert state["Status"] == "exited" and state["ExitCode"] == 0, (name, state, logs[name])
        assert containers["dealer"]["State"]["Running"], containers["dealer"]["State"]
        for name in ("dealer", "party0", "party1"):
            assert containers[name]["Config"]["Healthcheck"]["Test"] == [
                "CMD", *compose_env.healthchecks(COMPOSE_FILE)[name]], name

        # The example's private predictions, in party0's log (which `up` showed).
        predictions = PREDICTION.findall(logs["party0"])
        assert len(predictions) == 1, logs["party0"]
        assert predictions == PREDICTION.findall(log), "`up` must show party0's output"
        assert PREDICTION.findall(logs["party1"]) == predictions, logs["party1"]
        plain = re.findall(r"plaintext torch prediction: (\[[\d, ]*\])", logs["party0"])
        assert plain == predictions, logs["party0"]
        # The example is seeded: the same predictions as in plain launch mode on this machine.
        script = services["party0"].command[1]
        launch = _run([sys.executable, "-m", "crypten_lite.cli", "launch", "-n", "2",
                       "--timeout", "600", script], timeout=UP_TIMEOUT)
        assert re.findall(r"\[rank 0\] " + PREDICTION.pattern, launch.stdout) == predictions, (
            launch.stdout)
        assert not any("TLS is off" in text for text in logs.values())

        # Each service mounts only its own volume, read-only at /certs, holding only the CA
        # certificate and its own certificate and key (the image user's, key 0600).
        for name, c in containers.items():
            mounts = [(m["Type"], m.get("Name"), m["Destination"], m["RW"]) for m in c["Mounts"]]
            if name == "certs":
                assert sorted(m[1] for m in mounts) == sorted(
                    f"{project}_tls-{s}" for s in services if s != "certs"), mounts
                assert "/ca" in c["HostConfig"]["Tmpfs"], c["HostConfig"]
            else:
                assert mounts == [("volume", f"{project}_tls-{name}", "/certs", False)], mounts
                files = {line.split()[-1]: line.split() for line in
                         _volume_files(f"{project}_tls-{name}")}
                assert set(files) == {"ca.pem", f"{name}.pem", f"{name}.key"}, files
                assert files[f"{name}.key"][0] == "-rw-------", files
                assert files[f"{name}.key"][2:4] == ["10001", "10001"], files
    finally:
        down = _run([*compose, "down", "--volumes", "--remove-orphans"], timeout=300, check=False)
    assert down.returncode == 0, down.stdout
    assert _project_objects(project) == {"containers": [], "volumes": [], "networks": []}


RSS_COMPOSE_FILE = REPO / "docker-compose.rss.yml"


def _rss_documented_command() -> list[str]:
    """The `up` command for docker-compose.rss.yml that its header and docs/protocols.md give."""
    header = RSS_COMPOSE_FILE.read_text()
    lines = [line.split("#")[0].strip()
             for line in (REPO / "docs" / "protocols.md").read_text().splitlines()
             if line.startswith("docker compose -f docker-compose.rss.yml") and " up " in line]
    assert len(lines) == 1, lines
    assert f"#   {lines[0]}\n" in header, "docker-compose.rss.yml's header gives another command"
    return shlex.split(lines[0])


def test_compose_rss_with_docker(image: dict) -> None:
    """docker-compose.rss.yml with the image built above (not rebuilt): three parties, protocol
    rss, no dealer, mutual TLS; party0's private predictions equal plaintext torch's."""
    command = _rss_documented_command()
    assert command[:5] == ["docker", "compose", "-f", "docker-compose.rss.yml", "-p"], command
    args = [a for a in command[command.index("up") + 1:] if a != "--build"]
    project = f"cltestrss{os.getpid()}"  # apart from any other run on this engine
    compose = [*_compose_cli(), "-p", project, "-f", str(RSS_COMPOSE_FILE)]
    services = compose_env.services(RSS_COMPOSE_FILE)
    assert set(services) == {"certs", "party0", "party1", "party2"}  # no dealer
    try:
        up = _run([*compose, "up", "--no-color", *args], timeout=UP_TIMEOUT, check=False)
        containers = (_wait_exited(project, tuple(services)) if up.returncode == 0
                      else _containers(project))
        logs = {name: _run(["docker", "logs", c["Id"]], timeout=60).stdout
                for name, c in containers.items()}
        assert up.returncode == 0, f"`up` exited {up.returncode}:\n{up.stdout[-6000:]}\n{logs}"
        assert set(containers) == set(services), sorted(containers)
        for name in ("party0", "party1", "party2"):  # each has its compose health check
            assert containers[name]["Config"]["Healthcheck"]["Test"] == [
                "CMD", *compose_env.healthchecks(RSS_COMPOSE_FILE)[name]], name
        for name in services:
            state = containers[name]["State"]
            assert state["Status"] == "exited" and state["ExitCode"] == 0, (name, state, logs[name])
        predictions = PREDICTION.findall(logs["party0"])
        assert len(predictions) == 1 and predictions == PREDICTION.findall(up.stdout), logs["party0"]
        for name in ("party1", "party2"):
            assert PREDICTION.findall(logs[name]) == predictions, logs[name]
        plain = re.findall(r"plaintext torch prediction: (\[[\d, ]*\])", logs["party0"])
        assert plain == predictions, logs["party0"]
        assert not any("TLS is off" in text for text in logs.values())
        for name in ("party0", "party1", "party2"):
            env = dict(e.split("=", 1) for e in containers[name]["Config"]["Env"])
            assert env["CRYPTEN_LITE_PROTOCOL"] == "rss" and "CRYPTEN_LITE_DEALER" not in env
            mounts = [(m["Type"], m.get("Name"), m["Destination"], m["RW"])
                      for m in containers[name]["Mounts"]]
            assert mounts == [("volume", f"{project}_tls-{name}", "/certs", False)], mounts
        print(f"rss compose: {predictions[0]}; " + next(
            line for line in logs["party0"].splitlines() if line.startswith("online:")), flush=True)
    finally:
        down = _run([*compose, "down", "--volumes", "--remove-orphans"], timeout=300, check=False)
    assert down.returncode == 0, down.stdout
    assert _project_objects(project) == {"containers": [], "volumes": [], "networks": []}

