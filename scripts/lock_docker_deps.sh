#!/usr/bin/env bash
# Regenerate docker/requirements.lock from docker/requirements.in: every package the image
# installs besides torch, pinned to one version with the sha256 of each of its files on PyPI
# (so the lock holds on any platform the image is built for). Only PyPI is asked (this
# machine's other pip indexes and find-links are ignored), for Python 3.11, the image's.
# Needs network access to PyPI; installs pip-tools into a throwaway venv.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3.11 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "pip-tools==7.6.2"
# This machine's pip configuration (other indexes, find-links, constraints) is left out; only
# a CA bundle is kept (an intercepting proxy needs it).
cert="${PIP_CERT:-}"
if [[ -z "$cert" && -f /etc/ssl/certs/ca-certificates.crt ]]; then
    cert=/etc/ssl/certs/ca-certificates.crt
fi
cd "$ROOT"
env $(env | grep -o '^PIP_[A-Z_]*' | sed 's/^/-u /') PIP_CONFIG_FILE=/dev/null PIP_CERT="$cert" \
    "$work/venv/bin/pip-compile" --quiet \
    --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
    --index-url https://pypi.org/simple \
    --output-file docker/requirements.lock docker/requirements.in
echo "wrote docker/requirements.lock"
