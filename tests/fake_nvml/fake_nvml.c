/*
 * A driver-level fake of libnvidia-ml.so.1 for tests: the real nvidia-ml-py (pynvml) loads it
 * with dlopen exactly as it loads NVIDIA's library, and calls the same symbols. What the
 * "driver" answers comes from a scenario file named by $FAKE_NVML_SCENARIO (format in
 * README.md beside this file), read at nvmlInit, so every process (the CLI, a probe started
 * over SSH) sees the same node.
 *
 * Only the symbols kvforensics' NVML collector and nvidia-smi-style queries need are here.
 * Struct layouts follow nvml.h (and pynvml's ctypes mirrors of it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NO_PERMISSION = 4, NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18, NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
};

#define MAX_GPUS 16
#define MAX_PROCS 64
#define NVML_MEMORY_V2 0x02000028u

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
/* Process-info layouts across drivers (shared research, peers.md §3.2). */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } proc_v1_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } proc_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId;
                 unsigned long long usedGpuCcProtectedMemory; } proc_cc_t; /* R535.43-535.86 */

typedef struct { unsigned int pid; unsigned long long used; int graphics; } fake_proc_t;
typedef struct {
    int present, lost, mig, memory_err, processes_err;
    char uuid[96], name[96], bus[32];
    unsigned long long total, reserved, used, free;
    int nproc;
    fake_proc_t procs[MAX_PROCS];
} fake_gpu_t;

static fake_gpu_t gpus[MAX_GPUS];
static int ngpus = 0;
static int initialised = 0;
static int init_error = 0;
static int memory_api = 2;          /* 2: _v2 exists; 1: only v1 */
static char process_api[8] = "v3";  /* v3 | v2 | v1 | cc */
static char driver[64] = "580.95.05", nvml_version[64] = "13.580.95.05";
static int cuda_version = 13000;

static int error_code(const char *name) {
    if (!strcmp(name, "ok")) return NVML_SUCCESS;
    if (!strcmp(name, "not_supported")) return NVML_ERROR_NOT_SUPPORTED;
    if (!strcmp(name, "no_permission")) return NVML_ERROR_NO_PERMISSION;
    if (!strcmp(name, "driver_not_loaded")) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (!strcmp(name, "rm_version_mismatch")) return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    if (!strcmp(name, "gpu_lost")) return NVML_ERROR_GPU_IS_LOST;
    if (!strcmp(name, "unknown")) return NVML_ERROR_UNKNOWN;
    return NVML_ERROR_UNKNOWN;
}

static void set_gpu_field(fake_gpu_t *g, const char *key, const char *value) {
    if (!strcmp(key, "uuid")) snprintf(g->uuid, sizeof g->uuid, "%s", value);
    else if (!strcmp(key, "name")) {
        snprintf(g->name, sizeof g->name, "%s", value);
        for (char *p = g->name; *p; p++) if (*p == '_') *p = ' ';
    }
    else if (!strcmp(key, "bus")) snprintf(g->bus, sizeof g->bus, "%s", value);
    else if (!strcmp(key, "total")) g->total = strtoull(value, NULL, 10);
    else if (!strcmp(key, "reserved")) g->reserved = strtoull(value, NULL, 10);
    else if (!strcmp(key, "used")) g->used = strtoull(value, NULL, 10);
    else if (!strcmp(key, "free")) g->free = strtoull(value, NULL, 10);
    else if (!strcmp(key, "mig")) g->mig = atoi(value);
    else if (!strcmp(key, "state")) g->lost = !strcmp(value, "lost");
    else if (!strcmp(key, "memory")) g->memory_err = error_code(value);
    else if (!strcmp(key, "processes")) g->processes_err = error_code(value);
}

/* $FAKE_NVML_SCENARIO, else "scenario.txt" beside this library: a probe started by sshd does
 * not inherit the test's environment, but it can be pointed at a copy of the library. */
static const char *scenario_path(void) {
    static char beside[4096];
    const char *env = getenv("FAKE_NVML_SCENARIO");
    if (env) return env;
    Dl_info info;
    if (!dladdr((void *)scenario_path, &info) || !info.dli_fname) return NULL;
    snprintf(beside, sizeof beside, "%s", info.dli_fname);
    char *slash = strrchr(beside, '/');
    if (!slash) return NULL;
    snprintf(slash + 1, sizeof beside - (size_t)(slash + 1 - beside), "scenario.txt");
    return beside;
}

static void load_scenario(void) {
    const char *path = scenario_path();
    memset(gpus, 0, sizeof gpus);
    ngpus = 0;
    init_error = 0;
    /* Each scenario starts from a current driver: a directive of an earlier scenario (loaded into the
     * same process) must not leak into the next one. */
    memory_api = 2;
    snprintf(process_api, sizeof process_api, "v3");
    if (!path) return;
    FILE *f = fopen(path, "r");
    if (!f) { init_error = getenv("FAKE_NVML_SCENARIO") ? NVML_ERROR_UNKNOWN : 0; return; }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *save = NULL;
        char *word = strtok_r(line, " \t\r\n", &save);
        if (!word || word[0] == '#') continue;
        if (!strcmp(word, "driver")) { char *v = strtok_r(NULL, " \t\r\n", &save); if (v) snprintf(driver, sizeof driver, "%s", v); }
        else if (!strcmp(word, "nvml")) { char *v = strtok_r(NULL, " \t\r\n", &save); if (v) snprintf(nvml_version, sizeof nvml_version, "%s", v); }
        else if (!strcmp(word, "cuda")) { char *v = strtok_r(NULL, " \t\r\n", &save); if (v) cuda_version = atoi(v); }
        else if (!strcmp(word, "init")) { char *v = strtok_r(NULL, " \t\r\n", &save); if (v) init_error = error_code(v); }
        else if (!strcmp(word, "memory_api")) { char *v = strtok_r(NULL, " \t\r\n", &save); if (v) memory_api = !strcmp(v, "v1") ? 1 : 2; }
        else if (!strcmp(word, "process_api")) { char *v = strtok_r(NULL, " \t\r\n", &save); if (v) snprintf(process_api, sizeof process_api, "%s", v); }
        else if (!strcmp(word, "gpu")) {
            char *idx = strtok_r(NULL, " \t\r\n", &save);
            if (!idx) continue;
            int i = atoi(idx);
            if (i < 0 || i >= MAX_GPUS) continue;
            fake_gpu_t *g = &gpus[i];
            g->present = 1;
            char *kv;
            while ((kv = strtok_r(NULL, " \t\r\n", &save))) {
                char *eq = strchr(kv, '=');
                if (!eq) continue;
                *eq = 0;
                set_gpu_field(g, kv, eq + 1);
            }
            if (g->free == 0 && g->total > g->reserved + g->used) g->free = g->total - g->reserved - g->used;
            if (i + 1 > ngpus) ngpus = i + 1;
        } else if (!strcmp(word, "proc")) {
            char *idx = strtok_r(NULL, " \t\r\n", &save), *kind = strtok_r(NULL, " \t\r\n", &save);
            char *pid = strtok_r(NULL, " \t\r\n", &save), *used = strtok_r(NULL, " \t\r\n", &save);
            if (!idx || !kind || !pid || !used) continue;
            int i = atoi(idx);
            if (i < 0 || i >= MAX_GPUS || gpus[i].nproc >= MAX_PROCS) continue;
            fake_proc_t *p = &gpus[i].procs[gpus[i].nproc++];
            p->pid = (unsigned int)strtoul(pid, NULL, 10);
            p->used = !strcmp(used, "na") ? ~0ULL : strtoull(used, NULL, 10);
            p->graphics = !strcmp(kind, "graphics");
        }
    }
    fclose(f);
}

#define CHECK_INIT() do { if (!initialised) return NVML_ERROR_UNINITIALIZED; } while (0)

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    load_scenario();
    if (init_error) return init_error;
    initialised = 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { CHECK_INIT(); initialised = 0; return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_string(char *dst, unsigned int len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) { CHECK_INIT(); return copy_string(v, len, driver); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) { CHECK_INIT(); return copy_string(v, len, nvml_version); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { CHECK_INIT(); if (!v) return NVML_ERROR_INVALID_ARGUMENT; *v = cuda_version; return NVML_SUCCESS; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { CHECK_INIT(); if (!count) return NVML_ERROR_INVALID_ARGUMENT; *count = (unsigned int)ngpus; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

typedef fake_gpu_t *nvmlDevice_t;

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    CHECK_INIT();
    if (!device || index >= (unsigned int)ngpus || !gpus[index].present) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpus[index].lost) return NVML_ERROR_GPU_IS_LOST;
    *device = &gpus[index];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) { return nvmlDeviceGetHandleByIndex_v2(index, device); }

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    CHECK_INIT();
    if (!d || !index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)(d - gpus);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) { CHECK_INIT(); if (!d) return NVML_ERROR_INVALID_ARGUMENT; return copy_string(uuid, len, d->uuid); }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) { CHECK_INIT(); if (!d) return NVML_ERROR_INVALID_ARGUMENT; return copy_string(name, len, d->name); }

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    CHECK_INIT();
    if (!d || !pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", d->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%.15s", d->bus + (strlen(d->bus) > 12 ? 4 : 0));
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(d, pci); }

/* v1: used = allocated + reserved, total = free + used (NVIDIA's nvmlMemory_t docs). */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    CHECK_INIT();
    if (!d || !m) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->memory_err) return d->memory_err;
    m->total = d->total;
    m->free = d->free;
    m->used = d->used + d->reserved;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    CHECK_INIT();
    if (memory_api < 2) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!d || !m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (d->memory_err) return d->memory_err;
    m->total = d->total;
    m->reserved = d->reserved;
    m->free = d->free;
    m->used = d->used;
    return NVML_SUCCESS;
}

/* The two-call protocol: NULL (or too small) -> INSUFFICIENT_SIZE with the count needed. */
static nvmlReturn_t list_processes(nvmlDevice_t d, unsigned int *count, void *infos, int graphics, int layout) {
    CHECK_INIT();
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->processes_err) return d->processes_err;
    unsigned int n = 0;
    for (int i = 0; i < d->nproc; i++) if (d->procs[i].graphics == graphics) n++;
    if (n == 0) { *count = 0; return NVML_SUCCESS; }
    if (!infos || *count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    unsigned int k = 0;
    for (int i = 0; i < d->nproc; i++) {
        fake_proc_t *p = &d->procs[i];
        if (p->graphics != graphics) continue;
        if (layout == 1) { proc_v1_t *o = (proc_v1_t *)infos + k; o->pid = p->pid; o->usedGpuMemory = p->used; }
        else if (layout == 2) { proc_v2_t *o = (proc_v2_t *)infos + k; o->pid = p->pid; o->usedGpuMemory = p->used; o->gpuInstanceId = o->computeInstanceId = 0xFFFFFFFFu; }
        else { proc_cc_t *o = (proc_cc_t *)infos + k; o->pid = p->pid; o->usedGpuMemory = p->used; o->gpuInstanceId = o->computeInstanceId = 0xFFFFFFFFu; o->usedGpuCcProtectedMemory = 0; }
        k++;
    }
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t by_api(const char *fn_version, nvmlDevice_t d, unsigned int *count, void *infos, int graphics) {
    /* which symbol generations this "driver" has, and the layout each one writes */
    if (!strcmp(fn_version, "v3")) {
        if (!strcmp(process_api, "v3")) return list_processes(d, count, infos, graphics, 2);
        if (!strcmp(process_api, "cc")) return list_processes(d, count, infos, graphics, 3);
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    if (!strcmp(fn_version, "v2")) {
        if (!strcmp(process_api, "v1")) return NVML_ERROR_FUNCTION_NOT_FOUND;
        return list_processes(d, count, infos, graphics, 2);
    }
    return list_processes(d, count, infos, graphics, 1);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) { return by_api("v3", d, c, i, 0); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) { return by_api("v2", d, c, i, 0); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) { return by_api("v1", d, c, i, 0); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) { return by_api("v3", d, c, i, 1); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) { return by_api("v2", d, c, i, 1); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) { return by_api("v1", d, c, i, 1); }

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    CHECK_INIT();
    if (!d || !current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig < 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)d->mig;
    return NVML_SUCCESS;
}
