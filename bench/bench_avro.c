/* bench_avro: StepCompleted encode+decode records/s on one core.
 *
 * lt_avro (preallocated records and buffers) against two peers in the same run, same record,
 * same single-object framing:
 *   naive  — avro-c's generic value API as usually written: a new value, writer and reader per
 *            record, avro_value_write / avro_value_read (the peer the issue asks for);
 *   reused — avro-c's generic API with the value, writer and reader reused (its best case;
 *            avro_value_read still allocates per string).
 * Rates are per CPU second of this thread (one core, robust to a shared machine), best of 3.
 * Last line: avro_step_records_per_s. */
#include <avro.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lt_avro.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: one core, even on a busy machine */
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *msg) {
  fprintf(stderr, "bench_avro: %s: %s\n", what, msg);
  exit(1);
}

static volatile int64_t sink;

/* ---- lt_avro ---- */
static void set_step(lt_avro_record_t *w, int64_t i) {
  lt_avro_set_long(w, "step", i);
  lt_avro_set_double(w, "loss", 2.0 - (double)(i & 1023) * 1e-3);
  lt_avro_set_long(w, "elapsed_ms", 1000 + i);
}

static double run_lathe(lt_avro_record_t *w, lt_avro_record_t *r, long n) {
  char err[256];
  double t0 = now_s();
  for (long i = 0; i < n; i++) {
    const uint8_t *b;
    size_t len;
    set_step(w, i);
    if (lt_avro_record_encode(w, &b, &len, err, sizeof err)) die("encode", err);
    if (lt_avro_record_decode(r, b, len, err, sizeof err)) die("decode", err);
    int64_t step;
    lt_avro_get_long(r, "step", &step);
    sink += step;
  }
  return n / (now_s() - t0);
}

/* ---- avro-c generic API ---- */
static void avroc_fill(avro_value_t *v, int64_t i) {
  avro_value_t f;
#define SETS(name, s) (avro_value_get_by_name(v, name, &f, NULL), avro_value_set_string(&f, s))
#define SETL(name, x) (avro_value_get_by_name(v, name, &f, NULL), avro_value_set_long(&f, x))
#define SETI(name, x) (avro_value_get_by_name(v, name, &f, NULL), avro_value_set_int(&f, x))
#define SETD(name, x) (avro_value_get_by_name(v, name, &f, NULL), avro_value_set_double(&f, x))
  SETS("event_id", "6f1c7e52-55a4-4c1e-9e53-1d2a3b4c5d6e");
  SETL("occurred_at", 1764400000000 + i);
  SETS("producer", "worker/w-1");
  SETS("job_id", "job-0001");
  SETS("tenant_id", "tenant-a");
  SETI("attempt", 1);
  SETL("step", i);
  SETL("total_steps", 100000);
  SETD("loss", 2.0 - (double)(i & 1023) * 1e-3);
  SETD("learning_rate", 2e-4);
  SETL("tokens", 4096);
  SETD("tokens_per_s", 812.5);
  SETL("elapsed_ms", 1000 + i);
  SETL("eta_ms", 95000);
  SETD("epoch", 0.5);
  avro_value_t u;
  avro_value_get_by_name(v, "grad_norm", &f, NULL);
  avro_value_set_branch(&f, 1, &u);
  avro_value_set_double(&u, 0.75);
}

static double run_avroc_naive(avro_value_iface_t *iface, const uint8_t hdr[10], long n) {
  static char buf[1024];
  double t0 = now_s();
  for (long i = 0; i < n; i++) {
    avro_value_t v, d, f;
    if (avro_generic_value_new(iface, &v)) die("avro-c", avro_strerror());
    avroc_fill(&v, i);
    memcpy(buf, hdr, 10);
    avro_writer_t wr = avro_writer_memory(buf + 10, sizeof buf - 10);
    if (avro_value_write(wr, &v)) die("avro-c write", avro_strerror());
    int64_t len = avro_writer_tell(wr);
    avro_writer_free(wr);
    if (memcmp(buf, hdr, 10) != 0) die("avro-c", "header");
    avro_reader_t rd = avro_reader_memory(buf + 10, len);
    if (avro_generic_value_new(iface, &d)) die("avro-c", avro_strerror());
    if (avro_value_read(rd, &d)) die("avro-c read", avro_strerror());
    avro_reader_free(rd);
    int64_t step;
    avro_value_get_by_name(&d, "step", &f, NULL);
    avro_value_get_long(&f, &step);
    sink += step;
    avro_value_decref(&d);
    avro_value_decref(&v);
  }
  return n / (now_s() - t0);
}

static double run_avroc_reused(avro_value_iface_t *iface, const uint8_t hdr[10], long n) {
  static char buf[1024];
  avro_value_t v, d, f;
  avro_generic_value_new(iface, &v);
  avro_generic_value_new(iface, &d);
  avro_writer_t wr = avro_writer_memory(buf + 10, sizeof buf - 10);
  avro_reader_t rd = avro_reader_memory(buf + 10, sizeof buf - 10);
  double t0 = now_s();
  for (long i = 0; i < n; i++) {
    avroc_fill(&v, i);
    memcpy(buf, hdr, 10);
    avro_writer_memory_set_dest(wr, buf + 10, sizeof buf - 10);
    if (avro_value_write(wr, &v)) die("avro-c write", avro_strerror());
    int64_t len = avro_writer_tell(wr);
    if (memcmp(buf, hdr, 10) != 0) die("avro-c", "header");
    avro_reader_memory_set_source(rd, buf + 10, len);
    if (avro_value_read(rd, &d)) die("avro-c read", avro_strerror());
    int64_t step;
    avro_value_get_by_name(&d, "step", &f, NULL);
    avro_value_get_long(&f, &step);
    sink += step;
  }
  double rate = n / (now_s() - t0);
  avro_writer_free(wr);
  avro_reader_free(rd);
  avro_value_decref(&d);
  avro_value_decref(&v);
  return rate;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 400000;
  char err[512];
  lt_avro_registry_t *reg;
  if (lt_avro_registry_new(&reg, err, sizeof err)) die("registry", err);
  const lt_avro_schema_t *s = lt_avro_schema_latest(reg, "StepCompleted");
  lt_avro_record_t *w, *r;
  if (lt_avro_record_new(reg, "StepCompleted", &w, err, sizeof err) ||
      lt_avro_record_new(reg, "StepCompleted", &r, err, sizeof err))
    die("record", err);
  /* Same content as the avro-c peers. */
  lt_avro_set_string(w, "event_id", "6f1c7e52-55a4-4c1e-9e53-1d2a3b4c5d6e");
  lt_avro_set_long(w, "occurred_at", 1764400000000);
  lt_avro_set_string(w, "producer", "worker/w-1");
  lt_avro_set_string(w, "job_id", "job-0001");
  lt_avro_set_string(w, "tenant_id", "tenant-a");
  lt_avro_set_int(w, "attempt", 1);
  lt_avro_set_long(w, "total_steps", 100000);
  lt_avro_set_double(w, "learning_rate", 2e-4);
  lt_avro_set_long(w, "tokens", 4096);
  lt_avro_set_double(w, "tokens_per_s", 812.5);
  lt_avro_set_long(w, "eta_ms", 95000);
  lt_avro_set_double(w, "epoch", 0.5);
  lt_avro_set_double(w, "grad_norm", 0.75);
  const uint8_t *b;
  size_t len;
  if (lt_avro_record_encode(w, &b, &len, err, sizeof err)) die("encode", err);

  size_t jl;
  avro_schema_t as;
  const char *js = lt_avro_schema_json(s, &jl);
  if (avro_schema_from_json_length(js, jl, &as)) die("avro-c schema", avro_strerror());
  avro_value_iface_t *iface = avro_generic_class_from_schema(as);
  uint8_t hdr[10] = {0xC3, 0x01};
  for (int i = 0; i < 8; i++) hdr[2 + i] = (uint8_t)(lt_avro_schema_fingerprint(s) >> (8 * i));

  double lathe = 0, naive = 0, reused = 0;
  run_lathe(w, r, n / 10); /* warm up */
  for (int rep = 0; rep < 3; rep++) {
    double x = run_lathe(w, r, n);
    if (x > lathe) lathe = x;
    x = run_avroc_naive(iface, hdr, n / 2);
    if (x > naive) naive = x;
    x = run_avroc_reused(iface, hdr, n / 2);
    if (x > reused) reused = x;
  }
  printf("record: StepCompleted v%d, %zu bytes single-object\n", lt_avro_schema_version(s), len);
  printf("lt_avro encode+decode:                 %10.0f records/s\n", lathe);
  printf("avro-c generic, naive (peer):          %10.0f records/s\n", naive);
  printf("avro-c generic, value/io reused:       %10.0f records/s\n", reused);
  printf("ratio lt_avro / avro-c naive:          %10.2f\n", lathe / naive);
  printf("ratio lt_avro / avro-c reused:         %10.2f\n", lathe / reused);
  printf("avro_step_records_per_s: %.0f\n", lathe);
  avro_value_iface_decref(iface);
  avro_schema_decref(as);
  lt_avro_record_destroy(w);
  lt_avro_record_destroy(r);
  lt_avro_registry_destroy(reg);
  return 0;
}
