/* A link stub for libnvidia-ml.so.1, as the toolkit ships for libcuda (lib64/stubs): it gives the
 * NVML programs of this suite a DT_NEEDED entry on a machine without the driver. It is never
 * loaded: at run time the driver's own libnvidia-ml.so.1 is found by its soname. Each function
 * says so if it ever runs. */
#include "nvml_api.h"

#define STUB { return NVML_ERROR_LIBRARY_NOT_FOUND; }
nvmlReturn_t nvmlInit_v2(void) STUB
nvmlReturn_t nvmlShutdown(void) STUB
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* n) { (void)n; STUB }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d) { (void)i; (void)d; STUB }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char* u, unsigned int l) { (void)d; (void)u; (void)l; STUB }
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) { (void)d; (void)m; STUB }
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t* m) { (void)d; (void)m; STUB }
