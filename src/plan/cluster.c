/*
 * cluster: the description of a cluster `modtrain plan` plans for, as a
 * strict `key = value` file (see cluster.h).
 */
#include "src/plan/cluster.h"
#include "src/base/files.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const char *name;
    size_t offset;
    int is_int;
    double min, max;
    const char *help;
} ClusterKey;

#define CK(f) offsetof(Cluster, f)
static const ClusterKey ckeys[] = {
    {"nodes", CK(nodes), 1, 1, 1 << 20, "nodes"},
    {"cores_per_node", CK(cores_per_node), 1, 1, 1 << 16, "cores a node gives the job"},
    {"mem_per_node_gib", CK(mem_per_node_gib), 0, 0.001, 1 << 30, "GiB of memory a node gives"},
    {"gflops_per_core", CK(gflops_per_core), 0, 0.001, 1e9, "sgemm GFLOP/s of one core"},
    {"efficiency", CK(efficiency), 0, 0.001, 1, "share of the sgemm rate a step reaches (MFU)"},
    {"mem_bw_gbs", CK(mem_bw_gbs), 0, 0.001, 1e9, "GB/s of a node's memory"},
    {"shm_bw_gbs", CK(shm_bw_gbs), 0, 0.001, 1e9, "GB/s between ranks of a node (MPI)"},
    {"shm_latency_us", CK(shm_latency_us), 0, 0, 1e9, "microseconds per message on a node"},
    {"net_bw_gbs", CK(net_bw_gbs), 0, 0.001, 1e9, "GB/s between nodes (MPI)"},
    {"net_latency_us", CK(net_latency_us), 0, 0, 1e9, "microseconds per message between nodes"},
    {"shm_cpu_share", CK(shm_cpu_share), 0, 0, 1,
     "share of an all-reduce on a node that keeps its ranks' cores busy"},
    {"net_cpu_share", CK(net_cpu_share), 0, 0, 1,
     "share of an all-reduce between nodes that keeps its ranks' cores busy (0: the NIC moves it)"},
    {"fs_bw_gbs", CK(fs_bw_gbs), 0, 0.001, 1e9, "GB/s the checkpoint file system writes"},
    {"pack_mbs", CK(pack_mbs), 0, 0.001, 1e9, "MB/s of state a rank packs a checkpoint at"},
    {"baseline_mib", CK(baseline_mib), 0, 0, 1 << 30, "MiB a rank holds before the model"},
};
#define NCKEYS (sizeof ckeys / sizeof ckeys[0])

void cluster_defaults(Cluster *c) {
    /* this project's 2-core machine, roughly: calibrate for a real one */
    *c = (Cluster){.nodes = 1,
                   .cores_per_node = 2,
                   .mem_per_node_gib = 24,
                   .gflops_per_core = 100,
                   .efficiency = 0.4,
                   .mem_bw_gbs = 10,
                   .shm_bw_gbs = 5,
                   .shm_latency_us = 1,
                   .net_bw_gbs = 12.5,
                   .net_latency_us = 2,
                   .shm_cpu_share = 1,
                   .net_cpu_share = 0,
                   .fs_bw_gbs = 1,
                   .pack_mbs = 700,
                   .baseline_mib = 60};
}

static int cluster_set(Cluster *c, const char *key, const char *value, const char *where,
                       Err *err) {
    for (size_t i = 0; i < NCKEYS; i++) {
        const ClusterKey *k = &ckeys[i];
        if (strcmp(k->name, key) != 0) continue;
        double v;
        long long iv = 0;
        const int bad = k->is_int ? parse_i64(value, (long long)k->min, (long long)k->max, &iv)
                                  : parse_f64(value, &v) != 0 || v < k->min || v > k->max;
        if (bad)
            return err_set(err, "%s: %s = '%.40s' is not %s in [%g, %g] (%s)", where, key, value,
                           k->is_int ? "an integer" : "a number", k->min, k->max, k->help);
        if (k->is_int) *(int *)((char *)c + k->offset) = (int)iv;
        else *(double *)((char *)c + k->offset) = v;
        return 0;
    }
    char names[512] = "";
    for (size_t i = 0; i < NCKEYS; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 ckeys[i].name);
    return err_set(err, "%s: unknown key '%.40s' (expected one of %s)", where, key, names);
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

int cluster_load_text(Cluster *c, char *text, size_t len, const char *name, Err *err) {
    if (memchr(text, '\0', len))
        return err_set(err, "plan: '%s' holds a NUL byte (not a cluster file)", name);
    char *l = text;
    for (int line = 1; l < text + len; line++) {
        char *nl = memchr(l, '\n', (size_t)(text + len - l)), *next = nl ? nl + 1 : text + len;
        if (nl) *nl = '\0';
        char *hash = strchr(l, '#');
        if (hash) *hash = '\0';
        char *s = trim(l), *eq = strchr(s, '='), where[600];
        snprintf(where, sizeof where, "%s:%d", name, line);
        if (*s && !eq) return err_set(err, "%s: expected 'key = value'", where);
        if (*s) {
            *eq = '\0';
            if (cluster_set(c, trim(s), trim(eq + 1), where, err) != 0) return -1;
        }
        l = next;
    }
    return 0;
}

int cluster_load(Cluster *c, const char *path, Err *err) {
    size_t len = 0;
    Err e;
    char *text = read_file(path, 1 << 20, &len, &e);
    if (!text)
        return err_set(err,
                       "plan: %s (a cluster file of at most 1 MiB; modtrain plan --calibrate "
                       "writes one)",
                       e.msg);
    const int rc = cluster_load_text(c, text, len, path, err);
    free(text);
    return rc;
}

int cluster_describe(const Cluster *c, int i, char *line, size_t n) {
    if (i < 0 || (size_t)i >= NCKEYS) return 0;
    const ClusterKey *k = &ckeys[i];
    const char *f = (const char *)c + k->offset;
    if (k->is_int) snprintf(line, n, "%-16s = %d  # %s", k->name, *(const int *)f, k->help);
    else snprintf(line, n, "%-16s = %.6g  # %s", k->name, *(const double *)f, k->help);
    return 1;
}

int cluster_write(const Cluster *c, const char *path, Err *err) {
    char buf[4096], line[256];
    size_t n = (size_t)snprintf(buf, sizeof buf,
                                "# modtrain plan --cluster: measured or stated; one key a line\n");
    for (int i = 0; cluster_describe(c, i, line, sizeof line) && n < sizeof buf; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s\n", line);
    return write_file_atomic(path, buf, n < sizeof buf ? n : sizeof buf - 1, err);
}
