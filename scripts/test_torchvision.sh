#!/usr/bin/env bash
# Runs tests/torchvision (issue 13: the torchvision model zoo through from_pytorch, privately)
# in a separate virtual environment with torch and torchvision built for each other.
#
# Why a separate environment: torchvision's C++ ops load only into the torch build they were
# compiled for, and the main environment's torch (a CPU build) has no matching torchvision.
#
#   scripts/test_torchvision.sh [pytest arguments...]
#
# Environment: TV_VENV (default .venv-torchvision in the repository), TORCH_SPEC and
# TORCHVISION_SPEC (default torch==2.14.1 and torchvision==0.29.1), PYTHON (default python3).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${TV_VENV:-$repo/.venv-torchvision}"
torch_spec="${TORCH_SPEC:-torch==2.14.1}"
vision_spec="${TORCHVISION_SPEC:-torchvision==0.29.1}"
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torchvision" 2>/dev/null; then
    "$venv/bin/pip" install "$torch_spec" "$vision_spec"
fi
if ! "$venv/bin/python" -c "import crypten_lite, pytest" 2>/dev/null; then
    "$venv/bin/pip" install -e "$repo[test]"
fi
# the project's install must not have replaced the torch torchvision was built for
"$venv/bin/python" - "$torch_spec" <<'PY'
import sys, torch, torchvision
want = sys.argv[1].split("==")[-1]
if "==" in sys.argv[1] and torch.__version__.split("+")[0] != want:
    sys.exit(f"torch {torch.__version__} in the venv, {sys.argv[1]} expected")
torchvision.models.resnet18()
print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
PY
cd "$repo"
exec "$venv/bin/python" -m pytest -q tests/torchvision "$@"
