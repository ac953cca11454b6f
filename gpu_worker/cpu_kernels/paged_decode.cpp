// Decode attention straight from the paged KV pool on the CPU: each (sequence, KV head) reads its
// keys and values through its block table once, with no gathered copy. Float32, no variant.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

}  // namespace

// out, query [B, H, D]; k_pool, v_pool [num_blocks, block_size, KVH, D]; block_tables [B, max_blocks]
// int32; context_lens [B] int32 (keys each row attends over, its query's own included).
void paged_decode_attention(at::Tensor out, at::Tensor query, at::Tensor k_pool,
                            at::Tensor v_pool, at::Tensor block_tables,
                            at::Tensor context_lens, double scale) {
    TORCH_CHECK(query.scalar_type() == at::kFloat && k_pool.scalar_type() == at::kFloat &&
                    v_pool.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
                "paged_decode_attention: float32 only");
    TORCH_CHECK(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt,
                "paged_decode_attention: int32 block tables and context lengths");
    TORCH_CHECK(query.is_contiguous() && out.is_contiguous() && k_pool.is_contiguous() &&
                    v_pool.is_contiguous() && block_tables.is_contiguous() && context_lens.is_contiguous(),
                "paged_decode_attention: contiguous tensors only");
    const int64_t B = query.size(0), H = query.size(1), D = query.size(2);
    const int64_t BS = k_pool.size(1), KVH = k_pool.size(2), MB = block_tables.size(1);
    TORCH_CHECK(H % KVH == 0 && k_pool.size(3) == D, "paged_decode_attention: shapes disagree");
    const int64_t group = H / KVH;
    const float* q = query.data_ptr<float>();
    const float* kp = k_pool.data_ptr<float>();
    const float* vp = v_pool.data_ptr<float>();
    const int32_t* tables = block_tables.data_ptr<int32_t>();
    const int32_t* lens = context_lens.data_ptr<int32_t>();
    float* o = out.data_ptr<float>();
    const float fscale = static_cast<float>(scale);

    at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> scores;
        std::vector<float> acc(group * D);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t b = task / KVH, kvh = task % KVH;
            const int64_t n = lens[b];
            const int32_t* table = tables + b * MB;
            const float* qb = q + (b * H + kvh * group) * D;
            scores.assign(group * n, 0.f);
            for (int64_t t = 0; t < n; ++t) {
                const float* k = kp + ((static_cast<int64_t>(table[t / BS]) * BS + t % BS) * KVH + kvh) * D;
                for (int64_t g = 0; g < group; ++g) scores[g * n + t] = dot(qb + g * D, k, D) * fscale;
            }
            std::fill(acc.begin(), acc.end(), 0.f);
            std::vector<float> denom(group, 0.f);
            for (int64_t g = 0; g < group; ++g) {
                float* s = scores.data() + g * n;
                float m = -std::numeric_limits<float>::infinity();
                for (int64_t t = 0; t < n; ++t) m = std::max(m, s[t]);
                float sum = 0.f;
                for (int64_t t = 0; t < n; ++t) {
                    s[t] = std::exp(s[t] - m);
                    sum += s[t];
                }
                denom[g] = sum;
            }
            for (int64_t t = 0; t < n; ++t) {
                const float* v = vp + ((static_cast<int64_t>(table[t / BS]) * BS + t % BS) * KVH + kvh) * D;
                for (int64_t g = 0; g < group; ++g) {
                    const float p = scores[g * n + t];
                    float* a = acc.data() + g * D;
#pragma omp simd
                    for (int64_t d = 0; d < D; ++d) a[d] += p * v[d];
                }
            }
            for (int64_t g = 0; g < group; ++g) {
                float* ob = o + (b * H + kvh * group + g) * D;
                const float inv = 1.f / denom[g];
                for (int64_t d = 0; d < D; ++d) ob[d] = acc[g * D + d] * inv;
            }
        }
    });
}

TORCH_LIBRARY(cbserve_cpu, m) {
    m.def(
        "paged_decode_attention(Tensor(a!) out, Tensor query, Tensor k_pool, Tensor v_pool, "
        "Tensor block_tables, Tensor context_lens, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(cbserve_cpu, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }
