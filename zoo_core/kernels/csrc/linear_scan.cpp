// The zoo's linear recurrences on CPUs: the diagonal scan (real or complex) and the 2×2-block scan,
// one fused pass per (batch row, block of states), forward and backward.
//
// Letters: Bt batch, L length, S real state values per row (flattened), W SIMD width.
//
// One kernel for all three structures. Every state value x has an optional partner x' (its pair
// neighbour: lanes 2i and 2i+1 of the flattened row), and one step is
//
//       h_t = P_t ⊙ h_{t−1} + Q_t ⊙ swap(h_{t−1}) + b_t        (swap exchanges each pair)
//
//   real diagonal a:   P = a, no Q.
//   complex diagonal:  values (re, im) interleaved (torch.view_as_real); a = ar + i·ai is the 2×2 real
//                      matrix [[ar, −ai], [ai, ar]], so P = (ar, ar), Q = (−ai, ai).
//   2×2 blocks:        state (x, y) interleaved; A = [[a00, a01], [a10, a11]] gives P = (a00, a11),
//                      Q = (a01, a10).
// The Python wrapper (zoo_core/kernels/scan_cpu.py) forms P and Q from a differentiably, so autograd
// turns ∂P, ∂Q back into ∂a of any of the three shapes. With a time-invariant a, P and Q are (S,)
// and stay in registers for the whole sequence (never expanded to (Bt, L, S)); else (Bt, L, S).
//
// Why this shape (the one llama.cpp's ggml_ssm_scan uses): time is the only sequential dimension, so
// the threads take (batch row × block of state values) work items and walk time innermost; each
// step reads one contiguous run of the block's values of b and writes one of h, i.e. the op streams b
// and h exactly once (the PyTorch loop makes ~4 passes per step plus torch.stack's copy).
//
// Backward (the adjoint, time reversed): λ_t = ∂L/∂h_t + A_{t+1}ᵀ λ_{t+1}, where Aᵀ has the same P
// and Q with each pair swapped (for complex numbers that is the matrix of conj(a));
// ∂b_t = λ_t; ∂P_t = λ_t ⊙ h_{t−1}, ∂Q_t = λ_t ⊙ swap(h_{t−1}) (summed over batch and time for a
// time-invariant a: per work item in registers, then over the batch by the caller); ∂h0 = A_0ᵀ λ_0.
// It reads the forward's states (the op returns all of them anyway), so nothing is recomputed.
//
// Resets (packed documents): where reset[b, t] is set the transition is an exact zero, h_t = b_t,
// nothing flows back into h_{t−1} and ∂a_t = 0, as in scan_naive.
//
// Subnormals: decaying states fall into subnormal floats, which x86 CPUs handle ~100x slower. Each
// work item runs with flush-to-zero / denormals-are-zero set (and restores the caller's mode), which
// changes only values below 1.2e-38 (float32) / 2.2e-308 (float64).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define ZOO_HAS_MXCSR 1
#endif

namespace {

using at::vec::Vectorized;

constexpr int64_t kBlockBytes = 8192;  // state values per work item, in bytes (one stream of a step)

// Flush-to-zero and denormals-are-zero for the current thread while alive; restores the old mode.
struct FlushDenormals {
#ifdef ZOO_HAS_MXCSR
  unsigned int saved;
  FlushDenormals() : saved(_mm_getcsr()) { _mm_setcsr(saved | 0x8040u); }
  ~FlushDenormals() { _mm_setcsr(saved); }
#endif
};

// The portable pair swap (any other CPU).
template <typename scalar_t>
[[maybe_unused]] inline Vectorized<scalar_t> swap_generic(const Vectorized<scalar_t>& v) {
  constexpr int W = Vectorized<scalar_t>::size();
  alignas(64) scalar_t x[W];
  v.store(x);
  for (int i = 0; i + 1 < W; i += 2) std::swap(x[i], x[i + 1]);
  return Vectorized<scalar_t>::loadu(x);
}

// Exchange the two values of every pair (lanes 2i <-> 2i+1): one in-lane permute on AVX2/AVX512.
inline Vectorized<float> swap_pairs(const Vectorized<float>& v) {
#if defined(CPU_CAPABILITY_AVX512)
  return Vectorized<float>(_mm512_permute_ps(__m512(v), 0xB1));
#elif defined(CPU_CAPABILITY_AVX2)
  return Vectorized<float>(_mm256_permute_ps(__m256(v), 0xB1));
#else
  return swap_generic(v);
#endif
}

inline Vectorized<double> swap_pairs(const Vectorized<double>& v) {
#if defined(CPU_CAPABILITY_AVX512)
  return Vectorized<double>(_mm512_permute_pd(__m512d(v), 0x55));
#elif defined(CPU_CAPABILITY_AVX2)
  return Vectorized<double>(_mm256_permute_pd(__m256d(v), 0x5));
#else
  return swap_generic(v);
#endif
}

// Everything a work item reads or writes, as raw pointers into contiguous tensors.
template <typename scalar_t>
struct Args {
  const scalar_t* P;     // (S,) time-invariant or (Bt, L, S)
  const scalar_t* Q;     // like P, or nullptr (real diagonal)
  const scalar_t* b;     // forward: b; backward: ∂L/∂h_all            (Bt, L, S)
  const scalar_t* init;  // forward: h0; backward: ∂L/∂h_last          (Bt, S) or nullptr
  const scalar_t* h;     // backward: the forward's states             (Bt, L, S)
  const scalar_t* h0;    // backward: h0                               (Bt, S) or nullptr
  const bool* reset;     // (Bt, L) or nullptr
  scalar_t* out;         // forward: h_all; backward: λ = ∂b           (Bt, L, S)
  scalar_t* last;        // forward: h_last; backward: ∂h0             (Bt, S)
  scalar_t* gP;          // backward: ∂P (Bt, L, S), or per batch row (Bt, S) when time-invariant
  scalar_t* gQ;          // like gP, or nullptr
  bool tv;               // P, Q time-varying
  int64_t Bt, L, S;
};

// One work item: batch row bi, state values [s0, s0 + nb). Its state (and a time-invariant P, Q)
// lives in a per-thread scratch buffer of nb values (L1/L2-resident: at most kBlockBytes each), so
// every step streams nb contiguous values of b and of h (hardware prefetch works; a block of one
// SIMD vector would jump S values per step, a new page each time, and ran 3x slower).
template <typename scalar_t, bool HAS_Q>
struct Item {
  using Vec = Vectorized<scalar_t>;
  static constexpr int W = Vec::size();
  int64_t nfull;  // full vectors
  int tail;       // values in the last, partial vector (0: none)
  Vec* h;         // scratch: state or adjoint, then P, Q, gP, gQ (nv vectors each)
  Vec *P, *Q, *gP, *gQ;

  Item(int64_t nb, Vec* scratch) : nfull(nb / W), tail(static_cast<int>(nb % W)) {
    const int64_t nv = nv_of(nb);
    h = scratch;
    P = h + nv;
    Q = P + nv;
    gP = Q + nv;
    gQ = gP + nv;
  }
  static int64_t nv_of(int64_t nb) { return (nb + W - 1) / W; }
  inline int64_t nv() const { return nfull + (tail > 0); }
  inline Vec load(const scalar_t* p, int64_t v) const {
    return v < nfull ? Vec::loadu(p + v * W) : Vec::loadu(p + v * W, tail);
  }
  inline void store(const Vec& x, scalar_t* p, int64_t v) const {
    if (v < nfull) x.store(p + v * W); else x.store(p + v * W, tail);
  }
  static inline Vec step(const Vec& p, const Vec& q, const Vec& h) {
    return HAS_Q ? at::vec::fmadd(p, h, q * swap_pairs(h)) : p * h;
  }

  // h_t = P ⊙ h_{t−1} + Q ⊙ swap(h_{t−1}) + b_t over one run of vectors [v0, v1) (loads unmasked
  // when FULL) for one step.
  template <bool FULL, bool TV>
  inline void fwd_run(const Args<scalar_t>& a, int64_t o, int64_t v0, int64_t v1) const {
    for (int64_t v = v0; v < v1; ++v) {
      const scalar_t* pb = a.b + o + v * W;
      const Vec bv = FULL ? Vec::loadu(pb) : Vec::loadu(pb, tail);
      Vec p, q;
      if (TV) {
        p = FULL ? Vec::loadu(a.P + o + v * W) : Vec::loadu(a.P + o + v * W, tail);
        if (HAS_Q) q = FULL ? Vec::loadu(a.Q + o + v * W) : Vec::loadu(a.Q + o + v * W, tail);
      } else {
        p = P[v];
        if (HAS_Q) q = Q[v];
      }
      h[v] = step(p, q, h[v]) + bv;
      if (FULL) h[v].store(a.out + o + v * W); else h[v].store(a.out + o + v * W, tail);
    }
  }

  void forward(const Args<scalar_t>& a, int64_t bi, int64_t s0) const {
    const int64_t S = a.S, L = a.L;
    const Vec zero(scalar_t(0));
    for (int64_t v = 0; v < nv(); ++v) {
      h[v] = a.init ? load(a.init + bi * S + s0, v) : zero;
      if (!a.tv) {
        P[v] = load(a.P + s0, v);
        Q[v] = HAS_Q ? load(a.Q + s0, v) : zero;
      }
    }
    for (int64_t t = 0; t < L; ++t) {
      const int64_t o = (bi * L + t) * S + s0;
      if (a.reset && a.reset[bi * L + t]) {  // exact zero transition: h_t = b_t
        for (int64_t v = 0; v < nv(); ++v) {
          h[v] = load(a.b + o, v);
          store(h[v], a.out + o, v);
        }
        continue;
      }
      if (a.tv) {
        fwd_run<true, true>(a, o, 0, nfull);
        if (tail) fwd_run<false, true>(a, o, nfull, nfull + 1);
      } else {
        fwd_run<true, false>(a, o, 0, nfull);
        if (tail) fwd_run<false, false>(a, o, nfull, nfull + 1);
      }
    }
    for (int64_t v = 0; v < nv(); ++v) store(h[v], a.last + bi * S + s0, v);
  }

  // One step of the adjoint over [v0, v1): λ_t = λ + g_t (stored as ∂b_t), ∂P/∂Q from h_{t−1},
  // then λ ← Aᵀ λ_t for step t − 1 (h is the adjoint λ here).
  template <bool FULL, bool TV>
  inline void bwd_run(const Args<scalar_t>& a, int64_t o, const scalar_t* hp, int64_t v0, int64_t v1) const {
    const Vec zero(scalar_t(0));
    auto ld = [&](const scalar_t* p) { return FULL ? Vec::loadu(p) : Vec::loadu(p, tail); };
    auto st = [&](const Vec& x, scalar_t* p) { if (FULL) x.store(p); else x.store(p, tail); };
    for (int64_t v = v0; v < v1; ++v) {
      const int64_t ov = o + v * W;
      const Vec l = h[v] + ld(a.b + ov);
      st(l, a.out + ov);
      const Vec hv = hp ? ld(hp + v * W) : zero;
      if (TV) {
        st(l * hv, a.gP + ov);
        if (HAS_Q) st(l * swap_pairs(hv), a.gQ + ov);
        h[v] = step(ld(a.P + ov), HAS_Q ? swap_pairs(ld(a.Q + ov)) : zero, l);  // Aᵀ λ
      } else {
        gP[v] = at::vec::fmadd(l, hv, gP[v]);
        if (HAS_Q) gQ[v] = at::vec::fmadd(l, swap_pairs(hv), gQ[v]);
        h[v] = step(P[v], Q[v], l);  // Aᵀ λ (Q holds swap(Q) here)
      }
    }
  }

  void backward(const Args<scalar_t>& a, int64_t bi, int64_t s0) const {
    const int64_t S = a.S, L = a.L;
    const Vec zero(scalar_t(0));
    for (int64_t v = 0; v < nv(); ++v) {
      h[v] = a.init ? load(a.init + bi * S + s0, v) : zero;
      gP[v] = zero;
      gQ[v] = zero;
      if (!a.tv) {
        P[v] = load(a.P + s0, v);
        Q[v] = HAS_Q ? swap_pairs(load(a.Q + s0, v)) : zero;  // Aᵀ
      }
    }
    for (int64_t t = L - 1; t >= 0; --t) {
      const int64_t o = (bi * L + t) * S + s0;
      const scalar_t* hp = t > 0 ? a.h + o - S : (a.h0 ? a.h0 + bi * S + s0 : nullptr);
      if (a.reset && a.reset[bi * L + t]) {  // nothing flows into h_{t−1}; ∂a_t = 0
        for (int64_t v = 0; v < nv(); ++v) {
          store(h[v] + load(a.b + o, v), a.out + o, v);
          if (a.tv) {
            store(zero, a.gP + o, v);
            if (HAS_Q) store(zero, a.gQ + o, v);
          }
          h[v] = zero;
        }
        continue;
      }
      if (a.tv) {
        bwd_run<true, true>(a, o, hp, 0, nfull);
        if (tail) bwd_run<false, true>(a, o, hp, nfull, nfull + 1);
      } else {
        bwd_run<true, false>(a, o, hp, 0, nfull);
        if (tail) bwd_run<false, false>(a, o, hp, nfull, nfull + 1);
      }
    }
    for (int64_t v = 0; v < nv(); ++v) {
      store(h[v], a.last + bi * S + s0, v);
      if (!a.tv) {
        store(gP[v], a.gP + bi * S + s0, v);
        if (HAS_Q) store(gQ[v], a.gQ + bi * S + s0, v);
      }
    }
  }
};

template <typename scalar_t, bool HAS_Q>
void run(const Args<scalar_t>& a, bool backward) {
  using Vec = Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  // values per block: kBlockBytes, fewer when that leaves threads idle (a multiple of W, so even)
  int64_t bw = std::max<int64_t>(W, kBlockBytes / int64_t(sizeof(scalar_t)) / W * W);
  const int64_t threads = at::get_num_threads();
  const int64_t want = (threads + a.Bt - 1) / a.Bt;  // blocks per row for every thread to have one
  bw = std::min(bw, std::max<int64_t>(W, ((a.S + want - 1) / want + W - 1) / W * W));
  const int64_t nblk = (a.S + bw - 1) / bw;
  const int64_t nv = Item<scalar_t, HAS_Q>::nv_of(bw);
  at::parallel_for(0, a.Bt * nblk, 1, [&](int64_t begin, int64_t end) {
    FlushDenormals ftz;
    std::vector<Vec> scratch(5 * nv);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t bi = i / nblk, s0 = (i % nblk) * bw, nb = std::min(bw, a.S - s0);
      const Item<scalar_t, HAS_Q> it(nb, scratch.data());
      backward ? it.backward(a, bi, s0) : it.forward(a, bi, s0);
    }
  });
}

void check(const at::Tensor& P, const c10::optional<at::Tensor>& Q, const at::Tensor& b, const c10::optional<at::Tensor>& h0,
           const c10::optional<at::Tensor>& reset) {
  const auto st = b.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble, "float32 or float64 only (complex values as interleaved pairs)");
  TORCH_CHECK(b.dim() == 3, "b must be (Bt, L, S)");
  const int64_t Bt = b.size(0), L = b.size(1), S = b.size(2);
  auto like = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == st, name, ": a contiguous CPU tensor of b's dtype");
  };
  like(b, "b");
  like(P, "P");
  TORCH_CHECK((P.dim() == 1 && P.size(0) == S) || P.sizes() == b.sizes(), "P must be (S,) or (Bt, L, S)");
  if (Q.has_value()) {
    like(*Q, "Q");
    TORCH_CHECK(Q->sizes() == P.sizes(), "Q must be shaped like P");
    TORCH_CHECK(S % 2 == 0, "with Q, S must be even (pairs)");
  }
  if (h0.has_value()) {
    like(*h0, "h0");
    TORCH_CHECK(h0->dim() == 2 && h0->size(0) == Bt && h0->size(1) == S, "h0 must be (Bt, S)");
  }
  if (reset.has_value()) {
    TORCH_CHECK(reset->scalar_type() == at::kBool && reset->is_contiguous() && reset->dim() == 2 && reset->size(0) == Bt &&
                    reset->size(1) == L,
                "reset must be a contiguous (Bt, L) bool tensor");
  }
}

template <typename scalar_t>
void dispatch(const Args<scalar_t>& a, bool backward) {
  if (a.Q) {
    run<scalar_t, true>(a, backward);
  } else {
    run<scalar_t, false>(a, backward);
  }
}

// h_all (Bt, L, S), h_last (Bt, S).
std::vector<at::Tensor> forward(const at::Tensor& P, const c10::optional<at::Tensor>& Q, const at::Tensor& b,
                                const c10::optional<at::Tensor>& h0, const c10::optional<at::Tensor>& reset) {
  check(P, Q, b, h0, reset);
  const int64_t Bt = b.size(0), L = b.size(1), S = b.size(2);
  at::Tensor out = at::empty_like(b), last = at::empty({Bt, S}, b.options());
  AT_DISPATCH_FLOATING_TYPES(b.scalar_type(), "zoo_linear_scan_fwd", [&] {
    Args<scalar_t> a{};
    a.P = P.data_ptr<scalar_t>();
    a.Q = Q.has_value() ? Q->data_ptr<scalar_t>() : nullptr;
    a.b = b.data_ptr<scalar_t>();
    a.init = h0.has_value() ? h0->data_ptr<scalar_t>() : nullptr;
    a.reset = reset.has_value() ? reset->data_ptr<bool>() : nullptr;
    a.out = out.data_ptr<scalar_t>();
    a.last = last.data_ptr<scalar_t>();
    a.tv = P.dim() == 3;
    a.Bt = Bt;
    a.L = L;
    a.S = S;
    dispatch<scalar_t>(a, false);
  });
  return {out, last};
}

// From ∂L/∂h_all (Bt, L, S) and ∂L/∂h_last (Bt, S) or None, with the forward's states h_all:
// ∂P, ∂Q (P's shape; Q's empty without Q), ∂b (Bt, L, S), ∂h0 (Bt, S).
std::vector<at::Tensor> backward(const at::Tensor& P, const c10::optional<at::Tensor>& Q, const at::Tensor& g_all,
                                 const c10::optional<at::Tensor>& g_last, const at::Tensor& h_all,
                                 const c10::optional<at::Tensor>& h0, const c10::optional<at::Tensor>& reset) {
  check(P, Q, g_all, h0, reset);
  TORCH_CHECK(h_all.sizes() == g_all.sizes() && h_all.is_contiguous() && h_all.scalar_type() == g_all.scalar_type(),
              "h_all must be like g_all");
  const int64_t Bt = g_all.size(0), L = g_all.size(1), S = g_all.size(2);
  if (g_last.has_value()) {
    TORCH_CHECK(g_last->is_contiguous() && g_last->scalar_type() == g_all.scalar_type() && g_last->dim() == 2 &&
                    g_last->size(0) == Bt && g_last->size(1) == S,
                "g_last must be (Bt, S)");
  }
  const bool tv = P.dim() == 3;
  at::Tensor gb = at::empty_like(g_all), gh0 = at::empty({Bt, S}, g_all.options());
  at::Tensor gP = tv ? at::empty_like(g_all) : at::empty({Bt, S}, g_all.options());
  at::Tensor gQ = Q.has_value() ? at::empty_like(gP) : at::empty({0}, g_all.options());
  AT_DISPATCH_FLOATING_TYPES(g_all.scalar_type(), "zoo_linear_scan_bwd", [&] {
    Args<scalar_t> a{};
    a.P = P.data_ptr<scalar_t>();
    a.Q = Q.has_value() ? Q->data_ptr<scalar_t>() : nullptr;
    a.b = g_all.data_ptr<scalar_t>();
    a.init = g_last.has_value() ? g_last->data_ptr<scalar_t>() : nullptr;
    a.h = h_all.data_ptr<scalar_t>();
    a.h0 = h0.has_value() ? h0->data_ptr<scalar_t>() : nullptr;
    a.reset = reset.has_value() ? reset->data_ptr<bool>() : nullptr;
    a.out = gb.data_ptr<scalar_t>();
    a.last = gh0.data_ptr<scalar_t>();
    a.gP = gP.data_ptr<scalar_t>();
    a.gQ = Q.has_value() ? gQ.data_ptr<scalar_t>() : nullptr;
    a.tv = tv;
    a.Bt = Bt;
    a.L = L;
    a.S = S;
    dispatch<scalar_t>(a, true);
  });
  if (!tv) {
    gP = gP.sum(0);
    if (Q.has_value()) gQ = gQ.sum(0);
  }
  return {gP, gQ, gb, gh0};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "SSM Zoo: the diagonal (real/complex) and 2x2-block linear scans on CPUs, forward and adjoint backward";
  m.def("forward", &forward, "h_all (Bt, L, S), h_last (Bt, S) from P, Q or None, b, h0 or None, reset or None");
  m.def("backward", &backward, "dP, dQ, db, dh0 from P, Q or None, g_all, g_last or None, h_all, h0 or None, reset or None");
}
