"""CrypTen's `crypten.nn.init`: torch.nn.init on public tensors; on an encrypted tensor the
initial values are drawn by torch.nn.init at party 0 (the model owner) and shared from it."""

import torch

from ..tensor import CrypTensor, MPCTensor

_NAMES = ("constant_", "dirac_", "ones_", "zeros_", "eye_", "kaiming_normal_", "kaiming_uniform_",
          "normal_", "orthogonal_", "sparse_", "trunc_normal_", "uniform_", "xavier_normal_",
          "xavier_uniform_")


def _make(name: str):
    torch_init = getattr(torch.nn.init, name)

    def init(tensor, *args, **kwargs):
        if not isinstance(tensor, CrypTensor):
            return torch_init(tensor, *args, **kwargs)
        plain = torch_init(torch.zeros(tuple(tensor.size())), *args, **kwargs)
        return tensor.set(MPCTensor(plain, src=0))
    init.__name__ = name
    init.__doc__ = f"torch.nn.init.{name}; encrypted tensors get party 0's draw, secret-shared."
    return init


for _name in _NAMES:
    if hasattr(torch.nn.init, _name):
        globals()[_name] = _make(_name)
