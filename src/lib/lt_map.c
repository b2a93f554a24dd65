/* lt_map: see lt_map.h. Entries live in a dense array in insertion order; a power-of-two index
 * of positions (1-based, 0 = empty slot) is probed linearly. A deleted entry keeps its index
 * slot (its key is NULL) so probe chains through it stay intact until the next rebuild, which
 * drops deleted entries and re-indexes, doubling the index when the live keys need it. */
#include "lt_map.h"

#include <stdlib.h>
#include <string.h>

#define MAP_MIN_SLOTS 8u

typedef struct map_entry {
  char *key; /* NULL: deleted */
  void *value;
  uint64_t hash;
} map_entry_t;

struct lt_map {
  map_entry_t *entries; /* insertion order, deleted ones included */
  size_t nentries;      /* used entries, deleted ones included: at most 3/4 of nslots */
  size_t count;         /* live keys */
  uint32_t *slots;      /* 1-based entry positions; 0 = empty */
  size_t nslots;        /* power of two */
  lt_map_free_fn *free_value;
};

uint64_t lt_map_hash(const char *key) {
  uint64_t h = 14695981039346656037ull;
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 1099511628211ull;
  return h;
}

static size_t max_entries(size_t nslots) { return nslots / 4 * 3; }

/* Allocates nslots slots and room for max_entries(nslots) entries, moving the live entries over
 * in order. The old arrays are freed only on success. */
static lt_err_t rebuild(lt_map_t *m, size_t nslots) {
  uint32_t *slots = calloc(nslots, sizeof *slots);
  map_entry_t *entries = malloc(max_entries(nslots) * sizeof *entries);
  if (!slots || !entries) {
    free(slots);
    free(entries);
    return LT_ERR_NOMEM;
  }
  size_t n = 0;
  for (size_t i = 0; i < m->nentries; i++) {
    if (!m->entries[i].key) continue;
    entries[n] = m->entries[i];
    size_t s = (size_t)entries[n].hash & (nslots - 1);
    while (slots[s]) s = (s + 1) & (nslots - 1);
    slots[s] = (uint32_t)(n + 1);
    n++;
  }
  free(m->slots);
  free(m->entries);
  m->slots = slots;
  m->entries = entries;
  m->nslots = nslots;
  m->nentries = n;
  return LT_OK;
}

lt_map_t *lt_map_new(lt_map_free_fn *free_value) {
  lt_map_t *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->free_value = free_value;
  if (rebuild(m, MAP_MIN_SLOTS)) {
    free(m);
    return NULL;
  }
  return m;
}

void lt_map_destroy(lt_map_t *m) {
  if (!m) return;
  for (size_t i = 0; i < m->nentries; i++) {
    if (!m->entries[i].key) continue;
    free(m->entries[i].key);
    if (m->free_value && m->entries[i].value) m->free_value(m->entries[i].value);
  }
  free(m->entries);
  free(m->slots);
  free(m);
}

size_t lt_map_count(const lt_map_t *m) { return m->count; }

/* The live entry of key, or NULL. */
static map_entry_t *find(const lt_map_t *m, const char *key, uint64_t h) {
  for (size_t s = (size_t)h & (m->nslots - 1); m->slots[s]; s = (s + 1) & (m->nslots - 1)) {
    map_entry_t *e = &m->entries[m->slots[s] - 1];
    if (e->key && e->hash == h && strcmp(e->key, key) == 0) return e;
  }
  return NULL;
}

bool lt_map_has(const lt_map_t *m, const char *key) { return find(m, key, lt_map_hash(key)) != NULL; }

void *lt_map_get(const lt_map_t *m, const char *key) {
  map_entry_t *e = find(m, key, lt_map_hash(key));
  return e ? e->value : NULL;
}

lt_err_t lt_map_set(lt_map_t *m, const char *key, void *value) {
  uint64_t h = lt_map_hash(key);
  map_entry_t *e = find(m, key, h);
  if (e) {
    if (m->free_value && e->value && e->value != value) m->free_value(e->value);
    e->value = value;
    return LT_OK;
  }
  if (m->nentries == max_entries(m->nslots)) {
    /* Full of entries: drop the deleted ones, and double when live keys fill half the index. */
    size_t nslots = m->nslots;
    while ((m->count + 1) * 2 > nslots) nslots *= 2;
    if (rebuild(m, nslots)) return LT_ERR_NOMEM;
  }
  char *k = strdup(key);
  if (!k) return LT_ERR_NOMEM;
  size_t s = (size_t)h & (m->nslots - 1);
  while (m->slots[s]) s = (s + 1) & (m->nslots - 1);
  m->entries[m->nentries] = (map_entry_t){.key = k, .value = value, .hash = h};
  m->slots[s] = (uint32_t)(++m->nentries);
  m->count++;
  return LT_OK;
}

bool lt_map_del(lt_map_t *m, const char *key) {
  map_entry_t *e = find(m, key, lt_map_hash(key));
  if (!e) return false;
  free(e->key);
  e->key = NULL;
  if (m->free_value && e->value) m->free_value(e->value);
  e->value = NULL;
  m->count--;
  return true;
}

bool lt_map_next(const lt_map_t *m, lt_map_iter_t *it) {
  while (it->pos < m->nentries) {
    const map_entry_t *e = &m->entries[it->pos++];
    if (!e->key) continue;
    it->key = e->key;
    it->value = e->value;
    return true;
  }
  return false;
}
