#!/usr/bin/env bash
# Debian bookworm's python3.11 of another architecture, unpacked into a directory: a root for
# qemu-user (QEMU_LD_PREFIX) in which that Python runs (scripts/aarch64_env.sh, s390x_env.sh).
# The packages (python3.11 and the libraries its modules load, not dbm/nis's, plus PACKAGE...)
# are downloaded with apt-get under its own state directory (DIR/../apt: the host's dpkg keeps
# its architectures) and unpacked with dpkg-deb, not installed (no maintainer scripts run).
#   scripts/debian_python.sh ARCH DIR [PACKAGE...]     e.g. scripts/debian_python.sh s390x root python3-numpy
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 ARCH DIR [PACKAGE...]" >&2; exit 2; }
arch=$1 root=$2
shift 2
python="python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 libexpat1 zlib1g libssl3 libffi8
libbz2-1.0 liblzma5 libsqlite3-0 libncursesw6 libtinfo6 libreadline8 libuuid1 libgcc-s1 libstdc++6 libgomp1
libcrypt1 media-types"
command -v qemu-aarch64 >/dev/null || { apt-get update -qq && apt-get install -y -qq qemu-user >/dev/null; }
apt_dir=$(dirname "$root")/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/debs"
touch "$apt_dir/status"
apt=(apt-get -qq -o "Dir::State=$apt_dir" -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::State::status=$apt_dir/status"
     -o "Dir::Cache=$apt_dir" -o "APT::Sandbox::User=root" -o "APT::Architecture=$arch" -o "APT::Architectures::=$arch")
"${apt[@]}" update
# shellcheck disable=SC2086  # the list is words
(cd "$apt_dir/debs" && "${apt[@]}" download $python "$@")
mkdir -p "$root"
for deb in "$apt_dir"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
