// Two processes run a float32 sum allreduce of one buffer (1 MiB by default) in two ways,
// taking turns in blocks of 200 calls, and print each block's median time per call (the
// slower process's):
//   slot    as pyring's shm link does it: each half goes through a shared slot. Reduce-scatter:
//           a rank copies the peer's half of its buffer into the peer's slot, the peer adds
//           the slot into its own half. Allgather: a rank copies its summed half into the
//           peer's slot, the peer copies it out. Copies stream (non-temporal stores) from
//           STREAM_FROM bytes on, as pyring's timed choice does in the machine's slow state.
//   shared  the two buffers live in one mapping that both processes see (a buffer that the
//           ranks registered): a rank adds the peer's half straight into its own, then copies
//           the peer's summed half straight out of the peer's buffer. No slot, no copy in.
// Each call ends with both ranks done reading the other's memory. Both ways give the same
// sums (checked at the end).
//   gcc -O3 -mavx2 -o /tmp/shared_ar bench/probes/shared_allreduce.c
//   /tmp/shared_ar [bytes] [blocks] [pin: 0 or 1]
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CALLS 200
#define STREAM_FROM (128 << 10)
typedef struct {
  volatile uint64_t step[2][16];  // per rank, one cache line each: the last phase it finished
  double t[2][CALLS];
} Ctl;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static void copy(float* d, const float* s, size_t n) {
  if (n * 4 < STREAM_FROM) {
    memcpy(d, s, n * 4);
    return;
  }
  for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(d + i, _mm256_loadu_ps(s + i));
  _mm_sfence();
}
static void add(float* d, const float* s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}
static void post(Ctl* c, int r, uint64_t v) {
  __atomic_store_n(&c->step[r][0], v, __ATOMIC_RELEASE);
}
static void wait_for(Ctl* c, int r, uint64_t v) {
  while (__atomic_load_n(&c->step[r][0], __ATOMIC_ACQUIRE) < v) _mm_pause();
}
static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], 0, 10) : (1 << 20);
  int blocks = argc > 2 ? atoi(argv[2]) : 10, pinned = argc > 3 ? atoi(argv[3]) : 0;
  size_t n = bytes / 4, h = n / 2;
  Ctl* c = mmap(0, sizeof(Ctl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  // buf[r]: rank r's buffer (in the shared mapping, as a registered buffer would be);
  // slot[r]: the slot that rank r reads from.
  float* mem = mmap(0, 4 * bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  float *buf[2] = {mem, mem + n}, *slot[2] = {mem + 2 * n, mem + 3 * n};
  int r = fork() == 0;
  if (pinned) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(r, &s);
    sched_setaffinity(0, sizeof s, &s);
  }
  float *mine = buf[r], *peer = buf[1 - r];
  float* my_half = mine + (size_t)r * h;  // rank r owns half r
  size_t other = (size_t)(1 - r) * h;
  uint64_t phase = 0;
  for (int b = 0; b < 2 * blocks; ++b) {
    int shared = b & 1;
    for (int k = 0; k < CALLS + 20; ++k) {
      for (size_t i = 0; i < n; ++i) mine[i] = (float)(r + 1);
      post(c, r, ++phase);  // both buffers are written before either call starts
      wait_for(c, 1 - r, phase);
      double t0 = now();
      if (shared) {
        add(my_half, peer + (size_t)r * h, h);
        post(c, r, ++phase);
        wait_for(c, 1 - r, phase);
        memcpy(mine + other, peer + other, h * 4);
      } else {
        copy(slot[1 - r], mine + other, h);
        post(c, r, ++phase);
        wait_for(c, 1 - r, phase);
        add(my_half, slot[r], h);
        post(c, r, ++phase);  // my slot is read: the peer may write it again
        wait_for(c, 1 - r, phase);
        copy(slot[1 - r], my_half, h);
        post(c, r, ++phase);
        wait_for(c, 1 - r, phase);
        memcpy(mine + other, slot[r], h * 4);
      }
      post(c, r, ++phase);  // done reading the peer's memory
      wait_for(c, 1 - r, phase);
      if (k >= 20) c->t[r][k - 20] = now() - t0;
      post(c, r, ++phase);
      wait_for(c, 1 - r, phase);
    }
    for (size_t i = 0; i < n; ++i) {
      if (mine[i] != 3.0f) {
        fprintf(stderr, "rank %d: wrong sum %g at %zu (%s)\n", r, mine[i], i,
                shared ? "shared" : "slot");
        return 1;
      }
    }
    if (r == 0) {
      double m[CALLS];
      for (int k = 0; k < CALLS; ++k) m[k] = c->t[0][k] > c->t[1][k] ? c->t[0][k] : c->t[1][k];
      qsort(m, CALLS, sizeof m[0], cmp);
      printf("%s %.2f\n", shared ? "shared" : "slot", m[CALLS / 2]);
      fflush(stdout);
    }
    post(c, r, ++phase);
    wait_for(c, 1 - r, phase);
  }
  if (r) return 0;
  int status = 0;
  wait(&status);
  return WEXITSTATUS(status);
}
