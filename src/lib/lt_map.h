/* lt_map: a string-keyed hash map for the control plane's in-memory indexes (the API's SSE
 * history, the datasets and cancels it has seen, the /metrics accumulators).
 *
 * Keys are copied and owned by the map. Values are void * and belong to the caller unless the
 * map was made with a free function, which then runs on a replaced, deleted or freed value; a map
 * used as a set stores NULL and asks lt_map_has. Iteration runs in insertion order (a replaced
 * value keeps its place; a deleted and re-inserted key moves to the end), so what is printed
 * from a map does not depend on hashing. Open addressing over an index of positions into a
 * dense entry array.
 *
 * Thread safety: one thread at a time. */
#ifndef LT_MAP_H
#define LT_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

typedef struct lt_map lt_map_t;

/* Frees one value; called with the value only, never with NULL. */
typedef void lt_map_free_fn(void *value);

/* A new empty map, or NULL when out of memory. free_value may be NULL (values are not owned). */
lt_map_t *lt_map_new(lt_map_free_fn *free_value);

/* Frees the keys, the owned values and the map. m may be NULL. */
void lt_map_destroy(lt_map_t *m);

/* Number of keys. */
size_t lt_map_count(const lt_map_t *m);

/* True when key is in the map (whatever its value, NULL included). */
bool lt_map_has(const lt_map_t *m, const char *key);

/* The value of key, or NULL when absent (or when NULL was stored). */
void *lt_map_get(const lt_map_t *m, const char *key);

/* Sets key to value. An existing key keeps its place in the iteration order and its old value is
 * freed (when the map owns values). LT_ERR_NOMEM leaves the map unchanged; the value is then
 * still the caller's. */
lt_err_t lt_map_set(lt_map_t *m, const char *key, void *value);

/* Removes key, freeing its value when owned. False when it was absent. */
bool lt_map_del(lt_map_t *m, const char *key);

/* Insertion-order iteration:
 *   lt_map_iter_t it = {0};
 *   while (lt_map_next(m, &it)) use(it.key, it.value);
 * Deleting the current key during the loop is allowed; setting a new key is not. */
typedef struct lt_map_iter {
  size_t pos;        /* private: next entry to look at */
  const char *key;   /* OUT: borrowed from the map */
  void *value;       /* OUT */
} lt_map_iter_t;
bool lt_map_next(const lt_map_t *m, lt_map_iter_t *it);

/* The hash the map uses (64-bit FNV-1a): for tests that need keys that collide. */
uint64_t lt_map_hash(const char *key);

#endif
