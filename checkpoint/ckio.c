/*
 * ckio: shuffle + deflate + CRC32 chunks, the collective data write, the
 * text index, and reading any slice back from the chunks that overlap it.
 */
#include "checkpoint/ckio.h"
#include "checkpoint/huff.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "mpi/check.h"
#include "src/base/fault.h"
#include "src/base/files.h"
#include "src/base/util.h"

/* Byte b of every float to plane b. On a little-endian machine a float's
 * bytes are its word's bytes from the low end, and shifts of whole words
 * vectorise (2.8 against 7.9 GB/s for the byte loop, one core). */
void ck_shuffle(uint8_t *restrict dst, const float *restrict src, size_t n) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint8_t *restrict p0 = dst, *restrict p1 = dst + n, *restrict p2 = dst + 2 * n,
                      *restrict p3 = dst + 3 * n;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, src + i, 4);
        p0[i] = (uint8_t)w, p1[i] = (uint8_t)(w >> 8), p2[i] = (uint8_t)(w >> 16);
        p3[i] = (uint8_t)(w >> 24);
    }
#else
    const uint8_t *s = (const uint8_t *)src;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) dst[(size_t)b * n + i] = s[4 * i + b];
#endif
}

void ck_unshuffle(float *restrict dst, const uint8_t *restrict src, size_t n) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint8_t *restrict p0 = src, *restrict p1 = src + n, *restrict p2 = src + 2 * n,
                            *restrict p3 = src + 3 * n;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const uint32_t w =
            (uint32_t)p0[i] | (uint32_t)p1[i] << 8 | (uint32_t)p2[i] << 16 | (uint32_t)p3[i] << 24;
        memcpy(dst + i, &w, 4);
    }
#else
    uint8_t *d = (uint8_t *)dst;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) d[4 * i + b] = src[(size_t)b * n + i];
#endif
}

/* ------------------------------------------------------------------ write */

/* A round's packed bytes (room for the round's bound, reused). */
typedef struct {
    uint8_t *buf;
    size_t len;
} Blob;

static void text_append(char **s, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void text_append(char **s, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(*s ? *s + *len : NULL, *s ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (*s && (size_t)k < *cap - *len) {
            *len += (size_t)k;
            return;
        }
        size_t ncap = (*cap ? *cap * 2 : 4096) + (size_t)k;
        char *ns = xmalloc(ncap);
        if (*s) memcpy(ns, *s, *len);
        free(*s);
        *s = ns;
        *cap = ncap;
    }
}

/* One chunk to write: rows [r0, r0 + nr) of a slice. */
typedef struct {
    const CkSlice *s;
    int64_t r0, nr;
} Piece;

/* Stores one byte plane into out (compressBound(n) bytes): Huffman-coded
 * when a sample of it gains at least 2% and the whole does gain, raw
 * otherwise. Returns the stored size and sets *codec: 'h' (a zlib stream)
 * or 'r' (raw bytes). */
static size_t pack_plane(const uint8_t *plane, size_t n, int level, uint8_t *out, char *codec) {
    *codec = 'r';
    if (level > 0 && n >= 64) {
        const size_t probe = n < CK_PROBE_BYTES ? n : CK_PROBE_BYTES;
        const size_t sample = ck_huffman(plane, probe, out, compressBound((uLong)probe));
        if (sample > 0 && sample < probe - probe / 50) {
            const size_t got = ck_huffman(plane, n, out, compressBound((uLong)n));
            if (got > 0 && got < n) {
                *codec = 'h';
                return got;
            }
        }
    }
    memcpy(out, plane, n);
    return n;
}

/* Bytes pack_piece may store for a piece: each plane deflated or raw. */
static size_t piece_bound(const Piece *pc) {
    return 4 * (size_t)compressBound((uLong)((size_t)pc->nr * (size_t)pc->s->nc));
}

/* Packs one piece into out (piece_bound bytes): its rows (first copied
 * contiguous into raw when they are a column slice's), their CRC32, the
 * 4 byte planes (shuffle, into planes) each deflated or raw. raw and
 * planes are the calling thread's scratch, 4 bytes an element. Fills the
 * chunk but its offset. */
static void pack_piece(const Piece *pc, int level, CkChunk *c, uint8_t *out, float *raw,
                       uint8_t *planes) {
    const CkSlice *s = pc->s;
    const size_t n = (size_t)pc->nr * (size_t)s->nc, bytes = n * sizeof(float);
    const float *rows = s->data + (pc->r0 - s->r0) * s->ld;
    if (s->ld != s->nc && pc->nr > 1) { /* a column slice: its rows made contiguous */
        for (int64_t r = 0; r < pc->nr; r++)
            memcpy(raw + (size_t)r * s->nc, rows + r * s->ld, (size_t)s->nc * sizeof(float));
        rows = raw;
    }
    ck_shuffle(planes, rows, n);
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", s->name);
    c->ndim = s->ndim;
    c->rows = s->rows, c->cols = s->cols, c->r0 = pc->r0, c->nr = pc->nr, c->c0 = s->c0;
    c->nc = s->nc;
    c->usize = bytes;
    c->crc = (uint32_t)crc32(0L, (const Bytef *)rows, (uInt)bytes);
    for (int p = 0; p < 4; p++) {
        c->psize[p] = pack_plane(planes + (size_t)p * n, n, level, out + c->csize, &c->codec[p]);
        c->csize += c->psize[p];
    }
}

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

/* Every rank's chunk lines, gathered in rank order on rank 0 (NULL
 * elsewhere): malloc'd text. */
static char *gather_chunk_lines(MPI_Comm comm, const CkChunk *chunks, int n) {
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    char *text = NULL;
    size_t tlen = 0, tcap = 0;
    text_append(&text, &tlen, &tcap, "%s", "");
    for (int i = 0; i < n; i++) {
        const CkChunk *c = &chunks[i];
        text_append(&text, &tlen, &tcap,
                    "chunk %s %d %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64
                    " %" PRId64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %08" PRIx32
                    " %c%" PRIu64 ",%c%" PRIu64 ",%c%" PRIu64 ",%c%" PRIu64 "\n",
                    c->name, c->ndim, c->rows, c->cols, c->r0, c->nr, c->c0, c->nc, c->offset,
                    c->csize, c->usize, c->crc, c->codec[0], c->psize[0], c->codec[1],
                    c->psize[1], c->codec[2], c->psize[2], c->codec[3], c->psize[3]);
    }
    int mylen = (int)tlen;
    int *lens = rank == 0 ? xcalloc((size_t)size, sizeof(int)) : NULL;
    int *displs = rank == 0 ? xcalloc((size_t)size, sizeof(int)) : NULL;
    MPI_CHECK(MPI_Gather(&mylen, 1, MPI_INT, lens, 1, MPI_INT, 0, comm));
    char *all = NULL;
    if (rank == 0) {
        size_t sum = 0;
        for (int r = 0; r < size; r++) {
            displs[r] = (int)sum;
            sum += (size_t)lens[r];
        }
        all = xmalloc(sum + 1);
        all[sum] = '\0';
    }
    MPI_CHECK(MPI_Gatherv(text, mylen, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, comm));
    free(text);
    free(lens);
    free(displs);
    return all;
}

/* Step 4 (rank 0): the index, its key/value lines, the chunk lines and the
 * CRC of them all, written durably. Returns 0 or -1 with err set. */
static int write_index(const char *dir, unsigned long long total, const CkKV *kv, int nkv,
                       const char *chunk_lines, Err *err) {
    char *ix = NULL;
    size_t ilen = 0, icap = 0;
    text_append(&ix, &ilen, &icap, "%s\ndata data.bin %llu\n", CK_INDEX_MAGIC, total);
    for (int i = 0; i < nkv; i++)
        text_append(&ix, &ilen, &icap, "kv %s %s\n", kv[i].key, kv[i].value);
    text_append(&ix, &ilen, &icap, "%s", chunk_lines);
    uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)ix, (uInt)ilen);
    text_append(&ix, &ilen, &icap, "end %08" PRIx32 "\n", crc);
    char ipath[1200];
    snprintf(ipath, sizeof ipath, "%s/index", dir);
    Err werr;
    /* a directory fsync that fails fails the save: it is not committed */
    int rc = write_file_durable("index", ipath, ix, ilen, &werr) != 0 ? -1 : 0;
    if (rc != 0) err_set(err, "ckpt: %s", werr.msg);
    free(ix);
    return rc;
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

/* ------------------------------------------------------------------- read */

void ck_index_free(CkIndex *ix) {
    free(ix->kv);
    free(ix->chunks);
    memset(ix, 0, sizeof *ix);
}

const char *ck_kv(const CkIndex *ix, const char *key) {
    for (int i = 0; i < ix->nkv; i++)
        if (strcmp(ix->kv[i].key, key) == 0) return ix->kv[i].value;
    return NULL;
}

/* Splits line at single spaces into at most max fields. Returns the count,
 * or -1 for an empty field (a leading, trailing or doubled space) or too
 * many fields. */
static int split_fields(char *line, char **f, int max) {
    int n = 0;
    for (char *p = line;; p++) {
        char *sp = strchr(p, ' ');
        if (n == max || sp == p || *p == '\0') return -1;
        f[n++] = p;
        if (!sp) return n;
        *sp = '\0';
        p = sp;
    }
}

/* Exactly 8 hex digits. */
static int parse_crc(const char *s, uint32_t *out) {
    if (strlen(s) != 8 || strspn(s, "0123456789abcdefABCDEF") != 8) return -1;
    *out = (uint32_t)strtoul(s, NULL, 16);
    return 0;
}

/* The fields of a chunk line into c; *why says what is wrong. Every number
 * is parsed whole and bounded, and every sum and product is checked. */
static int parse_chunk(CkChunk *c, char **f, const char **why) {
    /* ndim rows cols r0 nr c0 nc offset csize usize */
    long long v[10];
    static const long long lo[10] = {1, 1, 1, 0, 1, 0, 1, 0, 0, 0};
    for (int i = 0; i < 10; i++) {
        long long hi = i < 7 ? INT32_MAX : INT64_MAX;
        if (parse_i64(f[i + 2], lo[i], hi, &v[i]) != 0) {
            *why = "a number is missing, malformed or out of range";
            return -1;
        }
    }
    if (strlen(f[1]) >= sizeof c->name) return (*why = "the tensor name is too long"), -1;
    snprintf(c->name, sizeof c->name, "%s", f[1]);
    c->ndim = (int)v[0], c->rows = v[1], c->cols = v[2], c->r0 = v[3], c->nr = v[4];
    c->c0 = v[5], c->nc = v[6];
    c->offset = (uint64_t)v[7], c->csize = (uint64_t)v[8], c->usize = (uint64_t)v[9];
    uint64_t bytes;
    if (c->ndim > 2 || (c->ndim == 1 && c->cols != 1)) *why = "ndim is not 1 or 2 (1: one column)";
    else if (c->r0 + c->nr > c->rows || c->c0 + c->nc > c->cols)
        *why = "the slice leaves its tensor";
    else if (__builtin_mul_overflow((uint64_t)c->nr * (uint64_t)c->nc, 4, &bytes) ||
             bytes != c->usize)
        *why = "the raw size is not 4 x rows x cols of the slice";
    else if (parse_crc(f[12], &c->crc) != 0) *why = "the CRC32 is not 8 hex digits";
    else return 0;
    return -1;
}

/* A version-2 chunk's planes field, "h123,r4096,r4096,h200": each plane's
 * codec and stored size; raw planes hold exactly a quarter of the raw
 * bytes, and the sizes add up to the stored size (checked sums). */
static int parse_planes(CkChunk *c, char *field, const char **why) {
    char *f[4];
    int n = 0;
    for (char *p = field;; p++) {
        char *comma = strchr(p, ',');
        if (n == 4 || comma == p || *p == '\0') return (*why = "the planes field is malformed"), -1;
        f[n++] = p;
        if (!comma) break;
        *comma = '\0';
        p = comma;
    }
    if (n != 4) return (*why = "the planes field does not have 4 planes"), -1;
    uint64_t sum = 0;
    for (int p = 0; p < 4; p++) {
        long long v;
        c->codec[p] = f[p][0];
        if ((c->codec[p] != 'h' && c->codec[p] != 'r') || parse_i64(f[p] + 1, 0, INT64_MAX, &v) != 0)
            return (*why = "a plane is not h or r followed by its size"), -1;
        c->psize[p] = (uint64_t)v;
        if (c->codec[p] == 'r' && c->psize[p] != c->usize / 4)
            return (*why = "a raw plane is not a quarter of the raw size"), -1;
        if (__builtin_add_overflow(sum, c->psize[p], &sum))
            return (*why = "the plane sizes overflow"), -1;
    }
    if (sum != c->csize) return (*why = "the plane sizes do not add up to the stored size"), -1;
    return 0;
}

/* One "data", "kv" or "chunk" line of an index into ix; caps are the
 * arrays' capacities. Returns 0, or -1 with *why saying what is wrong. */
static int parse_record(CkIndex *ix, char *line, int *kcap, int *ccap, const char **why) {
    char *f[14];
    *why = "not a data, kv or chunk line";
    if (strncmp(line, "kv ", 3) == 0) {
        char *key = line + 3, *sp = strchr(key, ' ');
        if (!sp || sp == key || (size_t)(sp - key) >= sizeof ix->kv[0].key ||
            strlen(sp + 1) >= sizeof ix->kv[0].value)
            return (*why = "a kv line needs a key and a value of bounded length"), -1;
        *sp = '\0';
        if (ck_kv(ix, key)) return (*why = "the key appears twice"), -1;
        if (ix->nkv == *kcap) {
            *kcap = *kcap ? 2 * *kcap : 32;
            ix->kv = xrealloc(ix->kv, (size_t)*kcap * sizeof(CkKV));
        }
        snprintf(ix->kv[ix->nkv].key, sizeof ix->kv[0].key, "%s", key);
        snprintf(ix->kv[ix->nkv].value, sizeof ix->kv[0].value, "%s", sp + 1);
        ix->nkv++;
        return 0;
    }
    int n = split_fields(line, f, 14);
    if (n == 3 && strcmp(f[0], "data") == 0 && strcmp(f[1], "data.bin") == 0) {
        long long b;
        if (parse_i64(f[2], 8, INT64_MAX, &b) != 0) return (*why = "a bad data size"), -1;
        ix->data_bytes = (uint64_t)b;
        return 0;
    }
    if (n != (ix->version == 1 ? 13 : 14) || strcmp(f[0], "chunk") != 0) return -1;
    if (ix->nchunks == *ccap) {
        *ccap = *ccap ? 2 * *ccap : 128;
        ix->chunks = xrealloc(ix->chunks, (size_t)*ccap * sizeof(CkChunk));
    }
    CkChunk *c = &ix->chunks[ix->nchunks];
    memset(c, 0, sizeof *c);
    if (parse_chunk(c, f, why) != 0 || (ix->version == 2 && parse_planes(c, f[13], why) != 0))
        return -1;
    ix->nchunks++;
    return 0;
}

static int chunk_order(const void *a, const void *b) {
    const CkChunk *x = *(const CkChunk *const *)a, *y = *(const CkChunk *const *)b;
    int k = strcmp(x->name, y->name);
    if (k) return k;
    if (x->r0 != y->r0) return x->r0 < y->r0 ? -1 : 1;
    return x->c0 < y->c0 ? -1 : x->c0 > y->c0;
}

/* The chunks of one tensor, sorted by position, tile it exactly: one shape,
 * no two overlapping, and together as many elements as the tensor has. */
static int check_tensor_tiling(const CkIndex *ix, CkChunk **c, int k, Err *err) {
    if (k > CK_MAX_CHUNKS)
        return err_set(err, "ckpt: '%s/index': tensor %s has %d chunks (at most %d)", ix->dir,
                       c[0]->name, k, CK_MAX_CHUNKS);
    uint64_t area = 0, total = (uint64_t)c[0]->rows * (uint64_t)c[0]->cols;
    for (int i = 0; i < k; i++) {
        if (c[i]->ndim != c[0]->ndim || c[i]->rows != c[0]->rows || c[i]->cols != c[0]->cols)
            return err_set(err, "ckpt: '%s/index': the chunks of %s disagree on its shape", ix->dir,
                           c[0]->name);
        for (int j = i + 1; j < k && c[j]->r0 < c[i]->r0 + c[i]->nr; j++)
            if (c[j]->c0 < c[i]->c0 + c[i]->nc && c[i]->c0 < c[j]->c0 + c[j]->nc)
                return err_set(err,
                               "ckpt: '%s/index': chunks of %s overlap at rows %" PRId64
                               " and %" PRId64 " (a region stored twice)",
                               ix->dir, c[0]->name, c[i]->r0, c[j]->r0);
        area += (uint64_t)c[i]->nr * (uint64_t)c[i]->nc; /* <= total: no overflow */
    }
    if (area != total)
        return err_set(err,
                       "ckpt: '%s/index': the chunks of %s hold %" PRIu64 " of its %" PRIu64
                       " elements (a region is missing)",
                       ix->dir, c[0]->name, area, total);
    return 0;
}

/* Every tensor of the index is tiled exactly by its chunks. */
static int check_tiling(const CkIndex *ix, Err *err) {
    CkChunk **order = xcalloc((size_t)ix->nchunks + 1, sizeof(CkChunk *));
    for (int i = 0; i < ix->nchunks; i++) order[i] = &ix->chunks[i];
    qsort(order, (size_t)ix->nchunks, sizeof(CkChunk *), chunk_order);
    int rc = 0;
    for (int i = 0, j; rc == 0 && i < ix->nchunks; i = j) {
        j = i + 1; /* [i, j): one tensor's chunks */
        while (j < ix->nchunks && strcmp(order[j]->name, order[i]->name) == 0) j++;
        rc = check_tensor_tiling(ix, order + i, j - i, err);
    }
    free(order);
    return rc;
}

/* The lines of an index after its magic: records, then an "end" line whose
 * CRC32 covers every line before it. Returns 0 or -1 with err set. */
static int parse_index(CkIndex *ix, const char *path, char *text, size_t len, Err *err) {
    int lineno = 0, have_end = 0, kcap = 0, ccap = 0;
    const char *why = "";
    char cur[96];
    uint32_t running = (uint32_t)crc32(0L, Z_NULL, 0);
    for (char *line = text, *next; line < text + len; line = next) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        if (!nl)
            return err_set(err, "ckpt: '%s' ends without a newline at line %d (truncated index)",
                           path, lineno + 1);
        /* the CRC of every line before "end", taken before the line is cut */
        uint32_t crc_before = running;
        running = (uint32_t)crc32(running, (const Bytef *)line, (uInt)(nl + 1 - line));
        *nl = '\0';
        next = nl + 1;
        lineno++;
        snprintf(cur, sizeof cur, "%s", line); /* parsing cuts the line up */
        if (have_end)
            return err_set(err, "ckpt: '%s' has text after its 'end' line (line %d)", path, lineno);
        if (lineno == 1) continue;
        if (strncmp(line, "end ", 4) == 0) {
            uint32_t want;
            if (parse_crc(line + 4, &want) != 0)
                return err_set(err,
                               "ckpt: '%s' line %d is malformed (an end line needs 8 hex "
                               "digits): '%.80s'",
                               path, lineno, cur);
            if (want != crc_before)
                return err_set(err,
                               "ckpt: '%s' is garbled (CRC32 %08" PRIx32 ", its end line says "
                               "%08" PRIx32 ")",
                               path, crc_before, want);
            have_end = 1;
        } else if (parse_record(ix, line, &kcap, &ccap, &why) != 0) {
            return err_set(err, "ckpt: '%s' line %d is malformed (%s): '%.80s'", path, lineno, why,
                           cur);
        }
    }
    if (!have_end) return err_set(err, "ckpt: '%s' has no 'end' line (truncated index)", path);
    return 0;
}

/* The data file an index describes: its magic, the size the index
 * promises, every chunk inside it. Returns 0 or -1 with err set. */
static int check_data_file(const CkIndex *ix, Err *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/data.bin", ix->dir);
    struct stat st;
    Err e;
    int fd = open_regular(path, O_RDONLY, &st, &e);
    if (fd < 0) return err_set(err, "ckpt: %s", e.msg);
    char magic[8] = {0};
    const ssize_t got = (uint64_t)st.st_size == ix->data_bytes ? pread(fd, magic, 8, 0) : 0;
    close(fd);
    if ((uint64_t)st.st_size != ix->data_bytes)
        return err_set(err, "ckpt: '%s' is %lld bytes, its index says %llu (truncated or extended)",
                       path, (long long)st.st_size, (unsigned long long)ix->data_bytes);
    const char *want = ix->version == 1 ? CK_DATA_MAGIC_V1 : CK_DATA_MAGIC;
    if (got != 8 || memcmp(magic, want, 8) != 0)
        return err_set(err, "ckpt: '%s' has the wrong magic (expected '%s')", path, want);
    for (int i = 0; i < ix->nchunks; i++) {
        const CkChunk *c = &ix->chunks[i];
        /* zlib deflates at most 1032:1, so usize is bounded by the file too */
        if (c->offset < 8 || c->csize > ix->data_bytes || c->offset > ix->data_bytes - c->csize ||
            c->usize / 1032 > c->csize + 1)
            return err_set(err,
                           "ckpt: '%s': chunk %s [%" PRId64 ":%" PRId64 ", %" PRId64 ":%" PRId64
                           "] lies outside the data file or claims more than it can inflate to",
                           ix->dir, c->name, c->r0, c->r0 + c->nr, c->c0, c->c0 + c->nc);
    }
    return 0;
}

int ck_index_parse(CkIndex *ix, const char *dir, char *text, size_t len, Err *err) {
    memset(ix, 0, sizeof *ix);
    snprintf(ix->dir, sizeof ix->dir, "%s", dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/index", dir);
    int rc;
    size_t ml = strlen(CK_INDEX_MAGIC); /* the same length for every version */
    if (len > ml && strncmp(text, CK_INDEX_MAGIC, ml) == 0 && text[ml] == '\n') ix->version = 2;
    else if (len > ml && strncmp(text, CK_INDEX_MAGIC_V1, ml) == 0 && text[ml] == '\n')
        ix->version = 1;
    if (!ix->version)
        rc = err_set(err,
                     "ckpt: '%s' does not start with '%s' or '%s' (not a modtrain checkpoint "
                     "index)",
                     path, CK_INDEX_MAGIC, CK_INDEX_MAGIC_V1);
    else rc = parse_index(ix, path, text, len, err);
    if (rc == 0) rc = check_tiling(ix, err);
    if (rc != 0) ck_index_free(ix);
    return rc;
}

int ck_index_read(const char *dir, CkIndex *ix, Err *err) {
    memset(ix, 0, sizeof *ix);
    char path[1200];
    snprintf(path, sizeof path, "%s/index", dir);
    size_t len = 0;
    Err e;
    char *text = read_file(path, SIZE_MAX, &len, &e);
    if (!text) return err_set(err, "ckpt: %s (an interrupted save or not a checkpoint)", e.msg);
    int rc = ck_index_parse(ix, dir, text, len, err);
    free(text);
    if (rc == 0 && check_data_file(ix, err) != 0) {
        ck_index_free(ix);
        rc = -1;
    }
    return rc;
}

/* Index of the first NaN or Inf of x[0..n), or n. */
static size_t first_non_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return n;
}

/* The stored bytes of a chunk back to its byte planes (usize bytes):
 * version 1, one zlib stream of them all; version 2, each plane raw or its
 * own zlib stream, which must inflate to exactly a quarter and consume
 * exactly its stored size. Returns 0 or -1. */
static int unpack_planes(const CkIndex *ix, const CkChunk *c, const uint8_t *comp, uint8_t *planes) {
    if (ix->version == 1) {
        uLongf ulen = (uLongf)c->usize;
        return uncompress(planes, &ulen, comp, (uLong)c->csize) == Z_OK && ulen == c->usize ? 0
                                                                                             : -1;
    }
    const size_t q = c->usize / 4;
    for (int p = 0; p < 4; p++) {
        if (c->codec[p] == 'r') {
            memcpy(planes + (size_t)p * q, comp, q);
        } else {
            uLongf ulen = (uLongf)q;
            uLong used = (uLong)c->psize[p];
            if (uncompress2(planes + (size_t)p * q, &ulen, comp, &used) != Z_OK || ulen != q ||
                used != c->psize[p])
                return -1;
        }
        comp += c->psize[p];
    }
    return 0;
}

/* Reads, unpacks, unshuffles and checks one chunk into out (usize bytes):
 * sizes, CRC32, and every value finite (a checkpoint holds weights and
 * moments; a NaN with a valid CRC is damage all the same). */
static int load_chunk(const CkIndex *ix, int fd, const CkChunk *c, float *out, Err *err) {
    uint8_t *comp = xmalloc(c->csize + 1), *planes = xmalloc(c->usize + 1);
    int rc = -1;
    size_t got = 0;
    while (got < c->csize) {
        ssize_t k = pread(fd, comp + got, c->csize - got, (off_t)(c->offset + got));
        if (k <= 0) break;
        got += (size_t)k;
    }
    char where[1400];
    snprintf(where, sizeof where, "ckpt: '%s/data.bin': chunk %s [%" PRId64 ":%" PRId64 ", %" PRId64
             ":%" PRId64 "]", ix->dir, c->name, c->r0, c->r0 + c->nr, c->c0, c->c0 + c->nc);
    if (got != c->csize) {
        err_set(err, "%s: short read (%zu of %" PRIu64 " bytes)", where, got, c->csize);
    } else if (unpack_planes(ix, c, comp, planes) != 0) {
        err_set(err, "%s: does not inflate (corrupt)", where);
    } else {
        ck_unshuffle(out, planes, c->usize / 4);
        uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)out, (uInt)c->usize);
        size_t bad = first_non_finite(out, c->usize / 4);
        if (crc != c->crc)
            err_set(err, "%s: CRC32 %08" PRIx32 ", the index says %08" PRIx32 " (corrupt)", where,
                    crc, c->crc);
        else if (bad < c->usize / 4)
            err_set(err, "%s: element %zu is %g (weights and moments must be finite)", where, bad,
                    (double)out[bad]);
        else rc = 0;
    }
    free(comp);
    free(planes);
    return rc;
}

static int open_data(const CkIndex *ix, Err *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/data.bin", ix->dir);
    Err e;
    int fd = open_regular(path, O_RDONLY, NULL, &e);
    if (fd < 0) err_set(err, "ckpt: %s", e.msg);
    return fd;
}

/* A chunk and the part of a slice it fills (NULL slice: only checked). */
typedef struct {
    const CkChunk *c;
    const CkSlice *s;
    int64_t r0, r1, c0, c1;
} Load;

/* Loads every job on all threads (chunks are independent and fill disjoint
 * regions); the first failure in job order is the one reported, whatever
 * the thread count. Returns 0 or -1 with err set. */
static int run_loads(const CkIndex *ix, int fd, const Load *jobs, int n, Err *err) {
    int first = n;
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < n; i++) {
        const Load *L = &jobs[i];
        const CkChunk *c = L->c;
        float *buf = xmalloc(c->usize + 4);
        Err e;
        int bad = fault_point("load.chunk") != 0; /* a read that fails, or stalls */
        if (bad) err_set(&e, "ckpt: '%s': reading chunk %s: %s", ix->dir, c->name, strerror(errno));
        if (bad || load_chunk(ix, fd, c, buf, &e) != 0) {
#pragma omp critical
            if (i < first) {
                first = i;
                *err = e;
            }
        } else if (L->s) {
            const CkSlice *s = L->s;
            for (int64_t r = L->r0; r < L->r1; r++)
                memcpy(s->data + (r - s->r0) * s->ld + (L->c0 - s->c0),
                       buf + (r - c->r0) * c->nc + (L->c0 - c->c0), (size_t)(L->c1 - L->c0) * 4);
        }
        free(buf);
        fault_progress(); /* the watchdog's: a long load is no hang */
    }
    return first < n ? -1 : 0;
}

/* The chunks that overlap slice s, appended to *jobs; checks the shape and
 * that they cover the slice. Returns 0 or -1 with err set. */
static int plan_slice(const CkIndex *ix, const CkSlice *s, Load **jobs, int *n, int *cap,
                      Err *err) {
    int64_t covered = 0, found = 0;
    for (int j = 0; j < ix->nchunks; j++) {
        const CkChunk *c = &ix->chunks[j];
        if (strcmp(c->name, s->name) != 0) continue;
        found = 1;
        if (c->rows != s->rows || c->cols != s->cols)
            return err_set(err,
                           "ckpt: '%s': tensor %s is [%" PRId64 ", %" PRId64 "], this run "
                           "expects [%" PRId64 ", %" PRId64 "]",
                           ix->dir, s->name, c->rows, c->cols, s->rows, s->cols);
        int64_t r0 = c->r0 > s->r0 ? c->r0 : s->r0;
        int64_t r1 = c->r0 + c->nr < s->r0 + s->nr ? c->r0 + c->nr : s->r0 + s->nr;
        int64_t c0 = c->c0 > s->c0 ? c->c0 : s->c0;
        int64_t c1 = c->c0 + c->nc < s->c0 + s->nc ? c->c0 + c->nc : s->c0 + s->nc;
        if (r0 >= r1 || c0 >= c1) continue;
        if (*n == *cap) *jobs = xrealloc(*jobs, (size_t)(*cap = 2 * *cap + 16) * sizeof(Load));
        (*jobs)[(*n)++] = (Load){c, s, r0, r1, c0, c1};
        covered += (r1 - r0) * (c1 - c0);
    }
    if (!found) return err_set(err, "ckpt: '%s' holds no tensor %s", ix->dir, s->name);
    if (covered != s->nr * s->nc)
        return err_set(err,
                       "ckpt: '%s': the chunks of %s cover %" PRId64 " of the %" PRId64
                       " elements this rank needs",
                       ix->dir, s->name, covered, s->nr * s->nc);
    return 0;
}

int ck_read_slices(const CkIndex *ix, const CkSlice *slices, int n, Err *err) {
    Load *jobs = NULL;
    int nj = 0, cap = 0, rc = 0;
    for (int i = 0; i < n && rc == 0; i++) rc = plan_slice(ix, &slices[i], &jobs, &nj, &cap, err);
    int fd = rc == 0 ? open_data(ix, err) : -1;
    if (fd >= 0) {
        rc = run_loads(ix, fd, jobs, nj, err);
        close(fd);
    } else {
        rc = -1;
    }
    free(jobs);
    return rc;
}

int ck_verify(const CkIndex *ix, Err *err) {
    int fd = open_data(ix, err);
    if (fd < 0) return -1;
    Load *jobs = xcalloc((size_t)ix->nchunks + 1, sizeof(Load));
    for (int j = 0; j < ix->nchunks; j++) jobs[j].c = &ix->chunks[j];
    int rc = run_loads(ix, fd, jobs, ix->nchunks, err);
    free(jobs);
    close(fd);
    return rc;
}
