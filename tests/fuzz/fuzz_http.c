/* fuzz_http: the layer of the API's request handling that Lathe writes (libevent parses the
 * request line and headers; what Lathe does with them is here): the router's reading of a path
 * (lt_api_match: route families, {id}/{name}/{n}, the route table), the multipart/form-data of
 * POST /v1/files (lt_api_header_param, lt_api_form_parse) and OpenAI's fine-tuning job body
 * (lt_api_openai_job_spec, mapped onto the job spec), and a training session's call body
 * (lt_callspec_parse, lt_callspec_check: POST /v1/sessions/{id}/calls).
 *
 * First byte: mode (modulo 5); the rest:
 *   0  a method byte, then a request URI, decoded as lathed decodes it (evhttp_uri_parse,
 *      evhttp_uridecode, no NUL), then matched
 *   1  a Content-Type value up to the first '\n', then the body
 *   2  a POST /v1/fine_tuning/jobs body
 *   3  a Content-Disposition line up to the first '\n': its name and filename parameters
 *   4  a vocabulary size byte, then a session call's body
 * Properties: a match names only what its family has (the prefix is the path's, an {id} is an
 * id, a handler only for a pattern of the table); multipart parts lie inside the body, in order,
 * with terminated names; an accepted OpenAI body is a spec that validates; an accepted call
 * is accepted again, as the same kind, from its own JSON text. */
#include <string.h>

#include "fuzz.h"
#include "lt_api_int.h"
#include "lt_callspec.h"
#include "lt_jobspec.h"

static void fuzz_route(const uint8_t *data, size_t size) {
  static const int methods[] = {EVHTTP_REQ_GET, EVHTTP_REQ_POST, EVHTTP_REQ_PUT, EVHTTP_REQ_DELETE,
                                EVHTTP_REQ_HEAD, EVHTTP_REQ_PATCH};
  int method = methods[fuzz_take(&data, &size) % (sizeof methods / sizeof *methods)];
  char *uri = strndup((const char *)data, size);
  struct evhttp_uri *parsed = evhttp_uri_parse(uri);
  const char *path = parsed ? evhttp_uri_get_path(parsed) : NULL;
  size_t dlen = 0;
  char *decoded = path ? evhttp_uridecode(path, 0, &dlen) : NULL;
  if (decoded && strlen(decoded) == dlen) {
    lt_api_match_t m, again;
    lt_api_match(decoded, method, &m);
    lt_api_match(decoded, method, &again);
    FUZZ_CHECK(memcmp(&m, &again, sizeof m) == 0, "matching %s twice differs", decoded);
    if (m.family < 0) {
      FUZZ_CHECK(!m.parsed && !m.handler, "no family but parsed");
    } else {
      size_t pl = strlen(m.prefix);
      FUZZ_CHECK(strncmp(decoded, m.prefix, pl) == 0 && strchr("/?", decoded[pl]) != NULL,
                 "%s matched under %s", decoded, m.prefix);
      FUZZ_CHECK(strlen(m.id) <= LT_ID_MAX && memchr(m.name, 0, sizeof m.name) &&
                     memchr(m.pattern, 0, sizeof m.pattern),
                 "parts of %s overflow", decoded);
      FUZZ_CHECK(strncmp(m.pattern, m.prefix, pl) == 0, "pattern %s is not under %s", m.pattern, m.prefix);
      FUZZ_CHECK(!m.handler || m.parsed, "a handler for a path the family does not have: %s", decoded);
      FUZZ_CHECK(!m.id[0] || !strchr(m.id, '/'), "{id} %s holds a slash", m.id);
      if (m.parsed && m.id[0] && (!strcmp(m.prefix, "/v1/datasets") || !strcmp(m.prefix, "/v1/files")))
        FUZZ_CHECK(lt_id_valid(m.id), "dataset id %s is not an id", m.id);
    }
  }
  free(decoded);
  if (parsed) evhttp_uri_free(parsed);
  free(uri);
}

static void fuzz_multipart(const uint8_t *data, size_t size) {
  const uint8_t *nl = memchr(data, '\n', size);
  if (!nl) return;
  char *ct = strndup((const char *)data, (size_t)(nl - data));
  size_t len = size - (size_t)(nl + 1 - data);
  char *body = malloc(len ? len : 1); /* exactly the body: an overread is seen */
  memcpy(body, nl + 1, len);
  char boundary[80];
  if (lt_api_header_param(ct, "boundary", boundary, sizeof boundary)) {
    FUZZ_CHECK(boundary[0] && strlen(boundary) < sizeof boundary, "empty boundary accepted");
    lt_api_form_part_t parts[8];
    int n = -1;
    if (lt_api_form_parse(body, len, boundary, parts, 8, &n)) {
      FUZZ_CHECK(n >= 0 && n <= 8, "%d parts", n);
      const char *prev_end = body;
      for (int i = 0; i < n; i++) {
        FUZZ_CHECK(parts[i].data >= prev_end && parts[i].data + parts[i].len <= body + len,
                   "part %d lies outside the body or before the previous one", i);
        FUZZ_CHECK(memchr(parts[i].name, 0, sizeof parts[i].name) &&
                       memchr(parts[i].filename, 0, sizeof parts[i].filename),
                   "part %d's name is not terminated", i);
        prev_end = parts[i].data + parts[i].len;
      }
    }
  }
  free(body);
  free(ct);
}

static void fuzz_openai_body(const uint8_t *data, size_t size) {
  lt_jobspec_t *spec = calloc(1, sizeof *spec);
  char field[LT_API_FIELD_MAX] = "", msg[512] = "";
  if (lt_api_openai_job_spec((const char *)data, size, spec, field, sizeof field, msg, sizeof msg)) {
    char f2[96], m2[256];
    FUZZ_CHECK(lt_jobspec_validate(spec, f2, sizeof f2, m2, sizeof m2) == LT_OK, "accepted, yet invalid: %s", m2);
  } else {
    FUZZ_CHECK(msg[0] != '\0', "refused without a message");
  }
  free(spec);
}

static void fuzz_disposition(const uint8_t *data, size_t size) {
  const uint8_t *nl = memchr(data, '\n', size);
  char *h = strndup((const char *)data, nl ? (size_t)(nl - data) : size);
  char name[64], filename[128];
  if (lt_api_header_param(h, "name", name, sizeof name)) FUZZ_CHECK(name[0], "empty name accepted");
  if (lt_api_header_param(h, "filename", filename, sizeof filename)) FUZZ_CHECK(filename[0], "empty filename");
  free(h);
}

static void fuzz_call(const uint8_t *data, size_t size) {
  lt_callspec_limits_t lim = {.vocab_size = 1 + fuzz_take(&data, &size) * 4, .max_tokens_per_call = 4096};
  char field[128], msg[256];
  json_t *body = lt_callspec_parse((const char *)data, size, field, sizeof field, msg, sizeof msg);
  const char *kind = NULL;
  if (body && lt_callspec_check(body, &lim, &kind, field, sizeof field, msg, sizeof msg) == LT_OK) {
    char *text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
    FUZZ_CHECK(text != NULL, "an accepted call has no JSON text");
    json_t *again = lt_callspec_parse(text, strlen(text), field, sizeof field, msg, sizeof msg);
    const char *kind2 = NULL;
    FUZZ_CHECK(again && lt_callspec_check(again, &lim, &kind2, field, sizeof field, msg, sizeof msg) == LT_OK &&
                   strcmp(kind, kind2) == 0,
               "an accepted call's own text is refused: %s: %s (%s)", field, msg, text);
    json_decref(again);
    free(text);
  }
  json_decref(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  switch (fuzz_take(&data, &size) % 5) {
  case 0: fuzz_route(data, size); break;
  case 1: fuzz_multipart(data, size); break;
  case 2: fuzz_openai_body(data, size); break;
  case 3: fuzz_disposition(data, size); break;
  default: fuzz_call(data, size); break;
  }
  return 0;
}
