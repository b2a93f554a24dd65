/* lt_scrub: nothing of a tenant stays on a worker's disk after an attempt.
 *
 * An attempt's private directory holds plaintext in flight (the executor's upload spool, state
 * files, samples) in files and subdirectories. lt_scrub_tree() overwrites every regular file with
 * zeros, syncs it, removes it, and removes the directories, depth first, and says how many bytes
 * it zeroed (the CleanupDone record's host_bytes_zeroed).
 *
 * The tree was written by an executor, which is treated as hostile: links are never followed (a
 * symbolic link is removed, not its target), a file with other hard links is removed but not
 * overwritten (its bytes belong to another name, perhaps outside the tree), and nesting deeper
 * than LT_SCRUB_MAX_DEPTH is removed as far as it can be without recursing further.
 *
 * Threads: no state; any thread. */
#ifndef LT_SCRUB_H
#define LT_SCRUB_H

#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

#define LT_SCRUB_MAX_DEPTH 64

/* Scrubs and removes the tree at path (a directory; a missing path is LT_OK with 0 bytes).
 * *zeroed (may be NULL) receives the bytes overwritten. Goes on past a failure and returns the
 * first one (LT_ERR_IO naming the path), so as much as possible is gone either way. */
lt_err_t lt_scrub_tree(const char *path, int64_t *zeroed, char *errstr, size_t errstr_size);

#endif
