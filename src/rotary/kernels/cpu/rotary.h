#pragma once

// Fused rotary position embedding for CPU tensors: one pass over q and k, in place or out of place.
//
// Every tensor arrives as a [B, S, H, D] view with arbitrary strides except a unit stride over D
// (so q/k views into a fused qkv projection need no copy). The rotation of pair (a, b) by theta is
// (a cos - b sin, b cos + a sin); the backward pass is the same kernel with sin negated (conjugate).
// Arithmetic is fp32 (fp64 for fp64 inputs) whatever the storage dtype; results are rounded once.
//
// On x86 the rotation of one head is written with intrinsics (AVX-512, or AVX2 + F16C): the 16-bit
// dtypes are converted in registers, and the interleaved pairing is rotated where it lies (see
// `vec` below). Other machines, and the channels a vector does not fill when no masked loads exist,
// use the portable loops, written with __restrict pointers and no branches so the compiler
// vectorises them. Which instructions exist is decided at compile time: the extension is built with
// -march=native on the machine that uses it, and its cache key carries that CPU's flags
// (extension.py), so a build is never loaded on a CPU without its instructions. Rows (b, s) are
// spread over threads with at::parallel_for.
//
// This header holds the kernels; the entry points are in rotary.cpp (bound there): rope (the rotation),
// rope_table_grad (its tables' gradients), rmsnorm_rope (per-head RMSNorm, then the rotation), rope_layout
// (the call a recorded plan makes: the caller's layout, views and outputs made in C++); and in rotary_cache.cpp, rope_cache (rotary.rotate_and_cache: q and k
// rotated, the rotated k and v written into a KV cache at their slots, in one pass over the tokens, after every
// check, so a call that fails writes nothing). The two .cpp files are compiled in parallel.

// The ATen and pybind11 headers the kernel uses, not <torch/extension.h> (the whole C++ frontend): a third
// of the build's time went on parsing it.
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

// Half pairing, (i, i + h): x0 = first half, x1 = second half. In place.
template <typename T, typename A, typename TT>
inline void rotate_half_inplace(T* __restrict x0, T* __restrict x1, const TT* __restrict c,
                                const TT* __restrict s, A sign, int64_t h) {
  for (int64_t i = 0; i < h; ++i) {
    const A a = static_cast<A>(x0[i]), b = static_cast<A>(x1[i]);
    const A ci = static_cast<A>(c[i]), si = sign * static_cast<A>(s[i]);
    x0[i] = static_cast<T>(a * ci - b * si);
    x1[i] = static_cast<T>(b * ci + a * si);
  }
}

template <typename T, typename A, typename TT>
inline void rotate_half_out(const T* __restrict x0, const T* __restrict x1, T* __restrict o0, T* __restrict o1,
                            const TT* __restrict c, const TT* __restrict s, A sign, int64_t h) {
  for (int64_t i = 0; i < h; ++i) {
    const A a = static_cast<A>(x0[i]), b = static_cast<A>(x1[i]);
    const A ci = static_cast<A>(c[i]), si = sign * static_cast<A>(s[i]);
    o0[i] = static_cast<T>(a * ci - b * si);
    o1[i] = static_cast<T>(b * ci + a * si);
  }
}

// Interleaved pairing, (2i, 2i + 1), portable: fp64, machines without the vector code below, and
// the pairs a vector does not fill. Tables are laid out per channel, c[2i] == c[2i + 1]. The pairs
// are first split into L1 buffers and rotated with the half pairing's loop: written directly, GCC
// 12 recognises the complex multiply and emits fmaddsub even under -ffp-contract=off, which made
// this pairing differ from the pure-torch path by one rounding. x and o may be the same memory (in
// place): each chunk is read completely before it is written.
template <typename T, typename A, typename TT>
inline void rotate_interleaved_out(const T* x, T* o, const TT* __restrict c, const TT* __restrict s, A sign,
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

struct View {  // a [B, S, H, D] view (D contiguous) and the table that rotates it
  char* in;
  char* out;
  int64_t heads, sb, ss, sh, ob, os, oh;  // strides in elements
  const void* cos;
  const void* sin;
  int64_t rs, hs;  // table strides in elements: per row, per head (0: one table row serves every head)
};

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__))
#define ROTARY_VEC 1
// One head's rotation in vector registers, fp32 arithmetic for fp32, bf16 and fp16 storage.
//
// Bit-identical to the pure-torch path: every product and every sum is a separate instruction,
// rounded once (no fused multiply-add; intrinsics are not contracted under -ffp-contract=off), and
// the 16-bit conversions round to nearest even exactly as c10::BFloat16 and c10::Half do (NaN
// becomes c10::BFloat16's 0x7FC0; tests/kernels/test_fused_cpu.py checks every exponent at and
// around the rounding ties, denormals, infinities and NaN).
//
// Interleaved pairing, (2i, 2i + 1) in adjacent lanes, with tables laid out per channel: for
// p = x * c and q = swap_pairs(x) * s, the even lane of p - q is a c - b s and the odd lane of
// p + q is b c + a s, the two components of the rotated pair, with no de-interleaving.
namespace vec {
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
using F = __m512;
inline F mul(F a, F b) { return _mm512_mul_ps(a, b); }
inline F add(F a, F b) { return _mm512_add_ps(a, b); }
inline F sub(F a, F b) { return _mm512_sub_ps(a, b); }
inline F splat(float v) { return _mm512_set1_ps(v); }
inline F swap_pairs(F x) { return _mm512_permute_ps(x, 0xB1); }
// even lanes a - b, odd lanes a + b; conjugate: the other way round, which is a - (-b) and a + (-b)
// exactly (negation is exact), i.e. the rotation by -s without multiplying s by -1
struct SubAdd {
  __mmask16 sub_lanes;
  explicit SubAdd(float sign) : sub_lanes(sign < 0 ? 0xAAAA : 0x5555) {}
  F operator()(F a, F b) const { return _mm512_mask_sub_ps(_mm512_add_ps(a, b), sub_lanes, a, b); }
  F sin(F s) const { return s; }
};
inline __mmask16 first(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

inline F widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
// fp32 -> bf16 as c10::BFloat16: bits + 0x7FFF + (bit 16), top half; NaN -> 0x7FC0.
inline __m256i narrow_bf16(F v) {
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
  // one instruction, the same rounding, except that it flushes denormals to zero and keeps NaN
  // payloads: taken when the vector holds neither (fpclass 0x20 denormal, 0x01/0x80 quiet/signalling NaN)
  if (!_mm512_fpclass_ps_mask(v, 0xA1)) return (__m256i)_mm512_cvtneps_pbh(v);
#endif
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

// Load / store kLanes values of T as fp32; with n < kLanes only the first n (masked: nothing past
// them is read or written). `masked`: whether the partial forms exist (16-bit ones need AVX512BW/VL).
template <typename T> struct IO { static constexpr bool ok = false, masked = false; };
template <> struct IO<float> {
  static constexpr bool ok = true, masked = true;
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store(float* p, F v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), v); }
  static F round(F v) { return v; }  // to the storage dtype and back (rmsnorm_rope's roundings)
};
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define ROTARY_MASKED16 true
inline __m256i load16(const void* p, int64_t n) { return _mm256_maskz_loadu_epi16(first(n), p); }
inline void store16(void* p, __m256i v, int64_t n) { _mm256_mask_storeu_epi16(p, first(n), v); }
#else
#define ROTARY_MASKED16 false
inline __m256i load16(const void*, int64_t) { return _mm256_setzero_si256(); }  // never called
inline void store16(void*, __m256i, int64_t) {}
#endif
template <> struct IO<at::BFloat16> {
  static constexpr bool ok = true, masked = ROTARY_MASKED16;
  static F load(const at::BFloat16* p) { return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F load(const at::BFloat16* p, int64_t n) { return widen_bf16(load16(p, n)); }
  static void store(at::BFloat16* p, F v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow_bf16(v)); }
  static void store(at::BFloat16* p, F v, int64_t n) { store16(p, narrow_bf16(v), n); }
  static F round(F v) {  // narrow_bf16's rounding, kept in the top half of each lane: no conversion, no branch
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
    return _mm512_castsi512_ps(r);
  }
};
template <> struct IO<at::Half> {  // round to nearest even, as c10::Half
  static constexpr bool ok = true, masked = ROTARY_MASKED16;
  static F load(const at::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F load(const at::Half* p, int64_t n) { return _mm512_cvtph_ps(load16(p, n)); }
  static __m256i narrow(F v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static void store(at::Half* p, F v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v)); }
  static void store(at::Half* p, F v, int64_t n) { store16(p, narrow(v), n); }
  static F round(F v) { return _mm512_cvtph_ps(narrow(v)); }
};
#undef ROTARY_MASKED16
#else  // AVX2 + F16C: 8 lanes, no masked forms (the portable loops finish a partial vector)
constexpr int64_t kLanes = 8;
using F = __m256;
inline F mul(F a, F b) { return _mm256_mul_ps(a, b); }
inline F add(F a, F b) { return _mm256_add_ps(a, b); }
inline F sub(F a, F b) { return _mm256_sub_ps(a, b); }
inline F splat(float v) { return _mm256_set1_ps(v); }
inline F swap_pairs(F x) { return _mm256_permute_ps(x, 0xB1); }
struct SubAdd {  // even lanes a - b, odd lanes a + b (vaddsubps), of the rotation by sign * s
  F sign;
  explicit SubAdd(float sign_) : sign(_mm256_set1_ps(sign_)) {}
  F operator()(F a, F b) const { return _mm256_addsub_ps(a, b); }
  F sin(F s) const { return _mm256_mul_ps(sign, s); }
};

template <typename T> struct IO { static constexpr bool ok = false, masked = false; };
template <> struct IO<float> {
  static constexpr bool ok = true, masked = false;
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const float*, int64_t) { return _mm256_setzero_ps(); }  // never called (masked = false)
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store(float*, F, int64_t) {}
  static F round(F v) { return v; }
};
template <> struct IO<at::BFloat16> {
  static constexpr bool ok = true, masked = false;
  static F load(const at::BFloat16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static F load(const at::BFloat16*, int64_t) { return _mm256_setzero_ps(); }
  static void store(at::BFloat16* p, F v) {  // as c10::BFloat16, see the AVX-512 version
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  static void store(at::BFloat16*, F, int64_t) {}
  static F round(F v) {  // store's rounding, kept in the top half of each lane
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC00000), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    return _mm256_castsi256_ps(r);
  }
};
template <> struct IO<at::Half> {
  static constexpr bool ok = true, masked = false;
  static F load(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F load(const at::Half*, int64_t) { return _mm256_setzero_ps(); }
  static void store(at::Half* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store(at::Half*, F, int64_t) {}
  static F round(F v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
};
#endif

// The first r channels of x into o (may be x), interleaved pairing. Returns the channels done: r,
// or fewer (a multiple of kLanes) when a partial vector is left to the portable loop.
template <typename T>
inline int64_t interleaved(const T* x, T* o, const float* c, const float* s, float sign, int64_t r) {
  using io = IO<T>;
  const SubAdd sub_add(sign);
  int64_t j = 0;
  for (; j + kLanes <= r; j += kLanes) {
    const F v = io::load(x + j);
    const F p = mul(v, IO<float>::load(c + j)), q = mul(swap_pairs(v), sub_add.sin(IO<float>::load(s + j)));
    io::store(o + j, sub_add(p, q));
  }
  if (io::masked && j < r) {  // r is even: the last vector holds whole pairs
    const int64_t n = r - j;
    const F v = io::load(x + j, n);
    const F p = mul(v, IO<float>::load(c + j, n)), q = mul(swap_pairs(v), sub_add.sin(IO<float>::load(s + j, n)));
    io::store(o + j, sub_add(p, q), n);
    j = r;
  }
  return j;
}

// Half pairing: x0/x1 (the two halves) into o0/o1 (may be x0/x1), h pairs. Returns the pairs done.
template <typename T>
inline int64_t half(const T* x0, const T* x1, T* o0, T* o1, const float* c, const float* s, float sign_, int64_t h) {
  using io = IO<T>;
  const F sign = splat(sign_);
  int64_t i = 0;
  for (; i + kLanes <= h; i += kLanes) {
    const F a = io::load(x0 + i), b = io::load(x1 + i);
    const F ci = IO<float>::load(c + i), si = mul(sign, IO<float>::load(s + i));
    io::store(o0 + i, sub(mul(a, ci), mul(b, si)));
    io::store(o1 + i, add(mul(b, ci), mul(a, si)));
  }
  if (io::masked && i < h) {
    const int64_t n = h - i;
    const F a = io::load(x0 + i, n), b = io::load(x1 + i, n);
    const F ci = IO<float>::load(c + i, n), si = mul(sign, IO<float>::load(s + i, n));
    io::store(o0 + i, sub(mul(a, ci), mul(b, si)), n);
    io::store(o1 + i, add(mul(b, ci), mul(a, si)), n);
    i = h;
  }
  return i;
}

// rmsnorm_rope's last steps for one vector in registers: v (its channels as fp32) times its rstd inv,
// rounded to T (kRoundNormed), times the weight w and rounded to T; then rotated as half() and interleaved()
// rotate, and rounded once. The same operations, in the same order and precision, as the scalar
// norm_rotate_vector followed by rotate_vector, without the buffer between them. Returns false (nothing
// written) when r does not fill whole vectors and the partial forms are missing (AVX2).
template <typename T, bool kRoundNormed>
inline F norm_weight(F v, F inv, F w) {
  F n = mul(v, inv);
  if constexpr (kRoundNormed) n = IO<T>::round(n);
  return IO<T>::round(mul(w, n));
}

template <typename T, bool kInterleaved, bool kRoundNormed>
inline bool norm_rotate(const float* v, float inv_, T* o, const float* w, const float* c, const float* s, int64_t r) {
  using io = IO<T>;
  using fio = IO<float>;
  const int64_t span = kInterleaved ? r : r / 2;  // the channels one pass of the loop walks
  if (!io::masked && span % kLanes) return false;
  const F inv = splat(inv_);
  const SubAdd sub_add(1.0f);
  for (int64_t i = 0; i < span; i += kLanes) {
    const int64_t n = std::min(kLanes, span - i);
    const bool full = n == kLanes;  // else masked: nothing past the last channel is read or written
    auto load = [&](const float* p) { return full ? fio::load(p) : fio::load(p, n); };
    auto store = [&](T* p, F value) { full ? io::store(p, value) : io::store(p, value, n); };
    if constexpr (kInterleaved) {
      const F y = norm_weight<T, kRoundNormed>(load(v + i), inv, load(w + i));
      store(o + i, sub_add(mul(y, load(c + i)), mul(swap_pairs(y), sub_add.sin(load(s + i)))));
    } else {
      const int64_t h = span;
      const F a = norm_weight<T, kRoundNormed>(load(v + i), inv, load(w + i));
      const F b = norm_weight<T, kRoundNormed>(load(v + h + i), inv, load(w + h + i));
      const F ci = load(c + i), si = load(s + i);
      store(o + i, sub(mul(a, ci), mul(b, si)));
      store(o + h + i, add(mul(b, ci), mul(a, si)));
    }
  }
  return true;
}
}  // namespace vec
#else
#define ROTARY_VEC 0
#endif

// One (b, s, head) vector: rotate its first r channels; out of place, copy the rest. The vector
// code does what it can; the portable loops do the rest (everything, for fp64 or without it).
// Always inlined, with the pairing and in-place choices as template arguments: a call per vector,
// or a branch between the paths inside the head loops, costs up to 20% at cache-resident shapes.
template <bool kInplace, bool kInterleaved, typename T, typename A, typename TT>
__attribute__((always_inline)) inline void rotate_vector(T* x, T* o, const TT* c, const TT* sn, A sign, int64_t h,
                                                         int64_t r, int64_t D) {
  int64_t done = 0;  // pairs
#if ROTARY_VEC
  // fp32 with the half pairing is left to the portable loop: the compiler vectorises it on its own
  // (no conversion, no shuffle to do), and the 512-bit intrinsics were ~18% slower at a 32 MiB
  // tensor (1.16 vs 0.98 ms in place on one thread, 2.1 vs 1.7 ms out of place).
  if constexpr (vec::IO<T>::ok && std::is_same_v<TT, float> && std::is_same_v<A, float> &&
                (kInterleaved || !std::is_same_v<T, float>)) {
    if constexpr (kInterleaved) done = vec::interleaved<T>(x, o, c, sn, sign, r) / 2;
    else done = vec::half<T>(x, x + h, o, o + h, c, sn, sign, h);
  }
#endif
  if (done < h) {
    if constexpr (kInterleaved) {
      const int64_t j = 2 * done;
      rotate_interleaved_out<T, A, TT>(x + j, o + j, c + j, sn + j, sign, h - done);
    } else if constexpr (kInplace) {
      rotate_half_inplace<T, A, TT>(x + done, x + h + done, c + done, sn + done, sign, h - done);
    } else {
      rotate_half_out<T, A, TT>(x + done, x + h + done, o + done, o + h + done, c + done, sn + done, sign, h - done);
    }
  }
  if (!kInplace && D > r) std::memcpy(o + r, x + r, (D - r) * sizeof(T));
}

// Tokens are processed in blocks of kBlock positions. Within a block, the loop order follows the
// memory: for [B, H, S, D] storage (head stride > position stride) heads are the outer loop, so
// each head reads one contiguous run of kBlock * D elements; iterating token by token instead
// would touch H streams a head-stride apart and defeat the prefetchers (2.3x slower measured).
// The block's table rows (kBlock * r * 8 bytes) stay in L1 across heads.
constexpr int64_t kBlock = 16;

struct Rows {  // which table row each token reads
  const int64_t* positions;  // [B, S] with strides pb, ps; or null: row = b * batch_rows + s
  int64_t pb, ps, batch_rows, table_rows;
  // float64 [r/2 + 1], the frequencies the tables were made from and their attention scaling, or null: a
  // position that is not a row of the table then has its row computed (computed_row); without, it is an error
  const double* freqs;

  inline int64_t position(int64_t b, int64_t s) const { return positions ? positions[b * pb + s * ps] : b * batch_rows + s; }
  inline bool inside(int64_t t) const { return t >= 0 && t < table_rows; }
};

// The table row of position p, computed as the cached rows are (rotary.tables.cos_sin_table): per pair,
// cos(p * f) and sin(p * f) in double (the angle exact for |p| < 2^29, the float64 product beyond), times
// the attention scaling, rounded once to the table dtype; laid out per channel for the pairing.
template <typename TT>
void computed_row(int64_t p, const double* freqs, int64_t r, bool interleaved, TT* c, TT* s) {
  const int64_t h = r / 2;
  const double scale = freqs[h];
  for (int64_t i = 0; i < h; ++i) {
    const double theta = static_cast<double>(p) * freqs[i];
    const TT cv = static_cast<TT>(std::cos(theta) * scale), sv = static_cast<TT>(std::sin(theta) * scale);
    const int64_t first = interleaved ? 2 * i : i, second = interleaved ? 2 * i + 1 : i + h;
    c[first] = c[second] = cv;
    s[first] = s[second] = sv;
  }
}

// The rows of one block of tokens: the table row of each, or a row computed into `scratch` (2 * n * r values,
// allocated on first need) for a position the table does not hold. computed[j] says which.
template <typename TT>
void block_rows(const Rows& rows, int64_t b, int64_t s0, int64_t n, int64_t r, bool interleaved, int64_t* row,
                bool* computed, std::vector<TT>& scratch) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t t = rows.position(b, s0 + j);
    computed[j] = !rows.inside(t);
    row[j] = computed[j] ? 0 : t;
    if (!computed[j]) continue;
    TORCH_CHECK(rows.freqs != nullptr, "rotary: position ", t, " is outside the cos/sin table of ", rows.table_rows,
                " rows");
    if (scratch.size() < static_cast<size_t>(2 * n * r)) scratch.resize(2 * n * r);
    computed_row<TT>(t, rows.freqs, r, interleaved, scratch.data() + 2 * j * r, scratch.data() + (2 * j + 1) * r);
  }
}

template <typename T, typename TT, int64_t kHalf>
void run_fixed(const std::vector<View>& views, int64_t B, int64_t S, int64_t D, int64_t r, const Rows& rows,
               bool interleaved, bool conjugate) {
  using A = typename Acc<T>::type;
  const A sign = conjugate ? A(-1) : A(1);
  const int64_t h = kHalf ? kHalf : r / 2;
  const int64_t blocks_per_batch = (S + kBlock - 1) / kBlock;
  int64_t work_per_block = 0;
  for (const auto& v : views) work_per_block += v.heads * D * std::min(S, kBlock);
  // ~64k elements per task: enough to amortise a thread wake-up, small enough to split prefill.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, work_per_block));
  at::parallel_for(0, B * blocks_per_batch, grain, [=, &views, &rows](int64_t begin, int64_t end) {
    int64_t row[kBlock];
    bool computed[kBlock];
    const TT* crow[kBlock];
    const TT* srow[kBlock];
    std::vector<TT> scratch;  // rows computed for positions past the table (Rows::freqs)
    for (int64_t block = begin; block < end; ++block) {
      const int64_t b = block / blocks_per_batch, s0 = (block % blocks_per_batch) * kBlock;
      const int64_t n = std::min(kBlock, S - s0);
      block_rows<TT>(rows, b, s0, n, r, interleaved, row, computed, scratch);
      for (const auto& v : views) {
        T* xb = reinterpret_cast<T*>(v.in) + b * v.sb + s0 * v.ss;
        T* ob = reinterpret_cast<T*>(v.out) + b * v.ob + s0 * v.os;
        const TT* cos = static_cast<const TT*>(v.cos);
        const TT* sin = static_cast<const TT*>(v.sin);
        for (int64_t j = 0; j < n; ++j) {
          crow[j] = computed[j] ? scratch.data() + 2 * j * r : cos + row[j] * v.rs;
          srow[j] = computed[j] ? scratch.data() + (2 * j + 1) * r : sin + row[j] * v.rs;
        }
        const bool inplace = xb == ob && v.sh == v.oh && v.ss == v.os;
        // The interleaved pairing reads table rows twice as wide (r, not r/2), and with heads outer it
        // ran at 2x one pass for [B, H, S, D] storage; tokens outer (each row read once per token, for
        // every head) brought bf16 prefill from 1.95 to 1.00 ms and fp32 from 2.99 to 2.29 ms (2 threads).
        const bool heads_outer = !interleaved && std::abs(v.sh) >= std::abs(v.ss);
        // The pairing and in-place choices are made once per block, outside the loops: with the two
        // branches inside them, the fp32 in-place kernel ran at half the speed (1.8 ms vs 0.9 ms
        // for a 32 MiB tensor on one thread, where a plain loop and mul_ take 0.85 ms).
        auto loops = [&](auto inplace_c, auto interleaved_c) {
          constexpr bool kInplace = decltype(inplace_c)::value, kInterleaved = decltype(interleaved_c)::value;
          auto one = [&](int64_t head, int64_t j) {
            const int64_t t = head * v.hs;
            rotate_vector<kInplace, kInterleaved, T, A, TT>(xb + head * v.sh + j * v.ss, ob + head * v.oh + j * v.os,
                                                            crow[j] + t, srow[j] + t, sign, h, r, D);
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

template <typename T, typename TT>
void run(const std::vector<View>& views, int64_t B, int64_t S, int64_t D, int64_t r, const Rows& rows,
         bool interleaved, bool conjugate) {
  // A pair count known at compile time lets the compiler unroll a head's loop completely (no
  // remainder loop, no peeling): rotary dims 64 and 128 cover most models.
  switch (r / 2) {
    case 32: return run_fixed<T, TT, 32>(views, B, S, D, r, rows, interleaved, conjugate);
    case 64: return run_fixed<T, TT, 64>(views, B, S, D, r, rows, interleaved, conjugate);
    default: return run_fixed<T, TT, 0>(views, B, S, D, r, rows, interleaved, conjugate);
  }
}

// Gradients with respect to the tables, per token: for each x and its output gradient g,
// gcos[b, s, (head,) c] = Σ_heads g[c] x[c] and gsin[...] = sign Σ_heads g[c] turn(x)[c], where
// turn(x) is the 90-degree turn of each pair, (a, b) -> (-b, a). Each task owns whole tokens, so
// no two threads write the same row.
template <typename T, typename TT>
void table_grad(const std::vector<View>& views, const std::vector<at::Tensor>& gcos, const std::vector<at::Tensor>& gsin,
                int64_t B, int64_t S, int64_t r, bool interleaved, bool conjugate) {
  using A = typename Acc<T>::type;
  const A sign = conjugate ? A(-1) : A(1);
  const int64_t h = r / 2;
  at::parallel_for(0, B * S, 64, [&](int64_t begin, int64_t end) {
    std::vector<A> ac(r), as(r);
    for (int64_t token = begin; token < end; ++token) {
      const int64_t b = token / S, s = token % S;
      for (size_t i = 0; i < views.size(); ++i) {
        const View& v = views[i];
        const bool per_head = gcos[i].dim() == 4;
        TT* gc = gcos[i].data_ptr<TT>() + b * gcos[i].stride(0) + s * gcos[i].stride(1);
        TT* gs = gsin[i].data_ptr<TT>() + b * gsin[i].stride(0) + s * gsin[i].stride(1);
        const T* xb = reinterpret_cast<const T*>(v.in) + b * v.sb + s * v.ss;  // the input x
        const T* gb = reinterpret_cast<const T*>(v.out) + b * v.ob + s * v.os;  // the output gradient
        std::fill(ac.begin(), ac.end(), A(0));
        std::fill(as.begin(), as.end(), A(0));
        for (int64_t head = 0; head < v.heads; ++head) {
          const T* x = xb + head * v.sh;
          const T* g = gb + head * v.oh;
          for (int64_t p = 0; p < h; ++p) {
            const int64_t i0 = interleaved ? 2 * p : p, i1 = interleaved ? 2 * p + 1 : p + h;
            const A a = static_cast<A>(x[i0]), z = static_cast<A>(x[i1]);
            const A g0 = static_cast<A>(g[i0]), g1 = static_cast<A>(g[i1]);
            ac[i0] += g0 * a;
            ac[i1] += g1 * z;
            as[i0] -= g0 * z;
            as[i1] += g1 * a;
          }
          if (per_head) {
            TT* hc = gc + head * gcos[i].stride(2);
            TT* hs = gs + head * gsin[i].stride(2);
            for (int64_t c = 0; c < r; ++c) {
              hc[c] = static_cast<TT>(ac[c]);
              hs[c] = static_cast<TT>(sign * as[c]);
            }
            std::fill(ac.begin(), ac.end(), A(0));
            std::fill(as.begin(), as.end(), A(0));
          }
        }
        if (!per_head) {
          for (int64_t c = 0; c < r; ++c) {
            gc[c] = static_cast<TT>(ac[c]);
            gs[c] = static_cast<TT>(sign * as[c]);
          }
        }
      }
    }
  });
}

struct Call {
  std::vector<View> views;
  int64_t B, S, D, r;
  Rows rows;
  bool double_tables;
};

// The checks shared by both entry points; xs[i] with outs[i] (or the gradients) and tables cos[i], sin[i].
Call prepare(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& cos,
             const std::vector<at::Tensor>& sin, const std::optional<at::Tensor>& positions, int64_t batch_rows,
             const std::optional<at::Tensor>& frequencies) {
  TORCH_CHECK(!xs.empty() && xs.size() == outs.size() && xs.size() == cos.size() && xs.size() == sin.size(),
              "rotary: need one output and one table per input");
  const auto& x0 = xs[0];
  const auto table_type = cos[0].scalar_type();
  TORCH_CHECK(table_type == at::kFloat || (table_type == at::kDouble && x0.scalar_type() == at::kDouble),
              "rotary: tables must be fp32 (or float64 for float64 inputs)");
  Call call{{}, x0.size(0), x0.size(1), x0.size(3), cos[0].size(-1), Rows{nullptr, 0, 0, batch_rows, cos[0].size(0), nullptr},
            table_type == at::kDouble};
  TORCH_CHECK(call.r > 0 && call.r % 2 == 0 && call.r <= call.D, "rotary: bad rotary dim ", call.r);
  for (size_t i = 0; i < xs.size(); ++i) {
    const auto &x = xs[i], &o = outs[i], &c = cos[i], &s = sin[i];
    TORCH_CHECK(x.dim() == 4 && x.size(0) == call.B && x.size(1) == call.S && x.size(3) == call.D,
                "rotary: inputs disagree on B, S, D");
    TORCH_CHECK(o.sizes() == x.sizes() && o.scalar_type() == x.scalar_type() && x.scalar_type() == x0.scalar_type(),
                "rotary: output shape/dtype mismatch");
    TORCH_CHECK(x.is_cpu() && o.is_cpu() && c.is_cpu() && s.is_cpu(),
                "rotary: the CPU kernel reads and writes CPU tensors only (inputs, outputs and tables)");
    TORCH_CHECK(x.stride(3) == 1 && o.stride(3) == 1, "rotary: the channel dim must have unit stride");
    TORCH_CHECK(c.scalar_type() == table_type && s.scalar_type() == table_type && c.sizes() == s.sizes() &&
                    c.strides() == s.strides() && c.stride(-1) == 1 && c.size(-1) == call.r &&
                    c.size(0) == call.rows.table_rows,
                "rotary: cos/sin must be [N, r] or [N, H, r] of one dtype with unit column stride and equal strides");
    const bool per_head = c.dim() == 3;
    TORCH_CHECK(c.dim() == 2 || (per_head && c.size(1) == x.size(2)), "rotary: per-head tables must have the input's heads");
    call.views.push_back({static_cast<char*>(x.data_ptr()), static_cast<char*>(o.data_ptr()), x.size(2), x.stride(0),
                          x.stride(1), x.stride(2), o.stride(0), o.stride(1), o.stride(2), c.data_ptr(), s.data_ptr(),
                          c.stride(0), per_head ? c.stride(1) : 0});
  }
  if (positions.has_value() && positions->defined()) {
    TORCH_CHECK(positions->scalar_type() == at::kLong && positions->dim() == 2 && positions->size(0) == call.B &&
                    positions->size(1) == call.S && positions->is_cpu(),
                "rotary: positions must be int64 [B, S] on the CPU");
    call.rows.positions = positions->data_ptr<int64_t>();
    call.rows.pb = positions->stride(0);
    call.rows.ps = positions->stride(1);
  }
  if (frequencies.has_value() && frequencies->defined()) {
    TORCH_CHECK(positions.has_value() && positions->defined() && frequencies->scalar_type() == at::kDouble &&
                    frequencies->dim() == 1 &&
                    frequencies->size(0) == call.r / 2 + 1 && frequencies->is_contiguous() && frequencies->is_cpu(),
                "rotary: frequencies must be float64 [r/2 + 1] on the CPU, with positions");
    for (const auto& c : cos) TORCH_CHECK(c.dim() == 2, "rotary: rows are computed for [N, r] tables only");
    call.rows.freqs = frequencies->data_ptr<double>();
  }
  return call;
}

// ---- Per-head RMSNorm, then the rotation (rotary.rmsnorm_rotate) --------------------------------------
//
// Each (b, s, head) vector x of D channels: rstd = 1 / sqrt(mean(x²) + eps), n = x rstd, y = w n rounded to
// the storage dtype; y is then rotated as above (channels past r copied) and rounded once. Qwen3RMSNorm rounds
// n to the storage dtype before the weight multiplies it (kRoundNormed); Gemma3RMSNorm multiplies in fp32 by
// (1 + weight), which the caller passes as w, and rounds once. Every step is the operation Hugging Face's
// module does, in its order and precision, so the result is theirs bit for bit. That includes the mean of the
// squares: they are summed in the order of ATen's CPU sum kernel (aten/src/ATen/native/cpu/SumKernel.cpp), and
// divided by D, as torch's mean does on the CPU.

// ceil(log2(x)), and 1 for x <= 2: ATen's utils::CeilLog2.
inline int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  int64_t bits = 0;
  for (uint64_t v = static_cast<uint64_t>(x - 1); v; v >>= 1) ++bits;
  return bits;
}

// ATen's row_sum over n non-negative elements (scalars, or vectors of lanes summed lane by lane), load(e)
// giving element e: the elements as rows of four with four running sums and a cascade of four levels every
// 2^power rows (multi_row_sum), the elements past the last full row added to sum 0, then sums 1, 2 and 3
// added to sum 0.
template <typename E, typename Load>
inline E aten_row_sum(int64_t n, Load load) {
  constexpr int64_t kLevels = 4, kRows = 4;
  const int64_t rows = n / kRows;
  const int64_t power = std::max<int64_t>(4, ceil_log2(rows) / kLevels);
  const int64_t step = int64_t(1) << power, mask = step - 1;
  E acc[kLevels][kRows] = {};
  int64_t i = 0;
  auto add_rows = [&](int64_t to) {
    for (; i < to; ++i)
      for (int64_t k = 0; k < kRows; ++k) acc[0][k] += load(i * kRows + k);
  };
  while (i + step <= rows) {
    add_rows(i + step);
    for (int64_t j = 1; j < kLevels; ++j) {
      for (int64_t k = 0; k < kRows; ++k) {
        acc[j][k] += acc[j - 1][k];
        acc[j - 1][k] = E{};
      }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  add_rows(rows);
  if (rows >= step) {  // otherwise levels 1 .. 3 hold +0, which adds nothing to sums of squares (never -0)
    for (int64_t j = 1; j < kLevels; ++j)
      for (int64_t k = 0; k < kRows; ++k) acc[0][k] += acc[j][k];
  }
  for (int64_t e = rows * kRows; e < n; ++e) acc[0][0] += load(e);
  for (int64_t k = 1; k < kRows; ++k) acc[0][0] += acc[0][k];
  return acc[0][0];
}

// The sum of the squares v[e]² of v[0 .. n) in the order torch.sum takes over the squares (a contiguous last
// dim) on the CPU: vectors of 32 bytes (8 floats, 4 doubles) through row_sum, the leftover values one by one,
// then the lanes in order (vectorized_inner_sum); fewer values than a vector: row_sum over the values
// (scalar_inner_sum). 32 bytes is the width ATen's reductions run at: AVX2's (its sum kernel is not compiled
// for AVX-512, which runs the AVX2 one) and NEON's pair of 128-bit registers; tests/test_rmsnorm_rotate.py
// checks the result against torch's. The lanes are GCC/Clang vector types: each lane's operations are the
// scalar ones (each square rounded, then added), in one instruction.
template <typename A>
inline A aten_sum_of_squares(const A* v, int64_t n) {
  constexpr int64_t L = 32 / sizeof(A);
  if (n < L) return aten_row_sum<A>(n, [v](int64_t e) { return v[e] * v[e]; });
  typedef A Lanes __attribute__((vector_size(32)));
  const int64_t vectors = n / L;
  const Lanes lanes = aten_row_sum<Lanes>(vectors, [v](int64_t e) {
    Lanes x;
    std::memcpy(&x, v + e * L, sizeof(x));
    return x * x;
  });
  A total = A(0);
  for (int64_t k = vectors * L; k < n; ++k) total += v[k] * v[k];
  for (int64_t w = 0; w < L; ++w) total += lanes[w];
  return total;
}

// The rstd of one (b, s, head) vector x: its channels into v (as A), then 1 / sqrt(mean(x²) + eps).
template <typename T, typename A>
__attribute__((always_inline)) inline A norm_rstd(const T* __restrict x, A* __restrict v, A eps, int64_t D) {
  int64_t i = 0;
#if ROTARY_VEC
  // fp16 widened in vector registers (exact): GCC leaves c10::Half's conversion scalar (4x slower
  // overall); bf16's, a shift, it vectorises itself (and the intrinsics measured no faster)
  if constexpr (vec::IO<T>::ok && std::is_same_v<T, at::Half>) {
    for (; i + vec::kLanes <= D; i += vec::kLanes) vec::IO<float>::store(v + i, vec::IO<T>::load(x + i));
  }
#endif
  for (; i < D; ++i) v[i] = static_cast<A>(x[i]);
  return A(1) / std::sqrt(aten_sum_of_squares(v, D) / static_cast<A>(D) + eps);
}

// The normalised, weighted and rotated channels of one vector (v: its channels as A, inv: its rstd) into o.
// y holds D values of T: the normalised vector in the storage dtype, which rotate_vector then rotates as
// rope_cpu would (its vector code included: written out here, the interleaved pairing's complex multiply
// would be contracted, see rotate_interleaved_out).
template <bool kInterleaved, bool kRoundNormed, typename T, typename A, typename TT>
__attribute__((always_inline)) inline void norm_rotate_vector(const A* __restrict v, A inv, T* o, T* __restrict y,
                                                              const A* __restrict w, const TT* c, const TT* sn,
                                                              int64_t D, int64_t r) {
#if ROTARY_VEC
  // bf16 with the interleaved pairing keeps the two passes below (the buffer, then rotate_vector's vector
  // code): in registers it measured 5-7% slower on an AVX-512 EPYC at head_dim 128 (an A/B of the two
  // builds), where the others gained (1 thread: fp32 10-17%, fp16 4-5x, bf16 half 0-9%)
  if constexpr (vec::IO<T>::ok && std::is_same_v<TT, float> && std::is_same_v<A, float> &&
                !(kInterleaved && std::is_same_v<T, at::BFloat16>)) {
    if (vec::norm_rotate<T, kInterleaved, kRoundNormed>(v, inv, o, w, c, sn, r)) {
      for (int64_t i = r; i < D; ++i) {  // normalised, not rotated
        A n = v[i] * inv;
        if constexpr (kRoundNormed) n = static_cast<A>(static_cast<T>(n));
        o[i] = static_cast<T>(w[i] * n);
      }
      return;
    }
  }
#endif
  for (int64_t i = 0; i < D; ++i) {
    A n = v[i] * inv;
    if constexpr (kRoundNormed) n = static_cast<A>(static_cast<T>(n));
    y[i] = static_cast<T>(w[i] * n);
  }
  rotate_vector<false, kInterleaved, T, A, TT>(y, o, c, sn, A(1), r / 2, r, D);
}

// One view's norm: its weight (D values of the arithmetic dtype A, contiguous) and where its rstds go, [B, S, H]
// with strides rb, rs, rh (null: not written, a call without a backward).
struct Norm {
  const void* weight;
  void* rstd;
  int64_t rb, rs, rh;
};

template <typename T, typename TT>
void norm_run(const std::vector<View>& views, const std::vector<Norm>& norms, int64_t B, int64_t S, int64_t D,
              int64_t r, const Rows& rows, bool interleaved, bool round_normed, double eps) {
  using A = typename Acc<T>::type;
  const A eps_a = static_cast<A>(eps);  // torch adds a Python float to an fp32 tensor as fp32
  int64_t per_token = 0;
  for (const auto& v : views) per_token += v.heads * D;
  int64_t heads = 0;
  for (const auto& v : views) heads = std::max(heads, v.heads);
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, per_token));
  auto loops = [&](auto interleaved_c, auto round_c) {
    constexpr bool kInterleaved = decltype(interleaved_c)::value, kRoundNormed = decltype(round_c)::value;
    at::parallel_for(0, B * S, grain, [&](int64_t begin, int64_t end) {
      std::vector<A> xs(heads * D), inv(heads);
      std::vector<T> y(D);
      std::vector<TT> scratch;  // a row computed for a position past the table (Rows::freqs)
      for (int64_t token = begin; token < end; ++token) {
        const int64_t b = token / S, s = token % S;
        int64_t t;
        bool computed;
        block_rows<TT>(rows, b, s, 1, r, kInterleaved, &t, &computed, scratch);
        for (size_t i = 0; i < views.size(); ++i) {
          const View& v = views[i];
          const T* xb = reinterpret_cast<const T*>(v.in) + b * v.sb + s * v.ss;
          T* ob = reinterpret_cast<T*>(v.out) + b * v.ob + s * v.os;
          const TT* cos = computed ? scratch.data() : static_cast<const TT*>(v.cos);
          const TT* sin = computed ? scratch.data() + r : static_cast<const TT*>(v.sin);
          const Norm& n = norms[i];
          // every head's rstd first: one vector's sum, square root and divisions are a chain of dependent
          // instructions, and the heads' chains overlap only when nothing waits for each in turn
          for (int64_t head = 0; head < v.heads; ++head)
            inv[head] = norm_rstd<T, A>(xb + head * v.sh, xs.data() + head * D, eps_a, D);
          if (n.rstd != nullptr) {
            A* rstd = static_cast<A*>(n.rstd) + b * n.rb + s * n.rs;
            for (int64_t head = 0; head < v.heads; ++head) rstd[head * n.rh] = inv[head];
          }
          const A* w = static_cast<const A*>(n.weight);
          for (int64_t head = 0; head < v.heads; ++head) {
            const int64_t tt = t * v.rs + head * v.hs;
            norm_rotate_vector<kInterleaved, kRoundNormed, T, A, TT>(xs.data() + head * D, inv[head], ob + head * v.oh,
                                                                     y.data(), w, cos + tt, sin + tt, D, r);
          }
        }
      }
    });
  };
  using Yes = std::true_type;
  using No = std::false_type;
  if (interleaved) round_normed ? loops(Yes{}, Yes{}) : loops(Yes{}, No{});
  else round_normed ? loops(No{}, Yes{}) : loops(No{}, No{});
}

}  // namespace
