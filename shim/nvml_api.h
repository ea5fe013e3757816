// The few NVML declarations cupool needs, written here because no nvml.h is installed with the
// toolkit headers cupool builds against. They follow NVML's stable ABI (libnvidia-ml.so.1): the
// names, argument lists, struct layouts and codes are NVML's own. Also used by the simulated NVML
// (test/sim/libnvml_sim.cpp) and the test programs, so that all of them agree on one ABI.
#pragma once
// Plain C too: the test programs include C monitors linked against NVML.

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nvmlDevice_st* nvmlDevice_t;

// nvmlReturn_t: only the codes cupool, the simulated NVML and the tests use.
typedef enum nvmlReturn_enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
  NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

// nvmlDeviceGetMemoryInfo: used = total - free (what the driver and firmware reserve counts as used).
typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

// nvmlDeviceGetMemoryInfo_v2: `version` must be nvmlMemory_v2; used excludes `reserved`.
typedef struct nvmlMemory_v2_st {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;

// NVML_STRUCT_VERSION(Memory, 2): the struct's size with the version in the top byte.
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2U << 24U)))

// nvmlDeviceGetUUID's buffer: "GPU-" (or "MIG-") and the UUID in 8-4-4-4-12 hex digits, NUL included.
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char* nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory);

#ifdef __cplusplus
}  // extern "C"
#endif
