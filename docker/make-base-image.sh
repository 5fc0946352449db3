#!/usr/bin/env bash
# Make a local Debian bookworm image with Python 3.11, for machines that cannot pull
# `python:3.11-slim-bookworm` (no registry reachable). Built from Debian's own packages with
# debootstrap (needs root and apt's network), then imported into docker.
#   docker/make-base-image.sh [IMAGE]        default IMAGE: core-python:3.11-bookworm
# Use it as:  docker build --build-arg BASE_IMAGE=core-python:3.11-bookworm ...
set -euo pipefail
IMAGE=${1:-core-python:3.11-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
ROOT=$(mktemp -d /tmp/core-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
# minbase: essential packages + apt; python3-venv brings ensurepip (pip inside a venv),
# ca-certificates the public roots (a proxy's CA is added at build time, see Dockerfile.cpu)
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$ROOT" "$MIRROR" >/dev/null
echo "deb $MIRROR bookworm main" >"$ROOT/etc/apt/sources.list"
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb \
    "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/*
tar -C "$ROOT" --numeric-owner -c . |
    docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$IMAGE" >/dev/null
echo "made $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
