/* lt_recmac: a MAC on security-relevant records (docs/DESIGN.md §5a, defence in depth).
 *
 * The bus's ACLs say who may write lathe.tenants and lathe.audit; the MAC says the record was made
 * by a process that holds the master key. A principal that gets write access to the topic (a
 * leaked credential, a misconfigured ACL) still cannot forge a tenant's API key or a staff grant:
 * consumers refuse a record whose MAC is missing or wrong.
 *
 * The MAC is HMAC-SHA256 under a key derived from the master key with one label per purpose (a
 * MAC made for tenants does not verify on audit), over the topic's base name, the record key and
 * the value, each with its length, so no field can be moved into another. It travels in the
 * record header LT_RECMAC_HEADER. */
#ifndef LT_RECMAC_H
#define LT_RECMAC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_bus.h"
#include "lt_crypto.h"
#include "lt_err.h"

#define LT_RECMAC_HEADER "lathe-mac"
#define LT_RECMAC_BYTES 32

typedef enum lt_recmac_purpose {
  LT_RECMAC_TENANTS,  /* TenantUpserted on lathe.tenants */
  LT_RECMAC_AUDIT,    /* Access* records on lathe.audit */
  LT_RECMAC_OPERATOR  /* an operator's requests on lathe.control (WorkerDrainRequested) */
} lt_recmac_purpose_t;

typedef struct lt_recmac_key lt_recmac_key_t;

lt_err_t lt_recmac_key_new(const lt_crypto_kek_t *kek, lt_recmac_purpose_t purpose, lt_recmac_key_t **out,
                           char *errstr, size_t errstr_size);
void lt_recmac_key_destroy(lt_recmac_key_t *k); /* zeroes the key; NULL is fine */

/* The MAC of (topic_base, key, value). topic_base is the name without the prefix ("tenants"), so
 * a record keeps its MAC when topics are mirrored under another prefix. */
void lt_recmac_sign(const lt_recmac_key_t *k, const char *topic_base, const void *key, size_t key_len,
                    const void *value, size_t value_len, uint8_t out[LT_RECMAC_BYTES]);

/* True when mac (mac_len bytes) is the MAC of (topic_base, key, value); constant time. */
bool lt_recmac_verify(const lt_recmac_key_t *k, const char *topic_base, const void *key, size_t key_len,
                      const void *value, size_t value_len, const void *mac, size_t mac_len);

/* lt_recmac_verify on a consumed record's key, value and LT_RECMAC_HEADER; false with the reason
 * ("no lathe-mac header", "the record MAC does not verify") in errstr. */
bool lt_recmac_msg_ok(const lt_recmac_key_t *k, const char *topic_base, const lt_bus_msg_t *m, char *errstr,
                      size_t errstr_size);

/* Writes value under key to topic (full name; its base name topic_base goes into the MAC) with the
 * MAC in LT_RECMAC_HEADER, and waits up to timeout_ms for the durable acknowledgement
 * (lt_bus_produce_sync). */
lt_err_t lt_recmac_produce_sync(lt_bus_producer_t *p, const lt_recmac_key_t *k, const char *topic,
                                const char *topic_base, const char *key, const void *value, size_t value_len,
                                int timeout_ms, char *errstr, size_t errstr_size);

#endif
