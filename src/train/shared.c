/*
 * shared: what the trainer and the commands both use (see shared.h):
 * agreeing on failure across ranks, thread counts, step statistics and
 * evaluation over a dataset. Returns errors; prints nothing.
 */
#include "src/train/shared.h"

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi/check.h"
#include "mpi/pipeline.h"
#include "mpi/sync.h"
#include "src/base/fault.h"

/* Formats a line whole (however long) and hands it to fn. */
static void say_v(void (*fn)(void *, const char *), void *ctx, const char *fmt, va_list ap) {
    if (!fn) return;
    va_list aq;
    va_copy(aq, ap);
    char small[512];
    const int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n < (int)sizeof small) {
        fn(ctx, small);
    } else {
        char *big = xmalloc((size_t)n + 1);
        vsnprintf(big, (size_t)n + 1, fmt, aq);
        fn(ctx, big);
        free(big);
    }
    va_end(aq);
}

void say_log(const Say *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say_v(s ? s->log : NULL, s ? s->ctx : NULL, fmt, ap);
    va_end(ap);
}

void say_error(const Say *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say_v(s ? s->error : NULL, s ? s->ctx : NULL, fmt, ap);
    va_end(ap);
}

int ranks_agree(int rc, Err *err, MPI_Comm comm) {
    int rank = 0, mine, first = INT_MAX;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    mine = rc != 0 ? rank : INT_MAX;
    MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
    if (first == INT_MAX) return 0;
    if (rank != first && err) err->msg[0] = '\0';
    return -1;
}

/* OMP_NUM_THREADS, the hybrid MPI + OpenMP convention (mpirun -x
 * OMP_NUM_THREADS=N), is each process's count when it is a whole number (its
 * first level when it lists nested ones). Otherwise the node's cores are
 * shared among its ranks, and never more than this process may run on (its
 * affinity mask: mpirun's binding to a core, a SLURM cpuset). */
int default_threads(int local_ranks) {
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && *env) {
        char first[32];
        const size_t n = strcspn(env, ",");
        long long t;
        if (n < sizeof first) {
            memcpy(first, env, n);
            first[n] = '\0';
            if (parse_i64(first, 1, 4096, &t) == 0) return (int)t;
        }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    long t = cores / (local_ranks > 0 ? local_ranks : 1);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 && CPU_COUNT(&set) < t)
        t = CPU_COUNT(&set);
    return t > 0 ? (int)t : 1;
}

int oversubscribed(int threads, MPI_Comm comm, char *msg, size_t n) {
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int ranks = 1, node_rank = 0, all_threads = threads;
    MPI_CHECK(MPI_Comm_size(node, &ranks));
    MPI_CHECK(MPI_Comm_rank(node, &node_rank));
    /* the union of the node's ranks' affinity masks: the cores they may use */
    enum { WORDS = CPU_SETSIZE / 64 };
    uint64_t bits[WORDS] = {0};
    cpu_set_t set;
    CPU_ZERO(&set);
    const int have = sched_getaffinity(0, sizeof set, &set) == 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (have ? CPU_ISSET(c, &set) : c < sysconf(_SC_NPROCESSORS_ONLN))
            bits[c / 64] |= (uint64_t)1 << (c % 64);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, bits, WORDS, MPI_UINT64_T, MPI_BOR, node));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all_threads, 1, MPI_INT, MPI_SUM, node));
    MPI_CHECK(MPI_Comm_free(&node));
    int cores = 0;
    for (int w = 0; w < WORDS; w++) cores += __builtin_popcountll(bits[w]);
    if (node_rank != 0 || all_threads <= cores || cores < 1) return 0;
    char host[256] = "this node";
    gethostname(host, sizeof host - 1);
    char fix[256];
    if (ranks <= cores)
        snprintf(fix, sizeof fix, "set threads = %d, the cores over the ranks, or bind each rank "
                 "to %d cores: mpirun --bind-to core --map-by ppr:%d:node:PE=%d", cores / ranks,
                 threads, ranks, threads);
    else
        snprintf(fix, sizeof fix, "run at most %d rank%s on this node, or give them more cores",
                 cores, cores == 1 ? "" : "s");
    snprintf(msg, n, "warning: %d rank%s x %d thread%s on %s exceed the %d core%s %s bound to, so threads "
           "wait on each other (%s)",
           ranks, ranks == 1 ? "" : "s", threads, threads == 1 ? "" : "s", host, cores,
           cores == 1 ? "" : "s", ranks == 1 ? "it is" : "they are", fix);
    return 1;
}

double reduce_step_stats(Model *m, double loss_sum, MPI_Comm comm) {
    const int n = route_stats_len(&m->d);
    double *v = xcalloc((size_t)n + 1, sizeof(double));
    v[0] = loss_sum;
    route_stats_to_vec(&m->stats, &m->d, v + 1);
    stats_reduce(v, n + 1, comm);
    route_stats_from_vec(&m->stats, &m->d, v + 1);
    double loss = v[0];
    free(v);
    return loss;
}

void check_model_fault(const Model *m) {
    if (m->faulted) mpi_abort_job(m->fault.msg);
}

double eval_loss(Model *m, Dataset *ds, int part, int micro, size_t n_seqs, RouteMode mode,
                 int backward, float aux_weight, int *failed, Err *err) {
    const int T = m->d.maxT;
    const uint64_t avail = ds->parts[part].n_seqs;
    if (n_seqs > avail) n_seqs = (size_t)avail;
    int *inputs = xmalloc((size_t)micro * T * sizeof(int));
    int *targets = xmalloc((size_t)micro * T * sizeof(int));
    const double tokens = (double)n_seqs * T;
    RouteMode saved = m->route;
    m->route = mode;
    model_stats_reset(m);
    model_use_slot(m, 0);
    const int pp = m->d.pp;
    assert(!backward || m->d.nchunk == 1); /* `modtrain eval --grads` has one chunk */
    double total = 0;
    *failed = 0;
    for (size_t w = 0; w < n_seqs;) {
        int B = 0, rc = 0;
        for (; B < micro && w < n_seqs && rc == 0; B++, w++) {
            DsSample s;
            ds_locate_seq(ds, part, w, &s);
            rc = ds_read(ds, &s, m->d.V, inputs + (size_t)B * T, targets + (size_t)B * T, err);
        }
        /* every rank reads the same sequences: one failing ends them all */
        if (ranks_agree(rc, err, MPI_COMM_WORLD) != 0) {
            *failed = 1;
            break;
        }
        const size_t count = (size_t)B * T * m->d.C;
        /* a pipeline runs the forward stage after stage, round the ranks
         * once per chunk (interleaved); the last has the loss */
        for (int c = 0; c < m->d.nchunk; c++) {
            model_use_chunk(m, 0, c);
            if (pp > 1 && !model_set_embeds(m))
                pp_recv_prev(m->cur->enc, count, PP_TAG_EVAL, m->pp_comm);
            if (backward) model_expect_backward(m, (float)(1.0 / tokens));
            model_forward(m, inputs, targets, B, T);
            /* each sequence's token losses, then the sequences, in order:
             * the same sum whatever micro-batches they came in */
            for (int b = 0; model_set_heads(m) && b < B; b++) {
                double seq = 0;
                for (int t = 0; t < T; t++) seq += m->cur->losses[(size_t)b * T + t];
                total += seq;
            }
            fault_progress(); /* the watchdog's: a long validation is no hang */
            check_model_fault(m);
            if (pp > 1 && !model_set_heads(m))
                pp_send_next(model_stage_output(m), count, PP_TAG_EVAL, m->pp_comm);
        }
        if (backward) model_backward(m, (float)(1.0 / tokens), aux_weight);
    }
    if (pp > 1 && !*failed) total = reduce_step_stats(m, total, m->pp_comm);
    m->route = saved;
    free(inputs);
    free(targets);
    return *failed ? NAN : total / tokens;
}

uint64_t val_seqs(const Dataset *ds, int part, uint64_t n) {
    const uint64_t have = ds->parts[part].n_seqs;
    if (n == 0) return have;
    uint64_t k = ds->n_parts == 1 ? n : ds_part_count(ds, part, n);
    if (k < 1) k = 1;
    return k < have ? k : have;
}

/* The config's tokenizers and the shards' codes, side by side. */
static const struct {
    Tokenizer config;
    int shard;
} TOKENIZERS[] = {{TOK_BYTE, SHARD_TOK_BYTE},   {TOK_GPT2, SHARD_TOK_GPT2},
                  {TOK_R50K, SHARD_TOK_R50K},   {TOK_CL100K, SHARD_TOK_CL100K},
                  {TOK_O200K, SHARD_TOK_O200K}, {TOK_LLAMA3, SHARD_TOK_LLAMA3},
                  {TOK_HF, SHARD_TOK_HF}};

Tokenizer tokenizer_of_shard(int shard_tokenizer) {
    for (size_t i = 0; i < sizeof TOKENIZERS / sizeof TOKENIZERS[0]; i++)
        if (TOKENIZERS[i].shard == shard_tokenizer) return TOKENIZERS[i].config;
    return TOK_AUTO;
}

int shard_code_of_tokenizer(Tokenizer t) {
    for (size_t i = 0; i < sizeof TOKENIZERS / sizeof TOKENIZERS[0]; i++)
        if (TOKENIZERS[i].config == t) return TOKENIZERS[i].shard;
    return SHARD_TOK_UNKNOWN;
}

void format_vocab_hash(uint64_t hash, char hex[CONFIG_HASH_HEX + 1]) {
    snprintf(hex, CONFIG_HASH_HEX + 1, "%016llx", (unsigned long long)hash);
}

int ds_open_agreed(Dataset *ds, const char *spec, int T, uint64_t seed, MPI_Comm comm, Err *err) {
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    uint64_t len = 0;
    uint8_t *buf = NULL;
    int rc = 0;
    if (rank == 0) {
        rc = ds_open(ds, spec, T, seed, err);
        size_t n = 0;
        if (rc == 0) buf = ds_pack(ds, &n);
        len = n;
        if (rc == 0 && len > INT_MAX) {
            ds_free(ds);
            rc = err_set(err, "data: '%.200s' names too many shards to share (%llu bytes of "
                         "headers; at most 2 GiB)", spec, (unsigned long long)len);
        }
    }
    if (ranks_agree(rc, err, comm) != 0) {
        free(buf);
        return -1;
    }
    MPI_CHECK(MPI_Bcast(&len, 1, MPI_UINT64_T, 0, comm));
    if (rank != 0) buf = xmalloc(len ? (size_t)len : 1);
    MPI_CHECK(MPI_Bcast(buf, (int)len, MPI_BYTE, 0, comm));
    if (rank != 0) rc = ds_unpack(ds, buf, (size_t)len, T, seed, err);
    free(buf);
    return ranks_agree(rc, err, comm);
}
