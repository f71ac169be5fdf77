#!/usr/bin/env bash
# Install crypten_lite with its test extras (torch pinned to its CPU build) into a virtual
# environment (the active one, else .venv: scripts/python_env.sh) and run every test.
#
# The run prints a line as each phase starts (unit, protocol, integration, container), the
# reasons for skipped tests and the 25 slowest tests at the end. Tests that install system
# packages (the Docker test: docker.io & co. with apt-get, a root dockerd, ~3 GB) run only with
# CRYPTEN_LITE_SYSTEM_TESTS=1 (.ci/run sets it). Arguments go to pytest
# (e.g. `bash scripts/test.sh tests/unit -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
python scripts/install_torch.py 2.13.0
echo "test.sh: installing crypten_lite[test] into $VIRTUAL_ENV (pip install -e '.[test]')" >&2
python -m pip install -q -e '.[test]'
python scripts/gen_proto.py --check
if [[ ${CRYPTEN_LITE_SYSTEM_TESTS:-} == 1 ]]; then
    echo "test.sh: CRYPTEN_LITE_SYSTEM_TESTS=1: the system tests run too (they may apt-get install packages and start dockerd)" >&2
else
    echo "test.sh: system tests skipped (set CRYPTEN_LITE_SYSTEM_TESTS=1 to run them: they apt-get install Docker and start dockerd)" >&2
fi
python -m pytest -q -p no:cacheprovider -rfEs --durations=25 "$@"
