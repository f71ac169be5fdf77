"""Provider 'pairwise' as a deployment: `crypten-lite launch` with CRYPTEN_LITE_PROVIDER=
pairwise starts two parties and no dealer; docker-compose.pairwise.yml has no dealer
service and configures both parties for pairwise (static checks; Docker itself is not run)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = """
import torch, crypten_lite
crypten_lite.init()
from crypten_lite.session import current
x = crypten_lite.cryptensor(torch.tensor([1.5, -2.0]), src=0)
y = crypten_lite.cryptensor(torch.tensor([2.0, 4.0]), src=1)
print("provider", current().provider.name, (x * y).get_plain_text().tolist())
"""


def test_compose_has_no_dealer():
    compose = yaml.safe_load((ROOT / "docker-compose.pairwise.yml").read_text())
    services = compose["services"]
    assert set(services) == {"certs", "party0", "party1"}
    for name in ("party0", "party1"):
        env = services[name]["environment"]
        assert env["CRYPTEN_LITE_PROVIDER"] == "pairwise" and env["CRYPTEN_LITE_WORLD_SIZE"] == "2"
        assert "CRYPTEN_LITE_DEALER" not in env
    assert "dealer" not in services["certs"]["command"][0]
    assert (ROOT / services["party0"]["build"]["dockerfile"]).exists()


def test_launch_pairwise_from_the_environment(tmp_path):
    pytest.importorskip("tenseal")
    pytest.importorskip("nacl")
    script = tmp_path / "mul.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, CRYPTEN_LITE_PROVIDER="pairwise")
    out = subprocess.run([sys.executable, "-m", "crypten_lite.cli", "launch", "-n", "2", str(script)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if "provider" in line]
    assert len(lines) == 2 and all("provider pairwise [3.0, -8.0]" in line for line in lines), out.stdout
    assert "dealer" not in out.stderr.lower() or "no dealer" in out.stderr.lower(), out.stderr


def test_launch_pairwise_refuses_three_parties(tmp_path):
    script = tmp_path / "x.py"
    script.write_text("print(1)\n")
    out = subprocess.run([sys.executable, "-m", "crypten_lite.cli", "launch", "-n", "3",
                          "--provider", "pairwise", str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "exactly 2 parties" in out.stderr


PREFETCH = """
import torch, crypten_lite
from crypten_lite.mpc import offline
crypten_lite.init()
x = crypten_lite.cryptensor(torch.tensor([1.5, -2.0]), src=0)
y = crypten_lite.cryptensor(torch.tensor([2.0, 4.0]), src=1)
with offline.record() as plan:
    (x * y).get_plain_text()
offline.prefetch(plan)
print("product", (x * y).get_plain_text().tolist())
"""


def test_launch_progress_flag_draws_rank_0s_offline_line(tmp_path):
    pytest.importorskip("tenseal")
    pytest.importorskip("nacl")
    script = tmp_path / "prefetch.py"
    script.write_text(PREFETCH)
    env = {k: v for k, v in os.environ.items() if k != "CRYPTEN_LITE_PROGRESS"}
    out = subprocess.run([sys.executable, "-m", "crypten_lite.cli", "launch", "-n", "2",
                          "--provider", "pairwise", "--progress", str(script)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("product [3.0, -8.0]") == 2, out.stdout
    lines = [line for line in out.stderr.splitlines() if "pairwise offline:" in line]
    assert lines and all(line.startswith("[rank 0] ") for line in lines), out.stderr[-2000:]
    assert "1/1 correlations" in lines[-1] and "MB/s" in lines[-1] and "s left" in lines[-1]


STORED = """
import sys, torch, crypten_lite
from crypten_lite.mpc import offline
crypten_lite.init()
x = crypten_lite.cryptensor(torch.tensor([1.5, -2.0]), src=0)
y = crypten_lite.cryptensor(torch.tensor([2.0, 4.0]), src=1)
with offline.record() as plan:
    (x * y).get_plain_text()
if sys.argv[1] == "make":
    print("store", offline.make_store(plan, sys.argv[2]))
else:
    offline.prefetch(plan)              # CRYPTEN_LITE_OFFLINE_STORE names the store
    from crypten_lite.session import current
    made = current().provider.stats["pairwise_made"]
    z = (x * y).get_plain_text().tolist()
    print("product", z, "made online", current().provider.stats["pairwise_made"] - made)
"""


def test_offline_store_made_in_one_launch_is_used_by_the_next(tmp_path):
    pytest.importorskip("tenseal")
    pytest.importorskip("nacl")
    script = tmp_path / "stored.py"
    script.write_text(STORED)
    store = str(tmp_path / "store-{rank}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_OFFLINE")}
    env["CRYPTEN_LITE_OFFLINE_KEY"] = str(tmp_path / "key-{rank}")

    def launch(*args, **more):
        return subprocess.run([sys.executable, "-m", "crypten_lite.cli", "launch", "-n", "2",
                               "--provider", "pairwise", str(script), *args],
                              env={**env, **more}, capture_output=True, text=True, timeout=600)

    made = launch("make", store)
    assert made.returncode == 0, made.stderr[-2000:]
    ids = {line.split()[-1] for line in made.stdout.splitlines() if "store" in line}
    assert len(ids) == 1, made.stdout                    # both parties name the same store
    used = launch("use", CRYPTEN_LITE_OFFLINE_STORE=store)
    assert used.returncode == 0, used.stderr[-2000:]
    assert used.stdout.count("product [3.0, -8.0] made online 0") == 2, used.stdout
    again = launch("use", CRYPTEN_LITE_OFFLINE_STORE=store)
    assert again.returncode != 0
    assert "was already used" in again.stderr, again.stderr[-3000:]
