/*
 * ckpt_io: the checkpoint writer and reader on several ranks, before tensor
 * and pipeline parallelism exist. Each rank owns slices of a set of tensors
 * (uneven row splits, column splits in three blocks like c_attn, a
 * replicated tensor written once), all ranks write one checkpoint together,
 * and any number of ranks read it back under another split. Every element's
 * value is a pure function of (tensor, row, column), so a reader checks what
 * it got without knowing who wrote it.
 *
 * usage: mpirun -np W ckpt_io write DIR | read DIR
 * exit 0 when every check passed on every rank, 1 otherwise.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckio.h"
#include "mpi/check.h"
#include "src/base/rng.h"
#include "src/base/files.h"
#include "src/base/util.h"

static float value(const char *name, int64_t r, int64_t c) {
    return (float)rng_normal(7, rng_hash_str(name), (uint64_t)(r * 100003 + c));
}

typedef struct {
    const char *name;
    int64_t rows, cols;
} Tensor;

static const Tensor tensors[] = {{"param/A", 37, 50}, {"param/B", 16, 48}, {"param/C", 10, 1},
                                 {"adam_m/A", 37, 50}};

/* A slice of tensor t, its buffer filled with the true values when fill. */
static CkSlice make_slice(const Tensor *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc, int fill) {
    CkSlice s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "%s", t->name);
    s.ndim = t->cols == 1 ? 1 : 2;
    s.rows = t->rows, s.cols = t->cols, s.r0 = r0, s.nr = nr, s.c0 = c0, s.nc = nc;
    s.ld = nc + 3; /* a local row stride wider than the slice */
    s.data = xcalloc((size_t)(nr > 0 ? nr : 1) * (size_t)s.ld, sizeof(float));
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < nc; c++)
            s.data[r * s.ld + c] = fill ? value(t->name, r0 + r, c0 + c) : NAN;
    return s;
}

static int check_slice(const CkSlice *s) {
    int bad = 0;
    for (int64_t r = 0; r < s->nr; r++)
        for (int64_t c = 0; c < s->nc; c++)
            if (s->data[r * s->ld + c] != value(s->name, s->r0 + r, s->c0 + c)) bad++;
    return bad;
}

int main(int argc, char **argv) {
    int provided = MPI_THREAD_SINGLE;
    mpi_env_defaults();
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int rank, W;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    util_rank = rank;
    if (argc != 3 || (strcmp(argv[1], "write") && strcmp(argv[1], "read"))) {
        if (rank == 0) fprintf(stderr, "usage: ckpt_io write|read DIR\n");
        MPI_Finalize();
        return 2;
    }
    const char *dir = argv[2];
    Err err = {""};
    CkSlice s[16];
    int n = 0, failures = 0;
    if (strcmp(argv[1], "write") == 0) {
        if (16 % W != 0) {
            if (rank == 0) fprintf(stderr, "ckpt_io write: needs a rank count dividing 16\n");
            MPI_Finalize();
            return 2;
        }
        /* A and adam_m/A: uneven row blocks; B: three column blocks, each
         * split across ranks (c_attn's q, k, v); C: replicated, rank 0 writes */
        int64_t r0 = 37 * rank / W, r1 = 37 * (rank + 1) / W;
        s[n++] = make_slice(&tensors[0], r0, r1 - r0, 0, 50, 1);
        s[n++] = make_slice(&tensors[3], r0, r1 - r0, 0, 50, 1);
        for (int b = 0; b < 3; b++) s[n++] = make_slice(&tensors[1], 0, 16, b * 16 + rank * (16 / W), 16 / W, 1);
        if (rank == 0) s[n++] = make_slice(&tensors[2], 0, 10, 0, 1, 1);
        mkdirs(dir);
        CkKV kv = {"state.step", "7"};
        const CkWriteOpts wo = {6, 1 << 20, 0, 0};
        if (ck_write(MPI_COMM_WORLD, dir, s, n, &kv, 1, &wo, NULL, &err) != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, err.msg);
            failures++;
        }
        CkIndex ix;
        if (ck_index_read(dir, &ix, &err) != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, err.msg);
            failures++;
        } else {
            int c_chunks = 0;
            for (int i = 0; i < ix.nchunks; i++) c_chunks += strcmp(ix.chunks[i].name, "param/C") == 0;
            if (c_chunks != 1 || ix.nchunks != 5 * W + 1 || strcmp(ck_kv(&ix, "state.step"), "7")) {
                fprintf(stderr, "rank %d: index has %d chunks (%d of C), expected %d (1 of C)\n",
                        rank, ix.nchunks, c_chunks, 5 * W + 1);
                failures++;
            }
            ck_index_free(&ix);
        }
    } else {
        /* another split: A by uneven column blocks, B and C whole, adam_m/A
         * as a rectangle crossing every writer's rows */
        int64_t c0 = 50 * rank / W, c1 = 50 * (rank + 1) / W;
        s[n++] = make_slice(&tensors[0], 0, 37, c0, c1 - c0, 0);
        s[n++] = make_slice(&tensors[1], 0, 16, 0, 48, 0);
        s[n++] = make_slice(&tensors[2], 0, 10, 0, 1, 0);
        s[n++] = make_slice(&tensors[3], 3, 30, 7 + rank % 3, 20, 0);
        CkIndex ix;
        if (ck_index_read(dir, &ix, &err) != 0 || ck_read_slices(&ix, s, n, &err) != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, err.msg);
            failures++;
        } else {
            for (int i = 0; i < n; i++) {
                int bad = check_slice(&s[i]);
                if (bad) fprintf(stderr, "rank %d: %s: %d wrong elements\n", rank, s[i].name, bad);
                failures += bad != 0;
            }
            ck_index_free(&ix);
        }
    }
    for (int i = 0; i < n; i++) free(s[i].data);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("ckpt_io %s on %d ranks: %s\n", argv[1], W, total ? "FAILED" : "every check passed");
    MPI_Finalize();
    return total ? 1 : 0;
}
