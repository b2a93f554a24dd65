/* lt_backend_cuda: the cuda implementation of lt_backend.h, and the NCCL communicator that
 * averages adapter gradients over the GPUs of one node.
 *
 * The backend keeps the vtable's f32 contract. Precision of the matrix products is chosen at
 * creation: `f32` (the default: exact FP32 cuBLAS GEMMs, no TF32, for parity with the cpu
 * backend and the PyTorch reference) or `bf16`: a weight from map_const() of at least
 * bf16_min_elems floats lives on the device in bf16 alone, stored once (its name is a reserved
 * host range, not device memory), and the matmul()s that read one run on tensor cores with the activations cast to bf16 and f32
 * accumulation (attention's GEMMs likewise); embed_fwd() widens its bf16 rows; copy() and
 * download() give the caller's floats; grad_f32() (the LM head) puts the weight's floats on the
 * device at its first A W product (the input gradient), which reads them, as on the cpu backend. Smaller
 * weights (norms, biases) stay f32 for the kernels that read floats; handing such a kernel a
 * bf16-only weight fails the backend, naming it. The embedding's rows are bf16 in this mode
 * (the cpu backend's bf16 path reads them as floats).
 *
 * Errors: members that cannot return an error (kernels) record the first failure; upload(),
 * download() and last_error() report it, and every later call is a no-op until destroy().
 * Threads: one host thread at a time per backend (lt_backend.h). Each member makes the
 * backend's device current, so several backends (one per GPU) may be driven from one thread.
 * Tenant isolation: free(), free_const() and destroy() zero every buffer before releasing it. */
#ifndef LT_BACKEND_CUDA_H
#define LT_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "lt_backend.h"

typedef struct lt_cuda_opts {
  int bf16;              /* 1: bf16 tensor-core matmuls for mapped weights (see above) */
  size_t bf16_min_elems; /* map_const() tensors smaller than this get no bf16 shadow
                            (norm weights, biases); 0 means 65536 */
} lt_cuda_opts_t;

/* Without the CUDA toolkit the build links lt_backend_cuda_stub.c instead: these three answer
 * LT_ERR_UNAVAILABLE there (the NCCL members below exist in CUDA builds only).
 * lt_backend_cuda_new() (declared in lt_backend.h) uses f32, unless the environment variable
 * LATHE_CUDA_PRECISION=bf16 asks otherwise (read once, at creation). */
lt_err_t lt_backend_cuda_new_opts(int device, const lt_cuda_opts_t *opts, lt_backend_t **out,
                                  char *errstr, size_t errstr_size);

/* Number of usable GPUs; 0 (and LT_ERR_UNAVAILABLE with the runtime's reason in errstr) when
 * there is none, including "driver version is insufficient". */
lt_err_t lt_cuda_device_count(int *count, char *errstr, size_t errstr_size);

/* A GPU as a worker's heartbeat reports it. */
typedef struct lt_cuda_device {
  int index;
  char name[96];          /* "NVIDIA H200" */
  uint64_t memory_bytes;  /* total device memory */
  int cc_major, cc_minor; /* compute capability */
} lt_cuda_device_t;

/* The GPUs this process can use, the first `max` of them in out, how many in *n. Reads the
 * devices' properties only: no context is made, so a worker can list the GPUs it hands to its
 * executors without holding memory on them. 0 (and the reason, as lt_cuda_device_count) when
 * there is none. */
lt_err_t lt_cuda_devices(lt_cuda_device_t *out, int max, int *n, char *errstr, size_t errstr_size);

/* ---- NCCL: data parallelism over the GPUs of one node --------------------------------- */

typedef struct lt_cuda_comm lt_cuda_comm_t;

#define LT_CUDA_COMM_ID_BYTES 128

/* A fresh communicator id (rank 0 makes it and hands it to the other ranks, e.g. through the
 * executor's command line or a pipe). */
lt_err_t lt_cuda_comm_id(uint8_t id[LT_CUDA_COMM_ID_BYTES], char *errstr, size_t errstr_size);

/* Joins communicator `id` as `rank` of `nranks`, on `be`'s device and stream (be must be a cuda
 * backend). Blocks until every rank has joined: call it from one thread or process per rank.
 * The caller owns the result; it must be destroyed before `be`. */
lt_err_t lt_cuda_comm_new(lt_backend_t *be, const uint8_t id[LT_CUDA_COMM_ID_BYTES], int nranks,
                          int rank, lt_cuda_comm_t **out, char *errstr, size_t errstr_size);

/* In place: buf (n floats on this rank's device) becomes the mean over ranks. Enqueued on the
 * backend's stream after earlier work; later members see the result. Every rank must call it
 * with the same n, in the same order. */
lt_err_t lt_cuda_comm_allreduce_mean(lt_cuda_comm_t *comm, float *buf, size_t n, char *errstr,
                                     size_t errstr_size);

/* NULL-safe. */
void lt_cuda_comm_destroy(lt_cuda_comm_t *comm);

#endif
