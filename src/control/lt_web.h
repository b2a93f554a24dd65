/* lt_web: the dashboard's static files (web/), embedded at build time (web/gen_web.py) and served
 * under /dashboard/ by the api (a tenant's view) and by the scheduler's operator port (the
 * operator's view). The pages call the same HTTP API as every client, with the key the user types;
 * the files themselves are public and hold no data. */
#ifndef LT_WEB_H
#define LT_WEB_H

#include <stdbool.h>
#include <stddef.h>

struct evhttp_request;

typedef struct lt_web_file {
  const char *name;         /* "index.html" */
  const char *content_type;
  const unsigned char *data;
  size_t len;
} lt_web_file_t;

extern const lt_web_file_t lt_web_files[];
extern const size_t lt_web_nfiles;

/* Answers a GET of path when it is /dashboard or under it (index.html for the folder itself, 404
 * for a file it does not have) and returns true; false (nothing sent) for any other path. The
 * answer forbids framing and any script or connection but the page's own origin. */
bool lt_web_serve(struct evhttp_request *req, const char *path);

#endif
