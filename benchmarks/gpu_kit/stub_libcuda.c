/* For cpu_evidence.py on a machine without the NVIDIA driver: vLLM's extensions link
 * libcuda.so.1 for these entry points; each reports CUDA_ERROR_NO_DEVICE (100).
 * gcc -shared -fPIC -o libcuda.so.1 stub_libcuda.c */
#define NO_DEVICE 100
int cuInit(unsigned f) { return NO_DEVICE; }
int cuDeviceGetCount(int *n) { *n = 0; return NO_DEVICE; }
int cuDriverGetVersion(int *v) { return NO_DEVICE; }
int cuGetErrorString(int e, const char **s) { *s = "no NVIDIA driver (stub)"; return 0; }
int cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, void *st) { return NO_DEVICE; }
int cuCtxGetCurrent(void *c) { return NO_DEVICE; }
int cuCtxSetCurrent(void *c) { return NO_DEVICE; }
int cuDeviceGetAttribute(void *v, int a, int d) { return NO_DEVICE; }
int cuDevicePrimaryCtxRetain(void *c, int d) { return NO_DEVICE; }
int cuPointerGetAttribute(void *d, int a, unsigned long long p) { return NO_DEVICE; }
int cuMemAddressFree(unsigned long long p, unsigned long s) { return NO_DEVICE; }
int cuMemAddressReserve(void *p, unsigned long s, unsigned long a, unsigned long long b, unsigned long long f) { return NO_DEVICE; }
int cuMemCreate(void *h, unsigned long s, void *prop, unsigned long long f) { return NO_DEVICE; }
int cuMemGetAllocationGranularity(void *g, void *prop, int o) { return NO_DEVICE; }
int cuMemMap(unsigned long long p, unsigned long s, unsigned long o, unsigned long long h, unsigned long long f) { return NO_DEVICE; }
int cuMemRelease(unsigned long long h) { return NO_DEVICE; }
int cuMemSetAccess(unsigned long long p, unsigned long s, void *d, unsigned long c) { return NO_DEVICE; }
int cuMemUnmap(unsigned long long p, unsigned long s) { return NO_DEVICE; }
int cuTensorMapEncodeTiled(void *m, ...) { return NO_DEVICE; }
