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
#include <torch/python.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

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

// The block around a core: core(row, u, y) advances row `row`'s state from the normalised input u
// (H) and writes the core's output y (H); everything else is the same for every core.
template <typename T, typename Core>
void run_block(const at::Tensor& x, at::Tensor& z, const Norm& norm, bool prenorm, int64_t act, int64_t out,
               const T* ow, const T* ob, bool residual, Core core) {
  const int64_t B = x.size(0), H = x.size(1);
  const T* X = x.data_ptr<T>();
  T* Z = z.data_ptr<T>();
  std::vector<T> u(H), y(H), v(out == 2 ? 2 * H : H), w(H);
  for (int64_t r = 0; r < B; ++r) {
    const T* xr = X + r * H;
    if (prenorm) norm_row(xr, u.data(), H, norm);
    else for (int64_t i = 0; i < H; ++i) u[i] = xr[i];
    core(r, u.data(), y.data());
    for (int64_t i = 0; i < H; ++i) y[i] = activate(y[i], act);
    if (out == 0) {
      for (int64_t i = 0; i < H; ++i) w[i] = y[i];
    } else {
      const int64_t O = out == 2 ? 2 * H : H;
      for (int64_t o = 0; o < O; ++o) {
        T acc = ob ? ob[o] : T(0);
        const T* wo = ow + o * H;
        for (int64_t i = 0; i < H; ++i) acc += wo[i] * y[i];
        v[o] = acc;
      }
      if (out == 2) for (int64_t i = 0; i < H; ++i) w[i] = v[i] / (T(1) + std::exp(-v[H + i]));
      else for (int64_t i = 0; i < H; ++i) w[i] = v[i];
    }
    T* zr = Z + r * H;
    for (int64_t i = 0; i < H; ++i) w[i] = residual ? xr[i] + w[i] : w[i];
    if (prenorm) for (int64_t i = 0; i < H; ++i) zr[i] = w[i];
    else norm_row(w.data(), zr, H, norm);
  }
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
    for (int64_t k = 0; k < 2 * P; ++k) {
      T acc = 0;
      for (int64_t i = 0; i < H; ++i) acc += u[i] * Bm[i * 2 * P + k];
      nr[k] = acc;
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
  TORCH_CHECK(a.dim() == 3 && a.size(1) == a.size(2), "osc_block: a must be (P, K, K)");
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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "SSM Zoo: one residual block's streaming step around an LTI core, fused (inference only)";
  m.def("diag_block", &diag_block, "z (B, H), h' from x, the state and a DiagStream's tensors, then the block's");
  m.def("dplr_block", &dplr_block, "z (B, H), h' from x, the state and a DPLRStream's tensors, then the block's");
  m.def("osc_block", &osc_block, "z (B, H), h' from x, the state and a BlockStream's tensors, then the block's");
}
