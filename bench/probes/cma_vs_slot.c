// Two processes pinned to CPUs 0 and 1 move 1 MiB per round from the writer to the reader in
// two ways, taking turns: (a) the reader pulls the writer's buffer with process_vm_readv (single
// copy); (b) the writer streams it into a shared slot (non-temporal stores, as pyring's shm
// link does with the cores far apart) and the reader copies it out. The writer rewrites its
// buffer before every round, as a fresh gradient would be. Prints the mean per round, after 20
// rounds of warm-up, of each side's time.
//   gcc -O2 -mavx2 -o /tmp/cma bench/probes/cma_vs_slot.c && /tmp/cma
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
#define N (1<<20)
typedef struct { volatile uint64_t go, done; uint64_t addr; int pid; } Ctl;
static void ntcopy(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=32)_mm256_stream_si256((__m256i*)(d+i),_mm256_loadu_si256((const __m256i*)(s+i)));_mm_sfence();}
int main(int argc,char**argv){
  int iters=2000;
  Ctl* c=mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  char* slots=mmap(0,16*N,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  memset(slots,0,16*N);
  char* src=aligned_alloc(64,N); memset(src,1,N);
  c->addr=(uint64_t)src; c->pid=getpid();
  pid_t p=fork();
  if(p==0){ // reader on core 1
    pin(1); char* dst=aligned_alloc(64,N); memset(dst,0,N);
    double tc=0,ts=0;
    for(uint64_t k=1;k<=2*(uint64_t)iters;k++){
      while(c->go!=k) _mm_pause();
      double t0=now();
      if(k&1){ struct iovec l={dst,N},r={(void*)c->addr,N}; if(process_vm_readv(c->pid,&l,1,&r,1,0)!=N){perror("cma");exit(1);} }
      else { memcpy(dst,slots+((k/2)%16)*N,N); }
      double t=now()-t0; if(k>20){ if(k&1) tc+=t; else ts+=t; }
      c->done=k;
    }
    printf("reader: cma read %.1f us, slot read %.1f us\n", tc/(iters-10), ts/(iters-10));
    exit(0);
  }
  pin(0); double tw_nt=0,tw_m=0, tot_c=0, tot_s=0;
  for(uint64_t k=1;k<=2*(uint64_t)iters;k++){
    double t0=now();
    memset(src,(int)k,N); // the writer's data is fresh in its cache, as a gradient would be
    double t1=now();
    if(!(k&1)){ ntcopy(slots+((k/2)%16)*N,src,N); }
    double t2=now();
    c->go=k; while(c->done!=k) _mm_pause();
    double t3=now();
    if(k>20){ if(k&1) tot_c+=t3-t1; else {tot_s+=t3-t1; tw_nt+=t2-t1;} }
  }
  wait(0);
  printf("writer: cma path %.1f us, slot path %.1f us (nt write %.1f)\n", tot_c/(iters-10), tot_s/(iters-10), tw_nt/(iters-10));
}
