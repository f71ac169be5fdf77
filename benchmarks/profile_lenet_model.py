"""LeNet batch 1's private model and recorded plan, set up once for the LeNet profiles.

Shared by benchmarks/profile_lenet.py, profile_lenet_calls.py and dealer_plan_cpu.py. Their
jobs run in PartyPool's party processes, which cannot import benchmarks/ by name, so each job
loads this file by path: ``runpy.run_path(LENET_MODEL)["private_lenet_b1"]()``, with
LENET_MODEL the path the launching script computes from its own ``__file__``.

The setup is `crypten-lite bench --only lenet_b1`'s model: LeNet (crypten_lite.models.lenet,
seeded by torch.manual_seed(11): test data only), its weights secret on party 0, one image
secret on party 1, and a first inference made (it masks the fixed weights), so that a
recorded plan holds one inference's correlations only.
"""

from __future__ import annotations


def private_lenet_b1() -> dict:
    """In a party process: {"comm", "model", "image", "want" (torch's output), "private" (the
    encrypted model, eval mode, its fixed weights masked), "x" (the encrypted image)}."""
    import torch

    import crypten_lite
    from crypten_lite import comm, nn
    from crypten_lite.models import lenet
    c = comm.get()
    torch.manual_seed(11)  # test data only: the bench's seed for LeNet b1
    model = lenet().eval()
    image = torch.randn(1, 1, 28, 28)
    private = nn.from_pytorch(model if c.rank == 0 else None, torch.zeros(1, 1, 28, 28), src=0)
    private.encrypt(src=0)
    private.eval()
    x = crypten_lite.cryptensor(image if c.rank == 1 else None, src=1)
    with torch.no_grad():
        want = model(image)
    private(x).get_plain_text()  # the first inference masks the fixed weights
    return {"comm": c, "model": model, "image": image, "want": want, "private": private, "x": x}


def recorded_plan(setup: dict) -> list:
    """The correlation plan of one more inference of private_lenet_b1's model."""
    from crypten_lite.mpc import offline
    with offline.record() as plan:
        setup["private"](setup["x"]).get_plain_text()
    return plan
