/* lt_cpu_pool: the cpu backend's thread pool (lt_backend_cpu.c). A fixed set of threads runs
 * each job as nt static parts, the caller being part 0, so a job's partition depends only on
 * its shapes and the thread count.
 *
 * A job is published by fn, arg and then gen; workers wait awake on gen before they sleep on
 * go, and the caller on pending before it sleeps on done: a decode step runs hundreds of short
 * jobs, and in a VM a sleeping vCPU's wake-up exits to the hypervisor (a sleep and a wake-up
 * for each job cost a third of a step). sleepers and waiting say who sleeps, so that a wake-up
 * is only sent to a sleeper (seq_cst on both sides: a thread that sets its flag and then reads
 * the condition, against one that changes the condition and then reads the flag, cannot both
 * miss). */
#ifndef LT_CPU_POOL_H
#define LT_CPU_POOL_H

#include <pthread.h>
#include <stdatomic.h>

typedef void (*lt_cpu_pool_fn)(void *arg, int tid, int nt);

typedef struct lt_cpu_pool {
  int nt; /* threads, the caller included */
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  _Atomic long gen;     /* incremented per job */
  _Atomic long pending; /* workers still running the current job */
  _Atomic int sleepers; /* workers asleep on go, or about to be */
  _Atomic int waiting;  /* the caller asleep on done, or about to be */
  int quit;             /* written before gen moves, read after */
  lt_cpu_pool_fn fn;
  void *arg;
  pthread_t *threads; /* [nt]; [0] unused (the caller) */
} lt_cpu_pool_t;

/* Starts nt - 1 threads. 0 on success; otherwise the index of the thread that could not start
 * (those started before are stopped, and nothing is left to free). */
int lt_cpu_pool_start(lt_cpu_pool_t *p, int nt);

/* Runs fn(arg, tid, nt) for tid in [0, nt), the caller being tid 0; returns when all are done. */
void lt_cpu_pool_run(lt_cpu_pool_t *p, lt_cpu_pool_fn fn, void *arg);

/* Stops and joins the threads. */
void lt_cpu_pool_stop(lt_cpu_pool_t *p);

#endif
