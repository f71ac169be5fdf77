#!/usr/bin/env bash
# Install crypten_lite and run the main example: private inference between 2 local parties + dealer.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[examples]'
crypten-lite launch -n 2 examples/private_inference.py
