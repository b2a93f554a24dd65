/* lt_cuda_check: CUDA / cuBLAS / NCCL status codes to lt_err_t with file, line and message. */
#include "lt_cuda_check.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

extern "C" int lt_cuda_is_no_gpu(int e) {
  cudaError_t c = (cudaError_t)e;
  return c == cudaErrorNoDevice || c == cudaErrorInsufficientDriver ||
         c == cudaErrorInitializationError || c == cudaErrorCompatNotSupportedOnDevice ||
         c == cudaErrorSystemDriverMismatch || c == cudaErrorDevicesUnavailable;
}

extern "C" lt_err_t lt_cuda_check_at(int e, const char *what, const char *file, int line,
                                     char *errstr, size_t errstr_size) {
  cudaError_t c = (cudaError_t)e;
  if (c == cudaSuccess) return LT_OK;
  lt_err_t err = LT_ERR_FATAL;
  if (lt_cuda_is_no_gpu(e))
    err = LT_ERR_UNAVAILABLE;
  else if (c == cudaErrorMemoryAllocation)
    err = LT_ERR_NOMEM;
  else if (c == cudaErrorInvalidValue || c == cudaErrorInvalidConfiguration ||
           c == cudaErrorInvalidDevice)
    err = LT_ERR_INVALID;
  return lt_errf(errstr, errstr_size, err, "%s:%d: %s: %s (%s)", file, line, what,
                 cudaGetErrorString(c), cudaGetErrorName(c));
}

extern "C" lt_err_t lt_cublas_check_at(int st, const char *what, const char *file, int line,
                                       char *errstr, size_t errstr_size) {
  cublasStatus_t s = (cublasStatus_t)st;
  if (s == CUBLAS_STATUS_SUCCESS) return LT_OK;
  lt_err_t err = LT_ERR_FATAL;
  if (s == CUBLAS_STATUS_ALLOC_FAILED)
    err = LT_ERR_NOMEM;
  else if (s == CUBLAS_STATUS_INVALID_VALUE)
    err = LT_ERR_INVALID;
  else if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH)
    err = LT_ERR_UNSUPPORTED;
  else if (s == CUBLAS_STATUS_NOT_INITIALIZED)
    err = LT_ERR_UNAVAILABLE;
  return lt_errf(errstr, errstr_size, err, "%s:%d: %s: cuBLAS %s (%s)", file, line, what,
                 cublasGetStatusName(s), cublasGetStatusString(s));
}

extern "C" lt_err_t lt_nccl_check_at(int st, const char *what, const char *file, int line,
                                     char *errstr, size_t errstr_size) {
  ncclResult_t r = (ncclResult_t)st;
  if (r == ncclSuccess) return LT_OK;
  lt_err_t err = LT_ERR_FATAL;
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) err = LT_ERR_INVALID;
  if (r == ncclSystemError || r == ncclRemoteError) err = LT_ERR_UNAVAILABLE;
  return lt_errf(errstr, errstr_size, err, "%s:%d: %s: NCCL %s", file, line, what,
                 ncclGetErrorString(r));
}
