"""Read docker-compose.yml as a launcher needs it: each service's command and environment.

Integration tests run the compose deployment without docker: every service's command in its
own network namespace (see netns.py), started in :func:`start_order`, e.g.::

    for name in compose_env.start_order(COMPOSE_FILE):
        command, environment = compose_env.services(COMPOSE_FILE)[name]
        net.run(name, [*compose_env.ENTRYPOINT, *command], env={**os.environ, **environment})

YAML anchors and merge keys (``<<: *session``) are resolved by the YAML loader; variable
interpolation (``${VAR}``) is not supported and is reported as an error.
"""

from __future__ import annotations

import os
import shlex
from typing import Any, NamedTuple

import yaml

# The image's ENTRYPOINT (Dockerfile); a compose `command` is its arguments.
ENTRYPOINT = ("crypten-lite",)


class Service(NamedTuple):
    """One compose service: the arguments after the entrypoint, its environment, and its
    entrypoint (the image's unless the service sets its own)."""

    command: list[str]
    environment: dict[str, str]
    entrypoint: tuple[str, ...] = ENTRYPOINT

    @property
    def argv(self) -> list[str]:
        """The full command line: the entrypoint followed by `command`."""
        return [*self.entrypoint, *self.command]


class Mount(NamedTuple):
    """One mount of a service: a named volume (source = its name) or a tmpfs (source None)."""

    source: str | None
    target: str
    read_only: bool


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The compose file as plain data (anchors and merge keys resolved)."""
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise ValueError(f"{path}: not a compose file (no `services` mapping)")
    return data


def services(path: str | os.PathLike[str]) -> dict[str, Service]:
    """``{name: (command_args, environment)}`` for every service of the compose file."""
    return {name: Service(_command(name, spec), _environment(name, spec),
                          _entrypoint(name, spec))
            for name, spec in load(path)["services"].items()}


def mounts(path: str | os.PathLike[str]) -> dict[str, list[Mount]]:
    """``{name: [Mount, ...]}``: each service's named volumes and tmpfs mounts.

    Only the short volume syntax ``volume:/target[:ro]`` is supported (host paths and the
    long syntax are reported as errors: the deployment must not depend on host folders).
    """
    data = load(path)
    declared = set(data.get("volumes") or {})
    result: dict[str, list[Mount]] = {}
    for name, spec in data["services"].items():
        found = []
        for entry in spec.get("volumes") or []:
            if not isinstance(entry, str):
                raise ValueError(f"service {name}: only the short volume syntax is supported")
            source, target, *mode = entry.split(":")
            if source not in declared or not target.startswith("/") or mode not in ([], ["ro"]):
                raise ValueError(f"service {name}: {entry!r} is not `declared-volume:/path[:ro]`")
            found.append(Mount(source, target, mode == ["ro"]))
        tmpfs = spec.get("tmpfs") or []
        for target in [tmpfs] if isinstance(tmpfs, str) else tmpfs:
            found.append(Mount(None, str(target).split(":")[0], False))
        result[name] = found
    return result


def healthchecks(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """``{name: argv}`` of each service's health check (services without one are left out)."""
    checks = {}
    for name, spec in load(path)["services"].items():
        test = (spec.get("healthcheck") or {}).get("test")
        if test is None:
            continue
        if isinstance(test, str):
            checks[name] = ["/bin/sh", "-c", test]
        elif test and test[0] == "CMD":
            checks[name] = [str(a) for a in test[1:]]
        elif test and test[0] == "CMD-SHELL":
            checks[name] = ["/bin/sh", "-c", " ".join(str(a) for a in test[1:])]
        else:
            raise ValueError(f"service {name}: unsupported healthcheck test {test!r}")
    return checks


def dependencies(path: str | os.PathLike[str]) -> dict[str, dict[str, str]]:
    """``{name: {dependency: condition}}`` from each service's ``depends_on``."""
    result: dict[str, dict[str, str]] = {}
    for name, spec in load(path)["services"].items():
        depends = spec.get("depends_on") or {}
        if isinstance(depends, list):  # short syntax: plain names mean "service_started"
            depends = {dep: {"condition": "service_started"} for dep in depends}
        result[name] = {dep: (opts or {}).get("condition", "service_started")
                        for dep, opts in depends.items()}
    return result


def start_order(path: str | os.PathLike[str]) -> list[str]:
    """Service names with every service after its dependencies (ties in file order)."""
    graph = dependencies(path)
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ValueError(f"depends_on cycle through service {name!r}")
        if name not in graph:
            raise ValueError(f"depends_on names unknown service {name!r}")
        visiting.add(name)
        for dep in graph[name]:
            visit(dep)
        visiting.discard(name)
        order.append(name)

    for name in graph:
        visit(name)
    return order


def _command(name: str, spec: dict[str, Any]) -> list[str]:
    command = spec.get("command", [])
    args = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    _no_interpolation(name, args)
    return args


def _entrypoint(name: str, spec: dict[str, Any]) -> tuple[str, ...]:
    entrypoint = spec.get("entrypoint")
    if entrypoint is None:
        return ENTRYPOINT
    args = shlex.split(entrypoint) if isinstance(entrypoint, str) else [str(a) for a in entrypoint]
    _no_interpolation(name, args)
    return tuple(args)


def _environment(name: str, spec: dict[str, Any]) -> dict[str, str]:
    environment = spec.get("environment") or {}
    if isinstance(environment, list):  # ["KEY=value", ...]
        environment = dict(item.split("=", 1) if "=" in item else (item, "")
                           for item in environment)
    env = {str(k): "" if v is None else _scalar(v) for k, v in environment.items()}
    _no_interpolation(name, env.values())
    return env


def _scalar(value: Any) -> str:
    if isinstance(value, bool):  # YAML true/false; compose would refuse them unquoted
        return "true" if value else "false"
    return str(value)


def _no_interpolation(name: str, values: Any) -> None:
    for value in values:
        if "$" in value:
            raise ValueError(f"service {name}: variable interpolation in {value!r} is not "
                             "supported by this launcher; write the value out")
