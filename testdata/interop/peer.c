/*
 * A libmemcached peer for interop_test.go, compiled by the test:
 *
 *   peer SERVERS write|read PREFIX COUNT
 *
 * SERVERS is host:port:weight,... . write sets PREFIX0 .. PREFIX(COUNT-1),
 * each to its own key as the value; read gets them and prints how many it
 * found with the right value. It exits non-zero on any other error.
 */
#include <libmemcached/memcached.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH 100

static void die(memcached_st *m, const char *what, memcached_return_t rc) {
  fprintf(stderr, "%s: %s\n", what, memcached_strerror(m, rc));
  exit(1);
}

int main(int argc, char **argv) {
  if (argc != 5 || (strcmp(argv[2], "write") && strcmp(argv[2], "read"))) {
    fprintf(stderr, "usage: peer host:port:weight,... write|read PREFIX COUNT\n");
    return 2;
  }
  int reading = !strcmp(argv[2], "read");
  const char *prefix = argv[3];
  long count = atol(argv[4]);

  memcached_st *m = memcached_create(NULL);
  /* The mode under test: weighted ketama, which also sets md5 for both the
   * keys and the points, and the consistent distribution. */
  memcached_return_t rc = memcached_behavior_set(m, MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED, 1);
  if (rc != MEMCACHED_SUCCESS) die(m, "KETAMA_WEIGHTED", rc);
  for (char *s = strtok(argv[1], ","); s; s = strtok(NULL, ",")) {
    char host[256];
    unsigned port, weight;
    if (sscanf(s, "%255[^:]:%u:%u", host, &port, &weight) != 3) {
      fprintf(stderr, "bad server %s\n", s);
      return 2;
    }
    rc = memcached_server_add_with_weight(m, host, (in_port_t)port, weight);
    if (rc != MEMCACHED_SUCCESS) die(m, "memcached_server_add_with_weight", rc);
  }

  static char keys[BATCH][250];
  const char *ptrs[BATCH];
  size_t lens[BATCH];
  long hits = 0;
  for (long i = 0; i < count; i += BATCH) {
    int n = 0;
    for (; n < BATCH && i + n < count; n++) {
      lens[n] = (size_t)snprintf(keys[n], sizeof keys[n], "%s%ld", prefix, i + n);
      ptrs[n] = keys[n];
      if (!reading) {
        rc = memcached_set(m, keys[n], lens[n], keys[n], lens[n], 0, 0);
        if (rc != MEMCACHED_SUCCESS) die(m, keys[n], rc);
      }
    }
    if (!reading) continue;
    rc = memcached_mget(m, ptrs, lens, (size_t)n);
    if (rc != MEMCACHED_SUCCESS) die(m, "memcached_mget", rc);
    memcached_result_st *r;
    while ((r = memcached_fetch_result(m, NULL, &rc)) != NULL) {
      size_t kl = memcached_result_key_length(r), vl = memcached_result_length(r);
      if (kl == vl && !memcmp(memcached_result_key_value(r), memcached_result_value(r), kl)) hits++;
      memcached_result_free(r);
    }
    if (rc != MEMCACHED_END && rc != MEMCACHED_SUCCESS && rc != MEMCACHED_NOTFOUND) die(m, "memcached_fetch_result", rc);
  }
  if (reading) printf("%ld\n", hits);
  memcached_free(m);
  return 0;
}
