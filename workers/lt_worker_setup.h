/* lt_worker_setup: what a worker sets up once, at lt_worker_new (lt_worker.c): the backend its
 * executors train on and its slots, its configuration's defaults, the confinement of its
 * executors and their directories, and its two consumers. */
#ifndef LT_WORKER_SETUP_H
#define LT_WORKER_SETUP_H

#include <stddef.h>

#include "lt_backend_cuda.h"
#include "lt_bus.h"
#include "lt_confine.h"
#include "lt_job.h"
#include "lt_worker.h"

/* What a worker's executors train on: the cpu backend, or one GPU each (slot i on GPU i). */
#define LT_WORKER_MAX_GPUS 16
typedef struct lt_worker_devices {
  char backend[8];                          /* "cpu" or "cuda" */
  int ngpus;                                /* 0 on a cpu worker */
  lt_cuda_device_t gpus[LT_WORKER_MAX_GPUS];
} lt_worker_devices_t;

/* Chooses the backend (conf->backend: "auto" or NULL, "cpu", "cuda"; LATHE_WORKER_BACKEND) and
 * settles *slots: auto takes the GPUs when this build and machine have any, the cpu otherwise;
 * cuda without a GPU is refused with the runtime's reason. On cuda, *slots <= 0 becomes the GPU
 * count, and more slots than GPUs is refused; on cpu, *slots <= 0 becomes 1. */
lt_err_t lt_worker_devices(const char *backend, int *slots, lt_worker_devices_t *out, char *errstr, size_t n);

/* conf's defaults where it leaves a field 0 (or negative: store_retry_ms, threads_per_executor),
 * and at most max_slots slots. */
void lt_worker_conf_defaults(lt_worker_conf_t *conf, int max_slots);

/* What executors may do (lt_confine.h) into *confine, and the parents of the attempts'
 * directories (work_parent, mem_parent: 512 bytes each), created 0711; what a previous process of
 * the same worker id left in them (a crash skips the attempts' scrub) is scrubbed and removed
 * first (lt_scrub.h), unless a live process of the id holds <mem_parent>.lock. *lock_fd: that
 * lock, held shared until the caller closes it (even on a failure, when it is >= 0). Fails when mem_root is not
 * a memory file system, or without the store and master key. Logs what it cannot apply. */
lt_err_t lt_worker_confinement(const lt_worker_conf_t *conf, lt_confine_conf_t *confine, char *work_parent,
                               char *mem_parent, int *lock_fd, char *errstr, size_t n);

/* lathe.jobs, lathe.control and lathe.tenants assigned from the beginning, into *out. */
lt_err_t lt_worker_assign_control(const lt_bus_conf_t *bus, lt_bus_consumer_t **out, char *errstr, size_t n);

/* The dispatch group's consumer, subscribed to the class topics, into *out. */
lt_err_t lt_worker_join_dispatch(const lt_bus_conf_t *bus, const char *const topics[LT_CLASS__COUNT],
                                 lt_bus_rebalance_cb *rebalance_cb, void *opaque, lt_bus_consumer_t **out,
                                 char *errstr, size_t n);

#endif
