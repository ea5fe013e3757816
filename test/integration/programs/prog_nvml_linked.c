/* A C monitor as nvidia-smi-style tools and DCGM clients are built: linked against libcuda and
 * libnvidia-ml (DT_NEEDED, loaded at start-up, never dlopened), asking NVML for memory info before
 * and after it reaches CUDA, from the thread with a context and from one without. Under cupool
 * at 51ba0d9 every such program died with SIGSEGV at its first query after CUDA (issue 25: the
 * shim searched NVML through a link_map, which is no handle for an object loaded at start-up).
 * It checks what a monitor relies on: every query succeeds, used = total - free, v1 and v2
 * agree. Environment: PROG_EXPECT_TOTAL=<bytes> (a cap is set): NVML's total of the device in
 * use must be that, and NVML's answer cuMemGetInfo's on the same device. */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_api.h"

static int failures = 0;

#define CHECK(cond, what)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, what);       \
            ++failures;                                                     \
        }                                                                   \
    } while (0)
#define CU(call) CHECK((call) == CUDA_SUCCESS, #call)
#define NV(call) CHECK((call) == NVML_SUCCESS, #call)

/* The NVML device that is CUDA's `dev` (NVML numbers devices in its own order): by UUID. */
static nvmlDevice_t nvml_device_of(CUdevice dev) {
    CUuuid uuid;
    char want[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    const unsigned char* b;
    unsigned int n = 0, i;
    if (cuDeviceGetUuid(&uuid, dev) != CUDA_SUCCESS) return NULL;
    b = (const unsigned char*)uuid.bytes;
    snprintf(want, sizeof want, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    if (nvmlDeviceGetCount_v2(&n) != NVML_SUCCESS) return NULL;
    for (i = 0; i < n; ++i) {
        nvmlDevice_t d;
        char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {0};
        if (nvmlDeviceGetHandleByIndex_v2(i, &d) == NVML_SUCCESS &&
            nvmlDeviceGetUUID(d, text, sizeof text) == NVML_SUCCESS && strcmp(text, want) == 0)
            return d;
    }
    return NULL;
}

/* Both queries of one device: consistent with each other and with themselves. */
static void query(nvmlDevice_t d, nvmlMemory_t* out) {
    nvmlMemory_v2_t v2;
    memset(&v2, 0, sizeof v2);
    v2.version = nvmlMemory_v2;
    NV(nvmlDeviceGetMemoryInfo(d, out));
    NV(nvmlDeviceGetMemoryInfo_v2(d, &v2));
    CHECK(out->total > 0 && out->free <= out->total && out->used == out->total - out->free, "v1 used != total - free");
    CHECK(v2.total == out->total && v2.free == out->free, "v2 disagrees with v1");
}

struct Probe {
    nvmlDevice_t device;
    nvmlMemory_t seen;
};

/* A monitor's sampling thread: it has no CUDA context at all. */
static void* sample(void* arg) {
    struct Probe* p = (struct Probe*)arg;
    query(p->device, &p->seen);
    return NULL;
}

int main(void) {
    unsigned int count = 0, i;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr ptr;
    size_t cuda_free = 0, cuda_total = 0;
    const size_t bytes = (size_t)64 << 20;
    nvmlDevice_t mine;
    nvmlMemory_t m;
    struct Probe probe;
    pthread_t t;
    const char* expect_total = getenv("PROG_EXPECT_TOTAL");

    NV(nvmlInit_v2());
    NV(nvmlDeviceGetCount_v2(&count));
    CHECK(count > 0, "no NVML device");
    for (i = 0; i < count; ++i) { /* before the process reaches CUDA: NVML's own answer */
        nvmlDevice_t d;
        NV(nvmlDeviceGetHandleByIndex_v2(i, &d));
        query(d, &m);
    }

    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuCtxCreate(&ctx, NULL, 0, dev));
    mine = nvml_device_of(dev);
    CHECK(mine != NULL, "no NVML device has CUDA device 0's UUID");
    CU(cuMemAlloc(&ptr, bytes));
    CU(cuMemsetD8(ptr, 0x5a, bytes));
    CU(cuCtxSynchronize());
    CU(cuMemGetInfo(&cuda_free, &cuda_total));
    if (mine) {
        query(mine, &m);
        /* Governed by a cap, NVML says what cuMemGetInfo says. (A real driver's NVML and CUDA count
         * the device differently, so without one they need not agree: the H200's NVML total is
         * 150754820096 bytes, cuMemGetInfo's 150109880320.) */
        if (expect_total) {
            CHECK(m.total == strtoull(expect_total, NULL, 10), "NVML's total is not the cap");
            CHECK(m.total == cuda_total, "NVML's total is not cuMemGetInfo's");
            CHECK(m.free == cuda_free, "NVML's free is not cuMemGetInfo's");
        }
        probe.device = mine;
        CHECK(pthread_create(&t, NULL, sample, &probe) == 0, "pthread_create");
        pthread_join(t, NULL);
        CHECK(probe.seen.total == m.total && probe.seen.free == m.free, "a thread without a context sees other memory");
    }
    for (i = 0; i < count; ++i) { /* every device, as nvidia-smi lists them */
        nvmlDevice_t d;
        NV(nvmlDeviceGetHandleByIndex_v2(i, &d));
        query(d, &m);
    }
    CU(cuMemFree(ptr));
    CU(cuCtxDestroy(ctx));
    NV(nvmlShutdown());
    printf("{\"allocs\": 1, \"frees\": 1, \"bytes\": %zu}\n", bytes);
    return failures == 0 ? 0 : 1;
}
