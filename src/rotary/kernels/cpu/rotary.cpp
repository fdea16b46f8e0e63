// The entry points of the fused CPU kernel and their Python bindings; the kernels are in rotary.h, and
// rope_cache (rotary.rotate_and_cache) in rotary_cache.cpp, compiled beside this file.

#include "rotary.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/InferenceMode.h>

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
                    gcos[i].stride(-1) == 1 && gsin[i].stride(-1) == 1 && gcos[i].is_cpu() && gsin[i].is_cpu(),
                "rotary: table gradient buffers must be [B, S, (H,) r] on the CPU in the tables' dtype");
  }
  if (call.double_tables) {
    table_grad<double, double>(call.views, gcos, gsin, call.B, call.S, call.r, interleaved, conjugate);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xs[0].scalar_type(), "rope_table_grad_cpu", [&] {
    table_grad<scalar_t, float>(call.views, gcos, gsin, call.B, call.S, call.r, interleaved, conjugate);
  });
}

// norm_run for inputs of dtype `type` (fp32 tables; float64 tables for float64 inputs).
void norm_dispatch(const std::vector<View>& views, const std::vector<Norm>& norms, at::ScalarType type, int64_t B,
                   int64_t S, int64_t D, int64_t r, const Rows& rows, bool interleaved, bool round_normed,
                   double eps) {
  if (type == at::kDouble) {
    norm_run<double, double>(views, norms, B, S, D, r, rows, interleaved, round_normed, eps);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, type, "rmsnorm_rope_cpu", [&] {
    if constexpr (!std::is_same_v<scalar_t, double>) {
      norm_run<scalar_t, float>(views, norms, B, S, D, r, rows, interleaved, round_normed, eps);
    }
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
                    weights[i].stride(0) == 1 && weights[i].is_cpu(),
                "rotary: norm weights must be contiguous [D] on the CPU in the arithmetic dtype (fp32, fp64 for fp64 "
                "inputs)");
    TORCH_CHECK(rstds[i].scalar_type() == acc && rstds[i].dim() == 3 && rstds[i].size(0) == call.B &&
                    rstds[i].size(1) == call.S && rstds[i].size(2) == xs[i].size(2) && rstds[i].is_cpu(),
                "rotary: rstd buffers must be [B, S, H] on the CPU in the arithmetic dtype");
  }
  std::vector<Norm> norms;
  norms.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i)
    norms.push_back(Norm{weights[i].data_ptr(), rstds[i].data_ptr(), rstds[i].stride(0), rstds[i].stride(1),
                         rstds[i].stride(2)});
  norm_dispatch(call.views, norms, xs[0].scalar_type(), call.B, call.S, call.D, call.r, call.rows, interleaved,
                round_normed, eps);
}

// A call's signature (rotary.plans), computed and compared here, where it costs a tenth of what it costs from
// Python: grad and inference mode, then per tensor its rank, sizes, strides, storage offset, dtype, device,
// requires_grad and inference-ness (-1 for an absent one), and in place whether each input shares the first
// one's storage (their overlap then follows from the rest). A recorded plan keeps its signature; the call
// that does not match it does nothing here, and the general path runs (a new signature).
struct Signature {
  std::vector<int64_t> fields;
};

// Where a signature's fields go: appended to a new signature (Record), or compared in order with a recorded one
// (Match: no allocation, and it stops reading at the first difference).
struct Record {
  std::vector<int64_t>& v;
  void operator()(int64_t x) { v.push_back(x); }
};

struct Match {
  const std::vector<int64_t>& v;
  size_t i = 0;
  bool same = true;
  void operator()(int64_t x) {
    if (same) same = i < v.size() && v[i++] == x;
  }
  bool done() const { return same && i == v.size(); }
};

template <class Sink>
inline void add_tensor(Sink& out, const at::Tensor& t) {
  if (!t.defined()) {
    out(-1);
    return;
  }
  if (!t.has_storage()) {  // torch.func's wrappers: never the signature of a recorded plan
    out(-2);
    return;
  }
  out(t.dim());
  for (const auto n : t.sizes()) out(n);
  for (const auto n : t.strides()) out(n);
  out(t.storage_offset());
  out(static_cast<int64_t>(t.scalar_type()));
  out(static_cast<int64_t>(t.device().type()));
  out(t.device().index());
  out(t.requires_grad());
  out(t.is_inference());
}

template <class Sink>
void signature_fields(Sink& out, const std::vector<at::Tensor>& xs, const at::Tensor& cos, const at::Tensor& sin,
                      const std::optional<at::Tensor>& positions, bool inplace) {
  out(at::GradMode::is_enabled());
  out(c10::InferenceMode::is_enabled());
  out(static_cast<int64_t>(xs.size()));
  for (const auto& x : xs) add_tensor(out, x);
  add_tensor(out, cos);
  add_tensor(out, sin);
  add_tensor(out, positions.has_value() ? *positions : at::Tensor());
  if (inplace)
    for (size_t i = 1; i < xs.size(); ++i)
      out(xs[i].has_storage() && xs[0].has_storage() && xs[i].storage().is_alias_of(xs[0].storage()));
}

Signature signature_of(const std::vector<at::Tensor>& xs, const at::Tensor& cos, const at::Tensor& sin,
                       const std::optional<at::Tensor>& positions, bool inplace) {
  Signature sig;
  sig.fields.reserve(64);
  Record record{sig.fields};
  signature_fields(record, xs, cos, sin, positions, inplace);
  return sig;
}

bool matches(const Signature& expected, const std::vector<at::Tensor>& xs, const at::Tensor& cos, const at::Tensor& sin,
             const std::optional<at::Tensor>& positions, bool inplace) {
  Match match{expected.fields};
  signature_fields(match, xs, cos, sin, positions, inplace);
  return match.done();
}

// The views and the table window of a recorded plan's call (rope_layout, rmsnorm_rope_layout): xs[i] as
// [B, S, H_i, D] views of [B, S, H_i, D] (layout 1), [B, H_i, S, D] (layout 2) or packed [T, H_i, D] (layout 0, one
// sequence of T tokens); cos/sin: [N, r] (with positions: int64 [S], [1, S] or [B, S] ([T] packed); without: rows
// row_offset .. row_offset + S - 1, checked to lie inside the table), or the tokens' own rows [1, S, r] / [B, S, r].
struct LayoutCall {
  std::vector<at::Tensor> views;
  at::Tensor cos, sin;
  int64_t batch_rows = 0;
  std::optional<at::Tensor> ids;
};

// A window of rows outside the table is no call of the plan's: nullopt (nothing done; the general path grows the
// table, or names the offset).
std::optional<LayoutCall> layout_call(const std::vector<at::Tensor>& xs, const at::Tensor& cos, const at::Tensor& sin,
                                      int64_t row_offset, const std::optional<at::Tensor>& positions, int64_t layout) {
  TORCH_CHECK(!xs.empty() && (layout == 0 || layout == 1 || layout == 2), "rotary: a plan's call needs inputs and a layout");
  LayoutCall call;
  call.views.reserve(xs.size());
  for (const auto& x : xs) call.views.push_back(layout == 0 ? x.unsqueeze(0) : layout == 2 ? x.transpose(1, 2) : x);
  const int64_t B = call.views[0].size(0), S = call.views[0].size(1);
  call.cos = cos;
  call.sin = sin;
  if (positions.has_value() && positions->defined()) {
    const at::Tensor& p = *positions;
    TORCH_CHECK(p.scalar_type() == at::kLong && p.dim() >= 1 && p.dim() <= 2, "rotary: positions must be int64 [S] or [B, S]");
    call.ids = layout == 0 ? p.unsqueeze(0) : p.expand({B, S});
  } else if (cos.dim() == 3) {  // the tokens' own rows [1 or B, S, r]
    TORCH_CHECK(cos.size(1) == S && (cos.size(0) == 1 || cos.size(0) == B), "rotary: per-token tables must be [1 or B, S, r]");
    if (cos.size(0) == 1) {
      call.cos = cos.select(0, 0);
      call.sin = sin.select(0, 0);
    } else {
      call.cos = cos.flatten(0, 1);
      call.sin = sin.flatten(0, 1);
      call.batch_rows = S;
    }
  } else {
    if (row_offset < 0 || row_offset + S > cos.size(0)) return std::nullopt;
    if (row_offset != 0 || cos.size(0) != S) {
      call.cos = cos.narrow(0, row_offset, S);
      call.sin = sin.narrow(0, row_offset, S);
    }
  }
  return call;
}

// A kernel view's result back in the caller's layout.
inline at::Tensor unview(const at::Tensor& o, int64_t layout) {
  return layout == 0 ? o.squeeze(0) : layout == 2 ? o.transpose(1, 2) : o;
}

// A tensor in the caller's layout read as the kernel's [B, S, H, D] (layout_call's view), without making the view:
// its sizes and the strides of B, S and H.
struct Dims {
  int64_t B, S, H, D, sb, ss, sh;
};

inline Dims kernel_dims(const at::Tensor& t, int64_t layout) {
  if (layout == 0) return {1, t.size(0), t.size(1), t.size(2), 0, t.stride(0), t.stride(1)};
  if (layout == 2) return {t.size(0), t.size(2), t.size(1), t.size(3), t.stride(0), t.stride(2), t.stride(1)};
  return {t.size(0), t.size(1), t.size(2), t.size(3), t.stride(0), t.stride(1), t.stride(2)};
}

// The table of a direct call (rope_direct, rmsnorm_direct) as pointers and strides: which row each token reads
// (Rows), the first row's cos and sin, and the row stride. cos/sin: a table [N, r] (rows row_offset .. or position
// ids) or the tokens' own rows [1, S, r] (shared by the batch) or [B, S, r] (row b * S + s, when its batch stride is
// S rows: layout_call's flatten is then a view). nullopt when the tables are not a form this handles (the caller
// takes layout_call); outside: rows outside the table (nothing done).
struct DirectTable {
  Rows rows;
  const char* c = nullptr;
  const char* s = nullptr;
  int64_t row_stride = 0;
  bool outside = false;
};

std::optional<DirectTable> direct_table(const at::Tensor& cos, const at::Tensor& sin, const Dims& d0,
                                        at::ScalarType input_type, int64_t row_offset,
                                        const std::optional<at::Tensor>& positions, int64_t layout,
                                        const std::optional<at::Tensor>& frequencies) {
  if (cos.dim() < 2 || cos.dim() > 3) return std::nullopt;
  const int64_t r = cos.size(-1);
  const auto table_type = cos.scalar_type();
  TORCH_CHECK(table_type == at::kFloat || (table_type == at::kDouble && input_type == at::kDouble),
              "rotary: tables must be fp32 (or float64 for float64 inputs)");
  TORCH_CHECK(r > 0 && r % 2 == 0 && r <= d0.D && cos.stride(-1) == 1 && sin.scalar_type() == table_type &&
                  sin.sizes() == cos.sizes() && sin.strides() == cos.strides() && cos.is_cpu() && sin.is_cpu(),
              "rotary: cos/sin must be [N, r] on the CPU, of one dtype with unit column stride and equal strides");
  const bool ids = positions.has_value() && positions->defined();
  DirectTable table{Rows{nullptr, 0, 0, 0, cos.size(0), nullptr}};
  table.row_stride = cos.stride(0);
  int64_t first = 0;
  if (cos.dim() == 3) {
    if (ids || cos.size(1) != d0.S || (cos.size(0) != 1 && cos.size(0) != d0.B)) return std::nullopt;
    const bool batched = cos.size(0) > 1;
    if (batched && d0.S > 1 && cos.stride(0) != d0.S * cos.stride(1)) return std::nullopt;
    table.row_stride = batched && d0.S == 1 ? cos.stride(0) : cos.stride(1);  // (one token: row b is batch b)
    table.rows.table_rows = cos.size(0) * d0.S;
    table.rows.batch_rows = cos.size(0) > 1 ? d0.S : 0;
  } else if (ids) {
    const at::Tensor& p = *positions;
    TORCH_CHECK(p.scalar_type() == at::kLong && p.dim() >= 1 && p.dim() <= 2 && p.size(-1) == d0.S &&
                    (p.dim() == 1 || p.size(0) == 1 || p.size(0) == d0.B) && (layout != 0 || p.dim() == 1) &&
                    p.is_cpu(),
                "rotary: positions must be int64 [S], [1, S] or [B, S] ([T] packed) on the CPU");
    table.rows.positions = p.data_ptr<int64_t>();
    table.rows.pb = p.dim() == 2 && p.size(0) > 1 ? p.stride(0) : 0;
    table.rows.ps = p.stride(-1);
    if (frequencies.has_value() && frequencies->defined()) {
      const at::Tensor& f = *frequencies;
      TORCH_CHECK(f.scalar_type() == at::kDouble && f.dim() == 1 && f.size(0) == r / 2 + 1 && f.is_contiguous() &&
                      f.is_cpu(),
                  "rotary: frequencies must be float64 [r/2 + 1] on the CPU, with positions");
      table.rows.freqs = f.data_ptr<double>();
    }
  } else {
    if (row_offset < 0 || row_offset + d0.S > cos.size(0)) {
      table.outside = true;
      return table;
    }
    first = row_offset;
    table.rows.table_rows = d0.S;  // the window's rows
  }
  const int64_t shift = first * table.row_stride * static_cast<int64_t>(cos.element_size());
  table.c = static_cast<const char*>(cos.data_ptr()) + shift;
  table.s = static_cast<const char*>(sin.data_ptr()) + shift;
  return table;
}

// Inputs a direct call takes: CPU, of the layout's rank, and (out of place) dense, so that their outputs are
// allocated with their own strides.
inline bool direct_inputs(const std::vector<at::Tensor>& xs, int64_t layout, bool inplace) {
  if (xs.empty() || (layout != 0 && layout != 1 && layout != 2)) return false;
  for (const auto& x : xs)
    if (x.dim() != (layout == 0 ? 3 : 4) || !x.is_cpu() || (!inplace && !x.is_non_overlapping_and_dense()))
      return false;
  return true;
}

// x's kernel view and its output (x itself in place, else new with x's strides: empty_like of a dense view keeps
// its strides, so the view's output, viewed back, has x's strides; allocated without the dispatcher, a CPU tensor
// as the plan's signature says), both read through layout.
inline View direct_view(const at::Tensor& x, const Dims& d0, const DirectTable& table, int64_t layout, bool inplace,
                        at::Tensor& out) {
  const Dims d = kernel_dims(x, layout);
  TORCH_CHECK(d.B == d0.B && d.S == d0.S && d.D == d0.D && x.stride(-1) == 1,
              "rotary: inputs disagree on B, S, D, or the channel dim has no unit stride");
  if (inplace)
    TORCH_CHECK(at::has_internal_overlap(x) != at::MemOverlap::Yes, "rotary: an input rotated in place overlaps itself");
  out = inplace ? x : at::Tensor(at::detail::empty_strided_cpu(x.sizes(), x.strides(), x.options()));
  const Dims od = kernel_dims(out, layout);
  return View{static_cast<char*>(x.data_ptr()), static_cast<char*>(out.data_ptr()), d.H, d.sb, d.ss, d.sh,
              od.sb, od.ss, od.sh, table.c, table.s, table.row_stride, 0};
}

// rope_layout's call for inputs whose outputs are allocated with their own strides (direct_inputs): the kernel's
// views, the table window and the expansion of the ids are strides and pointers here, not tensors (each tensor op
// costs about a microsecond at a decoding step); the results are those of the layout_call path. nullopt when the
// call is not one this handles (the caller takes layout_call); {} for rows outside the table.
std::optional<std::vector<at::Tensor>> rope_direct(const std::vector<at::Tensor>& xs, const at::Tensor& cos,
                                                   const at::Tensor& sin, int64_t row_offset,
                                                   const std::optional<at::Tensor>& positions, int64_t layout,
                                                   bool interleaved, bool inplace,
                                                   const std::optional<at::Tensor>& frequencies) {
  if (!direct_inputs(xs, layout, inplace)) return std::nullopt;
  const Dims d0 = kernel_dims(xs[0], layout);
  const auto table = direct_table(cos, sin, d0, xs[0].scalar_type(), row_offset, positions, layout, frequencies);
  if (!table) return std::nullopt;
  if (table->outside) return std::vector<at::Tensor>{};
  std::vector<View> views;
  views.reserve(xs.size());
  std::vector<at::Tensor> outs(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    TORCH_CHECK(xs[i].scalar_type() == xs[0].scalar_type(), "rotary: inputs disagree on dtype");
    views.push_back(direct_view(xs[i], d0, *table, layout, inplace, outs[i]));
  }
  const int64_t r = cos.size(-1);
  if (cos.scalar_type() == at::kDouble) {
    run<double, double>(views, d0.B, d0.S, d0.D, r, table->rows, interleaved, false);
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xs[0].scalar_type(), "rope_layout", [&] {
      run<scalar_t, float>(views, d0.B, d0.S, d0.D, r, table->rows, interleaved, false);
    });
  }
  if (inplace)
    for (const auto& x : xs) x.unsafeGetTensorImpl()->bump_version();  // (rotary.kernels.ops.mark_written)
  return outs;
}

// The entry a recorded plan calls (rotary.plans): the tensors of a call in the caller's layout (layout_call),
// checked by the general path when the plan was recorded, rotated by one table pair; {} (nothing done) when the
// call's signature is not the plan's. A row the table does not hold (positions given) is computed from
// frequencies. The views, the table window and the outputs are made here; what memory safety needs is checked
// here (and in prepare): the rows read lie inside the table, no input written in place overlaps itself. In place,
// the inputs' version counters move on, as after any in-place torch operation. Nothing is decided here: the plan
// decided it.
std::vector<at::Tensor> rope_layout_cpu(const Signature& expected, const std::vector<at::Tensor>& xs, const at::Tensor& cos,
                                        const at::Tensor& sin, int64_t row_offset,
                                        const std::optional<at::Tensor>& positions, int64_t layout, bool interleaved,
                                        bool inplace, const std::optional<at::Tensor>& frequencies) {
  if (!matches(expected, xs, cos, sin, positions, inplace)) return {};
  auto direct = rope_direct(xs, cos, sin, row_offset, positions, layout, interleaved, inplace, frequencies);
  if (direct) return std::move(*direct);
  const auto window = layout_call(xs, cos, sin, row_offset, positions, layout);
  if (!window) return {};
  const LayoutCall& call = *window;
  std::vector<at::Tensor> outs;
  outs.reserve(call.views.size());
  for (const auto& v : call.views) {
    if (inplace) {
      TORCH_CHECK(at::has_internal_overlap(v) != at::MemOverlap::Yes, "rotary: an input rotated in place overlaps itself");
      outs.push_back(v);
    } else {
      outs.push_back(at::empty_like(v));
    }
  }
  const std::vector<at::Tensor> cs(call.views.size(), call.cos), ss(call.views.size(), call.sin);
  rope_cpu(call.views, outs, cs, ss, call.ids, call.batch_rows, interleaved, false,
           call.ids.has_value() ? frequencies : std::optional<at::Tensor>());
  if (inplace) {
    for (const auto& x : xs) x.unsafeGetTensorImpl()->bump_version();  // (rotary.kernels.ops.mark_written)
    return xs;
  }
  for (auto& o : outs) o = unview(o, layout);
  return outs;
}

// A recorded rope_layout plan with what does not change between its calls bound (rotary.plans): one call from
// Python, three arguments, for a decoding step. with_offset: a RoPE's plan, its cached table (cos, sin) bound, the
// call's rows from an offset or position ids (with position ids, an offset is no call of the plan's: {}).
// with_tables: rotary.rotate's plan, the call's own tables.
struct RopePlan {
  Signature signature;
  at::Tensor cos, sin;
  std::optional<at::Tensor> frequencies;
  int64_t layout;
  bool interleaved, inplace;

  std::vector<at::Tensor> with_offset(const std::vector<at::Tensor>& xs, int64_t offset,
                                      const std::optional<at::Tensor>& positions) const {
    if (positions.has_value() && positions->defined() && offset != 0) return {};
    return rope_layout_cpu(signature, xs, cos, sin, offset, positions, layout, interleaved, inplace, frequencies);
  }

  std::vector<at::Tensor> with_tables(const std::vector<at::Tensor>& xs, const at::Tensor& call_cos,
                                      const at::Tensor& call_sin, const std::optional<at::Tensor>& rows,
                                      const std::optional<at::Tensor>& call_frequencies) const {
    return rope_layout_cpu(signature, xs, call_cos, call_sin, 0, rows, layout, interleaved, inplace, call_frequencies);
  }
};

// The signature of a rmsnorm_rotate call (rotary.qk_norm): the rotation's (never in place), then the norm weights'.
template <class Sink>
void norm_fields(Sink& out, const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& weights,
                 const at::Tensor& cos, const at::Tensor& sin, const std::optional<at::Tensor>& positions) {
  signature_fields(out, xs, cos, sin, positions, false);
  out(static_cast<int64_t>(weights.size()));
  for (const auto& w : weights) add_tensor(out, w);
}

Signature norm_signature_of(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& weights,
                            const at::Tensor& cos, const at::Tensor& sin, const std::optional<at::Tensor>& positions) {
  Signature sig;
  sig.fields.reserve(80);
  Record record{sig.fields};
  norm_fields(record, xs, weights, cos, sin, positions);
  return sig;
}

// A 16-bit model's own per-token tables [1 or B, S, r] (hf.patch's, of a bf16/fp16 model) as a direct call's fp32
// rows, widened into `wide` (cos [n, r], then sin [n, r]; it must outlive the call) as layout_call's .to(fp32)
// widens them. nullopt for tables of another form, or with torch's negative bit (stored negated).
std::optional<DirectTable> widened_table(const at::Tensor& cos, const at::Tensor& sin, const Dims& d0,
                                         std::vector<float>& wide) {
  if (cos.dim() != 3 || !cos.is_cpu() || !sin.is_cpu() || cos.is_neg() || sin.is_neg() ||
      sin.scalar_type() != cos.scalar_type() || sin.sizes() != cos.sizes() || cos.size(1) != d0.S ||
      (cos.size(0) != 1 && cos.size(0) != d0.B))
    return std::nullopt;
  const int64_t r = cos.size(2), n = cos.size(0) * d0.S;
  if (r <= 0 || r % 2 != 0 || r > d0.D) return std::nullopt;
  wide.resize(2 * n * r);
  AT_DISPATCH_REDUCED_FLOATING_TYPES(cos.scalar_type(), "rmsnorm_tables", [&] {
    const scalar_t* c = cos.data_ptr<scalar_t>();
    const scalar_t* s = sin.data_ptr<scalar_t>();
    for (int64_t b = 0; b < cos.size(0); ++b)
      for (int64_t t = 0; t < d0.S; ++t)
        for (int64_t j = 0; j < r; ++j) {
          const int64_t row = (b * d0.S + t) * r + j;
          wide[row] = static_cast<float>(c[b * cos.stride(0) + t * cos.stride(1) + j * cos.stride(2)]);
          wide[n * r + row] = static_cast<float>(s[b * sin.stride(0) + t * sin.stride(1) + j * sin.stride(2)]);
        }
  });
  DirectTable table{Rows{nullptr, 0, 0, cos.size(0) > 1 ? d0.S : 0, n, nullptr}};
  table.c = reinterpret_cast<const char*>(wide.data());
  table.s = reinterpret_cast<const char*>(wide.data() + n * r);
  table.row_stride = r;
  return table;
}

// The norm weights as a direct call's kernel reads them, D values of A each: a weight that is contiguous [D] of A
// in place, another widened (and 1 + w for Gemma's convention) into `widened`, which must outlive the call.
template <typename A>
std::vector<Norm> direct_norms(const std::vector<at::Tensor>& weights, bool gemma, int64_t D, std::vector<A>& widened) {
  constexpr auto acc = std::is_same_v<A, double> ? at::kDouble : at::kFloat;
  widened.resize(weights.size() * D);  // (sized before any pointer into it is taken)
  std::vector<Norm> norms;
  norms.reserve(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i];
    if (!gemma && w.scalar_type() == acc && w.stride(0) == 1) {
      norms.push_back(Norm{w.data_ptr(), nullptr, 0, 0, 0});
      continue;
    }
    A* buffer = widened.data() + i * D;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, w.scalar_type(), "rmsnorm_weight", [&] {
      const scalar_t* p = w.data_ptr<scalar_t>();
      for (int64_t j = 0; j < D; ++j) {
        const A v = static_cast<A>(p[j * w.stride(0)]);
        buffer[j] = gemma ? v + A(1) : v;
      }
    });
    norms.push_back(Norm{buffer, nullptr, 0, 0, 0});
  }
  return norms;
}

// rmsnorm_rope_layout's call as rope_direct makes rope_layout's: views, table window and outputs as strides and
// pointers, each weight read in place when it is contiguous [D] of the arithmetic dtype A (else widened here, and
// 1 + weight for Gemma's convention, into D values of A), a 16-bit model's per-token tables widened to fp32 rows
// here (as layout_call's .to(fp32)), no rstd written (a plan runs without a backward). nullopt when the call is
// not one this handles (other tables of another dtype than A, tables of A that direct_table does not take, inputs
// direct_inputs does not take, a weight or 16-bit table with torch's negative bit): the caller takes layout_call.
std::optional<std::vector<at::Tensor>> rmsnorm_direct(const std::vector<at::Tensor>& xs,
                                                      const std::vector<at::Tensor>& weights, const at::Tensor& cos,
                                                      const at::Tensor& sin, int64_t row_offset,
                                                      const std::optional<at::Tensor>& positions, int64_t layout,
                                                      bool interleaved, bool gemma, double eps,
                                                      const std::optional<at::Tensor>& frequencies) {
  if (!direct_inputs(xs, layout, false)) return std::nullopt;
  const auto type = xs[0].scalar_type();
  const auto acc = type == at::kDouble ? at::kDouble : at::kFloat;
  const Dims d0 = kernel_dims(xs[0], layout);
  // a weight with torch's negative bit (z.conj().imag) stores its values negated, and this reads the storage: it
  // takes the layout_call path, which copies it to D values as the general path does
  for (const auto& w : weights)
    if (w.dim() != 1 || w.size(0) != d0.D || !w.is_cpu() || !at::isFloatingType(w.scalar_type()) || w.is_neg())
      return std::nullopt;
  std::optional<DirectTable> table;
  std::vector<float> wide;  // a 16-bit model's own per-token rows, widened
  const bool half_tables = cos.scalar_type() == at::kBFloat16 || cos.scalar_type() == at::kHalf;
  if (acc == at::kFloat && half_tables) {
    if (positions.has_value() && positions->defined()) return std::nullopt;
    table = widened_table(cos, sin, d0, wide);
  } else {
    if (cos.scalar_type() != acc || cos.stride(-1) != 1 || sin.scalar_type() != acc || sin.sizes() != cos.sizes() ||
        sin.strides() != cos.strides())
      return std::nullopt;
    table = direct_table(cos, sin, d0, type, row_offset, positions, layout, frequencies);
  }
  if (!table) return std::nullopt;
  if (table->outside) return std::vector<at::Tensor>{};
  const int64_t D = d0.D;
  std::vector<double> widened64;
  std::vector<float> widened32;
  const std::vector<Norm> norms = acc == at::kDouble ? direct_norms(weights, gemma, D, widened64)
                                                     : direct_norms(weights, gemma, D, widened32);
  std::vector<View> views;
  views.reserve(xs.size());
  std::vector<at::Tensor> outs(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    TORCH_CHECK(xs[i].scalar_type() == type, "rotary: inputs disagree on dtype");
    views.push_back(direct_view(xs[i], d0, *table, layout, false, outs[i]));
  }
  norm_dispatch(views, norms, type, d0.B, d0.S, D, cos.size(-1), table->rows, interleaved, !gemma, eps);
  return outs;
}

// A recorded rmsnorm_rotate plan's call (rotary.qk_norm): as rope_layout, out of place, each x normalised with
// weights[i] (as given: widened to the arithmetic dtype here, and 1 + weight for Gemma's convention, as
// kernels.norm.effective_weight forms it) before its rotation; tables of another dtype than the arithmetic one
// (a 16-bit model's own) widened here, as kernels.norm.run widens them. {} when the signature is not the plan's.
std::vector<at::Tensor> rmsnorm_rope_layout_cpu(const Signature& expected, const std::vector<at::Tensor>& xs,
                                                const std::vector<at::Tensor>& weights, const at::Tensor& cos,
                                                const at::Tensor& sin, int64_t row_offset,
                                                const std::optional<at::Tensor>& positions, int64_t layout,
                                                bool interleaved, bool gemma, double eps,
                                                const std::optional<at::Tensor>& frequencies) {
  Match match{expected.fields};
  norm_fields(match, xs, weights, cos, sin, positions);
  if (!match.done()) return {};
  TORCH_CHECK(weights.size() == xs.size(), "rotary: need one norm weight per input");
  auto direct = rmsnorm_direct(xs, weights, cos, sin, row_offset, positions, layout, interleaved, gemma, eps,
                               frequencies);
  if (direct) return std::move(*direct);
  auto window = layout_call(xs, cos, sin, row_offset, positions, layout);
  if (!window) return {};
  LayoutCall& call = *window;
  const auto acc = xs[0].scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (call.cos.scalar_type() != acc) {
    call.cos = call.cos.to(acc);
    call.sin = call.sin.to(acc);
  }
  if (call.cos.stride(-1) != 1 || call.sin.strides() != call.cos.strides()) {
    call.cos = call.cos.contiguous();
    call.sin = call.sin.contiguous();
  }
  std::vector<at::Tensor> outs, rstds, ws;
  outs.reserve(xs.size());
  rstds.reserve(xs.size());
  ws.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const at::Tensor& v = call.views[i];
    outs.push_back(at::empty_like(v));
    rstds.push_back(v.new_empty({v.size(0), v.size(1), v.size(2)}, v.options().dtype(acc)));
    at::Tensor w = weights[i].to(acc);
    if (gemma) w = w.add(1.0);
    ws.push_back(w.contiguous());
  }
  const std::vector<at::Tensor> cs(xs.size(), call.cos), ss(xs.size(), call.sin);
  rmsnorm_rope_cpu(call.views, outs, rstds, ws, cs, ss, call.ids, call.batch_rows, interleaved, !gemma, eps,
                   call.ids.has_value() ? frequencies : std::optional<at::Tensor>());
  for (auto& o : outs) o = unview(o, layout);
  return outs;
}

// in rotary_cache.cpp
std::tuple<std::vector<int64_t>, std::vector<at::Tensor>> rope_cache_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& slots, const at::Tensor& cos, const std::optional<at::Tensor>& sin,
    const std::optional<at::Tensor>& rows, bool interleaved, bool inplace, bool memory_checked, int64_t layout,
    bool cache_bhsd);

// The signature of a rotate_and_cache call (rotary.serving): xs are q, k, v, the caches and the slots; sin is
// absent for vLLM's cos_sin_cache, rows are its positions (or the tables' rows).
Signature cache_signature_of(const std::vector<at::Tensor>& xs, const at::Tensor& cos, const std::optional<at::Tensor>& sin,
                             const std::optional<at::Tensor>& rows, bool inplace) {
  return signature_of(xs, cos, sin.has_value() ? *sin : at::Tensor(), rows, inplace);
}

// A recorded rotate_and_cache plan's call: rope_cache (which checks the values, slots and positions, and the
// memory, itself, and returns its status) when the call's signature is the plan's; status {-1} (nothing done, the
// general path runs) when it is not. xs: q, k, v, k_cache, v_cache, slots, as the caller holds them.
std::tuple<std::vector<int64_t>, std::vector<at::Tensor>> rope_cache_plan_cpu(
    const Signature& expected, const std::vector<at::Tensor>& xs, const at::Tensor& cos,
    const std::optional<at::Tensor>& sin, const std::optional<at::Tensor>& rows, bool interleaved, bool inplace,
    int64_t layout, bool cache_bhsd) {
  if (xs.size() != 6 || !matches(expected, xs, cos, sin.has_value() ? *sin : at::Tensor(), rows, inplace)) return {{-1}, {}};
  return rope_cache_cpu(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], cos, sin, rows, interleaved, inplace, false, layout,
                        cache_bhsd);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Signature>(m, "Signature", py::module_local());  // local: another build of rotary may share the process
  m.def("signature", &signature_of, "a call's signature, for a plan to record (rotary.plans)");
  py::class_<RopePlan>(m, "RopePlan", py::module_local())
      .def(py::init([](const Signature& signature, const std::optional<at::Tensor>& cos,
                       const std::optional<at::Tensor>& sin, const std::optional<at::Tensor>& frequencies,
                       int64_t layout, bool interleaved, bool inplace) {
             return RopePlan{signature, cos.value_or(at::Tensor()), sin.value_or(at::Tensor()), frequencies,
                             layout, interleaved, inplace};
           }))
      .def("with_offset", &RopePlan::with_offset, "a RoPE plan's call: rows offset .. of its table, or position ids")
      .def("with_tables", &RopePlan::with_tables, "a rotate plan's call with the call's own tables");
  m.def("norm_signature", &norm_signature_of, "a rmsnorm_rotate call's signature, for a plan to record");
  m.def("rmsnorm_rope_layout", &rmsnorm_rope_layout_cpu,
        "a recorded rmsnorm_rotate plan's call: the norm and the rotation, views, tables and outputs made here");
  m.def("rope_layout", &rope_layout_cpu,
        "a recorded plan's call: tensors in the caller's layout rotated by one table, views and outputs made here");
  m.def("rope", &rope_cpu, "fused rotary embedding over a list of [B, S, H, D] views, one table per view");
  m.def("rope_table_grad", &rope_table_grad_cpu, "per-token gradients of the cos/sin tables");
  m.def("rmsnorm_rope", &rmsnorm_rope_cpu, "per-head RMSNorm of each [B, S, H, D] view, then its rotation");
  m.def("cache_signature", &cache_signature_of, "a rotate_and_cache call's signature, for a plan to record");
  m.def("rope_cache_plan", &rope_cache_plan_cpu, "a recorded rotate_and_cache plan's call: rope_cache if the signature is the plan's");
  m.def("rope_cache", &rope_cache_cpu,
        "rotate_and_cache: q and k rotated, the rotated k and v written into the KV cache, in one pass");
}
