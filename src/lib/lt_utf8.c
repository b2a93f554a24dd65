/* lt_utf8: see lt_utf8.h. */
#include "lt_utf8.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of the character that starts with byte b (0: b cannot start one). */
static size_t lead_len(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0 && b >= 0xC2) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0 && b <= 0xF4) return 4;
  return 0;
}

/* Whether the need bytes at u form one well-formed character. */
static bool well_formed(const unsigned char *u, size_t need) {
  for (size_t j = 1; j < need; j++)
    if ((u[j] & 0xC0) != 0x80) return false;
  /* Overlong three-byte forms, surrogates and code points above U+10FFFF are not well formed. */
  if (need == 3) return !(u[0] == 0xE0 && u[1] < 0xA0) && !(u[0] == 0xED && u[1] >= 0xA0);
  if (need == 4) return !(u[0] == 0xF0 && u[1] < 0x90) && !(u[0] == 0xF4 && u[1] >= 0x90);
  return true;
}

char *lt_utf8_sanitize(const char *s, size_t len, size_t *out_len) {
  char *o = malloc(3 * len + 1);
  if (!o) return NULL;
  size_t k = 0;
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < len;) {
    size_t need = lead_len(u[i]);
    if (need > 0 && i + need <= len && well_formed(u + i, need)) {
      memcpy(o + k, s + i, need);
      k += need;
      i += need;
    } else {
      memcpy(o + k, "\xEF\xBF\xBD", 3);
      k += 3;
      i++;
    }
  }
  o[k] = '\0';
  *out_len = k;
  return o;
}

size_t lt_utf8_complete(const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  /* A character is at most 4 bytes: look back at most 3 for a lead byte still waiting. */
  for (size_t back = 1; back <= 3 && back <= len; back++) {
    unsigned char b = u[len - back];
    if ((b & 0xC0) == 0x80) continue; /* a continuation byte: keep looking for its lead */
    size_t need = lead_len(b);
    return need > back ? len - back : len;
  }
  return len;
}
