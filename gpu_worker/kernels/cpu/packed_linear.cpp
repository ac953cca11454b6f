// y = x W^T + b with W in oneDNN's blocked layout (reordered once at load): mkldnn's own linear,
// called from C++ so that a compiled graph's C++ wrapper reaches it through the dispatcher without
// entering Python, several times per layer and step.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <string_view>

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& weight_packed,
                         const std::optional<at::Tensor>& bias, int64_t out_features) {
    static const auto linear =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                              std::string_view, c10::List<std::optional<at::Scalar>>,
                              std::optional<std::string_view>)>();
    at::Tensor y = linear.call(x.contiguous(), weight_packed, bias, "none",
                               c10::List<std::optional<at::Scalar>>(), std::string_view(""));
    TORCH_CHECK(y.size(-1) == out_features, "packed_linear: the weight has ", y.size(-1),
                " outputs, not ", out_features);
    return y;
}

TORCH_LIBRARY_FRAGMENT(cbserve_cpu, m) {
    m.def("packed_linear(Tensor x, Tensor weight_packed, Tensor? bias, int out_features) -> Tensor");
}

// The packed weight is an MkldnnCPU tensor, which selects that key.
TORCH_LIBRARY_IMPL(cbserve_cpu, MkldnnCPU, m) { m.impl("packed_linear", &packed_linear); }
