"""docker-compose.serve.yml for real: three rss parties in containers serving LeNet over TLS.

The engine and the image are test_compose_docker's fixtures (scripts/docker_engine.sh, the
base image of scripts/docker_base_image.sh, `docker build` of the Dockerfile with Docker's
layer cache: after that test, only the code layers are rebuilt). Then, under its own project
name: `up -d`, the certs job's client token and CA certificate read from the client volume,
and the torch-free client (client/) predicting from this machine over TLS against the
published endpoints, each party's certificate checked against the CA: the answers equal
plaintext torch's forward. A client that skips TLS is refused. `down --volumes` leaves no
container, volume or network of the project.

Like test_compose_docker it changes the machine (system packages, a root dockerd, images), so
it runs only with CRYPTEN_LITE_SYSTEM_TESTS=1 (skipped otherwise, saying so).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from test_compose_docker import (ENV, IMAGE, UP_TIMEOUT, _compose_cli, _containers,  # noqa: F401
                                 _project_objects, _run, engine, image)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600), pytest.mark.system_tests(
    "apt-installs docker.io, docker-compose, containerd, runc, iptables and debootstrap, starts a "
    "root dockerd and keeps about 3 GB of images")]
if os.environ.get("CRYPTEN_LITE_SKIP_DOCKER") == "1":
    pytestmark.append(pytest.mark.skip(reason="CRYPTEN_LITE_SKIP_DOCKER=1"))

REPO = pathlib.Path(__file__).resolve().parents[2]
SERVE_FILE = REPO / "docker-compose.serve.yml"
ENDPOINTS = ["127.0.0.1:9100", "127.0.0.1:9101", "127.0.0.1:9102"]  # the file's published ports


def _client_file(project: str, name: str) -> str:
    """A file of the certs job's client volume (stdout only: no compose chatter)."""
    proc = subprocess.run(["docker", "run", "--rm", "--entrypoint", "cat", "-v",
                           f"{project}_client:/client:ro", IMAGE, f"/client/{name}"],
                          env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_serve_compose_tls_with_docker(image: dict, tmp_path: pathlib.Path) -> None:
    sys.path.insert(0, str(REPO / "client"))
    from crypten_lite_client import Client, ClientError

    from crypten_lite.serve.server import build_model

    project = f"cltestserve{os.getpid()}"
    compose = [*_compose_cli(), "-p", project, "-f", str(SERVE_FILE)]
    try:
        _run([*compose, "up", "-d", "--no-color"], timeout=UP_TIMEOUT)
        token = _client_file(project, "token").strip()
        ca = tmp_path / "ca.pem"
        ca.write_text(_client_file(project, "ca.pem"))
        assert token and "BEGIN CERTIFICATE" in ca.read_text()

        model, shape = build_model("lenet")
        xs = np.random.default_rng(5).standard_normal((3, *shape))
        with torch.no_grad():
            want = model(torch.tensor(xs, dtype=torch.float32)).numpy()
        with Client(ENDPOINTS, token, tls=str(ca), timeout=UP_TIMEOUT) as c:
            infos = c.wait_ready(UP_TIMEOUT)
            assert [i.party for i in infos] == [0, 1, 2] and {i.protocol for i in infos} == {"rss"}
            got = c.predict(xs, timeout=300)
            one = c.predict(xs[1], timeout=300)
        assert np.allclose(got, want, atol=2e-2), (got, want)
        assert np.allclose(one, want[1], atol=2e-2), (one, want[1])

        with Client(ENDPOINTS, token, tls=None, timeout=10) as plain:  # TLS is not optional
            with pytest.raises(ClientError):
                plain.predict(xs[0], timeout=10)

        containers = _containers(project)
        for r in range(3):
            c = containers[f"party{r}"]
            assert c["State"]["Running"] and c["RestartCount"] == 0, (r, c["State"])
    except BaseException:
        for name, c in _containers(project).items():
            print(f"--- {name}:\n" + _run(["docker", "logs", c["Id"]], timeout=60,
                                         check=False).stdout[-3000:], flush=True)
        raise
    finally:
        down = _run([*compose, "down", "--volumes", "--remove-orphans"], timeout=300, check=False)
    assert down.returncode == 0, down.stdout
    assert _project_objects(project) == {"containers": [], "volumes": [], "networks": []}
