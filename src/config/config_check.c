/*
 * config_check: the relations between a config's keys (config_validate)
 * and the pipeline's split of the blocks (config_stage_layers), each a
 * one-line error naming the keys and what would do.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/util.h"
#include "src/config/config.h"

/* The experts' keys against each other and the layout's tp and ep. */
static int validate_moe(const Config *c, Err *err) {
    const int E = c->n_expert;
    if (E == 0 && (c->n_noop_expert > 0 || c->ep > 1))
        return err_set(err,
                       "config: %s = %d needs experts, and n_expert = 0 (set n_expert > 0, or "
                       "%s = %d)",
                       c->ep > 1 ? "ep" : "n_noop_expert", c->ep > 1 ? c->ep : c->n_noop_expert,
                       c->ep > 1 ? "ep" : "n_noop_expert", c->ep > 1 ? 1 : 0);
    if (E == 0) return 0;
    if (c->expert_top_k > E)
        return err_set(err,
                       "config: expert_top_k = %d is more than the n_expert = %d experts a token "
                       "can choose (choose expert_top_k <= %d)",
                       c->expert_top_k, E, E);
    if (!(c->capacity_factor > 0) || !isfinite(c->capacity_factor))
        return err_set(err, "config: capacity_factor = %g is not a positive number", c->capacity_factor);
    if (c->moe_every > c->n_layer)
        return err_set(err,
                       "config: moe_every = %d makes no block of n_layer = %d an MoE block "
                       "(choose moe_every in [1, %d])",
                       c->moe_every, c->n_layer, c->n_layer);
    if (E % c->ep != 0)
        return err_set(err,
                       "config: n_expert = %d experts do not split over ep = %d ranks (choose ep "
                       "dividing n_expert)",
                       E, c->ep);
    const int ff = c->expert_d_ff ? c->expert_d_ff : config_d_ff(c);
    if (ff % c->tp != 0)
        return err_set(err,
                       "config: the experts' width %d (expert_d_ff) is not divisible by tp = %d "
                       "(choose expert_d_ff a multiple of tp)",
                       ff, c->tp);
    return 0;
}

/* "a, b, c": the divisors of n (at most 4096). */
static void divisors(char *buf, size_t cap, int n) {
    buf[0] = '\0';
    for (int t = 1; t <= n; t++)
        if (n % t == 0)
            snprintf(buf + strlen(buf), cap - strlen(buf), "%s%d", buf[0] ? ", " : "", t);
}

/* The block's keys against the shape and tp. */
static int validate_arch(const Config *c, Err *err) {
    char alts[256];
    const int KV = config_kv_heads(c), F = config_d_ff(c);
    if (c->arch == ARCH_GPT2 && KV != c->n_head)
        return err_set(err,
                       "config: n_kv_head = %d needs arch = llama (GPT-2's attention has n_head "
                       "key and value heads: set arch = llama, or n_kv_head = 0)",
                       c->n_kv_head);
    if (c->n_head % KV != 0) {
        divisors(alts, sizeof alts, c->n_head);
        return err_set(
            err, "config: n_kv_head = %d does not divide n_head = %d (choose n_kv_head in {%s})",
            KV, c->n_head, alts);
    }
    if (KV % c->tp != 0) {
        divisors(alts, sizeof alts, KV);
        return err_set(
            err,
            "config: n_kv_head = %d key and value heads do not split over tp = %d (kv "
            "heads are not replicated: choose tp in {%s}, or n_kv_head a multiple of %d)",
            KV, c->tp, alts, c->tp);
    }
    if (c->arch == ARCH_LLAMA && (c->d_model / c->n_head) % 2 != 0)
        return err_set(err,
                       "config: the head size d_model / n_head = %d is odd, and rotary positions "
                       "turn pairs of channels (choose an even head size)",
                       c->d_model / c->n_head);
    if (F % c->tp != 0)
        return err_set(err,
                       "config: the MLP width %d (d_ff) is not divisible by tp = %d (choose d_ff a "
                       "multiple of tp)",
                       F, c->tp);
    return 0;
}

int config_validate(const Config *c, Err *err) {
    if (c->d_model % c->n_head != 0) {
        return err_set(
            err,
            "config: d_model = %d is not divisible by n_head = %d (choose d_model a multiple "
            "of n_head, e.g. %d)",
            c->d_model, c->n_head, (c->d_model / c->n_head + 1) * c->n_head);
    }
    if (c->min_lr > c->lr) {
        return err_set(err, "config: min_lr = %g is above lr = %g (expected min_lr <= lr)",
                       c->min_lr, c->lr);
    }
    if (c->micro_batch > 0 && c->batch_size % c->micro_batch != 0) {
        return err_set(
            err,
            "config: batch_size = %d is not divisible by micro_batch = %d (choose a divisor of "
            "batch_size)",
            c->batch_size, c->micro_batch);
    }
    if (c->route_every > c->n_layer) {
        return err_set(
            err,
            "config: route_every = %d routes no block of n_layer = %d (choose route_every in "
            "[1, %d], or 0 for the dense model)",
            c->route_every, c->n_layer, c->n_layer);
    }
    if (validate_moe(c, err) != 0) return -1;
    if (c->virtual_stages > 1 && (c->pp < 2 || c->schedule != SCHED_1F1B))
        return err_set(err,
                       "config: virtual_stages = %d interleaves a 1F1B pipeline, not %s (set "
                       "pp >= 2 and schedule 1f1b, or virtual_stages 1)",
                       c->virtual_stages, c->pp < 2 ? "pp = 1" : "schedule gpipe");
    int *layers = xcalloc((size_t)c->pp * c->virtual_stages, sizeof(int));
    int split = config_stage_layers(c, layers, err);
    free(layers);
    if (split != 0) return -1;
    if (c->n_head % c->tp != 0) {
        char alts[256];
        divisors(alts, sizeof alts, c->n_head);
        return err_set(err, "config: n_head = %d is not divisible by tp = %d (choose tp in {%s})",
                       c->n_head, c->tp, alts);
    }
    if (validate_arch(c, err) != 0) return -1;
    if (c->train_only == TRAIN_ROUTERS && c->route_every == 0 && c->n_expert == 0)
        return err_set(err,
                       "config: train_only = routers trains the routers, and this model has none "
                       "(set route_every > 0 for Mixture-of-Depths routers, or train_only = all)");
    if (c->train_only == TRAIN_ROUTERS && c->zero)
        return err_set(err,
                       "config: zero = 1 shards AdamW's moments over dp, and train_only = routers "
                       "keeps moments for the routers alone (a few KB): set zero = 0");
    const char *h = c->tokenizer_hash;
    if (h[0] && (strlen(h) != CONFIG_HASH_HEX || strspn(h, "0123456789abcdef") != CONFIG_HASH_HEX))
        return err_set(err,
                       "config: tokenizer_hash = '%.32s' is not a vocabulary hash (expected %d "
                       "lowercase hex digits, as 'modtrain tokenize --vocab DIR --hash' prints, "
                       "or empty)",
                       h, CONFIG_HASH_HEX);
    if (c->vocab_size > 0 && c->vocab_size < 2) {
        return err_set(err,
                       "config: vocab_size = %d is too small (expected >= 2, or 0 for the data's)",
                       c->vocab_size);
    }
    return 0;
}

int config_stage_layers(const Config *c, int *layers, Err *err) {
    const int nv = c->pp * c->virtual_stages;
    const char *what = c->virtual_stages > 1 ? "pp x virtual_stages" : "pp";
    if (nv > c->n_layer) {
        if (c->virtual_stages > 1)
            return err_set(err,
                           "config: pp = %d x virtual_stages = %d = %d virtual stages cannot "
                           "split n_layer = %d blocks (choose pp x virtual_stages <= %d)",
                           c->pp, c->virtual_stages, nv, c->n_layer, c->n_layer);
        return err_set(err,
                       "config: pp = %d stages cannot split n_layer = %d blocks (choose pp <= %d)",
                       c->pp, c->n_layer, c->n_layer);
    }
    if (!c->stage_layers[0]) {
        for (int s = 0; s < nv; s++) layers[s] = c->n_layer / nv + (s < c->n_layer % nv);
        return 0;
    }
    char eg[256];
    int k = snprintf(eg, sizeof eg, "%d", c->n_layer - (nv - 1));
    for (int i = 1; i < nv && k < (int)sizeof eg - 4; i++)
        k += snprintf(eg + k, sizeof eg - k, ",1");
    /* The shape first, by hand: strtok_r skips empty items (a leading comma passed as a split)
     * and strtoll takes a sign, so every item must be digits alone, between single commas. */
    const char *s = c->stage_layers;
    for (const char *p = s;; p++) {
        size_t d = strspn(p, "0123456789");
        p += d;
        if (d == 0 || (*p != ',' && *p != '\0') || (*p == ',' && p[1] == '\0'))
            return err_set(err,
                           "config: stage_layers = '%s' is not a list of block counts (expected "
                           "whole numbers >= 1 separated by single commas, no spaces or signs, "
                           "%d of them summing to n_layer = %d, e.g. '%s')",
                           s, nv, c->n_layer, eg);
        if (*p == '\0') break;
    }
    /* each count parsed strictly: a huge one cannot wrap into a plausible one */
    int n = 0;
    long long sum = 0;
    char buf[CONFIG_STR];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long long v;
        if (n == nv || parse_i64(tok, 1, c->n_layer, &v) != 0) {
            n = -1;
            break;
        }
        layers[n++] = (int)v;
        sum += v;
    }
    if (n != nv || sum != c->n_layer) {
        return err_set(
            err,
            "config: stage_layers = '%s' does not split n_layer = %d over %s = %d %s "
            "(give %d counts >= 1 that sum to %d, e.g. '%s')",
            c->stage_layers, c->n_layer, what, nv,
            c->virtual_stages > 1 ? "virtual stages, rank s's chunk k at k x pp + s" : "stages",
            nv, c->n_layer, eg);
    }
    return 0;
}
