/* lt_worker_setup: what a worker sets up once, at lt_worker_new (lt_worker.c): the confinement of
 * its executors and their directories, and its two consumers. */
#ifndef LT_WORKER_SETUP_H
#define LT_WORKER_SETUP_H

#include <stddef.h>

#include "lt_bus.h"
#include "lt_confine.h"
#include "lt_job.h"
#include "lt_worker.h"

/* What executors may do (lt_confine.h) into *confine, and the parents of the attempts'
 * directories (work_parent, mem_parent: 512 bytes each), created 0711. Fails when mem_root is not
 * a memory file system, or without the store and master key. Logs what it cannot apply. */
lt_err_t lt_worker_confinement(const lt_worker_conf_t *conf, lt_confine_conf_t *confine, char *work_parent,
                               char *mem_parent, char *errstr, size_t n);

/* lathe.jobs, lathe.control and lathe.tenants assigned from the beginning, into *out. */
lt_err_t lt_worker_assign_control(const lt_bus_conf_t *bus, lt_bus_consumer_t **out, char *errstr, size_t n);

/* The dispatch group's consumer, subscribed to the class topics, into *out. */
lt_err_t lt_worker_join_dispatch(const lt_bus_conf_t *bus, const char *const topics[LT_CLASS__COUNT],
                                 lt_bus_rebalance_cb *rebalance_cb, void *opaque, lt_bus_consumer_t **out,
                                 char *errstr, size_t n);

#endif
