// Decode attention straight from the paged KV pool on the CPU: each sequence reads its keys and values
// through its block table once, with no gathered copy, for its one query (a decode) or its few last
// ones (a decode with drafts to verify). Float32 queries and arithmetic over a float32,
// bfloat16 or float16 pool (WORKER_KV_CACHE_DTYPE), no variant.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

// Keys ahead whose K/V rows are prefetched while one is read.
constexpr int64_t kPrefetchKeys = 4;

// Vec::size() pool elements as float32.
template <typename T>
inline Vec load_float(const T* p) {
    if constexpr (std::is_same_v<T, float>) {
        return Vec::loadu(p);
    } else {
        Vec out;
        at::vec::load_to_float<T>(p, out);
        return out;
    }
}

template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
    constexpr int64_t w = Vec::size();
    Vec s0(0.f), s1(0.f);
    int64_t i = 0;
    for (; i + 2 * w <= n; i += 2 * w) {
        s0 = at::vec::fmadd(Vec::loadu(a + i), load_float(b + i), s0);
        s1 = at::vec::fmadd(Vec::loadu(a + i + w), load_float(b + i + w), s1);
    }
    for (; i + w <= n; i += w) s0 = at::vec::fmadd(Vec::loadu(a + i), load_float(b + i), s0);
    float s = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, s0 + s1);
    for (; i < n; ++i) s += a[i] * static_cast<float>(b[i]);
    return s;
}

// y += p * x
template <typename T>
inline void axpy(float* y, float p, const T* x, int64_t n) {
    constexpr int64_t w = Vec::size();
    const Vec pv(p);
    int64_t i = 0;
    for (; i + w <= n; i += w) at::vec::fmadd(pv, load_float(x + i), Vec::loadu(y + i)).store(y + i);
    for (; i < n; ++i) y[i] += p * static_cast<float>(x[i]);
}

// s = exp(s - max(s)) in place; returns the sum.
inline float softmax_numerators(float* s, int64_t n) {
    const float m = at::vec::reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, s, n);
    at::vec::map([m](Vec x) { return (x - Vec(m)).exp(); }, s, s, n);
    return at::vec::reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, s, n);
}

}  // namespace

#define KV_POOL_TYPES(...)                                  \
    AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__)    \
    AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__) \
    AT_DISPATCH_CASE(at::ScalarType::Half, __VA_ARGS__)

// out, query [Q, H, D]; k_pool, v_pool [num_blocks, block_size, KVH, D]; block_tables [B, max_blocks]
// int32; seq_lens [B] int32 (keys of the sequence, its queries' own included); query_start_loc [B + 1]
// int32: sequence b's queries are rows query_start_loc[b] .. query_start_loc[b + 1] - 1, its last tokens
// (a decode's one, or a few drafts), each attending causally up to its own position.
void paged_decode_attention(at::Tensor out, at::Tensor query, at::Tensor k_pool,
                            at::Tensor v_pool, at::Tensor block_tables,
                            at::Tensor seq_lens, at::Tensor query_start_loc, double scale) {
    TORCH_CHECK(query.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
                "paged_decode_attention: float32 queries only");
    TORCH_CHECK(v_pool.scalar_type() == k_pool.scalar_type(), "paged_decode_attention: K and V pools differ");
    TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                    query_start_loc.scalar_type() == at::kInt,
                "paged_decode_attention: int32 block tables, sequence lengths and query starts");
    TORCH_CHECK(query.is_contiguous() && out.is_contiguous() && k_pool.is_contiguous() &&
                    v_pool.is_contiguous() && block_tables.is_contiguous() && seq_lens.is_contiguous() &&
                    query_start_loc.is_contiguous(),
                "paged_decode_attention: contiguous tensors only");
    const int64_t B = seq_lens.size(0), H = query.size(1), D = query.size(2);
    const int64_t BS = k_pool.size(1), KVH = k_pool.size(2), MB = block_tables.size(1);
    TORCH_CHECK(H % KVH == 0 && k_pool.size(3) == D && block_tables.size(0) == B &&
                    query_start_loc.size(0) == B + 1,
                "paged_decode_attention: shapes disagree");
    const int64_t group = H / KVH;
    const float* q = query.data_ptr<float>();
    AT_DISPATCH_SWITCH(k_pool.scalar_type(), "paged_decode_attention", KV_POOL_TYPES([&] {
        const scalar_t* kp = k_pool.data_ptr<scalar_t>();
        const scalar_t* vp = v_pool.data_ptr<scalar_t>();
        const int32_t* tables = block_tables.data_ptr<int32_t>();
        const int32_t* lens = seq_lens.data_ptr<int32_t>();
        const int32_t* qsl = query_start_loc.data_ptr<int32_t>();
        float* o = out.data_ptr<float>();
        const float fscale = static_cast<float>(scale);
        // A task is one sequence's KV heads, or a slice of them when there are fewer sequences than
        // threads: a whole sequence reads each token's K/V row contiguously, once for all its queries.
        const int64_t slices = std::min<int64_t>(KVH, std::max<int64_t>(1, (at::get_num_threads() + B - 1) / B));
        // Threads take tasks longest first from a shared counter: contexts differ by 10x or more, and
        // an equal count of tasks each (parallel_for's split of a range) left one thread the long ones.
        const int64_t num_tasks = B * slices;
        std::vector<int64_t> order(num_tasks);
        for (int64_t i = 0; i < num_tasks; ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
            return lens[a / slices] > lens[b / slices];
        });
        std::atomic<int64_t> next_task{0};

        at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_tasks), 1, [&](int64_t, int64_t) {
            std::vector<float> scores;
            std::vector<float> acc;
            for (int64_t i = next_task.fetch_add(1); i < num_tasks; i = next_task.fetch_add(1)) {
                const int64_t task = order[i];
                const int64_t b = task / slices, slice = task % slices;
                const int64_t kv0 = slice * KVH / slices, kv1 = (slice + 1) * KVH / slices;
                const int64_t h0 = kv0 * group, nh = (kv1 - kv0) * group;
                const int64_t n = lens[b], q0 = qsl[b], nq = qsl[b + 1] - qsl[b];
                const int32_t* table = tables + b * MB;
                // Query j of the sequence sees keys 0 .. first_unseen + j - 1.
                const int64_t first_unseen = n - nq + 1;
                // fn(h, t, x): for every key position t, x is the K (or V) vector each of the task's
                // heads h reads there, in the pool's row for t.
                auto row_of = [&](const scalar_t* pool, int64_t t) {
                    return pool + (static_cast<int64_t>(table[t / BS]) * BS + t % BS) * KVH * D;
                };
                const int64_t task_row_bytes = (kv1 - kv0) * D * static_cast<int64_t>(sizeof(scalar_t));
                auto for_each_key = [&](const scalar_t* pool, auto&& fn) {
                    for (int64_t t = 0; t < n; ++t) {
                        const scalar_t* row = row_of(pool, t);
                        // The hardware prefetchers stop at each 4 KiB page, and a block's pages lie
                        // anywhere in the pool: ask for the task's part of a row a few keys ahead, into
                        // every cache level (a non-temporal hint skips L2 on Intel: 3x slower there).
                        if (t + kPrefetchKeys < n) {
                            const char* ahead = reinterpret_cast<const char*>(row_of(pool, t + kPrefetchKeys) + kv0 * D);
                            for (int64_t off = 0; off < task_row_bytes; off += 64) __builtin_prefetch(ahead + off, 0, 3);
                        }
                        for (int64_t kvh = kv0; kvh < kv1; ++kvh)
                            for (int64_t g = 0; g < group; ++g) fn((kvh - kv0) * group + g, t, row + kvh * D);
                    }
                };
                // scores[(h * nq + j) * n + t]; a query's keys past its own position stay unused.
                scores.resize(nh * nq * n);
                for_each_key(kp, [&](int64_t h, int64_t t, const scalar_t* k) {
                    for (int64_t j = std::max<int64_t>(0, t - first_unseen + 1); j < nq; ++j)
                        scores[(h * nq + j) * n + t] = dot(q + ((q0 + j) * H + h0 + h) * D, k, D) * fscale;
                });
                std::vector<float> inv(nh * nq);
                for (int64_t h = 0; h < nh; ++h)
                    for (int64_t j = 0; j < nq; ++j)
                        inv[h * nq + j] = 1.f / softmax_numerators(scores.data() + (h * nq + j) * n, first_unseen + j);
                acc.assign(nh * nq * D, 0.f);
                for_each_key(vp, [&](int64_t h, int64_t t, const scalar_t* v) {
                    for (int64_t j = std::max<int64_t>(0, t - first_unseen + 1); j < nq; ++j)
                        axpy(acc.data() + (h * nq + j) * D, scores[(h * nq + j) * n + t], v, D);
                });
                for (int64_t j = 0; j < nq; ++j) {
                    float* oj = o + ((q0 + j) * H + h0) * D;
                    for (int64_t h = 0; h < nh; ++h)
                        for (int64_t d = 0; d < D; ++d) oj[h * D + d] = acc[(h * nq + j) * D + d] * inv[h * nq + j];
                }
            }
        });
    }));
}

TORCH_LIBRARY(cbserve_cpu, m) {
    m.def(
        "paged_decode_attention(Tensor(a!) out, Tensor query, Tensor k_pool, Tensor v_pool, "
        "Tensor block_tables, Tensor seq_lens, Tensor query_start_loc, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(cbserve_cpu, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }
