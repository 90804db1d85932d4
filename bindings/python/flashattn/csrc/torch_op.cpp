// The eager fast path of flashattn.attention on torch tensors, as a compiled torch op.
//
// A Python autograd.Function costs tens of microseconds per forward + backward (the
// autograd engine's round trip into Python); this op keeps the whole call in C++: the
// op flashattn_ext::attention has CPU and CUDA kernels and an autograd kernel (a C++
// torch::autograd::Function) whose forward and backward are the ops flashattn_ext::fwd
// and flashattn_ext::bwd. It serves dense 4-D q, k, v in (batch, seq, heads, dim) order
// with any strides, band masks (causal, window, either alignment), scale, softcap, GQA,
// an additive bias (the 4-D one flashattn/_torch.py makes of bias, attn_mask and
// key_padding_mask, broadcast dims of size 1, its gradient when it requires one), ALiBi
// slopes (heads) or (batch, heads), dropout and the algorithm choice;
// flashattn/_torch_ops.py sends every other call (varlen, block-sparse layouts) down the
// Python path, as does the Python entry below any input that path would refuse in Python.
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
  int64_t window_left, window_right;
  bool bottom_right;
  double scale, softcap;  // 0: the default scale, no softcap
  bool alibi_symmetric;
  double dropout_p;  // 0: no dropout
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

Strides strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

// flashattn._plan._norm_strides: size-1 dims get the stride a dense array would have.
Strides norm_strides(const Tensor& t) {
  Strides out = strides_of(t);
  int64_t acc = 1;
  for (int i = 3; i >= 0; --i) {
    const int64_t n = t.size(i);
    if (n <= 1) out[i] = i < 3 ? acc : 1;
    acc = std::max(acc, std::abs(out[i]) * std::max<int64_t>(n, 1));
  }
  return out;
}

// flashattn._plan._dense_like: dense strides for `shape` in the dimension order of `like`.
Strides dense_like(const std::array<int64_t, 4>& shape, const Strides& like) {
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

std::array<int64_t, 4> shape_of(const Tensor& t) { return {t.size(0), t.size(1), t.size(2), t.size(3)}; }

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

// The extents the plan takes from q's and k's sizes (4-D tensors): k has q's batch and head
// dim, v has k's batch, length and heads. Others would be read out of bounds.
bool k_fits_q(const Tensor& k, const Tensor& q) { return k.size(0) == q.size(0) && k.size(3) == q.size(3); }
bool v_fits_k(const Tensor& v, const Tensor& k) {
  return v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2);
}

// The plan's bias strides (flashattn._plan.bias_strides_from) for a 4-D bias broadcast to
// (batch, heads_q, seqlen_q, seqlen_k): a dim's stride where it has the full size (> 1), 0
// where it has size 1; false where a size is neither (it would be read out of bounds).
bool bias_strides(const Tensor& bias, const Tensor& q, const Tensor& k, Strides& st) {
  const std::array<int64_t, 4> full{q.size(0), q.size(2), q.size(1), k.size(1)};
  for (int i = 0; i < 4; ++i) {
    const int64_t n = bias.size(i);
    if (n != 1 && n != full[i]) return false;
    st[i] = n == 1 ? 0 : bias.stride(i);
  }
  return true;
}

// ALiBi slopes as the plan reads them: fp32 on q's device, (heads_q) or (batch, heads_q),
// heads contiguous (flashattn._plan's _check_vector and _check_slopes_per_batch).
bool slopes_fit(const Tensor& s, const Tensor& q) {
  const int64_t b = q.size(0), h = q.size(2);
  if (s.scalar_type() != at::kFloat || s.device() != q.device() || s.layout() != at::kStrided) return false;
  if (s.dim() == 1) return s.size(0) == h && (h == 1 || s.stride(0) == 1);
  return s.dim() == 2 && s.size(0) == b && s.size(1) == h && (h == 1 || s.stride(1) == 1);
}

// flashattn._plan._alibi_batch_stride: the row stride of (batch, heads_q) slopes, else 0.
int64_t alibi_batch_stride(const Tensor& s) { return s.dim() == 2 && s.size(0) > 1 ? s.stride(0) : 0; }

// q, k, v, bias and ALiBi slopes as the plan reads them: 4-D (batch, seq, heads, dim)
// with fitting extents, a bias (batch, heads_q, seqlen_q, seqlen_k) of q's dtype with size-1
// dims where it broadcasts, or slopes that fit; not both.
void check_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const Tensor& slopes) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "flashattn_ext: q, k, v must be 4-D (batch, seq, heads, ",
              "dim); got q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(k_fits_q(k, q), "flashattn_ext: k ", k.sizes(), " must have q's batch and head dim (q ", q.sizes(), ")");
  TORCH_CHECK(v_fits_k(v, k), "flashattn_ext: v ", v.sizes(), " must have k's batch, length and heads (k ", k.sizes(),
              ")");
  TORCH_CHECK(!bias.defined() || !slopes.defined(), "flashattn_ext: bias and alibi_slopes cannot be combined");
  if (bias.defined()) {
    Strides st;
    TORCH_CHECK(bias.dim() == 4 && bias.layout() == at::kStrided && bias_strides(bias, q, k, st),
                "flashattn_ext: bias ", bias.sizes(), " must be 4-D (batch, heads_q, seqlen_q, seqlen_k) with size 1 ",
                "where it broadcasts (q ", q.sizes(), ", k ", k.sizes(), ")");
    check_like_q(bias, q, "bias");
  }
  TORCH_CHECK(!slopes.defined() || slopes_fit(slopes, q), "flashattn_ext: alibi_slopes ",
              slopes.defined() ? slopes.sizes() : at::IntArrayRef(), " must be float32 on q's device, (heads_q) or ",
              "(batch, heads_q) with contiguous heads (q ", q.sizes(), ")");
}

// The setter calls of flashattn._plan.make_plan and _torch_plans._Entry, in their order.
std::shared_ptr<const Plan> build_plan(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                       const Tensor& slopes, const Options& o) {
  const Api& fa = api();
  check_like_q(k, q, "k");
  check_like_q(v, q, "v");
  auto p = std::make_shared<Plan>();
  p->cuda = q.is_cuda();
  flashattn_plan_t h = nullptr;
  check(fa.plan_create(&h, p->cuda ? FLASHATTN_BACKEND_CUDA : FLASHATTN_BACKEND_CPU, p->cuda ? q.get_device() : 0),
        "flashattn_plan_create");
  p->handle = h;
  check(fa.set_shape(h, q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)),
        "flashattn_plan_set_shape");
  check(fa.set_dtype(h, dtype_of(q)), "flashattn_plan_set_dtype");
  const Strides qs = strides_of(q);
  p->out = dense_like({q.size(0), q.size(1), q.size(2), v.size(3)}, qs);
  p->dq = dense_like(shape_of(q), qs);
  p->dk = dense_like(shape_of(k), strides_of(k));
  p->dv = dense_like(shape_of(v), strides_of(v));
  const std::pair<flashattn_tensor_t, Strides> strides[] = {
      {FLASHATTN_TENSOR_Q, norm_strides(q)}, {FLASHATTN_TENSOR_K, norm_strides(k)},
      {FLASHATTN_TENSOR_V, norm_strides(v)}, {FLASHATTN_TENSOR_O, p->out},
      {FLASHATTN_TENSOR_DO, p->out},         {FLASHATTN_TENSOR_DQ, p->dq},
      {FLASHATTN_TENSOR_DK, p->dk},          {FLASHATTN_TENSOR_DV, p->dv}};
  for (const auto& [tensor, st] : strides) check(fa.set_strides(h, tensor, st.data()), "flashattn_plan_set_strides");
  check(fa.set_band_mask(h, o.bottom_right ? FLASHATTN_ALIGN_BOTTOM_RIGHT : FLASHATTN_ALIGN_TOP_LEFT, o.window_left,
                         o.window_right),
        "flashattn_plan_set_band_mask");
  if (o.scale != 0) check(fa.set_scale(h, static_cast<float>(o.scale)), "flashattn_plan_set_softmax_scale");
  if (o.softcap != 0) check(fa.set_softcap(h, static_cast<float>(o.softcap)), "flashattn_plan_set_softcap");
  if (bias.defined()) {
    bias_strides(bias, q, k, p->bias);
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
                                  const Tensor& slopes, const Options& o) {
    check_shapes(q, k, v, bias, slopes);
    std::vector<int64_t> key;
    key.reserve(5 * 12 + 9);
    for (const Tensor* t : {&q, &k, &v, &bias, &slopes}) {
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
    key.insert(key.end(), {o.window_left, o.window_right, o.bottom_right, bits[0], bits[1], o.alibi_symmetric, bits[2],
                           o.deterministic, o.algorithm});
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    auto plan = build_plan(q, k, v, bias, slopes, o);  // outside the lock: a failure takes the GIL
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
  for (int i = 0; i < 4; ++i) {
    if (t.size(i) > 1 && t.stride(i) != st[i]) return at::empty_strided(t.sizes(), st, t.options()).copy_(t);
  }
  return t;
}

const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

const float* slopes_ptr(const Tensor& slopes) { return slopes.defined() ? slopes.data_ptr<float>() : nullptr; }

std::tuple<Tensor, Tensor> forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                   const Tensor& slopes, const Options& o, const Rng& rng, bool want_lse) {
  const auto p = cache.get(q, k, v, bias, slopes, o);
  Tensor out = at::empty_strided({q.size(0), q.size(1), q.size(2), v.size(3)}, p->out, q.options());
  Tensor lse = want_lse ? at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat)) : Tensor();
  const flashattn_fwd_args_t a{.struct_size = sizeof(flashattn_fwd_args_t),
                               .q = q.data_ptr(),
                               .k = k.data_ptr(),
                               .v = v.data_ptr(),
                               .o = out.data_ptr(),
                               .lse = want_lse ? lse.data_ptr<float>() : nullptr,
                               .bias = ptr_or_null(bias),
                               .alibi_slopes = slopes_ptr(slopes)};
  run(*p, p->ws_fwd, q, rng, "flashattn_fwd",
      [&](void* ws, size_t n, CUstream_st* s) { return api().fwd(p->handle, &a, ws, n, s); });
  return {out, lse};
}

Options options(int64_t left, int64_t right, bool bottom_right, double scale, double softcap, bool alibi_symmetric,
                double dropout_p, bool deterministic, int64_t algorithm) {
  return Options{left, right, bottom_right, scale, softcap, alibi_symmetric, dropout_p, deterministic, algorithm};
}

// An optional tensor argument, undefined when absent.
Tensor given(const std::optional<Tensor>& t) { return t.has_value() ? *t : Tensor(); }

// flashattn_ext::fwd: (out, lse).
std::tuple<Tensor, Tensor> fwd_kernel(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const std::optional<Tensor>& bias, const std::optional<Tensor>& slopes,
                                      int64_t left, int64_t right, bool bottom_right, double scale, double softcap,
                                      bool alibi_symmetric, double dropout_p, int64_t seed, int64_t offset,
                                      bool deterministic, int64_t algorithm) {
  return forward(
      q, k, v, given(bias), given(slopes),
      options(left, right, bottom_right, scale, softcap, alibi_symmetric, dropout_p, deterministic, algorithm),
      Rng{seed, offset}, true);
}

// flashattn_ext::attention below autograd: the output alone, no LSE written.
Tensor attention_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& bias,
                        const std::optional<Tensor>& slopes, int64_t left, int64_t right, bool bottom_right,
                        double scale, double softcap, bool alibi_symmetric, double dropout_p, int64_t seed,
                        int64_t offset, bool deterministic, int64_t algorithm) {
  return std::get<0>(
      forward(q, k, v, given(bias), given(slopes),
              options(left, right, bottom_right, scale, softcap, alibi_symmetric, dropout_p, deterministic, algorithm),
              Rng{seed, offset}, false));
}

// flashattn_ext::bwd: (dq, dk, dv, dbias), with the dropout mask of the forward's seed and
// offset; dbias has the bias's shape (summed over its broadcast dims), or is empty unless
// want_dbias.
std::tuple<Tensor, Tensor, Tensor, Tensor> bwd_kernel(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const std::optional<Tensor>& bias_arg, const std::optional<Tensor>& slopes_arg, int64_t left, int64_t right,
    bool bottom_right, double scale, double softcap, bool alibi_symmetric, double dropout_p, int64_t seed,
    int64_t offset, bool deterministic, int64_t algorithm, bool want_dbias) {
  const Tensor bias = given(bias_arg), slopes = given(slopes_arg);
  const Rng rng{seed, offset};
  const auto p = cache.get(
      q, k, v, bias, slopes,
      options(left, right, bottom_right, scale, softcap, alibi_symmetric, dropout_p, deterministic, algorithm));
  const std::array<int64_t, 4> out_shape{q.size(0), q.size(1), q.size(2), v.size(3)};
  const std::array<int64_t, 3> lse_shape{q.size(0), q.size(2), q.size(1)};
  check_like_q(out, q, "out");
  check_like_q(dout, q, "dout");
  TORCH_CHECK(out.sizes() == out_shape && dout.sizes() == out_shape, "flashattn_ext::bwd: out ", out.sizes(),
              " and dout ", dout.sizes(), " must have the shape ", at::IntArrayRef(out_shape));
  TORCH_CHECK(lse.sizes() == lse_shape && lse.scalar_type() == at::kFloat && lse.device() == q.device(),
              "flashattn_ext::bwd: lse must be float32 of shape ", at::IntArrayRef(lse_shape), " on q's device");
  TORCH_CHECK(!want_dbias || bias.defined(), "flashattn_ext::bwd: want_dbias needs a bias tensor");
  const Tensor o = with_strides(out, p->out), d_o = with_strides(dout, p->out), l = lse.contiguous();
  Tensor dq = at::empty_strided(q.sizes(), p->dq, q.options());
  Tensor dk = at::empty_strided(k.sizes(), p->dk, q.options());
  Tensor dv = at::empty_strided(v.sizes(), p->dv, q.options());
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
                               .alibi_slopes = slopes_ptr(slopes)};
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
                        const std::optional<Tensor>& bias, const std::optional<Tensor>& slopes, const Options& o,
                        const Rng& rng) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, lse] =
        fwd_op().call(q, k, v, bias, slopes, o.window_left, o.window_right, o.bottom_right, o.scale, o.softcap,
                      o.alibi_symmetric, o.dropout_p, rng.seed, rng.offset, o.deterministic, o.algorithm);
    ctx->save_for_backward({q, k, v, out, lse, given(bias), given(slopes)});
    auto& d = ctx->saved_data;  // the backward's dropout mask is the forward's: its seed and offset are kept
    d["left"] = o.window_left;
    d["right"] = o.window_right;
    d["bottom_right"] = o.bottom_right;
    d["scale"] = o.scale;
    d["softcap"] = o.softcap;
    d["alibi_symmetric"] = o.alibi_symmetric;
    d["dropout_p"] = o.dropout_p;
    d["seed"] = rng.seed;
    d["offset"] = rng.offset;
    d["deterministic"] = o.deterministic;
    d["algorithm"] = o.algorithm;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto& d = ctx->saved_data;
    const bool want_dbias = s[5].defined() && ctx->needs_input_grad(3);  // edges: q, k, v, bias if given
    auto [dq, dk, dv, dbias] =
        bwd_op().call(grads[0], s[0], s[1], s[2], s[3], s[4], opt(s[5]), opt(s[6]), d["left"].toInt(),
                      d["right"].toInt(), d["bottom_right"].toBool(), d["scale"].toDouble(), d["softcap"].toDouble(),
                      d["alibi_symmetric"].toBool(), d["dropout_p"].toDouble(), d["seed"].toInt(), d["offset"].toInt(),
                      d["deterministic"].toBool(), d["algorithm"].toInt(), want_dbias);
    return {dq, dk, dv, want_dbias ? dbias : Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// flashattn_ext::attention with autograd: the Function when a gradient is wanted, else
// the kernel below autograd.
Tensor attention_autograd(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& bias,
                          const std::optional<Tensor>& slopes, int64_t left, int64_t right, bool bottom_right,
                          double scale, double softcap, bool alibi_symmetric, double dropout_p, int64_t seed,
                          int64_t offset, bool deterministic, int64_t algorithm) {
  const bool bias_grad = bias.has_value() && bias->defined() && bias->requires_grad();
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad() || bias_grad)) {
    return Attention::apply(
        q, k, v, bias, slopes,
        options(left, right, bottom_right, scale, softcap, alibi_symmetric, dropout_p, deterministic, algorithm),
        Rng{seed, offset});
  }
  at::AutoDispatchBelowADInplaceOrView below;
  return attention_op().call(q, k, v, bias, slopes, left, right, bottom_right, scale, softcap, alibi_symmetric,
                             dropout_p, seed, offset, deterministic, algorithm);
}

// ------------------------------------------------------------------ the Python entry

bool servable(const Tensor& t, const Tensor& q) {
  return t.dim() == 4 && t.layout() == at::kStrided && t.scalar_type() == q.scalar_type() && t.device() == q.device() &&
         t.stride(3) == 1 && t.numel() > 0;
}

// A bias the Python path would run with, not refuse in Python (flashattn._plan's
// bias_strides_from and _check_bias): q's dtype and device, broadcastable, its key stride
// 0 or 1.
bool bias_servable(const Tensor& bias, const Tensor& q, const Tensor& k) {
  Strides st;
  return bias.dim() == 4 && bias.layout() == at::kStrided && bias.scalar_type() == q.scalar_type() &&
         bias.device() == q.device() && bias_strides(bias, q, k, st) && (k.size(1) == 1 || st[3] == 0 || st[3] == 1);
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
// disagree, a bias or slopes it would refuse, whose errors that path words. bias is the
// 4-D additive bias flashattn._torch made of bias and masks; with dropout, rng is the
// (seed, offset) tensor the Python path would run with.
py::object attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& bias,
                     const std::optional<Tensor>& slopes, const std::optional<Tensor>& rng_tensor, int64_t left,
                     int64_t right, bool bottom_right, double scale, double softcap, bool alibi_symmetric,
                     double dropout_p, bool deterministic, int64_t algorithm) {
  const auto dt = q.scalar_type();
  Rng rng;
  if (!(dt == at::kHalf || dt == at::kBFloat16 || dt == at::kFloat) || !(q.is_cpu() || q.is_cuda()) ||
      !servable(q, q) || !servable(k, q) || !servable(v, q) || !k_fits_q(k, q) || !v_fits_k(v, k) || (bias && slopes) ||
      (bias && !bias_servable(*bias, q, k)) || (slopes && !slopes_fit(*slopes, q)) ||
      (dropout_p != 0 && !read_rng(rng_tensor, rng))) {
    return py::none();
  }
  Tensor out;
  {
    py::gil_scoped_release no_gil;
    out = attention_op().call(q, k, v, bias, slopes, left, right, bottom_right, scale, softcap, alibi_symmetric,
                              dropout_p, rng.seed, rng.offset, deterministic, algorithm);
  }
  return py::cast(out);
}

}  // namespace

TORCH_LIBRARY(flashattn_ext, m) {
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor? alibi_slopes, int window_left, int window_right, "
      "bool bottom_right, float scale, float softcap, bool alibi_symmetric, float dropout_p, int seed, int offset, "
      "bool deterministic, int algorithm) -> Tensor");
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor? alibi_slopes, int window_left, int window_right, "
      "bool bottom_right, float scale, float softcap, bool alibi_symmetric, float dropout_p, int seed, int offset, "
      "bool deterministic, int algorithm) -> (Tensor, Tensor)");
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? bias, Tensor? alibi_slopes, "
      "int window_left, int window_right, bool bottom_right, float scale, float softcap, bool alibi_symmetric, "
      "float dropout_p, int seed, int offset, bool deterministic, int algorithm, bool want_dbias) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
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
