// Quarantine (quarantine.h): deferred frees held in batches behind fences until they retire.
#include "quarantine.h"

namespace cupool {

void Quarantine::seal(FenceId fence, std::uint64_t t, bool from_free) {
  last_seal_ns_ = t;
  Batch b;
  b.sealed_ns = t;
  b.from_free = from_free;
  b.fence = fence;
  b.seq = ++seq_;
  b.bytes = pending_bytes_;
  b.blocks.swap(pending_);
  if (!spare_.empty()) {
    pending_.swap(spare_.back());
    spare_.pop_back();
  }
  pending_bytes_ = 0;
  batches_.push_back(std::move(b));
}

Quarantine::Batch* Quarantine::oldest_untaken(bool* all_taken) {
  std::size_t i = head_;
  while (i < batches_.size() && batches_[i].taken) ++i;  // other threads wait on those
  *all_taken = i == batches_.size() && i != head_;
  return i < batches_.size() ? &batches_[i] : nullptr;
}

void Quarantine::pop_front() {
  Batch& b = batches_[head_];
  b.blocks.clear();
  spare_.push_back(std::move(b.blocks));
  ++head_;
  if (head_ == batches_.size()) {
    batches_.clear();
    head_ = 0;
  } else if (head_ >= 64 && head_ * 2 >= batches_.size()) {
    // Compacted now and then: the FIFO is a vector, and waiting threads hold sequence numbers,
    // not positions.
    batches_.erase(batches_.begin(), batches_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
}

void Quarantine::clear() {
  pending_.clear();
  pending_bytes_ = 0;
  batches_.clear();
  head_ = 0;
}

}  // namespace cupool
