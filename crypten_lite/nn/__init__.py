"""crypten_lite.nn: modules, layers, losses and model import from PyTorch (torch.fx).

    model = crypten_lite.nn.from_pytorch(torch_model, dummy_input).encrypt(src=0)
    # or with the model on party 0 only (the others rebuild it from a description, graph_desc):
    model = crypten_lite.nn.from_pytorch(torch_model if rank == 0 else None, shape, src=0).encrypt(src=0)
    x = crypten_lite.cryptensor(data, src=1)
    loss = crypten_lite.nn.CrossEntropyLoss()(model(x), labels)
    loss.backward()

Importing this package also installs autograd (`CrypTensor.backward`).
"""

from .. import _quiet
from .. import autograd as _autograd  # noqa: F401  (installs CrypTensor.backward)
from . import functional
from .from_pytorch import CONVERTERS, FUNCTIONS, METHODS, from_pytorch
from .generation import PrivateGenerator, generate
from .layers import (AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, BCELoss,
                     BCEWithLogitsLoss, Conv1d, Conv2d, ConvTranspose2d, CrossEntropyLoss, Dropout,
                     Flatten, GELU, Identity, L1Loss, LayerNorm, Linear, LogSoftmax, MaxPool2d,
                     MSELoss, NLLLoss, ReLU, ReLU6, Sigmoid, SiLU, Softmax, Tanh)
from .module import Module, ModuleDict, ModuleList, Sequential
from .transformer_ops import PrivateTokens, share_tokens

_quiet.install()  # torchao's notes about itself when transformers imports it (crypten_lite._quiet)

__all__ = [
    "Module", "Sequential", "ModuleList", "ModuleDict", "functional", "from_pytorch",
    "share_tokens", "PrivateTokens", "generate", "PrivateGenerator",
    "CONVERTERS", "FUNCTIONS", "METHODS",
    "Linear", "Conv1d", "Conv2d", "ConvTranspose2d", "BatchNorm1d", "BatchNorm2d", "LayerNorm",
    "Dropout", "ReLU", "ReLU6", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax",
    "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "Flatten", "Identity",
    "MSELoss", "L1Loss", "BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "NLLLoss",
]
