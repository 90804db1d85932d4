/* A stand-in for the CUDA driver library (built as libcuda.so.1 in a folder of its own, never
 * installed) for test_host_memory: it answers the three driver calls the CPU backend's
 * device-memory probe makes (src/cpu/host_memory.cpp), so the probe runs without a GPU.
 * Pointers inside the range set by fake_cuda_set_range are "device memory of device 0"
 * (optionally managed, or on a device that uses the host page tables); every other pointer
 * is unknown to it (CUDA_ERROR_INVALID_VALUE), as host memory is to the real driver. */
#include <stddef.h>
#include <stdint.h>

static uintptr_t g_lo, g_hi;
static int g_managed, g_host_page_tables;

void fake_cuda_set_range(const void* p, size_t bytes, int managed, int host_page_tables) {
  g_lo = (uintptr_t)p;
  g_hi = g_lo + bytes;
  g_managed = managed;
  g_host_page_tables = host_page_tables;
}

/* CUresult cuPointerGetAttribute(void*, CUpointer_attribute, CUdeviceptr) */
int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  if (ptr < g_lo || ptr >= g_hi) return 1; /* CUDA_ERROR_INVALID_VALUE */
  switch (attribute) {
    case 2: *(unsigned int*)data = 2u; return 0;         /* MEMORY_TYPE: CU_MEMORYTYPE_DEVICE */
    case 8: *(unsigned int*)data = (unsigned)g_managed; return 0; /* IS_MANAGED */
    case 9: *(int*)data = 0; return 0;                   /* DEVICE_ORDINAL */
    default: return 1;
  }
}

int cuDeviceGet(int* device, int ordinal) {
  *device = ordinal;
  return 0;
}

int cuDeviceGetAttribute(int* value, int attribute, int device) {
  (void)device;
  if (attribute != 100) return 1; /* PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES */
  *value = g_host_page_tables;
  return 0;
}
