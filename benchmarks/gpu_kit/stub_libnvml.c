/* For checking a kit on a machine without the NVIDIA driver: a libnvidia-ml.so.1 that
 * reports two H200s (compute capability 9.0), so vLLM's own platform detection (its
 * pynvml copy, vllm/third_party) picks the CUDA platform as on the GPU hosts. Use it
 * with stub_libcuda.c, which reports no CUDA device to the CUDA runtime.
 * gcc -shared -fPIC -o libnvidia-ml.so.1 stub_libnvml.c */
#include <string.h>
#define OK 0
#define NOT_SUPPORTED 3
#define INVALID_ARGUMENT 2
typedef struct { unsigned long long total, free, used; } mem_t;
static const char *NAME = "NVIDIA H200";
static int index_of(void *h) { return (int)((unsigned long)h) - 1; }
int nvmlInit_v2(void) { return OK; }
int nvmlInit(void) { return OK; }
int nvmlInitWithFlags(unsigned flags) { return OK; }
int nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(int r) { return r == OK ? "Success" : "Not Supported (stub)"; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return OK; }
int nvmlDeviceGetCount(unsigned *n) { *n = 2; return OK; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
  if (i >= 2) return INVALID_ARGUMENT;
  *h = (void *)(unsigned long)(i + 1); return OK; }
int nvmlDeviceGetHandleByIndex(unsigned i, void **h) { return nvmlDeviceGetHandleByIndex_v2(i, h); }
int nvmlDeviceGetIndex(void *h, unsigned *i) { *i = index_of(h); return OK; }
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) { *major = 9; *minor = 0; return OK; }
int nvmlDeviceGetName(void *h, char *name, unsigned len) { strncpy(name, NAME, len); return OK; }
int nvmlDeviceGetUUID(void *h, char *uuid, unsigned len) {
  strncpy(uuid, index_of(h) ? "GPU-00000000-0000-0000-0000-000000000001"
                            : "GPU-00000000-0000-0000-0000-000000000000", len); return OK; }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
  m->total = 143771ULL << 20; m->free = m->total; m->used = 0; return OK; }
int nvmlDeviceGetP2PStatus(void *a, void *b, int what, int *status) { *status = 0; return OK; }
int nvmlSystemGetDriverVersion(char *v, unsigned len) { strncpy(v, "580.159.04", len); return OK; }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 13000; return OK; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return OK; }
int nvmlDeviceGetNumaNodeId(void *h, unsigned *n) { *n = 0; return OK; }
int nvmlDeviceGetCpuAffinity(void *h, unsigned n, unsigned long *set) { return NOT_SUPPORTED; }
int nvmlDeviceGetPciInfo_v3(void *h, void *pci) { return NOT_SUPPORTED; }
