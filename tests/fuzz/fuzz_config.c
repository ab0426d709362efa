/* Fuzz harness: a config file's text (config_load_text), then the checks
 * run on the config it gives (config_validate). */
#include <stdlib.h>
#include <string.h>

#include "src/config/config.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    Config c;
    Err err;
    config_defaults(&c);
    if (config_load_text(&c, text, size, "fuzz.conf", &err) == 0 &&
        config_validate(&c, &err) == 0) {
        int layers[64];
        if (c.pp <= 64) config_stage_layers(&c, layers, &err);
    }
    free(text);
    return 0;
}
