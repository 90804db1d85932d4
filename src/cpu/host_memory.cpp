// CPU backend: CUDA device memory passed where host memory is needed is refused with
// FLASHATTN_STATUS_WRONG_MEMORY_SPACE, where that is detectable without side effects.
//
// The probe asks the CUDA driver (cuPointerGetAttributes) only if the process has already
// loaded it (found among the loaded objects, then dlopen with RTLD_NOLOAD): a process that
// never touched CUDA loads, initializes and allocates nothing, and every pointer counts as
// host memory. A process holding device memory has loaded the driver, whichever runtime it
// uses. tests/test_host_memory.cpp runs the probe against a stand-in driver. Accepted: host memory (pageable
// or page-locked), managed memory, and device memory of a GPU that reads the host's page
// tables (CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, e.g. Grace
// Hopper, where the CPU can access it). The driver's ABI is stable: its enum values are
// spelled here so that the CPU-only build needs no CUDA header. cuPointerGetAttributes,
// not cuPointerGetAttribute: for a pointer the driver does not know (host memory, the
// common case) it answers CUDA_SUCCESS with zeroed attributes instead of an error, so a
// CPU run leaves no failed driver call behind (compute-sanitizer reports each one).
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <mutex>

#include "common/run_pointers.hpp"
#include "cpu/cpu_impl.hpp"
#include "error.hpp"

namespace flashattn {
namespace cpu {
namespace {

constexpr int kPointerAttrMemoryType = 2;        // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttrIsManaged = 8;         // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kPointerAttrDeviceOrdinal = 9;     // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kMemoryTypeDevice = 2;             // CU_MEMORYTYPE_DEVICE
constexpr int kDevAttrUsesHostPageTables = 100;  // CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES

struct Driver {
  int (*pointer_get_attributes)(unsigned count, int* attributes, void** data, unsigned long long ptr) = nullptr;
  int (*device_get)(int* device, int ordinal) = nullptr;
  int (*device_get_attribute)(int* value, int attribute, int device) = nullptr;
};

// Path of the loaded CUDA driver library (libcuda.so*), if any: a walk over the loaded
// objects in memory (~0.1 us; a dlopen(RTLD_NOLOAD) by name searches the file system when
// the library is not loaded, ~25 us per run).
int find_driver(struct dl_phdr_info* info, size_t, void* data) {
  const char* name = info->dlpi_name;
  if (name == nullptr) return 0;
  const char* slash = strrchr(name, '/');
  if (strncmp(slash != nullptr ? slash + 1 : name, "libcuda.so", 10) != 0) return 0;
  *static_cast<const char**>(data) = name;
  return 1;
}

// The loader's counts of objects added and removed so far (dlpi_adds, dlpi_subs), read from
// the first object a walk visits; valid where the C library reports them.
struct LoaderCounts {
  unsigned long long adds = 0, subs = 0;
  bool valid = false;
};
int read_counts(struct dl_phdr_info* info, size_t size, void* data) {
  auto* c = static_cast<LoaderCounts*>(data);
  if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
    c->adds = info->dlpi_adds;
    c->subs = info->dlpi_subs;
    c->valid = true;
  }
  return 1;  // the first object is enough
}

// The driver's entry points once the process has loaded it; NULL before (checked again
// at the next run: a process may start using CUDA after its first CPU run). A search that
// found no driver is repeated only once the loader has added or removed objects since, so
// a process without CUDA pays one visit per check rather than a walk over every loaded
// object (hundreds in a Python process with torch).
const Driver* loaded_driver() {
  static std::mutex mutex;
  static Driver driver;
  static bool found = false;
  static LoaderCounts searched;  // the counts at the last search that found no driver
  std::lock_guard<std::mutex> lock(mutex);
  if (!found) {
    LoaderCounts now;
    dl_iterate_phdr(read_counts, &now);
    if (now.valid && searched.valid && now.adds == searched.adds && now.subs == searched.subs) return nullptr;
    searched = now;
    const char* path = nullptr;
    dl_iterate_phdr(find_driver, &path);
    if (path == nullptr) return nullptr;
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h == nullptr) return nullptr;
    driver.pointer_get_attributes =
        reinterpret_cast<decltype(driver.pointer_get_attributes)>(dlsym(h, "cuPointerGetAttributes"));
    driver.device_get = reinterpret_cast<decltype(driver.device_get)>(dlsym(h, "cuDeviceGet"));
    driver.device_get_attribute =
        reinterpret_cast<decltype(driver.device_get_attribute)>(dlsym(h, "cuDeviceGetAttribute"));
    // The handle stays open: the driver was loaded before and stays for the process.
    found = driver.pointer_get_attributes != nullptr && driver.device_get != nullptr &&
            driver.device_get_attribute != nullptr;
    if (!found) return nullptr;
  }
  return &driver;
}

// Device memory the CPU cannot access; false for anything the driver does not know
// (including every pointer while the driver is not initialized).
bool device_only(const Driver& d, const void* ptr, int* ordinal) {
  const unsigned long long address = reinterpret_cast<uintptr_t>(ptr);
  // IS_MANAGED is documented as "a boolean": read through a zeroed 4-byte slot, so a
  // 1-byte write reads the same as a 4-byte one.
  unsigned type = 0, managed = 0;
  int dev_ordinal = -1, dev = 0, host_page_tables = 0;
  int attributes[3] = {kPointerAttrMemoryType, kPointerAttrIsManaged, kPointerAttrDeviceOrdinal};
  void* data[3] = {&type, &managed, &dev_ordinal};
  if (d.pointer_get_attributes(3, attributes, data, address) != 0 || type != kMemoryTypeDevice || managed != 0)
    return false;
  *ordinal = dev_ordinal;
  if (d.device_get(&dev, dev_ordinal) == 0 &&
      d.device_get_attribute(&host_page_tables, kDevAttrUsesHostPageTables, dev) == 0 && host_page_tables != 0)
    return false;
  return true;
}

flashattn_status_t check_with(const Driver* d, const void* ptr, const char* name) {
  int ordinal = -1;
  if (d == nullptr || ptr == nullptr || !device_only(*d, ptr, &ordinal)) return FLASHATTN_STATUS_SUCCESS;
  return fail(FLASHATTN_STATUS_WRONG_MEMORY_SPACE,
              "%s=%p is memory of CUDA device %d; the CPU backend needs host memory (or managed memory)", name, ptr,
              ordinal);
}

}  // namespace

flashattn_status_t check_host_memory(const void* ptr, const char* name) {
  return ptr == nullptr ? FLASHATTN_STATUS_SUCCESS : check_with(loaded_driver(), ptr, name);
}

flashattn_status_t check_host_memory(const AttnParams& p) {
  const Driver* d = loaded_driver();  // once per run, not per pointer
  if (d == nullptr) return FLASHATTN_STATUS_SUCCESS;
  for (const NamedPointer& n : run_pointers(p)) FA_TRY(check_with(d, n.ptr, n.name));
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace cpu
}  // namespace flashattn
