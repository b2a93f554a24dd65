/* lt_backend_cuda_stub: the cuda backend's entry points for builds without the CUDA toolkit, so
 * callers link on every build and learn at run time that no GPU backend is there. */
#include "lt_backend_cuda.h"

static lt_err_t none(char *errstr, size_t errstr_size) {
  return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                 "cuda backend: this build has no CUDA support (configure with -Dcuda=enabled "
                 "on a machine with the CUDA toolkit)");
}

lt_err_t lt_cuda_device_count(int *count, char *errstr, size_t errstr_size) {
  *count = 0;
  return none(errstr, errstr_size);
}

lt_err_t lt_cuda_devices(lt_cuda_device_t *out, int max, int *n, char *errstr, size_t errstr_size) {
  (void)out, (void)max;
  return lt_cuda_device_count(n, errstr, errstr_size);
}

lt_err_t lt_backend_cuda_new_opts(int device, const lt_cuda_opts_t *opts, lt_backend_t **out, char *errstr,
                                  size_t errstr_size) {
  (void)device, (void)opts;
  *out = NULL;
  return none(errstr, errstr_size);
}

lt_err_t lt_backend_cuda_new(int device, lt_backend_t **out, char *errstr, size_t errstr_size) {
  return lt_backend_cuda_new_opts(device, NULL, out, errstr, errstr_size);
}
