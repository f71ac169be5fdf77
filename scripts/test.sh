#!/usr/bin/env bash
# Install crypten_lite with its test extras (torch pinned to the CPU wheel) and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test]'
python scripts/gen_proto.py --check
python -m pytest -q -p no:cacheprovider "$@"
