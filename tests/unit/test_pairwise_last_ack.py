"""Provider 'pairwise': the last message of an exchange tampered in transit. Its receiver
raises ProtocolError and sends an ERROR frame, but its sender has already left the
exchange (rank 0 after a plain acknowledgement; rank 1 after its acknowledgement back): the
ERROR frame is then the next message that party reads from the peer, online or offline,
and it must raise ProtocolError there, never be taken for an online share (issue 29)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite.errors import ProtocolError  # noqa: E402
from crypten_lite.provider import ot  # noqa: E402
from crypten_lite.provider.pairwise import ACK  # noqa: E402
from tests.unit.test_pairwise_ot_reuse import BIN_PLAN, _ok  # noqa: E402
from tests.unit.test_pairwise_security import _both, _pair, _providers  # noqa: E402

HEADER_BYTES, MAC_BYTES = 46, 32


def _tamper_acks(comm, flagged: bool) -> dict:
    """comm's ACK frames (the plain one, or with flagged: one saying its data ended the
    exchange; rank 1's acknowledgement back is plain) with one bit of the MAC flipped."""
    real, seen = comm._send, {"n": 0}

    def evil(tensor, dst):
        raw = tensor.numpy().tobytes()
        if tensor.dtype == torch.uint8 and raw[:4] == b"CLPW" and raw[5] == ACK \
                and (len(raw) == HEADER_BYTES + MAC_BYTES + 1) == flagged:
            b = bytearray(raw)
            b[-1] ^= 0x01
            tensor = torch.frombuffer(b, dtype=torch.uint8)
            seen["n"] += 1
        real(tensor, dst)
    comm._send = evil
    return seen


def _run(ps, plan):
    def one(p):
        p.prefetch(plan)
        return [p.get(k, s, op, par).corrected() for k, op, s, par in plan]
    return _both([lambda p=p: one(p) for p in ps])


def _online_recv_fails(comms, r):
    """Party r's next online receive from its peer (the peer sends its share too) raises."""
    share = torch.arange(8, dtype=torch.int64)
    got = _both([lambda q=q: comms[q].exchange({1 - q: share}, [1 - q]) for q in range(2)])
    assert isinstance(got[r][1], ProtocolError), got[r]
    assert "offline" in str(got[r][1]) and f"party {1 - r}" in str(got[r][1])


@pytest.mark.parametrize("sender, flagged", [(0, False), (1, False), (0, True)])
def test_a_tampered_last_acknowledgement_stops_both_parties(monkeypatch, sender, flagged):
    """sender 0: rank 0's plain acknowledgement (an OT bin: rank 1's message ends it);
    sender 1: rank 1's acknowledgement back (a bit alone: rank 0's corrections end it);
    flagged: rank 0's acknowledgement saying its data ended the exchange (a bit alone), rank
    0 then waits for rank 1's and reads the ERROR frame in the exchange."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    comms = _pair()
    ps = _providers(comms)
    _ok(_both([lambda p=p: p.get("bit_mul", [(2, 1), (2, 1)]).corrected() for p in ps]))  # pools
    plan = BIN_PLAN if sender == 0 and not flagged else [("bit", "", [(5,)], ())]
    seen = _tamper_acks(comms[sender], flagged)
    out = _run(ps, plan)
    assert seen["n"] == 1
    detector = 1 - sender
    assert isinstance(out[detector][1], ProtocolError), out[detector]
    if flagged:                          # it waited in the exchange
        assert isinstance(out[sender][1], ProtocolError), out[sender]
    else:                                # it had left the exchange: its next read raises
        assert out[sender][1] is None, out[sender]
        _online_recv_fails(comms, sender)
