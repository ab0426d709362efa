#!/bin/sh
# Installs the Debian packages modtrain builds, tests and runs with.
# usage (as root): jobs/deps.sh [--slurm]
set -eu
pkgs="build-essential autoconf automake libtool pkg-config libopenmpi-dev openmpi-bin
      libblis-dev libcunit1-dev zlib1g-dev fortunes python3 python3-torch gnuplot-nox"
[ "${1:-}" = "--slurm" ] && pkgs="$pkgs slurm-wlm munge"
if [ "$(id -u)" -ne 0 ]; then
    echo "deps: run as root (or: sudo $0)" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086
apt-get install -y --no-install-recommends $pkgs
