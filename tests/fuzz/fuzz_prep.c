/* Fuzz harness: hostile prep inputs. The first byte chooses how the rest
 * is read: its low 2 bits the documents (a whole text file, pieces between
 * "%" lines, JSON Lines under "text"), the next 2 the file's kind (text,
 * .gz, .zst: the bytes as they are, so inflate and zstd see hostile
 * streams), bit 4 a val fraction of 0.5 or 0, the top 3 bits the shard
 * size (2 to 9 tokens, so that the writer closes and joins shards all the
 * time). prep_run must refuse the input or write a set whose shards each
 * hold 2 to shard_tokens + 1 tokens (every one but the last exactly
 * shard_tokens), counts that add up to what it says, and load back. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/data/data.h"
#include "src/prep/prep.h"
#include "tests/fuzz/fuzz.h"

static char dir[512];

/* Removes what a prep left in dir (files of a folder, then the folder). */
static void clear(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (unlink(p) != 0) clear(p);
    }
    closedir(d);
    rmdir(path);
}

/* Checks the shards of one split; returns their token count. */
static uint64_t check_split(const char *out, const char *split, size_t nshards, size_t per) {
    uint64_t total = 0;
    for (size_t i = 0; i < nshards; i++) {
        char p[1024];
        Shard s;
        Err e;
        snprintf(p, sizeof p, "%s/%s_%06zu.bin", out, split, i);
        if (shard_load(&s, p, &e) != 0) {
            fprintf(stderr, "fuzz_prep: %s\n", e.msg);
            abort();
        }
        if (s.n_tokens < 2 || s.n_tokens > per + 1 || (i + 1 < nshards && s.n_tokens != per) ||
            !s.meta.has_crc)
            abort();
        total += s.n_tokens;
        shard_free(&s);
    }
    return total;
}

static void clear_dir(void) { clear(dir); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/modtrain-fuzz-prep-XXXXXX", t && *t ? t : P_tmpdir);
        if (!mkdtemp(dir)) abort();
        atexit(clear_dir);
    }
    const int docs = data[0] & 3, kind = (data[0] >> 2) & 3;
    char in[600], out[600];
    snprintf(in, sizeof in, "%s/in%s%s", dir, docs >= 2 ? ".jsonl" : ".txt",
             kind == 1   ? ".gz"
             : kind == 2 ? ".zst"
                         : "");
    snprintf(out, sizeof out, "%s/out", dir);
    FILE *f = fopen(in, "wb");
    if (!f || fwrite(data + 1, 1, size - 1, f) != size - 1 || fclose(f) != 0) abort();
    char *inputs[] = {in};
    PrepOptions o = {.out = out,
                     .inputs = inputs,
                     .ninputs = 1,
                     .doc_sep = docs == 1 ? "%" : NULL,
                     .jsonl_key = docs >= 2 ? "text" : NULL,
                     .val_fraction = data[0] & 16 ? 0.5 : 0,
                     .threads = 1,
                     .mem = PREP_MEM_MIN,
                     .held = 1 << 20, /* not libFuzzer's corpus and ASan's shadow */
                     .shard_tokens = 2 + (size_t)(data[0] >> 5)};
    PrepStats st;
    Err e;
    if (prep_run(&o, NULL, &st, &e) == 0) {
        if (check_split(out, "train", st.shards[0], o.shard_tokens) != st.tokens[0] ||
            check_split(out, "val", st.shards[1], o.shard_tokens) != st.tokens[1])
            abort();
    } else if (!e.msg[0] || strchr(e.msg, '\n')) {
        abort(); /* an error is one line */
    }
    clear(out);
    unlink(in);
    return 0;
}
