"""Network namespaces for integration tests: N hosts on a private LAN, 10.77.0.0/24.

Each host (``dealer``, ``party0``, ...) is its own network namespace with one interface,
``eth0``, address ``10.77.0.{i+1}/24``. A hub namespace holds a bridge joining them::

      [party0 ns] eth0 --veth-- v0 \\
      [party1 ns] eth0 --veth-- v1 -- br0   [hub ns]
      [dealer ns] eth0 --veth-- v2 /

Everything is created inside namespaces made here: nothing is added to the root namespace,
and hosts have no default route, so no packet can leave the LAN. Optionally each ``eth0`` is
rate-limited (``tc qdisc ... tbf rate 100mbit``), which shapes every host's outgoing traffic.

Names resolve inside the namespaces: ``ip netns exec`` bind-mounts ``/etc/netns/NS/hosts``
over ``/etc/hosts``, and we write one listing every host. :meth:`Network.substitute` also
rewrites ``name:port`` to ``ip:port`` in an environment, for code that prefers addresses.
(Certificates identify peers by their common name, so neither breaks TLS identity checks.)

Usage::

    ok, reason = netns.available()
    with netns.Network(["dealer", "party0", "party1"], rate="100mbit") as net:
        proc = net.run("party0", ["crypten-lite", "party", "x.py"], env=net.substitute(env))

Leaving the block kills every process started with :meth:`Network.run` (and anything else
still inside the namespaces), deletes the namespaces and the ``/etc/netns`` entries.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from types import TracebackType
from typing import Any, Mapping, Sequence

SUBNET = "10.77.0"
PREFIX_LEN = 24
NETNS_ETC = pathlib.Path("/etc/netns")
_HOST_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")
_COMMAND_TIMEOUT = 10  # seconds for one `ip` / `tc` command


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be set up (the message has the command's error)."""


def _ip(*args: str) -> str:
    return _command(["ip", *args])


def _command(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetnsError(f"`{' '.join(argv)}` could not run: {e}") from e
    if done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done.stdout


@functools.cache
def available() -> tuple[bool, str]:
    """Whether namespaces, veth pairs and bridges can be created here; else why not."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces need Linux"
    if os.geteuid() != 0:
        return False, "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return False, "the `ip` command (iproute2) is not installed"
    probe = f"clprobe{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "add", "name", "v0", "type", "veth", "peer", "name", "v1")
        _ip("-n", probe, "link", "add", "name", "br0", "type", "bridge")
    except NetnsError as e:
        return False, f"cannot create network namespaces here: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True,
                       timeout=_COMMAND_TIMEOUT)
    return True, ""


def rate_limit_available() -> tuple[bool, str]:
    """Whether `tc` and the tbf qdisc work here (call after :func:`available` succeeded)."""
    if shutil.which("tc") is None:
        return False, "the `tc` command (iproute2) is not installed"
    probe = f"clprobe{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "add", "name", "v0", "type", "veth", "peer", "name", "v1")
        _command(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "v0", "root",
                  "tbf", "rate", "100mbit", "burst", "32kbit", "latency", "50ms"])
    except NetnsError as e:
        return False, f"cannot rate-limit links here: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True,
                       timeout=_COMMAND_TIMEOUT)
    return True, ""


class Network:
    """Hosts on one private LAN, each in its own network namespace (a context manager)."""

    def __init__(self, hosts: Sequence[str], rate: str | None = None,
                 hosts_file: bool = True) -> None:
        """`hosts`: names such as ``party0``; `rate`: e.g. ``"100mbit"`` per host's egress;
        `hosts_file`: make the names resolve inside the namespaces."""
        if not 1 <= len(hosts) <= 250:
            raise ValueError(f"between 1 and 250 hosts, got {len(hosts)}")
        for host in hosts:
            if not _HOST_NAME.fullmatch(host):
                raise ValueError(f"host name {host!r} must match {_HOST_NAME.pattern}")
        if len(set(hosts)) != len(hosts):
            raise ValueError(f"duplicate host names in {list(hosts)}")
        self.hosts = list(hosts)
        self.rate = rate
        self.hosts_file = hosts_file
        token = secrets.token_hex(3)  # unique names, so concurrent test runs do not collide
        self.namespaces = {host: f"cl{token}-{host}" for host in hosts}
        self.hub = f"cl{token}-hub"
        self._ips = {host: f"{SUBNET}.{i + 1}" for i, host in enumerate(hosts)}
        self._created: list[str] = []
        self._made_netns_etc = False
        self._processes: list[subprocess.Popen[Any]] = []

    # --- set-up and tear-down ---------------------------------------------------------

    def __enter__(self) -> "Network":
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _create(self) -> None:
        self._add_namespace(self.hub)
        _ip("-n", self.hub, "link", "add", "name", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "dev", "br0", "up")
        for i, host in enumerate(self.hosts):
            ns, hub_end = self.namespaces[host], f"v{i}"
            self._add_namespace(ns)
            _ip("-n", self.hub, "link", "add", "name", hub_end, "type", "veth",
                "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.hub, "link", "set", "dev", hub_end, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self._ips[host]}/{PREFIX_LEN}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "dev", "eth0", "up")
            _ip("-n", ns, "link", "set", "dev", "lo", "up")
            if self.rate:
                # burst must hold at least one MTU-sized packet per timer tick.
                _command(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0",
                          "root", "tbf", "rate", self.rate, "burst", "256kbit",
                          "latency", "50ms"])
            if self.hosts_file:
                self._write_hosts_file(ns)

    def _add_namespace(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._created.append(ns)

    def _write_hosts_file(self, ns: str) -> None:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{ip}\t{host}" for host, ip in self._ips.items()]
        if not NETNS_ETC.exists():
            NETNS_ETC.mkdir(parents=True)
            self._made_netns_etc = True
        folder = NETNS_ETC / ns
        folder.mkdir(exist_ok=True)
        (folder / "hosts").write_text("\n".join(lines) + "\n")

    def close(self) -> None:
        """Kill our processes, delete the namespaces and their /etc/netns entries (idempotent)."""
        for proc in self._processes:
            _terminate(proc)
        self._processes.clear()
        for ns in reversed(self._created):
            _kill_remaining(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True,
                           timeout=_COMMAND_TIMEOUT)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        self._created.clear()
        if self._made_netns_etc:
            try:
                NETNS_ETC.rmdir()  # fails, as it should, while another run still uses it
            except OSError:
                pass
            self._made_netns_etc = False

    # --- using the network ------------------------------------------------------------

    def ip(self, host: str) -> str:
        """The IPv4 address of `host` on the LAN."""
        return self._ips[self._check(host)]

    def substitute(self, env: Mapping[str, str]) -> dict[str, str]:
        """A copy of `env` where every ``host:port`` of a known host reads ``ip:port``."""
        pattern = re.compile(
            r"(?<![\w.-])(" + "|".join(map(re.escape, self.hosts)) + r")(?=:\d)")
        return {k: pattern.sub(lambda m: self._ips[m.group(1)], v) for k, v in env.items()}

    def run(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
            **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside `host`'s namespace; it is killed when the network closes.

        `env` replaces the environment (default: ours; our PATH is kept if `env` has none,
        so that `argv[0]` is found). Extra arguments go to Popen
        (``stdout=subprocess.PIPE``, ``text=True``...). The process leads its own process
        group, so stopping it also stops its children.
        """
        ns = self.namespaces[self._check(host)]
        if env is not None:
            env = {"PATH": os.environ.get("PATH", os.defpath), **env}
        ip = shutil.which("ip") or "ip"
        proc = subprocess.Popen([ip, "netns", "exec", ns, *argv], env=env,
                                start_new_session=True, **popen_kwargs)
        self._processes.append(proc)
        return proc

    def _check(self, host: str) -> str:
        if host not in self._ips:
            raise KeyError(f"unknown host {host!r}; this network has {self.hosts}")
        return host


def _terminate(proc: subprocess.Popen[Any], grace: float = 3.0) -> None:
    """SIGTERM the process group `proc` leads, then SIGKILL it after `grace` seconds."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait(timeout=grace)


def _kill_remaining(ns: str) -> None:
    """SIGKILL every process still inside namespace `ns` (all started by us, by id)."""
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                          timeout=_COMMAND_TIMEOUT)
    for pid in done.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    deadline = time.monotonic() + 30.0  # SIGKILLed: they go as soon as the kernel reaps them
    while time.monotonic() < deadline:
        left = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                              timeout=_COMMAND_TIMEOUT).stdout.split()
        if not left:
            return
        time.sleep(0.05)
