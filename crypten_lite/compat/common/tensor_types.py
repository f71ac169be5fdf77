"""CrypTen's tensor type predicates."""

import torch


def is_tensor(t) -> bool:
    return torch.is_tensor(t)


def is_float_tensor(t) -> bool:
    return torch.is_tensor(t) and t.dtype.is_floating_point


def is_int_tensor(t) -> bool:
    return torch.is_tensor(t) and not t.dtype.is_floating_point and t.dtype != torch.bool
