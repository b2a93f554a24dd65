/* lt_utf8: well-formed UTF-8 for what customers read. Token ids of single bytes may cut a
 * character in two; a reply must still be valid UTF-8 (JSON, SSE). */
#ifndef LT_UTF8_H
#define LT_UTF8_H

#include <stddef.h>

/* A copy of the len bytes at s with every byte that is not part of well-formed UTF-8 replaced by
 * U+FFFD (as Hugging Face's decode does), NUL-terminated; *out_len its length. NULL: no memory. */
char *lt_utf8_sanitize(const char *s, size_t len, size_t *out_len);

/* The length of the longest prefix of s[0..len) that does not end inside a character that more
 * bytes could still complete: a stream holds back what lt_utf8_complete leaves out until the next
 * token arrives. */
size_t lt_utf8_complete(const char *s, size_t len);

#endif
