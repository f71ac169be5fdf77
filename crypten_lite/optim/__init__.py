"""crypten_lite.optim: SGD and Adam on encrypted parameters, with torch.optim's semantics.

    optimizer = crypten_lite.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.zero_grad(); loss.backward(); optimizer.step()

Parameters are updated in place (the module keeps the same CrypTensor objects) under
no_grad(); optimizer state (momentum buffers, Adam moments) is secret-shared like the
parameters. Public parameters (torch tensors) have no gradient and are skipped.
"""

from .optimizer import SGD, Adam, Optimizer

__all__ = ["Optimizer", "SGD", "Adam"]
