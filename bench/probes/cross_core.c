// Two processes, one per core, move a float32 buffer (64 MiB by default) in several ways,
// taking turns in blocks, and print each block's median time per call (the slower process's)
// and its speed over `local`'s in the same round:
//   local      each rank copies its own buffer into its own output (bench/allreduce.py's
//              memcpy row: the memory system's pace with both cores copying);
//   pull       each rank copies the peer's buffer into its own output (reads lines the peer's
//              core wrote);
//   push       each rank copies its own buffer into the peer's output, non-temporal stores;
//   scatter    the two-shot zero-copy all_reduce at 2 ranks as pyring runs it: rank r sums
//              half r of both buffers into a tile and copies the tile into both buffers;
//              -32k-nt with a 32 KiB tile and non-temporal stores, -1k-nt with a 1 KiB tile
//              and non-temporal stores, -1k with a 1 KiB tile and cached stores;
//   gather     the other two-shot: rank r adds half r of the peer's buffer into its own, then,
//              after a flag, copies the peer's summed half into its own buffer (non-temporal).
// Every call of scatter and gather reads and writes as many bytes as local, half of them the
// peer's; pull and push show what crossing between the cores costs each way. Before each call
// each rank rewrites its own buffer, as a backward pass leaves a gradient.
//   gcc -O3 -mavx2 -o /tmp/cross_core bench/probes/cross_core.c
//   /tmp/cross_core [bytes] [rounds] [calls per block]
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

#define MAX_CALLS 64
#define KINDS 7
#define BIG_TILE 8192  // floats: 32 KiB
#define TILE 256       // floats: 1 KiB
static const char* kName[KINDS] = {"local",         "pull",       "push",  "scatter-32k-nt",
                                   "scatter-1k-nt", "scatter-1k", "gather"};

typedef struct {
  volatile uint64_t step[2][16];  // per rank, one cache line each: the last phase it finished
  double t[2][MAX_CALLS];
} Ctl;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static void stream_unfenced(float* d, const float* s, size_t n) {
  for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(d + i, _mm256_loadu_ps(s + i));
}
static void stream(float* d, const float* s, size_t n) {
  stream_unfenced(d, s, n);
  _mm_sfence();
}
// Rank r's share of the scatter two-shot: half [lo, lo + h) of both buffers, tile by tile.
static void scatter(float* mine, float* peer, size_t lo, size_t h, size_t tile_n, int nt) {
  static float tile[BIG_TILE] __attribute__((aligned(64)));
  for (size_t at = lo; at < lo + h; at += tile_n) {
    for (size_t i = 0; i < tile_n; i += 8) {
      _mm256_store_ps(
          tile + i, _mm256_add_ps(_mm256_loadu_ps(peer + at + i), _mm256_loadu_ps(mine + at + i)));
    }
    if (nt) {
      stream_unfenced(mine + at, tile, tile_n);
      stream_unfenced(peer + at, tile, tile_n);
    } else {
      memcpy(mine + at, tile, tile_n * 4);
      memcpy(peer + at, tile, tile_n * 4);
    }
  }
  if (nt) _mm_sfence();
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
  size_t bytes = argc > 1 ? strtoull(argv[1], 0, 10) : (64u << 20);
  int rounds = argc > 2 ? atoi(argv[2]) : 5, calls = argc > 3 ? atoi(argv[3]) : 10;
  if (calls < 1 || calls > MAX_CALLS || bytes % (2 * BIG_TILE * 4)) {
    fprintf(stderr, "calls must be 1-%d and bytes a multiple of %d\n", MAX_CALLS, 2 * BIG_TILE * 4);
    return 2;
  }
  size_t n = bytes / 4, h = n / 2;
  Ctl* c = mmap(0, sizeof(Ctl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  // buf[r], out[r]: rank r's buffer and output, in one mapping both processes see.
  float* mem = mmap(0, 4 * bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  float *buf[2] = {mem, mem + n}, *out[2] = {mem + 2 * n, mem + 3 * n};
  int r = fork() == 0;
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(r, &s);
  sched_setaffinity(0, sizeof s, &s);
  float *mine = buf[r], *peer = buf[1 - r];
  const size_t lo = (size_t)r * h, other = (size_t)(1 - r) * h;
  uint64_t phase = 0;
  double median[KINDS];
  for (int round = 0; round < rounds; ++round) {
    for (int kind = 0; kind < KINDS; ++kind) {
      for (int k = 0; k < calls + 2; ++k) {
        for (size_t i = 0; i < n; ++i) mine[i] = (float)(r + 1);
        post(c, r, ++phase);  // both buffers are written before either call starts
        wait_for(c, 1 - r, phase);
        double t0 = now();
        switch (kind) {
          case 0:
            memcpy(out[r], mine, bytes);
            break;
          case 1:
            memcpy(out[r], peer, bytes);
            break;
          case 2:
            stream(out[1 - r], mine, n);
            break;
          case 3:
            scatter(mine, peer, lo, h, BIG_TILE, 1);
            break;
          case 4:
            scatter(mine, peer, lo, h, TILE, 1);
            break;
          case 5:
            scatter(mine, peer, lo, h, TILE, 0);
            break;
          case 6:
            for (size_t i = lo; i < lo + h; ++i) mine[i] += peer[i];
            post(c, r, ++phase);
            wait_for(c, 1 - r, phase);
            stream(mine + other, peer + other, h);
            break;
        }
        post(c, r, ++phase);  // done with the peer's memory
        wait_for(c, 1 - r, phase);
        if (k >= 2) c->t[r][k - 2] = now() - t0;
        if (kind >= 3) {
          for (size_t i = 0; i < n; i += 4099) {
            if (mine[i] != 3.0f) {
              fprintf(stderr, "rank %d: wrong sum %g at %zu (%s)\n", r, mine[i], i, kName[kind]);
              return 1;
            }
          }
        }
        post(c, r, ++phase);
        wait_for(c, 1 - r, phase);
      }
      if (r == 0) {
        double m[MAX_CALLS];
        for (int k = 0; k < calls; ++k) m[k] = c->t[0][k] > c->t[1][k] ? c->t[0][k] : c->t[1][k];
        qsort(m, calls, sizeof m[0], cmp);
        median[kind] = m[calls / 2];
      }
      post(c, r, ++phase);
      wait_for(c, 1 - r, phase);
    }
    if (r == 0) {
      printf("round %d:", round);
      for (int kind = 0; kind < KINDS; ++kind) {
        printf("  %s %.0f us (%.2f)", kName[kind], median[kind], median[0] / median[kind]);
      }
      printf("\n");
      fflush(stdout);
    }
  }
  if (r) return 0;
  int status = 0;
  wait(&status);
  return WEXITSTATUS(status);
}
