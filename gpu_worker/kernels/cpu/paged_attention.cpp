// A plain layer's whole paged attention for one step on the CPU, as the compiled forward's C++ wrapper
// calls it: it stores the step's K/V in the pool, attends decodes and short chunks with the paged
// decode kernel and prompt chunks with SDPA, without entering Python once per layer. The step's
// metadata is set once per step (set_attention_step, as vLLM's forward context); a step or layer it
// does not cover (cascade attention, a variant) goes to the Python op `cbserve::paged_attention`.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <vector>

// paged_decode.cpp
void paged_decode_attention(at::Tensor out, at::Tensor query, at::Tensor k_pool, at::Tensor v_pool,
                            at::Tensor block_tables, at::Tensor seq_lens, at::Tensor query_start_loc,
                            double scale);

namespace {

struct StepPlan {
    std::vector<at::Tensor> k_pools, v_pools;  // [num_blocks, block_size, KVH, D] per layer
    at::Tensor slot_mapping;                   // [T] int64
    at::Tensor block_tables;                   // [B, max_blocks] int32
    at::Tensor seq_lens;                       // [B] int32
    at::Tensor query_start_loc;                // [B + 1] int32
    int64_t num_decodes = 0;
    int64_t kernel_max_queries = 0;  // a later chunk of at most this many queries goes to the kernel
};

// The step running now on this thread, when this op attends it.
thread_local std::optional<StepPlan> plan;

void set_attention_step(std::vector<at::Tensor> k_pools, std::vector<at::Tensor> v_pools,
                        at::Tensor slot_mapping, at::Tensor block_tables, at::Tensor seq_lens,
                        at::Tensor query_start_loc, int64_t num_decodes, int64_t kernel_max_queries) {
    TORCH_CHECK(k_pools.size() == v_pools.size(), "set_attention_step: K and V pools differ in number");
    TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                    seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous() &&
                    query_start_loc.scalar_type() == at::kInt && query_start_loc.is_contiguous(),
                "set_attention_step: int64 slots, int32 lengths and query starts, contiguous");
    plan = StepPlan{std::move(k_pools), std::move(v_pools), std::move(slot_mapping), std::move(block_tables),
                    std::move(seq_lens), std::move(query_start_loc), num_decodes, kernel_max_queries};
}

void clear_attention_step() { plan.reset(); }

// One prompt chunk of sequence b by SDPA: a first chunk over its own K/V (causal), a later one over
// its blocks read back from the pool, each query up to its own position.
void attend_chunk(const StepPlan& p, at::Tensor& out, const at::Tensor& q, const at::Tensor& key,
                  const at::Tensor& value, const at::Tensor& k_pool, const at::Tensor& v_pool, int64_t b,
                  double scale) {
    const int32_t* qsl = p.query_start_loc.data_ptr<int32_t>();
    const int64_t start = qsl[b], end = qsl[b + 1], context_len = p.seq_lens.data_ptr<int32_t>()[b];
    const int64_t cached = context_len - (end - start);
    const at::Tensor qc = q.slice(0, start, end).transpose(0, 1).unsqueeze(0);  // [1, H, n, D]
    at::Tensor kc, vc;
    std::optional<at::Tensor> mask;
    if (cached == 0) {
        kc = key.slice(0, start, end).transpose(0, 1).unsqueeze(0);
        vc = value.slice(0, start, end).transpose(0, 1).unsqueeze(0);
    } else {
        const int64_t block_size = k_pool.size(1);
        const at::Tensor table = p.block_tables.select(0, b).slice(0, 0, (context_len + block_size - 1) / block_size);
        auto read = [&](const at::Tensor& pool) {
            return pool.index_select(0, table).flatten(0, 1).slice(0, 0, context_len).to(q.scalar_type())
                .transpose(0, 1).unsqueeze(0);  // [1, KVH, context_len, D]
        };
        kc = read(k_pool);
        vc = read(v_pool);
        const auto opts = at::TensorOptions().dtype(at::kLong);
        mask = at::arange(context_len, opts).unsqueeze(0) <= at::arange(cached, context_len, opts).unsqueeze(1);
    }
    const at::Tensor attn = at::scaled_dot_product_attention(qc, kc, vc, mask, 0.0, /*is_causal=*/cached == 0,
                                                             scale, /*enable_gqa=*/true);
    out.slice(0, start, end).copy_(attn.select(0, 0).transpose(0, 1));
}

at::Tensor python_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            at::Tensor& k_cache, at::Tensor& v_cache, int64_t layer, double scale,
                            std::optional<int64_t> window) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("cbserve::paged_attention", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                 at::Tensor&, at::Tensor&, int64_t, double,
                                                 std::optional<int64_t>)>();
    return op.call(query, key, value, k_cache, v_cache, layer, scale, window);
}

// query [T, H, D], key/value [T, KVH, D] (after RoPE), the layer's pools (written) -> [T, H, D]; the
// Python op's contract.
at::Tensor paged_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           at::Tensor& k_cache, at::Tensor& v_cache, int64_t layer, double scale,
                           std::optional<int64_t> window) {
    if (!plan.has_value() || window.has_value())
        return python_attention(query, key, value, k_cache, v_cache, layer, scale, window);
    const StepPlan& p = *plan;
    TORCH_CHECK(layer >= 0 && layer < static_cast<int64_t>(p.k_pools.size()), "paged_attention: no pool for layer ", layer);
    TORCH_CHECK(k_cache.data_ptr() == p.k_pools[layer].data_ptr() && v_cache.data_ptr() == p.v_pools[layer].data_ptr(),
                "paged_attention: the pools given are not the step's pools of layer ", layer);
    const at::Tensor& k_pool = k_cache;
    const at::Tensor& v_pool = v_cache;
    const at::Tensor q = query.contiguous();
    for (const auto& [pool, x] : {std::pair{k_pool, key}, std::pair{v_pool, value}})
        pool.view({-1, pool.size(2), pool.size(3)}).index_copy_(0, p.slot_mapping, x.to(pool.scalar_type()));
    at::Tensor out = at::empty_like(q);
    const int32_t* qsl = p.query_start_loc.data_ptr<int32_t>();
    const int32_t* lens = p.seq_lens.data_ptr<int32_t>();
    const int64_t num_seqs = p.seq_lens.size(0);
    // Consecutive sequences the kernel attends go to it in one call: its threads share them out.
    int64_t run = -1;
    auto flush = [&](int64_t end) {
        if (run < 0) return;
        paged_decode_attention(out, q, k_pool, v_pool, p.block_tables.slice(0, run, end),
                               p.seq_lens.slice(0, run, end), p.query_start_loc.slice(0, run, end + 1), scale);
        run = -1;
    };
    for (int64_t b = 0; b < num_seqs; ++b) {
        const int64_t n = qsl[b + 1] - qsl[b];
        if (b < p.num_decodes || (lens[b] > n && n <= p.kernel_max_queries)) {
            if (run < 0) run = b;
            continue;
        }
        flush(b);
        attend_chunk(p, out, q, key, value, k_pool, v_pool, b, scale);
    }
    flush(num_seqs);
    return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cbserve_cpu, m) {
    m.def("set_attention_step(Tensor[] k_pools, Tensor[] v_pools, Tensor slot_mapping, Tensor block_tables, "
          "Tensor seq_lens, Tensor query_start_loc, int num_decodes, int kernel_max_queries) -> ()",
          &set_attention_step);
    m.def("clear_attention_step() -> ()", &clear_attention_step);
    // The layer's pools are arguments, declared written (a!, b!), so a compiled graph orders this op
    // before anything that reads them.
    m.def("paged_attention(Tensor query, Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, "
          "int layer, float scale, int? window=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(cbserve_cpu, CPU, m) { m.impl("paged_attention", &paged_attention); }
