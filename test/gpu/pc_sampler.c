// A flat CPU profile of a process, with no tool installed on the machine: preloaded beside
// libcupool.so, it samples the interrupted instruction of whichever thread is running on the CPU
// (ITIMER_PROF, PC_SAMPLER_HZ times a second of CPU time, default 5000) and writes, at exit, one
// line per sampled address and the process's mappings, for test/gpu/pc_profile.py to name the
// functions (inlined frames included, from the library's debug information) here.
//   LD_PRELOAD=pc_sampler.so:libcupool.so PC_SAMPLER_OUT=prof.txt PROGRAM...
// Issue 38 asks where the traced pair's time goes on the GPU host, measured rather than guessed;
// the GPU machine has no perf.
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>

#define MAX_SAMPLES (1u << 22)

static unsigned long* samples;
static atomic_uint count;
static atomic_uint lost;

static void on_prof(int sig, siginfo_t* info, void* context) {
  (void)sig;
  (void)info;
  const ucontext_t* uc = (const ucontext_t*)context;
#if defined(__x86_64__)
  const unsigned long pc = (unsigned long)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
  const unsigned long pc = (unsigned long)uc->uc_mcontext.pc;
#else
  const unsigned long pc = 0;
#endif
  const unsigned i = atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
  if (i < MAX_SAMPLES) samples[i] = pc;
  else atomic_fetch_add_explicit(&lost, 1, memory_order_relaxed);
}

static int cmp_ul(const void* a, const void* b) {
  const unsigned long x = *(const unsigned long*)a, y = *(const unsigned long*)b;
  return x < y ? -1 : x > y;
}

__attribute__((constructor)) static void start(void) {
  if (getenv("PC_SAMPLER_OUT") == NULL) return;
  samples = calloc(MAX_SAMPLES, sizeof *samples);
  if (samples == NULL) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_prof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPROF, &sa, NULL);
  const char* hz_text = getenv("PC_SAMPLER_HZ");
  const long hz = hz_text ? atol(hz_text) : 5000;
  struct itimerval it;
  it.it_interval.tv_sec = 0;
  it.it_interval.tv_usec = hz > 0 ? 1000000 / hz : 200;
  it.it_value = it.it_interval;
  setitimer(ITIMER_PROF, &it, NULL);
}

__attribute__((destructor)) static void finish(void) {
  const char* path = getenv("PC_SAMPLER_OUT");
  if (path == NULL || samples == NULL) return;
  struct itimerval off;
  memset(&off, 0, sizeof off);
  setitimer(ITIMER_PROF, &off, NULL);
  unsigned n = atomic_load(&count);
  if (n > MAX_SAMPLES) n = MAX_SAMPLES;
  // A process that ran no sampled code (a `timeout` or shell around the program inherits the
  // preload too) writes nothing: it would overwrite the program's profile.
  if (n == 0) return;
  qsort(samples, n, sizeof *samples, cmp_ul);
  FILE* f = fopen(path, "w");
  if (f == NULL) return;
  fprintf(f, "# samples %u lost %u\n", n, atomic_load(&lost));
  for (unsigned i = 0; i < n;) {
    unsigned j = i;
    while (j < n && samples[j] == samples[i]) ++j;
    fprintf(f, "pc %lx %u\n", samples[i], j - i);
    i = j;
  }
  FILE* maps = fopen("/proc/self/maps", "r");
  if (maps) {
    char line[4096];
    while (fgets(line, sizeof line, maps)) fprintf(f, "map %s", line);
    fclose(maps);
  }
  fclose(f);
}
