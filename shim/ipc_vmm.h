// CUDA IPC of the vmm policy's blocks between processes that both run cupool (docs/design.md,
// "IPC of vmm blocks"). The driver's IPC handles do not cover cuMemCreate memory, so cupool writes
// its own 64-byte handle (policy/ipc_vmm_handle.h) and the exporter serves the granules' file
// descriptors over an abstract Unix socket (SCM_RIGHTS: no ptrace rights needed, unlike
// pidfd_getfd). The importer maps them in a range of its own. A block freed while an importer maps
// it stays out of the exporter's pool until the last importer lets go.
#pragma once

#include <cstdint>

#include "cuda_api.h"
#include "ipc_vmm_handle.h"
#include "process_memory.h"

namespace cupool::shim::ipc_vmm {

// cudaIpcGetMemHandle / cuIpcGetMemHandle of `ptr`, inside a block of `cp`'s pool under the vmm
// policy. From the pool's own records (no current context needed). On failure the handle is
// cleared and one line says why.
CUresult export_block(ContextMemory& cp, std::uint64_t ptr, unsigned char* handle, const char* api);

// cudaIpcOpenMemHandle / cuIpcOpenMemHandle of a handle decode_vmm() accepted. The calling
// thread's current context gets the mapping. Opening the same handle again returns the same
// pointer and counts the opens, as the driver does for its own handles.
CUresult open(const ipc::VmmHandle& handle, std::uint64_t* ptr);
// cudaIpcCloseMemHandle / cuIpcCloseMemHandle: false if `ptr` is not what an open above returned
// (the caller asks the driver, which answers for it); else *rc says how the close went.
bool close(std::uint64_t ptr, CUresult* rc);
// The imported block holding `ptr`, for range queries.
bool range(std::uint64_t ptr, std::uint64_t* start, std::uint64_t* size);

// The context of `cp` is going: its exports go with it (importers keep their memory: they hold
// their own handles).
void context_dropped(ContextMemory& cp);

}  // namespace cupool::shim::ipc_vmm
