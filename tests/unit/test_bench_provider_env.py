"""crypten-lite bench takes its provider as launch does: --provider, else CRYPTEN_LITE_PROVIDER,
else the dealer; a wrong value of the variable is a usage error saying what to do, never
silently the dealer."""

from __future__ import annotations

import pytest

from crypten_lite import bench


@pytest.fixture
def runs(monkeypatch):
    got = []
    monkeypatch.setattr(bench, "run", lambda names, parties, provider, *a, **k: got.append(provider) or [])
    return got


@pytest.mark.parametrize("env, flag, want", [
    (None, [], "dealer"), ("pairwise", [], "pairwise"), ("pairwise", ["--provider", "dealer"], "dealer"),
    ("dealer", ["--provider", "pairwise"], "pairwise"), ("", [], "dealer")])
def test_provider_from_flag_then_environment(monkeypatch, runs, env, flag, want):
    if env is None:
        monkeypatch.delenv("CRYPTEN_LITE_PROVIDER", raising=False)
    else:
        monkeypatch.setenv("CRYPTEN_LITE_PROVIDER", env)
    assert bench.main(["--only", "mul_4", *flag]) == 0
    assert runs == [want]


def test_unknown_provider_in_the_environment_is_a_usage_error(monkeypatch, runs, capsys):
    monkeypatch.setenv("CRYPTEN_LITE_PROVIDER", "dealr")
    with pytest.raises(SystemExit) as e:
        bench.main(["--only", "mul_4"])
    assert e.value.code == 2 and runs == []
    err = capsys.readouterr().err
    assert "CRYPTEN_LITE_PROVIDER='dealr'" in err and "unset it" in err


def test_pairwise_from_the_environment_with_three_parties_is_refused(monkeypatch, runs, capsys):
    monkeypatch.setenv("CRYPTEN_LITE_PROVIDER", "pairwise")
    with pytest.raises(SystemExit) as e:
        bench.main(["--only", "mul_4", "--parties", "3", "--protocol", "additive"])
    assert e.value.code == 2 and runs == []
    assert "exactly 2 parties" in capsys.readouterr().err
