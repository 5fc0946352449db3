#!/usr/bin/env bash
# Make a local Debian bookworm image with Python 3.11, for machines that cannot pull
# `python:3.11-slim-bookworm` (no registry reachable). Built from Debian's own packages with
# debootstrap (needs root and apt's network), then imported into docker.
#   docker/make-base-image.sh [IMAGE]        default IMAGE: core-python:3.11-bookworm
#   ARCH=arm64 docker/make-base-image.sh core-python:3.11-bookworm-arm64
# Use it as:  docker build --build-arg BASE_IMAGE=core-python:3.11-bookworm ...
# ARCH (Debian's name: amd64, arm64, s390x; default this machine's) other than the machine's
# runs the packages' install scripts under qemu: it needs qemu's binfmt handlers registered
# with the F flag (Debian's qemu-user-static does that); the image's platform is linux/ARCH.
set -euo pipefail
IMAGE=${1:-core-python:3.11-bookworm}
ARCH=${ARCH:-$(dpkg --print-architecture)}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
ROOT=$(mktemp -d /tmp/core-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
# minbase: essential packages + apt; python3-venv brings ensurepip (pip inside a venv),
# ca-certificates the public roots (a proxy's CA is added at build time, see Dockerfile.cpu)
debootstrap --arch="$ARCH" --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$ROOT" "$MIRROR" >/dev/null
echo "deb $MIRROR bookworm main" >"$ROOT/etc/apt/sources.list"
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb \
    "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/*
if [ "$ARCH" = "$(dpkg --print-architecture)" ]; then
    tar -C "$ROOT" --numeric-owner -c . |
        docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$IMAGE" >/dev/null
else
    # docker import labels the image with the daemon's platform (its --platform needs an
    # experimental daemon): BuildKit's `FROM scratch` with --platform labels it linux/ARCH
    ctx=$ROOT.ctx
    mkdir -p "$ctx"
    trap 'rm -rf "$ROOT" "$ctx"' EXIT
    tar -C "$ROOT" --numeric-owner -cf "$ctx/rootfs.tar" .
    printf 'FROM scratch\nADD rootfs.tar /\nENV LANG=C.UTF-8\nCMD ["python3"]\n' >"$ctx/Dockerfile"
    build=(docker build)  # a client without the buildx plugin: docker.io's own has BuildKit built in
    docker buildx version >/dev/null 2>&1 || build=(env DOCKER_BUILDKIT=1 /usr/bin/docker build)
    "${build[@]}" -q --platform "linux/$ARCH" -t "$IMAGE" "$ctx" >/dev/null
fi
echo "made $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
