"""Rank 1 imports a module that does not exist (before init); rank 0 joins the session."""
import os

import crypten_lite

if os.environ["CRYPTEN_LITE_RANK"] == "1":
    import crypten_lite_no_such_module  # noqa: F401
crypten_lite.init()
print("joined", flush=True)
