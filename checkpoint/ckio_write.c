/*
 * ckio_write: ck_write, the collective save of slices. Every slice is cut
 * into row blocks shared among the ranks that hold the same data; a rank
 * packs its blocks in rounds of bounded size on threads of their own while
 * it writes the previous round with MPI_File_write_at_all (write-behind
 * hints keep the page cache small), every MPI-IO call behind a fault
 * point; then rank 0 writes the index. Also the save's test hooks
 * (ck_fault).
 */
#include "checkpoint/ckio_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "mpi/check.h"
#include "src/base/fault.h"
#include "src/base/util.h"

/* A round's packed bytes (room for the round's bound, reused). */
typedef struct {
    uint8_t *buf;
    size_t len;
} Blob;

/* Which of a slice's holders writes row block k of it: the holders of the
 * same data (dp replicas, the tp ranks of a replicated tensor, both copies
 * of the tied embedding) take the blocks of each group in turn, the least
 * loaded (in bytes so far) first, the lowest index on ties. load[] is the
 * group's tally, the same on every holder since they see the same slices
 * in the same order. */
static int assign_block(uint64_t *load, int holders, uint64_t bytes) {
    int best = 0;
    for (int h = 1; h < holders; h++)
        if (load[h] < load[best]) best = h;
    load[best] += bytes;
    return best;
}

/* This rank's pieces: every slice cut into row blocks of at most `chunk`
 * elements (a longer row alone), each kept by the holder it is assigned to.
 * Returns the count; *out is malloc'd. */
static int plan_pieces(const CkSlice *slices, int n, int64_t chunk, Piece **out) {
    int cap = 64, np = 0, maxh = 1;
    Piece *pcs = xcalloc((size_t)cap, sizeof(Piece));
    for (int i = 0; i < n; i++)
        if (slices[i].holders > maxh) maxh = slices[i].holders;
    uint64_t *load = xcalloc((size_t)CK_GROUPS * (size_t)maxh, sizeof(uint64_t));
    for (int i = 0; i < n; i++) {
        const CkSlice *s = &slices[i];
        const int holders = s->holders > 0 ? s->holders : 1;
        int64_t rows = s->nc >= chunk ? 1 : chunk / s->nc;
        /* at most CK_MAX_CHUNKS chunks a tensor, whatever the chunk size:
         * a slice covering a share a of the tensor takes at most a share a
         * of them (its tiles, rounded up, overstate how many slices there
         * are, so the shares of all slices sum to at most one) */
        const int64_t tiles = ((s->rows + s->nr - 1) / s->nr) * ((s->cols + s->nc - 1) / s->nc);
        const int64_t most = tiles < CK_MAX_CHUNKS ? CK_MAX_CHUNKS / tiles : 1;
        if ((s->nr + rows - 1) / rows > most) rows = (s->nr + most - 1) / most;
        for (int64_t r = 0; r < s->nr; r += rows) {
            const int64_t nr = s->nr - r < rows ? s->nr - r : rows;
            const uint64_t bytes = (uint64_t)nr * (uint64_t)s->nc * 4;
            if (assign_block(load + (size_t)s->group * maxh, holders, bytes) != s->holder) continue;
            if (np == cap) pcs = xrealloc(pcs, (size_t)(cap *= 2) * sizeof(Piece));
            pcs[np++] = (Piece){s, s->r0 + r, nr};
        }
    }
    free(load);
    *out = pcs;
    return np;
}

/* Write-behind: each round's pages go to the disk while the next rounds
 * pack, and once written they leave the page cache, so a save occupies
 * two rounds of it instead of the whole file. Copying into pages that
 * stay hot costs a fraction of copying into pages the kernel must find
 * for 1.5 GB (on this project's VM, where the host takes freed memory
 * back, 1.7 GB/s against 0.3 GB/s), the final sync has little left to
 * do, and the training data's cached pages stay. Hints only: a file
 * system that ignores them loses nothing, MPI_File_sync is what makes
 * the data durable. */
typedef struct {
    int fd;                           /* the data file, for the hints (-1: none) */
    unsigned long long at[2], len[2]; /* this rank's last two extents */
} Behind;

static void behind_drop(const Behind *b, int i) {
#if defined(SYNC_FILE_RANGE_WRITE) && defined(POSIX_FADV_DONTNEED)
    if (b->fd < 0 || b->len[i] == 0) return;
    sync_file_range(b->fd, (off_t)b->at[i], (off_t)b->len[i],
                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                        SYNC_FILE_RANGE_WAIT_AFTER);
    posix_fadvise(b->fd, (off_t)b->at[i], (off_t)b->len[i], POSIX_FADV_DONTNEED);
#endif
}

/* After this rank wrote [at, at + len): starts its writeback, then waits
 * for the extent of two rounds ago and drops it. */
static void behind_round(Behind *b, unsigned long long at, unsigned long long len) {
#ifdef SYNC_FILE_RANGE_WRITE
    if (b->fd >= 0 && len > 0) sync_file_range(b->fd, (off_t)at, (off_t)len, SYNC_FILE_RANGE_WRITE);
#endif
    behind_drop(b, 0);
    b->at[0] = b->at[1], b->len[0] = b->len[1];
    b->at[1] = at, b->len[1] = len;
}

/* One round's collective write, done by the master thread while the other
 * threads pack the next round. */
typedef struct {
    MPI_File fh;
    MPI_Comm comm;
    const char *path;
    const Blob *blob;
    unsigned long long base; /* where the round starts in the file */
    unsigned long long at;   /* out: this rank's offset */
    unsigned long long total; /* out: the round's bytes over all ranks */
    Behind *behind;
    int *failed;
    Err *err;
} RoundWrite;

static void write_round(RoundWrite *w);

/* Lowers the calling packing thread's priority beside training, once.
 * Beside an OpenMP team (threads > 1) it goes to SCHED_IDLE (nice 19
 * where that is refused): it takes only the cycles the team leaves idle
 * between its parallel regions and never preempts a team thread, which
 * the team's next barrier would make every other thread wait for (at
 * nice 10, a GPT-2-small step with a save in flight took 3 s longer).
 * Beside one training thread it goes to nice 10, about a tenth of the
 * core: such a rank leaves no cycle idle (its MPI waits spin), so at idle
 * priority the save would only progress when training next waits for it.
 * Only threads that make no MPI call: one holding an MPI lock at low
 * priority would stall training's MPI calls. */
static void pack_quietly(int threads) {
    static _Thread_local int done;
    if (done) return;
    done = 1;
    const id_t tid = (id_t)syscall(SYS_gettid);
    struct sched_param sp = {0};
    if (threads == 1) setpriority(PRIO_PROCESS, tid, 10);
    else if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp) != 0)
        setpriority(PRIO_PROCESS, tid, 19);
}

/* Each packing thread's scratch: the largest piece's rows and planes. */
typedef struct {
    float *raw;
    uint8_t *planes;
} Scratch;

/* The threads that pack: training's count (0: OpenMP's), and one more
 * that writes first (then packs too, or beside training only writes). */
static int pack_team(const CkWriteOpts *opt) {
    int threads = opt->threads;
#ifdef _OPENMP
    if (threads <= 0) threads = omp_get_max_threads();
#endif
    return (threads > 0 ? threads : 1) + 1;
}

/* A round's packing, shared by its threads: pieces [lo, hi) into their
 * slots of buf, taken in turn through next. */
typedef struct {
    const Piece *pcs;
    const CkWriteOpts *opt;
    CkChunk *chunks;
    uint8_t *buf;
    const size_t *slot;
    int lo, hi;
    atomic_int next;
} PackWork;

typedef struct {
    PackWork *work;
    Scratch *scratch;
} Packer;

static void pack_pieces(PackWork *k, Scratch *sc) {
    for (int i; (i = atomic_fetch_add(&k->next, 1)) < k->hi;)
        pack_piece(&k->pcs[i], k->opt->level, &k->chunks[i], k->buf + k->slot[i - k->lo], sc->raw,
                   sc->planes);
}

static void *packer_main(void *arg) {
    Packer *p = arg;
    if (p->work->opt->background) pack_quietly(p->work->opt->threads);
    pack_pieces(p->work, p->scratch);
    return NULL;
}

/* Packs pieces [lo, hi) into blob (which has room for the magic already
 * in it plus every piece's bound), each piece into a slot of its own, then
 * closes the gaps in piece order: the same bytes whatever the thread
 * count. Chunk offsets are relative to the blob. Threads of the round's
 * own pack; the calling thread first does the write w (the previous
 * round's; none when NULL), then packs with them, or beside training
 * waits for them. Every wait sleeps: a thread spinning for another (as in
 * an OpenMP barrier) would take the core that one needs, or a training
 * thread's. Signals stay with the threads that had them. */
static void pack_round(const Piece *pcs, int lo, int hi, const CkWriteOpts *opt, CkChunk *chunks,
                       Blob *blob, RoundWrite *w, Scratch *scratch) {
    size_t *slot = xcalloc((size_t)(hi - lo) + 1, sizeof(size_t)), at = blob->len;
    for (int i = lo; i < hi; i++) {
        slot[i - lo] = at;
        at += piece_bound(&pcs[i]);
    }
    const int team = pack_team(opt);
    PackWork work = {pcs, opt, chunks, blob->buf, slot, lo, hi, lo};
    Packer *pk = xcalloc((size_t)team, sizeof(Packer));
    pthread_t *tid = xcalloc((size_t)team, sizeof(pthread_t));
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int started = 0; /* threads 1..started run */
    for (int t = 1; t < team && hi > lo; started = t++) {
        pk[t] = (Packer){&work, &scratch[t]};
        if (pthread_create(&tid[t], NULL, packer_main, &pk[t]) != 0) break;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (w) write_round(w);
    if (!opt->background || started == 0) pack_pieces(&work, &scratch[0]);
    for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
    free(pk);
    free(tid);
    for (int i = lo; i < hi; i++) {
        memmove(blob->buf + blob->len, blob->buf + slot[i - lo], chunks[i].csize);
        chunks[i].offset = blob->len;
        blob->len += chunks[i].csize;
    }
    free(slot);
}

/* The errno an injected failure of the calling thread's last MPI-IO call
 * stands for (0: none). */
static _Thread_local int fp_errno;

static int mpi_failed(int rc, const char *call, const char *path, Err *err) {
    if (rc == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (fp_errno) snprintf(msg, sizeof msg, "%s", strerror(fp_errno));
    else MPI_Error_string(rc, msg, &len);
    fp_errno = 0;
    err_set(err, "ckpt: %s on '%s' failed: %s", call, path, msg);
    return 1;
}

/* The save's collective MPI-IO calls, each behind its fault point. A call
 * that is to fail is still made, so that no other rank waits in it for
 * this one, and then reported failed with the injected errno. */
static int fp_mpi_result(int injected, int rc) {
    if (!injected || rc != MPI_SUCCESS) return rc;
    fp_errno = injected;
    return MPI_ERR_IO;
}

/* fault_point's verdict: 0 go on, else the errno to fail with. */
static int fp_verdict(const char *point) { return fault_point(point) != 0 ? errno : 0; }

/* MPI_File_open for writing; *fh is MPI_FILE_NULL unless the file is open
 * (which it may be when the result is an injected failure). */
static int fp_file_open(MPI_Comm comm, const char *path, MPI_Info info, MPI_File *fh) {
    const int inj = fp_verdict("data.open");
    *fh = MPI_FILE_NULL;
    int rc = MPI_File_open(comm, path, MPI_MODE_CREATE | MPI_MODE_WRONLY, info, fh);
    if (rc != MPI_SUCCESS) *fh = MPI_FILE_NULL;
    return fp_mpi_result(inj, rc);
}

static int fp_file_set_size(MPI_File fh) {
    const int inj = fp_verdict("data.truncate");
    return fp_mpi_result(inj, MPI_File_set_size(fh, 0));
}

static int fp_file_write_at_all(MPI_File fh, unsigned long long at, const Blob *b,
                                MPI_Status *st) {
    const int inj = fp_verdict("data.write");
    return fp_mpi_result(
        inj, MPI_File_write_at_all(fh, (MPI_Offset)at, b->buf, (int)b->len, MPI_BYTE, st));
}

static int fp_file_sync(MPI_File fh) {
    const int inj = fp_verdict("data.sync");
    return fp_mpi_result(inj, MPI_File_sync(fh));
}

static int fp_file_close(MPI_File *fh) {
    const int inj = fp_verdict("data.close");
    return fp_mpi_result(inj, MPI_File_close(fh));
}

/* The whole job agrees on success: every rank's flag, OR-ed. */
static int any_failed(MPI_Comm comm, int failed) {
    int any = 0;
    MPI_CHECK(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, comm));
    return any;
}

/* Waits for req without spinning: Open MPI's blocking calls poll at full speed for as long as
 * the slowest rank is behind, which takes a core from the threads packing
 * (and beside training, from training). Tests between naps that double
 * from 20 us to 2 ms. */
static void quiet_wait(MPI_Request *req) {
    for (long ns = 20000;; ns = ns < 1000000 ? 2 * ns : 2000000) {
        int done = 0;
        MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (done) return;
        struct timespec nap = {0, ns};
        nanosleep(&nap, NULL);
    }
}

/* A barrier that waits quietly: every rank of a save calls it before a
 * phase of collectives, so that they then find each other at once. */
static void quiet_barrier(MPI_Comm comm) {
    MPI_Request req;
    MPI_CHECK(MPI_Ibarrier(comm, &req));
    quiet_wait(&req);
}

/* The collective write of every rank's blob at base + the bytes of the
 * ranks before it (every rank's length gathered, waited for quietly); the
 * call's return code and byte count are checked (*failed set, the first
 * failure kept). MPI calls from the master thread only. */
static void write_round(RoundWrite *w) {
    unsigned long long mine = w->blob->len;
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(w->comm, &rank));
    MPI_CHECK(MPI_Comm_size(w->comm, &size));
    unsigned long long *lens = xcalloc((size_t)size, sizeof *lens), before = 0;
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, lens, 1, MPI_UNSIGNED_LONG_LONG,
                             w->comm, &req));
    quiet_wait(&req);
    w->total = 0;
    for (int r = 0; r < size; r++) {
        if (r < rank) before += lens[r];
        w->total += lens[r];
    }
    free(lens);
    w->at = w->base + before;
    /* blocking: every rank has just arrived, and Open MPI's OMPIO
     * progresses non-blocking I/O from whichever thread polls, which
     * beside training's MPI calls corrupted the heap */
    MPI_Status st;
    int rc = fp_file_write_at_all(w->fh, w->at, w->blob, &st);
    if (!*w->failed && mpi_failed(rc, "MPI_File_write_at_all", w->path, w->err)) *w->failed = 1;
    int wrote = 0;
    if (rc == MPI_SUCCESS) MPI_Get_count(&st, MPI_BYTE, &wrote);
    if (!*w->failed && (size_t)wrote != w->blob->len) {
        err_set(w->err, "ckpt: wrote %d of %zu bytes to '%s' at offset %llu (disk full?)", wrote,
                w->blob->len, w->path, w->at);
        *w->failed = 1;
    }
    if (!*w->failed) behind_round(w->behind, w->at, w->blob->len);
    fault_progress();
}

/* The data file: rounds of at most CK_ROUND_BYTES of raw state a rank,
 * each packed on all threads while the master thread writes the previous
 * one (two buffers in turn), so that the memory a save takes stays bounded
 * whatever the model. Rank 0's first round starts with the magic. Fills
 * the chunks' file offsets and *total. Returns 0 on every rank or -1 on
 * every rank (err set where it failed). */
static int write_data(MPI_Comm comm, const char *path, const Piece *pcs, int np,
                      const CkWriteOpts *opt, long step, CkChunk *chunks, unsigned long long *total,
                      Err *err) {
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    /* Each rank writes one contiguous extent a round: aggregating them
     * through collective buffers only copies (Open MPI's OMPIO measured
     * 254 MB/s with its default two-phase path, 1238 MB/s without, on a
     * 1.2 GB write in 128 MiB rounds); ROMIO decides the same by itself
     * for accesses that do not interleave. */
    MPI_Info info;
    MPI_CHECK(MPI_Info_create(&info));
    MPI_CHECK(MPI_Info_set(info, "romio_cb_write", "disable"));
    MPI_File fh;
    quiet_barrier(comm);
    int rc = fp_file_open(comm, path, info, &fh);
    MPI_CHECK(MPI_Info_free(&info));
    if (any_failed(comm, mpi_failed(rc, "MPI_File_open", path, err))) {
        /* opened on some ranks only: those close it, or the handle (and on
         * NFS a .nfs file in the directory to remove) would stay */
        if (fh != MPI_FILE_NULL) fp_file_close(&fh);
        return -1;
    }
    MPI_File_set_errhandler(fh, MPI_ERRORS_RETURN);
    rc = fp_file_set_size(fh);
    int failed = mpi_failed(rc, "MPI_File_set_size", path, err);
    /* for the write-behind hints only: nothing is written through it */
    Behind behind = {open(path, O_RDONLY | O_CLOEXEC), {0, 0}, {0, 0}};
    /* round boundaries: pieces in order, at most CK_ROUND_BYTES raw each;
     * two buffers, used in turn, hold the largest round's bound */
    int *ends = xcalloc((size_t)np + 2, sizeof(int)), nr = 0;
    size_t arena = 0;
    for (int i = 0; i < np;) {
        uint64_t raw = 0;
        size_t bound = 0;
        do {
            raw += (uint64_t)pcs[i].nr * (uint64_t)pcs[i].s->nc * 4;
            bound += piece_bound(&pcs[i]);
        } while (++i < np &&
                 raw + (uint64_t)pcs[i].nr * (uint64_t)pcs[i].s->nc * 4 <= CK_ROUND_BYTES);
        ends[nr++] = i;
        if (bound > arena) arena = bound;
    }
    size_t most = 0;
    for (int i = 0; i < np; i++) {
        const size_t bytes = (size_t)pcs[i].nr * (size_t)pcs[i].s->nc * 4;
        if (bytes > most) most = bytes;
    }
    const int team = pack_team(opt);
    Scratch *scratch = xcalloc((size_t)team, sizeof(Scratch));
    for (int t = 0; t < team; t++) scratch[t] = (Scratch){xmalloc(most + 4), xmalloc(most + 4)};
    int rounds = 0;
    MPI_CHECK(MPI_Allreduce(&nr, &rounds, 1, MPI_INT, MPI_MAX, comm));
    if (rounds < 1) rounds = 1; /* the magic */
    Blob blob[2] = {{xmalloc(arena + 8), 0}, {NULL, 0}};
    if (rounds > 1) blob[1] = (Blob){xmalloc(arena + 8), 0};
    if (rank == 0) {
        memcpy(blob[0].buf, CK_DATA_MAGIC, 8);
        blob[0].len = 8;
    }
    pack_round(pcs, 0, nr > 0 ? ends[0] : 0, opt, chunks, &blob[0], NULL, scratch);
    ck_fault("pack", step);
    unsigned long long base = 0;
    for (int k = 0; k < rounds; k++) {
        /* round k is written while round k + 1 packs into the other buffer */
        RoundWrite w = {fh, comm, path, &blob[k % 2], base, 0, 0, &behind, &failed, err};
        const int lo = k < nr ? ends[k] : np, hi = k + 1 < nr ? ends[k + 1] : lo;
        if (k + 1 < rounds) {
            blob[(k + 1) % 2].len = 0;
            pack_round(pcs, lo, hi, opt, chunks, &blob[(k + 1) % 2], &w, scratch);
        } else {
            write_round(&w);
        }
        ck_fault("write", step);
        const int first = k == 0 ? 0 : k - 1 < nr ? ends[k - 1] : np, last = k < nr ? ends[k] : np;
        for (int i = first; i < last; i++) chunks[i].offset += w.at;
        base += w.total;
    }
    free(blob[0].buf);
    free(blob[1].buf);
    for (int t = 0; t < team; t++) {
        free(scratch[t].raw);
        free(scratch[t].planes);
    }
    free(scratch);
    free(ends);
    *total = base;
    quiet_barrier(comm);
    rc = fp_file_sync(fh);
    if (!failed && mpi_failed(rc, "MPI_File_sync", path, err)) failed = 1;
    behind_drop(&behind, 0);
    behind_drop(&behind, 1);
    if (behind.fd >= 0) close(behind.fd);
    rc = fp_file_close(&fh);
    if (!failed && mpi_failed(rc, "MPI_File_close", path, err)) failed = 1;
    return any_failed(comm, failed) ? -1 : 0;
}

/* MODTRAIN_FAULT cut at its colons: NAME[:ARG[:ARG]]; *n fields. */
static int fault_fields(char f[3][64]) {
    const char *env = getenv("MODTRAIN_FAULT");
    int n = 0;
    if (!env || strlen(env) >= 64) return 0;
    for (const char *p = env; n < 3; n++) {
        size_t len = strcspn(p, ":");
        memcpy(f[n], p, len);
        f[n][len] = '\0';
        if (!p[len]) return n + 1;
        p += len + 1;
    }
    return n;
}

/* Whether field s (absent when NULL) leaves the hook on for step. */
static int fault_step(const char *s, long step) {
    long long want;
    return !s || (parse_i64(s, 0, 99999999, &want) == 0 && want == step);
}

void ck_fault(const char *phase, long step) {
    if (strcmp(phase, "slow") != 0) {
        char point[64];
        snprintf(point, sizeof point, "phase.%s", phase);
        fault_point(point); /* a phase has no call to fail: only kill acts */
    }
    char f[3][64];
    const int n = fault_fields(f);
    long long ms;
    if (n == 0) return;
    if (strcmp(phase, "slow") == 0 && n == 2 && strcmp(f[0], "save-slow") == 0 &&
        parse_i64(f[1], 1, 600000, &ms) == 0)
        usleep((useconds_t)ms * 1000);
    if (strcmp(phase, "index") == 0 && strcmp(f[0], "save-crash") == 0 && n <= 2 &&
        fault_step(n == 2 ? f[1] : NULL, step)) {
        fprintf(stderr, "modtrain: MODTRAIN_FAULT=save-crash: exiting in the middle of a save\n");
        _exit(137);
    }
    if (strcmp(f[0], "save-kill") == 0 && n >= 2 && strcmp(f[1], phase) == 0 &&
        fault_step(n == 3 ? f[2] : NULL, step)) {
        fprintf(stderr, "modtrain: MODTRAIN_FAULT=save-kill:%s: killed in the save of step %ld\n",
                phase, step);
        raise(SIGKILL);
    }
}

/* The "state.step" value among kv, for the fault hooks (-1: none). */
static long kv_step(const CkKV *kv, int nkv) {
    long step = -1;
    for (int i = 0; i < nkv; i++)
        if (strcmp(kv[i].key, "state.step") == 0) {
            long long v;
            step = parse_i64(kv[i].value, 0, 99999999, &v) == 0 ? (long)v : -1;
        }
    return step;
}

/* Sums this rank's part of a save over comm into *st. */
static void reduce_stats(MPI_Comm comm, const CkChunk *chunks, int n, CkStats *st) {
    double v[5] = {0}, share;
    for (int i = 0; i < n; i++) {
        v[0] += (double)chunks[i].usize;
        v[1] += (double)chunks[i].csize;
        v[2] += 1;
        for (int p = 0; p < 4; p++) v[3 + (chunks[i].codec[p] == 'h')] += 1;
    }
    share = v[0];
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 5, MPI_DOUBLE, MPI_SUM, comm));
    MPI_CHECK(MPI_Allreduce(&share, &st->share_min, 1, MPI_DOUBLE, MPI_MIN, comm));
    MPI_CHECK(MPI_Allreduce(&share, &st->share_max, 1, MPI_DOUBLE, MPI_MAX, comm));
    st->raw = v[0], st->stored = v[1], st->chunks = (long long)v[2];
    st->planes = (long long)(v[3] + v[4]), st->planes_deflated = (long long)v[4];
}

int ck_write(MPI_Comm comm, const char *dir, const CkSlice *slices, int n, const CkKV *kv, int nkv,
             const CkWriteOpts *opt, CkStats *st, Err *err) {
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    err->msg[0] = '\0';
    char path[1200];
    snprintf(path, sizeof path, "%s/data.bin", dir);
    Piece *pcs;
    int np = plan_pieces(slices, n, opt->chunk_floats > 0 ? opt->chunk_floats : 1 << 20, &pcs);
    int failed = 0;
    CkChunk *chunks = xcalloc((size_t)np + 1, sizeof(CkChunk));
    unsigned long long total = 0;
    /* 1. the data, packed and written collectively in rounds */
    const long step = kv_step(kv, nkv);
    ck_fault("slow", step);
    if (write_data(comm, path, pcs, np, opt, step, chunks, &total, err) != 0) {
        if (!err->msg[0]) err_set(err, "ckpt: another rank failed while writing '%s'", path);
        free(chunks);
        free(pcs);
        return -1;
    }
    ck_fault("index", step);
    /* 2. the index, after the data */
    quiet_barrier(comm);
    char *lines = gather_chunk_lines(comm, chunks, np);
    if (rank == 0) failed = write_index(dir, total, kv, nkv, lines, err) != 0;
    free(lines);
    MPI_CHECK(MPI_Bcast(&failed, 1, MPI_INT, 0, comm));
    if (failed && rank != 0) err_set(err, "ckpt: rank 0 could not write the index of '%s'", dir);
    if (st) reduce_stats(comm, chunks, np, st);
    free(chunks);
    free(pcs);
    return failed ? -1 : 0;
}
