/*
 * A libmemcached peer for interop_test.go, compiled by the test:
 *
 *   peer SERVERS write|read PREFIX COUNT
 *
 * SERVERS is host:port:weight,..., split at the last two colons, so that
 * an IPv6 host is written bare, as libmemcached takes it (::1:11212:1).
 * write sets PREFIX0 .. PREFIX(COUNT-1), each to its own key as the value;
 * read gets them and prints how many it found with the right value; locate
 * prints each key's server, key TAB host:port a line, from
 * memcached_server_by_key, which connects to nothing. It exits non-zero on
 * any other error.
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
  if (argc != 5 || (strcmp(argv[2], "write") && strcmp(argv[2], "read") && strcmp(argv[2], "locate"))) {
    fprintf(stderr, "usage: peer host:port:weight,... write|read|locate PREFIX COUNT\n");
    return 2;
  }
  int reading = !strcmp(argv[2], "read"), locating = !strcmp(argv[2], "locate");
  const char *prefix = argv[3];
  long count = atol(argv[4]);

  memcached_st *m = memcached_create(NULL);
  /* The mode under test: weighted ketama, which also sets md5 for both the
   * keys and the points, and the consistent distribution. */
  memcached_return_t rc = memcached_behavior_set(m, MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED, 1);
  if (rc != MEMCACHED_SUCCESS) die(m, "KETAMA_WEIGHTED", rc);
  for (char *s = strtok(argv[1], ","); s; s = strtok(NULL, ",")) {
    char *w = strrchr(s, ':'), *p = NULL;
    unsigned port, weight;
    if (w) {
      *w = 0;
      p = strrchr(s, ':');
    }
    if (!p || sscanf(p + 1, "%u", &port) != 1 || sscanf(w + 1, "%u", &weight) != 1) {
      fprintf(stderr, "bad server %s\n", s);
      return 2;
    }
    *p = 0; /* s is the host */
    rc = memcached_server_add_with_weight(m, s, (in_port_t)port, weight);
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
      if (locating) {
        const memcached_instance_st *srv = memcached_server_by_key(m, keys[n], lens[n], &rc);
        if (srv == NULL) die(m, "memcached_server_by_key", rc);
        printf("%s\t%s:%u\n", keys[n], memcached_server_name(srv), (unsigned)memcached_server_port(srv));
        continue;
      }
      if (!reading) {
        rc = memcached_set(m, keys[n], lens[n], keys[n], lens[n], 0, 0);
        if (rc != MEMCACHED_SUCCESS) die(m, keys[n], rc);
      }
    }
    if (!reading) continue; /* written or located */
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
