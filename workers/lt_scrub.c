/* lt_scrub: overwrite, sync and remove an attempt's private tree (lt_scrub.h). */
#include "lt_scrub.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct scrub {
  int64_t zeroed;
  lt_err_t err; /* the first failure */
  char *errstr;
  size_t errstr_size;
  char zeros[1 << 16];
} scrub_t;

static void failed(scrub_t *s, const char *what, const char *name) {
  if (s->err) return;
  s->err = lt_errf(s->errstr, s->errstr_size, LT_ERR_IO, "scrub: %s %s: %s", what, name, strerror(errno));
}

/* Overwrites the regular file name in dirfd with zeros and syncs it, unless other names share it. */
static void zero_file(scrub_t *s, int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == EACCES && fchmodat(dirfd, name, S_IRUSR | S_IWUSR, 0) == 0)
    fd = openat(dirfd, name, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    failed(s, "cannot open", name);
    return;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1) {
    off_t off = 0;
    while (off < st.st_size) {
      size_t k = (size_t)(st.st_size - off) < sizeof s->zeros ? (size_t)(st.st_size - off) : sizeof s->zeros;
      ssize_t w = pwrite(fd, s->zeros, k, off);
      if (w <= 0) {
        failed(s, "cannot overwrite", name);
        break;
      }
      off += w;
    }
    s->zeroed += off;
    if (fsync(fd) != 0) failed(s, "cannot sync", name);
  }
  close(fd);
}

/* Scrubs every entry of the open directory dirfd, depth first; closes dirfd. */
static void scrub_dir(scrub_t *s, int dirfd, int depth) {
  DIR *d = fdopendir(dirfd);
  if (!d) {
    failed(s, "cannot read", "a directory");
    close(dirfd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    struct stat st;
    if (fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      failed(s, "cannot stat", e->d_name);
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      int sub = depth < LT_SCRUB_MAX_DEPTH
                    ? openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                    : -1;
      if (sub >= 0) scrub_dir(s, sub, depth + 1);
      if (unlinkat(dirfd, e->d_name, AT_REMOVEDIR) != 0) failed(s, "cannot remove directory", e->d_name);
      continue;
    }
    if (S_ISREG(st.st_mode)) zero_file(s, dirfd, e->d_name);
    if (unlinkat(dirfd, e->d_name, 0) != 0) failed(s, "cannot remove", e->d_name);
  }
  closedir(d); /* closes dirfd */
}

lt_err_t lt_scrub_tree(const char *path, int64_t *zeroed, char *errstr, size_t errstr_size) {
  if (zeroed) *zeroed = 0;
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return LT_OK;
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "scrub: cannot open %s: %s", path, strerror(errno));
  }
  scrub_t *s = calloc(1, sizeof *s);
  if (!s) {
    close(fd);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "scrub: out of memory");
  }
  s->errstr = errstr;
  s->errstr_size = errstr_size;
  scrub_dir(s, fd, 0);
  if (rmdir(path) != 0) failed(s, "cannot remove directory", path);
  if (zeroed) *zeroed = s->zeroed;
  lt_err_t err = s->err;
  free(s);
  return err;
}
