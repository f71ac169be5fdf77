#!/usr/bin/env bash
# Install crypten_lite (torch pinned to its CPU build) into a virtual environment (the active
# one, else .venv: scripts/python_env.sh) and run the main example: private inference between
# 2 local parties + dealer. Afterwards `. .venv/bin/activate` gives you `crypten-lite`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
python scripts/install_torch.py 2.13.0
echo "example.sh: installing crypten_lite[examples] into $VIRTUAL_ENV (pip install -e '.[examples]')" >&2
python -m pip install -q -e '.[examples]'
crypten-lite launch -n 2 examples/private_inference.py
