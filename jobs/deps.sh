#!/bin/sh
# Installs the Debian packages modtrain builds, tests and runs with.
# usage (as root): jobs/deps.sh [--slurm] [--fuzz]
#   --slurm  a SLURM cluster for tests/slurm (slurm-wlm, munge)
#   --fuzz   clang's libFuzzer for `make fuzz` (clang, its runtime, libomp)
set -eu
pkgs="build-essential autoconf automake libtool pkg-config libopenmpi-dev openmpi-bin
      libblis-dev libcunit1-dev zlib1g-dev fortunes python3 python3-torch gnuplot-nox"
for opt in "$@"; do
    case $opt in
    --slurm) pkgs="$pkgs slurm-wlm munge" ;;
    --fuzz) pkgs="$pkgs clang libclang-rt-dev libomp-dev" ;;
    *)
        echo "deps: unknown option '$opt' (expected --slurm or --fuzz)" >&2
        exit 2
        ;;
    esac
done
if [ "$(id -u)" -ne 0 ]; then
    echo "deps: run as root (or: sudo $0)" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086
apt-get install -y --no-install-recommends $pkgs
