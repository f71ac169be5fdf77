"""An int8 program with the calls of a crypten_lite.nn.Module: encrypt, eval, __call__.

    private = crypten_lite.nn.from_pytorch(qmodel if rank == 0 else None, dummy, src=0)
    private.encrypt(src=0)                      # party 0's int8 weights become shares
    private.eval()
    x = crypten_lite.cryptensor(images, src=1)  # party 1's images become shares
    logits = private(x).get_plain_text()        # what the torch model returns

the same user code as for a float model. Underneath, :meth:`encrypt` builds one
:class:`~crypten_lite.quantized.mpc_backend.MpcBackend`, checks that every party holds the
owner's public program (one all-gather of digests) and shares every weight once; each
call is :func:`~crypten_lite.quantized.mpc_backend.run_private` with that backend, so a call
after ``encrypt`` costs what ``run_private`` costs minus the weights' sharing.

``private(x)`` quantizes a CrypTensor input in MPC (within one step of torch's input
quantization, and some comparison rounds); ``private(images_or_None, src=1)`` lets the data
owner quantize its plaintext images itself, exactly as torch does and without those rounds.
"""

from __future__ import annotations

import torch

from crypten_lite.cryptensor import CrypTensor
from crypten_lite.errors import ProtocolError
from crypten_lite.quantized.ir import QuantizedProgram, ValueInfo
from crypten_lite.session import current


class QuantizedOutput:
    """The secret int8 output of ``program(x)``.

    ``get_plain_text()`` reveals what the torch model returns: the float32 reals
    ``(q - zero_point) * scale``, exactly (one opening of the integers, as
    ``run_private(reveal=True)``). ``int_repr()``, ``q_scale()``, ``q_zero_point()`` and
    ``dequantize()`` are those of the underlying
    :class:`~crypten_lite.quantized.tensor.QuantizedCrypTensor` (:attr:`quantized`).
    """

    def __init__(self, quantized):
        self.quantized = quantized

    @property
    def shape(self) -> torch.Size:
        return self.quantized.shape

    def size(self, dim: int | None = None):
        return self.quantized.size(dim)

    def dim(self) -> int:
        return self.quantized.dim()

    def int_repr(self) -> CrypTensor:
        """The secret integers (an int64 CrypTensor)."""
        return self.quantized.int_repr()

    def q_scale(self) -> float:
        return self.quantized.q_scale()

    def q_zero_point(self) -> int:
        return self.quantized.q_zero_point()

    def dequantize(self, precision: int | None = None) -> CrypTensor:
        """A float CrypTensor (for further private computation; one truncation)."""
        return self.quantized.dequantize(precision)

    def get_plain_text(self, dst: int | None = None) -> torch.Tensor | None:
        """The float32 output torch's quantized model returns (to every party, or ``dst`` only)."""
        ints = self.int_repr().get_plain_text(dst)
        if ints is None:
            return None
        info = ValueInfo("quant", self.q_scale(), self.q_zero_point(), 0, 0)
        return info.to_real(ints).to(torch.float32)

    reveal = get_plain_text

    def __bool__(self):
        raise ProtocolError("a secret output cannot be used as a Python bool; reveal it with "
                            "get_plain_text() first")

    def __repr__(self) -> str:
        return (f"QuantizedOutput(shape={tuple(self.shape)}, scale={self.q_scale():.6g}, "
                f"zero_point={self.q_zero_point()}, encrypted=True)")


def _holds_weights(program: QuantizedProgram) -> bool:
    return all(w.device.type != "meta" for n in program.nodes for w in n.weights.values())


def encrypt(program: QuantizedProgram, src: int = 0, **backend_options) -> QuantizedProgram:
    """Share the weights of party ``src`` once (see the module docstring); returns ``program``."""
    from crypten_lite.quantized.mpc_backend import MpcBackend

    s = current()
    if program.__dict__.get("_backend") is not None:
        raise ProtocolError("this program is already encrypted")
    model_src = program.__dict__.get("_model_src")
    if model_src is not None and src != model_src:
        raise ProtocolError(f"this program came from party {model_src} (from_pytorch(..., src="
                            f"{model_src})), which alone holds its weights; call encrypt(src={model_src})")
    if s.rank == src and not _holds_weights(program):
        raise ProtocolError(f"party {src} holds only the public part of this program, not its weights; "
                            "encrypt(src=...) must name the model owner")
    # src_input is set per call (it matters only for a plaintext input)
    backend = MpcBackend(src_model=src, src_input=src, **backend_options)
    prepared = backend.prepare(program)  # every party checks the owner's public program
    for node in prepared.nodes:
        for w in node.weights.values():
            backend.weight(w)
    object.__setattr__(program, "_backend", backend)
    return program


def call(program: QuantizedProgram, x, src: int | None = None):
    """``program(x)``: the secret output (:class:`QuantizedOutput`, or a float CrypTensor)."""
    from crypten_lite.quantized.mpc_backend import run_private
    from crypten_lite.quantized.tensor import QuantizedCrypTensor

    s = current()
    backend = program.__dict__.get("_backend")
    if isinstance(x, CrypTensor):
        if src is not None:
            raise ProtocolError("program(x, src=...) is for a plaintext input; x is already a CrypTensor")
    elif src is None and backend is not None:
        raise ProtocolError("program(x) takes a CrypTensor, or the data owner's plaintext tensor with "
                            "src=<its rank> (None on the other parties)")
    elif src is not None and not 0 <= src < s.world_size:
        raise ProtocolError(f"src={src} is out of range: ranks are 0..{s.world_size - 1}")
    if backend is None:
        options = {} if src is None else {"src_input": src}
        out = run_private(program, x, reveal=False, **options)
    else:
        if src is not None:
            backend.src_input = src
        out = run_private(program, x, reveal=False, backend=backend)
    if isinstance(out, QuantizedCrypTensor):
        return QuantizedOutput(out)
    return out
