// Where policies send trace records. The trace writer (policy/trace_writer.h) is the real one;
// tests may collect records themselves. record() is on the allocation hot path.
#pragma once

#include "trace_schema.h"

namespace cupool {

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void record(const trace::Record&) = 0;
};

}  // namespace cupool
