// The CUDA backend's entry points in a CPU-only build (FLASHATTN_ENABLE_CUDA=OFF):
// CUDA is reported as not built in, so AUTO resolves to the CPU.
#include "backends.hpp"
#include "error.hpp"

namespace flashattn {

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }

static flashattn_status_t unavailable() {
  return fail(FLASHATTN_STATUS_BACKEND_UNAVAILABLE, "backend=CUDA: this libflashattn was built without CUDA");
}

flashattn_status_t cuda_check_device(int) { return unavailable(); }
flashattn_status_t cuda_upload(int, const void*, size_t, void**) { return unavailable(); }
void cuda_free(int, void*) {}
CheckedSize cuda_workspace_size(const AttnParams&, int) { return 0; }
flashattn_status_t cuda_check(const AttnParams&, int) { return unavailable(); }
flashattn_status_t cuda_run(const AttnParams&, int, void*, size_t, struct CUstream_st*) { return unavailable(); }
flashattn_status_t cuda_combine(const CombineParams&, int, struct CUstream_st*) { return unavailable(); }

}  // namespace flashattn
