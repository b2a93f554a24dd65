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

/* A library status code and the lt_err_t it means; a failure in no table is LT_ERR_FATAL. */
struct status_map {
  int code;
  lt_err_t err;
};

template <size_t N> static lt_err_t mapped(const status_map (&map)[N], int code) {
  for (const status_map &m : map)
    if (m.code == code) return m.err;
  return LT_ERR_FATAL;
}

/* (no GPU at all is LT_ERR_UNAVAILABLE: lt_cuda_is_no_gpu) */
static const status_map cuda_errs[] = {
    {cudaErrorMemoryAllocation, LT_ERR_NOMEM}, {cudaErrorInvalidValue, LT_ERR_INVALID},
    {cudaErrorInvalidConfiguration, LT_ERR_INVALID}, {cudaErrorInvalidDevice, LT_ERR_INVALID}};
static const status_map cublas_errs[] = {
    {CUBLAS_STATUS_ALLOC_FAILED, LT_ERR_NOMEM}, {CUBLAS_STATUS_INVALID_VALUE, LT_ERR_INVALID},
    {CUBLAS_STATUS_NOT_SUPPORTED, LT_ERR_UNSUPPORTED},
    {CUBLAS_STATUS_ARCH_MISMATCH, LT_ERR_UNSUPPORTED},
    {CUBLAS_STATUS_NOT_INITIALIZED, LT_ERR_UNAVAILABLE}};
static const status_map nccl_errs[] = {
    {ncclInvalidArgument, LT_ERR_INVALID}, {ncclInvalidUsage, LT_ERR_INVALID},
    {ncclSystemError, LT_ERR_UNAVAILABLE}, {ncclRemoteError, LT_ERR_UNAVAILABLE}};

extern "C" lt_err_t lt_cuda_check_at(int e, const char *what, const char *file, int line,
                                     char *errstr, size_t errstr_size) {
  cudaError_t c = (cudaError_t)e;
  if (c == cudaSuccess) return LT_OK;
  lt_err_t err = lt_cuda_is_no_gpu(e) ? LT_ERR_UNAVAILABLE : mapped(cuda_errs, e);
  return lt_errf(errstr, errstr_size, err, "%s:%d: %s: %s (%s)", file, line, what,
                 cudaGetErrorString(c), cudaGetErrorName(c));
}

extern "C" lt_err_t lt_cublas_check_at(int st, const char *what, const char *file, int line,
                                       char *errstr, size_t errstr_size) {
  cublasStatus_t s = (cublasStatus_t)st;
  if (s == CUBLAS_STATUS_SUCCESS) return LT_OK;
  return lt_errf(errstr, errstr_size, mapped(cublas_errs, st), "%s:%d: %s: cuBLAS %s (%s)", file,
                 line, what, cublasGetStatusName(s), cublasGetStatusString(s));
}

extern "C" lt_err_t lt_nccl_check_at(int st, const char *what, const char *file, int line,
                                     char *errstr, size_t errstr_size) {
  if (st == ncclSuccess) return LT_OK;
  return lt_errf(errstr, errstr_size, mapped(nccl_errs, st), "%s:%d: %s: NCCL %s", file, line,
                 what, ncclGetErrorString((ncclResult_t)st));
}
