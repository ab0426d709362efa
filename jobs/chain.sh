#!/bin/sh
# Chains N jobs of one run: each starts when the previous ends (afterany) and
# resumes from its last checkpoint, for clusters that forbid requeueing or to
# cover a run longer than the partition's time limit.
#   jobs/chain.sh N my.conf [--key value ...]
# (--dependency=singleton with a fixed --job-name does the same.)
set -eu
n=${1:?usage: jobs/chain.sh N CONFIG [--key value ...]}
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
