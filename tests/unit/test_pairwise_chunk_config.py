"""Provider 'pairwise', its working-set budget (CRYPTEN_LITE_PAIRWISE_CHUNK_MB): a bad value is
a ConfigError that says what to use, and parties with different budgets (their large
correlations would be sliced differently) are refused at the handshake on both parties.
That sliced correlations hold: tests/protocol/test_pairwise_chunks.py."""

from __future__ import annotations

import pytest

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite.config import Config  # noqa: E402
from crypten_lite.errors import ConfigError, ProtocolError  # noqa: E402
from crypten_lite.provider import pairwise  # noqa: E402
from crypten_lite.provider.pairwise import PairwiseProvider  # noqa: E402
from tests.unit.test_pairwise_security import _both, _pair  # noqa: E402


@pytest.mark.parametrize("raw", ["lots", "0", "-3", "nan"])
def test_bad_chunk_budget_is_a_config_error(monkeypatch, raw):
    monkeypatch.setenv(pairwise.CHUNK_ENV, raw)
    with pytest.raises(ConfigError, match=pairwise.CHUNK_ENV):
        pairwise.chunk_bytes()


def test_chunk_budget_from_the_environment(monkeypatch):
    monkeypatch.delenv(pairwise.CHUNK_ENV, raising=False)
    assert pairwise.chunk_bytes() == pairwise.CHUNK_MB << 20
    monkeypatch.setenv(pairwise.CHUNK_ENV, "0.5")
    assert pairwise.chunk_bytes() == 1 << 19


def test_different_chunk_budgets_are_refused_at_the_handshake():
    class Other(PairwiseProvider):
        def _chunk_budget(self):
            return 16 << 20
    comms = _pair()
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="t") for r in range(2)]
    out = _both([lambda: PairwiseProvider(cfg[0], comms[0]), lambda: Other(cfg[1], comms[1])])
    for r in range(2):
        err = out[r][1]
        assert isinstance(err, ProtocolError) and "parameters differ" in str(err), out[r]
        assert pairwise.CHUNK_ENV in str(err)


def test_progress_line_counts_inside_a_sliced_correlation(monkeypatch, capsys):
    """One large correlation made in slices: the line's time left comes from the slices made
    (without them it would stay 'time left unknown' until the correlation ends)."""
    monkeypatch.setenv(pairwise.PROGRESS_ENV, "1")
    monkeypatch.setattr(pairwise._Progress, "TICK", 3600.0)
    stats = {"pairwise_bytes_sent": 0, "pairwise_bytes_received": 0}
    bar = pairwise._Progress([40], stats, rank=0)
    bar.current = 40
    bar._draw()
    assert "time left unknown" in capsys.readouterr().err
    bar.within(0.5)
    bar._draw()
    assert "0/1 correlations" in (err := capsys.readouterr().err) and " s left" in err
    assert "unknown" not in err
    bar.step(1, 40)
    bar.done()
    assert bar.inside == 0.0
