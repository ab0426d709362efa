/*
 * infer: a checkpoint opened for `modtrain eval` (eval.c) and `modtrain
 * sample` (sample.c), over all ranks as pp pipeline stages of tp = world /
 * pp ranks: the grid, this rank's part of the model, its tokenizer, and
 * logits written to a file.
 */
#include "src/cmd/infer.h"

#include <stdio.h>
#include <string.h>

#include "checkpoint/ckpt.h"
#include "mpi/check.h"
#include "mpi/tp.h"
#include "src/base/files.h"
#include "src/kernels/kernels.h"

/* Builds the grid for `pp` stages (stdout on rank 0 alone), sets threads
 * and loads this rank's part of the checkpoint for micro-batches of maxB.
 * Returns 0, or -1 after printing why (nothing to free). */
int infer_open(Infer *in, const char *cmd, const char *ckpt, int pp, int threads, int maxB) {
    int world = 1, rank = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (pp < 1 || world % pp != 0) {
        char alts[256] = "";
        for (int k = 1; k <= world && k <= 4096; k++)
            if (world % k == 0)
                snprintf(alts + strlen(alts), sizeof alts - strlen(alts), "%s%d",
                         alts[0] ? ", " : "", k);
        if (rank == 0)
            errorf("%s: --pp %d does not divide the %d ranks (run a multiple of %d ranks, or "
                   "choose --pp in {%s})",
                   cmd, pp, world, pp > 0 ? pp : 1, alts);
        return -1;
    }
    Err err;
    if (grid_init(&in->grid, world / pp, pp, NULL, &err) != 0) {
        if (rank == 0) err_print(&err);
        return -1;
    }
    Grid *g = &in->grid;
    const int nt = threads ? threads : default_threads(g->local_ranks);
    kernels_init(nt, "auto");
    warn_oversubscribed(nt, MPI_COMM_WORLD);
    TpGroup tpg = {g->tp_comm, g->tp, g->tp_rank};
    config_defaults(&in->cfg);
    const int rc = ckpt_open_model(ckpt, &in->m, &in->cfg, maxB, &in->step, &tpg, g->pp,
                                   g->pp_rank, g->local_ranks, &err);
    /* every rank opens the same checkpoint: the lowest that failed says why */
    if (cmd_agree(rc, &err, MPI_COMM_WORLD) != 0) {
        if (rc == 0) model_free(&in->m);
        grid_free(g);
        return -1;
    }
    in->m.pp_comm = g->pp > 1 ? g->pp_comm : MPI_COMM_NULL;
    return 0;
}

void infer_close(Infer *in) {
    model_free(&in->m);
    grid_free(&in->grid);
}

/* The tokenizer the checkpoint records: *bpe stays NULL for bytes, or is
 * GPT-2's from --vocab, checked against the recorded hash. *vdraw is the
 * number of ids that have text (a padded vocabulary has more rows). Returns
 * 0, or -1 with err set. */
int infer_tokenizer(const Infer *in, const char *cmd, const char *vocab, Bpe **bpe, int *vdraw,
                    Err *err) {
    const Config *c = &in->cfg;
    const int V = in->m.d.V;
    *bpe = NULL;
    *vdraw = V;
    if (c->tokenizer == TOK_BYTE) {
        if (vocab)
            return err_set(err,
                           "%s: the model was trained on byte tokens; --vocab is for models "
                           "trained on gpt2 tokens (leave it out)",
                           cmd);
        if (V != 256)
            return err_set(err,
                           "%s: the model has vocab_size = %d; text with the byte tokenizer "
                           "needs vocab_size = 256",
                           cmd, V);
        return 0;
    }
    if (!config_tokenizer_is_bpe(c->tokenizer))
        return err_set(err,
                       "%s: the checkpoint records no tokenizer for its %d-token vocabulary "
                       "(tokenizer = none); train with a tokenizer for text",
                       cmd, V);
    const char *enc = config_tokenizer_encoding(c->tokenizer);
    if (!vocab) {
        if (c->tokenizer == TOK_HF)
            return err_set(err,
                           "%s: the model was trained on a tokenizer.json's tokens; pass --vocab "
                           "with that tokenizer.json",
                           cmd);
        if (enc)
            return err_set(err,
                           "%s: the model was trained on %s tokens; pass --vocab %s.tiktoken "
                           "(jobs/get_tokenizers.sh DIR places it)",
                           cmd, enc, enc);
        return err_set(err,
                       "%s: the model was trained on gpt2 tokens; pass --vocab DIR with its "
                       "encoder.json and vocab.bpe (jobs/get_gpt2_vocab.sh DIR places GPT-2's)",
                       cmd);
    }
    if (!(*bpe = bpe_open(vocab, enc, err))) return -1;
    char hex[CONFIG_HASH_HEX + 1];
    format_vocab_hash(bpe_hash(*bpe), hex);
    const char *why = NULL;
    if (c->tokenizer_hash[0] && strcmp(hex, c->tokenizer_hash) != 0)
        why = "its vocabulary hash differs from the one the model was trained with";
    else if (bpe_vocab_size(*bpe) > V || bpe_eot(*bpe) < 0)
        why = bpe_eot(*bpe) < 0 ? "it has no <|endoftext|>" : "it has more tokens than the model";
    if (why) {
        err_set(err,
                "%s: '%s' is not this model's vocabulary: %s (%s, %d tokens; the model: %s, %d)",
                cmd, vocab, why, hex, bpe_vocab_size(*bpe),
                c->tokenizer_hash[0] ? c->tokenizer_hash : "no hash", V);
        bpe_free(*bpe);
        *bpe = NULL;
        return -1;
    }
    *vdraw = bpe_vocab_size(*bpe);
    return 0;
}

/* Every rank parses the same arguments: rank 0 alone prints (help, errors). */
void quiet_above_rank0(int on) {
    static int lost; /* stdout could not be pointed at /dev/null: stay quiet */
    if (util_rank == 0) return;
    if (on && !freopen("/dev/null", "w", stdout)) lost = 1;
    util_quiet = on || lost;
}

/* Writes V logits, one a line, gathered over tp from this rank's Vl (rank 0
 * of the tp group writes). Returns 0, or -1 with err set. */
int write_logits(const char *path, const Model *m, const float *logits, Err *err) {
    float *all = xmalloc((size_t)m->d.Vp * sizeof(float));
    tp_allgather(all, logits, (size_t)m->d.Vl, &m->tp);
    int rc = 0;
    FILE *f = m->tp.rank == 0 ? open_output(path, 0, err) : NULL;
    if (m->tp.rank == 0 && !f) rc = -1;
    for (int v = 0; f && v < m->d.V; v++) fprintf(f, "%.9g\n", all[v]);
    if (f && close_output(f, path, err) != 0) rc = -1;
    free(all);
    return rc;
}
