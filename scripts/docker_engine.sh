#!/usr/bin/env bash
# Make a Docker engine answer on this machine (Debian/Ubuntu, as root), for the container test
# (tests/integration/test_compose_docker.py) and for trying docker-compose.yml by hand:
#
#   1. install Debian's docker.io, docker-compose (v1), containerd, runc, iptables and
#      debootstrap when one is missing (apt-get; `apt-get update` first only if that fails);
#   2. start dockerd in the background when no engine answers (no systemd needed), logging
#      to $CRYPTEN_LITE_DOCKERD_LOG (default /var/log/crypten-lite-dockerd.log);
#   3. wait for the engine, at most $CRYPTEN_LITE_DOCKER_START_TIMEOUT seconds (default 120).
#
# Idempotent: a running engine is left alone. On success prints one line on stdout:
# `running` (an engine was already up) or `started PID` (this script started dockerd PID; the
# caller may stop it with `kill PID`). On failure exits non-zero with the reason on stderr.
# The Debian CLI is /usr/bin/docker: callers should put /usr/bin first on PATH (another docker
# CLI may sit in /usr/local/bin).
set -euo pipefail
export PATH="/usr/bin:/usr/sbin:/bin:/sbin:${PATH}"
TIMEOUT="${CRYPTEN_LITE_DOCKER_START_TIMEOUT:-120}"
LOG="${CRYPTEN_LITE_DOCKERD_LOG:-/var/log/crypten-lite-dockerd.log}"
PACKAGES=(docker.io docker-compose containerd runc iptables debootstrap)

fail() { echo "docker_engine.sh: $*" >&2; exit 1; }

engine_answers() { timeout 20 /usr/bin/docker info >/dev/null 2>&1; }

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || fail "packages ${missing[*]} are missing and installing them needs root"
    command -v apt-get >/dev/null || fail "packages ${missing[*]} are missing and there is no apt-get"
    echo "docker_engine.sh: installing ${missing[*]}" >&2
    apt_install() {
        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q \
            -o DPkg::Lock::Timeout=300 "${missing[@]}" >&2
    }
    if ! apt_install; then
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get update -q \
            -o DPkg::Lock::Timeout=300 >&2 || fail "apt-get update failed"
        apt_install || fail "apt-get install ${missing[*]} failed"
    fi
fi
[[ -x /usr/bin/docker && -x /usr/sbin/dockerd ]] || fail "no /usr/bin/docker or /usr/sbin/dockerd after installing docker.io"

if engine_answers; then
    echo running
    exit 0
fi
[[ $(id -u) == 0 ]] || fail "no Docker engine answers and starting dockerd needs root"
if [[ -S /var/run/docker.sock ]] && ! pgrep -x dockerd >/dev/null; then
    rm -f /var/run/docker.sock /var/run/docker.pid  # left by a dockerd that died
fi
mkdir -p "$(dirname "$LOG")"
if pgrep -x dockerd >/dev/null; then
    pid=""  # another dockerd is starting: wait for it, do not start a second one
else
    setsid /usr/sbin/dockerd >>"$LOG" 2>&1 < /dev/null &
    pid=$!
fi
deadline=$((SECONDS + TIMEOUT))
until engine_answers; do
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
        fail "dockerd exited at start; last lines of $LOG:
$(tail -n 20 "$LOG")"
    fi
    ((SECONDS < deadline)) || fail "no Docker engine answered within ${TIMEOUT} s; last lines of $LOG:
$(tail -n 20 "$LOG")"
    sleep 1
done
if [[ -n $pid ]]; then echo "started $pid"; else echo running; fi
