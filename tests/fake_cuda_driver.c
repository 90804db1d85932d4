/* A stand-in for the CUDA driver library (built as libcuda.so.1 in a folder of its own, never
 * installed) for test_host_memory: it answers the three driver calls the CPU backend's
 * device-memory probe makes (src/cpu/host_memory.cpp), so the probe runs without a GPU.
 * Pointers inside the range set by fake_cuda_set_range are "device memory of device 0"
 * (optionally managed, or on a device that uses the host page tables); every other pointer
 * is unknown to it (zeroed attributes), as host memory is to the real driver. IS_MANAGED is
 * written as one byte (a "boolean" in the driver's documentation), the narrowest reading. */
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

/* CUresult cuPointerGetAttributes(unsigned, CUpointer_attribute*, void**, CUdeviceptr): like the
 * real driver, a pointer it does not know gets zeroed attributes and CUDA_SUCCESS. */
int cuPointerGetAttributes(unsigned count, const int* attributes, void** data, unsigned long long ptr) {
  int known = ptr >= g_lo && ptr < g_hi;
  for (unsigned i = 0; i < count; ++i) {
    switch (attributes[i]) {
      case 2: *(unsigned int*)data[i] = known ? 2u : 0u; break;                      /* MEMORY_TYPE: DEVICE */
      case 8: *(unsigned char*)data[i] = (unsigned char)(known && g_managed); break; /* IS_MANAGED: bool */
      case 9: *(int*)data[i] = known ? 0 : -1; break;                                /* DEVICE_ORDINAL */
      default: return 1; /* CUDA_ERROR_INVALID_VALUE: an attribute the probe does not ask */
    }
  }
  return 0;
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
