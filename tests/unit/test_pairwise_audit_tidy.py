"""Issue 29's audit tidy-ups and small fixes: Correlation's components and rows (one check
path, corrected() a tuple); a streamed opening that meets the peer's offline ERROR notice (a
ProtocolError saying the peer's offline exchange failed, as a plain receive says, not
"diverged"); gen_doc_figures' AMX probe read once; the LeNet profiles' shared setup loaded by
path in party processes; the pairwise compose commands of the docs; launch's and bench's
refusals of pairwise beyond two parties; the pinned TenSEAL of the pairwise image; the
elementwise HE engine's raw secret-key words never on the wire."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import torch

from crypten_lite.comm import grpc_comm
from crypten_lite.comm.communicator import OFFLINE_ERROR_TAG, with_tag
from crypten_lite.config import Config
from crypten_lite.errors import ProtocolError
from crypten_lite.mpc.launcher import free_ports
from crypten_lite.provider import Correlation

PER = grpc_comm.CHUNK_BYTES // 8  # int64 elements per chunk: above the streaming threshold


def test_corrected_is_a_tuple_whose_change_leaves_the_correlation_alone():
    base = torch.arange(24, dtype=torch.int64)
    seeded = list(base.split(8))[:2]
    fix = torch.full((8,), 7, dtype=torch.int64)
    corr = Correlation(seeded + [None], lambda: [fix], ((8,),) * 3)
    comps = corr.corrected()
    assert isinstance(comps, tuple) and len(comps) == 3 and comps[2] is fix
    with pytest.raises(TypeError):
        comps[0] = torch.zeros(8, dtype=torch.int64)  # type: ignore[index]
    assert corr[0] is seeded[0] and corr.corrected()[2] is fix  # fetched once, same parts


def test_rows_never_read_a_correction_in_the_seeded_memory_as_a_seeded_part():
    """A correction that is a view of the seeded parts' memory at another place: rows() of a
    span across the cut is the components' values or None, never the memory's other words."""
    base = torch.arange(40, dtype=torch.int64)
    seeded = list(base[:16].split(8))            # components 0-1 at words 0-15
    # components 2-3's corrections: 3 where a split would put it, 2 elsewhere in that memory
    fixes = [base[32:40], base[24:32]]
    corr = Correlation(seeded + [None, None], lambda: fixes, ((8,),) * 4)
    comps = corr.corrected()
    rows = corr.rows(0, 4)
    # its ends (words 0 and 24) lie as a split's would; words 16-23 are not component 2
    assert rows is None or all(np.array_equal(rows[j], comps[j].numpy()) for j in range(4))
    assert corr.rows(0, 2).shape == (2, 8) and corr.rows(2, 2) is None
    seeded = list(base[:24].split(8))            # components 0-2 at words 0-23
    adjacent = base[24:32]                       # there where a split would put it: true rows
    corr = Correlation(list(seeded) + [None], lambda: [adjacent], ((8,),) * 4)
    comps = corr.corrected()
    rows = corr.rows(0, 4)
    assert rows is not None and all(np.array_equal(rows[j], comps[j].numpy()) for j in range(4))
    other = torch.arange(100, 108, dtype=torch.int64)  # a separate answer: two memories
    corr = Correlation(list(seeded) + [None], lambda: [other], ((8,),) * 4)
    corr.corrected()
    assert corr.rows(0, 4) is None and corr.rows(0, 3).shape == (3, 8)


def _pair(timeout: float) -> list[grpc_comm.GrpcCommunicator]:
    ports = free_ports(2)
    parties = tuple(f"127.0.0.1:{p}" for p in ports)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(grpc_comm.GrpcCommunicator,
                               Config(rank=r, world_size=2, session=f"audit-{ports[0]}",
                                      timeout=timeout, parties=parties)) for r in range(2)]
        return [f.result(timeout=120) for f in futures]


def test_a_streamed_opening_that_meets_the_peers_error_notice_says_its_exchange_failed():
    """Party 0 sends its offline ERROR notice (the pairwise channel's tagged uint8 frame) where
    party 1 runs a streamed opening: party 1 raises the offline ProtocolError naming party 0,
    not a CommunicationError about diverged programs, and no deadline passes."""
    comms = _pair(timeout=60)
    try:
        notice = with_tag(torch.frombuffer(bytearray(b"\x00" * 64), dtype=torch.uint8),
                          OFFLINE_ERROR_TAG)
        comms[0]._send(notice, 1)

        def fill(start, end, out):
            out.copy_(torch.arange(start, end, dtype=torch.int64))

        with pytest.raises(ProtocolError, match="party 0 stopped its offline exchange") as err:
            comms[1].sum_streamed((PER,), b"", fill)
        assert "diverged" not in str(err.value)
    finally:
        for c in comms:
            c.close()


def test_gen_doc_figures_reads_cpuinfo_once_a_process(monkeypatch):
    """cpu_class is asked per CPU-dependent figure: the AMX probe reads /proc/cpuinfo once."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gen_doc_figures.py"
    spec = importlib.util.spec_from_file_location("gen_doc_figures_audit", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    reads = []
    real = pathlib.Path.read_text

    def counted(self, *a, **k):
        if str(self) == "/proc/cpuinfo":
            reads.append(1)
            return " fpu amx_tile amx_int8 "
        return real(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "read_text", counted)
    gen._has_amx.cache_clear()
    first = [gen.cpu_class() for _ in range(5)]
    assert len(reads) <= 1 and len(set(first)) == 1
    assert gen._has_amx() is True and len(reads) == 1
    gen._has_amx.cache_clear()


def test_the_lenet_profiles_share_one_setup_that_party_processes_load_by_path():
    """benchmarks/dealer_plan_cpu.py's plan job (the LeNet b1 setup of profile_lenet*.py, in
    benchmarks/profile_lenet_model.py) runs in real party processes, which cannot import
    benchmarks/: the plan is one inference's, the same on both parties."""
    import importlib.util
    import pathlib

    from crypten_lite.mpc.launcher import PartyPool
    bench = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
    for name in ("profile_lenet.py", "profile_lenet_calls.py", "dealer_plan_cpu.py"):
        text = (bench / name).read_text()
        assert "profile_lenet_model.py" in text and "lenet()" not in text, name
    spec = importlib.util.spec_from_file_location("dealer_plan_cpu_audit", bench / "dealer_plan_cpu.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with PartyPool(2, timeout=120) as pool:
        plans = pool.run(script._record_plan)
    assert plans[0] == plans[1] and len(plans[0]) > 10
    kinds = {k for k, *_ in plans[0]}
    assert {"weight_triple", "binary_monomials"} <= kinds and "weight_mask" not in kinds  # masked before


def test_pairwise_compose_commands_in_the_docs_are_the_files_own():
    """docs/deployment.md's commands for docker-compose.pairwise.yml are those its header
    gives (Docker is not run here: test_pairwise_deploy.py checks the services)."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    header = (root / "docker-compose.pairwise.yml").read_text()
    lines = [line.split("#")[0].strip() for line in (root / "docs" / "deployment.md").read_text().splitlines()
             if "docker-compose.pairwise.yml" in line and line.startswith("docker compose")]
    assert len(lines) == 2, lines       # up and down
    for line in lines:
        assert f"#   {line}\n" in header, line


def test_launch_and_bench_refuse_pairwise_beyond_two_parties_saying_what_to_do(tmp_path):
    import os
    import subprocess
    import sys
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}

    def cli(*args, **more):
        return subprocess.run([sys.executable, "-m", "crypten_lite.cli", *args], env={**env, **more},
                              capture_output=True, text=True, timeout=120)
    flag = cli("launch", "-n", "3", "--provider", "pairwise", str(script))
    assert flag.returncode == 2 and "ran" not in flag.stdout
    assert "--provider pairwise" in flag.stderr and "use -n 2" in flag.stderr and "--protocol rss" in flag.stderr
    envd = cli("launch", "-n", "4", str(script), CRYPTEN_LITE_PROVIDER="pairwise")
    assert envd.returncode == 2 and "CRYPTEN_LITE_PROVIDER=pairwise" in envd.stderr
    assert "--provider dealer" in envd.stderr and "rss" not in envd.stderr
    unknown = cli("launch", "-n", "2", str(script), CRYPTEN_LITE_PROVIDER="cheetah")
    assert unknown.returncode == 2 and "unset it" in unknown.stderr
    bench = cli("bench", "--provider", "pairwise", "--parties", "3", "--only", "mul_4")
    assert bench.returncode == 2 and "Traceback" not in bench.stderr
    assert "use --parties 2" in bench.stderr and "--protocol rss" in bench.stderr


def test_pairwise_image_pins_a_tenseal_whose_layout_is_checked():
    import pathlib
    import re

    from crypten_lite.provider import he_pow2
    text = (pathlib.Path(__file__).resolve().parents[2] / "docker" / "pairwise.Dockerfile").read_text()
    pinned = re.findall(r'"tenseal==([0-9.]+)"', text)
    assert pinned and pinned[0] in he_pow2.LAYOUT_CHECKED_TENSEAL, pinned


def test_no_raw_secret_key_words_of_the_elementwise_engine_on_the_wire():
    """test_pairwise_security looks for a window of SEAL's own (compressed) save of each key;
    here the key's raw words (NTT form, each data prime) are looked for too, over a two-block
    mul, a matmul and a ReLU's OT correlations, in everything either party sent."""
    pytest.importorskip("tenseal")
    pytest.importorskip("nacl")
    from tests.unit import test_pairwise_security as sec
    from two_party_threads import record_sends, stop_recording
    comms = sec._pair()
    p0, p1 = sec._providers(comms)
    try:
        sent = record_sends(comms)
        try:
            jobs = [("triple", "mul", ((9000,), (9000,)), ()), ("triple", "matmul", ((8, 16), (16, 4)), ()),
                    ("bit", "", ((64,),), ())]
            out = sec._both([lambda p=p: [sec._get(p, k, op, s, par) for k, op, s, par in jobs] for p in (p0, p1)])
        finally:
            stop_recording(comms)
        assert out[0][1] is None and out[1][1] is None, out
        wire = b"".join(sent[0] + sent[1])
        assert len(wire) > 100_000
        for p in (p0, p1):
            for prime in p._engine._primes:
                key = prime.secret_key.data()
                n = 8192
                words = np.fromiter(map(key.data, range(3 * n)), dtype=np.uint64, count=3 * n)
                for start in (100, n + 100, 2 * n + 100):
                    assert words[start:start + 8].astype("<u8").tobytes() not in wire
    finally:
        for p in (p0, p1):
            p.close()
