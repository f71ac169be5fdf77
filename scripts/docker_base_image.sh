#!/usr/bin/env bash
# Build a local stand-in for python:3.11-slim where no image registry is reachable:
# Debian 12 (Python 3.11) from debootstrap, imported into the Docker engine as IMAGE
# (default crypten-lite-base:bookworm). Use it with
#   docker build --build-arg BASE_IMAGE=crypten-lite-base:bookworm .
# The image gets this machine's CA certificates (pip inside `docker build` needs them where
# HTTPS goes through an intercepting proxy) and no EXTERNALLY-MANAGED marker (the Dockerfile
# pip-installs into the system Python, as it does in python:3.11-slim).
# Idempotent: does nothing when IMAGE exists. Needs root, debootstrap and a Debian mirror
# ($CRYPTEN_LITE_DEBIAN_MIRROR, default http://deb.debian.org/debian).
set -euo pipefail
export PATH="/usr/bin:/usr/sbin:/bin:/sbin:${PATH}"
IMAGE="${1:-crypten-lite-base:bookworm}"
MIRROR="${CRYPTEN_LITE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

fail() { echo "docker_base_image.sh: $*" >&2; exit 1; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE"
    exit 0
fi
[[ $(id -u) == 0 ]] || fail "debootstrap needs root"
command -v debootstrap >/dev/null || fail "debootstrap is not installed (scripts/docker_engine.sh installs it)"
root="$(mktemp -d /var/tmp/crypten-lite-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
echo "docker_base_image.sh: debootstrap bookworm into $root" >&2
timeout 1200 debootstrap --variant=minbase \
    --include=python3,python3-pip,python-is-python3,ca-certificates \
    bookworm "$root/rootfs" "$MIRROR" >"$root/debootstrap.log" 2>&1 \
    || fail "debootstrap failed; last lines:
$(tail -n 20 "$root/debootstrap.log")"
rootfs="$root/rootfs"
rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null
fi
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$rootfs/etc/pip.conf"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["python3"]' - "$IMAGE" >/dev/null
echo "$IMAGE"
