/**
 * @file flashattn.hpp
 * @brief Optional header-only C++17 RAII wrapper over the C API in flashattn.h.
 *
 * Everything here is inline in the caller's program: it adds no symbol to
 * libflashattn and needs nothing beyond flashattn.h and the C++ standard library.
 * Failures throw flashattn::Error, which carries the status code and the library's
 * message (flashattn_last_error()).
 */
#ifndef FLASHATTN_HPP
#define FLASHATTN_HPP

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "flashattn.h"

/** C++ wrapper types for libflashattn. */
namespace flashattn {

/** A failed libflashattn call: its status code and the library's message. */
class Error : public std::runtime_error {
 public:
  /**
   * @param status The failing status.
   * @param function The C function that failed.
   * @param message The library's message.
   */
  Error(flashattn_status_t status, const std::string& function, const std::string& message)
      : std::runtime_error(function + ": " + message + " (" + flashattn_status_string(status) + ")"),
        status_(status),
        message_(message) {}
  /** @return The status code. */
  flashattn_status_t status() const noexcept { return status_; }
  /** @return The status name, e.g. "FLASHATTN_STATUS_INVALID_SHAPE". */
  const char* status_name() const noexcept { return flashattn_status_string(status_); }
  /** @return The library's message naming the argument and its value. */
  const std::string& message() const noexcept { return message_; }

 private:
  flashattn_status_t status_;
  std::string message_;
};

/**
 * @brief Throw Error for a failed status.
 * @param status Result of a C call.
 * @param function Name of that call.
 */
inline void check(flashattn_status_t status, const char* function) {
  if (status != FLASHATTN_STATUS_SUCCESS) throw Error(status, function, flashattn_last_error());
}

/** Problem shape (see flashattn_plan_set_shape). */
struct Shape {
  int64_t batch;       /**< Sequences. */
  int64_t seqlen_q;    /**< Query length (max in varlen mode). */
  int64_t seqlen_k;    /**< Key length (max in varlen mode). */
  int64_t heads_q;     /**< Query heads. */
  int64_t heads_kv;    /**< Key/value heads, dividing heads_q. */
  int64_t head_dim_qk; /**< Head dimension of Q and K. */
  int64_t head_dim_v;  /**< Head dimension of V and O. */
};

/** An owned flashattn_plan_t (move-only). Setters return *this for chaining. */
class Plan {
 public:
  /**
   * @brief Create a plan and set its shape and dtype.
   * @param shape Problem shape.
   * @param dtype Element type.
   * @param backend Backend (AUTO resolves now).
   * @param device CUDA device ordinal.
   */
  Plan(const Shape& shape, flashattn_dtype_t dtype, flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO,
       int device = 0) {
    check(flashattn_plan_create(&plan_, backend, device), "flashattn_plan_create");
    try {
      set_shape(shape);
      set_dtype(dtype);
    } catch (...) {
      flashattn_plan_destroy(plan_);
      throw;
    }
  }
  ~Plan() { flashattn_plan_destroy(plan_); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  /** @param other Plan to take over; left empty. */
  Plan(Plan&& other) noexcept : plan_(std::exchange(other.plan_, nullptr)) {}
  /** @param other Plan to take over; left empty. @return *this. */
  Plan& operator=(Plan&& other) noexcept {
    if (this != &other) {
      flashattn_plan_destroy(plan_);
      plan_ = std::exchange(other.plan_, nullptr);
    }
    return *this;
  }

  /** @return The C handle (still owned by this object). */
  flashattn_plan_t get() const noexcept { return plan_; }

  /** @return The resolved backend (CPU or CUDA). */
  flashattn_backend_t backend() const {
    flashattn_backend_t b = FLASHATTN_BACKEND_AUTO;
    check(flashattn_plan_get_backend(plan_, &b), "flashattn_plan_get_backend");
    return b;
  }

  /** @param s Shape (resets strides). @return *this. */
  Plan& set_shape(const Shape& s) {
    check(flashattn_plan_set_shape(plan_, s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim_qk,
                                   s.head_dim_v),
          "flashattn_plan_set_shape");
    return *this;
  }
  /** @param d Element type. @return *this. */
  Plan& set_dtype(flashattn_dtype_t d) {
    check(flashattn_plan_set_dtype(plan_, d), "flashattn_plan_set_dtype");
    return *this;
  }
  /** @param t Tensor. @param strides (batch, seq, head, dim) in elements. @return *this. */
  Plan& set_strides(flashattn_tensor_t t, const std::array<int64_t, 4>& strides) {
    check(flashattn_plan_set_strides(plan_, t, strides.data()), "flashattn_plan_set_strides");
    return *this;
  }
  /** @param scale Softmax scale (0 = default). @return *this. */
  Plan& set_scale(float scale) {
    check(flashattn_plan_set_softmax_scale(plan_, scale), "flashattn_plan_set_softmax_scale");
    return *this;
  }
  /** @param a Algorithm. @return *this. */
  Plan& set_algorithm(flashattn_algorithm_t a) {
    check(flashattn_plan_set_algorithm(plan_, a), "flashattn_plan_set_algorithm");
    return *this;
  }
  /** @param total_q Query tokens. @param total_k Key tokens. @return *this. */
  Plan& set_varlen(int64_t total_q, int64_t total_k) {
    check(flashattn_plan_set_varlen(plan_, 1, total_q, total_k), "flashattn_plan_set_varlen");
    return *this;
  }
  /** @return *this, with variable-length mode off. */
  Plan& clear_varlen() {
    check(flashattn_plan_set_varlen(plan_, 0, 0, 0), "flashattn_plan_set_varlen");
    return *this;
  }
  /** @param on Deterministic gradients. @return *this. */
  Plan& set_deterministic(bool on) {
    check(flashattn_plan_set_deterministic(plan_, on ? 1 : 0), "flashattn_plan_set_deterministic");
    return *this;
  }
  /** @param on The backward adds into dQ, dK, dV. @return *this. */
  Plan& set_grad_accumulate(bool on) {
    check(flashattn_plan_set_grad_accumulate(plan_, on ? 1 : 0), "flashattn_plan_set_grad_accumulate");
    return *this;
  }
  /** @param align Alignment. @param left Left window. @param right Right window. @return *this. */
  Plan& set_band_mask(flashattn_mask_align_t align, int64_t left, int64_t right) {
    check(flashattn_plan_set_band_mask(plan_, align, left, right), "flashattn_plan_set_band_mask");
    return *this;
  }
  /** @param align Alignment. @return *this, with a causal mask. */
  Plan& set_causal(flashattn_mask_align_t align = FLASHATTN_ALIGN_TOP_LEFT) {
    return set_band_mask(align, FLASHATTN_WINDOW_UNBOUNDED, 0);
  }
  /** @param softcap Softcap (0 disables). @return *this. */
  Plan& set_softcap(float softcap) {
    check(flashattn_plan_set_softcap(plan_, softcap), "flashattn_plan_set_softcap");
    return *this;
  }
  /** @param kind Bias kind. @param strides 4 strides for TENSOR, else NULL. @return *this. */
  Plan& set_bias(flashattn_bias_t kind, const int64_t* strides = nullptr) {
    check(flashattn_plan_set_bias(plan_, kind, strides), "flashattn_plan_set_bias");
    return *this;
  }
  /** @param batch_stride Elements between sequences' ALiBi slopes (0: per head only). @return *this. */
  Plan& set_alibi_batch_stride(int64_t batch_stride) {
    check(flashattn_plan_set_alibi_batch_stride(plan_, batch_stride), "flashattn_plan_set_alibi_batch_stride");
    return *this;
  }
  /** @param p Drop probability. @param seed Philox key. @param offset Philox offset. @return *this. */
  Plan& set_dropout(float p, uint64_t seed, uint64_t offset = 0) {
    check(flashattn_plan_set_dropout(plan_, p, seed, offset), "flashattn_plan_set_dropout");
    return *this;
  }
  /**
   * @param layout Host layout or NULL. @param heads Layout heads. @param rows Row blocks.
   * @param cols Column blocks. @param block_q Rows per block. @param block_k Columns per block.
   * @return *this.
   */
  Plan& set_block_sparse(const uint8_t* layout, int64_t heads, int64_t rows, int64_t cols, int64_t block_q,
                         int64_t block_k) {
    check(flashattn_plan_set_block_sparse(plan_, layout, heads, rows, cols, block_q, block_k),
          "flashattn_plan_set_block_sparse");
    return *this;
  }

  /** @param pass Pass. @return Workspace bytes it needs. */
  std::size_t workspace_size(flashattn_pass_t pass) const {
    std::size_t n = 0;
    check(flashattn_plan_get_workspace_size(plan_, pass, &n), "flashattn_plan_get_workspace_size");
    return n;
  }

  /**
   * @brief flashattn_fwd; throws Error on failure.
   * @param args Pointers (struct_size set by FLASHATTN_FWD_ARGS_INIT).
   * @param workspace Scratch. @param bytes Its size. @param stream CUDA stream or nullptr.
   */
  void forward(const flashattn_fwd_args_t& args, void* workspace, std::size_t bytes,
               CUstream_st* stream = nullptr) const {
    check(flashattn_fwd(plan_, &args, workspace, bytes, stream), "flashattn_fwd");
  }
  /**
   * @brief flashattn_bwd; throws Error on failure.
   * @param args Pointers (struct_size set by FLASHATTN_BWD_ARGS_INIT).
   * @param workspace Scratch. @param bytes Its size. @param stream CUDA stream or nullptr.
   */
  void backward(const flashattn_bwd_args_t& args, void* workspace, std::size_t bytes,
                CUstream_st* stream = nullptr) const {
    check(flashattn_bwd(plan_, &args, workspace, bytes, stream), "flashattn_bwd");
  }

 private:
  flashattn_plan_t plan_ = nullptr;
};

}  // namespace flashattn

#endif  // FLASHATTN_HPP
