// One residual block's streaming step (one token) around a diagonal complex LTI core, fused: what
// SequenceModel.step runs per block at inference (zoo_core/nn/lean.py) for S4D, S5 and LRU.
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
    case 4: return v > T(0) ? v : T(0);
    default: return v;
  }
}

template <typename T>
void block(const at::Tensor& x, const at::Tensor& h, at::Tensor& z, at::Tensor& hn, const at::Tensor& a,
           const at::Tensor& bm, const at::Tensor& c, const at::Tensor& d, bool per_channel, const Norm& norm,
           bool prenorm, int64_t act, int64_t out, const T* ow, const T* ob,
           bool residual) {
  const int64_t B = x.size(0), H = x.size(1);
  const int64_t P = per_channel ? a.size(1) : a.size(0);
  const T* X = x.data_ptr<T>();
  const T* Hs = h.data_ptr<T>();
  const T* A = a.data_ptr<T>();
  const T* Bm = bm.data_ptr<T>();
  const T* C = c.data_ptr<T>();
  const T* D = d.data_ptr<T>();
  T* Z = z.data_ptr<T>();
  T* Hn = hn.data_ptr<T>();
  std::vector<T> u(H), y(H), v(out == 2 ? 2 * H : H), w(H);
  for (int64_t r = 0; r < B; ++r) {
    const T* xr = X + r * H;
    if (prenorm) norm_row(xr, u.data(), H, norm);
    else for (int64_t i = 0; i < H; ++i) u[i] = xr[i];
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
    } else {  // state (P, 2) per row; b (H, 2P), c (2P, H)
      const T* hr = Hs + r * P * 2;
      T* nr = Hn + r * P * 2;
      for (int64_t k = 0; k < 2 * P; ++k) {
        T acc = 0;
        for (int64_t i = 0; i < H; ++i) acc += u[i] * Bm[i * 2 * P + k];
        nr[k] = acc;
      }
      for (int64_t p = 0; p < P; ++p) {
        const T re = A[2 * p] * hr[2 * p] - A[2 * p + 1] * hr[2 * p + 1];
        const T im = A[2 * p] * hr[2 * p + 1] + A[2 * p + 1] * hr[2 * p];
        nr[2 * p] += re;
        nr[2 * p + 1] += im;
      }
      for (int64_t i = 0; i < H; ++i) y[i] = D[i] * u[i];
      for (int64_t k = 0; k < 2 * P; ++k) {
        const T s = nr[k];
        const T* ck = C + k * H;
        for (int64_t i = 0; i < H; ++i) y[i] += s * ck[i];
      }
    }
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

template <typename T>
const T* opt_ptr(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr<T>() : nullptr;
}

std::vector<at::Tensor> diag_block(at::Tensor x, at::Tensor h, at::Tensor a, at::Tensor b, at::Tensor c, at::Tensor d,
                                   bool per_channel, int64_t norm, c10::optional<at::Tensor> norm_w,
                                   c10::optional<at::Tensor> norm_b, c10::optional<at::Tensor> norm_mean,
                                   c10::optional<at::Tensor> norm_var, double eps, bool prenorm, int64_t act,
                                   int64_t out, c10::optional<at::Tensor> out_w, c10::optional<at::Tensor> out_b,
                                   bool residual) {
  TORCH_CHECK(x.dim() == 2, "diag_block: x must be (B, H)");
  TORCH_CHECK(x.device().is_cpu(), "diag_block: CPU tensors only");
  auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "diag_block: float32 or float64");
  const int64_t H = x.size(1);
  auto cont = [&](const c10::optional<at::Tensor>& t) -> c10::optional<at::Tensor> {
    if (!t.has_value() || !t->defined()) return c10::nullopt;
    TORCH_CHECK(t->scalar_type() == dtype, "diag_block: every tensor in x's dtype");
    return t->contiguous();
  };
  // a complex state is read and written through its real view, and returned complex like it came
  const bool complex_state = h.is_complex();
  if (complex_state) h = at::view_as_real(h.contiguous());
  x = x.contiguous(); h = h.contiguous(); a = a.contiguous(); b = b.contiguous(); c = c.contiguous(); d = d.contiguous();
  for (const auto* t : {&h, &a, &b, &c, &d}) TORCH_CHECK(t->scalar_type() == dtype, "diag_block: every tensor in x's dtype");
  if (per_channel) {
    TORCH_CHECK(a.dim() == 3 && a.size(0) == H && a.size(2) == 2, "diag_block: per-channel a must be (H, P, 2)");
    TORCH_CHECK(b.sizes() == a.sizes() && c.sizes() == a.sizes(), "diag_block: per-channel b, c must be (H, P, 2)");
    TORCH_CHECK(h.dim() == 4 && h.size(0) == x.size(0) && h.size(1) == H && h.size(2) == a.size(1) && h.size(3) == 2,
                "diag_block: per-channel state must be (B, H, P, 2)");
  } else {
    const int64_t P = a.size(0);
    TORCH_CHECK(a.dim() == 2 && a.size(1) == 2, "diag_block: shared a must be (P, 2)");
    TORCH_CHECK(b.dim() == 2 && b.size(0) == H && b.size(1) == 2 * P, "diag_block: shared b must be (H, 2P)");
    TORCH_CHECK(c.dim() == 2 && c.size(0) == 2 * P && c.size(1) == H, "diag_block: shared c must be (2P, H)");
    TORCH_CHECK(h.dim() == 3 && h.size(0) == x.size(0) && h.size(1) == P && h.size(2) == 2,
                "diag_block: shared state must be (B, P, 2)");
  }
  TORCH_CHECK(d.numel() == H, "diag_block: d must be (H,)");
  auto nw = cont(norm_w), nb = cont(norm_b), nm = cont(norm_mean), nv = cont(norm_var), ow = cont(out_w), ob = cont(out_b);
  TORCH_CHECK(norm >= 0 && norm <= 3, "diag_block: norm kind 0..3");
  TORCH_CHECK(norm != 3 || (nm.has_value() && nv.has_value() && nm->numel() == H && nv->numel() == H),
              "diag_block: a batch norm needs its running mean and variance (H,)");
  for (const auto* t : {&nw, &nb}) TORCH_CHECK(!t->has_value() || (*t)->numel() == H, "diag_block: norm weight/bias (H,)");
  if (out != 0) {
    const int64_t O = out == 2 ? 2 * H : H;
    TORCH_CHECK(ow.has_value() && ow->dim() == 2 && ow->size(0) == O && ow->size(1) == H,
                "diag_block: the output map's weight must be (", O, ", H)");
    TORCH_CHECK(!ob.has_value() || ob->numel() == O, "diag_block: the output map's bias must be (", O, ",)");
  }
  auto z = at::empty_like(x);
  auto hn = at::empty_like(h);
  AT_DISPATCH_FLOATING_TYPES(dtype, "diag_block", [&] {
    const Norm n{norm, opt_ptr<scalar_t>(nw), opt_ptr<scalar_t>(nb), opt_ptr<scalar_t>(nm), opt_ptr<scalar_t>(nv), eps};
    block<scalar_t>(x, h, z, hn, a, b, c, d, per_channel, n, prenorm, act, out, opt_ptr<scalar_t>(ow),
                    opt_ptr<scalar_t>(ob), residual);
  });
  return {z, complex_state ? at::view_as_complex(hn) : hn};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "SSM Zoo: one residual block's streaming step around a diagonal complex LTI core, fused (inference only)";
  m.def("diag_block", &diag_block, "z (B, H), h' (the state's real view) from x, the state and the block's tensors");
}
