// An LD_PRELOAD shim that caps every TCP connection of a process at FLOW_CAP_BYTES_PER_S
// (SO_MAX_PACING_RATE, which the kernel's TCP pacing enforces per socket, loopback included):
// a path whose single flows are rate-limited, as many cloud networks limit each flow, while
// their sum is not. bench/interleaved.py --flow-cap builds and loads it.
//
//   cc -O2 -shared -fPIC bench/flow_cap.c -o flow_cap.so -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/socket.h>

static void cap(int fd) {
  const char* v = getenv("FLOW_CAP_BYTES_PER_S");
  unsigned long rate = v ? strtoul(v, NULL, 10) : 0;
  if (fd >= 0 && rate > 0) setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof rate);
}

int socket(int domain, int type, int protocol) {
  static int (*real)(int, int, int);
  if (!real) real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
  int fd = real(domain, type, protocol);
  if ((domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM) cap(fd);
  return fd;
}

int accept(int s, struct sockaddr* addr, socklen_t* len) {
  static int (*real)(int, struct sockaddr*, socklen_t*);
  if (!real) real = (int (*)(int, struct sockaddr*, socklen_t*))dlsym(RTLD_NEXT, "accept");
  int fd = real(s, addr, len);
  cap(fd);
  return fd;
}

int accept4(int s, struct sockaddr* addr, socklen_t* len, int flags) {
  static int (*real)(int, struct sockaddr*, socklen_t*, int);
  if (!real) real = (int (*)(int, struct sockaddr*, socklen_t*, int))dlsym(RTLD_NEXT, "accept4");
  int fd = real(s, addr, len, flags);
  cap(fd);
  return fd;
}
