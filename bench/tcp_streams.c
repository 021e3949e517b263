// The loopback TCP ceiling of a 2-rank exchange, by how the bytes are moved.
//
//   cc -O2 -pthread bench/tcp_streams.c -o /tmp/tcp_streams && /tmp/tcp_streams [MiB] [rounds]
//
// Two processes (fork) on 127.0.0.1 each send S bytes to the other and receive S bytes, which
// is what one 2-rank allreduce of S bytes must move. Variants, taking turns round by round:
//   streams=K   K connections, one thread each moving S/K bytes with non-blocking send/recv
//   vmsplice    one connection; sends go vmsplice (user pages into a pipe) + splice (pipe to
//               socket), which skips the sender's copy into socket buffers
// Prints one JSON line per variant: mean and best milliseconds over the rounds, as the slower
// process saw them (each process times its own exchange; the parent reports the maximum).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAX_STREAMS = 4, NVARIANTS = 4, CHUNK = 1 << 20 };
static const int kStreams[NVARIANTS] = {1, 2, 4, 1};  // the last is vmsplice

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char* what) {
  perror(what);
  exit(1);
}

struct job {
  int fd, splice;
  char *out, *in;
  size_t n;
};

static void* exchange(void* arg) {
  struct job* j = arg;
  size_t sent = 0, got = 0, piped = 0;
  int pipefd[2];
  if (j->splice) {
    if (pipe(pipefd) != 0) die("pipe");
    fcntl(pipefd[0], F_SETPIPE_SZ, CHUNK);
  }
  while (sent < j->n || got < j->n) {
    if (sent < j->n) {
      size_t want = j->n - sent < CHUNK ? j->n - sent : CHUNK;
      ssize_t k;
      if (!j->splice) {
        k = send(j->fd, j->out + sent, want, MSG_DONTWAIT | MSG_NOSIGNAL);
      } else {
        if (piped == 0) {
          struct iovec v = {j->out + sent, want};
          ssize_t m = vmsplice(pipefd[1], &v, 1, SPLICE_F_NONBLOCK);
          if (m > 0) piped = (size_t)m;
        }
        k = piped ? splice(pipefd[0], NULL, j->fd, NULL, piped, SPLICE_F_NONBLOCK | SPLICE_F_MOVE)
                  : -1;
        if (k > 0) piped -= (size_t)k;
        if (k < 0 && piped == 0) errno = EAGAIN;
      }
      if (k > 0) sent += (size_t)k;
      else if (k < 0 && errno != EAGAIN) die("send");
    }
    if (got < j->n) {
      ssize_t k = recv(j->fd, j->in + got, j->n - got, MSG_DONTWAIT);
      if (k > 0) got += (size_t)k;
      else if (k == 0) die("peer closed");
      else if (errno != EAGAIN) die("recv");
    }
  }
  if (j->splice) close(pipefd[0]), close(pipefd[1]);
  return NULL;
}

int main(int argc, char** argv) {
  size_t bytes = (size_t)(argc > 1 ? atoi(argv[1]) : 64) << 20;
  int rounds = argc > 2 ? atoi(argv[2]) : 10, one = 1;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (bind(ls, (void*)&a, sizeof a) || getsockname(ls, (void*)&a, &len) || listen(ls, 8))
    die("listen");
  int report[2];
  if (pipe(report) != 0) die("pipe");
  pid_t child = fork();
  int fd[MAX_STREAMS];
  for (int i = 0; i < MAX_STREAMS; i++) {
    if (child == 0) {
      fd[i] = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd[i], (void*)&a, sizeof a)) die("connect");
    } else if ((fd[i] = accept(ls, NULL, NULL)) < 0) {
      die("accept");
    }
    setsockopt(fd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  char *out = aligned_alloc(4096, bytes), *in = aligned_alloc(4096, bytes);
  if (!out || !in) die("alloc");
  memset(out, child ? 1 : 2, bytes);
  double times[NVARIANTS][64];
  if (rounds > 64) rounds = 64;
  for (int r = 0; r < rounds; r++) {
    for (int v = 0; v < NVARIANTS; v++) {
      int ns = kStreams[v];
      char c = 0;
      if (write(fd[0], &c, 1) != 1 || read(fd[0], &c, 1) != 1) die("sync");
      memset(in, 0, bytes);
      pthread_t th[MAX_STREAMS];
      struct job j[MAX_STREAMS];
      double t0 = now();
      for (int i = 0; i < ns; i++) {
        size_t part = bytes / ns;
        j[i] = (struct job){fd[i], v == NVARIANTS - 1, out + i * part, in + i * part, part};
        pthread_create(&th[i], NULL, exchange, &j[i]);
      }
      for (int i = 0; i < ns; i++) pthread_join(th[i], NULL);
      times[v][r] = now() - t0;
      if (in[0] != (child ? 2 : 1) || in[bytes - 1] != (child ? 2 : 1)) die("wrong bytes");
    }
  }
  if (child == 0) {
    if (write(report[1], times, sizeof times) != sizeof times) die("report");
    return 0;
  }
  double theirs[NVARIANTS][64];
  if (read(report[0], theirs, sizeof theirs) != sizeof theirs) die("report");
  waitpid(child, NULL, 0);
  for (int v = 0; v < NVARIANTS; v++) {
    double sum = 0, best = 1e9;
    for (int r = 0; r < rounds; r++) {
      double t = times[v][r] > theirs[v][r] ? times[v][r] : theirs[v][r];
      sum += t;
      best = t < best ? t : best;
    }
    printf("{\"variant\": \"%s\", \"streams\": %d, \"bytes\": %zu, \"rounds\": %d, "
           "\"mean_ms\": %.2f, \"best_ms\": %.2f}\n",
           v == NVARIANTS - 1 ? "vmsplice" : "send/recv", kStreams[v], bytes, rounds,
           sum / rounds * 1e3, best * 1e3);
  }
  return 0;
}
