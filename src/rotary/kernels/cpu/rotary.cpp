// Fused rotary position embedding for CPU tensors: one pass over q and k, in place or out of place.
//
// Every tensor arrives as a [B, S, H, D] view with arbitrary strides except a unit stride over D
// (so q/k views into a fused qkv projection need no copy). The rotation of pair (a, b) by theta is
// (a cos - b sin, b cos + a sin); the backward pass is the same kernel with sin negated (conjugate).
// Arithmetic is fp32 (fp64 for fp64 inputs) whatever the storage dtype; results are rounded once.
//
// Loops over one head's channels are written with __restrict pointers and no branches so the
// compiler vectorises them (-O3 and the build machine's instruction set); rows (b, s) are spread
// over threads with at::parallel_for.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

// Half pairing, (i, i + h): x0 = first half, x1 = second half. In place.
template <typename T, typename A>
inline void rotate_half_inplace(T* __restrict x0, T* __restrict x1, const float* __restrict c,
                                const float* __restrict s, A sign, int64_t h) {
  for (int64_t i = 0; i < h; ++i) {
    const A a = static_cast<A>(x0[i]), b = static_cast<A>(x1[i]);
    const A ci = static_cast<A>(c[i]), si = sign * static_cast<A>(s[i]);
    x0[i] = static_cast<T>(a * ci - b * si);
    x1[i] = static_cast<T>(b * ci + a * si);
  }
}

template <typename T, typename A>
inline void rotate_half_out(const T* __restrict x0, const T* __restrict x1, T* __restrict o0, T* __restrict o1,
                            const float* __restrict c, const float* __restrict s, A sign, int64_t h) {
  for (int64_t i = 0; i < h; ++i) {
    const A a = static_cast<A>(x0[i]), b = static_cast<A>(x1[i]);
    const A ci = static_cast<A>(c[i]), si = sign * static_cast<A>(s[i]);
    o0[i] = static_cast<T>(a * ci - b * si);
    o1[i] = static_cast<T>(b * ci + a * si);
  }
}

// Interleaved pairing, (2i, 2i + 1). Tables are laid out per channel, c[2i] == c[2i + 1].
// The pairs are first split into L1 buffers and rotated with the half pairing's loop: written
// directly, GCC 12 recognises the complex multiply and emits fmaddsub even under
// -ffp-contract=off, which made this pairing differ from the pure-torch path by one rounding.
// x and o may be the same memory (in place): each chunk is read completely before it is written.
template <typename T, typename A>
inline void rotate_interleaved_out(const T* x, T* o, const float* __restrict c, const float* __restrict s, A sign,
                                   int64_t h) {
  constexpr int64_t kChunk = 64;
  A ea[kChunk], eb[kChunk], ec[kChunk], es[kChunk];
  for (int64_t p0 = 0; p0 < h; p0 += kChunk) {
    const int64_t n = std::min(kChunk, h - p0);
    const T* xc = x + 2 * p0;
    for (int64_t i = 0; i < n; ++i) {
      ea[i] = static_cast<A>(xc[2 * i]);
      eb[i] = static_cast<A>(xc[2 * i + 1]);
      ec[i] = static_cast<A>(c[2 * (p0 + i)]);
      es[i] = sign * static_cast<A>(s[2 * (p0 + i)]);
    }
    for (int64_t i = 0; i < n; ++i) {
      const A a = ea[i], b = eb[i];
      ea[i] = a * ec[i] - b * es[i];
      eb[i] = b * ec[i] + a * es[i];
    }
    T* oc = o + 2 * p0;
    for (int64_t i = 0; i < n; ++i) {
      oc[2 * i] = static_cast<T>(ea[i]);
      oc[2 * i + 1] = static_cast<T>(eb[i]);
    }
  }
}

template <typename T, typename A>
inline void rotate_interleaved_inplace(T* x, const float* __restrict c, const float* __restrict s, A sign, int64_t h) {
  rotate_interleaved_out<T, A>(x, x, c, s, sign, h);
}

struct View {  // a [B, S, H, D] view, D contiguous
  char* in;
  char* out;
  int64_t heads, sb, ss, sh, ob, os, oh;  // strides in elements
};

// One (b, s, head) vector: rotate its first r channels; out of place, copy the rest.
template <typename T, typename A>
inline void rotate_vector(T* x, T* o, bool inplace, const float* c, const float* sn, A sign, int64_t h, int64_t r,
                          int64_t D, bool interleaved) {
  if (inplace) {
    if (interleaved) rotate_interleaved_inplace<T, A>(x, c, sn, sign, h);
    else rotate_half_inplace<T, A>(x, x + h, c, sn, sign, h);
  } else {
    if (interleaved) rotate_interleaved_out<T, A>(x, o, c, sn, sign, h);
    else rotate_half_out<T, A>(x, x + h, o, o + h, c, sn, sign, h);
    if (D > r) std::memcpy(o + r, x + r, (D - r) * sizeof(T));
  }
}

#if defined(__F16C__)
// fp16: c10::Half converts one value at a time, which the compiler cannot vectorise. Convert a
// chunk to fp32 with F16C (8 values per instruction, round to nearest even like c10::Half),
// rotate it with the fp32 loops above, convert back.
inline void half_to_float(const at::Half* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline void float_to_half(const float* src, at::Half* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = static_cast<at::Half>(src[i]);
}

template <>
inline void rotate_vector<at::Half, float>(at::Half* x, at::Half* o, bool inplace, const float* c, const float* sn,
                                           float sign, int64_t h, int64_t r, int64_t D, bool interleaved) {
  constexpr int64_t kChunk = 128;
  float a[2 * kChunk], b[kChunk];
  if (interleaved) {
    for (int64_t p0 = 0; p0 < h; p0 += kChunk) {
      const int64_t n = std::min(kChunk, h - p0);
      half_to_float(x + 2 * p0, a, 2 * n);
      rotate_interleaved_inplace<float, float>(a, c + 2 * p0, sn + 2 * p0, sign, n);
      float_to_half(a, o + 2 * p0, 2 * n);
    }
  } else {
    for (int64_t p0 = 0; p0 < h; p0 += kChunk) {
      const int64_t n = std::min(kChunk, h - p0);
      half_to_float(x + p0, a, n);
      half_to_float(x + h + p0, b, n);
      rotate_half_inplace<float, float>(a, b, c + p0, sn + p0, sign, n);
      float_to_half(a, o + p0, n);
      float_to_half(b, o + h + p0, n);
    }
  }
  if (!inplace && D > r) std::memcpy(o + r, x + r, (D - r) * sizeof(at::Half));
}
#endif

// Tokens are processed in blocks of kBlock positions. Within a block, the loop order follows the
// memory: for [B, H, S, D] storage (head stride > position stride) heads are the outer loop, so
// each head reads one contiguous run of kBlock * D elements; iterating token by token instead
// would touch H streams a head-stride apart and defeat the prefetchers (2.3x slower measured).
// The block's table rows (kBlock * r * 8 bytes) stay in L1 across heads.
constexpr int64_t kBlock = 16;

template <typename T, int64_t kHalf>
void run_fixed(const std::vector<View>& views, int64_t B, int64_t S, int64_t D, int64_t r, const float* cos,
               const float* sin, int64_t table_rows, int64_t table_stride, const int64_t* positions, int64_t pb,
               int64_t ps, int64_t batch_rows, bool interleaved, bool conjugate);

template <typename T>
void run(const std::vector<View>& views, int64_t B, int64_t S, int64_t D, int64_t r, const float* cos,
         const float* sin, int64_t table_rows, int64_t table_stride, const int64_t* positions, int64_t pb,
         int64_t ps, int64_t batch_rows, bool interleaved, bool conjugate) {
  // A pair count known at compile time lets the compiler unroll a head's loop completely (no
  // remainder loop, no peeling): rotary dims 64 and 128 cover most models.
  switch (r / 2) {
    case 32:
      return run_fixed<T, 32>(views, B, S, D, r, cos, sin, table_rows, table_stride, positions, pb, ps, batch_rows,
                              interleaved, conjugate);
    case 64:
      return run_fixed<T, 64>(views, B, S, D, r, cos, sin, table_rows, table_stride, positions, pb, ps, batch_rows,
                              interleaved, conjugate);
    default:
      return run_fixed<T, 0>(views, B, S, D, r, cos, sin, table_rows, table_stride, positions, pb, ps, batch_rows,
                             interleaved, conjugate);
  }
}

template <typename T, int64_t kHalf>
void run_fixed(const std::vector<View>& views, int64_t B, int64_t S, int64_t D, int64_t r, const float* cos,
         const float* sin, int64_t table_rows, int64_t table_stride, const int64_t* positions, int64_t pb,
         int64_t ps, int64_t batch_rows, bool interleaved, bool conjugate) {
  using A = typename Acc<T>::type;
  const A sign = conjugate ? A(-1) : A(1);
  const int64_t h = kHalf ? kHalf : r / 2;
  const int64_t blocks_per_batch = (S + kBlock - 1) / kBlock;
  int64_t work_per_block = 0;
  for (const auto& v : views) work_per_block += v.heads * D * std::min(S, kBlock);
  // ~64k elements per task: enough to amortise a thread wake-up, small enough to split prefill.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, work_per_block));
  at::parallel_for(0, B * blocks_per_batch, grain, [=, &views](int64_t begin, int64_t end) {
    const float* crow[kBlock];
    const float* srow[kBlock];
    for (int64_t block = begin; block < end; ++block) {
      const int64_t b = block / blocks_per_batch, s0 = (block % blocks_per_batch) * kBlock;
      const int64_t n = std::min(kBlock, S - s0);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t s = s0 + j;
        const int64_t t = positions ? positions[b * pb + s * ps] : b * batch_rows + s;
        TORCH_CHECK(t >= 0 && t < table_rows, "rotary: position ", t, " is outside the cos/sin table of ",
                    table_rows, " rows");
        crow[j] = cos + t * table_stride;
        srow[j] = sin + t * table_stride;
      }
      for (const auto& v : views) {
        T* xb = reinterpret_cast<T*>(v.in) + b * v.sb + s0 * v.ss;
        T* ob = reinterpret_cast<T*>(v.out) + b * v.ob + s0 * v.os;
        const bool inplace = xb == ob && v.sh == v.oh && v.ss == v.os;
        const bool heads_outer = std::abs(v.sh) >= std::abs(v.ss);
        // The pairing and in-place choices are made once per block, outside the loops: with the two
        // branches inside them, the fp32 in-place kernel ran at half the speed (1.8 ms vs 0.9 ms
        // for a 32 MiB tensor on one thread, where a plain loop and mul_ take 0.85 ms).
        auto loops = [&](auto inplace_c, auto interleaved_c) {
          constexpr bool kInplace = decltype(inplace_c)::value, kInterleaved = decltype(interleaved_c)::value;
          auto one = [&](int64_t head, int64_t j) {
            rotate_vector<T, A>(xb + head * v.sh + j * v.ss, ob + head * v.oh + j * v.os, kInplace, crow[j], srow[j],
                                sign, h, r, D, kInterleaved);
          };
          if (heads_outer) {
            for (int64_t head = 0; head < v.heads; ++head)
              for (int64_t j = 0; j < n; ++j) one(head, j);
          } else {
            for (int64_t j = 0; j < n; ++j)
              for (int64_t head = 0; head < v.heads; ++head) one(head, j);
          }
        };
        using Yes = std::true_type;
        using No = std::false_type;
        if (inplace) interleaved ? loops(Yes{}, Yes{}) : loops(Yes{}, No{});
        else interleaved ? loops(No{}, Yes{}) : loops(No{}, No{});
      }
    }
  });
}

}  // namespace

// xs[i], outs[i]: [B, S, H_i, D] (outs[i] may be xs[i] itself: in place). cos/sin: fp32 [T, >= r]
// rows with unit column stride. positions: int64 [B, S] (any strides) selecting the table row of
// (b, s), or an undefined tensor: row = b * batch_rows + s.
void rope_cpu(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& outs, const at::Tensor& cos,
              const at::Tensor& sin, const std::optional<at::Tensor>& positions, int64_t batch_rows, int64_t r,
              bool interleaved, bool conjugate) {
  TORCH_CHECK(!xs.empty() && xs.size() == outs.size(), "rotary: need as many outputs as inputs");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "rotary: tables must be fp32");
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.strides() == sin.strides() && cos.stride(1) == 1,
              "rotary: cos/sin must be [T, r] with unit column stride and equal strides");
  const auto& x0 = xs[0];
  const int64_t B = x0.size(0), S = x0.size(1), D = x0.size(3);
  TORCH_CHECK(r > 0 && r % 2 == 0 && r <= D && r <= cos.size(1), "rotary: bad rotary dim ", r);
  std::vector<View> views;
  for (size_t i = 0; i < xs.size(); ++i) {
    const auto &x = xs[i], &o = outs[i];
    TORCH_CHECK(x.dim() == 4 && x.size(0) == B && x.size(1) == S && x.size(3) == D, "rotary: inputs disagree on B, S, D");
    TORCH_CHECK(o.sizes() == x.sizes() && o.scalar_type() == x.scalar_type() && x.scalar_type() == x0.scalar_type(),
                "rotary: output shape/dtype mismatch");
    TORCH_CHECK(x.stride(3) == 1 && o.stride(3) == 1, "rotary: the channel dim must have unit stride");
    views.push_back({static_cast<char*>(x.data_ptr()), static_cast<char*>(o.data_ptr()), x.size(2), x.stride(0),
                     x.stride(1), x.stride(2), o.stride(0), o.stride(1), o.stride(2)});
  }
  const int64_t* pos = nullptr;
  int64_t pb = 0, ps = 0;
  if (positions.has_value() && positions->defined()) {
    TORCH_CHECK(positions->scalar_type() == at::kLong && positions->dim() == 2 && positions->size(0) == B &&
                    positions->size(1) == S,
                "rotary: positions must be int64 [B, S]");
    pos = positions->data_ptr<int64_t>();
    pb = positions->stride(0);
    ps = positions->stride(1);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x0.scalar_type(), "rope_cpu", [&] {
    run<scalar_t>(views, B, S, D, r, cos.data_ptr<float>(), sin.data_ptr<float>(), cos.size(0), cos.stride(0), pos,
                  pb, ps, batch_rows, interleaved, conjugate);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rope", &rope_cpu, "fused rotary embedding over a list of [B, S, H, D] views");
}
