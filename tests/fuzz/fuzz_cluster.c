/* Fuzz harness: a cluster file's text (cluster_load_text), then the values
 * it accepted checked against the bounds the planner divides by. */
#include <stdlib.h>
#include <string.h>

#include "src/plan/cluster.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    Cluster c;
    Err err;
    cluster_defaults(&c);
    if (cluster_load_text(&c, text, size, "fuzz.cluster", &err) == 0 &&
        (c.nodes < 1 || c.cores_per_node < 1 || !(c.gflops_per_core > 0) ||
         !(c.efficiency > 0 && c.efficiency <= 1) || !(c.mem_bw_gbs > 0) || !(c.shm_bw_gbs > 0) ||
         !(c.net_bw_gbs > 0) || !(c.fs_bw_gbs > 0) || !(c.pack_mbs > 0)))
        abort(); /* accepted a value the planner would divide by */
    free(text);
    return 0;
}
