"""gRPC health checking client (grpc.health.v1), used by `crypten-lite health` and compose."""

from __future__ import annotations

import os

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(target: str, timeout: float = 3.0) -> tuple[bool, str]:
    """(serving?, description) of the gRPC health service at `target`.

    With CRYPTEN_LITE_TLS_DIR set, presents this container's certificate (party{RANK}, or
    dealer when no rank is set) and verifies the target's certificate by its host name.
    """
    tls_dir = os.environ.get("CRYPTEN_LITE_TLS_DIR", "")
    if tls_dir:
        from . import tls
        rank = os.environ.get("CRYPTEN_LITE_RANK")
        identity = tls.party_identity(int(rank)) if rank not in (None, "") else tls.DEALER_IDENTITY
        material = tls.load(tls_dir, identity)
        host = target.rpartition(":")[0]
        target_identity = host if host.startswith(("party", "dealer")) else identity
        channel = grpc.secure_channel(target, tls.channel_credentials(material),
                                      tls.channel_options(target_identity))
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as e:
            return False, f"{target}: {e.code().name}"
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    return serving, f"{target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
