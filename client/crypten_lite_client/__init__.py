"""Torch-free client of `crypten-lite serve`: secret-share an input, reconstruct the output.

    from crypten_lite_client import Client
    client = Client(["host0:9100", "host1:9100"], token="...", tls="ca.pem")
    logits = client.predict(x)      # numpy array, batch first
    # asyncio: async with AsyncClient(...) as c: logits = await c.predict(x)

Depends on numpy, grpcio, protobuf and cryptography only.
"""

from .aio import AsyncClient
from .client import Client, ClientError, decode, encode, reconstruct, split

__all__ = ["Client", "AsyncClient", "ClientError", "encode", "decode", "split", "reconstruct"]
