"""The client's retry schedule and service check (shared by Client and AsyncClient)."""
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

CLIENT_DIR = Path(__file__).resolve().parents[2] / "client"   # the client is its own package
if str(CLIENT_DIR) not in sys.path:
    sys.path.insert(0, str(CLIENT_DIR))

from crypten_lite_client.client import ClientError, Retry, as_batch, one_service


def _info(**kw):
    base = dict(world_size=2, protocol="additive", sample_shape=[3], precision=16, model="m")
    base.update(kw)
    return SimpleNamespace(**base)


def test_retry_pauses_double_up_to_a_second_and_refuse_other_codes():
    retry = Retry(3600.0)
    pauses = [retry.pause_after(ClientError("down", "UNAVAILABLE")) for _ in range(7)]
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert 0 < retry.left() <= 3600.0
    with pytest.raises(ClientError) as e:
        retry.pause_after(ClientError("bad input", "INVALID_ARGUMENT"))
    assert e.value.code == "INVALID_ARGUMENT"


def test_retry_ends_at_its_deadline():
    retry = Retry(0.0)
    with pytest.raises(ClientError) as e:
        retry.left()
    assert e.value.code == "DEADLINE_EXCEEDED"
    with pytest.raises(ClientError) as e:      # no pause that would pass the deadline
        retry.pause_after(ClientError("down", "UNAVAILABLE"))
    assert e.value.code == "UNAVAILABLE"


def test_one_service_refuses_parties_that_disagree():
    assert one_service([_info(), _info()], 2).model == "m"
    with pytest.raises(ClientError, match="different services") as e:
        one_service([_info(), _info(precision=12)], 2)
    assert e.value.code == "mismatch"
    with pytest.raises(ClientError, match="another number of parties"):
        one_service([_info(world_size=3)] * 3, 2)


def test_as_batch_adds_the_batch_dimension_to_one_sample_only():
    x, single = as_batch([1, 2, 3], _info())
    assert single and x.shape == (1, 3) and x.dtype == np.float64
    x, single = as_batch(np.zeros((4, 3)), _info())
    assert not single and x.shape == (4, 3)
