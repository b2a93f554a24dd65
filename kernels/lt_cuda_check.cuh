/* lt_cuda_check: turns CUDA runtime, cuBLAS and NCCL status codes into lt_err_t.
 *
 * Every CUDA call in kernels/ and in the cuda backend goes through one of these macros, so a
 * failure carries the call, its file and line and the library's own message. The header is
 * plain C (it is included by workers/engine/lt_backend_cuda.c and by the tests as well as by .cu files).
 *
 *   LT_CUDA_TRY(cudaMemcpyAsync(...), errstr, errstr_size);   // returns the lt_err_t on failure
 *   LT_CUDA_LAUNCHED(errstr, errstr_size);                     // after a <<<...>>> launch
 */
#ifndef LT_CUDA_CHECK_CUH
#define LT_CUDA_CHECK_CUH

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "lt_err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* LT_OK when e == cudaSuccess; otherwise writes "<file>:<line>: <what>: <cuda message>" to
 * errstr and returns LT_ERR_UNAVAILABLE for "no GPU / driver too old", LT_ERR_NOMEM for out of
 * memory, LT_ERR_INVALID for bad launch arguments and LT_ERR_FATAL otherwise (a sticky device
 * error: the context is unusable). */
lt_err_t lt_cuda_check_at(int e, const char *what, const char *file, int line, char *errstr,
                          size_t errstr_size);
/* The same for a cublasStatus_t (passed as int so this header needs no cuBLAS). */
lt_err_t lt_cublas_check_at(int st, const char *what, const char *file, int line, char *errstr,
                            size_t errstr_size);
/* The same for an ncclResult_t. */
lt_err_t lt_nccl_check_at(int st, const char *what, const char *file, int line, char *errstr,
                          size_t errstr_size);

/* 1 when a cudaError_t means "there is no usable GPU here" (no device, no driver, driver older
 * than the runtime): callers report it as unavailable / test skipped, never as a failure. */
int lt_cuda_is_no_gpu(int e);

#ifdef __cplusplus
}
#endif

/* Returns from the enclosing function with the lt_err_t when check(call) is not LT_OK. */
#define LT_CHECKED_TRY(check, call, errstr, errstr_size)                                       \
  do {                                                                                         \
    lt_err_t lt_cuda_try_err_ = check((int)(call), #call, __FILE__, __LINE__, (errstr), (errstr_size)); \
    if (lt_cuda_try_err_ != LT_OK) return lt_cuda_try_err_;                                    \
  } while (0)
#define LT_CUDA_TRY(call, errstr, errstr_size) LT_CHECKED_TRY(lt_cuda_check_at, call, errstr, errstr_size)
#define LT_CUBLAS_TRY(call, errstr, errstr_size) LT_CHECKED_TRY(lt_cublas_check_at, call, errstr, errstr_size)
#define LT_NCCL_TRY(call, errstr, errstr_size) LT_CHECKED_TRY(lt_nccl_check_at, call, errstr, errstr_size)

/* After a kernel launch: catches bad launch configurations at once (asynchronous faults show
 * up at the next synchronising call, which is checked too). */
#define LT_CUDA_LAUNCHED(errstr, errstr_size) LT_CUDA_TRY(cudaGetLastError(), errstr, errstr_size)

#endif
