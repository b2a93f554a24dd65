/* lt_models: listing a models directory (lt_models.h). */
#include "lt_models.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lt_jobspec.h"

static bool has_all(const char *dir, const char *const *need) {
  char probe[5000];
  for (const char *const *f = need; *f; f++) {
    snprintf(probe, sizeof probe, "%s/%s", dir, *f);
    if (access(probe, R_OK) != 0) return false;
  }
  return true;
}

static int by_name(const void *a, const void *b) { return strcmp(a, b); }

/* Copies name into out (LT_JOB_NAME_MAX bytes) when it fits; false otherwise. */
static bool put_name(char *out, const char *name) {
  size_t len = strlen(name);
  if (len >= LT_JOB_NAME_MAX) return false;
  memcpy(out, name, len + 1);
  return true;
}

size_t lt_models_list(const char *dir, const char *const *need, char (*names)[LT_JOB_NAME_MAX], size_t max) {
  struct dirent **top = NULL;
  int n = scandir(dir, &top, NULL, alphasort);
  size_t count = 0;
  for (int i = 0; i < n; i++) {
    const char *org = top[i]->d_name;
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, org);
    if (lt_id_valid(org) && has_all(path, need)) {
      if (count >= max || put_name(names[count], org)) count++;
    } else if (lt_id_valid(org)) { /* ORG/NAME: one level down, never further */
      struct dirent **sub = NULL;
      int m = scandir(path, &sub, NULL, alphasort);
      for (int k = 0; k < m; k++) {
        char id[600], sp[4800];
        snprintf(id, sizeof id, "%s/%s", org, sub[k]->d_name);
        snprintf(sp, sizeof sp, "%s/%s", path, sub[k]->d_name);
        if (lt_model_id_valid(id) && has_all(sp, need) && (count >= max || put_name(names[count], id))) count++;
        free(sub[k]);
      }
      free(sub);
    }
    free(top[i]);
  }
  free(top);
  if (count && names) qsort(names, count < max ? count : max, sizeof *names, by_name);
  return count;
}
