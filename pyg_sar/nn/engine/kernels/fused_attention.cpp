// Fused attention over one CSR-ordered edge chunk (pyg_sar's online softmax).
//
// Score kinds (``kind``):
//   0  GAT:   a_e = lrelu(s_src[j,h] + s_dst[i,h] (+ edge[e,h]))
//   1  GATv2: a_e = sum_c att[h,c] * lrelu(s_src[j,h,c] + s_dst[i,h,c]
//                                           (+ edge[e,h,c]))
//   2  dot:   a_e = sum_c (s_src[j,h,c] (+ edge[e,h,c])) * s_dst[i,h,c] / d
//             (TransformerConv: keys, queries, d = sqrt(channels))
// ``slope`` is the leaky ReLU's negative slope for kinds 0 and 1, the
// divisor d for kind 2.
// Values are rows value[j,h,:]. Destination rows are the chunk's rows
// [0, R): crow is their row pointer over the chunk's edges, col the source
// of each edge. Work is split over destination rows (no atomics); the
// gradient of source rows is a second pass over the transposed chunk.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr double kEps = 1e-16;  // PyG's softmax normalizer epsilon

template <typename T>
inline T lrelu(T x, T slope) { return x > T(0) ? x : x * slope; }

template <typename T>
inline T lrelu_grad(T x, T slope) { return x > T(0) ? T(1) : slope; }

// exp(x) for x <= 0 (a logit minus its row's max), written so that the
// compiler vectorizes a loop of them (std::exp is a call per element, and
// std::floor does not vectorize under strict floating point): Cephes' range
// reduction by ln 2, n = x / ln 2 rounded to nearest by adding and
// subtracting 1.5 * 2^mantissa bits, its polynomial (float, relative error
// below 1e-7) or rational function (double, below 2.5e-16), and 2^n from
// its exponent bits. Below the smallest normal result it returns 0 (exp
// gives a subnormal there, at most 1e-37 of the row's largest weight), and
// NaN stays NaN.
inline float exp_nonpositive(float x) {
  const float xc = std::max(x, -88.0f);
  const float z = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - z * 0.693359375f;
  r = r - z * -2.12194440e-4f;
  const float rr = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * rr + r + 1.0f;
  const int32_t n = static_cast<int32_t>(z);
  const float two_n = __builtin_bit_cast(float, (n + 127) << 23);
  const float y = x < -87.3365447f ? 0.0f : p * two_n;
  return x != x ? x : y;
}

inline double exp_nonpositive(double x) {
  const double xc = std::max(x, -709.0);
  const double z =
      (xc * 1.4426950408889634073599 + 6755399441055744.0) - 6755399441055744.0;
  double r = xc - z * 6.93145751953125e-1;
  r = r - z * 1.42860682030941723212e-6;
  const double rr = r * r;
  const double px =
      r * ((1.26177193074810590878e-4 * rr + 3.02994407707441961300e-2) * rr +
           9.99999999999999999910e-1);
  const double qx = ((3.00198505138664455042e-6 * rr +
                      2.52448340349684104192e-3) * rr +
                     2.27265548208155028766e-1) * rr +
                    2.00000000000000000009e0;
  const double p = 1.0 + 2.0 * (px / (qx - px));
  const int64_t n = static_cast<int32_t>(z);
  const double two_n = __builtin_bit_cast(double, (n + 1023) << 52);
  const double y = x < -708.3964185322641 ? 0.0 : p * two_n;
  return x != x ? x : y;
}

// x[k] = exp(x[k]) for n values at or below 0, in place.
template <typename T>
inline void exp_nonpositive_inplace(T* x, int64_t n) {
  for (int64_t k = 0; k < n; ++k) x[k] = exp_nonpositive(x[k]);
}

// Row (n, h) of an [N, H, C] table with unit channel stride and any node and
// head strides (the engine fetches value tables head-major).
template <typename T>
struct Rows {
  T* p = nullptr;
  int64_t sn = 0, sh = 0;
  Rows() = default;
  explicit Rows(const torch::Tensor& t) {
    if (t.numel()) {
      TORCH_CHECK(t.dim() != 3 || t.stride(2) == 1,
                  "fused attention: channels must be contiguous");
      p = static_cast<T*>(t.data_ptr());
      sn = t.stride(0);
      sh = t.dim() > 1 ? t.stride(1) : 0;
    }
  }
  inline T* at(int64_t n, int64_t h) const { return p + n * sn + h * sh; }
  explicit operator bool() const { return p != nullptr; }
};

// sum_c f(c) over C channels in kLanes independent partial sums (lane
// c % kLanes), added in a fixed order at the end: the compiler vectorizes
// the lanes (a single running sum is a dependency chain it may not reorder),
// and the result is the same at every vector width.
constexpr int64_t kLanes = 8;

template <typename T, typename F>
inline T lane_sum(int64_t C, F f) {
  T p[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= C; c += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) p[k] += f(c + k);
  T tail = 0;
  for (; c < C; ++c) tail += f(c);
  return (((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]))) +
         tail;
}

template <typename T>
inline T dot(const T* a, const T* b, int64_t C) {
  return lane_sum<T>(C, [&](int64_t c) { return a[c] * b[c]; });
}

// The logit of edge e (source j, row i) and head h. GAT's tables are
// [N, H] (one term per node and head), GATv2's [N, H, C].
template <typename T, int KIND>
inline T logit(const Rows<const T>& ss, const Rows<const T>& sd,
               const Rows<const T>& ed, const T* att, int64_t j, int64_t i,
               int64_t e, int64_t h, int64_t C, T slope) {
  if (KIND == 0) {
    T v = *ss.at(j, h) + *sd.at(i, h);
    if (ed) v += *ed.at(e, h);
    return lrelu(v, slope);
  }
  if (KIND == 2) {
    const T *kj = ss.at(j, h), *qi = sd.at(i, h);
    if (ed) {
      const T* eh = ed.at(e, h);
      return lane_sum<T>(C, [&](int64_t c) { return (kj[c] + eh[c]) * qi[c]; }) /
             slope;
    }
    return dot(kj, qi, C) / slope;
  }
  const T *sj = ss.at(j, h), *si = sd.at(i, h), *a = att + h * C;
  if (ed) {
    const T* eh = ed.at(e, h);
    return lane_sum<T>(C, [&](int64_t c) {
      return a[c] * lrelu(sj[c] + si[c] + eh[c], slope);
    });
  }
  return lane_sum<T>(
      C, [&](int64_t c) { return a[c] * lrelu(sj[c] + si[c], slope); });
}

// Rows gathered by index are the chunk's cache misses: ask for the rows of
// the edge kAhead places on (in the chunk, across row ends: a row's first
// edges are then in flight before it starts) while this one is computed.
// Eight edges ahead was the fastest of 2-16 on a 200k-row chunk (2 cores).
constexpr int64_t kAhead = 8;

template <typename T>
inline void prefetch_rows(const Rows<T>& t, int64_t n, int64_t H, int64_t C) {
  for (int64_t h = 0; h < H; ++h) {
    const char* p = reinterpret_cast<const char*>(t.at(n, h));
    for (int64_t b = 0; b < C * static_cast<int64_t>(sizeof(T)); b += 64)
      __builtin_prefetch(p + b);
  }
}

// The score row of source n: GAT's [H] terms, GATv2's and the dot
// product's [H, C] rows.
template <typename T, int KIND>
inline void prefetch_score(const Rows<T>& ss, int64_t n, int64_t H,
                           int64_t C) {
  if (KIND == 0)
    __builtin_prefetch(ss.at(n, 0));
  else
    prefetch_rows(ss, n, H, C);
}

template <typename T>
inline const T* ptr_or_null(const torch::Tensor& t) {
  return t.numel() ? t.data_ptr<T>() : nullptr;
}

// One chunk folded into the running max, sum and (unnormalized) output of
// its rows; rows with no edge in the chunk are untouched.
template <typename T, typename I, int KIND>
void forward_impl(const torch::Tensor& crow, const torch::Tensor& col,
                  const torch::Tensor& s_src, const torch::Tensor& s_dst,
                  const torch::Tensor& edge, const torch::Tensor& att,
                  const torch::Tensor& value, const torch::Tensor& mask,
                  torch::Tensor& run_max, torch::Tensor& run_sum,
                  torch::Tensor& out, double slope_d) {
  const int64_t R = crow.numel() - 1;
  const int64_t H = run_max.size(1), C = value.size(2);
  const I* rp = crow.data_ptr<I>();
  const I* cl = col.data_ptr<I>();
  const Rows<const T> ss(s_src), sd(s_dst), ed(edge), val(value);
  const T *at = ptr_or_null<T>(att), *mk = ptr_or_null<T>(mask);
  T *mx = run_max.data_ptr<T>(), *sm = run_sum.data_ptr<T>();
  const Rows<T> o(out);
  const int64_t E = col.numel();
  const T slope = static_cast<T>(slope_d);
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    std::vector<T> logits, nmax(H), scale(H);
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t e0 = rp[i], e1 = rp[i + 1];
      if (e1 == e0) continue;
      logits.resize((e1 - e0) * H);
      for (int64_t h = 0; h < H; ++h) nmax[h] = mx[i * H + h];
      for (int64_t e = e0; e < e1; ++e) {
        const int64_t j = cl[e];
        if (e + kAhead < E) {
          prefetch_rows(val, cl[e + kAhead], H, C);
          if (ss.p != val.p)  // GATv2's score rows are its value rows
            prefetch_score<const T, KIND>(ss, cl[e + kAhead], H, C);
        }
        for (int64_t h = 0; h < H; ++h) {
          const T a = logit<T, KIND>(ss, sd, ed, at, j, i, e, h, C, slope);
          logits[(e - e0) * H + h] = a;
          if (a > nmax[h]) nmax[h] = a;
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        const T old = mx[i * H + h];
        scale[h] = nmax[h] == -std::numeric_limits<T>::infinity()
                       ? T(0) : std::exp(old - nmax[h]);
        sm[i * H + h] *= scale[h];
        mx[i * H + h] = nmax[h];
        T* oh = o.at(i, h);
        for (int64_t c = 0; c < C; ++c) oh[c] *= scale[h];
      }
      for (int64_t e = 0; e < e1 - e0; ++e)
        for (int64_t h = 0; h < H; ++h) logits[e * H + h] -= nmax[h];
      exp_nonpositive_inplace(logits.data(), (e1 - e0) * H);
      for (int64_t e = e0; e < e1; ++e) {
        const int64_t j = cl[e];
        for (int64_t h = 0; h < H; ++h) {
          T w = logits[(e - e0) * H + h];
          sm[i * H + h] += w;
          if (mk) w *= mk[e * H + h];
          T* oh = o.at(i, h);
          const T* vh = val.at(j, h);
          for (int64_t c = 0; c < C; ++c) oh[c] += w * vh[c];
        }
      }
    }
  });
}

// Backward over destination rows, probabilities recomputed from the final
// max and sum: per edge the weight p*z of the value gradient (w) and the
// gradient of the pre-activation (GAT, [E, H]) or of the logit (GATv2,
// dot; [E, H]) (ds); the destination terms' gradient (added); for GATv2
// and dot the per-channel edge gradient (written); for GATv2 the gradient
// of att (added, one [H, C] slab per thread).
template <typename T, typename I, int KIND>
void backward_rows_impl(const torch::Tensor& crow, const torch::Tensor& col,
                        const torch::Tensor& s_src, const torch::Tensor& s_dst,
                        const torch::Tensor& edge, const torch::Tensor& att,
                        const torch::Tensor& value, const torch::Tensor& mask,
                        const torch::Tensor& run_max,
                        const torch::Tensor& run_sum,
                        const torch::Tensor& grad_out,
                        const torch::Tensor& delta, torch::Tensor& w_out,
                        torch::Tensor& ds_out, torch::Tensor& grad_dst,
                        torch::Tensor& grad_edge, torch::Tensor& grad_att,
                        double slope_d) {
  const int64_t R = crow.numel() - 1;
  const int64_t H = run_max.size(1), C = value.size(2);
  const I* rp = crow.data_ptr<I>();
  const I* cl = col.data_ptr<I>();
  const Rows<const T> ss(s_src), sd(s_dst), ed(edge), val(value);
  const Rows<const T> go(grad_out);
  const T *at = ptr_or_null<T>(att), *mk = ptr_or_null<T>(mask);
  const T *mx = run_max.data_ptr<T>(), *sm = run_sum.data_ptr<T>();
  const T* dl = delta.data_ptr<T>();
  T *w = w_out.data_ptr<T>(), *ds = ds_out.data_ptr<T>();
  const Rows<T> gd(grad_dst), ge(grad_edge);
  T* ga = grad_att.numel() ? grad_att.data_ptr<T>() : nullptr;
  const T slope = static_cast<T>(slope_d);
  const int64_t E = col.numel();
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    T* ga_t = ga ? ga + at::get_thread_num() * H * C : nullptr;
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t e0 = rp[i], e1 = rp[i + 1];
      // The row's probabilities, into w: logits, exp, over the sum.
      for (int64_t e = e0; e < e1; ++e) {
        if (e + kAhead < E) {
          prefetch_rows(val, cl[e + kAhead], H, C);
          if (ss.p != val.p)  // GATv2's score rows are its value rows
            prefetch_score<const T, KIND>(ss, cl[e + kAhead], H, C);
        }
        for (int64_t h = 0; h < H; ++h)
          w[e * H + h] =
              logit<T, KIND>(ss, sd, ed, at, cl[e], i, e, h, C, slope) -
              mx[i * H + h];
      }
      exp_nonpositive_inplace(w + e0 * H, (e1 - e0) * H);
      for (int64_t e = e0; e < e1; ++e)
        for (int64_t h = 0; h < H; ++h)
          w[e * H + h] /= sm[i * H + h] + static_cast<T>(kEps);
      for (int64_t e = e0; e < e1; ++e) {
        const int64_t j = cl[e];
        for (int64_t h = 0; h < H; ++h) {
          const T p = w[e * H + h];
          const T z = mk ? mk[e * H + h] : T(1);
          const T *gh = go.at(i, h), *vh = val.at(j, h);
          const T da = p * (z * dot(gh, vh, C) - dl[i * H + h]);
          w[e * H + h] = p * z;
          if (KIND == 0) {
            T pre = *ss.at(j, h) + *sd.at(i, h);
            if (ed) pre += *ed.at(e, h);
            const T g = da * lrelu_grad(pre, slope);
            ds[e * H + h] = g;
            *gd.at(i, h) += g;
          } else if (KIND == 2) {
            // d a / d q_i = (k_j + e) / d, d a / d e = q_i / d.
            ds[e * H + h] = da;
            const T g = da / slope;
            const T *kj = ss.at(j, h), *qi = sd.at(i, h);
            T* gdi = gd.at(i, h);
            if (ed) {
              const T* eh = ed.at(e, h);
              for (int64_t c = 0; c < C; ++c) gdi[c] += g * (kj[c] + eh[c]);
              if (ge) {
                T* geh = ge.at(e, h);
                for (int64_t c = 0; c < C; ++c) geh[c] = g * qi[c];
              }
            } else {
              for (int64_t c = 0; c < C; ++c) gdi[c] += g * kj[c];
            }
          } else {
            ds[e * H + h] = da;
            const T *ah = at + h * C, *sj = ss.at(j, h), *si = sd.at(i, h);
            T* gdi = gd.at(i, h);
            T* gah = ga_t + h * C;
            if (ed) {
              const T* eh = ed.at(e, h);
              T* geh = ge ? ge.at(e, h) : nullptr;
              for (int64_t c = 0; c < C; ++c) {
                const T pre = sj[c] + si[c] + eh[c];
                const T g = da * ah[c] * lrelu_grad(pre, slope);
                gdi[c] += g;
                gah[c] += da * lrelu(pre, slope);
              }
              if (geh) {
                for (int64_t c = 0; c < C; ++c)
                  geh[c] = da * ah[c] *
                           lrelu_grad(sj[c] + si[c] + eh[c], slope);
              }
            } else {
              for (int64_t c = 0; c < C; ++c) {
                const T pre = sj[c] + si[c];
                gdi[c] += da * ah[c] * lrelu_grad(pre, slope);
                gah[c] += da * lrelu(pre, slope);
              }
            }
          }
        }
      }
    }
  });
}

// Backward over sources (the transposed chunk: rows are sources, perm maps
// its entries to chunk edges): the value gradient sum_e w_e dO_i, and the
// source terms' gradient (GAT: sum_e ds_e; GATv2: per channel; dot: the
// keys' gradient sum_e ds_e q_i / d).
template <typename T, typename I, int KIND>
void backward_cols_impl(const torch::Tensor& crow_t, const torch::Tensor& col_t,
                        const torch::Tensor& perm, const torch::Tensor& s_src,
                        const torch::Tensor& s_dst, const torch::Tensor& edge,
                        const torch::Tensor& att, const torch::Tensor& grad_out,
                        const torch::Tensor& w, const torch::Tensor& ds,
                        torch::Tensor& grad_value, torch::Tensor& grad_src,
                        double slope_d) {
  const int64_t S = crow_t.numel() - 1;
  const int64_t H = w.size(1), C = grad_out.size(2);
  const I* rp = crow_t.data_ptr<I>();
  const I* cl = col_t.data_ptr<I>();
  const I* pm = perm.data_ptr<I>();
  const Rows<const T> ss(s_src), sd(s_dst), ed(edge), go(grad_out);
  const T* at = ptr_or_null<T>(att);
  const T *wp = w.data_ptr<T>(), *dsp = ds.data_ptr<T>();
  const Rows<T> gv(grad_value), gs(grad_src);
  const T slope = static_cast<T>(slope_d);
  const int64_t E = col_t.numel();
  at::parallel_for(0, S, 64, [&](int64_t s0, int64_t s1) {
    for (int64_t j = s0; j < s1; ++j) {
      for (int64_t k = rp[j]; k < rp[j + 1]; ++k) {
        const int64_t i = cl[k], e = pm[k];
        if (k + kAhead < E) {  // the edge's gradient rows, its weights
          const int64_t ia = cl[k + kAhead], ea = pm[k + kAhead];
          prefetch_rows(go, ia, H, C);
          __builtin_prefetch(wp + ea * H);
          __builtin_prefetch(dsp + ea * H);
          if (KIND != 0) prefetch_rows(sd, ia, H, C);
        }
        for (int64_t h = 0; h < H; ++h) {
          const T* gh = go.at(i, h);
          if (gv) {
            const T we = wp[e * H + h];
            T* gvh = gv.at(j, h);
            for (int64_t c = 0; c < C; ++c) gvh[c] += we * gh[c];
          }
          if (!gs) continue;
          const T g = dsp[e * H + h];
          if (KIND == 0) {
            *gs.at(j, h) += g;
          } else if (KIND == 2) {
            const T gq = g / slope;
            const T* qi = sd.at(i, h);
            T* gsh = gs.at(j, h);
            for (int64_t c = 0; c < C; ++c) gsh[c] += gq * qi[c];
          } else {
            const T *ah = at + h * C, *sj = ss.at(j, h), *si = sd.at(i, h);
            T* gsh = gs.at(j, h);
            if (ed) {
              const T* eh = ed.at(e, h);
              for (int64_t c = 0; c < C; ++c)
                gsh[c] += g * ah[c] * lrelu_grad(sj[c] + si[c] + eh[c], slope);
            } else {
              for (int64_t c = 0; c < C; ++c)
                gsh[c] += g * ah[c] * lrelu_grad(sj[c] + si[c], slope);
            }
          }
        }
      }
    }
  });
}

#define DISPATCH_KIND(kind, ...)                 \
  if ((kind) == 0) {                             \
    constexpr int KIND = 0;                      \
    __VA_ARGS__();                               \
  } else if ((kind) == 1) {                      \
    constexpr int KIND = 1;                      \
    __VA_ARGS__();                               \
  } else {                                       \
    TORCH_CHECK((kind) == 2, "fused attention: score kind ", (kind),  \
                " is not 0, 1 or 2");           \
    constexpr int KIND = 2;                      \
    __VA_ARGS__();                               \
  }

void forward(int64_t kind, torch::Tensor crow, torch::Tensor col,
             torch::Tensor s_src, torch::Tensor s_dst, torch::Tensor edge,
             torch::Tensor att, torch::Tensor value, torch::Tensor mask,
             torch::Tensor run_max, torch::Tensor run_sum, torch::Tensor out,
             double slope) {
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "fused_forward", [&] {
    using T = scalar_t;
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "fused_forward_idx", [&] {
      using I = index_t;
      DISPATCH_KIND(kind, [&] {
        forward_impl<T, I, KIND>(crow, col, s_src, s_dst, edge, att, value,
                                 mask, run_max, run_sum, out, slope);
      });
    });
  });
}

void backward_rows(int64_t kind, torch::Tensor crow, torch::Tensor col,
                   torch::Tensor s_src, torch::Tensor s_dst,
                   torch::Tensor edge, torch::Tensor att, torch::Tensor value,
                   torch::Tensor mask, torch::Tensor run_max,
                   torch::Tensor run_sum, torch::Tensor grad_out,
                   torch::Tensor delta, torch::Tensor w, torch::Tensor ds,
                   torch::Tensor grad_dst, torch::Tensor grad_edge,
                   torch::Tensor grad_att, double slope) {
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "fused_backward_rows", [&] {
    using T = scalar_t;
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "fused_bwd_rows_idx", [&] {
      using I = index_t;
      DISPATCH_KIND(kind, [&] {
        backward_rows_impl<T, I, KIND>(crow, col, s_src, s_dst, edge, att,
                                       value, mask, run_max, run_sum,
                                       grad_out, delta, w, ds, grad_dst,
                                       grad_edge, grad_att, slope);
      });
    });
  });
}

void backward_cols(int64_t kind, torch::Tensor crow_t, torch::Tensor col_t,
                   torch::Tensor perm, torch::Tensor s_src,
                   torch::Tensor s_dst, torch::Tensor edge, torch::Tensor att,
                   torch::Tensor grad_out, torch::Tensor w, torch::Tensor ds,
                   torch::Tensor grad_value, torch::Tensor grad_src,
                   double slope) {
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "fused_backward_cols", [&] {
    using T = scalar_t;
    AT_DISPATCH_INDEX_TYPES(col_t.scalar_type(), "fused_bwd_cols_idx", [&] {
      using I = index_t;
      DISPATCH_KIND(kind, [&] {
        backward_cols_impl<T, I, KIND>(crow_t, col_t, perm, s_src, s_dst,
                                       edge, att, grad_out, w, ds,
                                       grad_value, grad_src, slope);
      });
    });
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused attention forward over one chunk");
  m.def("backward_rows", &backward_rows,
        "fused attention backward over destination rows");
  m.def("backward_cols", &backward_cols,
        "fused attention backward over sources (transposed chunk)");
}
