"""Private int8 inference of PyTorch quantized models (DESIGN.md section 8).

Modules in dependency order:

* ``ir``: the integer program (nodes, public attributes, int weights);
* ``requant``: pure integer math of requantization (multipliers, shifts, ties, bounds);
* ``backend``: the operations a program needs (:class:`Backend`) and :class:`PlainBackend`;
* ``lowering``: builds IR nodes for each layer kind;
* ``executor``: runs a program on a backend; per-layer comparison with torch;
* ``handlers``: one handler per torch module / function / method, in three tables;
* ``convert``: eager / FX / PT2E quantized models -> program (traces, walks the graph);
* ``testing``: torch's three quantization flows and an output-agreement check, for tests.

``from_quantized`` (convert, which imports torch.ao.quantization) and the executor load on
first use; running a program needs only ``ir``, ``backend`` and ``executor``.
"""

from crypten_lite.quantized.backend import Backend, PlainBackend
from crypten_lite.quantized.ir import OPS, Node, QuantizedProgram, Rescale, ValueInfo

__all__ = [
    "OPS",
    "Backend",
    "Node",
    "PlainBackend",
    "QuantizedProgram",
    "Rescale",
    "ValueInfo",
    "compare_layers",
    "from_quantized",
    "run",
    "run_float",
]


def __getattr__(name: str):
    # convert imports torch.ao.quantization; load it (and the executor) on first use only
    if name == "from_quantized":
        from crypten_lite.quantized.convert import from_quantized

        return from_quantized
    if name in ("run", "run_float", "compare_layers"):
        from crypten_lite.quantized import executor

        return getattr(executor, name)
    raise AttributeError(name)
