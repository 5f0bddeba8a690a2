/* A stand-in for the driver's libnvidia-ml.so.1, built with gcc by the tests: two devices with
 * chosen readings, device 1 does not support power readings (NVML_ERROR_NOT_SUPPORTED = 3).
 * It exports the C symbols and structure layouts that the real nvidia-ml-py bindings call, so
 * the bindings run unchanged against it. */
#include <string.h>

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { int index; } device_t;

static device_t devices[2] = {{0}, {1}};
static const char *names[2] = {"Fake H100 80GB", "Fake T4"};

int nvmlInitWithFlags(unsigned int flags) { (void)flags; return 0; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int result) {
    return result == 3 ? "Not Supported" : "Unknown Error";
}
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, device_t **device) {
    if (index > 1) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *device = &devices[index];
    return 0;
}
int nvmlDeviceGetName(device_t *d, char *name, unsigned int length) {
    strncpy(name, names[d->index], length - 1);
    name[length - 1] = 0;
    return 0;
}
int nvmlDeviceGetUtilizationRates(device_t *d, nvmlUtilization_t *u) {
    u->gpu = d->index == 0 ? 87 : 12;
    u->memory = d->index == 0 ? 40 : 3;
    return 0;
}
int nvmlDeviceGetMemoryInfo(device_t *d, nvmlMemory_t *m) {
    m->total = d->index == 0 ? 85899345920ULL : 16106127360ULL;
    m->used = d->index == 0 ? 42949672960ULL : 1073741824ULL;
    m->free = m->total - m->used;
    return 0;
}
int nvmlDeviceGetTemperature(device_t *d, int sensor, unsigned int *temp) {
    (void)sensor;
    *temp = d->index == 0 ? 71 : 44;
    return 0;
}
int nvmlDeviceGetPowerUsage(device_t *d, unsigned int *mw) {
    if (d->index == 1) return 3; /* NVML_ERROR_NOT_SUPPORTED */
    *mw = 312500;
    return 0;
}
