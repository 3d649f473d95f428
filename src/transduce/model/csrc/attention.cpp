// Attention of a decoding step on the CPU: a few queries per (sentence, head) over a short cache, float32.
//
// transduce.model.kernels builds this file on first use (torch.utils.cpp_extension) and
// transduce.model.step.decode_step calls it instead of torch's scaled_dot_product_attention, whose cost per
// (row, head) is made for long query blocks: for the one new query of a step it spent about 0.2-0.3 ms a call on
// the Multi30k model, of which the arithmetic is a few microseconds (see RESULTS_speed.md).
//
// For each (n, h): scores = q k^T * scale over the T keys (masked keys excluded), softmax, weighted sum of v. The
// same formula as scaled_dot_product_attention (max-subtracted softmax in float32); the exponential is a
// polynomial accurate to about two units in the last place, so the outputs agree to float rounding, not bit for
// bit. A query with no key left to attend (every key masked) gets zeros.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// e^x for x <= 0; 0 below -87 (where e^x leaves float's normal range) and for -inf. Cody-Waite reduction
// x = n ln2 + r, |r| <= ln2 / 2, and a degree-6 polynomial for e^r (Cephes' expf coefficients), branch-free so
// that the loops calling it are vectorised.
inline float exp_nonpositive(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  const float n = __builtin_rintf(xc * 1.44269504088896341f);
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &y, sizeof bits);
  bits += static_cast<int32_t>(n) << 23;
  std::memcpy(&y, &bits, sizeof y);
  return x < -87.0f ? 0.0f : y;
}

// One query over T keys. D > 0: the head size fixed at compile time (the loops unrolled, the accumulator in
// registers); D == 0: the head size d at run time.
template <int64_t D>
void attend_one(const float* __restrict q, const float* __restrict k, int64_t k_step, const float* __restrict v,
                int64_t v_step, const bool* mask, int64_t mask_step, int64_t T, int64_t d, float scale,
                float* __restrict p, float* __restrict acc, float* __restrict out) {
  const int64_t dim = D > 0 ? D : d;
  float top = kNegInf;
  for (int64_t t = 0; t < T; ++t) {
    const float* kt = k + t * k_step;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < dim; ++i) s += q[i] * kt[i];
    s = (mask == nullptr || mask[t * mask_step]) ? s * scale : kNegInf;
    p[t] = s;
    top = s > top ? s : top;
  }
  if (top == kNegInf) {  // nothing to attend
    for (int64_t i = 0; i < dim; ++i) out[i] = 0.0f;
    return;
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = 0; t < T; ++t) {
    const float e = exp_nonpositive(p[t] - top);
    p[t] = e;
    sum += e;
  }
  for (int64_t i = 0; i < dim; ++i) acc[i] = 0.0f;
  for (int64_t t = 0; t < T; ++t) {
    const float w = p[t];
    const float* vt = v + t * v_step;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) acc[i] += w * vt[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < dim; ++i) out[i] = acc[i] * inv;
}

}  // namespace

// q: (N, H, G, D), k and v: (N, H, T, D), mask: (N, T) bool (true: attend) or None; any strides but a unit
// stride along D (and T for the mask). Returns (N, G, H, D), contiguous: the heads of each query side by side.
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const c10::optional<torch::Tensor>& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attend: q, k and v must be 4-D");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "attend: CPU tensors only");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "attend: float32 tensors only");
  const int64_t N = q.size(0), H = q.size(1), G = q.size(2), d = q.size(3), T = k.size(2);
  TORCH_CHECK(k.size(0) == N && k.size(1) == H && k.size(3) == d && v.size(0) == N && v.size(1) == H &&
                  v.size(2) == T && v.size(3) == d,
              "attend: q ", q.sizes(), ", k ", k.sizes(), " and v ", v.sizes(), " do not match");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "attend: the last dimension must be dense");
  const bool* mask_data = nullptr;
  int64_t mask_row = 0, mask_step = 0;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->dim() == 2 && mask->size(0) == N && mask->size(1) == T,
                "attend: the mask must be (N, T) bool, got ", mask->sizes(), " ", mask->scalar_type());
    mask_data = mask->data_ptr<bool>();
    mask_row = mask->stride(0);
    mask_step = mask->stride(1);
  }
  auto out = torch::empty({N, G, H, d}, q.options());
  const float* qd = q.data_ptr<float>();
  const float* kd = k.data_ptr<float>();
  const float* vd = v.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t q0 = q.stride(0), q1 = q.stride(1), q2 = q.stride(2);
  const int64_t k0 = k.stride(0), k1 = k.stride(1), k2 = k.stride(2);
  const int64_t v0 = v.stride(0), v1 = v.stride(1), v2 = v.stride(2);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, G * T * d));
  at::parallel_for(0, N * H, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(T + d);
    float* p = scratch.data();
    float* acc = p + T;
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t n = nh / H, h = nh % H;
      const float* kb = kd + n * k0 + h * k1;
      const float* vb = vd + n * v0 + h * v1;
      const bool* m = mask_data == nullptr ? nullptr : mask_data + n * mask_row;
      for (int64_t g = 0; g < G; ++g) {
        const float* qg = qd + n * q0 + h * q1 + g * q2;
        float* o = od + ((n * G + g) * H + h) * d;
        switch (d) {
          case 32: attend_one<32>(qg, kb, k2, vb, v2, m, mask_step, T, d, sc, p, acc, o); break;
          case 64: attend_one<64>(qg, kb, k2, vb, v2, m, mask_step, T, d, sc, p, acc, o); break;
          case 128: attend_one<128>(qg, kb, k2, vb, v2, m, mask_step, T, d, sc, p, acc, o); break;
          default: attend_one<0>(qg, kb, k2, vb, v2, m, mask_step, T, d, sc, p, acc, o);
        }
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attend", &attend, "attention of a decoding step (see attention.cpp)", pybind11::arg("q"),
        pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("mask"), pybind11::arg("scale"));
}
