/*
 * commands: the exit codes and the environment variables modtrain and its
 * scripts read, for `modtrain --help`, docs/reference.md and the man pages
 * (the commands' table is reference.c's, which asks each for its --help).
 */
#include <stddef.h>

#include "src/cmd/cmd.h"

const ExitCode exit_codes[] = {
    {EXIT_OK, "done; a run relaunched after it reached steps also exits 0, without training or "
              "writing"},
    {EXIT_FAILURE,
     "a failure while working (a final save that could not be written, an output file that "
     "stopped taking writes), or a check's negative answer: ckpt verify found a bad chunk, ckpt "
     "list a bad checkpoint, ckpt diff a difference above --tol"},
    {EXIT_USAGE,
     "bad input: a config, an argument, a layout, data, a checkpoint or an output path that is "
     "missing, unreadable or wrong, in one line saying what and what would be right; nearly "
     "always found before any work, with nothing created (a shard cut short while a run reads "
     "it is found mid-run, on every rank together)"},
    {EXIT_DIVERGED,
     "train: the loss or a gradient was not finite with on_nonfinite = stop, or rollbacks gave "
     "up; the job scripts do not requeue it"},
    {EXIT_REQUEUE,
     "train: a checkpoint was saved and the run stopped early (SIGTERM, SIGUSR1, a first "
     "Ctrl-C, time_limit), or it stopped during setup with nothing to lose: requeue the job "
     "(jobs/train.sbatch requeues on 75 alone), it resumes"},
    {EXIT_WATCHDOG, "train: a rank made no progress for watchdog_s seconds; it names its rank "
                    "and phase"},
    {EXIT_INTERRUPTED, "train: a second Ctrl-C ended it at once, nothing saved"},
    {-1, NULL},
};

const EnvVar env_vars[] = {
    {"OMP_NUM_THREADS", "modtrain",
     "threads of each process (its first level when it lists nested ones); unset: the node's "
     "cores shared among its ranks, within each process's affinity mask"},
    {"BLIS_ARCH_TYPE", "modtrain",
     "BLIS's kernels (a numeric id); unset: modtrain picks skx on AVX-512, haswell on AVX2 "
     "(config blis_arch names one)"},
    {"SLURM_JOB_ID", "modtrain, jobs/train.sbatch",
     "the SLURM job: time_limit = auto asks squeue or scontrol for its end; the sbatch "
     "script's checkpoints and logs name it"},
    {"SLURM_JOB_END_TIME", "modtrain", "the job's end, seconds since 1970 (time_limit = auto)"},
    {"OMPI_MCA_coll_libnbc_ireduce_algorithm", "modtrain (set when unset)",
     "2 (binomial) for ZeRO's overlapped reduce-scatter; a user's own setting wins"},
    {"OMPI_MCA_coll_libnbc_iallreduce_algorithm", "modtrain (set when unset)",
     "3 (reduce-scatter, then all-gather) for dp_overlap's all-reduce, where libnbc's "
     "binomial tree would send each way twice the bytes, in turn"},
    {"OMPI_MCA_btl_tcp_links", "modtrain (set when unset)",
     "4 TCP endpoints between two ranks on different nodes: with the connections every rank "
     "opens to every other at start (jobs of up to 64 ranks), each direction gets one of its "
     "own and a link carries both ways at once"},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", "modtrain (Open MPI's mpirun sets it)",
     "the ranks on this node: where it is every rank, the start's exchange that opens each "
     "pair's connections from both ends is skipped"},
    {"OMPI_MCA_sharedfp", "modtrain (set when unset)",
     "^sm, so that a rank killed during a save leaves no machine-wide semaphore taken"},
    {"MODTRAIN_MAX_STEPS", "modtrain", "caps steps at N, as --steps N would"},
    {"MODTRAIN_PEAK_GFLOPS", "modtrain",
     "the sgemm peak MFU is measured against, for runs that give neither peak_gflops nor "
     "calibration"},
    {"MODTRAIN_DATA_TRACE", "modtrain",
     "FILE: each dp rank appends to FILE.RANK a JSON line for every sample it reads"},
    {"MODTRAIN_FAULT", "modtrain",
     "test hooks: at:POINT[:STEP[:ACTION[:RANK[:NTH]]]] ends the process or fails a call at a "
     "named fault point; rank-exit:R:STEP, hang:R:STEP, nan-batch:B, nan-from:B"},
    {"MODTRAIN_FAULT_AT", "modtrain",
     "a fault point (as MODTRAIN_FAULT's at:) beside another hook"},
    {"MODTRAIN_FAULT_TRACE", "modtrain", "FILE: every fault point reached, a line each"},
    {"MODTRAIN", "jobs/*.sh, jobs/train.sbatch",
     "the modtrain binary the scripts run (else ./modtrain, the tree's, or the PATH's)"},
    {"MODTRAIN_LAUNCH", "jobs/train.sbatch", "auto (the default), srun or mpirun"},
    {"MODTRAIN_SRUN_MPI", "jobs/train.sbatch", "srun's --mpi plugin (pmix, pmi2)"},
    {"MODTRAIN_MPIRUN_ARGS", "jobs/train.sbatch, jobs/isoflop.sh", "more mpirun options"},
    {"MODTRAIN_MAX_RESTARTS", "jobs/train.sbatch", "requeues at most this many times (10)"},
    {"MODTRAIN_REQUIRE_REFERENCE", "jobs/test.sh",
     "1 (the default there): a test whose reference cannot be had (npm, PyTorch) fails "
     "instead of skipping"},
    {"SLURM_SUBMIT_DIR", "jobs/train.sbatch",
     "where the job was submitted: a relative script path is found from it"},
    {"SLURM_NTASKS", "jobs/train.sbatch", "ranks mpirun starts"},
    {"SLURM_CPUS_PER_TASK", "jobs/train.sbatch",
     "threads of each rank: the script exports it as OMP_NUM_THREADS (1 when unset)"},
    {"SLURM_RESTART_COUNT", "jobs/train.sbatch", "the requeues so far"},
    {"FORTUNES_DIR", "jobs/prep_fortunes.sh, jobs/isoflop.sh",
     "the fortunes text (/usr/share/games/fortunes)"},
    {"ISOFLOP_NO_BIBLE", "jobs/isoflop.sh",
     "set: the default corpus is the fortunes alone, without the King James Bible"},
    {"PYTHON", "jobs/plot_run.sh", "the Python 3 that reads metrics.jsonl (python3)"},
    {"TMPDIR", "jobs/plot_run.sh, jobs/get_gpt2_vocab.sh, jobs/get_tokenizers.sh",
     "where their scratch folders go (/tmp)"},
    {NULL, NULL, NULL},
};
