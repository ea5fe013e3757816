// What a process pays to become a member of a shared budget (CUPOOL_SHARE) when the budget
// already has N members (HAMi-core #252 reports 5.6 ms median with 64): the shim joins the
// segment at load (SharedBudget::join: open, map, check the limit) and claims its slot at the
// first allocation (the first admit: a free slot found, the process's start time read, every
// slot summed). Each sample is a fresh forked process that does both, timed inside the process,
// with N-1 other live members holding a claim each. A benchmark (suite perf): nothing here is a
// pass/fail bound on time, but every sample must have joined and been admitted.
//
//   bench_share_startup [MEMBERS,...] [SAMPLES]      (default: 1,16,64 and 200)
// Prints one JSON line per member count: {"members":N,"samples":S,"join_us":{median,p90},
// "first_admit_us":{median,p90},"total_us":{median,p90}}.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "shared_budget.h"

namespace {

using cupool::SharedBudget;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kTotal = 80ull << 30;
constexpr std::uint64_t kClaim = 1ull << 20;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// One sample's timings, written by the forked member into memory shared with the parent.
struct Sample {
  double join_us, admit_us;
  int ok;
};

struct Quantiles {
  double median, p90;
};
Quantiles quantiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 9 / 10)]};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> counts = {1, 16, 64};
  if (argc > 1) {
    counts.clear();
    std::stringstream ss(argv[1]);
    for (std::string item; std::getline(ss, item, ',');) counts.push_back(std::atoi(item.c_str()));
  }
  const int samples = argc > 2 ? std::atoi(argv[2]) : 200;
  cupool::LimitSpec limit;
  limit.all = cupool::SizeSpec{40ull << 30};  // half the device: no claim here is refused
  std::random_device rd;

  for (const int members : counts) {
    const std::string name = "cupool-bench-" + std::to_string(getpid()) + "-" + std::to_string(rd() % 1000000);
    std::string error;
    auto parent = SharedBudget::join(name, limit, false, &error);  // makes the segment; holds no slot
    if (!parent) {
      std::fprintf(stderr, "bench_share_startup: %s\n", error.c_str());
      return 2;
    }
    // The other members: each holds a slot with a claim, and sleeps.
    std::vector<pid_t> others;
    auto* ready = static_cast<std::atomic<int>*>(
        mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    new (ready) std::atomic<int>(0);
    for (int i = 0; i < members - 1; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        std::string e;
        auto b = SharedBudget::join(name, limit, false, &e);
        if (!b || !b->admit(0, kTotal, kClaim, 0)) _exit(3);
        ready->fetch_add(1);
        for (;;) pause();
      }
      others.push_back(pid);
    }
    while (ready->load() < members - 1) usleep(1000);

    auto* results = static_cast<Sample*>(
        mmap(nullptr, sizeof(Sample) * samples, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    std::vector<double> join_us, admit_us, total_us;
    int failed = 0;
    for (int s = 0; s < samples; ++s) {
      const pid_t pid = fork();
      if (pid == 0) {
        const Clock::time_point t0 = Clock::now();
        std::string e;
        auto b = SharedBudget::join(name, limit, false, &e);
        const Clock::time_point t1 = Clock::now();
        const bool ok = b && b->admit(0, kTotal, kClaim, 0);
        const Clock::time_point t2 = Clock::now();
        results[s] = {micros(t1 - t0), micros(t2 - t1), ok ? 1 : 0};
        if (ok) b->release(0, kClaim);
        _exit(0);
      }
      int st = 0;
      waitpid(pid, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || results[s].ok != 1) {
        ++failed;
        continue;
      }
      join_us.push_back(results[s].join_us);
      admit_us.push_back(results[s].admit_us);
      total_us.push_back(results[s].join_us + results[s].admit_us);
    }
    for (pid_t pid : others) kill(pid, SIGKILL);
    for (pid_t pid : others) waitpid(pid, nullptr, 0);
    parent.reset();
    shm_unlink(SharedBudget::segment_name(name, false).c_str());
    munmap(results, sizeof(Sample) * samples);
    munmap(ready, sizeof(std::atomic<int>));
    if (failed > 0 || join_us.empty()) {
      std::fprintf(stderr, "bench_share_startup: %d of %d members with %d others were not admitted\n", failed,
                   samples, members - 1);
      return 1;
    }
    const Quantiles j = quantiles(join_us), a = quantiles(admit_us), t = quantiles(total_us);
    std::printf(
        "{\"members\":%d,\"samples\":%zu,\"join_us\":{\"median\":%.1f,\"p90\":%.1f},"
        "\"first_admit_us\":{\"median\":%.1f,\"p90\":%.1f},\"total_us\":{\"median\":%.1f,\"p90\":%.1f}}\n",
        members, join_us.size(), j.median, j.p90, a.median, a.p90, t.median, t.p90);
    std::fflush(stdout);
  }
  return 0;
}
