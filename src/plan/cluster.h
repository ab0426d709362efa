/*
 * cluster: what `modtrain plan` knows of a cluster, stated in a file or
 * measured by `modtrain plan --calibrate`: nodes, cores, memory, the sgemm
 * rate, memory and MPI bandwidths and latencies, the file system, and the
 * memory a rank holds before the model.
 */
#ifndef MODTRAIN_CLUSTER_H
#define MODTRAIN_CLUSTER_H

#include <stddef.h>

#include "src/base/util.h"

/* A cluster: stated, or measured by `modtrain plan --calibrate`. */
typedef struct {
    int nodes, cores_per_node;
    double mem_per_node_gib;
    double gflops_per_core;            /* sgemm on one core */
    double efficiency;                 /* share of that a training step reaches */
    double mem_bw_gbs;                 /* one node's memory bandwidth */
    double shm_bw_gbs, shm_latency_us; /* MPI between ranks of a node */
    double net_bw_gbs, net_latency_us; /* MPI between nodes */
    /* the share of an all-reduce's time its own rank's core is busy moving
     * the bytes (copies, the transport): what overlapping it with compute
     * on that core cannot hide */
    double shm_cpu_share, net_cpu_share;
    double fs_bw_gbs;                  /* the checkpoint file system */
    double pack_mbs;                   /* checkpoint packing, MB/s of state per rank */
    double baseline_mib;               /* a rank's RSS before the model: MPI, BLIS, runtime */
} Cluster;

void cluster_defaults(Cluster *c);
/* Reads `key = value` lines (# comments) over the defaults; every value is
 * a strict number in range. Returns 0, or -1 with err naming the line. */
int cluster_load(Cluster *c, const char *path, Err *err);
/* The same for the text of a file: len bytes and a NUL after them,
 * changed in place; name for the errors. */
int cluster_load_text(Cluster *c, char *text, size_t len, const char *name, Err *err);
/* Writes c as a cluster file. Returns 0 or -1 with err set. */
int cluster_write(const Cluster *c, const char *path, Err *err);
/* Line i of a cluster file for c ("key = value  # what it is"), as
 * cluster_write writes it: 1, or 0 past the last key. */
int cluster_describe(const Cluster *c, int i, char *line, size_t n);

#endif
