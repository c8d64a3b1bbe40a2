// One residual block's streaming step (one token) around an LTI core, fused: what SequenceModel.step
// runs per block at inference (zoo_core/nn/lean.py). Three cores (zoo_core/stream.py's forms): the
// diagonal complex update (S4D, S5, LRU: diag_block, written out below), S4's bilinear DPLR step
// (dplr_block) and LinOSS's oscillator blocks (osc_block), each beside its core functor.
//
// Why: at batch 1 a token through a block is a few thousand multiply-adds spread over ~13 PyTorch
// ops (norm, the core's update and readout, activation, output map, residual), each paying a
// dispatch of several microseconds; here the whole block is one call. No autograd: the lean step runs
// only with gradients off; the general path (separate ops) stays the reference, and
// tests/test_lean_step.py holds this kernel to it (outputs and states).
//
//   u  = norm(x)                              (prenorm; else u = x)
//   h' = a ⊙ h + B̄ u                          per channel: a, B̄ (H, P) complex, B̄u = B̄[h, p]·u_h
//                                              shared:      a (P,), B̄u = u @ b with b (H, 2P) (re, im interleaved)
//   y  = Σ_p Re(c_hp h'_hp) + d ⊙ u           per channel: c signed (H, P, 2) = (Re c, −Im c)
//                                              shared:      y = h'.flatten() @ c with c (2P, H)
//   v  = out(act(y))                           out: none, linear W (H, H) + b, or GLU W (2H, H) + b
//   z  = x + v (residual; else v), then norm(z) when postnorm
//
// Letters: B batch rows, H model width, P complex states (per channel or shared). The constants arrive
// as real views (..., 2); the state either complex (returned complex) or as its real view. Norms: 0 none, 1 LayerNorm, 2 RMSNorm, 3 a batch norm in eval (running
// statistics: BatchNorm, the EMA batch norm). Activations: 0 identity,
// 1 exact GELU, 2 tanh GELU, 3 SiLU, 4 ReLU. Output maps: 0 none, 1 linear, 2 GLU.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/python.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using at::vec::Vectorized;

// Σ a[i]·b[i] in SIMD lanes with four accumulators. A scalar `acc += a[i] * b[i]` loop is one serial
// chain of dependent adds that the compiler may not reorder (no -ffast-math): it ran at one multiply-add
// per add latency, which made a width-256 Mamba LM's fused step slower than BLAS. The order of the sum
// differs from a sequential one by float rounding only.
template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  using V = Vectorized<T>;
  constexpr int64_t W = V::size();
  V s0(T(0)), s1(T(0)), s2(T(0)), s3(T(0));
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    s0 = at::vec::fmadd(V::loadu(a + i), V::loadu(b + i), s0);
    s1 = at::vec::fmadd(V::loadu(a + i + W), V::loadu(b + i + W), s1);
    s2 = at::vec::fmadd(V::loadu(a + i + 2 * W), V::loadu(b + i + 2 * W), s2);
    s3 = at::vec::fmadd(V::loadu(a + i + 3 * W), V::loadu(b + i + 3 * W), s3);
  }
  for (; i + W <= n; i += W) s0 = at::vec::fmadd(V::loadu(a + i), V::loadu(b + i), s0);
  T acc = at::vec::vec_reduce_all<T>([](V& x, V& y) { return x + y; }, (s0 + s1) + (s2 + s3));
  for (; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Y = X Wᵀ + b for n rows: W (O, I) row-major, X (n, I), Y (n, O); b may be null. Weight-row outer: each
// row of W is read from memory once for all n rows (it stays in L1 while every row's dot uses it), so a
// batch costs its multiply-adds, not n passes over the weights. Where a product has more than 2^18
// multiply-adds its weight rows are split over ATen's intra-op threads (below that a fork costs more than
// it saves). A row's result depends neither on n nor on the threads.
template <typename T>
void linear_rows(const T* W, const T* b, const T* X, T* Y, int64_t O, int64_t I, int64_t n) {
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, n * I));
  at::parallel_for(0, O, grain, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const T* w = W + o * I;
      const T bias = b ? b[o] : T(0);
      for (int64_t r = 0; r < n; ++r) Y[r * O + o] = bias + dot(w, X + r * I, I);
    }
  });
}

struct Norm {  // the block's norm: kind, affine weight and bias (or null), running statistics (batch norms)
  int64_t kind;
  const void* w;
  const void* b;
  const void* mean;
  const void* var;
  double eps;
};

template <typename T>
void norm_row(const T* x, T* out, int64_t H, const Norm& n) {
  const int64_t kind = n.kind;
  const T* w = static_cast<const T*>(n.w);
  const T* b = static_cast<const T*>(n.b);
  const double eps = n.eps;
  if (kind == 0) {
    for (int64_t i = 0; i < H; ++i) out[i] = x[i];
    return;
  }
  if (kind == 3) {  // a batch norm in eval: the stored statistics, per channel
    const T* rm = static_cast<const T*>(n.mean);
    const T* rv = static_cast<const T*>(n.var);
    for (int64_t i = 0; i < H; ++i) {
      T v = (x[i] - rm[i]) / std::sqrt(rv[i] + static_cast<T>(eps));
      if (w) v *= w[i];
      if (b) v += b[i];
      out[i] = v;
    }
    return;
  }
  T mean = 0, var = 0;
  if (kind == 1) {
    for (int64_t i = 0; i < H; ++i) mean += x[i];
    mean /= static_cast<T>(H);
  }
  for (int64_t i = 0; i < H; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<T>(H);
  const T inv = T(1) / std::sqrt(var + static_cast<T>(eps));
  for (int64_t i = 0; i < H; ++i) {
    T v = (x[i] - mean) * inv;
    if (w) v *= w[i];
    if (b) v += b[i];
    out[i] = v;
  }
}

template <typename T>
T activate(T v, int64_t kind) {
  switch (kind) {
    case 1: return T(0.5) * v * (T(1) + std::erf(v * T(M_SQRT1_2)));
    case 2: return T(0.5) * v * (T(1) + std::tanh(T(0.7978845608028654) * (v + T(0.044715) * v * v * v)));
    case 3: return v / (T(1) + std::exp(-v));
    case 4: return v > T(0) || v != v ? v : T(0);  // NaN stays NaN, as torch's relu keeps it
    default: return v;
  }
}

// Whether a core has a batched `rows(B, U, Y)` (C++17 detection: torch before 2.12 builds extensions as C++17).
template <typename Core, typename T, typename = void>
struct batched : std::false_type {};
template <typename Core, typename T>
struct batched<Core, T, std::void_t<decltype(std::declval<const Core&>().rows(int64_t{}, std::declval<const T*>(),
                                                                             std::declval<T*>()))>> : std::true_type {};

// A core's update on every row: its own batched `rows(B, U, Y)` where it has one (its matrices are read
// once for the batch), else `core(r, u, y)` row by row. U, Y (B, H).
template <typename T, typename Core>
void core_rows(const Core& core, int64_t B, int64_t H, const T* U, T* Y) {
  if constexpr (batched<Core, T>::value) {
    core.rows(B, U, Y);
  } else {
    for (int64_t r = 0; r < B; ++r) core(r, U + r * H, Y + r * H);
  }
}

// The block around a core, on every row of X (B, H) into Z (B, H): the core advances each row's state
// from the normalised input U and writes its output Y; everything else is the same for every core.
// Scratch, B rows each: U, Y, W of H and V of 2H.
template <typename T, typename Core>
void block_rows(const T* X, T* Z, int64_t B, int64_t H, const Norm& norm, bool prenorm, int64_t act, int64_t out,
                const T* ow, const T* ob, bool residual, const Core& core, T* U, T* Y, T* V, T* W) {
  for (int64_t r = 0; r < B; ++r) {
    if (prenorm) norm_row(X + r * H, U + r * H, H, norm);
    else std::copy(X + r * H, X + (r + 1) * H, U + r * H);
  }
  core_rows(core, B, H, U, Y);
  for (int64_t i = 0; i < B * H; ++i) Y[i] = activate(Y[i], act);
  if (out == 0) {
    std::copy(Y, Y + B * H, W);
  } else {
    const int64_t O = out == 2 ? 2 * H : H;
    linear_rows(ow, ob, Y, V, O, H, B);
    for (int64_t r = 0; r < B; ++r) {
      const T* vr = V + r * O;
      T* wr = W + r * H;
      if (out == 2) for (int64_t i = 0; i < H; ++i) wr[i] = vr[i] / (T(1) + std::exp(-vr[H + i]));
      else std::copy(vr, vr + H, wr);
    }
  }
  for (int64_t r = 0; r < B; ++r) {
    const T* xr = X + r * H;
    T* wr = W + r * H;
    if (residual) for (int64_t i = 0; i < H; ++i) wr[i] = xr[i] + wr[i];
    if (prenorm) std::copy(wr, wr + H, Z + r * H);
    else norm_row(wr, Z + r * H, H, norm);
  }
}

template <typename T, typename Core>
void run_block(const at::Tensor& x, at::Tensor& z, const Norm& norm, bool prenorm, int64_t act, int64_t out,
               const T* ow, const T* ob, bool residual, Core core) {
  const int64_t B = x.size(0), H = x.size(1);
  std::vector<T> scratch(5 * B * H);
  T* S = scratch.data();
  block_rows(x.data_ptr<T>(), z.data_ptr<T>(), B, H, norm, prenorm, act, out, ow, ob, residual, core, S, S + B * H,
             S + 2 * B * H, S + 4 * B * H);
}

// Diagonal complex update (S4D per channel; S5, LRU shared): see the top of the file.
template <typename T>
struct DiagCore {
  const T *Hs, *A, *Bm, *C, *D;
  T* Hn;
  int64_t H, P;
  bool per_channel;
  void operator()(int64_t r, const T* u, T* y) const {
    if (per_channel) {  // state (H, P, 2) per row
      const T* hr = Hs + r * H * P * 2;
      T* nr = Hn + r * H * P * 2;
      for (int64_t i = 0; i < H; ++i) {
        T acc = 0;
        const T ui = u[i];
        for (int64_t p = 0; p < P; ++p) {
          const int64_t k = (i * P + p) * 2;
          const T re = A[k] * hr[k] - A[k + 1] * hr[k + 1] + Bm[k] * ui;
          const T im = A[k] * hr[k + 1] + A[k + 1] * hr[k] + Bm[k + 1] * ui;
          nr[k] = re;
          nr[k + 1] = im;
          acc += C[k] * re + C[k + 1] * im;
        }
        y[i] = acc + D[i] * ui;
      }
      return;
    }
    const T* hr = Hs + r * P * 2;  // state (P, 2) per row; b (H, 2P), c (2P, H)
    T* nr = Hn + r * P * 2;
    for (int64_t k = 0; k < 2 * P; ++k) nr[k] = 0;
    for (int64_t i = 0; i < H; ++i) {  // u @ b by rows of b: contiguous, and each nr[k] summed over i in order
      const T ui = u[i];
      const T* bi = Bm + i * 2 * P;
      for (int64_t k = 0; k < 2 * P; ++k) nr[k] += ui * bi[k];
    }
    for (int64_t p = 0; p < P; ++p) {
      nr[2 * p] += A[2 * p] * hr[2 * p] - A[2 * p + 1] * hr[2 * p + 1];
      nr[2 * p + 1] += A[2 * p] * hr[2 * p + 1] + A[2 * p + 1] * hr[2 * p];
    }
    for (int64_t i = 0; i < H; ++i) y[i] = D[i] * u[i];
    for (int64_t k = 0; k < 2 * P; ++k) {
      const T s = nr[k];
      const T* ck = C + k * H;
      for (int64_t i = 0; i < H; ++i) y[i] += s * ck[i];
    }
  }
};

// S4's bilinear DPLR step on the half state (zoo_core.stream.DPLRStream), per channel, M states:
//   q = 2 Re(conj(P)·x); x ← E x − P q + B2 u; r = 2 Re(R x); x ← Dm (x − P r); y = 2 Re(C x) + d u
// Every matrix (H, M, 2) as a real view; the state (H, M, 2) per row.
template <typename T>
struct DPLRCore {
  const T *Hs, *E, *Dm, *Pm, *B2, *R, *C, *D;
  T* Hn;
  int64_t H, M;
  void operator()(int64_t r, const T* u, T* y) const {
    for (int64_t i = 0; i < H; ++i) {
      const int64_t o = i * M * 2;
      const T* hr = Hs + r * H * M * 2 + o;
      T* nr = Hn + r * H * M * 2 + o;
      const T ui = u[i];
      T q = 0;
      for (int64_t m = 0; m < M; ++m) q += Pm[o + 2 * m] * hr[2 * m] + Pm[o + 2 * m + 1] * hr[2 * m + 1];
      q *= T(2);
      T rr = 0;
      for (int64_t m = 0; m < M; ++m) {  // the first half step, kept in nr
        const int64_t k = o + 2 * m;
        const T xr = E[k] * hr[2 * m] - E[k + 1] * hr[2 * m + 1] - Pm[k] * q + B2[k] * ui;
        const T xi = E[k] * hr[2 * m + 1] + E[k + 1] * hr[2 * m] - Pm[k + 1] * q + B2[k + 1] * ui;
        nr[2 * m] = xr;
        nr[2 * m + 1] = xi;
        rr += R[k] * xr - R[k + 1] * xi;
      }
      rr *= T(2);
      T acc = 0;
      for (int64_t m = 0; m < M; ++m) {
        const int64_t k = o + 2 * m;
        const T xr = nr[2 * m] - Pm[k] * rr, xi = nr[2 * m + 1] - Pm[k + 1] * rr;
        const T re = Dm[k] * xr - Dm[k + 1] * xi, im = Dm[k] * xi + Dm[k + 1] * xr;
        nr[2 * m] = re;
        nr[2 * m + 1] = im;
        acc += C[k] * re - C[k + 1] * im;
      }
      y[i] = T(2) * acc + D[i] * ui;
    }
  }
};

// LinOSS's oscillators (zoo_core.stream.BlockStream): real K×K blocks a (P, K, K) on each pair, a
// complex input map b (P, H, K, 2), readout y = Re(C h[..., 1]) + d u with c (H, P, 2); the state
// (P, K, 2) per row, real and imaginary parts evolving apart.
template <typename T>
struct OscCore {
  const T *Hs, *A, *Bm, *C, *D;
  T* Hn;
  int64_t H, P, K;
  void operator()(int64_t r, const T* u, T* y) const {
    const T* hr = Hs + r * P * K * 2;
    T* nr = Hn + r * P * K * 2;
    for (int64_t p = 0; p < P; ++p) {
      for (int64_t i = 0; i < K; ++i) {
        T re = 0, im = 0;
        for (int64_t j = 0; j < K; ++j) {
          const T a = A[(p * K + i) * K + j];
          re += a * hr[(p * K + j) * 2];
          im += a * hr[(p * K + j) * 2 + 1];
        }
        for (int64_t h = 0; h < H; ++h) {
          const int64_t k = ((p * H + h) * K + i) * 2;
          re += u[h] * Bm[k];
          im += u[h] * Bm[k + 1];
        }
        nr[(p * K + i) * 2] = re;
        nr[(p * K + i) * 2 + 1] = im;
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      T acc = D[h] * u[h];
      for (int64_t p = 0; p < P; ++p) {
        const int64_t k = (p * K + 1) * 2;  // the pair's second component (position)
        acc += C[(h * P + p) * 2] * nr[k] - C[(h * P + p) * 2 + 1] * nr[k + 1];
      }
      y[h] = acc;
    }
  }
};

// Mamba-1's mixer (zoo_core.stream.SelectiveStream; zoo_mamba.core.Mamba.step): from the block's
// normalised input u (H),
//   [x, z] = W_in u + b_in                           (2Di)
//   c      = conv_b + Σ_j w_j·[past, x]_j            the depthwise causal conv's window (K); past ← its last K−1
//   v      = SiLU(c)
//   [δ, B, C] = W_x v                                (R, N, N); B or C a fixed (Di, N) matrix where given
//   Δ      = softplus(W_dt δ + b_dt)                 (Di), or softplus(b_dt) where Δ is time-invariant
//   h      = exp(Δ·A) ⊙ h + (Δ·v) ⊗ B                (Di, N)
//   y      = W_out ((h·C + D⊙v) ⊙ SiLU(z)) + b_out   (H)
// State per row: conv (Di, K−1), ssm (Di, N). Absent tensors: null pointers (R = 0 without W_dt).
template <typename T>
struct SelectiveCore {
  const T *Cs, *Ss;
  T *Cn, *Sn;
  const T *Wi, *bi, *Wc, *bc, *Wx, *Wdt, *bdt, *A, *Bf, *Cf, *D, *Wo, *bo;
  int64_t H, Di, N, K, R;
  T* scratch;  // per row: 2Di (x, z) + Di (v) + R + 2N (W_x v) + Di (y); Di (Δ) once (selective_scratch)
  static T softplus(T x) { return x > T(20) ? x : std::log1p(std::exp(x)); }  // F.softplus (threshold 20)
  static T silu(T x) { return x / (T(1) + std::exp(-x)); }
  // Every row at once: the three projections as linear_rows over the batch (each weight read once), the
  // conv and the scan row by row. U (B, H), OUT (B, H).
  void rows(int64_t B, const T* U, T* OUT) const {
    const int64_t P = R + (Bf ? 0 : N) + (Cf ? 0 : N);  // W_x's rows: what is input-dependent
    T* XZ = scratch;
    T* V = XZ + B * 2 * Di;
    T* PR = V + B * Di;
    T* Yb = PR + B * P;
    T* delta = Yb + B * Di;
    linear_rows(Wi, bi, U, XZ, 2 * Di, H, B);
    for (int64_t r = 0; r < B; ++r) conv_row(r, XZ + r * 2 * Di, V + r * Di);
    linear_rows(Wx, static_cast<const T*>(nullptr), V, PR, P, Di, B);
    for (int64_t r = 0; r < B; ++r) scan_row(r, XZ + r * 2 * Di, V + r * Di, PR + r * P, delta, Yb + r * Di);
    linear_rows(Wo, bo, Yb, OUT, H, Di, B);
  }
  // The causal conv's window for row r: v = SiLU(conv(past, x)), the window shifted by one.
  void conv_row(int64_t r, const T* xz, T* v) const {
    const T* past = Cs + r * Di * (K - 1);
    T* next = Cn + r * Di * (K - 1);
    for (int64_t c = 0; c < Di; ++c) {
      const T* w = Wc + c * K;
      const T* pc = past + c * (K - 1);
      T acc = bc ? bc[c] : T(0);
      for (int64_t j = 0; j < K - 1; ++j) acc += w[j] * pc[j];
      acc += w[K - 1] * xz[c];
      T* nc = next + c * (K - 1);
      for (int64_t j = 0; j + 1 < K - 1; ++j) nc[j] = pc[j + 1];
      if (K > 1) nc[K - 2] = xz[c];
      v[c] = silu(acc);
    }
  }
  // Row r's Δ, state update and gated readout y (Di) from its [x, z], v and W_x v (proj).
  void scan_row(int64_t r, const T* xz, const T* v, const T* proj, T* delta, T* y) const {
    const T* Bt = Bf ? nullptr : proj + R;
    const T* Ct = Cf ? nullptr : proj + R + (Bf ? 0 : N);
    for (int64_t c = 0; c < Di; ++c) {
      delta[c] = softplus(Wdt ? bdt[c] + dot(Wdt + c * R, proj, R) : bdt[c]);
    }
    const T* hs = Ss + r * Di * N;
    T* hn = Sn + r * Di * N;
    for (int64_t c = 0; c < Di; ++c) {
      const T dc = delta[c], du = dc * v[c];
      const T* Ac = A + c * N;
      const T* Bc = Bt ? Bt : Bf + c * N;
      const T* Cc = Ct ? Ct : Cf + c * N;
      const T* hc = hs + c * N;
      T* nc = hn + c * N;
      using V = Vectorized<T>;
      V sum(T(0));
      int64_t n = 0;
      for (; n + V::size() <= N; n += V::size()) {  // the state in SIMD lanes, each lane its own exp
        const V h = at::vec::fmadd((V(dc) * V::loadu(Ac + n)).exp(), V::loadu(hc + n), V(du) * V::loadu(Bc + n));
        h.store(nc + n);
        sum = at::vec::fmadd(h, V::loadu(Cc + n), sum);
      }
      T acc = at::vec::vec_reduce_all<T>([](V& x, V& y) { return x + y; }, sum);
      for (; n < N; ++n) {
        const T h = std::exp(dc * Ac[n]) * hc[n] + du * Bc[n];
        nc[n] = h;
        acc += h * Cc[n];
      }
      if (D) acc += D[c] * v[c];
      y[c] = acc * silu(xz[Di + c]);
    }
  }
};

// The selective form's sizes from its tensors (W_in, b_in, W_conv, b_conv, W_x, W_dt, b_dt, A, B, C, D,
// W_out, b_out; an absent one empty), checked: H, Di, N, K, R.
std::vector<int64_t> selective_sizes(const std::vector<at::Tensor>& t) {
  TORCH_CHECK(t.size() == 13, "selective: 13 tensors (W_in, b_in, W_conv, b_conv, W_x, W_dt, b_dt, A, B, C, D, W_out, b_out)");
  auto has = [&](int i) { return t[i].numel() > 0; };
  TORCH_CHECK(t[2].dim() == 2 && t[7].dim() == 2 && t[0].dim() == 2, "selective: W_conv (Di, K), A (Di, N), W_in (2Di, H)");
  const int64_t Di = t[2].size(0), K = t[2].size(1), N = t[7].size(1), H = t[0].size(1);
  const int64_t R = has(5) ? t[5].size(1) : 0;
  TORCH_CHECK(K >= 1 && t[0].size(0) == 2 * Di && t[7].size(0) == Di, "selective: W_in (2Di, H), A (Di, N)");
  TORCH_CHECK(!has(1) || t[1].numel() == 2 * Di, "selective: b_in (2Di,)");
  TORCH_CHECK(!has(3) || t[3].numel() == Di, "selective: b_conv (Di,)");
  TORCH_CHECK(!has(5) || (t[5].dim() == 2 && t[5].size(0) == Di), "selective: W_dt (Di, R)");
  TORCH_CHECK(t[6].numel() == Di, "selective: b_dt (Di,)");
  for (int i : {8, 9}) TORCH_CHECK(!has(i) || (t[i].dim() == 2 && t[i].size(0) == Di && t[i].size(1) == N), "selective: fixed B, C (Di, N)");
  const int64_t P = R + (has(8) ? 0 : N) + (has(9) ? 0 : N);
  TORCH_CHECK(P == 0 ? !has(4) : (has(4) && t[4].dim() == 2 && t[4].size(0) == P && t[4].size(1) == Di),
              "selective: W_x (R + input-dependent N's, Di)");
  TORCH_CHECK(!has(10) || t[10].numel() == Di, "selective: D (Di,)");
  TORCH_CHECK(t[11].dim() == 2 && t[11].size(0) == H && t[11].size(1) == Di, "selective: W_out (H, Di)");
  TORCH_CHECK(!has(12) || t[12].numel() == H, "selective: b_out (H,)");
  return {H, Di, N, K, R};
}

template <typename T>
SelectiveCore<T> selective_core(const std::vector<at::Tensor>& t, const std::vector<int64_t>& n, const T* conv,
                                const T* ssm, T* conv_new, T* ssm_new, T* scratch) {
  auto p = [&](int i) -> const T* { return t[i].numel() > 0 ? t[i].data_ptr<T>() : nullptr; };
  return SelectiveCore<T>{conv, ssm, conv_new, ssm_new, p(0), p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9),
                          p(10), p(11), p(12), n[0], n[1], n[2], n[3], n[4], scratch};
}

// The selective core's scratch for B rows.
int64_t selective_scratch(const std::vector<int64_t>& n, int64_t B) { return B * (4 * n[1] + n[4] + 2 * n[2]) + n[1]; }

// The block's parts other than the core, checked once: the norm, the output map, their dtype.
struct Common {
  int64_t norm;
  c10::optional<at::Tensor> nw, nb, nm, nv;
  double eps;
  bool prenorm;
  int64_t act, out;
  c10::optional<at::Tensor> ow, ob;
  bool residual;
};

Common common(const at::Tensor& x, int64_t norm, c10::optional<at::Tensor> norm_w, c10::optional<at::Tensor> norm_b,
              c10::optional<at::Tensor> norm_mean, c10::optional<at::Tensor> norm_var, double eps, bool prenorm,
              int64_t act, int64_t out, c10::optional<at::Tensor> out_w, c10::optional<at::Tensor> out_b, bool residual) {
  TORCH_CHECK(x.dim() == 2, "stream_block: x must be (B, H)");
  TORCH_CHECK(x.device().is_cpu(), "stream_block: CPU tensors only");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "stream_block: float32 or float64");
  const int64_t H = x.size(1);
  auto cont = [&](const c10::optional<at::Tensor>& t) -> c10::optional<at::Tensor> {
    if (!t.has_value() || !t->defined()) return c10::nullopt;
    TORCH_CHECK(t->scalar_type() == dtype && t->device().is_cpu(), "stream_block: every tensor in x's dtype, on the CPU");
    return t->contiguous();
  };
  Common c{norm, cont(norm_w), cont(norm_b), cont(norm_mean), cont(norm_var), eps, prenorm, act, out, cont(out_w),
           cont(out_b), residual};
  TORCH_CHECK(norm >= 0 && norm <= 3, "stream_block: norm kind 0..3");
  TORCH_CHECK(act >= 0 && act <= 4, "stream_block: activation kind 0..4");
  TORCH_CHECK(out >= 0 && out <= 2, "stream_block: output kind 0..2");
  TORCH_CHECK(norm != 3 || (c.nm.has_value() && c.nv.has_value() && c.nm->numel() == H && c.nv->numel() == H),
              "stream_block: a batch norm needs its running mean and variance (H,)");
  for (const auto* t : {&c.nw, &c.nb}) TORCH_CHECK(!t->has_value() || (*t)->numel() == H, "stream_block: norm weight/bias (H,)");
  if (out != 0) {
    const int64_t O = out == 2 ? 2 * H : H;
    TORCH_CHECK(c.ow.has_value() && c.ow->dim() == 2 && c.ow->size(0) == O && c.ow->size(1) == H,
                "stream_block: the output map's weight must be (", O, ", H)");
    TORCH_CHECK(!c.ob.has_value() || c.ob->numel() == O, "stream_block: the output map's bias must be (", O, ",)");
  }
  return c;
}

template <typename T>
const T* optp(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

// A complex state is read and written through its real view and returned complex, like it came.
at::Tensor real_state(const at::Tensor& h) {
  return h.is_complex() ? at::view_as_real(h.contiguous()).contiguous() : h.contiguous();
}

at::Tensor same_form(const at::Tensor& hn, const at::Tensor& h) {
  return h.is_complex() ? at::view_as_complex(hn) : hn;
}

at::Tensor checked(const at::Tensor& t, const at::Tensor& x, const char* what) {
  TORCH_CHECK(t.scalar_type() == x.scalar_type() && t.device().is_cpu(), "stream_block: ", what,
              " must be in x's dtype, on the CPU");
  return t.contiguous();
}

#define ZOO_COMMON_ARGS                                                                                              \
  int64_t norm, c10::optional<at::Tensor> norm_w, c10::optional<at::Tensor> norm_b,                                  \
      c10::optional<at::Tensor> norm_mean, c10::optional<at::Tensor> norm_var, double eps, bool prenorm, int64_t act, \
      int64_t out, c10::optional<at::Tensor> out_w, c10::optional<at::Tensor> out_b, bool residual
#define ZOO_COMMON_PASS norm, norm_w, norm_b, norm_mean, norm_var, eps, prenorm, act, out, out_w, out_b, residual

template <typename T, typename Core>
void run(const at::Tensor& x, at::Tensor& z, const Common& c, Core core) {
  const Norm n{c.norm, optp<T>(c.nw), optp<T>(c.nb), optp<T>(c.nm), optp<T>(c.nv), c.eps};
  run_block<T>(x, z, n, c.prenorm, c.act, c.out, optp<T>(c.ow), optp<T>(c.ob), c.residual, core);
}

// Allocate z and the new state, run the core `make(T{}, hn)` returns for x's dtype T over every row, and
// return z with the new state in the form h came in (complex or its real view).
template <typename Make>
std::vector<at::Tensor> launch(const at::Tensor& x, const at::Tensor& h, const at::Tensor& hs, const Common& cm, Make make) {
  auto z = at::empty_like(x);
  auto hn = at::empty_like(hs);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "stream_block", [&] { run<scalar_t>(x, z, cm, make(scalar_t{}, hn)); });
  return {z, same_form(hn, h)};
}

std::vector<at::Tensor> diag_block(at::Tensor x, at::Tensor h, at::Tensor a, at::Tensor b, at::Tensor c, at::Tensor d,
                                   bool per_channel, ZOO_COMMON_ARGS) {
  const Common cm = common(x, ZOO_COMMON_PASS);
  x = x.contiguous();
  const int64_t H = x.size(1);
  at::Tensor hs = checked(real_state(h), x, "the state");
  a = checked(a, x, "a"); b = checked(b, x, "b"); c = checked(c, x, "c"); d = checked(d, x, "d");
  const int64_t P = per_channel ? a.size(1) : a.size(0);
  if (per_channel) {
    TORCH_CHECK(a.dim() == 3 && a.size(0) == H && a.size(2) == 2, "diag_block: per-channel a must be (H, P, 2)");
    TORCH_CHECK(b.sizes() == a.sizes() && c.sizes() == a.sizes(), "diag_block: per-channel b, c must be (H, P, 2)");
    TORCH_CHECK(hs.dim() == 4 && hs.size(0) == x.size(0) && hs.size(1) == H && hs.size(2) == P && hs.size(3) == 2,
                "diag_block: per-channel state must be (B, H, P) complex or (B, H, P, 2)");
  } else {
    TORCH_CHECK(a.dim() == 2 && a.size(1) == 2, "diag_block: shared a must be (P, 2)");
    TORCH_CHECK(b.dim() == 2 && b.size(0) == H && b.size(1) == 2 * P, "diag_block: shared b must be (H, 2P)");
    TORCH_CHECK(c.dim() == 2 && c.size(0) == 2 * P && c.size(1) == H, "diag_block: shared c must be (2P, H)");
    TORCH_CHECK(hs.dim() == 3 && hs.size(0) == x.size(0) && hs.size(1) == P && hs.size(2) == 2,
                "diag_block: shared state must be (B, P) complex or (B, P, 2)");
  }
  TORCH_CHECK(d.numel() == H, "diag_block: d must be (H,)");
  return launch(x, h, hs, cm, [&](auto zero, at::Tensor& hn) {
    using T = decltype(zero);
    return DiagCore<T>{hs.data_ptr<T>(), a.data_ptr<T>(), b.data_ptr<T>(), c.data_ptr<T>(), d.data_ptr<T>(),
                       hn.data_ptr<T>(), H, P, per_channel};
  });
}

std::vector<at::Tensor> dplr_block(at::Tensor x, at::Tensor h, at::Tensor E, at::Tensor Dm, at::Tensor P, at::Tensor B2,
                                   at::Tensor R, at::Tensor C, at::Tensor d, ZOO_COMMON_ARGS) {
  const Common cm = common(x, ZOO_COMMON_PASS);
  x = x.contiguous();
  const int64_t H = x.size(1);
  at::Tensor hs = checked(real_state(h), x, "the state");
  for (auto* t : {&E, &Dm, &P, &B2, &R, &C}) {
    *t = checked(*t, x, "a step matrix");
    TORCH_CHECK(t->dim() == 3 && t->size(0) == H && t->size(2) == 2 && t->sizes() == E.sizes(),
                "dplr_block: every step matrix must be (H, M, 2)");
  }
  d = checked(d, x, "d");
  TORCH_CHECK(d.numel() == H, "dplr_block: d must be (H,)");
  const int64_t M = E.size(1);
  TORCH_CHECK(hs.dim() == 4 && hs.size(0) == x.size(0) && hs.size(1) == H && hs.size(2) == M && hs.size(3) == 2,
              "dplr_block: the state must be (B, H, M) complex or (B, H, M, 2)");
  return launch(x, h, hs, cm, [&](auto zero, at::Tensor& hn) {
    using T = decltype(zero);
    return DPLRCore<T>{hs.data_ptr<T>(), E.data_ptr<T>(), Dm.data_ptr<T>(), P.data_ptr<T>(), B2.data_ptr<T>(),
                       R.data_ptr<T>(), C.data_ptr<T>(), d.data_ptr<T>(), hn.data_ptr<T>(), H, M};
  });
}

std::vector<at::Tensor> osc_block(at::Tensor x, at::Tensor h, at::Tensor a, at::Tensor b, at::Tensor c, at::Tensor d,
                                  ZOO_COMMON_ARGS) {
  const Common cm = common(x, ZOO_COMMON_PASS);
  x = x.contiguous();
  const int64_t H = x.size(1);
  at::Tensor hs = checked(real_state(h), x, "the state");
  a = checked(a, x, "a"); b = checked(b, x, "b"); c = checked(c, x, "c"); d = checked(d, x, "d");
  TORCH_CHECK(a.dim() == 3 && a.size(1) == a.size(2) && a.size(1) >= 2, "osc_block: a must be (P, K, K), K >= 2");
  const int64_t P = a.size(0), K = a.size(1);
  TORCH_CHECK(b.dim() == 4 && b.size(0) == P && b.size(1) == H && b.size(2) == K && b.size(3) == 2,
              "osc_block: b must be (P, H, K, 2)");
  TORCH_CHECK(c.dim() == 3 && c.size(0) == H && c.size(1) == P && c.size(2) == 2, "osc_block: c must be (H, P, 2)");
  TORCH_CHECK(d.numel() == H, "osc_block: d must be (H,)");
  TORCH_CHECK(hs.dim() == 4 && hs.size(0) == x.size(0) && hs.size(1) == P && hs.size(2) == K && hs.size(3) == 2,
              "osc_block: the state must be (B, P, K) complex or (B, P, K, 2)");
  return launch(x, h, hs, cm, [&](auto zero, at::Tensor& hn) {
    using T = decltype(zero);
    return OscCore<T>{hs.data_ptr<T>(), a.data_ptr<T>(), b.data_ptr<T>(), c.data_ptr<T>(), d.data_ptr<T>(),
                      hn.data_ptr<T>(), H, P, K};
  });
}

std::vector<at::Tensor> selective_block(at::Tensor x, at::Tensor conv, at::Tensor ssm, std::vector<at::Tensor> t,
                                        ZOO_COMMON_ARGS) {
  const Common cm = common(x, ZOO_COMMON_PASS);
  x = x.contiguous();
  for (auto& u : t) u = u.numel() > 0 ? checked(u, x, "a selective tensor") : u;
  const auto n = selective_sizes(t);
  TORCH_CHECK(n[0] == x.size(1), "selective_block: W_in must be (2Di, H)");
  conv = checked(conv, x, "the conv state");
  ssm = checked(ssm, x, "the ssm state");
  TORCH_CHECK(conv.dim() == 3 && conv.size(0) == x.size(0) && conv.size(1) == n[1] && conv.size(2) == n[3] - 1,
              "selective_block: the conv state must be (B, Di, K-1)");
  TORCH_CHECK(ssm.dim() == 3 && ssm.size(0) == x.size(0) && ssm.size(1) == n[1] && ssm.size(2) == n[2],
              "selective_block: the ssm state must be (B, Di, N)");
  auto z = at::empty_like(x);
  auto cn = at::empty_like(conv);
  auto sn = at::empty_like(ssm);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "selective_block", [&] {
    std::vector<scalar_t> scratch(selective_scratch(n, x.size(0)));
    run<scalar_t>(x, z, cm, selective_core<scalar_t>(t, n, conv.data_ptr<scalar_t>(), ssm.data_ptr<scalar_t>(),
                                                     cn.data_ptr<scalar_t>(), sn.data_ptr<scalar_t>(), scratch.data()));
  });
  return {z, cn, sn};
}

// ---------------------------------------------------------------------------------------------------
// The whole model's step in one call (zoo_core/nn/lean.py's StepProgram): encoder (linear or
// embedding), every depth position's block as above with the stack's damping, the final norm, the
// head and the pool's running state, for models made only of parts this file computes. Built once from
// the model's tensors and settings, which it keeps; every call first checks, in C++, that nothing it
// took them from has changed since (see `stale`), else answers STALE and the caller builds it again.
// A call it does not take (another dtype, a state of another form, autocast, a dispatch mode, a token
// out of range) answers DECLINED and the caller runs the plan, which raises what the general path
// raises. Answers: a (output, ModelState) tuple, or the int DECLINED (0) / STALE (1).

namespace py = pybind11;

constexpr int DECLINED = 0;
constexpr int STALE = 1;

// A tensor this file may read or write through its data pointer: dense, on the CPU, no lazy conjugate
// or negation, not a wrapper (fake, functional, vmap's, a Python subclass: those are traced, not run).
bool plain(const at::Tensor& t) {
  static const c10::DispatchKeySet wrapped({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                            c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper});
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.has_storage() && !t.is_conj() &&
         !t.is_neg() && !t.key_set().has_any(wrapped);
}

// A Python object as a plain tensor of exactly torch.Tensor's type, else nullopt.
c10::optional<at::Tensor> tensor_of(PyObject* o) {
  if (o == nullptr || !THPVariable_CheckExact(o)) return c10::nullopt;
  at::Tensor t = THPVariable_Unpack(o);
  if (!plain(t)) return c10::nullopt;
  return t;
}

// One entry of a watched object's __dict__ as the program was built: held weakly where it can be
// (modules, functions: the program must not keep the model alive through them, e.g. through a hook
// that refers to the model), else strongly (tensors, numbers, strings, tuples); a dict's or a list's
// contents one level down instead of the container itself (a module's _parameters, _modules, hook
// dicts; a schedule); a set by its size.
struct Seen {
  enum Kind { WEAK, STRONG, DICT, LIST, SET } kind = STRONG;
  py::object key;  // the dict's key (None in a list)
  py::object ref;  // WEAK: a weakref to the value; STRONG: the value
  std::vector<Seen> inner;
  Py_ssize_t size = 0;

  Seen(PyObject* k, PyObject* v, bool deep) : key(py::reinterpret_borrow<py::object>(k)) {
    if (deep && PyDict_Check(v)) {
      kind = DICT;
      Py_ssize_t pos = 0;
      PyObject *kk, *x;
      while (PyDict_Next(v, &pos, &kk, &x)) inner.emplace_back(kk, x, false);
    } else if (deep && PyList_Check(v)) {
      kind = LIST;
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); ++i) inner.emplace_back(Py_None, PyList_GET_ITEM(v, i), false);
    } else if (PyAnySet_Check(v)) {
      kind = SET;
      size = PySet_GET_SIZE(v);
    } else if (THPVariable_Check(v)) {  // held (a tensor does not refer to the model; a weakref to it would make
      ref = py::reinterpret_borrow<py::object>(v);  // torch.utils.swap_tensors refuse it)
    } else if (PyObject* w = PyWeakref_NewRef(v, nullptr)) {
      kind = WEAK;
      ref = py::reinterpret_steal<py::object>(w);
    } else {  // not weakly referenceable: held
      PyErr_Clear();
      ref = py::reinterpret_borrow<py::object>(v);
    }
  }

  // Whether the entry (k, v) now is what was seen.
  bool same(PyObject* k, PyObject* v) const {
    if (k != key.ptr()) return false;
    switch (kind) {
      case WEAK: {
        PyObject* was = PyWeakref_GetObject(ref.ptr());  // None once the value is gone
        return was != Py_None && was == v;
      }
      case STRONG: return v == ref.ptr();
      case SET: return PyAnySet_Check(v) && PySet_GET_SIZE(v) == size;
      case DICT: {
        if (!PyDict_Check(v) || PyDict_Size(v) != static_cast<Py_ssize_t>(inner.size())) return false;
        Py_ssize_t pos = 0;
        PyObject *kk, *x;
        size_t i = 0;
        while (PyDict_Next(v, &pos, &kk, &x))
          if (!inner[i++].same(kk, x)) return false;
        return true;
      }
      case LIST: {
        if (!PyList_Check(v) || PyList_GET_SIZE(v) != static_cast<Py_ssize_t>(inner.size())) return false;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); ++i)
          if (!inner[i].same(Py_None, PyList_GET_ITEM(v, i))) return false;
        return true;
      }
    }
    return false;
  }
};

// A watched object (every module of the model, its pool), held weakly where it can be, and its
// __dict__'s entries as the program was built (in order: a key deleted and added again is a change),
// but the entry named `skip` (where the model keeps this program: zoo_core.nn.lean).
struct ObjectWatch {
  py::object ref;
  bool weak = false;
  PyObject* skip;  // borrowed: the program holds it
  std::vector<Seen> entries;

  static PyObject* dict_of(PyObject* o) {  // a new reference, or null (no __dict__)
    PyObject* d = PyObject_GenericGetDict(o, nullptr);
    if (d == nullptr) PyErr_Clear();
    return d;
  }

  ObjectWatch(py::handle o, PyObject* skip_key) : skip(skip_key) {
    if (PyObject* w = PyWeakref_NewRef(o.ptr(), nullptr)) {
      ref = py::reinterpret_steal<py::object>(w);
      weak = true;
    } else {
      PyErr_Clear();
      ref = py::reinterpret_borrow<py::object>(o);
    }
    PyObject* d = dict_of(o.ptr());
    if (d == nullptr) return;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v))
      if (k != skip) entries.emplace_back(k, v, true);
    Py_DECREF(d);
  }

  bool same() const {
    PyObject* o = weak ? PyWeakref_GetObject(ref.ptr()) : ref.ptr();
    if (o == Py_None) return false;
    PyObject* d = dict_of(o);
    if (d == nullptr) return entries.empty();
    bool ok = true;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    size_t i = 0;
    while (ok && PyDict_Next(d, &pos, &k, &v)) {
      if (k == skip) continue;
      ok = i < entries.size() && entries[i].same(k, v);
      ++i;
    }
    Py_DECREF(d);
    return ok && i == entries.size();
  }
};

// A watched tensor (every parameter and buffer): the Python object (held: it does not refer to the
// model, and holding it keeps torch.utils.swap_tensors working, which a C++ reference would not) and
// what it was when the program was built: its TensorImpl (swap_tensors replaces it), storage (held, so
// its address cannot be handed to another allocation), data pointer, offset, sizes, strides, dtype and
// in-place version. An edit through `.data` that keeps all of those (an in-place op on `p.data`) is not
// seen, as `CoreBase.cached` does not see it either.
struct TensorWatch {
  py::object obj;
  const c10::TensorImpl* impl;
  bool stored, versioned = true;
  c10::Storage storage;
  const void* data = nullptr;
  int64_t offset = 0, version = 0;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;

  explicit TensorWatch(py::handle o) : obj(py::reinterpret_borrow<py::object>(o)) {
    TORCH_CHECK(THPVariable_Check(o.ptr()), "StepProgram: a watched tensor must be a tensor");
    const at::Tensor& t = THPVariable_Unpack(o.ptr());
    impl = t.unsafeGetTensorImpl();
    stored = t.has_storage() && t.layout() == at::kStrided;
    if (stored) {
      storage = t.storage();
      data = t.data_ptr();
      offset = t.storage_offset();
      strides = t.strides().vec();
    }
    sizes = t.sizes().vec();
    dtype = t.scalar_type();
    try {
      version = t._version();
    } catch (const c10::Error&) {  // no version counter (an inference tensor): the caller keeps those out
      versioned = false;
    }
  }

  bool changed() const {
    const at::Tensor& t = THPVariable_Unpack(obj.ptr());
    if (t.unsafeGetTensorImpl() != impl || t.scalar_type() != dtype || t.sizes() != at::IntArrayRef(sizes)) return true;
    if (stored && (!t.has_storage() || t.storage().unsafeGetStorageImpl() != storage.unsafeGetStorageImpl() ||
                   t.data_ptr() != data || t.storage_offset() != offset || t.strides() != at::IntArrayRef(strides)))
      return true;
    return versioned && t._version() != version;
  }
};

struct StateSpec {  // one named state tensor of a position: its shape without the batch
  std::string key;
  py::object name;          // the key as a Python str, made once
  std::vector<int64_t> shape;  // a complex state: its real view's, (..., 2)
  bool complex_ok;          // the state may come complex (the linear forms' "h")
};

struct Part {  // one depth position: its block's core form and settings, and the stack's damping there
  int64_t core;  // 0 diag, 1 dplr, 2 osc, 3 selective
  bool per_channel;
  std::vector<at::Tensor> t;
  Common c;
  double alpha;                            // the stack's damping at this position, fixed
  c10::optional<at::Tensor> alpha_logit;   // or learned: sigmoid(logit[alpha_index]), read at each call
  int64_t alpha_index = 0;
  std::vector<StateSpec> states;
  std::vector<int64_t> sizes;  // the selective form's H, Di, N, K, R
};

c10::optional<at::Tensor> opt_tensor(const py::handle& o) {
  if (o.is_none()) return c10::nullopt;
  return THPVariable_Unpack(o.ptr());
}

class StepProgram {
 public:
  StepProgram(py::tuple encoder, py::list parts, py::tuple final_norm, py::tuple head, int64_t pool,
              int64_t max_rows, py::list watch, py::list objects, py::object skip, py::list global_hooks, py::object state_cls,
              py::object pool_cls, py::object depth_key)
      : pool_(pool), max_rows_(max_rows), global_hooks_(global_hooks), state_cls_(state_cls), pool_cls_(pool_cls), depth_key_(depth_key) {
    watching(watch, objects, skip);
    enc_ = encoder[0].cast<int64_t>();
    enc_w_ = opt_tensor(encoder[1]);
    enc_b_ = opt_tensor(encoder[2]);
    head_w_ = THPVariable_Unpack(head[0].ptr()).contiguous();
    head_b_ = opt_tensor(head[1]);
    dtype_ = head_w_.scalar_type();
    TORCH_CHECK(dtype_ == at::kFloat || dtype_ == at::kDouble, "StepProgram: float32 or float64");
    H_ = head_w_.size(1);
    O_ = head_w_.size(0);
    TORCH_CHECK(enc_ >= 0 && enc_ <= 2, "StepProgram: encoder kind 0..2");
    TORCH_CHECK(pool_ >= 0 && pool_ <= 3, "StepProgram: pool kind 0..3");
    TORCH_CHECK(enc_ == 0 || (enc_w_.has_value() && enc_w_->dim() == 2 && enc_w_->size(enc_ == 1 ? 0 : 1) == H_),
                "StepProgram: the encoder's weight must be (H, D) (linear) or (V, H) (embedding)");
    D_ = enc_ == 1 ? enc_w_->size(1) : H_;
    V_ = enc_ == 2 ? enc_w_->size(0) : 0;
    auto own = [&](c10::optional<at::Tensor>& t, int64_t n, const char* what) {
      if (!t.has_value()) return;
      TORCH_CHECK(t->scalar_type() == dtype_ && t->device().is_cpu(), "StepProgram: ", what, " in the head's dtype, on the CPU");
      TORCH_CHECK(n < 0 || t->numel() == n, "StepProgram: ", what, " has the wrong size");
      *t = t->contiguous();
    };
    own(enc_w_, -1, "the encoder's weight");
    own(enc_b_, H_, "the encoder's bias");
    own(head_b_, O_, "the head's bias");
    at::Tensor probe = at::empty({1, H_}, head_w_.options());
    final_ = common(probe, final_norm[0].cast<int64_t>(), opt_tensor(final_norm[1]), opt_tensor(final_norm[2]),
                    c10::nullopt, c10::nullopt, final_norm[3].cast<double>(), true, 0, 0, c10::nullopt, c10::nullopt, false);
    TORCH_CHECK(final_.norm <= 2, "StepProgram: the final norm is none, LayerNorm or RMSNorm");
    for (const auto& item : parts) {
      py::tuple p = item.cast<py::tuple>();
      Part part;
      part.core = p[0].cast<int64_t>();
      part.t = p[1].cast<std::vector<at::Tensor>>();
      part.per_channel = p[2].cast<bool>();
      part.c = common(probe, p[3].cast<int64_t>(), opt_tensor(p[4]), opt_tensor(p[5]), opt_tensor(p[6]), opt_tensor(p[7]),
                      p[8].cast<double>(), p[9].cast<bool>(), p[10].cast<int64_t>(), p[11].cast<int64_t>(),
                      opt_tensor(p[12]), opt_tensor(p[13]), p[14].cast<bool>());
      if (py::isinstance<py::tuple>(p[15])) {  // learned damping: (logit (blocks,), this position's block)
        py::tuple a = p[15].cast<py::tuple>();
        part.alpha = 1.0;
        part.alpha_logit = checked(THPVariable_Unpack(a[0].ptr()), probe, "the damping logit");
        part.alpha_index = a[1].cast<int64_t>();
        TORCH_CHECK(part.alpha_index >= 0 && part.alpha_index < part.alpha_logit->numel(), "StepProgram: damping index");
      } else {
        part.alpha = p[15].cast<double>();
      }
      for (auto& t : part.t) t = t.numel() > 0 || part.core != 3 ? checked(t, probe, "a core tensor") : t;
      shape(part);
      parts_.push_back(std::move(part));
    }
    release();
  }

  // A program that takes no call (DECLINED) until something it watches changes (STALE): what stands for
  // a model the program cannot compute, so the caller tries again only after a change.
  StepProgram(py::list watch, py::list objects, py::object skip) : declines_(true) { watching(watch, objects, skip); }

  // Whether anything the program was built from has changed: a watched object's __dict__ (a module
  // replaced or gone, a setting or training flag set, a hook added, a parameter reassigned), a watched
  // tensor (TensorImpl, storage, layout, dtype, in-place version).
  bool stale() const {
    for (const auto& w : tensors_)
      if (w.changed()) return true;
    for (const auto& o : objects_)
      if (!o.same()) return true;
    return false;
  }

  py::object run(py::handle x_obj, py::handle state_obj) {
    for (const auto& g : global_hooks_)
      if (PyDict_Size(g.ptr()) != 0) return py::int_(DECLINED);
    if (at::autocast::is_autocast_enabled(at::kCPU) || c10::impl::TorchDispatchModeTLS::stack_len() > 0)
      return py::int_(DECLINED);
    if (stale()) return py::int_(STALE);
    ++calls_;
    if (declines_) return py::int_(DECLINED);
    Bound bound(*this);  // the tensors it reads, held in C++ for this call only
    if (Py_TYPE(state_obj.ptr()) != reinterpret_cast<PyTypeObject*>(state_cls_.ptr())) return py::int_(DECLINED);
    auto x = tensor_of(x_obj.ptr());
    if (!x.has_value()) return py::int_(DECLINED);
    if (enc_ == 2 ? (x->dim() != 1 || (x->scalar_type() != at::kLong && x->scalar_type() != at::kInt))
                  : (x->dim() != 2 || x->size(1) != D_ || x->scalar_type() != dtype_))
      return py::int_(DECLINED);
    const int64_t B = x->size(0);
    if (B > max_rows_) return py::int_(DECLINED);  // a batch BLAS (the plan's separate ops) runs faster
    // the state: a plain stream's (no reshaping, not adaptive), one {"h": tensor} per position, the pool's
    py::object reshape = state_obj.attr("reshape"), adaptive = state_obj.attr("adaptive");
    if (!reshape.is_none() || !adaptive.is_none()) return py::int_(DECLINED);
    auto t = tensor_of(state_obj.attr("t").ptr());
    if (!t.has_value() || t->scalar_type() != at::kLong || t->dim() != 1 || t->size(0) != B) return py::int_(DECLINED);
    py::object layers_obj = state_obj.attr("layers");
    if (!PyList_Check(layers_obj.ptr()) || PyList_GET_SIZE(layers_obj.ptr()) != static_cast<Py_ssize_t>(parts_.size()))
      return py::int_(DECLINED);
    const at::ScalarType cdtype = dtype_ == at::kFloat ? at::kComplexFloat : at::kComplexDouble;
    std::vector<std::vector<at::Tensor>> hs(parts_.size());
    for (size_t i = 0; i < parts_.size(); ++i) {
      PyObject* layer = PyList_GET_ITEM(layers_obj.ptr(), i);
      const auto& specs = parts_[i].states;
      if (!PyDict_Check(layer) || PyDict_Size(layer) != static_cast<Py_ssize_t>(specs.size())) return py::int_(DECLINED);
      for (const auto& spec : specs) {
        auto h = tensor_of(PyDict_GetItem(layer, spec.name.ptr()));
        if (!h.has_value() || !h->is_contiguous()) return py::int_(DECLINED);
        const bool cx = spec.complex_ok && h->scalar_type() == cdtype;
        if (!cx && h->scalar_type() != dtype_) return py::int_(DECLINED);
        const auto& want = spec.shape;  // a complex state drops the real view's last (2)
        const size_t dims = want.size() + (cx ? 0 : 1);
        if (static_cast<size_t>(h->dim()) != dims || h->size(0) != B) return py::int_(DECLINED);
        for (size_t k = 0; k + 1 < dims; ++k)
          if (h->size(k + 1) != want[k]) return py::int_(DECLINED);
        hs[i].push_back(*h);
      }
    }
    py::object pools_obj = state_obj.attr("pools");
    c10::optional<at::Tensor> total, count;
    if (pool_ != 0) {
      if (!PyDict_Check(pools_obj.ptr())) return py::int_(DECLINED);
      PyObject* kept = PyDict_GetItem(pools_obj.ptr(), depth_key_.ptr());
      if (kept == nullptr || Py_TYPE(kept) != reinterpret_cast<PyTypeObject*>(pool_cls_.ptr())) return py::int_(DECLINED);
      py::handle k(kept);
      total = tensor_of(k.attr("total").ptr());
      count = tensor_of(k.attr("count").ptr());
      const int64_t W = pool_ == 3 ? O_ : H_;
      if (!total.has_value() || !count.has_value() || total->scalar_type() != dtype_ || total->dim() != 2 ||
          total->size(0) != B || total->size(1) != W || count->scalar_type() != at::kLong || count->dim() != 1 ||
          count->size(0) != B)
        return py::int_(DECLINED);
      *total = total->contiguous();
      *count = count->contiguous();
    }
    at::Tensor xc = x->contiguous();
    if (enc_ == 2) {  // a token out of range: the plan's embedding raises the general path's error
      at::Tensor ids = xc.to(at::kLong);
      const int64_t* id = ids.data_ptr<int64_t>();
      for (int64_t r = 0; r < B; ++r)
        if (id[r] < 0 || id[r] >= V_) return py::int_(DECLINED);
      xc = ids;
    }
    // outputs
    auto opts = head_w_.options();
    at::Tensor y = at::empty({B, O_}, opts);
    std::vector<std::vector<at::Tensor>> hn(parts_.size());
    for (size_t i = 0; i < parts_.size(); ++i)
      for (const auto& h : hs[i]) hn[i].push_back(at::empty_like(h));
    at::Tensor tin = t->contiguous(), t1 = at::empty_like(tin);
    at::Tensor total1, count1, last1;
    if (pool_ != 0) {
      total1 = at::empty_like(*total);
      count1 = at::empty_like(*count);
      last1 = at::empty({B, H_}, opts);
    }
    AT_DISPATCH_FLOATING_TYPES(dtype_, "StepProgram", [&] {
      compute<scalar_t>(B, xc, hs, hn, y, total, count, total1, count1, last1);
    });
    int64_t* tp = t1.data_ptr<int64_t>();
    const int64_t* tq = tin.data_ptr<int64_t>();
    for (int64_t r = 0; r < B; ++r) tp[r] = tq[r] + 1;
    py::list layers;
    for (size_t i = 0; i < parts_.size(); ++i) {
      py::dict d;
      for (size_t k = 0; k < hn[i].size(); ++k)
        d[parts_[i].states[k].name] = py::reinterpret_steal<py::object>(THPVariable_Wrap(hn[i][k]));
      layers.append(d);
    }
    py::dict pools;
    if (pool_ != 0)
      pools[depth_key_] = pool_cls_(py::reinterpret_steal<py::object>(THPVariable_Wrap(total1)),
                                    py::reinterpret_steal<py::object>(THPVariable_Wrap(count1)),
                                    py::reinterpret_steal<py::object>(THPVariable_Wrap(last1)));
    py::object out = py::reinterpret_steal<py::object>(THPVariable_Wrap(y));
    py::object new_state = state_cls_(py::reinterpret_steal<py::object>(THPVariable_Wrap(t1)), layers, pools);
    return py::make_tuple(out, new_state);
  }

 private:
  void watching(const py::list& watch, const py::list& objects, py::object skip) {
    skip_ = std::move(skip);
    for (const auto& t : watch) tensors_.emplace_back(t);
    for (const auto& o : objects) objects_.emplace_back(o, skip_.ptr());
  }

  // Between calls the program holds the tensors it reads as their Python objects only (a C++ reference,
  // even a weak one, would make torch.utils.swap_tensors refuse the model's parameters): every one is a
  // tensor Python holds (the model's or a core's cache); a contiguous copy of a strided one is refused.
  std::vector<std::pair<at::Tensor*, py::object>> slots_;

  void release() {
    auto add = [&](at::Tensor* t) {
      if (!t->defined() || t->numel() == 0) return;  // an absent part's empty tensor stays held
      TORCH_CHECK(t->use_count() > 1, "StepProgram: a tensor the model does not hold (not contiguous?)");
      slots_.emplace_back(t, py::reinterpret_steal<py::object>(THPVariable_Wrap(*t)));  // its Python object
    };
    auto add_opt = [&](c10::optional<at::Tensor>& t) {
      if (t.has_value()) add(&*t);
    };
    add_opt(enc_w_);
    add_opt(enc_b_);
    add(&head_w_);
    add_opt(head_b_);
    add_opt(final_.nw);
    add_opt(final_.nb);
    for (auto& p : parts_) {
      for (auto& t : p.t) add(&t);
      for (auto* t : {&p.c.nw, &p.c.nb, &p.c.nm, &p.c.nv, &p.c.ow, &p.c.ob, &p.alpha_logit}) add_opt(*t);
    }
    for (auto& slot : slots_) *slot.first = at::Tensor();  // from now on through the Python object
  }

  struct Bound {  // every slot's tensor, held in C++ while a call runs
    StepProgram& p;
    explicit Bound(StepProgram& program) : p(program) {
      for (auto& slot : p.slots_) *slot.first = THPVariable_Unpack(slot.second.ptr());
    }
    ~Bound() {
      for (auto& slot : p.slots_) *slot.first = at::Tensor();
    }
  };

  void shape(Part& p) {
    const auto& t = p.t;
    TORCH_CHECK(p.core >= 0 && p.core <= 3, "StepProgram: core kind 0..3");
    std::vector<int64_t> h;  // the linear forms' one state "h" (real view)
    if (p.core == 3) {
      p.sizes = selective_sizes(t);
      TORCH_CHECK(p.sizes[0] == H_, "StepProgram: the selective core's W_in must be (2Di, H)");
      p.states = {{"conv", py::str("conv"), {p.sizes[1], p.sizes[3] - 1}, false},
                  {"ssm", py::str("ssm"), {p.sizes[1], p.sizes[2]}, false}};
      return;
    }
    if (p.core == 0) {
      TORCH_CHECK(t.size() == 4, "StepProgram: a diagonal core has a, b, c, d");
      const at::Tensor &a = t[0], &b = t[1], &c = t[2];
      if (p.per_channel) {
        TORCH_CHECK(a.dim() == 3 && a.size(0) == H_ && a.size(2) == 2 && b.sizes() == a.sizes() && c.sizes() == a.sizes(),
                    "StepProgram: per-channel a, b, c must be (H, P, 2)");
        h = {H_, a.size(1), 2};
      } else {
        const int64_t P = a.size(0);
        TORCH_CHECK(a.dim() == 2 && a.size(1) == 2 && b.dim() == 2 && b.size(0) == H_ && b.size(1) == 2 * P &&
                    c.dim() == 2 && c.size(0) == 2 * P && c.size(1) == H_, "StepProgram: shared a (P, 2), b (H, 2P), c (2P, H)");
        h = {P, 2};
      }
      TORCH_CHECK(t[3].numel() == H_, "StepProgram: d must be (H,)");
    } else if (p.core == 1) {
      TORCH_CHECK(t.size() == 7, "StepProgram: a DPLR core has E, Dm, P, B2, R, C, d");
      for (int i = 0; i < 6; ++i)
        TORCH_CHECK(t[i].dim() == 3 && t[i].size(0) == H_ && t[i].size(2) == 2 && t[i].sizes() == t[0].sizes(),
                    "StepProgram: every DPLR step matrix must be (H, M, 2)");
      TORCH_CHECK(t[6].numel() == H_, "StepProgram: d must be (H,)");
      h = {H_, t[0].size(1), 2};
    } else {
      TORCH_CHECK(t.size() == 4, "StepProgram: an oscillator core has a, b, c, d");
      const at::Tensor &a = t[0], &b = t[1], &c = t[2];
      TORCH_CHECK(a.dim() == 3 && a.size(1) == a.size(2) && a.size(1) >= 2, "StepProgram: a must be (P, K, K), K >= 2");
      const int64_t P = a.size(0), K = a.size(1);
      TORCH_CHECK(b.dim() == 4 && b.size(0) == P && b.size(1) == H_ && b.size(2) == K && b.size(3) == 2 && c.dim() == 3 &&
                  c.size(0) == H_ && c.size(1) == P && c.size(2) == 2, "StepProgram: b (P, H, K, 2), c (H, P, 2)");
      TORCH_CHECK(t[3].numel() == H_, "StepProgram: d must be (H,)");
      h = {P, K, 2};
    }
    p.states = {{"h", py::str("h"), h, true}};
  }

  template <typename T>
  void compute(int64_t B, const at::Tensor& x, const std::vector<std::vector<at::Tensor>>& hs,
               std::vector<std::vector<at::Tensor>>& hn,
               at::Tensor& y, const c10::optional<at::Tensor>& total, const c10::optional<at::Tensor>& count,
               at::Tensor& total1, at::Tensor& count1, at::Tensor& last1) {
    const int64_t H = H_;
    // every buffer B rows: h the running features, z a block's output, u yy v w its scratch (v 2H), hf the
    // final norm's output, mean the pooled features, s the head's (the mean-of-logits pool only); uninitialised
    // (each is written before it is read), so a large head costs no memset per token
    const int64_t So = pool_ == 3 ? O_ : 0;
    std::unique_ptr<T[]> buf(new T[B * (9 * H + So)]);
    T *h = buf.get(), *z = h + B * H, *u = z + B * H, *yy = u + B * H, *v = yy + B * H, *w = v + 2 * B * H;
    T *hf = w + B * H, *mean = hf + B * H, *s = mean + B * H;
    const T* ew = enc_ == 0 ? nullptr : enc_w_->data_ptr<T>();
    const T* eb = optp<T>(enc_b_);
    const T* hw = head_w_.data_ptr<T>();
    const T* hb = optp<T>(head_b_);
    const Norm fn{final_.norm, optp<T>(final_.nw), optp<T>(final_.nb), nullptr, nullptr, final_.eps};
    int64_t need = 0;
    for (const auto& p : parts_)
      if (p.core == 3) need = std::max(need, selective_scratch(p.sizes, B));
    std::unique_ptr<T[]> sel(new T[need]);  // the selective cores' scratch
    const T* X = enc_ == 2 ? nullptr : x.data_ptr<T>();  // token ids (int64) for an embedding
    if (enc_ == 0) std::copy(X, X + B * H, h);
    else if (enc_ == 1) linear_rows(ew, eb, X, h, H, D_, B);
    else
      for (int64_t r = 0; r < B; ++r) {
        const T* row = ew + x.data_ptr<int64_t>()[r] * H;
        std::copy(row, row + H, h + r * H);
      }
    for (size_t i = 0; i < parts_.size(); ++i) {
      const Part& p = parts_[i];
      const T* S = static_cast<const T*>(hs[i][0].data_ptr());  // complex states read as their (re, im) pairs
      T* N = static_cast<T*>(hn[i][0].data_ptr());
      const Common& c = p.c;
      const Norm norm{c.norm, optp<T>(c.nw), optp<T>(c.nb), optp<T>(c.nm), optp<T>(c.nv), c.eps};
      const T* ow = optp<T>(c.ow);
      const T* ob = optp<T>(c.ob);
      const auto& t = p.t;
      auto block = [&](const auto& core) {
        block_rows(h, z, B, H, norm, c.prenorm, c.act, c.out, ow, ob, c.residual, core, u, yy, v, w);
      };
      if (p.core == 0) {
        block(DiagCore<T>{S, t[0].data_ptr<T>(), t[1].data_ptr<T>(), t[2].data_ptr<T>(), t[3].data_ptr<T>(), N, H,
                          p.per_channel ? t[0].size(1) : t[0].size(0), p.per_channel});
      } else if (p.core == 1) {
        block(DPLRCore<T>{S, t[0].data_ptr<T>(), t[1].data_ptr<T>(), t[2].data_ptr<T>(), t[3].data_ptr<T>(),
                          t[4].data_ptr<T>(), t[5].data_ptr<T>(), t[6].data_ptr<T>(), N, H, t[0].size(1)});
      } else if (p.core == 2) {
        block(OscCore<T>{S, t[0].data_ptr<T>(), t[1].data_ptr<T>(), t[2].data_ptr<T>(), t[3].data_ptr<T>(), N, H,
                         t[0].size(0), t[0].size(1)});
      } else {
        block(selective_core<T>(t, p.sizes, S, static_cast<const T*>(hs[i][1].data_ptr()), N,
                                static_cast<T*>(hn[i][1].data_ptr()), sel.get()));
      }
      // the stack's damping (1 - α) h + α z, with α = sigmoid(logit) where it is learned (read now)
      const T alpha = p.alpha_logit.has_value()
                          ? T(1) / (T(1) + std::exp(-p.alpha_logit->data_ptr<T>()[p.alpha_index])) : T(p.alpha);
      if (!p.alpha_logit.has_value() && p.alpha == 1.0) std::copy(z, z + B * H, h);
      else for (int64_t k = 0; k < B * H; ++k) h[k] = (T(1) - alpha) * h[k] + alpha * z[k];
    }
    for (int64_t r = 0; r < B; ++r) norm_row(h + r * H, hf + r * H, H, fn);  // hf: the final norm's output
    T* Y = y.data_ptr<T>();
    if (pool_ == 0) {  // a per-step readout
      linear_rows(hw, hb, hf, Y, O_, H, B);
      return;
    }
    if (pool_ == 3) linear_rows(hw, hb, hf, s, O_, H, B);  // mean of the logits: the head on every step, summed
    for (int64_t r = 0; r < B; ++r) {
      const T* hr = hf + r * H;
      const T* tot = total->data_ptr<T>() + r * total->size(1);
      T* tot1 = total1.data_ptr<T>() + r * total1.size(1);
      const int64_t n = count->data_ptr<int64_t>()[r] + 1;
      count1.data_ptr<int64_t>()[r] = n;
      std::copy(hr, hr + H, last1.data_ptr<T>() + r * H);
      if (pool_ == 3) {
        for (int64_t o = 0; o < O_; ++o) {
          tot1[o] = tot[o] + s[r * O_ + o];
          Y[r * O_ + o] = tot1[o] / static_cast<T>(n);
        }
        continue;
      }
      for (int64_t k = 0; k < H; ++k) {
        tot1[k] = tot[k] + hr[k];
        mean[r * H + k] = tot1[k] / static_cast<T>(n);
      }
    }
    if (pool_ != 3) linear_rows(hw, hb, pool_ == 1 ? mean : hf, Y, O_, H, B);  // mean: the head on the mean; last: on the step
  }

  bool declines_ = false;
 public:
  int64_t calls_ = 0;  // the calls it found current since it was built (taken or declined)

 private:
  int64_t enc_ = 0, pool_ = 0, max_rows_ = 0;
  c10::optional<at::Tensor> enc_w_, enc_b_, head_b_;
  at::Tensor head_w_;
  at::ScalarType dtype_ = at::kFloat;
  int64_t H_ = 0, O_ = 0, D_ = 0, V_ = 0;
  Common final_;
  std::vector<Part> parts_;
  std::vector<TensorWatch> tensors_;
  std::vector<ObjectWatch> objects_;
  py::object skip_;
  py::list global_hooks_;
  py::object state_cls_, pool_cls_, depth_key_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "SSM Zoo: one residual block's streaming step around an LTI core, fused (inference only)";
  m.def("diag_block", &diag_block, "z (B, H), h' from x, the state and a DiagStream's tensors, then the block's");
  m.def("dplr_block", &dplr_block, "z (B, H), h' from x, the state and a DPLRStream's tensors, then the block's");
  m.def("osc_block", &osc_block, "z (B, H), h' from x, the state and a BlockStream's tensors, then the block's");
  m.def("selective_block", &selective_block, "z (B, H), conv', ssm' from x, the states and a SelectiveStream's tensors, then the block's");
  py::class_<StepProgram>(m, "StepProgram", "a model's whole streaming step in one call (zoo_core.nn.lean)")
      .def(py::init<py::tuple, py::list, py::tuple, py::tuple, int64_t, int64_t, py::list, py::list, py::object, py::list,
                    py::object, py::object, py::object>())
      .def(py::init<py::list, py::list, py::object>())
      .def("stale", &StepProgram::stale, "whether anything it was built from has changed since")
      .def_readonly("calls", &StepProgram::calls_, "the calls it found current since it was built (taken or declined)")
      .def("run", &StepProgram::run, "(output, state), or DECLINED (0) / STALE (1)");
  m.attr("DECLINED") = DECLINED;
  m.attr("STALE") = STALE;
}
