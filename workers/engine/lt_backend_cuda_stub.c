/* lt_backend_cuda_stub: lt_backend_cuda_new() for builds without the CUDA backend, so callers
 * link on every build and learn at run time that no GPU backend is there. */
#include "lt_backend.h"

lt_err_t lt_backend_cuda_new(int device, lt_backend_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                 "cuda backend: this build has no CUDA support (configure with -Dcuda=enabled "
                 "on a machine with the CUDA toolkit)");
}
