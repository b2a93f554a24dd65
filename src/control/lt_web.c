/* lt_web: serving the embedded dashboard files (lt_web.h). */
#include "lt_web.h"

#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

static void reply(struct evhttp_request *req, int status, const char *reason, const char *type, const void *data,
                  size_t len) {
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", type);
  /* The page talks only to its own origin: no inline script, no other host, never in a frame. */
  evhttp_add_header(h, "Content-Security-Policy",
                    "default-src 'self'; img-src 'self' blob: data:; frame-ancestors 'none'; base-uri 'none'");
  evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
  evhttp_add_header(h, "Referrer-Policy", "no-referrer");
  evhttp_add_header(h, "Cache-Control", "no-cache");
  struct evbuffer *b = evbuffer_new();
  if (b) evbuffer_add(b, data, len);
  evhttp_send_reply(req, status, reason, b);
  if (b) evbuffer_free(b);
}

bool lt_web_serve(struct evhttp_request *req, const char *path) {
  static const char prefix[] = "/dashboard";
  if (!path || strncmp(path, prefix, sizeof prefix - 1) != 0) return false;
  const char *rest = path + sizeof prefix - 1;
  if (*rest != '\0' && *rest != '/') return false;
  if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
    static const char msg[] = "{\"error\":{\"code\":\"method_not_allowed\",\"message\":\"use GET on /dashboard\"}}\n";
    reply(req, 405, NULL, "application/json", msg, sizeof msg - 1);
    return true;
  }
  if (*rest == '\0') { /* relative links need the folder's slash */
    evhttp_add_header(evhttp_request_get_output_headers(req), "Location", "/dashboard/");
    reply(req, 301, "Moved Permanently", "text/plain", "", 0);
    return true;
  }
  const char *name = rest[1] ? rest + 1 : "index.html";
  for (size_t i = 0; i < lt_web_nfiles; i++)
    if (strcmp(lt_web_files[i].name, name) == 0) {
      reply(req, 200, "OK", lt_web_files[i].content_type, lt_web_files[i].data, lt_web_files[i].len);
      return true;
    }
  static const char msg[] = "{\"error\":{\"code\":\"not_found\",\"message\":\"no such dashboard file\"}}\n";
  reply(req, 404, NULL, "application/json", msg, sizeof msg - 1);
  return true;
}
