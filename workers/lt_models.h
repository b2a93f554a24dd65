/* lt_models: the base models a models directory holds, by name. A model is a directory with the
 * files a role needs (model.safetensors to train; tokenizer.json and config.json to serve): either
 * DIR/NAME (a bundle, NAME an id) or DIR/ORG/NAME (a Hugging Face id, "ORG/NAME"), so that a job
 * names a Hub model as the Hub does (lt_model_id_valid). */
#ifndef LT_MODELS_H
#define LT_MODELS_H

#include <stddef.h>

#include "lt_job.h"

/* Up to max model names under dir that have every file of `need` (a NULL-terminated list), sorted;
 * returns how many there are (may exceed max: only max are written). 0 when dir cannot be read. */
size_t lt_models_list(const char *dir, const char *const *need, char (*names)[LT_JOB_NAME_MAX], size_t max);

#endif
