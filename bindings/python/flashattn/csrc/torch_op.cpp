// The eager fast path of flashattn.attention on torch tensors, as a compiled torch op.
//
// A Python autograd.Function costs tens of microseconds per forward + backward (the
// autograd engine's round trip into Python); this op keeps the whole call in C++: the
// op flashattn_ext::attention has CPU and CUDA kernels and an autograd kernel (a C++
// torch::autograd::Function) whose forward and backward are the ops flashattn_ext::fwd
// and flashattn_ext::bwd. It serves dense 4-D q, k, v in (batch, seq, heads, dim) order
// with any strides, packed variable-length q, k, v (3-D (tokens, heads, dim) with int32
// cu_seqlens offsets on their device, read by the library alone, and the maximum lengths
// the caller gives), band masks (causal, window, either alignment), scale, softcap, GQA,
// an additive bias (the 4-D one flashattn/_torch.py makes of bias, attn_mask and
// key_padding_mask, broadcast dims of size 1, its gradient when it requires one), ALiBi
// slopes (heads) or (batch, heads), dropout, block-sparse layouts (a host uint8 tensor,
// whose bytes key the plan) and the algorithm choice; the Python entry below sends any
// input the Python path would refuse in Python down that path (flashattn/_torch_ops.py).
// Dropout runs on the (seed, offset) the Python side drew for the call
// (flashattn._torch._dropout_rng, from torch's generator), set on the plan before each
// run as that path does, and the backward reuses the forward's.
//
// It calls the C API of the libflashattn the Python package loaded (init() resolves the
// symbols from that library with dlopen(RTLD_NOLOAD), once: one library per process, of
// the version of the flashattn.h compiled in; the ops refuse to run before), on plans
// cached by shapes, strides, dtype, device and options and configured by the same setter
// calls as flashattn/_torch_plans.py makes, so results are bitwise those of the Python
// path. Outputs and workspaces come from torch's allocator (the caching allocator on
// CUDA), runs go to the current stream, nothing synchronizes. A failing C call raises the
// Python path's exception (flashattn._lib.error_class) with the library's message.
// Built on demand by flashattn/torch_ext.py.
#include <dlfcn.h>
#include <torch/extension.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "flashattn.h"

namespace {

namespace py = pybind11;
using at::Tensor;

// ------------------------------------------------------------------ the C API

struct Api {
  decltype(&flashattn_get_version) get_version = nullptr;
  decltype(&flashattn_plan_create) plan_create = nullptr;
  decltype(&flashattn_plan_destroy) plan_destroy = nullptr;
  decltype(&flashattn_plan_set_shape) set_shape = nullptr;
  decltype(&flashattn_plan_set_dtype) set_dtype = nullptr;
  decltype(&flashattn_plan_set_strides) set_strides = nullptr;
  decltype(&flashattn_plan_set_band_mask) set_band_mask = nullptr;
  decltype(&flashattn_plan_set_softmax_scale) set_scale = nullptr;
  decltype(&flashattn_plan_set_softcap) set_softcap = nullptr;
  decltype(&flashattn_plan_set_dropout) set_dropout = nullptr;
  decltype(&flashattn_plan_set_bias) set_bias = nullptr;
  decltype(&flashattn_plan_set_alibi_batch_stride) set_alibi_batch_stride = nullptr;
  decltype(&flashattn_plan_set_deterministic) set_deterministic = nullptr;
  decltype(&flashattn_plan_set_algorithm) set_algorithm = nullptr;
  decltype(&flashattn_plan_set_varlen) set_varlen = nullptr;
  decltype(&flashattn_plan_set_block_sparse) set_block_sparse = nullptr;
  decltype(&flashattn_plan_get_workspace_size) workspace_size = nullptr;
  decltype(&flashattn_fwd) fwd = nullptr;
  decltype(&flashattn_bwd) bwd = nullptr;
  decltype(&flashattn_last_error) last_error = nullptr;
  decltype(&flashattn_status_string) status_string = nullptr;
};

// The bound C API: null until init() has bound it, then fixed for the life of the
// process (readers never see it change).
std::atomic<const Api*> bound{nullptr};

// The bound C API; refuses to run before init().
const Api& api() {
  const Api* a = bound.load(std::memory_order_acquire);
  TORCH_CHECK(a != nullptr, "flashattn_ext: init() has not bound the op to a loaded libflashattn");
  return *a;
}

template <class F>
void resolve(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  TORCH_CHECK(fn != nullptr, "flashattn_ext: the loaded libflashattn lacks ", name);
}

// Binds the C API to the library at `path`, which must already be loaded (by the Python
// package) and be the version of the flashattn.h this op was compiled against; the
// reference dlopen takes is kept for the life of the process. Binds once: a later call
// for the same library does nothing, one for another library is refused.
void init(const std::string& path) {
  static std::mutex mutex;
  static void* bound_lib = nullptr;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  TORCH_CHECK(lib != nullptr, "flashattn_ext: ", path, " is not loaded in this process");
  std::lock_guard<std::mutex> lock(mutex);
  if (bound_lib != nullptr) {
    dlclose(lib);  // the reference taken by the first init() stays
    TORCH_CHECK(lib == bound_lib, "flashattn_ext: already bound to another libflashattn than ", path);
    return;
  }
  auto a = std::make_unique<Api>();
  resolve(lib, a->get_version, "flashattn_get_version");
  int major = -1, minor = -1, patch = -1;
  a->get_version(&major, &minor, &patch);
  if (major != FLASHATTN_VERSION_MAJOR || minor != FLASHATTN_VERSION_MINOR || patch != FLASHATTN_VERSION_PATCH) {
    dlclose(lib);
    TORCH_CHECK(false, "flashattn_ext: ", path, " is libflashattn ", major, ".", minor, ".", patch,
                " but this build of the op was compiled against flashattn.h ", FLASHATTN_VERSION_MAJOR, ".",
                FLASHATTN_VERSION_MINOR, ".", FLASHATTN_VERSION_PATCH,
                ": rebuild it (python -m flashattn.torch_ext build)");
  }
  resolve(lib, a->plan_create, "flashattn_plan_create");
  resolve(lib, a->plan_destroy, "flashattn_plan_destroy");
  resolve(lib, a->set_shape, "flashattn_plan_set_shape");
  resolve(lib, a->set_dtype, "flashattn_plan_set_dtype");
  resolve(lib, a->set_strides, "flashattn_plan_set_strides");
  resolve(lib, a->set_band_mask, "flashattn_plan_set_band_mask");
  resolve(lib, a->set_scale, "flashattn_plan_set_softmax_scale");
  resolve(lib, a->set_softcap, "flashattn_plan_set_softcap");
  resolve(lib, a->set_dropout, "flashattn_plan_set_dropout");
  resolve(lib, a->set_bias, "flashattn_plan_set_bias");
  resolve(lib, a->set_alibi_batch_stride, "flashattn_plan_set_alibi_batch_stride");
  resolve(lib, a->set_deterministic, "flashattn_plan_set_deterministic");
  resolve(lib, a->set_algorithm, "flashattn_plan_set_algorithm");
  resolve(lib, a->set_varlen, "flashattn_plan_set_varlen");
  resolve(lib, a->set_block_sparse, "flashattn_plan_set_block_sparse");
  resolve(lib, a->workspace_size, "flashattn_plan_get_workspace_size");
  resolve(lib, a->fwd, "flashattn_fwd");
  resolve(lib, a->bwd, "flashattn_bwd");
  resolve(lib, a->last_error, "flashattn_last_error");
  resolve(lib, a->status_string, "flashattn_status_string");
  bound_lib = lib;
  bound.store(a.release(), std::memory_order_release);  // never freed: plans may outlive any scope
}

// UTF-8 bytes as a str, undecodable bytes replaced (flashattn._lib.last_error's decoding).
py::str utf8(const std::string& s) {
  PyObject* str = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (str == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(str);
}

// Raises what flashattn._lib.check raises for this status: the FlashAttnError subclass
// of the status, with the library's message for the calling thread.
[[noreturn]] void raise_status(flashattn_status_t status, const char* function) {
  std::string message = api().last_error();
  if (message.empty()) message = "(no message)";
  const std::string name = api().status_string(status);
  py::gil_scoped_acquire gil;
  py::object error_class = py::module_::import("flashattn._lib").attr("error_class")(static_cast<int>(status));
  py::object error = error_class(static_cast<int>(status), utf8(message), function, utf8(name));
  PyErr_SetObject(error_class.ptr(), error.ptr());
  throw py::error_already_set();
}

void check(flashattn_status_t status, const char* function) {
  if (status != FLASHATTN_STATUS_SUCCESS) raise_status(status, function);
}

// ------------------------------------------------------------------ plans

// The options of one call, as flashattn/_torch.py computes them.
struct Options {
  int64_t max_seqlen_q, max_seqlen_k;  // varlen only: the lengths the plan is made for
  int64_t window_left, window_right;
  bool bottom_right;
  double scale, softcap;  // 0: the default scale, no softcap
  bool alibi_symmetric;
  double dropout_p;          // 0: no dropout
  int64_t block_q, block_k;  // the block-sparse layout's block sizes
  bool deterministic;
  int64_t algorithm;
};

// The Philox seed and offset of one dropout run, as flashattn._torch._dropout_rng draws them.
struct Rng {
  int64_t seed = 0, offset = 0;
};

using Strides = std::array<int64_t, 4>;

// One configured C plan and the layouts of its outputs.
struct Plan {
  flashattn_plan_t handle = nullptr;
  bool cuda = false;
  float dropout_p = 0;              // nonzero: each run sets its seed and offset first, under `lock`
  mutable std::mutex lock;          // (flashattn/_torch_plans.py's _run)
  Strides out{}, dq{}, dk{}, dv{};  // out's strides are also those of dout
  Strides bias{};                   // those of the bias and of dbias
  size_t ws_fwd = 0, ws_bwd = 0;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (handle != nullptr) api().plan_destroy(handle);  // a handle means init() has bound the API
  }
};

using Shape = std::array<int64_t, 4>;

// t's sizes and strides in (batch, seq, heads, dim) order as the plan takes them
// (flashattn._plan._bshd): a packed (tokens, heads, dim) tensor has a batch of size 0 and
// stride 0.
Shape shape_of(const Tensor& t) {
  if (t.dim() == 3) return {0, t.size(0), t.size(1), t.size(2)};
  return {t.size(0), t.size(1), t.size(2), t.size(3)};
}

Strides strides_of(const Tensor& t) {
  if (t.dim() == 3) return {0, t.stride(0), t.stride(1), t.stride(2)};
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// flashattn._plan._norm_strides: size-1 dims get the stride a dense array would have.
Strides norm_strides(const Shape& shape, Strides out) {
  int64_t acc = 1;
  for (int i = 3; i >= 0; --i) {
    const int64_t n = shape[i];
    if (n <= 1) out[i] = i < 3 ? acc : 1;
    acc = std::max(acc, std::abs(out[i]) * std::max<int64_t>(n, 1));
  }
  return out;
}

// Strides as the plan takes them: batch stride 0 in varlen mode (ignored there).
Strides packed_if(Strides st, bool varlen) {
  if (varlen) st[0] = 0;
  return st;
}

// The strides a tensor of `rank` dims is allocated with from the plan's 4 (a packed one
// drops the batch's).
at::IntArrayRef tail(const Strides& st, int64_t rank) { return at::IntArrayRef(st.data() + 4 - rank, rank); }

// flashattn._plan._dense_like: dense strides for `shape` in the dimension order of `like`.
Strides dense_like(const Shape& shape, const Strides& like) {
  std::array<int, 3> order{0, 1, 2};
  auto key = [&](int i) {
    return shape[i] > 1 ? -static_cast<double>(like[i]) : -std::numeric_limits<double>::infinity();
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) < key(b); });
  Strides st{0, 0, 0, 1};
  int64_t acc = shape[3];
  for (int j = 2; j >= 0; --j) {
    st[order[j]] = acc;
    acc *= std::max<int64_t>(shape[order[j]], 1);
  }
  return st;
}

flashattn_dtype_t dtype_of(const Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return FLASHATTN_DTYPE_FP16;
    case at::kBFloat16: return FLASHATTN_DTYPE_BF16;
    case at::kFloat: return FLASHATTN_DTYPE_FP32;
    default: TORCH_CHECK(false, "flashattn_ext: q has dtype ", t.scalar_type(), "; use float16, bfloat16 or float32");
  }
}

// The ops can be called directly (torch.ops.flashattn_ext), and the backward gets what
// saved-tensor hooks return: what the plan does not check itself is checked here.
void check_like_q(const Tensor& t, const Tensor& q, const char* name) {
  TORCH_CHECK(t.scalar_type() == q.scalar_type() && t.device() == q.device(), "flashattn_ext: ", name, " has dtype ",
              t.scalar_type(), " on ", t.device(), " but q has ", q.scalar_type(), " on ", q.device());
}

// The extents the plan takes from q's and k's sizes (tensors of one rank, 3 or 4): k has
// q's head dim (and batch), v has k's length and heads (and batch). Others would be read
// out of bounds.
bool k_fits_q(const Tensor& k, const Tensor& q) {
  const Shape a = shape_of(k), b = shape_of(q);
  return a[0] == b[0] && a[3] == b[3];
}
bool v_fits_k(const Tensor& v, const Tensor& k) {
  const Shape a = shape_of(v), b = shape_of(k);
  return a[0] == b[0] && a[1] == b[1] && a[2] == b[2];
}

// The problem of one call as the plan takes it (flashattn._plan.make_plan): with
// cu_seqlens, batch is their count less one and the lengths are the maximum lengths given
// (at least 1); else q's and k's.
struct Dims {
  bool varlen;
  int64_t batch, seqlen_q, seqlen_k, heads_q;
};

Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& cu_q, const Options& o) {
  if (!cu_q.defined()) return {false, q.size(0), q.size(1), k.size(1), q.size(2)};
  return {true, cu_q.size(0) - 1, std::max<int64_t>(o.max_seqlen_q, 1), std::max<int64_t>(o.max_seqlen_k, 1),
          q.size(1)};
}

// cu_seqlens as the plan reads them (flashattn._plan's _check_vector): int32 (batch + 1),
// contiguous, on q's device.
bool cu_fits(const Tensor& cu, const Tensor& q, int64_t batch) {
  return cu.scalar_type() == at::kInt && cu.layout() == at::kStrided && cu.device() == q.device() && cu.dim() == 1 &&
         cu.size(0) == batch + 1 && cu.stride(0) == 1;
}

// The plan's bias strides (flashattn._plan.bias_strides_from) for a 4-D bias broadcast to
// (batch, heads_q, seqlen_q, seqlen_k): a dim's stride where it has the full size (> 1), 0
// where it has size 1; false where a size is neither (it would be read out of bounds).
bool bias_strides(const Tensor& bias, const Dims& d, Strides& st) {
  const Shape full{d.batch, d.heads_q, d.seqlen_q, d.seqlen_k};
  for (int i = 0; i < 4; ++i) {
    const int64_t n = bias.size(i);
    if (n != 1 && n != full[i]) return false;
    st[i] = n == 1 ? 0 : bias.stride(i);
  }
  return true;
}

// Whether t has a dim of size > 1 with stride 0 (an expand): one element stands for many,
// so a gradient written through t's strides would land on one address.
bool expanded(const Tensor& t) {
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.size(i) > 1 && t.stride(i) == 0) return true;
  return false;
}

// ALiBi slopes as the plan reads them: fp32 on q's device, (heads_q) or (batch, heads_q),
// heads contiguous (flashattn._plan's _check_vector and _check_slopes_per_batch).
bool slopes_fit(const Tensor& s, const Tensor& q, const Dims& d) {
  const int64_t b = d.batch, h = d.heads_q;
  if (s.scalar_type() != at::kFloat || s.device() != q.device() || s.layout() != at::kStrided) return false;
  if (s.dim() == 1) return s.size(0) == h && (h == 1 || s.stride(0) == 1);
  return s.dim() == 2 && s.size(0) == b && s.size(1) == h && (h == 1 || s.stride(1) == 1);
}

// flashattn._plan._alibi_batch_stride: the row stride of (batch, heads_q) slopes, else 0.
int64_t alibi_batch_stride(const Tensor& s) { return s.dim() == 2 && s.size(0) > 1 ? s.stride(0) : 0; }

// A block-sparse layout as flashattn_plan_set_block_sparse reads it: host uint8 (rows,
// cols) or (layout_heads, rows, cols); the library checks its extents.
bool layout_fits(const Tensor& layout) {
  return layout.is_cpu() && layout.layout() == at::kStrided && layout.scalar_type() == at::kByte &&
         (layout.dim() == 2 || layout.dim() == 3);
}

// A layout's bytes appended to a plan key, 8 to an element.
void append_bytes(const Tensor& layout, std::vector<int64_t>& key) {
  const Tensor lay = layout.contiguous();
  const auto* bytes = lay.data_ptr<uint8_t>();
  for (int64_t i = 0; i < lay.numel(); i += 8) {
    int64_t word = 0;
    std::memcpy(&word, bytes + i, static_cast<size_t>(std::min<int64_t>(8, lay.numel() - i)));
    key.push_back(word);
  }
}

// cu_seqlens_q and cu_seqlens_k, given together or not at all, as the plan reads them.
void check_offsets(const Tensor& q, const Tensor& cu_q, const Tensor& cu_k) {
  TORCH_CHECK(cu_q.defined() && cu_k.defined(),
              "flashattn_ext: variable-length mode needs both cu_seqlens_q and cu_seqlens_k");
  TORCH_CHECK(cu_q.dim() == 1 && cu_q.size(0) >= 2, "flashattn_ext: cu_seqlens_q ", cu_q.sizes(),
              " must be (batch + 1) with batch >= 1");
  for (const auto& [cu, name] : {std::pair{&cu_q, "cu_seqlens_q"}, std::pair{&cu_k, "cu_seqlens_k"}}) {
    TORCH_CHECK(cu_fits(*cu, q, cu_q.size(0) - 1), "flashattn_ext: ", name, " must be int32 of shape (", cu_q.size(0),
                "), contiguous, on q's device; got ", cu->scalar_type(), " ", cu->sizes(), " on ", cu->device());
  }
}

// q, k, v, cu_seqlens, bias and ALiBi slopes as the plan reads them: 4-D (batch, seq,
// heads, dim), or 3-D (tokens, heads, dim) with offsets that fit, with fitting extents; a
// bias (batch, heads_q, seqlen_q, seqlen_k) of q's dtype with size-1 dims where it
// broadcasts, or slopes that fit; not both. Returns the problem's extents.
Dims check_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const Tensor& slopes,
                  const Tensor& cu_q, const Tensor& cu_k, const Tensor& layout, const Options& o) {
  const bool varlen = cu_q.defined() || cu_k.defined();
  const int64_t rank = varlen ? 3 : 4;
  TORCH_CHECK(q.dim() == rank && k.dim() == rank && v.dim() == rank, "flashattn_ext: q, k, v must be 4-D (batch, ",
              "seq, heads, dim), or 3-D (tokens, heads, dim) with cu_seqlens; got q ", q.sizes(), ", k ", k.sizes(),
              ", v ", v.sizes(), varlen ? " with" : " without", " cu_seqlens");
  if (varlen) check_offsets(q, cu_q, cu_k);
  TORCH_CHECK(k_fits_q(k, q), "flashattn_ext: k ", k.sizes(), " must have q's ", varlen ? "" : "batch and ",
              "head dim (q ", q.sizes(), ")");
  TORCH_CHECK(v_fits_k(v, k), "flashattn_ext: v ", v.sizes(), " must have k's ", varlen ? "" : "batch, ",
              "length and heads (k ", k.sizes(), ")");
  TORCH_CHECK(!bias.defined() || !slopes.defined(), "flashattn_ext: bias and alibi_slopes cannot be combined");
  const Dims d = dims_of(q, k, cu_q, o);
  if (bias.defined()) {
    Strides st;
    TORCH_CHECK(bias.dim() == 4 && bias.layout() == at::kStrided && bias_strides(bias, d, st), "flashattn_ext: bias ",
                bias.sizes(), " must be 4-D (batch, heads_q, seqlen_q, seqlen_k) with size 1 ",
                "where it broadcasts (q ", q.sizes(), ", k ", k.sizes(), ")");
    check_like_q(bias, q, "bias");
  }
  TORCH_CHECK(!slopes.defined() || slopes_fit(slopes, q, d), "flashattn_ext: alibi_slopes ",
              slopes.defined() ? slopes.sizes() : at::IntArrayRef(), " must be float32 on q's device, (heads_q) or ",
              "(batch, heads_q) with contiguous heads (q ", q.sizes(), ")");
  TORCH_CHECK(!layout.defined() || layout_fits(layout), "flashattn_ext: block_layout ",
              layout.defined() ? layout.sizes() : at::IntArrayRef(), " must be a host uint8 tensor (rows, cols) or ",
              "(layout_heads, rows, cols)");
  return d;
}

// The setter calls of flashattn._plan.make_plan and _torch_plans._Entry, in their order.
std::shared_ptr<const Plan> build_plan(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                       const Tensor& slopes, const Tensor& layout, const Dims& d, const Options& o) {
  const Api& fa = api();
  check_like_q(k, q, "k");
  check_like_q(v, q, "v");
  auto p = std::make_shared<Plan>();
  p->cuda = q.is_cuda();
  flashattn_plan_t h = nullptr;
  check(fa.plan_create(&h, p->cuda ? FLASHATTN_BACKEND_CUDA : FLASHATTN_BACKEND_CPU, p->cuda ? q.get_device() : 0),
        "flashattn_plan_create");
  p->handle = h;
  const Shape qd = shape_of(q), kd = shape_of(k), vd = shape_of(v);
  check(fa.set_shape(h, d.batch, d.seqlen_q, d.seqlen_k, d.heads_q, kd[2], qd[3], vd[3]), "flashattn_plan_set_shape");
  check(fa.set_dtype(h, dtype_of(q)), "flashattn_plan_set_dtype");
  if (d.varlen) check(fa.set_varlen(h, 1, qd[1], kd[1]), "flashattn_plan_set_varlen");
  const Strides qs = strides_of(q);
  p->out = packed_if(dense_like({qd[0], qd[1], qd[2], vd[3]}, qs), d.varlen);
  p->dq = packed_if(dense_like(qd, qs), d.varlen);
  p->dk = packed_if(dense_like(kd, strides_of(k)), d.varlen);
  p->dv = packed_if(dense_like(vd, strides_of(v)), d.varlen);
  const std::pair<flashattn_tensor_t, Strides> strides[] = {
      {FLASHATTN_TENSOR_Q, packed_if(norm_strides(qd, qs), d.varlen)},
      {FLASHATTN_TENSOR_K, packed_if(norm_strides(kd, strides_of(k)), d.varlen)},
      {FLASHATTN_TENSOR_V, packed_if(norm_strides(vd, strides_of(v)), d.varlen)},
      {FLASHATTN_TENSOR_O, p->out},
      {FLASHATTN_TENSOR_DO, p->out},
      {FLASHATTN_TENSOR_DQ, p->dq},
      {FLASHATTN_TENSOR_DK, p->dk},
      {FLASHATTN_TENSOR_DV, p->dv}};
  for (const auto& [tensor, st] : strides) check(fa.set_strides(h, tensor, st.data()), "flashattn_plan_set_strides");
  check(fa.set_band_mask(h, o.bottom_right ? FLASHATTN_ALIGN_BOTTOM_RIGHT : FLASHATTN_ALIGN_TOP_LEFT, o.window_left,
                         o.window_right),
        "flashattn_plan_set_band_mask");
  if (o.scale != 0) check(fa.set_scale(h, static_cast<float>(o.scale)), "flashattn_plan_set_softmax_scale");
  if (o.softcap != 0) check(fa.set_softcap(h, static_cast<float>(o.softcap)), "flashattn_plan_set_softcap");
  if (bias.defined()) {
    bias_strides(bias, d, p->bias);
    check(fa.set_bias(h, FLASHATTN_BIAS_TENSOR, p->bias.data()), "flashattn_plan_set_bias");
  } else if (slopes.defined()) {
    check(fa.set_bias(h, o.alibi_symmetric ? FLASHATTN_BIAS_ALIBI_SYMMETRIC : FLASHATTN_BIAS_ALIBI, nullptr),
          "flashattn_plan_set_bias");
    const int64_t batch_stride = alibi_batch_stride(slopes);
    if (batch_stride != 0) {
      check(fa.set_alibi_batch_stride(h, batch_stride), "flashattn_plan_set_alibi_batch_stride");
    }
  }
  if (o.dropout_p != 0) {
    p->dropout_p = static_cast<float>(o.dropout_p);
    check(fa.set_dropout(h, p->dropout_p, 0, 0), "flashattn_plan_set_dropout");
  }
  if (layout.defined()) {
    const Tensor lay = layout.contiguous();
    const int64_t heads = lay.dim() == 3 ? lay.size(0) : 1;
    check(fa.set_block_sparse(h, lay.data_ptr<uint8_t>(), heads, lay.size(-2), lay.size(-1), o.block_q, o.block_k),
          "flashattn_plan_set_block_sparse");
  }
  check(fa.set_deterministic(h, o.deterministic), "flashattn_plan_set_deterministic");
  check(fa.set_algorithm(h, static_cast<flashattn_algorithm_t>(o.algorithm)), "flashattn_plan_set_algorithm");
  check(fa.workspace_size(h, FLASHATTN_PASS_FORWARD, &p->ws_fwd), "flashattn_plan_get_workspace_size");
  check(fa.workspace_size(h, FLASHATTN_PASS_BACKWARD, &p->ws_bwd), "flashattn_plan_get_workspace_size");
  return p;
}

// Plans by everything they depend on; at most kCapacity, the oldest dropped first (a run
// holding a dropped plan keeps it alive until it returns).
class PlanCache {
 public:
  static constexpr size_t kCapacity = 1024;

  std::shared_ptr<const Plan> get(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                  const Tensor& slopes, const Tensor& cu_q, const Tensor& cu_k, const Tensor& layout,
                                  const Options& o) {
    const Dims d = check_shapes(q, k, v, bias, slopes, cu_q, cu_k, layout, o);
    std::vector<int64_t> key;
    key.reserve(8 * 12 + 13 + (layout.defined() ? layout.numel() / 8 + 1 : 0));
    // Layouts: the offsets' values are read by each run, not baked into the plan.
    for (const Tensor* t : {&q, &k, &v, &bias, &slopes, &cu_q, &cu_k, &layout}) {
      if (!t->defined()) {
        key.push_back(-1);
        continue;
      }
      key.push_back(t->dim());
      for (int64_t i = 0; i < t->dim(); ++i) key.push_back(t->size(i));
      for (int64_t i = 0; i < t->dim(); ++i) key.push_back(t->stride(i));
      key.push_back(static_cast<int64_t>(t->scalar_type()));
      key.push_back(static_cast<int64_t>(t->device().type()));
      key.push_back(t->device().index());
    }
    const double reals[3] = {o.scale, o.softcap, o.dropout_p};
    int64_t bits[3];
    std::memcpy(bits, reals, sizeof bits);
    key.insert(key.end(), {d.seqlen_q, d.seqlen_k, o.window_left, o.window_right, o.bottom_right, bits[0], bits[1],
                           o.alibi_symmetric, bits[2], o.block_q, o.block_k, o.deterministic, o.algorithm});
    if (layout.defined()) append_bytes(layout, key);  // a layout's values are the plan's
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    auto plan = build_plan(q, k, v, bias, slopes, layout, d, o);  // outside the lock: a failure takes the GIL
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = plans_.emplace(key, plan);
    if (inserted) {
      order_.push_back(key);
      while (plans_.size() > kCapacity) {
        plans_.erase(order_.front());
        order_.pop_front();
      }
    }
    return it->second;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    plans_.clear();
    order_.clear();
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.size();
  }

 private:
  std::mutex mutex_;
  std::map<std::vector<int64_t>, std::shared_ptr<const Plan>> plans_;
  std::deque<std::vector<int64_t>> order_;
};

PlanCache cache;

// ------------------------------------------------------------------ runs

// Scratch for one run: from torch's caching allocator on CUDA; on the CPU a buffer of the
// calling thread, reused by its next run (a CPU run is synchronous).
Tensor workspace(const Plan& p, size_t bytes, const Tensor& like) {
  const auto n = static_cast<int64_t>(bytes);
  if (p.cuda) return at::empty({n}, like.options().dtype(at::kByte));
  thread_local Tensor buffer;
  if (!buffer.defined() || buffer.numel() < n) buffer = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  return buffer;
}

CUstream_st* stream_of(const Plan& p, const Tensor& like) {
  if (!p.cuda) return nullptr;
  const c10::Stream s = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(like.device());
  return static_cast<CUstream_st*>(s.native_handle());
}

template <class Run>
void run(const Plan& p, size_t ws_bytes, const Tensor& like, const Rng& rng, const char* function, Run&& c_call) {
  Tensor ws = ws_bytes ? workspace(p, ws_bytes, like) : Tensor();  // alive until the run is enqueued
  void* ws_ptr = ws.defined() ? ws.data_ptr() : nullptr;
  CUstream_st* stream = stream_of(p, like);
  flashattn_status_t status = FLASHATTN_STATUS_SUCCESS;
  {
    std::unique_lock<std::mutex> lock(p.lock, std::defer_lock);  // raising below takes the GIL: not under it
    if (p.dropout_p != 0) {
      lock.lock();
      status =
          api().set_dropout(p.handle, p.dropout_p, static_cast<uint64_t>(rng.seed), static_cast<uint64_t>(rng.offset));
      if (status != FLASHATTN_STATUS_SUCCESS) function = "flashattn_plan_set_dropout";
    }
    if (status == FLASHATTN_STATUS_SUCCESS) status = c_call(ws_ptr, ws_bytes, stream);
  }
  check(status, function);
}

// t itself if it has these strides (size-1 dims aside), else a copy that has them.
Tensor with_strides(const Tensor& t, const Strides& st) {
  const at::IntArrayRef want = tail(st, t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) > 1 && t.stride(i) != want[i]) return at::empty_strided(t.sizes(), want, t.options()).copy_(t);
  }
  return t;
}

const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

const float* slopes_ptr(const Tensor& slopes) { return slopes.defined() ? slopes.data_ptr<float>() : nullptr; }

const int32_t* offsets_ptr(const Tensor& cu) { return cu.defined() ? cu.data_ptr<int32_t>() : nullptr; }

// The sizes of out (q's with v's head dim) and of lse ((batch, heads_q, seqlen_q), or
// (heads_q, total_q) packed).
std::vector<int64_t> out_sizes(const Tensor& q, const Tensor& v) {
  std::vector<int64_t> s(q.sizes().begin(), q.sizes().end());
  s.back() = v.size(-1);
  return s;
}
std::vector<int64_t> lse_sizes(const Tensor& q) {
  if (q.dim() == 3) return {q.size(1), q.size(0)};
  return {q.size(0), q.size(2), q.size(1)};
}

std::tuple<Tensor, Tensor> forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                   const Tensor& slopes, const Tensor& cu_q, const Tensor& cu_k, const Tensor& layout,
                                   const Options& o, const Rng& rng, bool want_lse) {
  const auto p = cache.get(q, k, v, bias, slopes, cu_q, cu_k, layout, o);
  Tensor out = at::empty_strided(out_sizes(q, v), tail(p->out, q.dim()), q.options());
  Tensor lse = want_lse ? at::empty(lse_sizes(q), q.options().dtype(at::kFloat)) : Tensor();
  const flashattn_fwd_args_t a{.struct_size = sizeof(flashattn_fwd_args_t),
                               .q = q.data_ptr(),
                               .k = k.data_ptr(),
                               .v = v.data_ptr(),
                               .o = out.data_ptr(),
                               .lse = want_lse ? lse.data_ptr<float>() : nullptr,
                               .bias = ptr_or_null(bias),
                               .alibi_slopes = slopes_ptr(slopes),
                               .cu_seqlens_q = offsets_ptr(cu_q),
                               .cu_seqlens_k = offsets_ptr(cu_k)};
  run(*p, p->ws_fwd, q, rng, "flashattn_fwd",
      [&](void* ws, size_t n, CUstream_st* s) { return api().fwd(p->handle, &a, ws, n, s); });
  return {out, lse};
}

Options options(int64_t max_q, int64_t max_k, int64_t left, int64_t right, bool bottom_right, double scale,
                double softcap, bool alibi_symmetric, double dropout_p, int64_t block_q, int64_t block_k,
                bool deterministic, int64_t algorithm) {
  return Options{max_q,           max_k,     left,    right,   bottom_right,  scale,    softcap,
                 alibi_symmetric, dropout_p, block_q, block_k, deterministic, algorithm};
}

// An optional tensor argument, undefined when absent.
Tensor given(const std::optional<Tensor>& t) { return t.has_value() ? *t : Tensor(); }

// flashattn_ext::fwd: (out, lse).
std::tuple<Tensor, Tensor> fwd_kernel(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const std::optional<Tensor>& bias, const std::optional<Tensor>& slopes,
                                      const std::optional<Tensor>& cu_q, const std::optional<Tensor>& cu_k,
                                      const std::optional<Tensor>& layout, int64_t max_q, int64_t max_k, int64_t left,
                                      int64_t right, bool bottom_right, double scale, double softcap,
                                      bool alibi_symmetric, double dropout_p, int64_t seed, int64_t offset,
                                      int64_t block_q, int64_t block_k, bool deterministic, int64_t algorithm) {
  return forward(q, k, v, given(bias), given(slopes), given(cu_q), given(cu_k), given(layout),
                 options(max_q, max_k, left, right, bottom_right, scale, softcap, alibi_symmetric, dropout_p, block_q,
                         block_k, deterministic, algorithm),
                 Rng{seed, offset}, true);
}

// flashattn_ext::attention below autograd: the output alone, no LSE written.
Tensor attention_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& bias,
                        const std::optional<Tensor>& slopes, const std::optional<Tensor>& cu_q,
                        const std::optional<Tensor>& cu_k, const std::optional<Tensor>& layout, int64_t max_q,
                        int64_t max_k, int64_t left, int64_t right, bool bottom_right, double scale, double softcap,
                        bool alibi_symmetric, double dropout_p, int64_t seed, int64_t offset, int64_t block_q,
                        int64_t block_k, bool deterministic, int64_t algorithm) {
  return std::get<0>(forward(q, k, v, given(bias), given(slopes), given(cu_q), given(cu_k), given(layout),
                             options(max_q, max_k, left, right, bottom_right, scale, softcap, alibi_symmetric,
                                     dropout_p, block_q, block_k, deterministic, algorithm),
                             Rng{seed, offset}, false));
}

// flashattn_ext::bwd: (dq, dk, dv, dbias), with the dropout mask of the forward's seed and
// offset; dbias has the bias's shape (summed over its broadcast dims), or is empty unless
// want_dbias.
std::tuple<Tensor, Tensor, Tensor, Tensor> bwd_kernel(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const std::optional<Tensor>& bias_arg, const std::optional<Tensor>& slopes_arg,
    const std::optional<Tensor>& cu_q_arg, const std::optional<Tensor>& cu_k_arg,
    const std::optional<Tensor>& layout_arg, int64_t max_q, int64_t max_k, int64_t left, int64_t right,
    bool bottom_right, double scale, double softcap, bool alibi_symmetric, double dropout_p, int64_t seed,
    int64_t offset, int64_t block_q, int64_t block_k, bool deterministic, int64_t algorithm, bool want_dbias) {
  const Tensor bias = given(bias_arg), slopes = given(slopes_arg), cu_q = given(cu_q_arg), cu_k = given(cu_k_arg),
               layout = given(layout_arg);
  const Rng rng{seed, offset};
  const auto p = cache.get(q, k, v, bias, slopes, cu_q, cu_k, layout,
                           options(max_q, max_k, left, right, bottom_right, scale, softcap, alibi_symmetric, dropout_p,
                                   block_q, block_k, deterministic, algorithm));
  const std::vector<int64_t> out_shape = out_sizes(q, v), lse_shape = lse_sizes(q);
  check_like_q(out, q, "out");
  check_like_q(dout, q, "dout");
  TORCH_CHECK(out.sizes() == out_shape && dout.sizes() == out_shape, "flashattn_ext::bwd: out ", out.sizes(),
              " and dout ", dout.sizes(), " must have the shape ", at::IntArrayRef(out_shape));
  TORCH_CHECK(lse.sizes() == lse_shape && lse.scalar_type() == at::kFloat && lse.device() == q.device(),
              "flashattn_ext::bwd: lse must be float32 of shape ", at::IntArrayRef(lse_shape), " on q's device");
  TORCH_CHECK(!want_dbias || bias.defined(), "flashattn_ext::bwd: want_dbias needs a bias tensor");
  TORCH_CHECK(!want_dbias || !expanded(bias), "flashattn_ext::bwd: want_dbias needs a bias without expanded dims; got ",
              "sizes ", bias.sizes(), ", strides ", bias.strides());
  const Tensor o = with_strides(out, p->out), d_o = with_strides(dout, p->out), l = lse.contiguous();
  Tensor dq = at::empty_strided(q.sizes(), tail(p->dq, q.dim()), q.options());
  Tensor dk = at::empty_strided(k.sizes(), tail(p->dk, k.dim()), q.options());
  Tensor dv = at::empty_strided(v.sizes(), tail(p->dv, v.dim()), q.options());
  Tensor dbias = want_dbias ? at::empty_strided(bias.sizes(), p->bias, q.options()) : at::empty({0}, q.options());
  const flashattn_bwd_args_t a{.struct_size = sizeof(flashattn_bwd_args_t),
                               .q = q.data_ptr(),
                               .k = k.data_ptr(),
                               .v = v.data_ptr(),
                               .o = o.data_ptr(),
                               .lse = l.data_ptr<float>(),
                               .dout = d_o.data_ptr(),
                               .dq = dq.data_ptr(),
                               .dk = dk.data_ptr(),
                               .dv = dv.data_ptr(),
                               .bias = ptr_or_null(bias),
                               .dbias = want_dbias ? dbias.data_ptr() : nullptr,
                               .alibi_slopes = slopes_ptr(slopes),
                               .cu_seqlens_q = offsets_ptr(cu_q),
                               .cu_seqlens_k = offsets_ptr(cu_k)};
  run(*p, p->ws_bwd, q, rng, "flashattn_bwd",
      [&](void* ws, size_t n, CUstream_st* s) { return api().bwd(p->handle, &a, ws, n, s); });
  return {dq, dk, dv, dbias};
}

// ------------------------------------------------------------------ autograd

template <class Kernel>
c10::TypedOperatorHandle<Kernel> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Kernel>();
}

// An undefined tensor as an absent optional argument.
std::optional<Tensor> opt(const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }

const auto& fwd_op() {
  static const auto op = find_op<decltype(fwd_kernel)>("flashattn_ext::fwd");
  return op;
}

const auto& bwd_op() {
  static const auto op = find_op<decltype(bwd_kernel)>("flashattn_ext::bwd");
  return op;
}

const auto& attention_op() {
  static const auto op = find_op<decltype(attention_kernel)>("flashattn_ext::attention");
  return op;
}

struct Attention : torch::autograd::Function<Attention> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const std::optional<Tensor>& bias, const std::optional<Tensor>& slopes,
                        const std::optional<Tensor>& cu_q, const std::optional<Tensor>& cu_k,
                        const std::optional<Tensor>& layout, const Options& o, const Rng& rng) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, lse] =
        fwd_op().call(q, k, v, bias, slopes, cu_q, cu_k, layout, o.max_seqlen_q, o.max_seqlen_k, o.window_left,
                      o.window_right, o.bottom_right, o.scale, o.softcap, o.alibi_symmetric, o.dropout_p, rng.seed,
                      rng.offset, o.block_q, o.block_k, o.deterministic, o.algorithm);
    ctx->save_for_backward({q, k, v, out, lse, given(bias), given(slopes), given(cu_q), given(cu_k), given(layout)});
    auto& d = ctx->saved_data;  // the backward's dropout mask is the forward's: its seed and offset are kept
    d["max_q"] = o.max_seqlen_q;
    d["max_k"] = o.max_seqlen_k;
    d["left"] = o.window_left;
    d["right"] = o.window_right;
    d["bottom_right"] = o.bottom_right;
    d["scale"] = o.scale;
    d["softcap"] = o.softcap;
    d["alibi_symmetric"] = o.alibi_symmetric;
    d["dropout_p"] = o.dropout_p;
    d["seed"] = rng.seed;
    d["offset"] = rng.offset;
    d["block_q"] = o.block_q;
    d["block_k"] = o.block_k;
    d["deterministic"] = o.deterministic;
    d["algorithm"] = o.algorithm;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto& d = ctx->saved_data;
    const bool want_dbias = s[5].defined() && ctx->needs_input_grad(3);  // edges: q, k, v, bias if given
    auto [dq, dk, dv, dbias] = bwd_op().call(
        grads[0], s[0], s[1], s[2], s[3], s[4], opt(s[5]), opt(s[6]), opt(s[7]), opt(s[8]), opt(s[9]),
        d["max_q"].toInt(), d["max_k"].toInt(), d["left"].toInt(), d["right"].toInt(), d["bottom_right"].toBool(),
        d["scale"].toDouble(), d["softcap"].toDouble(), d["alibi_symmetric"].toBool(), d["dropout_p"].toDouble(),
        d["seed"].toInt(), d["offset"].toInt(), d["block_q"].toInt(), d["block_k"].toInt(), d["deterministic"].toBool(),
        d["algorithm"].toInt(), want_dbias);
    // q, k, v, bias, slopes, cu_seqlens_q, cu_seqlens_k, block_layout, options, rng
    return {dq, dk, dv, want_dbias ? dbias : Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// flashattn_ext::attention with autograd: the Function when a gradient is wanted, else
// the kernel below autograd.
Tensor attention_autograd(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& bias,
                          const std::optional<Tensor>& slopes, const std::optional<Tensor>& cu_q,
                          const std::optional<Tensor>& cu_k, const std::optional<Tensor>& layout, int64_t max_q,
                          int64_t max_k, int64_t left, int64_t right, bool bottom_right, double scale, double softcap,
                          bool alibi_symmetric, double dropout_p, int64_t seed, int64_t offset, int64_t block_q,
                          int64_t block_k, bool deterministic, int64_t algorithm) {
  const bool bias_grad = bias.has_value() && bias->defined() && bias->requires_grad();
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad() || bias_grad)) {
    // An expanded bias dim (stride 0, size > 1) cannot carry a per-element gradient in the
    // library's dbias: materialized, as flashattn._torch._combined_bias does, so that
    // autograd sums the gradient through the expand.
    const std::optional<Tensor> b = bias_grad && expanded(*bias) ? std::optional<Tensor>(bias->contiguous()) : bias;
    return Attention::apply(q, k, v, b, slopes, cu_q, cu_k, layout,
                            options(max_q, max_k, left, right, bottom_right, scale, softcap, alibi_symmetric, dropout_p,
                                    block_q, block_k, deterministic, algorithm),
                            Rng{seed, offset});
  }
  at::AutoDispatchBelowADInplaceOrView below;
  return attention_op().call(q, k, v, bias, slopes, cu_q, cu_k, layout, max_q, max_k, left, right, bottom_right, scale,
                             softcap, alibi_symmetric, dropout_p, seed, offset, block_q, block_k, deterministic,
                             algorithm);
}

// ------------------------------------------------------------------ the Python entry

bool servable(const Tensor& t, const Tensor& q, int64_t rank) {
  return t.dim() == rank && t.layout() == at::kStrided && t.scalar_type() == q.scalar_type() &&
         t.device() == q.device() && t.stride(-1) == 1 && t.numel() > 0;
}

// A bias the Python path would run with, not refuse in Python (flashattn._plan's
// bias_strides_from and _check_bias): q's dtype and device, broadcastable, its key stride
// 0 or 1.
bool bias_servable(const Tensor& bias, const Tensor& q, const Dims& d) {
  Strides st;
  return bias.dim() == 4 && bias.layout() == at::kStrided && bias.scalar_type() == q.scalar_type() &&
         bias.device() == q.device() && bias_strides(bias, d, st) && (d.seqlen_k == 1 || st[3] == 0 || st[3] == 1);
}

// Offsets the Python path would run with (flashattn._plan.make_plan and _check_vector):
// both or neither, cu_seqlens_q (batch + 1) with batch >= 1, both fitting.
bool offsets_servable(const std::optional<Tensor>& cu_q, const std::optional<Tensor>& cu_k, const Tensor& q) {
  if (!cu_q && !cu_k) return true;
  return cu_q && cu_k && cu_q->dim() == 1 && cu_q->size(0) >= 2 && cu_fits(*cu_q, q, cu_q->size(0) - 1) &&
         cu_fits(*cu_k, q, cu_q->size(0) - 1);
}

// The (seed, offset) of flashattn._torch._dropout_rng's host int64 tensor; false for
// anything else.
bool read_rng(const std::optional<Tensor>& t, Rng& rng) {
  if (!t || !t->is_cpu() || t->scalar_type() != at::kLong || t->dim() != 1 || t->size(0) != 2) return false;
  const auto a = t->accessor<int64_t, 1>();
  rng = Rng{a[0], a[1]};
  return true;
}

// The op's result for a call it serves; None for one the Python path must take
// (flashattn._torch_ops.run): other ranks, dtypes, devices or layouts, shapes that
// disagree, offsets, a bias or slopes it would refuse, whose errors that path words. bias
// is the 4-D additive bias flashattn._torch made of bias and masks; with cu_seqlens, q, k,
// v are packed (tokens, heads, dim) and max_q, max_k the lengths the plan is made for;
// a block-sparse layout is served on the host (uint8, 2-D or 3-D); with dropout, rng is
// the (seed, offset) tensor the Python path would run with.
py::object attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& bias,
                     const std::optional<Tensor>& slopes, const std::optional<Tensor>& cu_q,
                     const std::optional<Tensor>& cu_k, const std::optional<Tensor>& layout,
                     const std::optional<Tensor>& rng_tensor, int64_t max_q, int64_t max_k, int64_t left, int64_t right,
                     bool bottom_right, double scale, double softcap, bool alibi_symmetric, double dropout_p,
                     int64_t block_q, int64_t block_k, bool deterministic, int64_t algorithm) {
  const auto dt = q.scalar_type();
  const int64_t rank = cu_q || cu_k ? 3 : 4;
  Rng rng;
  if (!(dt == at::kHalf || dt == at::kBFloat16 || dt == at::kFloat) || !(q.is_cpu() || q.is_cuda()) ||
      !servable(q, q, rank) || !servable(k, q, rank) || !servable(v, q, rank) || !offsets_servable(cu_q, cu_k, q) ||
      !k_fits_q(k, q) || !v_fits_k(v, k) || (bias && slopes) || (layout && !layout_fits(*layout)) ||
      (dropout_p != 0 && !read_rng(rng_tensor, rng))) {
    return py::none();
  }
  const Options o = options(max_q, max_k, left, right, bottom_right, scale, softcap, alibi_symmetric, dropout_p,
                            block_q, block_k, deterministic, algorithm);
  const Dims d = dims_of(q, k, cu_q ? *cu_q : Tensor(), o);
  if ((bias && !bias_servable(*bias, q, d)) || (slopes && !slopes_fit(*slopes, q, d))) return py::none();
  Tensor out;
  {
    py::gil_scoped_release no_gil;
    out = attention_op().call(q, k, v, bias, slopes, cu_q, cu_k, layout, max_q, max_k, left, right, bottom_right, scale,
                              softcap, alibi_symmetric, dropout_p, rng.seed, rng.offset, block_q, block_k,
                              deterministic, algorithm);
  }
  return py::cast(out);
}

}  // namespace

TORCH_LIBRARY(flashattn_ext, m) {
  // The inputs and options every op takes in this order (bwd with its extra tensors around
  // q, k, v and want_dbias last); the kernels above take them as C++ arguments likewise.
  const std::string qkv = "Tensor q, Tensor k, Tensor v, ";
  const std::string opts =
      "Tensor? bias, Tensor? alibi_slopes, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? block_layout, "
      "int max_seqlen_q, int max_seqlen_k, int window_left, int window_right, bool bottom_right, float scale, "
      "float softcap, bool alibi_symmetric, float dropout_p, int seed, int offset, int block_q, int block_k, "
      "bool deterministic, int algorithm";
  m.def(("attention(" + qkv + opts + ") -> Tensor").c_str());
  m.def(("fwd(" + qkv + opts + ") -> (Tensor, Tensor)").c_str());
  m.def(("bwd(Tensor dout, " + qkv + "Tensor out, Tensor lse, " + opts +
         ", bool want_dbias) -> (Tensor, Tensor, Tensor, Tensor)")
            .c_str());
}

TORCH_LIBRARY_IMPL(flashattn_ext, CPU, m) {
  m.impl("attention", attention_kernel);
  m.impl("fwd", fwd_kernel);
  m.impl("bwd", bwd_kernel);
}

TORCH_LIBRARY_IMPL(flashattn_ext, CUDA, m) {
  m.impl("attention", attention_kernel);
  m.impl("fwd", fwd_kernel);
  m.impl("bwd", bwd_kernel);
}

TORCH_LIBRARY_IMPL(flashattn_ext, Autograd, m) { m.impl("attention", attention_autograd); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The compiled eager path of flashattn.attention (see flashattn/torch_ext.py)";
  m.def("init", &init, "Bind the C API to the already loaded libflashattn at this path");
  m.def("attention", &attention, "The op's output, or None for a call the Python path must take");
  m.def(
      "clear_cache", [] { cache.clear(); }, "Drop every cached plan");
  m.def(
      "cache_size", [] { return cache.size(); }, "How many plans are cached");
}
