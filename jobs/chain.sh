#!/bin/sh
# Chains N jobs of one run: each starts when the previous ends (afterany) and
# resumes from its last checkpoint, for clusters that forbid requeueing or to
# cover a run longer than the partition's time limit.
#   jobs/chain.sh N my.conf [--key value ...]
# (--dependency=singleton with a fixed --job-name does the same.)
# N is at most 1000, the largest job array index SLURM allows by default
# (MaxArraySize): a longer chain is more likely a typo, and each job already
# requeues itself up to MODTRAIN_MAX_RESTARTS times.
set -eu
max=1000
usage() {
    echo "usage: jobs/chain.sh N CONFIG [--key value ...]"
    echo "Submits N jobs (1 to $max) of jobs/train.sbatch CONFIG, each after the previous"
    echo "one ends (afterany), each resuming the run from its newest checkpoint."
}
case ${1:-} in --help | -h) usage; exit 0 ;; esac
case ${2:-} in --help | -h) usage; exit 0 ;; esac
if [ $# -lt 2 ]; then
    usage >&2
    exit 2
fi
n=$1
# digits only, no leading zero, and at most as many digits as $max before the
# numeric test, which a 20-digit N would overflow
case $n in
'' | *[!0-9]* | 0*) n_ok=0 ;;
*) n_ok=1 ;;
esac
if [ "$n_ok" = 0 ] || [ ${#n} -gt ${#max} ] || [ "$n" -gt "$max" ]; then
    echo "chain: N = '$n' is not a whole number from 1 to $max (see jobs/chain.sh --help)" >&2
    exit 2
fi
shift
dir=$(cd "$(dirname "$0")" && pwd)
prev=""
i=0
while [ $i -lt "$n" ]; do
    id=$(sbatch --parsable ${prev:+--dependency=afterany:$prev} "$dir/train.sbatch" "$@")
    echo "submitted job $id${prev:+ after $prev}"
    prev=$id
    i=$((i + 1))
done
