// The entry points of the fused CPU kernel and their Python bindings; the kernels are in rotary.h, and
// rope_cache (rotary.rotate_and_cache) in rotary_cache.cpp, compiled beside this file.

#include "rotary.h"

// xs[i], outs[i]: [B, S, H_i, D] (outs[i] may be xs[i] itself: in place). cos[i]/sin[i]: the table of
// xs[i], fp32 (or fp64 for fp64 inputs) [N, r] or per-head [N, H_i, r], unit column stride.
// positions: int64 [B, S] (any strides) selecting the table row of (b, s), or undefined: row = b * batch_rows + s.
void rope_cpu(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& cos,
              const std::vector<at::Tensor>& sin, const std::optional<at::Tensor>& positions, int64_t batch_rows,
              bool interleaved, bool conjugate, const std::optional<at::Tensor>& frequencies) {
  const Call call = prepare(xs, outs, cos, sin, positions, batch_rows, frequencies);
  if (call.double_tables) {
    run<double, double>(call.views, call.B, call.S, call.D, call.r, call.rows, interleaved, conjugate);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xs[0].scalar_type(), "rope_cpu", [&] {
    run<scalar_t, float>(call.views, call.B, call.S, call.D, call.r, call.rows, interleaved, conjugate);
  });
}

// Per-token table gradients (see table_grad): gcos[i]/gsin[i] are [B, S, r] (summed over heads) or
// [B, S, H_i, r] for per-head tables, in the tables' dtype; every element is written.
void rope_table_grad_cpu(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& grads,
                         const std::vector<at::Tensor>& cos, const std::vector<at::Tensor>& sin,
                         const std::vector<at::Tensor>& gcos, const std::vector<at::Tensor>& gsin, bool interleaved,
                         bool conjugate) {
  const Call call = prepare(xs, grads, cos, sin, std::nullopt, 0, std::nullopt);
  TORCH_CHECK(gcos.size() == xs.size() && gsin.size() == xs.size(), "rotary: one gradient buffer per input");
  for (size_t i = 0; i < xs.size(); ++i) {
    TORCH_CHECK(gcos[i].scalar_type() == cos[i].scalar_type() && gcos[i].sizes() == gsin[i].sizes() &&
                    gcos[i].size(0) == call.B && gcos[i].size(1) == call.S && gcos[i].size(-1) == call.r &&
                    gcos[i].stride(-1) == 1 && gsin[i].stride(-1) == 1,
                "rotary: table gradient buffers must be [B, S, (H,) r] in the tables' dtype");
  }
  if (call.double_tables) {
    table_grad<double, double>(call.views, gcos, gsin, call.B, call.S, call.r, interleaved, conjugate);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xs[0].scalar_type(), "rope_table_grad_cpu", [&] {
    table_grad<scalar_t, float>(call.views, gcos, gsin, call.B, call.S, call.r, interleaved, conjugate);
  });
}

// Per-head RMSNorm of each x, then its rotation (see norm_rotate_vector): xs[i], outs[i], cos[i], sin[i],
// positions and batch_rows as in rope_cpu; weights[i] [D] and rstds[i] [B, S, H_i] (written: 1 / sqrt(mean(x²)
// + eps) of each vector, for the backward) in the arithmetic dtype, fp32 (fp64 for fp64 inputs). weights[i] is
// the factor applied: Qwen3RMSNorm's weight (round_normed: the normalised x is rounded to the storage dtype
// first), or Gemma3RMSNorm's 1 + weight.
void rmsnorm_rope_cpu(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& outs,
                      const std::vector<at::Tensor>& rstds, const std::vector<at::Tensor>& weights,
                      const std::vector<at::Tensor>& cos, const std::vector<at::Tensor>& sin,
                      const std::optional<at::Tensor>& positions, int64_t batch_rows, bool interleaved, bool round_normed,
                      double eps, const std::optional<at::Tensor>& frequencies) {
  const Call call = prepare(xs, outs, cos, sin, positions, batch_rows, frequencies);
  const bool fp64 = xs[0].scalar_type() == at::kDouble;
  TORCH_CHECK(fp64 == call.double_tables, "rotary: float64 inputs need float64 tables, other inputs fp32 tables");
  const auto acc = fp64 ? at::kDouble : at::kFloat;
  TORCH_CHECK(weights.size() == xs.size() && rstds.size() == xs.size(), "rotary: need one weight and one rstd per input");
  for (size_t i = 0; i < xs.size(); ++i) {
    TORCH_CHECK(weights[i].scalar_type() == acc && weights[i].dim() == 1 && weights[i].size(0) == call.D &&
                    weights[i].stride(0) == 1,
                "rotary: norm weights must be contiguous [D] in the arithmetic dtype (fp32, fp64 for fp64 inputs)");
    TORCH_CHECK(rstds[i].scalar_type() == acc && rstds[i].dim() == 3 && rstds[i].size(0) == call.B &&
                    rstds[i].size(1) == call.S && rstds[i].size(2) == xs[i].size(2),
                "rotary: rstd buffers must be [B, S, H] in the arithmetic dtype");
  }
  if (fp64) {
    norm_run<double, double>(call.views, weights, rstds, call.B, call.S, call.D, call.r, call.rows, interleaved,
                             round_normed, eps);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xs[0].scalar_type(), "rmsnorm_rope_cpu", [&] {
    if constexpr (!std::is_same_v<scalar_t, double>) {
      norm_run<scalar_t, float>(call.views, weights, rstds, call.B, call.S, call.D, call.r, call.rows, interleaved,
                                round_normed, eps);
    }
  });
}

// The decoding fast path of RoPE.forward: q [B, Hq, S, D] / k [B, Hk, S, D] (seq_axis 2) or [B, S, H, D]
// (seq_axis 1), rotated by rows of the full fp32 tables cos/sin [N, r]: rows offset .. offset + S - 1, or
// the rows positions gives (int64 [S] or [1 or B, S], read here: no device sync on the CPU), or with
// batch_rows == S > 0 the per-token tables [B * S, r] (Hugging Face's [B, S, r], flattened): row b * S + s. The
// transposes, the table slices and the outputs are made here, where each costs a tenth of what it
// costs from Python. Returns {} (nothing done) when any check of the general path would not pass
// (including a position outside the table: the general path grows it): the caller then takes that
// path, with its checks and messages. Results are the general path's: the same kernel on the same rows.
std::vector<at::Tensor> rope_decode_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                        const at::Tensor& sin, int64_t offset, const std::optional<at::Tensor>& positions,
                                        int64_t seq_axis, int64_t head_dim, bool interleaved, bool inplace,
                                        int64_t batch_rows) {
  if (q.dim() != 4 || k.dim() != 4 || !q.device().is_cpu() || !k.device().is_cpu() || (seq_axis != 1 && seq_axis != 2))
    return {};
  if (!q.has_storage() || !k.has_storage()) return {};  // e.g. torch.func's batched tensors: the general path says why
  const auto dtype = q.scalar_type();
  if (k.scalar_type() != dtype || !(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf)) return {};
  if (q.stride(3) != 1 || k.stride(3) != 1 || q.numel() == 0 || k.numel() == 0) return {};
  if (cos.scalar_type() != at::kFloat || sin.scalar_type() != at::kFloat || cos.dim() != 2 || !cos.device().is_cpu() ||
      cos.sizes() != sin.sizes() || cos.strides() != sin.strides() || cos.stride(1) != 1)
    return {};
  const int64_t B = q.size(0), S = q.size(seq_axis), r = cos.size(1), rows = cos.size(0);
  if (q.size(3) != head_dim || k.size(3) != head_dim || k.size(0) != B || k.size(seq_axis) != S || r <= 0 || r % 2 ||
      r > head_dim)
    return {};
  std::optional<at::Tensor> ids;
  at::Tensor c = cos, s = sin;
  if (positions.has_value() && positions->defined()) {
    const at::Tensor& p = *positions;
    if (p.scalar_type() != at::kLong || !p.device().is_cpu() || p.dim() < 1 || p.dim() > 2 || p.size(-1) != S ||
        (p.dim() == 2 && p.size(0) != 1 && p.size(0) != B))
      return {};
    const at::Tensor expanded = p.expand({B, S});
    const int64_t* data = expanded.data_ptr<int64_t>();
    for (int64_t b = 0; b < (p.dim() == 2 ? p.size(0) : 1); ++b)
      for (int64_t j = 0; j < S; ++j) {
        const int64_t t = data[b * expanded.stride(0) + j * expanded.stride(1)];
        if (t < 0 || t >= rows) return {};
      }
    ids = expanded;
  } else if (batch_rows != 0) {
    if (batch_rows != S || offset != 0 || rows != B * S) return {};
  } else {
    if (offset < 0 || offset + S > rows) return {};
    c = cos.narrow(0, offset, S);
    s = sin.narrow(0, offset, S);
  }
  const at::Tensor qv = seq_axis == 2 ? q.transpose(1, 2) : q;
  const at::Tensor kv = seq_axis == 2 ? k.transpose(1, 2) : k;
  if (inplace) {
    if (at::has_internal_overlap(q) != at::MemOverlap::No || at::has_internal_overlap(k) != at::MemOverlap::No ||
        q.storage().is_alias_of(k.storage()))
      return {};  // the general path checks exactly which elements are shared
    rope_cpu({qv, kv}, {qv, kv}, {c, c}, {s, s}, ids, batch_rows, interleaved, false, std::nullopt);
    return {q, k};
  }
  const at::Tensor qo = at::empty_like(qv), ko = at::empty_like(kv);
  rope_cpu({qv, kv}, {qo, ko}, {c, c}, {s, s}, ids, batch_rows, interleaved, false, std::nullopt);
  if (seq_axis == 2) return {qo.transpose(1, 2), ko.transpose(1, 2)};
  return {qo, ko};
}

// in rotary_cache.cpp
std::tuple<std::vector<int64_t>, std::vector<at::Tensor>> rope_cache_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& slots, const at::Tensor& cos, const std::optional<at::Tensor>& sin,
    const std::optional<at::Tensor>& rows, bool interleaved, bool inplace, bool memory_checked, int64_t layout,
    bool cache_bhsd);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rope_decode", &rope_decode_cpu,
        "decoding fast path: q, k at positions offset.. or given; [] when the general path is needed");
  m.def("rope", &rope_cpu, "fused rotary embedding over a list of [B, S, H, D] views, one table per view");
  m.def("rope_table_grad", &rope_table_grad_cpu, "per-token gradients of the cos/sin tables");
  m.def("rmsnorm_rope", &rmsnorm_rope_cpu, "per-head RMSNorm of each [B, S, H, D] view, then its rotation");
  m.def("rope_cache", &rope_cache_cpu,
        "rotate_and_cache: q and k rotated, the rotated k and v written into the KV cache, in one pass");
}
