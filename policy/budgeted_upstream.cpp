// BudgetedUpstream's admission of a context's memory by the shared budget, and the allocation's
// scope its waits share a deadline in (budgeted_upstream.h).
#include "budgeted_upstream.h"

#include "context_pool.h"
#include "clock.h"

namespace cupool {

namespace {
thread_local ShareAskScope* t_share_ask = nullptr;  // the innermost allocation of this thread
}  // namespace

ShareAskScope::ShareAskScope() : outer_(t_share_ask) { t_share_ask = this; }
ShareAskScope::~ShareAskScope() { t_share_ask = outer_; }

bool BudgetedUpstream::admit(std::size_t bytes, bool may_wait) {
  if (share_.admit(c_.device, total(), bytes, 0)) return true;
  if (c_.pool) c_.pool->trim();  // the pool's lock is not held while it reserves
  if (!may_wait) return share_.admit(c_.device, total(), bytes, 0);
  ShareAskScope* ask = t_share_ask;
  std::uint64_t wait = wait_ns_;
  if (ask && wait > 0) {
    const std::uint64_t now = monotonic_ns();
    if (ask->deadline_ns == 0) ask->deadline_ns = now > UINT64_MAX - wait ? UINT64_MAX : now + wait;  // saturated
    wait = ask->deadline_ns > now ? ask->deadline_ns - now : 0;
  }
  return share_.admit(c_.device, total(), bytes, wait);
}

void BudgetedUpstream::publish() {
  if (!c_.pool) return;
  const PoolStats s = c_.pool->state();
  share_.publish(c_.device, s.in_use + c_.pool->outside(), s.reserved + c_.pool->outside());
}

}  // namespace cupool
