#!/usr/bin/env bash
# Make a headless browser available for the serving page's test
# (tests/integration/test_serve_web.py), modeled on scripts/docker_engine.sh:
#
#   1. install Debian's chromium and chromium-driver when one is missing (apt-get; `apt-get
#      update` once first if the install fails);
#   2. install selenium into this Python (`python -m pip install selenium`) when missing.
#
# Idempotent. On success prints one line on stdout: the chromium binary's path. On failure
# exits non-zero with the reason on stderr. Chromium runs as root only with --no-sandbox (the
# test passes it, with a fresh --user-data-dir and every background network feature off).
set -euo pipefail
export PATH="/usr/bin:/usr/sbin:/bin:/sbin:${PATH}"
PYTHON="${PYTHON:-python}"
PACKAGES=(chromium chromium-driver)

fail() { echo "browser_engine.sh: $*" >&2; exit 1; }

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || fail "packages ${missing[*]} are missing and installing them needs root"
    command -v apt-get >/dev/null || fail "packages ${missing[*]} are missing and there is no apt-get"
    echo "browser_engine.sh: installing ${missing[*]}" >&2
    apt_install() {
        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends \
            -o DPkg::Lock::Timeout=300 "${missing[@]}" >&2
    }
    if ! apt_install; then
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get update -q \
            -o DPkg::Lock::Timeout=300 >&2 || fail "apt-get update failed"
        apt_install || fail "apt-get install ${missing[*]} failed"
    fi
fi
command -v chromium >/dev/null || fail "chromium is not on PATH after the install"
command -v chromedriver >/dev/null || fail "chromedriver is not on PATH after the install"
if ! "$PYTHON" -c "import selenium" 2>/dev/null; then
    echo "browser_engine.sh: installing selenium" >&2
    timeout 600 "$PYTHON" -m pip install -q selenium >&2 || fail "pip install selenium failed"
fi
command -v chromium
