"""Private int8 inference of PyTorch quantized models (docs/design.md section 8).

Modules in dependency order:

* ``ir``: the integer program (nodes, public attributes, int weights);
* ``requant``: pure integer math of requantization (multipliers, shifts, ties, bounds);
* ``backend``: the operations a program needs (:class:`Backend`) and :class:`PlainBackend`;
* ``lowering``: builds IR nodes for each layer kind;
* ``executor``: runs a program on a backend; per-layer comparison with torch;
* ``handlers``: one handler per torch module / function / method, in three tables;
* ``convert``: eager / FX / PT2E quantized models -> program (traces, walks the graph);
* ``testing``: torch's three quantization flows and an output-agreement check, for tests;
* ``mpc_ops``: short comparisons, max pooling and exact rounding on arithmetic shares;
* ``mpc_backend``: :class:`MpcBackend` (the program on secret shares) and :func:`run_private`;
* ``tensor``: :class:`QuantizedCrypTensor`, ``quantize_per_tensor`` / ``quantize_per_channel``
  of CrypTensors in MPC;
* ``private``: ``program.encrypt(src)`` / ``program(x)`` / :class:`QuantizedOutput`, the calls of a
  float ``crypten_lite.nn`` model (docs/private_models.md).

``from_quantized`` (convert, which imports torch.ao.quantization), the executor and the MPC
modules load on first use; running a program needs only ``ir``, ``backend`` and ``executor``.
A program runs privately with ``run_private(program_or_model, x)`` or ``program.run(x)``, or
like a float model: ``program.encrypt(src=0)``, ``program(x).get_plain_text()``.
"""

from crypten_lite.quantized.backend import Backend, PlainBackend
from crypten_lite.quantized.ir import OPS, Node, QuantizedProgram, Rescale, ValueInfo

__all__ = [
    "OPS",
    "Backend",
    "MpcBackend",
    "Node",
    "PlainBackend",
    "QuantizedCrypTensor",
    "QuantizedOutput",
    "QuantizedProgram",
    "Rescale",
    "ValueInfo",
    "compare_layers",
    "dequantize",
    "from_quantized",
    "quantize_per_channel",
    "quantize_per_tensor",
    "run",
    "run_float",
    "run_private",
]

# name -> module that defines it, imported on first use
_LAZY = {
    "run": "executor", "run_float": "executor", "compare_layers": "executor",
    "MpcBackend": "mpc_backend", "run_private": "mpc_backend",
    "QuantizedCrypTensor": "tensor", "quantize_per_tensor": "tensor",
    "quantize_per_channel": "tensor", "dequantize": "tensor",
    "QuantizedOutput": "private",
}


def __getattr__(name: str):
    # convert imports torch.ao.quantization; load it (and the executor) on first use only
    if name == "from_quantized":
        from crypten_lite.quantized.convert import from_quantized

        return from_quantized
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"crypten_lite.quantized.{_LAZY[name]}"), name)
    raise AttributeError(name)
