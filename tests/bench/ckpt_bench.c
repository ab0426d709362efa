/*
 * ckpt_bench: on the state in a checkpoint (parameters and AdamW moments of a
 * trained model), compares the compression ratio of deflate alone, of the
 * byte planes deflated (format 1) and of format 2 (each plane Huffman-coded
 * or raw), and measures save and load throughput of the real writer (MPI-IO,
 * fsync, index) and reader (inflate, unshuffle, CRC) at level 0 (raw) and 6.
 * usage: ckpt_bench STEPDIR SCRATCHDIR [REPEATS]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "checkpoint/ckio.h"
#include "mpi/check.h"
#include "src/base/files.h"
#include "src/base/util.h"

int main(int argc, char **argv) {
    int provided = MPI_THREAD_SINGLE;
    mpi_env_defaults();
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    if (argc < 3) {
        fprintf(stderr, "usage: ckpt_bench STEPDIR SCRATCHDIR [REPEATS]\n");
        MPI_Finalize();
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    Err err;
    CkIndex ix;
    if (ck_index_read(argv[1], &ix, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        MPI_Finalize();
        return 1;
    }
    /* every chunk back as a whole-tensor slice */
    CkSlice *s = xcalloc((size_t)ix.nchunks, sizeof(CkSlice));
    double raw = 0;
    for (int i = 0; i < ix.nchunks; i++) {
        const CkChunk *c = &ix.chunks[i];
        snprintf(s[i].name, sizeof s[i].name, "%s", c->name);
        s[i].ndim = c->ndim, s[i].rows = c->rows, s[i].cols = c->cols;
        s[i].r0 = c->r0, s[i].nr = c->nr, s[i].c0 = c->c0, s[i].nc = c->nc, s[i].ld = c->nc;
        s[i].data = xmalloc(c->usize + 4);
        raw += (double)c->usize;
    }
    if (ck_read_slices(&ix, s, ix.nchunks, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        MPI_Finalize();
        return 1;
    }
    printf("state: %d tensors, %.2f MB of float32 (parameters and AdamW moments)\n", ix.nchunks,
           raw / 1e6);
    /* the ratio of three ways to store the same state: deflate of the
     * floats (level 6), deflate of the byte planes (format 1, level 6),
     * and format 2's Huffman-coded or raw planes (from its own save below) */
    double plain = 0, shuf = 0;
    for (int i = 0; i < ix.nchunks; i++) {
        size_t n = (size_t)(s[i].nr * s[i].nc), bytes = n * 4;
        uLongf bound = compressBound((uLong)bytes), len;
        uint8_t *out = xmalloc(bound), *planes = xmalloc(bytes + 4);
        len = bound;
        compress2(out, &len, (const Bytef *)s[i].data, (uLong)bytes, 6);
        plain += (double)len;
        ck_shuffle(planes, s[i].data, n);
        len = bound;
        compress2(out, &len, planes, (uLong)bytes, 6);
        shuf += (double)len;
        free(out);
        free(planes);
    }
    printf("ratio: deflate alone %.3fx, byte planes deflated (format 1) %.3fx\n", raw / plain,
           raw / shuf);
    CkKV kv = {"state.step", "0"};
    int levels[] = {0, 6};
    for (int li = 0; li < 2; li++) {
        double best_save = 1e30, best_load = 1e30, stored = 0;
        for (int r = 0; r < reps; r++) {
            char dir[1100];
            snprintf(dir, sizeof dir, "%s/bench-%d-%d", argv[2], levels[li], r);
            mkdirs(dir);
            const CkWriteOpts wo = {levels[li], 1 << 20, 0, 0};
            CkStats st;
            double t0 = now_s();
            if (ck_write(MPI_COMM_WORLD, dir, s, ix.nchunks, &kv, 1, &wo, &st, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                MPI_Finalize();
                return 1;
            }
            double t1 = now_s();
            CkIndex back;
            if (ck_index_read(dir, &back, &err) || ck_verify(&back, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                MPI_Finalize();
                return 1;
            }
            double t2 = now_s();
            ck_index_free(&back);
            stored = st.stored;
            if (t1 - t0 < best_save) best_save = t1 - t0;
            if (t2 - t1 < best_load) best_load = t2 - t1;
        }
        printf("format 2, level %d: ratio %.3fx, save %.1f MB/s (%.3f s), load and verify %.1f MB/s "
               "(%.3f s)\n",
               levels[li], raw / stored, raw / best_save / 1e6, best_save, raw / best_load / 1e6,
               best_load);
    }
    ck_index_free(&ix);
    MPI_Finalize();
    return 0;
}
