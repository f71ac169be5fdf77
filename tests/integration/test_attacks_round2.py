"""Security review, round 2: each finding's attack, performed (issue 28).

1. A SubjectAltName that the TLS stack matches against a role's name (``dealer.``, ``Dealer.``,
   punycode, wildcards) is refused by ``crypten-lite certs``; and a certificate that slipped
   such a SAN in (here: party0's key with a ``dealer.`` SAN, run as the dealer) cannot pass
   for the role, because every client checks the signed handshake against the role it dialed.
2. A handshake refusal is recorded against the authenticated identity: party 0 claiming
   rank 1 at party 2 with a wrong session no longer makes party 2 give up on party 1.
3. (tests/protocol/test_reveal_shapes_any_rank.py: the full shape of every opening.)
4. A few-byte announcement, a model description or an int8 weight's shape cannot make a party
   allocate more than the session's limits allow: refused before allocating.
5. An inherited CRYPTEN_LITE_CONFIG with ``bind = "0.0.0.0"`` does not expose launched parties:
   they and the dealer listen on loopback; a plaintext non-loopback bind is warned about.
6. The dealer verifies a batch's MAC before it decodes a single request.
"""

from __future__ import annotations

import ast
import datetime
import ipaddress
import json
import logging
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import textwrap
import time

import grpc
import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from crypten_lite import certs
from crypten_lite._proto import crypten_lite_pb2 as pb
from crypten_lite._proto import crypten_lite_pb2_grpc as pb_grpc
from crypten_lite.comm import dealer_rpc, grpc_comm, tls
from crypten_lite.config import Config
from crypten_lite.errors import ConfigError
from crypten_lite.mpc import PartyPool
from crypten_lite.mpc.launcher import free_ports, local_env

SCRIPTS = pathlib.Path(__file__).parent / "scripts"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}


def _communicate(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outs.append((p.returncode, out))
    return outs


def _start(script: pathlib.Path | list[str], env: dict) -> subprocess.Popen:
    cmd = [sys.executable, str(script)] if isinstance(script, pathlib.Path) else [sys.executable, *script]
    return subprocess.Popen(cmd, env={**_base_env(), **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


# ---------------------------------------------------------------- 1. names and roles
@pytest.mark.parametrize("host", [
    "party1.", "dealer.", "Dealer.", "DEALER", "dealer..", " party0. ", "PARTY1.",
    "xn--dealer-", "XN--PARTY1-", "ｄｅａｌｅｒ", "*", "*.", "d*", "deal*r", "party*", "*1",
])
def test_certs_refuses_every_form_of_a_role_name(tmp_path, host, capsys):
    with pytest.raises(ConfigError, match="identity name"):
        certs.generate(tmp_path / "g", parties=2, hosts=[host])
    assert certs.main(["--parties", "2", "--out", str(tmp_path / "c"), "--hosts", f"ok.example.org,{host}"]) == 2
    assert "identity name" in capsys.readouterr().err
    assert not (tmp_path / "c" / "dealer.pem").exists()


def test_certs_still_accepts_ordinary_names(tmp_path):
    issued = certs.generate(tmp_path, parties=2, hosts=["mpc.example.org", "*.example.org",
                                                        "dealer.example.org", "10.0.0.5"])
    cert = x509.load_pem_x509_certificate(issued["dealer"].cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "dealer.example.org" in names.get_values_for_type(x509.DNSName)


def _forge(good: pathlib.Path, out: pathlib.Path, identity: str, as_role: str, san: str) -> None:
    """`out`: the good folder, except that `as_role`'s certificate and key are a fresh
    certificate of the real CA for `identity` whose SANs also list `san` (the mistake the old
    guard let through: e.g. party0's certificate valid for "dealer.")."""
    for f in good.iterdir():
        shutil.copy(f, out / f.name)
    ca_key = serialization.load_pem_private_key((good / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((good / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    validity = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    cert = certs._leaf_certificate(identity, key, ca_key, ca, validity, [x509.DNSName(san)])
    (out / f"{as_role}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / f"{as_role}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


@pytest.fixture(scope="module")
def good_certs(tmp_path_factory) -> pathlib.Path:
    good = tmp_path_factory.mktemp("good")
    certs.generate(good, parties=3)
    return good


@pytest.mark.parametrize("san", ["dealer.", "Dealer.", "dealer"])
def test_party_certificate_with_a_dealer_san_cannot_act_as_the_dealer(good_certs, tmp_path, san):
    """The review's attack: a dealer run with party 0's key (its certificate listing the
    dealer's name in a SAN form the TLS stack accepts) completed a whole session. Now both
    parties refuse it at the handshake: the signed reply names party0, not the dealer."""
    evil = tmp_path / "evil"
    evil.mkdir()
    _forge(good_certs, evil, "party0", "dealer", san)
    party_envs, dealer_env = local_env(2, "dealer", timeout=20)
    dealer = _start(["-m", "crypten_lite.cli", "dealer"], {**dealer_env, "CRYPTEN_LITE_TLS_DIR": str(evil)})
    try:
        parties = [_start(SCRIPTS / "arith.py", {**e, "CRYPTEN_LITE_TLS_DIR": str(good_certs)})
                   for e in party_envs]
        outs = _communicate(parties)
    finally:
        _stop(dealer)
    for code, out in outs:
        assert code != 0 and "result [" not in out, out
        assert "dialed as 'dealer' presented a certificate for 'party0'" in out, out


def test_party_certificate_with_another_partys_san_is_refused_by_the_client(good_certs, tmp_path):
    """A server at party 1's address holds party 0's key, its certificate (of the real CA)
    listing "party1." in its SANs: the TLS stack accepts it for the name party1, and it signs
    its handshake replies with the key it holds. Party 0's role check refuses it."""
    from concurrent.futures import ThreadPoolExecutor

    evil = tmp_path / "evil"
    evil.mkdir()
    _forge(good_certs, evil, "party0", "party1", "party1.")
    material = tls.load(evil, "party1")
    envs, _ = local_env(2, "tfp", timeout=20)
    address = envs[0]["CRYPTEN_LITE_PARTIES"].split(",")[1]
    answered = []

    def handshake(request, context):
        hello = pb.Hello(protocol_version=request.protocol_version, session=request.session,
                         world_size=2, rank=1, config_digest=request.config_digest,
                         public_key=b"\x05" * 32)
        answered.append(1)
        return pb.HelloReply(hello=hello, certificate=material.cert,
                             signature=tls.sign_reply(material, request, hello))

    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("crypten_lite.Party", {
        "Handshake": grpc.unary_unary_rpc_method_handler(
            handshake, request_deserializer=pb.Hello.FromString,
            response_serializer=pb.HelloReply.SerializeToString)}),))
    assert server.add_secure_port(address, tls.server_credentials(material))
    server.start()
    try:
        (code, out), = _communicate([_start(SCRIPTS / "arith.py",
                                            {**envs[0], "CRYPTEN_LITE_TLS_DIR": str(good_certs)})])
    finally:
        server.stop(None)
    assert answered, "the TLS handshake did not accept the forged SAN: the attack was not performed"
    assert code != 0 and "result [" not in out, out
    assert "dialed as 'party1' presented a certificate for 'party0'" in out, out


def test_verify_reply_refuses_forged_and_replayed_replies(good_certs):
    material = {r: tls.load(good_certs, f"party{r}") for r in range(2)}
    dealer = tls.load(good_certs, "dealer")
    client = pb.Hello(protocol_version=1, session="s", world_size=2, rank=1, config_digest="d",
                      public_key=b"\x01" * 32)
    server = pb.Hello(protocol_version=1, session="s", world_size=2, rank=2, config_digest="d",
                      public_key=b"\x02" * 32)
    good = pb.HelloReply(hello=server, certificate=dealer.cert,
                         signature=tls.sign_reply(dealer, client, server))
    tls.verify_reply(material[1], "dealer", client, good)   # the real dealer passes
    other_client = pb.Hello()
    other_client.CopyFrom(client)
    other_client.public_key = b"\x03" * 32
    by_party0 = pb.HelloReply(hello=server, certificate=material[0].cert,
                              signature=tls.sign_reply(material[0], client, server))
    stolen_cert = pb.HelloReply(hello=server, certificate=dealer.cert,
                                signature=tls.sign_reply(material[0], client, server))
    cases = {
        "presented a certificate for 'party0'": by_party0,
        "did not sign this handshake": stolen_cert,
        "sent no certificate": pb.HelloReply(hello=server),
    }
    for why, reply in cases.items():
        with pytest.raises(Exception, match=why):
            tls.verify_reply(material[1], "dealer", client, reply)
    with pytest.raises(Exception, match="did not sign this handshake"):   # replayed to another client
        tls.verify_reply(material[1], "dealer", other_client, good)


# ---------------------------------------------------------------- 2. refusals pinned right
def _rogue_hello(address: str, material: tls.TlsMaterial | None, target: str, rank: int,
                 deadline: float) -> pb.HelloReply:
    """A Hello claiming `rank` in a wrong session, sent with `material` (or plaintext) until
    the server answers."""
    hello = pb.Hello(protocol_version=grpc_comm.PROTOCOL_VERSION, session="not-this-session",
                     world_size=3, rank=rank, config_digest="0" * 16, public_key=b"\x09" * 32)
    if material is not None:
        channel = grpc.secure_channel(address, tls.channel_credentials(material),
                                      tls.channel_options(target))
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        stub = pb_grpc.PartyStub(channel)
        while True:
            try:
                return stub.Handshake(hello, timeout=5)
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@pytest.mark.parametrize("with_tls", [True, False], ids=["tls", "plaintext"])
def test_a_refusal_is_recorded_against_the_authenticated_party(good_certs, with_tls):
    """Party 0 (its own certificate) claims rank 1 at party 2 in a wrong session, while party 2
    waits for the others. With TLS, party 2 refuses it for the identity and does not hold it
    against party 1: the three parties then finish their session. Without TLS nobody is
    authenticated: party 2 gives up on rank 1 and says that the claim was unauthenticated."""
    envs, _ = local_env(3, "tfp", timeout=60 if with_tls else 20)
    tls_dir = str(good_certs) if with_tls else ""
    for e in envs:
        e["CRYPTEN_LITE_TLS_DIR"] = tls_dir
    party2 = _start(SCRIPTS / "arith.py", envs[2])
    try:
        material = tls.load(good_certs, "party0") if with_tls else None
        reply = _rogue_hello(envs[2]["CRYPTEN_LITE_PARTIES"].split(",")[2], material, "party2", 1,
                             time.monotonic() + 120)
    except BaseException:
        _stop(party2)
        raise
    if with_tls:
        assert "certificate identity 'party0' does not match claimed rank 1" in reply.error, reply.error
    else:
        assert reply.error.startswith("session") and "unauthenticated: TLS is off" in reply.error
    others = [_start(SCRIPTS / "arith.py", envs[r]) for r in (0, 1)]
    outs = _communicate([party2, *others])
    if with_tls:
        for code, out in outs:
            assert code == 0 and "result [4.5, -10.0, 0.0]" in out, out
    else:
        code, out = outs[0]
        assert code != 0 and "refused party 1's handshake" in out, out
        assert "unauthenticated: TLS is off" in out, out


# ---------------------------------------------------------------- 4. announced sizes
LIMIT = 16 << 20           # the pool's CRYPTEN_LITE_MAX_MESSAGE_BYTES: 2 Mi elements per share
MODEL_LIMIT = 64 << 20     # its CRYPTEN_LITE_MAX_MODEL_BYTES


@pytest.fixture(scope="module")
def small_pool():
    with PartyPool(2, provider="tfp", timeout=600,
                   env={"CRYPTEN_LITE_MAX_MESSAGE_BYTES": str(LIMIT),
                        "CRYPTEN_LITE_MAX_MODEL_BYTES": str(MODEL_LIMIT)}) as pool:
        yield pool


def _peak_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def party_announcement_attack(elements: int):
    """Party 0 sends a hand-made 24-byte announcement ([int64 code, 1 dim, elements]);
    party 1 shares 'its input' as usual. Returns party 1's outcome and that the session works."""
    import crypten_lite
    from crypten_lite.errors import ProtocolError
    from crypten_lite.mpc import primitives
    from crypten_lite.session import current

    s = current()
    out = None
    if s.rank == 0:
        s.comm.broadcast(torch.tensor([primitives.DTYPE_CODES[torch.float32], 1, elements]), 0, rounds=0)
        if elements * 8 <= LIMIT:   # accepted: the source's share of it, as share() draws it
            primitives.przs((elements,))
    else:
        before = _peak_mb()
        try:
            crypten_lite.cryptensor(None, src=0)
            out = ("accepted", _peak_mb() - before)
        except ProtocolError as e:
            out = ("refused", str(e))
    ok = crypten_lite.cryptensor(torch.ones(2) if s.rank == 0 else None).get_plain_text().tolist()
    return out, ok


def _description(shapes: list[list[int]]) -> bytes:
    from crypten_lite.nn import graph_desc as gd
    doc = {"format": "crypten_lite.model", "version": gd.FORMAT_VERSION, "kind": "graph",
           "tensors": [{"dtype": "float32", "shape": s} for s in shapes]}
    text = json.dumps(doc).encode()
    return gd.MAGIC + struct.pack("<Q", len(text)) + text


def party_description_attack(shapes: list[list[int]]):
    """Party 0 broadcasts a description of secret placeholders; party 1 reads it."""
    import crypten_lite
    from crypten_lite.errors import ProtocolError
    from crypten_lite.nn import graph_desc as gd
    from crypten_lite.session import current

    s = current()
    out = None
    if s.rank == 0:
        gd.broadcast(_description(shapes), 0)
    else:
        try:
            gd.read(gd.broadcast(None, 0))
            out = ("accepted", "")
        except ProtocolError as e:
            out = ("refused", str(e))
    ok = crypten_lite.cryptensor(torch.ones(2) if s.rank == 0 else None).get_plain_text().tolist()
    return out, ok


def party_int8_weight(shape: list[int]):
    """Party 1 shares an int8 weight of the owner's (party 0's) announced shape."""
    from crypten_lite.errors import ProtocolError
    from crypten_lite.quantized.mpc_backend import MpcBackend
    from crypten_lite.session import current

    if current().rank == 0:
        return None
    backend = MpcBackend(src_model=0, src_input=1)
    try:
        backend.weight(torch.empty(shape, dtype=torch.int8, device="meta"))
        return ("accepted", "")
    except ProtocolError as e:
        return ("refused", str(e))


def test_announcement_beyond_the_session_limit_is_refused_before_allocating(small_pool):
    elements = 1 << 24        # 128 MiB of share: 8x the session's limit, far below the old 2^31
    status, message = small_pool.run(party_announcement_attack, elements)[1][0]
    assert status == "refused", message
    assert "refused before allocating" in message and str(LIMIT) in message, message
    for _, ok in small_pool.run(party_announcement_attack, 1 << 10):
        assert ok == [1.0, 1.0]


def test_announcement_within_the_limit_is_accepted(small_pool):
    got = small_pool.run(party_announcement_attack, 1 << 10)
    assert got[1][0][0] == "accepted" and got[1][1] == [1.0, 1.0]


@pytest.mark.parametrize("shapes, why", [
    ([[1 << 22]], "more than the session's limit of"),                       # one: 32 MiB of share
    ([[1 << 20]] * 9, "bytes of shares per model"),                          # together: 72 MiB
    ([[1 << 31]] * 20, "more than the session's limit of"),                  # the review's attack
])
def test_model_description_sizes_are_bounded(small_pool, shapes, why):
    status, message = small_pool.run(party_description_attack, shapes)[1][0]
    assert status == "refused" and why in message, message


def test_int8_weight_of_an_oversized_shape_is_refused(small_pool):
    status, message = small_pool.run(party_int8_weight, [1 << 12, 1 << 12])[1]   # 16 Mi elements
    assert status == "refused" and "int8 weight" in message and "before allocating" in message, message
    assert small_pool.run(party_int8_weight, [4, 4])[1] == ("accepted", "")


# ---------------------------------------------------------------- 5. bind
BIND_PROBE = textwrap.dedent('''
    """Report the local addresses on which this party's port and the dealer's port listen."""
    import os
    import crypten_lite

    import ipaddress

    def decode(h):
        if len(h) == 8:
            return str(ipaddress.IPv4Address(bytes.fromhex(h)[::-1]))
        raw = b"".join(bytes.fromhex(h[i:i + 8])[::-1] for i in range(0, 32, 8))
        address = ipaddress.IPv6Address(raw)
        return str(address.ipv4_mapped or address)

    def listening(port):
        found = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = open(table).read().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                host, _, hexport = fields[1].rpartition(":")
                if int(hexport, 16) == port and fields[3] == "0A":
                    found.append(decode(host))
        return sorted(set(found))

    crypten_lite.init()
    rank = crypten_lite.get_rank()
    own = int(os.environ["CRYPTEN_LITE_PARTIES"].split(",")[rank].rpartition(":")[2])
    dealer = int(os.environ["CRYPTEN_LITE_DEALER"].rpartition(":")[2])
    print("LISTEN", rank, listening(own), listening(dealer))
    crypten_lite.uninit()
''')


def test_inherited_config_binding_all_interfaces_does_not_expose_launched_parties(tmp_path):
    config = tmp_path / "deploy.toml"
    config.write_text('bind = "0.0.0.0"\n')
    script = tmp_path / "probe.py"
    script.write_text(BIND_PROBE)
    env = {**_base_env(), "CRYPTEN_LITE_CONFIG": str(config)}
    proc = subprocess.run([sys.executable, "-m", "crypten_lite.cli", "launch", "-n", "2", "--timeout", "120",
                           str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "LISTEN" in line]
    assert len(lines) == 2, proc.stdout
    for line in lines:
        listed = line.split("LISTEN", 1)[1].split(" ", 2)[2]     # after "LISTEN <rank> "
        own, dealer = ast.literal_eval(listed.replace("] [", "], ["))
        assert own and dealer, line
        assert all(ipaddress.ip_address(a).is_loopback for a in own + dealer), line


def test_plaintext_bind_to_all_interfaces_is_warned_about(caplog):
    port = free_ports(1)[0]
    config = Config(rank=0, world_size=1, parties=(f"127.0.0.1:{port}",), bind="0.0.0.0",
                    provider="tfp")
    with caplog.at_level(logging.WARNING, logger="crypten_lite.comm"):
        comm = grpc_comm.GrpcCommunicator(config)
        comm.close()
    assert any("TLS is off" in r.getMessage() and f"0.0.0.0:{port}" in r.getMessage()
               for r in caplog.records), caplog.text
    caplog.clear()
    assert not grpc_comm.warn_plaintext("party 0", [f"127.0.0.1:{port}", "localhost:1", "[::1]:2"])


# ---------------------------------------------------------------- 6. the dealer's MAC first
@pytest.fixture()
def live_dealer():
    ports = free_ports(3)
    config = Config(rank=0, world_size=2, parties=(f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"),
                    dealer=f"127.0.0.1:{ports[2]}", session="m", timeout=60)
    from crypten_lite.provider import dealer_handler
    server = dealer_rpc.DealerServer(config, dealer_handler)
    clients = [dealer_rpc.DealerClient(Config(**{**config.__dict__, "rank": r})) for r in range(2)]
    yield config, clients
    for c in clients:
        c.close()
    server.stop()


def test_dealer_checks_the_mac_before_decoding_anything(live_dealer, monkeypatch):
    config, clients = live_dealer
    decoded = []
    real = dealer_rpc.Request.from_proto
    monkeypatch.setattr(dealer_rpc.Request, "from_proto",
                        classmethod(lambda cls, msg: decoded.append(1) or real(msg)))
    # An unauthenticated batch as large as one message allows (2^17 requests, ~3 MB).
    reqs = [pb.CorrelationRequest(session=config.session, kind="triple", counter=i)
            for i in range(dealer_rpc.MAX_BATCH_REQUESTS)]
    stub = clients[1].stub
    reply = stub.Correlations(pb.CorrelationBatch(requests=reqs, mac=b"\x00" * 32), timeout=120)
    assert "bad MAC" in reply.error and decoded == [], reply.error
    too_many = reqs + reqs[:1]
    reply = stub.Correlations(pb.CorrelationBatch(requests=too_many, mac=b"\x00" * 32), timeout=120)
    assert "exceeds" in reply.error and decoded == [], reply.error
    reply = stub.Prepare(pb.CorrelationBatch(requests=reqs[:10], mac=b"\x00" * 32), timeout=120)
    assert "bad MAC" in reply.error and decoded == [], reply.error
    # A change of one field after rank 0's MAC, or an unknown field added, is refused too.
    good = clients[0].batch_proto([dealer_rpc.Request("triple", 5, "mul", ((4,), (4,)))])
    changed = pb.CorrelationBatch()
    changed.CopyFrom(good)
    changed.requests[0].counter = 6
    assert "bad MAC" in stub.Correlations(changed, timeout=60).error and decoded == []
    # Rank 0's own batch is decoded and answered.
    answer = clients[0].request([dealer_rpc.Request("triple", 5, "mul", ((4,), (4,)))])()
    assert decoded and len(answer) >= 1
