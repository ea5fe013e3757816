// Interned call stacks and their `stack` lines (stack_table.h).
#include "stack_table.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "quoted_string.h"
#include "trace_schema.h"

namespace cupool {

namespace {
std::uint64_t hash_of(const std::uintptr_t* pcs, std::size_t count) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the addresses
  for (std::size_t i = 0; i < count; ++i) {
    h ^= pcs[i];
    h *= 1099511628211ull;
  }
  return h ^ count;
}

// A C++ template instance can demangle to kilobytes: a stack line stays readable.
constexpr std::size_t kMaxSymbolChars = 512;
}  // namespace

std::uint32_t StackTable::intern(const std::uintptr_t* pcs, std::size_t count) {
  if (count == 0) return 0;
  if (count > kMaxFrames) count = kMaxFrames;
  const std::uint64_t h = hash_of(pcs, count);
  std::lock_guard lock(mu_);
  const auto [first, last] = by_hash_.equal_range(h);
  for (auto it = first; it != last; ++it) {
    const std::vector<std::uintptr_t>& s = stacks_[it->second - 1];
    if (s.size() == count && std::memcmp(s.data(), pcs, count * sizeof *pcs) == 0) return it->second;
  }
  if (stacks_.size() >= kMaxStacks) return 0;
  try {
    stacks_.emplace_back(pcs, pcs + count);
    const auto id = static_cast<std::uint32_t>(stacks_.size());
    by_hash_.emplace(h, id);
    return id;
  } catch (...) {  // out of memory: this allocation goes without its stack
    if (stacks_.size() > by_hash_.size()) stacks_.pop_back();
    return 0;
  }
}

std::vector<std::uintptr_t> StackTable::frames(std::uint32_t id) const {
  std::lock_guard lock(mu_);
  if (id == 0 || id > stacks_.size()) return {};
  return stacks_[id - 1];
}

std::size_t StackTable::size() const {
  std::lock_guard lock(mu_);
  return stacks_.size();
}

const std::string& FrameCache::json(std::uintptr_t pc) {
  if (auto it = by_pc_.find(pc); it != by_pc_.end()) return it->second;
  if (by_pc_.size() >= kMaxEntries) by_pc_.clear();
  namespace sk = trace::stack_key;
  // A return address is the instruction after the call: pc - 1 lies in the calling function.
  const std::uintptr_t at = pc - 1;
  std::string o = fmt::format(R"({{"{}":"0x{:x}")", sk::pc, pc);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(at), &info) != 0 && info.dli_fname != nullptr) {
    o += fmt::format(R"(,"{}":)", sk::module);
    append_quoted(o, info.dli_fname);
    o += fmt::format(R"(,"{}":"0x{:x}")", sk::offset, at - reinterpret_cast<std::uintptr_t>(info.dli_fbase));
    if (info.dli_sname != nullptr && info.dli_saddr != nullptr) {
      int status = -1;
      char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      std::string name = status == 0 && demangled != nullptr ? demangled : info.dli_sname;
      std::free(demangled);
      if (name.size() > kMaxSymbolChars) name = name.substr(0, kMaxSymbolChars - 3) + "...";
      o += fmt::format(R"(,"{}":)", sk::symbol);
      append_quoted(o, name);
      o += fmt::format(R"(,"{}":"0x{:x}")", sk::symbol_offset, at - reinterpret_cast<std::uintptr_t>(info.dli_saddr));
    }
  } else {
    o += fmt::format(R"(,"{}":"")", sk::module);  // no module: code generated at run time
  }
  o += '}';
  return by_pc_.emplace(pc, std::move(o)).first->second;
}

std::string stack_line(std::uint32_t id, const std::vector<std::uintptr_t>& pcs, FrameCache& frames) {
  namespace sk = trace::stack_key;
  std::string o = fmt::format(R"({{"type":"{}","{}":{},"{}":[)", trace::line::stack, sk::id, id, sk::frames);
  for (std::size_t i = 0; i < pcs.size(); ++i) {
    if (i) o += ',';
    o += frames.json(pcs[i]);
  }
  o += "]}\n";
  return o;
}

}  // namespace cupool
