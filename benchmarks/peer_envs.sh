#!/usr/bin/env bash
# Make (or reuse) the separate virtual environments of the peer systems that the side-by-side
# benchmarks measure: CrypTen 0.4.1 and SecretFlow SPU. They are never dependencies of
# crypten_lite; each lives in its own venv under $CRYPTEN_LITE_PEERS
# (default ~/.cache/crypten_lite/peers). Prints the python of each environment it made.
#   bash benchmarks/peer_envs.sh            # both
#   bash benchmarks/peer_envs.sh crypten    # CrypTen only (torch==2.13.0 CPU + crypten --no-deps)
#   bash benchmarks/peer_envs.sh spu        # SPU only (pip install spu)
set -euo pipefail
root="${CRYPTEN_LITE_PEERS:-$HOME/.cache/crypten_lite/peers}"
want="${1:-all}"
mkdir -p "$root"

make_env() {  # name, then pip arguments (one install line per argument group, separated by ';')
  local name=$1; shift
  local py="$root/$name/bin/python"
  if [ -x "$py" ] && [ -f "$root/$name/.ready" ]; then echo "$py"; return; fi
  echo "making the $name environment in $root/$name (a few minutes, once) ..." >&2
  python3 -m venv "$root/$name"
  "$py" -m pip install -q --upgrade pip >&2
  "$@" "$py"
  touch "$root/$name/.ready"
  echo "$py"
}

crypten_install() {
  local py=$1
  "$py" -m pip install -q torch==2.13.0 >&2
  "$py" -m pip install -q numpy onnx pyyaml omegaconf >&2
  "$py" -m pip install -q --no-deps crypten==0.4.1 >&2
  # CrypTen 0.4.1 imports torch.onnx._internal.registration at import time (its ONNX model
  # converter), which torch 2.13 no longer has. The side-by-side benchmarks use only its tensors
  # and providers, so the venv gets an empty stand-in module for that one import (a .pth file in
  # the venv's site-packages; nothing else of CrypTen or torch is changed).
  local site
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cat > "$site/crypten_torch213_shim.py" <<'PY'
"""Stand-in for torch.onnx._internal.registration (gone in torch 2.13), imported by CrypTen 0.4.1's
ONNX converter at import time; the benchmarks never convert models through ONNX."""
import sys
import types

try:
    import torch.onnx._internal.registration  # noqa: F401
except Exception:  # torch without it: give CrypTen's import an empty registry
    mod = types.ModuleType("torch.onnx._internal.registration")
    mod.registry = None
    sys.modules["torch.onnx._internal.registration"] = mod
PY
  echo "import crypten_torch213_shim" > "$site/crypten_torch213_shim.pth"
  "$py" -c "import crypten" >&2
}

spu_install() {
  local py=$1
  "$py" -m pip install -q spu >&2
}

case "$want" in
  crypten) make_env crypten crypten_install ;;
  spu) make_env spu spu_install ;;
  all) make_env crypten crypten_install; make_env spu spu_install ;;
  *) echo "usage: bash benchmarks/peer_envs.sh [crypten|spu|all]" >&2; exit 2 ;;
esac
