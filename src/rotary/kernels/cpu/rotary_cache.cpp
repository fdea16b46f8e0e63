// The CPU kernel of rotary.rotate_and_cache (the rope_cache entry bound in rotary.cpp): compiled on its own so the
// two halves of the extension build in parallel. The kernels it shares with the rotation are in rotary.h.

#include "rotary.h"

namespace {

// ---- The rotation and the KV-cache write in one pass (rotary.rotate_and_cache) ---------------------------
//
// Token (b, s): q's heads rotated into out_q; k's heads rotated into out_k and into the k-cache row
// k_cache[b or 0, slots[b, s]] (see kRotateTwice); v's heads copied into the v-cache row. The rotation is
// rope_cpu's (rotate_vector, in the same loop orders), so out_q, out_k and the cache rows are the composition's
// (rotate, then an indexed write per cache) bit for bit. Everything that can fail is checked before anything is
// written (check_cache_call): a call that fails writes nothing.

struct Strided {  // a [B, S, H, *] view, or a cache [Bc, T, H, *], with strides in elements (unit last stride)
  char* data;
  int64_t s0, s1, s2;
};

struct CacheCall {
  int64_t B, S, D, Dv, r, Hq, Hk, T;  // T: the cache's rows
  Strided q, k, v, out_q, out_k, k_cache, v_cache;
  bool shared_cache;  // Bc == 1: every sequence writes cache batch row 0
  size_t v_item;      // bytes of one element of v (its own dtype)
  const int64_t* slots;
  int64_t slot_b, slot_s;
  // the table row of token (b, s): rows[b * rows_b + s * rows_s] * table_r (rows_b, rows_s 0 where broadcast),
  // or without rows b * table_b + s * table_s (the tokens' own rows [S, r] or [B or 1, S, r]); in elements
  const int64_t* rows;
  int64_t rows_b, rows_s, table_r, table_b, table_s, table_rows;
  const void* cos;  // with from_cache, vLLM's cos_sin_cache [P, r]: cos of the r/2 pairs, then their sin
  const void* sin;
  bool from_cache;

  inline int64_t row(int64_t b, int64_t s) const { return rows[b * rows_b + s * rows_s]; }
  inline int64_t offset(int64_t b, int64_t s) const { return rows ? row(b, s) * table_r : b * table_b + s * table_s; }
  inline int64_t slot(int64_t b, int64_t s) const { return slots[b * slot_b + s * slot_s]; }
};

// Whether n fp32 values are all finite: no exponent of all ones, which plus one carries into the sign bit.
// Integer additions and ors only, so the loop vectorises; not inlined, where GCC 12 left it scalar (3 µs for 64
// rows of 128 values, 0.25 µs vectorised).
__attribute__((noinline)) bool all_finite(const float* p, int64_t n) {
  uint32_t carried = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, p + i, sizeof(u));
    carried |= (u & 0x7F800000u) + 0x00800000u;
  }
  return !(carried & 0x80000000u);
}

// The smallest slot given to two tokens of sequences [b0, b1) (written into one cache batch row), or -1. Slots
// that increase along the tokens (a sequence's next rows, the usual case) are told apart in one pass; others sorted.
inline int64_t repeated_slot(const CacheCall& c, int64_t b0, int64_t b1) {
  int64_t previous = -1;
  bool increasing = true;
  for (int64_t b = b0; b < b1 && increasing; ++b)
    for (int64_t s = 0; s < c.S && increasing; ++s) {
      increasing = c.slot(b, s) > previous;
      previous = c.slot(b, s);
    }
  if (increasing) return -1;
  std::vector<int64_t> sorted;
  sorted.reserve((b1 - b0) * c.S);
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t s = 0; s < c.S; ++s) sorted.push_back(c.slot(b, s));
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i] == sorted[i - 1]) return sorted[i];
  return -1;
}

// The checks of the values, in the order rotary.rotate_and_cache makes them: {} when all pass, else the status
// rope_cache_cpu returns.
std::vector<int64_t> check_cache_call(const CacheCall& c) {
  if (!c.B || !c.S) return {};
  if (c.rows) {
    int64_t low = c.row(0, 0), high = low;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t s = 0; s < c.S; ++s) {
        low = std::min(low, c.row(b, s));
        high = std::max(high, c.row(b, s));
      }
    if (low < 0 || high >= c.table_rows) {
      if (c.from_cache) return {1, low, high};
      return {0};  // tables whose rows were not checked where they were made: the general path names them
    }
  }
  if (c.from_cache) {  // NaN or inf in a row a token reads, named by the first token reading one
    const float* table = static_cast<const float*>(c.cos);
    int64_t checked = -1;  // the row just checked: a batch at one position reads it once
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t s = 0; s < c.S; ++s) {
        const int64_t t = c.row(b, s);
        if (t == checked) continue;
        if (!all_finite(table + t * c.table_r, c.r)) return {2, b * c.S + s, t};
        checked = t;
      }
  }
  int64_t low = c.slot(0, 0), high = low;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t s = 0; s < c.S; ++s) {
      low = std::min(low, c.slot(b, s));
      high = std::max(high, c.slot(b, s));
    }
  if (low < 0 || high >= c.T) return {3, low, high};
  if (c.shared_cache) {
    const int64_t slot = repeated_slot(c, 0, c.B);
    if (slot >= 0) return {4, 0, slot};
  } else if (c.S > 1) {  // one token per sequence (decoding) writes one row of each sequence's own cache
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t slot = repeated_slot(c, b, b + 1);
      if (slot >= 0) return {4, b, slot};
    }
  }
  return {};
}

template <typename T, typename TT, int64_t kHalf>
void cache_run(const CacheCall& c, bool inplace, bool interleaved) {
  using A = typename Acc<T>::type;
  const int64_t h = kHalf ? kHalf : c.r / 2, r = c.r, D = c.D, S = c.S;
  const int64_t blocks_per_batch = (S + kBlock - 1) / kBlock;
  const int64_t per_token = (c.Hq + 2 * c.Hk) * D + c.Hk * c.Dv;
  // ~64k elements per task, as run_fixed
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, per_token * std::min(S, kBlock)));
  const bool expand = c.from_cache && interleaved;  // cos_sin_cache rows laid out per channel, per token
  auto loops = [&](auto inplace_c, auto interleaved_c) {
    constexpr bool kInplace = decltype(inplace_c)::value, kInterleaved = decltype(interleaved_c)::value;
    // A rotated key head goes into its cache row too: out of place in fp32 and fp64 rotated a second time (5-10%
    // faster than copying it back, at 64x1 and 4x256 on one thread); otherwise copied (in place rotating twice was
    // 15-25% slower, and 16-bit dtypes convert twice, no faster than the copy).
    constexpr bool kRotateTwice = !kInplace && sizeof(T) >= 4;
    at::parallel_for(0, c.B * blocks_per_batch, grain, [&](int64_t begin, int64_t end) {
      const TT* cos[kBlock];
      const TT* sin[kBlock];
      int64_t slot[kBlock];
      std::vector<TT> expanded(expand ? 2 * kBlock * r : 0);
      for (int64_t block = begin; block < end; ++block) {
        const int64_t b = block / blocks_per_batch, s0 = (block % blocks_per_batch) * kBlock;
        const int64_t n = std::min(kBlock, S - s0), cb = c.shared_cache ? 0 : b;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t t = c.offset(b, s0 + j);
          slot[j] = c.slot(b, s0 + j);
          const TT* row = static_cast<const TT*>(c.cos) + t;
          if (!c.from_cache) {
            cos[j] = row;
            sin[j] = static_cast<const TT*>(c.sin) + t;
          } else if (!expand) {  // the half pairing reads the first r/2 channels of a table row: these
            cos[j] = row;
            sin[j] = row + h;
          } else {  // the interleaved pairing's table row (expand_pairs): [t0, t0, t1, t1, ...]
            TT* ec = expanded.data() + j * 2 * r;
            TT* es = ec + r;
            for (int64_t i = 0; i < h; ++i) {
              ec[2 * i] = ec[2 * i + 1] = row[i];
              es[2 * i] = es[2 * i + 1] = row[h + i];
            }
            cos[j] = ec;
            sin[j] = es;
          }
        }
        // as run_fixed: heads outer for [B, H, S, D] storage (the half pairing), tokens outer otherwise
        auto rotate = [&](const Strided& x, const Strided& o, int64_t heads, const Strided* cache) {
          T* xb = reinterpret_cast<T*>(x.data) + b * x.s0 + s0 * x.s1;
          T* ob = reinterpret_cast<T*>(o.data) + b * o.s0 + s0 * o.s1;
          auto one = [&](int64_t head, int64_t j) {
            T* in = xb + head * x.s2 + j * x.s1;
            T* out = ob + head * o.s2 + j * o.s1;
            if (cache) {
              T* row = reinterpret_cast<T*>(cache->data) + cb * cache->s0 + slot[j] * cache->s1 + head * cache->s2;
              if constexpr (kRotateTwice) {
                rotate_vector<false, kInterleaved, T, A, TT>(in, row, cos[j], sin[j], A(1), h, r, D);
              } else {  // the rotated head, still in L1, copied
                rotate_vector<kInplace, kInterleaved, T, A, TT>(in, out, cos[j], sin[j], A(1), h, r, D);
                std::memcpy(row, out, D * sizeof(T));
                return;
              }
            }
            rotate_vector<kInplace, kInterleaved, T, A, TT>(in, out, cos[j], sin[j], A(1), h, r, D);
          };
          if (!kInterleaved && std::abs(x.s2) >= std::abs(x.s1)) {
            for (int64_t head = 0; head < heads; ++head)
              for (int64_t j = 0; j < n; ++j) one(head, j);
          } else {
            for (int64_t j = 0; j < n; ++j)
              for (int64_t head = 0; head < heads; ++head) one(head, j);
          }
        };
        rotate(c.q, c.out_q, c.Hq, nullptr);
        rotate(c.k, c.out_k, c.Hk, &c.k_cache);
        auto value = [&](int64_t head, int64_t j) {
          const Strided &v = c.v, &vc = c.v_cache;
          std::memcpy(vc.data + (cb * vc.s0 + slot[j] * vc.s1 + head * vc.s2) * c.v_item,
                      v.data + (b * v.s0 + (s0 + j) * v.s1 + head * v.s2) * c.v_item, c.Dv * c.v_item);
        };
        if (std::abs(c.v.s2) >= std::abs(c.v.s1)) {
          for (int64_t head = 0; head < c.Hk; ++head)
            for (int64_t j = 0; j < n; ++j) value(head, j);
        } else {
          for (int64_t j = 0; j < n; ++j)
            for (int64_t head = 0; head < c.Hk; ++head) value(head, j);
        }
      }
    });
  };
  using Yes = std::true_type;
  using No = std::false_type;
  if (inplace) interleaved ? loops(Yes{}, Yes{}) : loops(Yes{}, No{});
  else interleaved ? loops(No{}, Yes{}) : loops(No{}, No{});
}

template <typename T, typename TT>
void cache_dispatch(const CacheCall& c, bool inplace, bool interleaved) {
  switch (c.r / 2) {  // as run: a pair count known at compile time unrolls a head's loop
    case 32: return cache_run<T, TT, 32>(c, inplace, interleaved);
    case 64: return cache_run<T, TT, 64>(c, inplace, interleaved);
    default: return cache_run<T, TT, 0>(c, inplace, interleaved);
  }
}

// Whether two tensors' memory (from their lowest to their highest element's bytes) is disjoint: then they share
// no element. Views that interleave (q and k sliced from one qkv buffer) are not told apart here.
inline bool disjoint(const at::Tensor& a, const at::Tensor& b) {
  if (!a.numel() || !b.numel()) return true;
  auto extent = [](const at::Tensor& t) {
    int64_t low = 0, high = 0;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t span = (t.size(d) - 1) * t.stride(d);
      (span < 0 ? low : high) += span;
    }
    const intptr_t base = reinterpret_cast<intptr_t>(t.data_ptr()), item = t.element_size();
    return std::pair<intptr_t, intptr_t>{base + low * item, base + (high + 1) * item};
  };
  const auto [a0, a1] = extent(a);
  const auto [b0, b1] = extent(b);
  return a1 <= b0 || b1 <= a0;
}

// Whether a tensor is one the kernel reads or writes as plain memory: a dense CPU tensor with storage.
inline bool plain(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.device().is_cpu() && t.layout() == at::kStrided && !t.is_neg() &&
         !t.is_conj();
}

}  // namespace

// rotary.rotate_and_cache on the CPU (see cache_run), on the kernel's views. q, k, v: [B, S, H, D] views (v: Hk heads of its own Dv and
// dtype); k_cache, v_cache: [Bc, T, Hk, D] and [Bc, T, Hk, Dv], Bc = B or 1; slots: int64 [B, S], any strides (an
// expanded [S] included). The tables: rotary tables cos/sin (fp32, or fp64 for fp64 inputs), [N, r] with rows (int64
// [S] or [1 or B, S]: token (b, s) reads row rows[b, s]) or, without rows, the tokens' own [S, r] or [1 or B, S, r];
// or, with sin undefined, vLLM's cos_sin_cache [P, r] in fp32 (row p: cos of the r/2 pairs, then their sin) with
// rows, the tokens' positions. Every check of the general path (rotate, then an indexed write per cache) is made
// here first, and the status returned with the outputs says how the call went:
//   {}: done; the outputs {q_rot, k_rot}: new tensors, or q and k themselves (inplace);
//   {0}: nothing done: a shape, dtype, stride or autograd check failed, or the kernel does not take these tensors
//        (torch.func's, tables it cannot address ...): the caller's general path runs, with its messages;
//   {1, lo, hi}: positions outside cos_sin_cache (the smallest and the largest); {2, token, row}: NaN or inf in
//        cos_sin_cache row `row`, first read by token b * S + s; {3, lo, hi}: slots outside the cache; {4, b, s}:
//        cache row (batch b, slot s) given to two tokens. Nothing written: the caller raises;
//   {5}: nothing written: memory that may be shared (the caches with themselves, each other, q, k or v; in place,
//        q, k and v with each other): the caller checks which elements are, and calls again with memory_checked.
std::tuple<std::vector<int64_t>, std::vector<at::Tensor>> rope_cache_views(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& slots, const at::Tensor& cos, const std::optional<at::Tensor>& sin,
    const std::optional<at::Tensor>& rows, bool interleaved, bool inplace, bool memory_checked) {
  const std::tuple<std::vector<int64_t>, std::vector<at::Tensor>> general{{0}, {}};
  const bool from_cache = !(sin.has_value() && sin->defined());
  const bool has_rows = rows.has_value() && rows->defined();
  for (const at::Tensor* t : {&q, &k, &v, &k_cache, &v_cache, &slots, &cos})
    if (!plain(*t)) return general;
  if ((!from_cache && !plain(*sin)) || (has_rows && !plain(*rows))) return general;
  for (const at::Tensor* t : {&q, &k, &v, &k_cache, &v_cache})
    if (t->dim() != 4 || t->stride(3) != 1) return general;
  if (at::GradMode::is_enabled()) {
    for (const at::Tensor* t : {&q, &k, &v, &k_cache, &v_cache, &cos})
      if (t->requires_grad()) return general;
    if (!from_cache && sin->requires_grad()) return general;
  }
  // q and k (rotate's checks), v and the caches (rotate_and_cache's)
  const auto dtype = q.scalar_type();
  if (!(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kDouble) ||
      k.scalar_type() != dtype || !at::isFloatingType(v.scalar_type()) || k_cache.scalar_type() != dtype ||
      v_cache.scalar_type() != v.scalar_type())
    return general;
  const int64_t B = q.size(0), S = q.size(1), D = q.size(3), Hk = k.size(2), Dv = v.size(3);
  const int64_t Bc = k_cache.size(0), T = k_cache.size(1);
  if (k.size(0) != B || k.size(1) != S || k.size(3) != D || v.size(0) != B || v.size(1) != S || v.size(2) != Hk)
    return general;
  if (!(Bc == 1 || Bc == B) || v_cache.size(0) != Bc || v_cache.size(1) != T || k_cache.size(2) != Hk ||
      v_cache.size(2) != Hk || k_cache.size(3) != D || v_cache.size(3) != Dv)
    return general;
  if (slots.scalar_type() != at::kLong || slots.dim() != 2 || slots.size(0) != B || slots.size(1) != S) return general;
  // the tables
  const auto table_type = cos.scalar_type();
  const int64_t r = cos.dim() ? cos.size(-1) : 0;
  if (r <= 0 || r % 2 || r > D || cos.stride(-1) != 1) return general;
  if (from_cache) {
    if (table_type != at::kFloat || cos.dim() != 2 || !has_rows) return general;
  } else if (!(table_type == at::kFloat || (table_type == at::kDouble && dtype == at::kDouble)) ||
             sin->scalar_type() != table_type || sin->sizes() != cos.sizes() || sin->strides() != cos.strides()) {
    return general;
  }
  int64_t rows_b = 0, rows_s = 0, table_b = 0, table_s = 0;
  if (has_rows) {
    const at::Tensor& p = *rows;
    if (cos.dim() != 2 || p.scalar_type() != at::kLong || p.dim() < 1 || p.dim() > 2 || p.size(-1) != S ||
        (p.dim() == 2 && p.size(0) != 1 && p.size(0) != B))
      return general;
    rows_s = p.stride(-1);
    rows_b = p.dim() == 2 && p.size(0) > 1 ? p.stride(0) : 0;
  } else if (cos.dim() == 2) {  // [S, r]: shared by the batch
    if (cos.size(0) != S) return general;
    table_s = cos.stride(0);
  } else if (cos.dim() == 3) {  // [1 or B, S, r]: per token
    if (cos.size(1) != S || (cos.size(0) != 1 && cos.size(0) != B)) return general;
    table_b = cos.size(0) > 1 ? cos.stride(0) : 0;
    table_s = cos.stride(1);
  } else {
    return general;
  }
  auto view = [](const at::Tensor& t) {
    return Strided{static_cast<char*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2)};
  };
  CacheCall call{B, S, D, Dv, r, q.size(2), Hk, T, view(q), view(k), view(v), view(q), view(k), view(k_cache),
                 view(v_cache), Bc == 1, static_cast<size_t>(v.element_size()), slots.data_ptr<int64_t>(),
                 slots.stride(0), slots.stride(1), has_rows ? rows->data_ptr<int64_t>() : nullptr, rows_b, rows_s,
                 cos.stride(0), table_b, table_s, cos.size(0), cos.data_ptr(), from_cache ? nullptr : sin->data_ptr(),
                 from_cache};
  std::vector<int64_t> status = check_cache_call(call);
  if (!status.empty()) return {status, {}};
  if (!memory_checked) {
    bool clear = at::has_internal_overlap(k_cache) == at::MemOverlap::No &&
                 at::has_internal_overlap(v_cache) == at::MemOverlap::No && disjoint(k_cache, v_cache);
    for (const at::Tensor* t : {&q, &k, &v}) clear = clear && disjoint(*t, k_cache) && disjoint(*t, v_cache);
    if (inplace)  // v is read after its token's k is rotated: v must not be q or k (the general path rotates first)
      clear = clear && at::has_internal_overlap(q) == at::MemOverlap::No &&
              at::has_internal_overlap(k) == at::MemOverlap::No && disjoint(q, k) && disjoint(v, q) && disjoint(v, k);
    if (!clear) return {{5}, {}};
  }
  at::Tensor out_q = q, out_k = k;
  if (!inplace) {
    out_q = at::empty_like(q);
    out_k = at::empty_like(k);
    call.out_q = view(out_q);
    call.out_k = view(out_k);
  }
  if (table_type == at::kDouble) {
    cache_dispatch<double, double>(call, inplace, interleaved);
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "rope_cache_cpu",
                                    [&] { cache_dispatch<scalar_t, float>(call, inplace, interleaved); });
  }
  return {{}, {out_q, out_k}};
}

// rope_cache_views with the tensors as the caller holds them: q, k, v [B, S, H, D] (layout 0), [B, H, S, D] (1) or
// packed [T, H, D] (2, with slots [T] or [1, T]); the caches [Bc, T, Hk, D], or [Bc, Hk, T, D] with cache_bhsd. They
// are viewed here as [B, S, H, D] and [Bc, T, Hk, D], and the results back in q's and k's layout: a view costs a
// tenth of what it costs from Python, and at decoding shapes the views were half the call's host time.
std::tuple<std::vector<int64_t>, std::vector<at::Tensor>> rope_cache_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& slots, const at::Tensor& cos, const std::optional<at::Tensor>& sin,
    const std::optional<at::Tensor>& rows, bool interleaved, bool inplace, bool memory_checked, int64_t layout,
    bool cache_bhsd) {
  const int64_t rank = layout == 2 ? 3 : 4;
  if (layout < 0 || layout > 2 || q.dim() != rank || k.dim() != rank || v.dim() != rank || k_cache.dim() != 4 ||
      v_cache.dim() != 4)
    return {{0}, {}};
  auto as_bshd = [layout](const at::Tensor& t) {
    return layout == 2 ? t.unsqueeze(0) : layout == 1 ? t.transpose(1, 2) : t;
  };
  auto as_cache = [cache_bhsd](const at::Tensor& t) { return cache_bhsd ? t.transpose(1, 2) : t; };
  auto [status, outs] =
      rope_cache_views(as_bshd(q), as_bshd(k), as_bshd(v), as_cache(k_cache), as_cache(v_cache),
                       layout == 2 && slots.dim() == 1 ? slots.unsqueeze(0) : slots, cos, sin, rows, interleaved,
                       inplace, memory_checked);
  if (!status.empty()) return {status, {}};
  if (inplace) return {std::vector<int64_t>{}, std::vector<at::Tensor>{q, k}};
  for (auto& out : outs) out = layout == 2 ? out.squeeze(0) : layout == 1 ? out.transpose(1, 2) : out;
  return {std::vector<int64_t>{}, outs};
}
