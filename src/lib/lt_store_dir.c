/* lt_store_dir: the object store of the embedded mode, a local directory.
 *
 * Layout. A key's segments become directories; every byte outside [A-Za-z0-9_.-] (and a leading
 * '.') is written %XX, so no key names "..", a hidden file or anything outside the root. An object
 * is the file "<last segment>%o" — "%o" never occurs in an escaped name, so the object "a" and
 * the directory of "a/b" never collide. Temp files live in <root>/.tmp (same file system).
 *
 * Writes are atomic: temp file, fsync, rename over the target, fsync of the directory. Objects are
 * therefore immutable inodes, which makes copy a hard link. */
#include "lt_store_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lt_crypto.h"

#define PATH_CAP (4096 + 16)
#define READ_PIECE (1024 * 1024)
#define OBJ_SUFFIX "%o"

typedef struct dir_store {
  char root[PATH_MAX];
  int root_fd;
} dir_store_t;

typedef struct dir_writer {
  dir_store_t *d;
  int fd;
  char tmp[PATH_CAP];
  char path[PATH_CAP];
  char key[LT_STORE_KEY_MAX + 1];
} dir_writer_t;

static bool plain(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

/* Escapes key into a path relative to the root ("seg/seg/last%o"). Returns false if too long. */
static bool key_path(const char *key, char *out, size_t cap) {
  static const char hx[] = "0123456789ABCDEF";
  size_t o = 0;
  bool seg_start = true;
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
    if (o + 4 >= cap) return false;
    if (*p == '/') {
      out[o++] = '/';
      seg_start = true;
      continue;
    }
    if (plain(*p) && !(seg_start && *p == '.')) {
      out[o++] = (char)*p;
    } else {
      out[o++] = '%';
      out[o++] = hx[*p >> 4];
      out[o++] = hx[*p & 15];
    }
    seg_start = false;
  }
  if (o + sizeof OBJ_SUFFIX > cap) return false;
  memcpy(out + o, OBJ_SUFFIX, sizeof OBJ_SUFFIX);
  return true;
}

static int unhex1(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Decodes an escaped relative path (without the object suffix) into a key. */
static bool path_key(const char *rel, size_t n, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (o + 1 >= cap) return false;
    if (rel[i] == '%') {
      if (i + 2 >= n) return false;
      int hi = unhex1(rel[i + 1]), lo = unhex1(rel[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out[o++] = (char)(hi << 4 | lo);
      i += 2;
    } else {
      out[o++] = rel[i];
    }
  }
  out[o] = 0;
  return true;
}

static lt_err_t io_err(char *errstr, size_t errstr_size, const char *op, const char *key,
                       int err) {
  if (err == ENOENT)
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "%s '%s': no such object", op, key);
  if (err == ENOSPC || err == EDQUOT)
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s '%s': file system full (%s)", op, key,
                   strerror(err));
  return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s '%s': %s", op, key, strerror(err));
}

/* mkdir -p of the parent directories of rel, relative to the root. */
static int make_parents(dir_store_t *d, const char *rel) {
  char tmp[PATH_CAP];
  snprintf(tmp, sizeof tmp, "%s", rel);
  for (char *p = strchr(tmp, '/'); p; p = strchr(p + 1, '/')) {
    *p = 0;
    if (mkdirat(d->root_fd, tmp, 0700) != 0 && errno != EEXIST) return errno;
    *p = '/';
  }
  return 0;
}

static int fsync_parent(dir_store_t *d, const char *rel) {
  char tmp[PATH_CAP];
  snprintf(tmp, sizeof tmp, "%s", rel);
  char *slash = strrchr(tmp, '/');
  int fd;
  if (slash) {
    *slash = 0;
    fd = openat(d->root_fd, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } else {
    fd = openat(d->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  if (fd < 0) return errno;
  int r = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return r;
}

static lt_err_t tmp_name(char *out, size_t cap) {
  char id[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  if (lt_crypto_random_id(id)) return LT_ERR_INTERNAL;
  snprintf(out, cap, ".tmp/%s", id);
  return LT_OK;
}

/* Publishes the fsynced temp file tmp as rel. */
static lt_err_t publish(dir_store_t *d, const char *tmp, const char *rel, const char *key,
                        char *errstr, size_t errstr_size) {
  int err = make_parents(d, rel);
  if (!err && renameat(d->root_fd, tmp, d->root_fd, rel) != 0) err = errno;
  if (!err) err = fsync_parent(d, rel);
  if (err) {
    unlinkat(d->root_fd, tmp, 0);
    return io_err(errstr, errstr_size, "put", key, err == ENOENT ? EIO : err);
  }
  return LT_OK;
}

static lt_err_t write_all(int fd, const void *data, size_t len) {
  const uint8_t *p = data;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return LT_ERR_IO;
    }
    p += n;
    len -= (size_t)n;
  }
  return LT_OK;
}

static lt_err_t dir_w_open(lt_store_t *s, const char *key, void **out, char *errstr,
                           size_t errstr_size) {
  dir_store_t *d = s->impl;
  dir_writer_t *w = calloc(1, sizeof *w);
  if (!w) return LT_ERR_NOMEM;
  w->d = d;
  snprintf(w->key, sizeof w->key, "%s", key);
  if (!key_path(key, w->path, sizeof w->path)) {
    free(w);
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key '%s' is too long once "
                   "escaped for the directory store", key);
  }
  if (tmp_name(w->tmp, sizeof w->tmp)) {
    free(w);
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "RAND_bytes failed");
  }
  w->fd = openat(d->root_fd, w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (w->fd < 0) {
    int err = errno;
    free(w);
    return io_err(errstr, errstr_size, "put (temp file)", key, err == ENOENT ? EIO : err);
  }
  *out = w;
  return LT_OK;
}

static lt_err_t dir_w_write(void *wv, const void *data, size_t len, char *errstr,
                            size_t errstr_size) {
  dir_writer_t *w = wv;
  if (write_all(w->fd, data, len)) return io_err(errstr, errstr_size, "put", w->key, errno);
  return LT_OK;
}

static void dir_w_abort(void *wv) {
  dir_writer_t *w = wv;
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  unlinkat(w->d->root_fd, w->tmp, 0);
  free(w);
}

static lt_err_t dir_w_commit(void *wv, char *errstr, size_t errstr_size) {
  dir_writer_t *w = wv;
  int err = fsync(w->fd) == 0 ? 0 : errno;
  if (close(w->fd) != 0 && !err) err = errno;
  w->fd = -1;
  if (err) {
    lt_err_t e = io_err(errstr, errstr_size, "put (fsync)", w->key, err);
    dir_w_abort(w);
    return e;
  }
  lt_err_t e = publish(w->d, w->tmp, w->path, w->key, errstr, errstr_size);
  free(w);
  return e;
}

static lt_err_t dir_put(lt_store_t *s, const char *key, const void *data, size_t len,
                        char *errstr, size_t errstr_size) {
  void *w;
  lt_err_t e = dir_w_open(s, key, &w, errstr, errstr_size);
  if (e) return e;
  if ((e = dir_w_write(w, data, len, errstr, errstr_size))) {
    dir_w_abort(w);
    return e;
  }
  return dir_w_commit(w, errstr, errstr_size);
}

static lt_err_t dir_get(lt_store_t *s, const char *key, lt_store_sink_fn sink, void *ctx,
                        char *errstr, size_t errstr_size) {
  dir_store_t *d = s->impl;
  char rel[PATH_CAP];
  if (!key_path(key, rel, sizeof rel))
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "get '%s': no such object", key);
  /* An object is a regular file: never a link or a FIFO that another process planted in a
   * directory it can write (a confined executor's sealed spool, workers/lt_ckpt.c). */
  int fd = openat(d->root_fd, rel, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return io_err(errstr, errstr_size, "get", key, errno == ENOTDIR ? ENOENT : errno);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return io_err(errstr, errstr_size, "get", key, EINVAL);
  }
  uint8_t *buf = malloc(READ_PIECE);
  lt_err_t e = buf ? LT_OK : LT_ERR_NOMEM;
  while (!e) {
    ssize_t n = read(fd, buf, READ_PIECE);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) e = io_err(errstr, errstr_size, "get", key, errno);
    if (n <= 0) break;
    e = sink(ctx, buf, (size_t)n);
  }
  free(buf);
  close(fd);
  return e;
}

static lt_err_t dir_head(lt_store_t *s, const char *key, lt_store_info_t *info, char *errstr,
                         size_t errstr_size) {
  dir_store_t *d = s->impl;
  char rel[PATH_CAP];
  struct stat st;
  if (!key_path(key, rel, sizeof rel))
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "head '%s': no such object", key);
  if (fstatat(d->root_fd, rel, &st, 0) != 0)
    return io_err(errstr, errstr_size, "head", key, errno == ENOTDIR ? ENOENT : errno);
  info->size = (uint64_t)st.st_size;
  info->mtime = st.st_mtim.tv_sec;
  /* Every write is a new inode, so inode and ctime identify a content version. */
  snprintf(info->etag, sizeof info->etag, "%llx-%llx-%lx", (unsigned long long)st.st_ino,
           (unsigned long long)st.st_size, (long)st.st_ctim.tv_nsec ^ (long)st.st_ctim.tv_sec);
  return LT_OK;
}

static lt_err_t dir_del(lt_store_t *s, const char *key, char *errstr, size_t errstr_size) {
  dir_store_t *d = s->impl;
  char rel[PATH_CAP];
  if (!key_path(key, rel, sizeof rel)) return LT_OK;
  if (unlinkat(d->root_fd, rel, 0) != 0 && errno != ENOENT && errno != ENOTDIR)
    return io_err(errstr, errstr_size, "delete", key, errno);
  int err = fsync_parent(d, rel);
  if (err && err != ENOENT) return io_err(errstr, errstr_size, "delete", key, err);
  return LT_OK;
}

static lt_err_t dir_copy(lt_store_t *s, const char *src, const char *dst, char *errstr,
                         size_t errstr_size) {
  dir_store_t *d = s->impl;
  char from[PATH_CAP], to[PATH_CAP], tmp[PATH_CAP];
  if (!key_path(src, from, sizeof from))
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "copy: no such object '%s'", src);
  if (!key_path(dst, to, sizeof to))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "copy: key '%s' is too long once escaped",
                   dst);
  if (tmp_name(tmp, sizeof tmp)) return LT_ERR_INTERNAL;
  if (linkat(d->root_fd, from, d->root_fd, tmp, 0) != 0)
    return io_err(errstr, errstr_size, "copy from", src, errno == ENOTDIR ? ENOENT : errno);
  return publish(d, tmp, to, dst, errstr, errstr_size);
}

/* ---- list ----------------------------------------------------------------------------------- */

typedef struct keyvec {
  char **k;
  size_t n, cap;
} keyvec_t;

static int cmp_keys(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Collects keys under the escaped directory rel (relative to the root) that start with prefix and
 * sort after start_after. */
static int walk(dir_store_t *d, char *rel, size_t rel_len, const char *prefix,
                const char *start_after, keyvec_t *v) {
  int fd = rel_len ? openat(d->root_fd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                   : openat(d->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ENOTDIR ? 0 : errno;
  DIR *dir = fdopendir(fd);
  if (!dir) {
    close(fd);
    return errno;
  }
  int err = 0;
  struct dirent *de;
  while (!err && (de = readdir(dir))) {
    const char *name = de->d_name;
    if (name[0] == '.') continue; /* ".", "..", ".tmp": escaped names never start with '.' */
    size_t nl = strlen(name);
    if (rel_len + 1 + nl + 1 > PATH_CAP) continue;
    size_t sub_len = rel_len;
    if (rel_len) rel[sub_len++] = '/';
    memcpy(rel + sub_len, name, nl + 1);
    sub_len += nl;
    unsigned char type = de->d_type;
    if (type == DT_UNKNOWN) {
      struct stat st;
      type = fstatat(d->root_fd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)
                 ? DT_DIR : DT_REG;
    }
    char key[LT_STORE_KEY_MAX + 1];
    if (type == DT_DIR) {
      /* Descend only if this directory's key prefix can still match. */
      if (path_key(rel, sub_len, key, sizeof key)) {
        size_t kl = strlen(key), pl = strlen(prefix);
        size_t m = kl < pl ? kl : pl;
        if (strncmp(key, prefix, m) == 0) err = walk(d, rel, sub_len, prefix, start_after, v);
      }
    } else if (type == DT_REG && nl > 2 && strcmp(name + nl - 2, OBJ_SUFFIX) == 0) {
      if (path_key(rel, sub_len - 2, key, sizeof key) &&
          strncmp(key, prefix, strlen(prefix)) == 0 && strcmp(key, start_after) > 0) {
        if (v->n == v->cap) {
          size_t cap = v->cap ? 2 * v->cap : 256;
          char **k = realloc(v->k, cap * sizeof *k);
          if (!k) err = ENOMEM;
          else {
            v->k = k;
            v->cap = cap;
          }
        }
        if (!err && !(v->k[v->n] = strdup(key))) err = ENOMEM;
        if (!err) v->n++;
      }
    }
    rel[rel_len] = 0;
  }
  closedir(dir);
  return err;
}

static lt_err_t dir_list(lt_store_t *s, const char *prefix, const char *start_after,
                         size_t max_keys, lt_store_list_fn fn, void *ctx, char *next,
                         size_t next_size, char *errstr, size_t errstr_size) {
  dir_store_t *d = s->impl;
  keyvec_t v = {0};
  char rel[PATH_CAP] = "";
  int err = walk(d, rel, 0, prefix, start_after, &v);
  lt_err_t e = LT_OK;
  if (err) e = lt_errf(errstr, errstr_size, LT_ERR_IO, "list '%s': %s", prefix, strerror(err));
  if (!e) {
    if (v.n) qsort(v.k, v.n, sizeof *v.k, cmp_keys); /* an empty list has no array */
    size_t n = v.n < max_keys ? v.n : max_keys;
    for (size_t i = 0; i < n && !e; i++) {
      lt_store_info_t info = {0};
      lt_err_t he = dir_head(s, v.k[i], &info, NULL, 0);
      if (he == LT_ERR_NOT_FOUND) continue; /* deleted since the walk */
      e = fn(ctx, v.k[i], &info);
    }
    if (!e && v.n > max_keys) snprintf(next, next_size, "%s", v.k[max_keys - 1]);
  }
  for (size_t i = 0; i < v.n; i++) free(v.k[i]);
  free(v.k);
  return e;
}

static void dir_destroy(lt_store_t *s) {
  dir_store_t *d = s->impl;
  if (d->root_fd >= 0) close(d->root_fd);
  free(d);
}

static const lt_store_ops_t dir_ops = {
    .kind = "dir",
    .put = dir_put,
    .get = dir_get,
    .head = dir_head,
    .del = dir_del,
    .copy = dir_copy,
    .list = dir_list,
    .w_open = dir_w_open,
    .w_write = dir_w_write,
    .w_commit = dir_w_commit,
    .w_abort = dir_w_abort,
    .destroy = dir_destroy,
};

lt_err_t lt_store_dir_new(lt_store_t **out, const char *root, char *errstr, size_t errstr_size) {
  if (!root || !*root) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "store root is empty");
  if (strlen(root) >= PATH_MAX - 1)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "store root path is too long");
  if (mkdir(root, 0700) != 0 && errno != EEXIST)
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "store root %s: %s", root, strerror(errno));
  dir_store_t *d = calloc(1, sizeof *d);
  if (!d) return LT_ERR_NOMEM;
  snprintf(d->root, sizeof d->root, "%s", root);
  d->root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d->root_fd < 0) {
    int err = errno;
    free(d);
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "store root %s: %s", root, strerror(err));
  }
  if (mkdirat(d->root_fd, ".tmp", 0700) != 0 && errno != EEXIST) {
    int err = errno;
    close(d->root_fd);
    free(d);
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "store root %s/.tmp: %s", root, strerror(err));
  }
  lt_err_t e = lt_store__new(out, &dir_ops, d);
  if (e) dir_destroy(&(lt_store_t){.impl = d});
  return e;
}
