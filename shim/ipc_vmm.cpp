// CUDA IPC of vmm blocks (ipc_vmm.h): the exporter's table and socket server, the free gate that
// keeps a shared block out of the pool while importers map it, and the importer's open and close.
#include "ipc_vmm.h"

#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "driver_upstream.h"
#include "hook_table.h"
#include "ipc_handle.h"
#include "log.h"
#include "shim_state.h"

namespace cupool::shim::ipc_vmm {

namespace {

// Every socket operation gives up after this: a hung or hostile exporter costs the importer
// this long, then a CUDA error. Local peers answer in microseconds.
constexpr int kTimeoutMs = 2000;
// More connections than this are refused (each holds a descriptor in the exporter).
constexpr std::size_t kMaxConnections = 4096;

void set_timeouts(int fd) {
  timeval tv{kTimeoutMs / 1000, (kTimeoutMs % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

socklen_t socket_address(std::uint32_t pid, std::uint64_t nonce, sockaddr_un* addr) {
  const std::string name = ipc::vmm_socket_name(pid, nonce);
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  std::memcpy(addr->sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

bool send_all(int fd, const void* data, std::size_t n) {
  return ::send(fd, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

// Exactly n bytes, or false (timeout, end, error).
bool recv_all(int fd, void* data, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, static_cast<char*>(data) + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<std::size_t>(r);
  }
  return true;
}

std::uint64_t fresh_nonce() {
  std::uint64_t n = 0;
  if (getrandom(&n, sizeof n, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof n) || n == 0) {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    n = (static_cast<std::uint64_t>(ts.tv_nsec) << 20) ^ static_cast<std::uint64_t>(ts.tv_sec) ^
        (static_cast<std::uint64_t>(getpid()) << 40) ^ reinterpret_cast<std::uintptr_t>(&n);
    n |= 1;
  }
  return n;
}

// ---- the exporter ----------------------------------------------------------------------------

struct Export {
  std::uint64_t ptr = 0, size = 0;   // the block
  std::uint64_t first_va = 0;        // its first granule
  std::uint64_t granule = 0, count = 0;
  ContextMemory* cp = nullptr;
  std::uint32_t imports = 0;  // importers connected (each holds a mapping, or is getting one)
  bool freed = false;         // the program freed it; the pool gets it when imports reach 0
};

class Exporter final : public FreeGate {
 public:
  // Never held across a socket operation; held across the pool's free of a block whose last
  // lease ended, so that a context drop waits for it.
  std::mutex mu;
  std::unordered_map<std::uint64_t, Export> by_id;
  std::unordered_map<std::uint64_t, std::uint64_t> id_by_ptr;
  std::uint64_t next_id = 1;
  std::uint32_t pid = 0;
  std::uint64_t nonce = 0;
  bool started = false;        // the server runs in this process
  std::atomic<int> listen_fd{-1};
  // Exports per bucket of block addresses: every free in the process asks the gate, and most
  // ask nothing more than this (one load, no lock).
  static constexpr std::size_t kBuckets = 1024;
  std::atomic<std::uint32_t> buckets[kBuckets] = {};
  static std::size_t bucket(std::uint64_t ptr) { return static_cast<std::size_t>((ptr >> 9) * 0x9E3779B97F4A7C15ull >> 54); }

  void add_locked(std::uint64_t id, const Export& e) {
    by_id[id] = e;
    id_by_ptr[e.ptr] = id;
    buckets[bucket(e.ptr)].fetch_add(1, std::memory_order_release);
  }
  void erase_locked(std::uint64_t id) {
    auto it = by_id.find(id);
    if (it == by_id.end()) return;
    if (auto at = id_by_ptr.find(it->second.ptr); at != id_by_ptr.end() && at->second == id) id_by_ptr.erase(at);
    buckets[bucket(it->second.ptr)].fetch_sub(1, std::memory_order_release);
    by_id.erase(it);
  }

  bool hold(ContextMemory& c, std::uint64_t ptr, std::size_t* size, FreeResult* result) override {
    if (buckets[bucket(ptr)].load(std::memory_order_acquire) == 0) return false;
    std::lock_guard g(mu);
    auto at = id_by_ptr.find(ptr);
    if (at == id_by_ptr.end()) return false;
    Export& e = by_id[at->second];
    if (e.cp != &c) return false;
    if (e.freed) {
      *result = FreeResult::double_free;
      if (size) *size = 0;
      return true;
    }
    if (e.imports == 0) {  // nobody maps it: the pool takes it now; later opens are refused
      erase_locked(at->second);
      return false;
    }
    e.freed = true;
    *result = FreeResult::freed;
    if (size) *size = e.size;
    if (log_debug_enabled())
      log_debug(fmt::format("IPC: a freed vmm block of {} bytes at 0x{:x} stays out of the pool while {} importer(s) "
                            "map it", e.size, e.ptr, e.imports));
    return true;
  }

  // An importer let go (closed, exited, or its import failed): a freed block with none left goes
  // to its pool. Under mu: a context drop (context_dropped) waits, so the pool is still live.
  void release_import(std::uint64_t id) {
    std::lock_guard g(mu);
    auto it = by_id.find(id);
    if (it == by_id.end() || it->second.imports == 0) return;
    Export& e = it->second;
    if (--e.imports > 0 || !e.freed) return;
    ContextMemory* cp = e.cp;
    const std::uint64_t ptr = e.ptr;
    erase_locked(id);
    // The pool's own free (not ProcessMemory's: its gate is this, and mu is held).
    cp->pool->deallocate(ptr);
    if (log_debug_enabled()) log_debug(fmt::format("IPC: the last importer let go; the vmm block at 0x{:x} is free", ptr));
  }
};

Exporter* g_exporter = new Exporter;  // never destroyed: the server thread and exit handlers use it

struct Connection {
  int fd;
  std::uint64_t id;
};

// Serves one request on a fresh connection. Returns the export id it now leases (0: none; the
// connection is then closed).
std::uint64_t serve(Exporter& ex, int c) {
  set_timeouts(c);
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid()) {
    log_warn(fmt::format("IPC: refused a connection to the vmm block server from uid {} (not this process's user)",
                         static_cast<long>(cred.uid)));
    return 0;
  }
  ipc::WireRequest req;
  if (!recv_all(c, &req, sizeof req) || req.magic != ipc::kWireMagic || req.version != ipc::kWireVersion) return 0;
  ipc::WireReply reply;
  Export e;
  {
    std::lock_guard g(ex.mu);
    auto it = ex.by_id.find(req.export_id);
    if (req.nonce != ex.nonce || it == ex.by_id.end() || it->second.freed || exiting()) {
      reply.status = ipc::WireStatus::unknown_export;
    } else {
      ++it->second.imports;  // from here the block stays the importer's until this connection ends
      e = it->second;
      reply.status = ipc::WireStatus::ok;
    }
  }
  if (reply.status != ipc::WireStatus::ok) {
    send_all(c, &reply, sizeof reply);
    return 0;
  }
  reply.granule = e.granule;
  reply.count = e.count;
  reply.offset = e.ptr - e.first_va;
  reply.size = e.size;
  bool ok = send_all(c, &reply, sizeof reply);
  DriverUpstream& up = driver_upstream(*e.cp);
  for (std::uint64_t i = 0; ok && i < e.count; i += ipc::kMaxFdsPerBatch) {
    const std::uint64_t n = std::min<std::uint64_t>(ipc::kMaxFdsPerBatch, e.count - i);
    std::vector<int> fds;
    if (up.export_granules(e.first_va + i * e.granule, static_cast<std::size_t>(n), &fds) != CUDA_SUCCESS) {
      log_error(fmt::format("IPC: could not export the granules of the vmm block at 0x{:x} to an importer", e.ptr));
      ok = false;
      break;
    }
    ipc::BatchHeader h;
    h.first = static_cast<std::uint32_t>(i);
    h.n = static_cast<std::uint32_t>(n);
    iovec iov{&h, sizeof h};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * ipc::kMaxFdsPerBatch)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
    ok = ::sendmsg(c, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof h);
    for (int fd : fds) ::close(fd);  // the importer has its own copies now
  }
  if (!ok) {
    ex.release_import(req.export_id);
    return 0;
  }
  return req.export_id;
}

// The server: accepts, serves, and watches each leasing connection for its end. Detached, with
// every signal blocked; exit does not wait for it, and a forked child does not have it.
void* server_main(void*) {
  Exporter& ex = *g_exporter;
  const int lfd = ex.listen_fd.load();
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({lfd, POLLIN, 0});
    for (const Connection& c : conns) fds.push_back({c.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return nullptr;
    }
    for (std::size_t i = conns.size(); i-- > 0;) {
      const short ev = fds[i + 1].revents;
      if (ev == 0) continue;
      char buf[64];
      if ((ev & POLLIN) && !(ev & (POLLHUP | POLLERR)) && ::recv(conns[i].fd, buf, sizeof buf, MSG_DONTWAIT) > 0)
        continue;  // an importer has nothing to say after its request: ignored
      ::close(conns[i].fd);
      ex.release_import(conns[i].id);
      conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (fds[0].revents & POLLIN) {
      const int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      const std::uint64_t id = conns.size() < kMaxConnections ? serve(ex, c) : 0;
      if (id == 0) ::close(c);
      else conns.push_back({c, id});
    }
  }
}

void after_fork_in_child();

// Once a process exports or imports: a forked child must not inherit the server or the leases.
void watch_forks() {
  static std::once_flag atfork;
  std::call_once(atfork, [] { pthread_atfork(nullptr, nullptr, after_fork_in_child); });
}

// Starts the server (under ex.mu). False, with one line, if the socket or thread cannot be made.
bool start_server_locked(Exporter& ex) {
  if (ex.started) return true;
  watch_forks();
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    log_error(fmt::format("IPC: cannot make the vmm block server's socket: {}", std::strerror(errno)));
    return false;
  }
  bool bound = false;
  for (int attempt = 0; attempt < 4 && !bound; ++attempt) {
    ex.pid = static_cast<std::uint32_t>(getpid());
    ex.nonce = fresh_nonce();
    sockaddr_un addr;
    const socklen_t len = socket_address(ex.pid, ex.nonce, &addr);
    bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 && ::listen(fd, 64) == 0;
  }
  if (!bound) {
    log_error(fmt::format("IPC: cannot bind the vmm block server's socket: {}", std::strerror(errno)));
    ::close(fd);
    return false;
  }
  ex.listen_fd.store(fd);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  const int rc = pthread_create(&t, &attr, server_main, nullptr);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    log_error(fmt::format("IPC: cannot start the vmm block server's thread: {}", std::strerror(rc)));
    ex.listen_fd.store(-1);
    ::close(fd);
    return false;
  }
  ex.started = true;
  return true;
}

// ---- the importer ----------------------------------------------------------------------------

struct Import {
  std::uint32_t pid = 0;
  std::uint64_t nonce = 0, export_id = 0;
  std::uint64_t base = 0, granule = 0;   // the range reserved here
  std::uint64_t reserved = 0;            // its bytes
  std::uint64_t size = 0;                // the block's bytes (at the pointer returned)
  std::vector<CUmemGenericAllocationHandle> handles;  // one per granule, mapped in order
  int sock = -1;                         // the lease: the exporter holds the block while it is open
  std::uint32_t opens = 0;
};

struct Importer {
  std::mutex mu;       // the table (fork handlers take it)
  std::mutex open_mu;  // one open at a time: two opens of one handle must share a mapping
  std::map<std::uint64_t, Import> by_ptr;  // by the pointer returned
};
Importer* g_importer = new Importer;  // never destroyed, as g_exporter

// Unmaps and releases what an import mapped (the device is done with it), frees the range.
void undo_import(Import& im) {
  for (std::size_t i = 0; i < im.handles.size(); ++i) {
    CUPOOL_REAL(cuMemUnmap)(static_cast<CUdeviceptr>(im.base + i * im.granule), im.granule);
    CUPOOL_REAL(cuMemRelease)(im.handles[i]);
  }
  if (im.base) CUPOOL_REAL(cuMemAddressFree)(static_cast<CUdeviceptr>(im.base), im.reserved);
  if (im.sock >= 0) ::close(im.sock);
  im.sock = -1;
}

void after_fork_in_child() {
  // The parent's server and leases are not the child's: their descriptors close here (the
  // listening one would keep the parent's name alive past its exit). A child that exports
  // starts a server of its own, under its own pid and nonce.
  Exporter* old_ex = g_exporter;
  if (const int fd = old_ex->listen_fd.load(); fd >= 0) ::close(fd);
  g_exporter = new Exporter;  // the old one is leaked: another thread may have held its lock
  process_memory().set_free_gate(nullptr);  // until this process exports a block of its own
  // The child's copies of the leases would keep the exporter holding blocks this child cannot
  // use (CUDA does not work across fork). Skipped if another thread held the table at the fork.
  Importer* old_im = g_importer;
  if (old_im->mu.try_lock()) {
    for (auto& [ptr, im] : old_im->by_ptr)
      if (im.sock >= 0) ::close(im.sock);
  }
  g_importer = new Importer;
}

}  // namespace

CUresult export_block(ContextMemory& cp, std::uint64_t ptr, unsigned char* handle, const char* api) {
  std::memset(handle, 0, ipc::kHandleBytes);
  std::uint64_t base = 0, range_base = 0;
  std::size_t bytes = 0;
  if (!cp.pool->block_in_reservation(ptr, &base, &bytes, &range_base)) return CUDA_ERROR_INVALID_VALUE;
  DriverUpstream& up = driver_upstream(cp);
  if (!up.shareable()) {
    log_warn(fmt::format("{}: cannot share a block of the vmm policy (CUPOOL_POLICY=vmm) over CUDA IPC here: the "
                         "device or driver does not export cuMemCreate memory as POSIX file descriptors. Run "
                         "processes that share memory over CUDA IPC under CUPOOL_POLICY=growth or passthrough.",
                         api));
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t g = up.vmm_granularity();
  const std::uint64_t first = base - (base - range_base) % g;  // the range starts on a granule
  ipc::VmmHandle h;
  h.offset = base - first;
  h.size = bytes;
  h.device = cp.device;
  Exporter& ex = *g_exporter;
  {
    std::lock_guard lock(ex.mu);
    if (!start_server_locked(ex)) return CUDA_ERROR_OPERATING_SYSTEM;
    process_memory().set_free_gate(&ex);
    auto at = ex.id_by_ptr.find(base);
    if (at != ex.id_by_ptr.end() && ex.by_id[at->second].size == bytes && ex.by_id[at->second].cp == &cp) {
      h.export_id = at->second;  // shared before: the same export
    } else {
      if (at != ex.id_by_ptr.end()) ex.erase_locked(at->second);  // a stale record (another pool's)
      Export e;
      e.ptr = base;
      e.size = bytes;
      e.first_va = first;
      e.granule = g;
      e.count = (h.offset + bytes + g - 1) / g;
      e.cp = &cp;
      h.export_id = ex.next_id++;
      ex.add_locked(h.export_id, e);
    }
    h.pid = ex.pid;
    h.nonce = ex.nonce;
  }
  ipc::encode_vmm(handle, h);
  if (log_debug_enabled())
    log_debug(fmt::format("{}: a vmm block of {} bytes at offset {} of its first granule, export {}", api, bytes,
                          h.offset, h.export_id));
  return CUDA_SUCCESS;
}

namespace {
// The import itself: connect, check the peer, ask, then map what comes. Fills `im` (sock, range,
// handles) or undoes everything and returns the error.
CUresult import_block(const ipc::VmmHandle& h, Import* im) {
  auto fail = [&](CUresult rc, const std::string& why) {
    log_error(fmt::format("IPC: cannot open a vmm block's handle (exporter pid {}): {}", h.pid, why));
    undo_import(*im);
    return rc;
  };
  im->sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (im->sock < 0) return fail(CUDA_ERROR_OPERATING_SYSTEM, std::strerror(errno));
  set_timeouts(im->sock);  // connect too: a full backlog waits SO_SNDTIMEO at most
  sockaddr_un addr;
  const socklen_t len = socket_address(h.pid, h.nonce, &addr);
  if (::connect(im->sock, reinterpret_cast<sockaddr*>(&addr), len) != 0)
    return fail(CUDA_ERROR_INVALID_HANDLE, fmt::format("the exporting process is gone ({})", std::strerror(errno)));
  ucred cred{};
  socklen_t clen = sizeof cred;
  if (getsockopt(im->sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != geteuid() ||
      static_cast<std::uint32_t>(cred.pid) != h.pid)
    return fail(CUDA_ERROR_INVALID_HANDLE, "the socket is not served by the exporting process of this user");
  ipc::WireRequest req;
  req.nonce = h.nonce;
  req.export_id = h.export_id;
  ipc::WireReply reply;
  if (!send_all(im->sock, &req, sizeof req) || !recv_all(im->sock, &reply, sizeof reply) ||
      reply.magic != ipc::kWireMagic)
    return fail(CUDA_ERROR_MAP_FAILED, "the exporter did not answer");
  if (reply.status == ipc::WireStatus::unknown_export)
    return fail(CUDA_ERROR_INVALID_HANDLE, "the exporter no longer shares this block (freed)");
  if (reply.status != ipc::WireStatus::ok || !ipc::vmm_layout_sane(reply.granule, reply.count, reply.offset, reply.size) ||
      reply.offset != h.offset || reply.size != h.size)
    return fail(CUDA_ERROR_MAP_FAILED, "the exporter's answer does not describe the block");
  im->granule = reply.granule;
  CUdeviceptr base = 0;
  const std::uint64_t reserved = reply.granule * reply.count;
  if (CUresult rc = CUPOOL_REAL(cuMemAddressReserve)(&base, reserved, reply.granule, 0, 0); rc != CUDA_SUCCESS)
    return fail(rc, "no addresses for it");
  im->base = base;
  im->reserved = reserved;
  auto import_fd = driver().mem_import_from_shareable_handle;
  im->handles.reserve(std::min<std::uint64_t>(reply.count, 4096));  // a count is not trusted with memory
  while (im->handles.size() < reply.count) {
    ipc::BatchHeader bh;
    iovec iov{&bh, sizeof bh};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * ipc::kMaxFdsPerBatch)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t r = ::recvmsg(im->sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    std::vector<int> fds;  // whatever came is closed, whatever else is wrong
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); r >= 0 && cm; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len < CMSG_LEN(0)) continue;
      const std::size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        fds.push_back(fd);
      }
    }
    auto close_fds = [&](std::size_t from) {
      for (std::size_t i = from; i < fds.size(); ++i) ::close(fds[i]);
    };
    if (r != static_cast<ssize_t>(sizeof bh) || (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) || bh.magic != ipc::kWireMagic ||
        bh.first != im->handles.size() || bh.n == 0 || bh.n != fds.size() || bh.n > ipc::kMaxFdsPerBatch ||
        bh.n > reply.count - im->handles.size()) {
      close_fds(0);
      return fail(CUDA_ERROR_MAP_FAILED, "the exporter sent something else than the block's granules");
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      CUmemGenericAllocationHandle mh = 0;
      CUresult rc = import_fd ? import_fd(&mh, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fds[i])),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                              : CUDA_ERROR_NOT_SUPPORTED;
      ::close(fds[i]);
      if (rc == CUDA_SUCCESS) {
        rc = CUPOOL_REAL(cuMemMap)(static_cast<CUdeviceptr>(base + im->handles.size() * reply.granule), reply.granule, 0,
                                   mh, 0);
        if (rc != CUDA_SUCCESS) CUPOOL_REAL(cuMemRelease)(mh);
        else im->handles.push_back(mh);
      }
      if (rc != CUDA_SUCCESS) {
        close_fds(i + 1);
        return fail(rc, "the driver would not import or map a granule");
      }
    }
  }
  CUdevice device = 0;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUresult rc = driver().ctx_get_device(&device);
  access.location.id = static_cast<int>(device);
  if (rc == CUDA_SUCCESS) rc = CUPOOL_REAL(cuMemSetAccess)(base, reserved, &access, 1);
  if (rc != CUDA_SUCCESS) return fail(rc, "the driver would not make it accessible from this device");
  return CUDA_SUCCESS;
}
}  // namespace

CUresult open(const ipc::VmmHandle& h, std::uint64_t* ptr) {
  CUcontext ctx = nullptr;
  if (!driver().ok || driver().ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  watch_forks();
  Importer& imp = *g_importer;
  std::lock_guard serial(imp.open_mu);
  {
    std::lock_guard lock(imp.mu);
    for (auto& [p, im] : imp.by_ptr)
      if (im.pid == h.pid && im.nonce == h.nonce && im.export_id == h.export_id) {
        ++im.opens;  // as the driver: the same pointer, counted
        *ptr = p;
        return CUDA_SUCCESS;
      }
  }
  Import im;
  im.pid = h.pid;
  im.nonce = h.nonce;
  im.export_id = h.export_id;
  im.size = h.size;
  if (const CUresult rc = import_block(h, &im); rc != CUDA_SUCCESS) return rc;
  im.opens = 1;
  *ptr = im.base + h.offset;
  if (log_debug_enabled())
    log_debug(fmt::format("IPC open: a vmm block of {} bytes from pid {} at 0x{:x} ({} granules mapped)", h.size, h.pid,
                          *ptr, im.handles.size()));
  std::lock_guard lock(imp.mu);
  imp.by_ptr.emplace(*ptr, std::move(im));
  return CUDA_SUCCESS;
}

bool close(std::uint64_t ptr, CUresult* rc) {
  Importer& imp = *g_importer;
  Import gone;
  {
    std::lock_guard lock(imp.mu);
    auto it = imp.by_ptr.find(ptr);
    if (it == imp.by_ptr.end()) return false;
    *rc = CUDA_SUCCESS;
    if (--it->second.opens > 0) return true;
    gone = std::move(it->second);
    imp.by_ptr.erase(it);
  }
  // An unmap does not wait for the device: work queued on the block ends first, as the driver's
  // own close of an IPC mapping lets it.
  if (driver().ok) driver().ctx_synchronize();
  undo_import(gone);  // closing the lease lets the exporter's pool have a freed block back
  if (log_debug_enabled()) log_debug(fmt::format("IPC close: the vmm block at 0x{:x}", ptr));
  return true;
}

bool range(std::uint64_t ptr, std::uint64_t* start, std::uint64_t* size) {
  Importer& imp = *g_importer;
  std::lock_guard lock(imp.mu);
  if (imp.by_ptr.empty()) return false;
  auto it = imp.by_ptr.upper_bound(ptr);
  if (it == imp.by_ptr.begin()) return false;
  --it;
  if (ptr - it->first >= it->second.size) return false;
  *start = it->first;
  *size = it->second.size;
  return true;
}

void context_dropped(ContextMemory& cp) {
  Exporter& ex = *g_exporter;
  std::lock_guard lock(ex.mu);
  std::vector<std::uint64_t> gone;
  for (const auto& [id, e] : ex.by_id)
    if (e.cp == &cp) gone.push_back(id);
  for (std::uint64_t id : gone) ex.erase_locked(id);
}

}  // namespace cupool::shim::ipc_vmm
