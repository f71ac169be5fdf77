"""Static checks of the docker deployment (docker-compose.yml, Dockerfile), no docker needed.

If the compose-spec JSON schema is vendored at tests/data/compose-spec.json, the file is also
validated against it; the structural checks below hold either way.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shlex

import pytest

import compose_env
from crypten_lite.config import PREFIX, Config

REPO = pathlib.Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
SCHEMA = REPO / "tests" / "data" / "compose-spec.json"
DOCUMENTED_KEYS = {PREFIX + f.name.upper() for f in dataclasses.fields(Config)} | {
    PREFIX + "CONFIG"}
PARTY = re.compile(r"party(\d+)")
CA_DIR = "/ca"  # the certs job's tmpfs: the CA key never leaves it
IMAGE_UID = "10001"  # the image's unprivileged user (Dockerfile)


@pytest.fixture(scope="module")
def compose() -> dict:
    return compose_env.load(COMPOSE_FILE)


@pytest.fixture(scope="module")
def services() -> dict[str, compose_env.Service]:
    return compose_env.services(COMPOSE_FILE)


@pytest.fixture(scope="module")
def parties(services: dict[str, compose_env.Service]) -> dict[int, str]:
    """``{rank: service name}`` of the computing parties."""
    found = {int(m.group(1)): name for name in services if (m := PARTY.fullmatch(name))}
    assert len(found) >= 2, f"need at least two party services, found {sorted(services)}"
    return found


def test_schema(compose: dict) -> None:
    if not SCHEMA.exists():
        pytest.skip(f"{SCHEMA.relative_to(REPO)} is not vendored; structural checks only")
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(compose, json.loads(SCHEMA.read_text()))


def test_required_services_share_one_image(compose: dict, parties: dict[int, str]) -> None:
    specs = compose["services"]
    assert {"certs", "dealer"} <= set(specs)
    images = {(spec.get("image"), str(spec.get("build"))) for spec in specs.values()}
    assert len(images) == 1, f"every service must run the same image, got {images}"
    assert specs["certs"].get("build") is not None


def test_environment_uses_documented_keys_only(services: dict[str, compose_env.Service]) -> None:
    for name, service in services.items():
        unknown = set(service.environment) - DOCUMENTED_KEYS
        assert not unknown, f"service {name} sets undocumented variables {sorted(unknown)}"


def test_parties_agree_on_the_session(services: dict[str, compose_env.Service],
                                      parties: dict[int, str]) -> None:
    world_size = len(parties)
    assert sorted(parties) == list(range(world_size)), "ranks must be 0..N-1"
    party_lists = set()
    for rank, name in parties.items():
        env = services[name].environment
        assert env["CRYPTEN_LITE_RANK"] == str(rank), f"{name} must have rank {rank}"
        party_lists.add(env["CRYPTEN_LITE_PARTIES"])
        config = Config.from_env(env)  # the project's own validation
        assert config.provider == "dealer", "compose must not use the insecure TFP provider"
        assert config.tls_dir == "/certs"
    assert len(party_lists) == 1, f"parties disagree on CRYPTEN_LITE_PARTIES: {party_lists}"
    addresses = party_lists.pop().split(",")
    assert [a.rpartition(":")[0] for a in addresses] == [parties[r] for r in range(world_size)]

    for name, service in services.items():
        env = service.environment
        if "CRYPTEN_LITE_WORLD_SIZE" in env:
            assert env["CRYPTEN_LITE_WORLD_SIZE"] == str(world_size), name
        for key in ("CRYPTEN_LITE_DEALER", "CRYPTEN_LITE_SESSION", "CRYPTEN_LITE_TLS_DIR"):
            if name != "certs":
                assert env.get(key) == services["dealer"].environment[key], (name, key)
    assert services["dealer"].environment["CRYPTEN_LITE_DEALER"].startswith("dealer:")


def _certs_script(services: dict[str, compose_env.Service]) -> list[list[str]]:
    """The certs job's shell script (`/bin/sh -ec SCRIPT`), one argv per line."""
    certs = services["certs"]
    assert certs.entrypoint == ("/bin/sh", "-ec") and len(certs.command) == 1, certs
    return [shlex.split(line) for line in certs.command[0].splitlines() if line.strip()]


def test_certificates_cover_every_party(services: dict[str, compose_env.Service],
                                        parties: dict[int, str]) -> None:
    lines = _certs_script(services)
    generate = lines[0]
    assert generate[:2] == ["crypten-lite", "certs"], generate
    assert generate[generate.index("--parties") + 1] == str(len(parties))
    assert generate[generate.index("--out") + 1] == CA_DIR
    assert all(line[0] == "install" for line in lines[1:]), lines


def test_each_service_mounts_only_its_own_key(compose: dict,
                                              services: dict[str, compose_env.Service],
                                              parties: dict[int, str]) -> None:
    """Each service sees only the CA certificate and its own certificate and key, read-only;
    the CA key lives in the certs job's tmpfs and in no volume."""
    mounts = compose_env.mounts(COMPOSE_FILE)
    identities = ["dealer", *(parties[r] for r in sorted(parties))]
    assert set(services) == {"certs", *identities}
    for name in identities:
        assert mounts[name] == [compose_env.Mount(f"tls-{name}", "/certs", True)], name
        assert services[name].environment["CRYPTEN_LITE_TLS_DIR"] == "/certs"
    assert set(compose["volumes"]) == {f"tls-{name}" for name in identities}
    # The certs job: a tmpfs for the CA, and every service's volume at /tls/<service>.
    assert sorted(mounts["certs"], key=str) == sorted(
        [compose_env.Mount(None, CA_DIR, False)]
        + [compose_env.Mount(f"tls-{name}", f"/tls/{name}", False) for name in identities], key=str)
    assert compose["services"]["certs"].get("user") == "root"  # to chown the keys to the image user

    # What the script copies where: exactly ca.pem, <name>.pem (0644) and <name>.key (0600)
    # into /tls/<name>/, owned by the image's user; never ca.key.
    copied: dict[str, dict[str, str]] = {name: {} for name in identities}
    for line in _certs_script(services)[1:]:
        args = line[1:]
        options = dict(zip(args[:-1:2], args[1:-1:2]))
        files = args[6:-1]
        assert args[:6:2] == ["-o", "-g", "-m"], line
        assert options["-o"] == options["-g"] == IMAGE_UID, line
        target = args[-1].rstrip("/")
        assert target.startswith("/tls/"), line
        for f in files:
            assert f.startswith(CA_DIR + "/"), line
            copied[target[len("/tls/"):]][f[len(CA_DIR) + 1:]] = options["-m"]
    for name in identities:
        assert copied[name] == {"ca.pem": "0644", f"{name}.pem": "0644",
                                f"{name}.key": "0600"}, (name, copied[name])


def test_health_checks_and_start_order(services: dict[str, compose_env.Service],
                                       parties: dict[int, str]) -> None:
    checks = compose_env.healthchecks(COMPOSE_FILE)
    listen = {"dealer": services["dealer"].environment["CRYPTEN_LITE_DEALER"]}
    addresses = services[parties[0]].environment["CRYPTEN_LITE_PARTIES"].split(",")
    listen.update({parties[r]: address for r, address in enumerate(addresses)})
    for name, address in listen.items():
        assert checks.get(name) == ["crypten-lite", "health", "--target", address], name

    depends = compose_env.dependencies(COMPOSE_FILE)
    assert depends["dealer"] == {"certs": "service_completed_successfully"}
    others = {parties[r]: "service_healthy" for r in sorted(parties) if r != 0}
    for rank, name in parties.items():
        # `up party0` (the documented command) starts party0 and what it depends on: so party0
        # depends on every other party (healthy: serving); the others on the certs and dealer.
        assert depends[name] == {"certs": "service_completed_successfully",
                                 "dealer": "service_healthy", **(others if rank == 0 else {})}
    order = compose_env.start_order(COMPOSE_FILE)
    assert order[:2] == ["certs", "dealer"] and set(order[2:]) == set(parties.values())
    assert order[-1] == parties[0]


def test_commands(services: dict[str, compose_env.Service], parties: dict[int, str]) -> None:
    assert services["dealer"].argv == ["crypten-lite", "dealer"]
    assert services["dealer"].entrypoint == compose_env.ENTRYPOINT
    commands = {tuple(services[name].command) for name in parties.values()}
    assert len(commands) == 1, f"every party must run the same program, got {commands}"
    assert commands.pop()[0] == "party"


def test_party_script_exists(services: dict[str, compose_env.Service]) -> None:
    script = services["party0"].command[1]  # the image has the repository's examples/
    assert (REPO / script).is_file(), f"the parties run {script}, which does not exist"


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text()
    # The base is a build argument whose default is the public image.
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    # A CPU-only torch by default (PyPI's Linux torch is the 5 GB CUDA build).
    assert re.search(r'^ARG TORCH_PIP_ARGS="--index-url https://download\.pytorch\.org/whl/cpu"$',
                     text, re.M)
    # torch alone, pinned to its version and checked against its wheel's hash.
    assert re.search(r'^RUN echo "torch==\$\{TORCH_VERSION\} --hash=sha256:\$\{TORCH_SHA256\}"', text, re.M)
    assert re.search(r"pip install --require-hashes --no-deps \$\{TORCH_PIP_ARGS\} -r /tmp/torch.txt", text)
    # Every other dependency from the hashed lock, then the package with the examples extra
    # (what the compose parties run needs scikit-learn), checked by pip check.
    assert re.search(r"^RUN pip install --require-hashes --no-deps -r docker/requirements\.lock$", text, re.M)
    assert re.search(r'^RUN pip install --no-deps --no-build-isolation "\.\[examples\]" && pip check$',
                     text, re.M)
    assert re.search(rf"^RUN useradd .*--uid {IMAGE_UID} ", text, re.M)
    assert f'ENTRYPOINT {json.dumps(list(compose_env.ENTRYPOINT))}' in text
    assert 'CMD ["party"]' in text
    assert re.search(r"^COPY examples \./examples$", text, re.M)
    assert re.search(r"^USER (?!root)", text, re.M), "run unprivileged"


def test_compose_env_parses_other_syntaxes(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "compose.yml"
    path.write_text(
        "services:\n"
        "  a:\n"
        "    command: party 'my script.py'\n"
        "    environment: [CRYPTEN_LITE_RANK=1, CRYPTEN_LITE_TLS_DIR]\n"
        "    depends_on: [b]\n"
        "  b:\n"
        "    healthcheck: {test: [CMD-SHELL, crypten-lite health --target b:1]}\n")
    assert compose_env.services(path)["a"] == (
        ["party", "my script.py"], {"CRYPTEN_LITE_RANK": "1", "CRYPTEN_LITE_TLS_DIR": ""},
        compose_env.ENTRYPOINT)
    assert compose_env.start_order(path) == ["b", "a"]
    assert compose_env.healthchecks(path) == {
        "b": ["/bin/sh", "-c", "crypten-lite health --target b:1"]}
    path.write_text("services:\n  a:\n    environment: {X: '${HOME}'}\n")
    with pytest.raises(ValueError, match="interpolation"):
        compose_env.services(path)
