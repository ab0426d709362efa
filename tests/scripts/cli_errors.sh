#!/bin/sh
# Bad input of every kind ends with exit code 2 and one line on stderr that
# names the problem, before any work starts (no run directory is created).
# MODTRAIN_SKIP_SLOW (the sanitizer pass): one bad value per check of the
# code, not every value that fails the same one (an unknown key, a value
# not among a key's choices, a file that does not open, an id out of the
# vocabulary, a number out of an option's range, a bad layout: each once).
. "$(dirname "$0")/lib.sh"
cd "$TMP"

# a real shard to train on, and broken ones
printf 'the quick brown fox jumps over the lazy dog\n%%\n%.0s' $(seq 1 400) > text.txt
"$MODTRAIN" prep --out data --doc-sep % text.txt > /dev/null
T="--route_every 0 --train_data data/train_000000.bin --val_data data/val_000000.bin --run_dir run --seq_len 16"

[ $slow = 0 ] || expect_error "did you mean 'eval_every'" "$MODTRAIN" train $T --eval_evry 5
expect_error "lr = 'abc' is not a number" "$MODTRAIN" train $T --lr abc
expect_error "steps = '1.5' is not an integer" "$MODTRAIN" train $T --steps 1.5
expect_error "capacity = 1.5 is out of range" "$MODTRAIN" train $T --capacity 1.5
[ $slow = 0 ] || expect_error "router_gate = 'relu' is not one of raw/sigmoid" "$MODTRAIN" train $T --router_gate relu
[ $slow = 0 ] || expect_error "cannot open 'missing.conf'" "$MODTRAIN" train --config missing.conf
printf 'seq_len = 16\nn_layr = 2\n' > bad.conf
expect_error "bad.conf:2: unknown key 'n_layr' (did you mean 'n_layer'?)" "$MODTRAIN" train --config bad.conf
printf 'n_layer 2\n' > bad2.conf
expect_error "bad2.conf:1: expected 'key = value'" "$MODTRAIN" train --config bad2.conf
expect_error "d_model = 130 is not divisible by n_head = 4" "$MODTRAIN" train $T --d_model 130 --n_head 4
expect_error "batch_size = 8 is not divisible by micro_batch = 3" "$MODTRAIN" train $T --micro_batch 3
expect_error "route_every = 9 routes no block of n_layer = 4" "$MODTRAIN" train $T --route_every 9
[ $slow = 0 ] || expect_error "cannot open 'nope.bin'" "$MODTRAIN" train $T --train_data nope.bin
expect_error "config: '/dev/zero' is a character device, not a file" timeout -k 10 60 "$MODTRAIN" train --config /dev/zero
[ $slow = 0 ] || expect_error "config: '.' is a directory" "$MODTRAIN" train --config .
expect_error "blis_arch = 'skylake' is not a BLIS configuration (expected one of auto, " "$MODTRAIN" train $T --blis_arch skylake
[ $slow = 0 ] || expect_error "gemm = 'mkl' is not one of own/blis" "$MODTRAIN" train $T --gemm mkl
expect_error "stage_layers = '4294967295,5' does not split n_layer = 4" "$MODTRAIN" train $T --pp 2 --stage_layers 4294967295,5
expect_error "stage_layers = ',2,2' is not a list of block counts (expected whole numbers >= 1 separated by single commas" "$MODTRAIN" train $T --pp 2 --stage_layers ,2,2
expect_error "steps = 100000000 is out of range (expected an integer in \[0, 99999999\])" "$MODTRAIN" train $T --steps 100000000
head -c 2000 data/train_000000.bin > trunc.bin
expect_error "trunc.bin' is 2000 bytes but its header promises" "$MODTRAIN" train $T --train_data trunc.bin
head -c 4096 /dev/zero > zero.bin
expect_error "zero.bin' has magic 0, expected 20240520" "$MODTRAIN" train $T --train_data zero.bin
expect_error "holds no sequence of seq_len + 1 = 100001" "$MODTRAIN" train $T --seq_len 100000
expect_error "more than vocab_size = 100" "$MODTRAIN" train $T --vocab_size 100
[ $slow = 0 ] || expect_error "tokenizer = 'bpe' is not one of auto/byte/gpt2/none" "$MODTRAIN" train $T --tokenizer bpe
[ $slow = 0 ] || expect_error "recompute = 'everything' is not one of none/attention/block" "$MODTRAIN" train $T --recompute everything
expect_error "recompute = 'everything' is not one of none/attention/block" "$MODTRAIN" plan --n_layer 2 --recompute everything
expect_error "tokenizer_hash = 'ABC' is not a vocabulary hash (expected 16 lowercase hex digits" "$MODTRAIN" train $T --tokenizer_hash ABC
expect_error "tokenizer = gpt2, but 'data/train_000000.bin' was written by 'modtrain prep --tokenizer byte'" "$MODTRAIN" train $T --tokenizer gpt2
tok4=$("$PYTHON" -c 'import struct,sys; print(struct.unpack("<5i", open(sys.argv[1],"rb").read(20))[4])' data/train_000000.bin)
[ "$tok4" = 1 ] && ok "byte prep records tokenizer 1 in header slot 4" || fail "byte prep's header slot 4 is $tok4"
: > empty.txt
expect_error "'empty.txt' is empty" "$MODTRAIN" prep --out data2 empty.txt
expect_error "val_fraction = '2' is not a number in \[0, 1)" "$MODTRAIN" prep --out data2 --val_fraction 2 text.txt
[ $slow = 0 ] || expect_error "val_fraction = 'nan' is not a number in \[0, 1)" "$MODTRAIN" prep --out data2 --val_fraction nan text.txt
expect_error "val_fraction = ' 0.5' is not a number in \[0, 1)" "$MODTRAIN" prep --out data2 --val_fraction ' 0.5' text.txt
expect_error "needs --vocab DIR" "$MODTRAIN" prep --out data2 --tokenizer gpt2 text.txt
expect_error "'wordpiece' is not available (expected byte, gpt2, r50k_base, cl100k_base, o200k_base, llama3 or hf)" "$MODTRAIN" prep --out data2 --tokenizer wordpiece text.txt
expect_error "threads = 'x' is not an integer" "$MODTRAIN" prep --out data2 --tokenizer gpt2 --threads x text.txt
expect_error "cannot open 'nowhere/encoder.json'" "$MODTRAIN" prep --out data2 --tokenizer gpt2 --vocab nowhere text.txt
expect_error "tokenize: --vocab PATH is required" "$MODTRAIN" tokenize text.txt
expect_error "cannot open 'nowhere': No such file or directory (expected a folder of GPT-2's encoder.json and vocab.bpe, a tiktoken rank file or a tokenizer.json)" "$MODTRAIN" tokenize --vocab nowhere text.txt
# tokenize --decode streams ids in 64 KiB chunks and reads them strictly: a
# NUL or any other byte that is not a digit or whitespace, or an id outside
# the vocabulary, anywhere, is exit 1 (the ids before it are written) with
# its byte offset; an id split between two chunks reads as one
mkdir vocab
seed="$srcdir/tests/fuzz/seeds/vocab/small" # encoder.json, a NUL, vocab.bpe
n=$(tr '\0' '\n' < "$seed" | head -n 1 | wc -c)
head -c $((n - 1)) "$seed" > vocab/encoder.json
tail -c +$((n + 1)) "$seed" > vocab/vocab.bpe
V=$("$MODTRAIN" tokenize --vocab vocab --hash | sed -n 's/^vocab_size //p')
printf '40\n\0\n99999\n' > nul-big.ids
printf '40\n\0x\n' > nul-bad.ids
printf '40\n%s\n' "$V" > beyond.ids
printf '40 -1\n' > sign.ids
spaces() { head -c "$1" /dev/zero | tr '\0' ' '; }
{ spaces 65535; printf '99999\n'; } > split-big.ids
{ spaces 65535; printf '40\n'; } > split.ids
expect_exit 1 "tokenize: nul-big.ids: byte 3 (line 2) is 0x00, not a digit or whitespace" "$MODTRAIN" tokenize --vocab vocab --decode nul-big.ids
[ $slow = 0 ] || expect_exit 1 "tokenize: nul-bad.ids: byte 3 (line 2) is 0x00" "$MODTRAIN" tokenize --vocab vocab --decode nul-bad.ids
[ $slow = 0 ] || expect_exit 1 "tokenize: beyond.ids: byte 3 (line 2): $V is not a token id in \[0, $V)" "$MODTRAIN" tokenize --vocab vocab --decode beyond.ids
expect_exit 1 "tokenize: sign.ids: byte 3 (line 1) is '-', not a digit" "$MODTRAIN" tokenize --vocab vocab --decode sign.ids
expect_exit 1 "tokenize: split-big.ids: byte 65535 (line 1): 99999 is not a token id" "$MODTRAIN" tokenize --vocab vocab --decode split-big.ids
"$MODTRAIN" tokenize --vocab vocab --decode split.ids > split.out
printf '40' | "$MODTRAIN" tokenize --vocab vocab --decode > one.out
[ -s one.out ] && cmp -s split.out one.out && ok "an id split between two chunks decodes as one" ||
    fail "the id split between chunks decoded as '$(cat split.out)', alone as '$(cat one.out)'"
expect_error "neither a checkpoint directory" "$MODTRAIN" eval --ckpt nowhere --data data/val_000000.bin
expect_error "neither a checkpoint directory" "$MODTRAIN" ckpt verify --ckpt nowhere
expect_error "neither a checkpoint directory" "$MODTRAIN" ckpt inspect --ckpt nowhere
expect_error "neither a checkpoint directory" "$MODTRAIN" ckpt export --ckpt nowhere --out x.st
expect_error "neither a checkpoint directory" "$MODTRAIN" ckpt diff --a nowhere --b nowhere
expect_error "unknown option '--dta' (did you mean '--data'?)" "$MODTRAIN" eval --ckpt nowhere --dta x
expect_error "eval: --routing_seqs = 0 is out of range (expected an integer in \[1, " "$MODTRAIN" eval --ckpt nowhere --data x --routing r.tsv --routing_seqs 0
expect_error "eval: --routing needs the whole model on each rank (--pp 1)" "$MODTRAIN" eval --ckpt nowhere --data x --routing r.tsv --pp 2
expect_error "eval: --vocab decodes the tokens of --routing FILE" "$MODTRAIN" eval --ckpt nowhere --data x --vocab v
expect_error "eval: --grads_routing 'sideways' is not one of topk/causal" "$MODTRAIN" eval --ckpt nowhere --data x --grads_routing sideways
[ $slow = 0 ] || expect_error "sample: --tokens = 2147483647 is out of range" "$MODTRAIN" sample --ckpt nowhere --tokens 2147483647
expect_error "sample: --tokens = ' 5' is not an integer" "$MODTRAIN" sample --ckpt nowhere --tokens ' 5'
expect_error "sample: --temperature = 'inf' is not a number" "$MODTRAIN" sample --ckpt nowhere --temperature inf
expect_error "unknown command 'trian'" "$MODTRAIN" trian
# a layout is exactly three whole numbers: no empty field is skipped, none is extra
lays="1,,2,2 1,2,2, ,1,2,2 1,2 1,2,2,2 1,2,x 1,2,2.0 1,,2"
[ $slow = 1 ] || lays=1,,2,2 # one parse: every bad layout fails the same check
for lay in $lays; do
    expect_error "plan: --layout '$lay' is not TP,PP,RANKS_PER_NODE (exactly three whole numbers" \
        "$MODTRAIN" plan --layout "$lay"
done
# the SLURM job scripts' own input, refused before anything is submitted or
# launched: sbatch, srun, mpirun and scontrol are tripwires that record a call
mkdir bin
for t in sbatch srun mpirun scontrol; do
    printf '#!/bin/sh\necho "%s $*" >> "%s"\nexit 1\n' "$t" "$TMP/calls.log" > "bin/$t"
    chmod +x "bin/$t"
done
# tripwired [NAME=VALUE ...] CMD...: CMD outside any SLURM job, under the tripwires
tripwired() { env -u SLURM_JOB_ID PATH="$TMP/bin:$PATH" "$@"; }
# a 20-digit N overflows the shell's numbers: refused as a number of jobs
for n in 18446744073709551616 99999 1001 0 01 x; do
    expect_error "chain: N = '$n' is not a whole number from 1 to 1000" \
        tripwired "$srcdir/jobs/chain.sh" "$n" x.conf
done
expect_error "train.sbatch: MODTRAIN_LAUNCH = 'bogus' is not a launcher (expected auto, srun or mpirun)" \
    tripwired MODTRAIN="$MODTRAIN" MODTRAIN_LAUNCH=bogus "$srcdir/jobs/train.sbatch" x.conf
[ ! -e calls.log ] && ok "the refused job scripts called no SLURM or MPI tool" ||
    fail "a refused job script called: $(tr '\n' ';' < calls.log)"
# N = 1000 is the bound, taken: the first submission reaches sbatch
rm -f calls.log
tripwired "$srcdir/jobs/chain.sh" 1000 x.conf > /dev/null 2>&1 || true
[ "$(grep -c '^sbatch ' calls.log 2> /dev/null)" = 1 ] && ok "chain: N = 1000 is taken" ||
    fail "chain: N = 1000 did not reach sbatch once: $(cat calls.log 2> /dev/null)"
[ ! -e run ] && ok "no run directory was created by the failed runs" || fail "a failed run created run/"
[ ! -e data2 ] && ok "no output directory was created by the failed prep" || fail "prep created data2/"

# --help works for every command and exits 0
for c in prep tokenize train eval sample ckpt plan; do
    if "$MODTRAIN" $c --help > help.txt 2>&1 && [ -s help.txt ]; then ok "modtrain $c --help"; else fail "modtrain $c --help"; fi
done
"$MODTRAIN" --version | grep -q "^modtrain [0-9].* with [a-z0-9_]* kernels: BLIS_ARCH_TYPE=[0-9]" &&
    ok "--version names the BLIS kernels" || fail "--version: $("$MODTRAIN" --version)"
finish
