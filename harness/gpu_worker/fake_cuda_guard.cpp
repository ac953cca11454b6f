// A device guard for CUDA that does nothing, registered only in a torch built without CUDA
// (harness/gpu_worker/fake_cuda.py): fake `cuda` tensors need one for Python indexing (`x[:n]`), which
// sets the tensor's device first, though they hold no memory and no kernel ever runs on them.
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::CUDA>);
}
