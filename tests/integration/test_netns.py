"""Self-test of the network-namespace helper (tests/integration/netns.py).

Needs root and iproute2; skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import pathlib
import select
import subprocess
import sys
import time
from typing import Any

import pytest

import netns

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(not netns.available()[0], reason=netns.available()[1]),
]

REPO = pathlib.Path(__file__).resolve().parents[2]

# Accepts `connections` connections; answers each with its message in upper case and the
# client's address. Prints "ready" once listening.
SERVER = """
import socket, sys
server = socket.create_server(("0.0.0.0", 5000))
print("ready", flush=True)
for _ in range(int(sys.argv[1])):
    conn, (peer, _) = server.accept()
    with conn:
        conn.sendall(conn.recv(100).upper() + b" from " + peer.encode())
"""
CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], 5000), timeout=5) as conn:
    conn.sendall(b"hello")
    print(conn.recv(100).decode())
"""


def _wait_for_line(proc: subprocess.Popen[Any], timeout: float = 10.0) -> str:
    """The next stdout line of `proc`, failing instead of hanging after `timeout` seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"no output from {proc.args} within {timeout} s")
    return proc.stdout.readline().strip()


def _python(net: netns.Network, host: str, code: str, *args: str) -> subprocess.Popen[Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return net.run(host, [sys.executable, "-c", code, *args], env=env, cwd=REPO,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _output(proc: subprocess.Popen[Any], timeout: float = 20.0) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out.strip()


def test_tcp_between_namespaces_by_ip_and_by_name() -> None:
    with netns.Network(["alice", "bob"]) as net:
        server = _python(net, "alice", SERVER, "2")
        assert _wait_for_line(server) == "ready"
        by_ip = _output(_python(net, "bob", CLIENT, net.ip("alice")))
        by_name = _output(_python(net, "bob", CLIENT, "alice"))
        assert by_ip == by_name == f"HELLO from {net.ip('bob')}"


def test_hosts_only_reach_the_lan() -> None:
    with netns.Network(["alice"]) as net:
        routes = subprocess.run(["ip", "-n", net.namespaces["alice"], "route"],
                                capture_output=True, text=True, check=True).stdout
    assert routes.strip().splitlines() == [
        line for line in routes.strip().splitlines() if line.startswith("10.77.0.0/24 ")]
    assert "default" not in routes


def test_close_kills_processes_and_deletes_everything() -> None:
    with netns.Network(["alice", "bob"]) as net:
        sleeper = net.run("alice", ["sleep", "600"])
        names = [*net.namespaces.values(), net.hub]
    assert sleeper.poll() is not None
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in names:
        assert name not in listed
        assert not (netns.NETNS_ETC / name).exists()


def test_close_after_failed_setup_leaves_nothing() -> None:
    net = netns.Network(["alice"], rate="not-a-rate")
    with pytest.raises(netns.NetnsError, match="tc qdisc"):
        net.__enter__()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.namespaces["alice"] not in listed and net.hub not in listed


def test_substitute_rewrites_known_hosts_only() -> None:
    net = netns.Network(["dealer", "party0", "party1"])
    env = {"CRYPTEN_LITE_PARTIES": "party0:50051,party1:50051",
           "CRYPTEN_LITE_DEALER": "dealer:50050", "OTHER": "xparty0:1 party0 /party1:2"}
    assert net.substitute(env) == {
        "CRYPTEN_LITE_PARTIES": "10.77.0.2:50051,10.77.0.3:50051",
        "CRYPTEN_LITE_DEALER": "10.77.0.1:50050", "OTHER": "xparty0:1 party0 /10.77.0.3:2"}


@pytest.mark.skipif(not netns.rate_limit_available()[0], reason=netns.rate_limit_available()[1])
def test_rate_limit_shapes_the_link() -> None:
    megabytes = 5  # 40 Mbit: 0.4 s at 100 Mbit/s, a few ms unshaped
    sink = """
import socket
server = socket.create_server(("0.0.0.0", 5000))
print("ready", flush=True)
conn, _ = server.accept()
while conn.recv(1 << 16):
    pass
"""
    source = f"""
import socket, time
with socket.create_connection(("alice", 5000), timeout=10) as conn:
    start = time.monotonic()
    conn.sendall(bytes({megabytes} << 20))
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)
    print(time.monotonic() - start)
"""
    with netns.Network(["alice", "bob"], rate="100mbit") as net:
        qdisc = subprocess.run(["ip", "netns", "exec", net.namespaces["bob"], "tc", "qdisc",
                                "show", "dev", "eth0"], capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "100Mbit" in qdisc
        server = _python(net, "alice", sink)
        assert _wait_for_line(server) == "ready"
        seconds = float(_output(_python(net, "bob", source)))
    assert seconds > 0.8 * megabytes * 8 / 100


def test_grpc_with_tls_identity_across_namespaces(tmp_path: pathlib.Path) -> None:
    """What the launcher does: dial a service by its compose name, verify its identity."""
    from crypten_lite import certs

    certs.generate(tmp_path, parties=1)
    server_code = f"""
import grpc
from concurrent.futures import ThreadPoolExecutor
from crypten_lite.comm import tls
def echo(request, context):
    return request + b" " + tls.peer_identity(context).encode()
handler = grpc.method_handlers_generic_handler(
    "t.Echo", {{"Echo": grpc.unary_unary_rpc_method_handler(echo)}})
server = grpc.server(ThreadPoolExecutor(2))
server.add_generic_rpc_handlers((handler,))
server.add_secure_port("0.0.0.0:50050", tls.server_credentials(tls.load({str(tmp_path)!r}, "dealer")))
server.start()
print("ready", flush=True)
server.wait_for_termination(30)
"""
    client_code = f"""
import grpc
from crypten_lite.comm import tls
material = tls.load({str(tmp_path)!r}, "party0")
with grpc.secure_channel("dealer:50050", tls.channel_credentials(material),
                         options=tls.channel_options("dealer")) as channel:
    print(channel.unary_unary("/t.Echo/Echo")(b"hi", timeout=60).decode())
"""
    with netns.Network(["dealer", "party0"]) as net:
        server = _python(net, "dealer", server_code)
        assert _wait_for_line(server, timeout=30) == "ready"
        assert _output(_python(net, "party0", client_code)) == "hi party0"
    deadline = time.monotonic() + 60  # hang guard: it was killed with its namespace
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.poll() is not None
