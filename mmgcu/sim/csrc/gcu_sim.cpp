// The simulated torch_gcu's native part for torch >= 2 (torch_gcu 2.x).
//
// Cards are PrivateUse1 devices (renamed "gcu", as torch_gcu 2.x does) or XLA devices (the
// torch_gcu 1.x device type, for rehearsing the legacy API on this torch). What both torch
// generations share is in gcu_sim.h; this file adds what torch 2 has and 1.10 lacks:
//   - the PrivateUse1 hooks autograd and the generators ask for;
//   - factories, views and resize with torch 2's signatures (SymInt sizes);
//   - convolution through at::convolution_backward;
//   - autocast policies for the cards' autocast keys.
#include "gcu_sim.h"

#include <ATen/autocast_mode.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/set_cpu_dispatch.h>

namespace mmgcu_sim {

C10_REGISTER_GUARD_IMPL(PrivateUse1, SimGuardImpl<c10::DeviceType::PrivateUse1>);
C10_REGISTER_GUARD_IMPL(XLA, SimGuardImpl<c10::DeviceType::XLA>);

static SimAllocator<c10::DeviceType::PrivateUse1> g_pu1_allocator;
static SimAllocator<c10::DeviceType::XLA> g_xla_allocator;

// ---------------------------------------------------------------------------- hooks
struct SimPrivateUse1Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(g_card_count.load());
  }
  c10::DeviceIndex getCurrentDevice() const override { return t_current; }
  void setCurrentDevice(c10::DeviceIndex d) const override { t_current = d; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = t_current;
    t_current = d;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override {
    return at::make_generator<at::CPUGeneratorImpl>(c10::detail::getNonDeterministicRandom());
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, t_current);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

// ---------------------------------------------------------------------------- kernels
template <c10::DeviceType T>
constexpr c10::DispatchKey backend_key() {
  return T == c10::DeviceType::XLA ? c10::DispatchKey::XLA : c10::DispatchKey::PrivateUse1;
}

template <c10::DeviceType T>
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device, std::optional<bool> pin,
                               std::optional<c10::MemoryFormat> memory_format) {
  const auto dev = checked_device<T>(device);
  const c10::DeviceGuard guard(dev);
  at::Tensor t = at::detail::empty_generic(size, at::GetAllocator(T),
                                     c10::DispatchKeySet(backend_key<T>()),
                                     c10::dtype_or_default(dtype), memory_format);
  graph::fresh(t);
  return t;
}

template <c10::DeviceType T>
at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin) {
  const auto dev = checked_device<T>(device);
  const c10::DeviceGuard guard(dev);
  at::Tensor t = at::detail::empty_strided_generic(size, stride, at::GetAllocator(T),
                                             c10::DispatchKeySet(backend_key<T>()),
                                             c10::dtype_or_default(dtype));
  graph::fresh(t);
  return t;
}

static at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                             c10::SymIntArrayRef stride,
                             std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, storage_offset);
}

static const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                                 std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  const void* before = self.storage().data_ptr().get_context();
  const uint64_t value = graph::storage_value(self);
  const auto& out = at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
  if (self.storage().data_ptr().get_context() != before) graph::resized(self, value);
  return out;
}

static at::Tensor _reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                                 c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

// torch_gcu 2.x's cards (PrivateUse1) are strided, as CUDA's: a view its strides cannot
// express is refused. torch_gcu 1.x's are XLA devices (see xla_view in gcu_sim.h).
template <c10::DeviceType T>
static at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  return T == c10::DeviceType::XLA ? xla_view(self, sizes) : at::native::view(self, sizes);
}

static at::Tensor& set_source_Storage_storage_offset_(at::Tensor& self, at::Storage storage,
                                                      c10::SymInt offset,
                                                      c10::SymIntArrayRef size,
                                                      c10::SymIntArrayRef stride) {
  return at::cpu::set__symint(self, storage, offset, size, stride);
}

// Convolution: PyTorch routes backends it does not know to these two "overrideable" ops,
// which every out-of-tree backend implements; here they run the CPU kernels on host memory,
// half inputs in float32 (see gcu_sim.h).
static at::Tensor convolution_overrideable(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
    bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups) {
  expect_same_device(input, weight);
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  expect_same_device(input, b);
  auto x = host_alias(input);
  auto w = host_alias(weight);
  auto hb = host_or_undefined(b);
  const auto half = shared_half_type({input, weight, b});
  if (half) {
    x = as_float32(x);
    w = as_float32(w);
    hb = as_float32(hb);
  }
  graph::KernelNode node("aten::convolution_overrideable", input);
  node.tensor(input).tensor(weight).tensor(b).ints(C10_AS_INTARRAYREF_SLOW(stride));
  node.ints(C10_AS_INTARRAYREF_SLOW(padding)).ints(C10_AS_INTARRAYREF_SLOW(dilation));
  node.ints(C10_AS_INTARRAYREF_SLOW(output_padding)).number(transposed);
  node.number(static_cast<double>(groups.guard_int(__FILE__, __LINE__)));
  auto out = at::convolution_symint(x, w, hb, stride, padding, dilation, transposed,
                                    output_padding, groups);
  out = onto_card(out, input.device(), half);
  node.output(out, 0);
  return out;
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
    bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups,
    std::array<bool, 3> output_mask) {
  expect_same_device(input, weight);
  expect_same_device(input, grad_output);
  auto gy = host_alias(grad_output);
  auto x = host_alias(input);
  auto w = host_alias(weight);
  const auto half = shared_half_type({grad_output, input, weight});
  if (half) {
    gy = as_float32(gy);
    x = as_float32(x);
    w = as_float32(w);
  }
  std::vector<c10::SymInt> bias_sizes{grad_output.sym_size(1)};
  auto grads = at::convolution_backward_symint(
      gy, x, w, output_mask[2] ? std::optional<c10::SymIntArrayRef>(bias_sizes) : std::nullopt,
      stride, padding, dilation, transposed, output_padding, groups, output_mask);
  const auto card = input.device();
  graph::KernelNode node("aten::convolution_backward_overrideable", input);
  node.tensor(grad_output).tensor(input).tensor(weight).ints(C10_AS_INTARRAYREF_SLOW(stride));
  node.ints(C10_AS_INTARRAYREF_SLOW(padding)).ints(C10_AS_INTARRAYREF_SLOW(dilation));
  node.ints(C10_AS_INTARRAYREF_SLOW(output_padding)).number(transposed);
  node.number(static_cast<double>(groups.guard_int(__FILE__, __LINE__)));
  node.ints(std::vector<int64_t>{output_mask[0], output_mask[1], output_mask[2]});
  std::tuple<at::Tensor, at::Tensor, at::Tensor> result{
      onto_card(std::get<0>(grads), card, half), onto_card(std::get<1>(grads), card, half),
      onto_card(std::get<2>(grads), card, half)};
  node.output(std::get<0>(result), 0);
  node.output(std::get<1>(result), 1);
  node.output(std::get<2>(result), 2);
  return result;
}

#define MMGCU_SIM_KERNELS(KEY, TYPE)                                                     \
  TORCH_LIBRARY_IMPL(aten, KEY, m) {                                                     \
    m.impl("empty.memory_format", empty_memory_format<c10::DeviceType::TYPE>);           \
    m.impl("empty_strided", empty_strided<c10::DeviceType::TYPE>);                       \
    m.impl("as_strided", as_strided);                                                    \
    m.impl("resize_", resize_);                                                          \
    m.impl("_reshape_alias", _reshape_alias);                                            \
    m.impl("view", view<c10::DeviceType::TYPE>);                                         \
    m.impl("_copy_from", copy_from);                                                     \
    m.impl("_copy_from_and_resize", copy_from_and_resize);                               \
    m.impl("_local_scalar_dense", local_scalar_dense);                                   \
    m.impl("set_.source_Tensor", set_source_Tensor_);                                    \
    m.impl("set_.source_Storage", set_source_Storage_);                                  \
    m.impl("set_.source_Storage_storage_offset", set_source_Storage_storage_offset_);    \
    m.impl("convolution_overrideable", convolution_overrideable);                        \
    m.impl("convolution_backward_overrideable", convolution_backward_overrideable);      \
  }                                                                                      \
  TORCH_LIBRARY_IMPL(_, KEY, m) {                                                        \
    m.fallback(torch::CppFunction::makeFromBoxedFunction<&card_fallback>());             \
  }

MMGCU_SIM_KERNELS(PrivateUse1, PrivateUse1)
MMGCU_SIM_KERNELS(XLA, XLA)
TORCH_LIBRARY_IMPL(aten, XLA, m) { register_whole_ops(m); }

// Autocast: like torch_gcu (and torch_xla), register PyTorch's own cast policies for the
// card's autocast key, and let every other op fall through.
#define MMGCU_SIM_AUTOCAST(KEY, TYPE)                                                     \
  TORCH_LIBRARY_IMPL(_, KEY, m) { m.fallback(torch::CppFunction::makeFallthrough()); }   \
  TORCH_LIBRARY_IMPL(aten, KEY, m) {                                                     \
    AT_FORALL_LOWER_PRECISION_FP(MMGCU_SIM_LOW_##TYPE)                                   \
    AT_FORALL_FP32(MMGCU_SIM_FP32_##TYPE)                                                \
    AT_FORALL_FP32_SET_OPT_DTYPE(MMGCU_SIM_FP32_OPT_##TYPE)                              \
    AT_FORALL_PROMOTE(MMGCU_SIM_PROMOTE_##TYPE)                                          \
  }
#define MMGCU_SIM_LOW_PrivateUse1(...) \
  KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, lower_precision_fp)
#define MMGCU_SIM_FP32_PrivateUse1(...) KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, fp32)
#define MMGCU_SIM_FP32_OPT_PrivateUse1(...) \
  KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, fp32_set_opt_dtype)
#define MMGCU_SIM_PROMOTE_PrivateUse1(...) \
  KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, promote)
#define MMGCU_SIM_LOW_XLA(...) KERNEL(c10::DeviceType::XLA, __VA_ARGS__, lower_precision_fp)
#define MMGCU_SIM_FP32_XLA(...) KERNEL(c10::DeviceType::XLA, __VA_ARGS__, fp32)
#define MMGCU_SIM_FP32_OPT_XLA(...) KERNEL(c10::DeviceType::XLA, __VA_ARGS__, fp32_set_opt_dtype)
#define MMGCU_SIM_PROMOTE_XLA(...) KERNEL(c10::DeviceType::XLA, __VA_ARGS__, promote)

MMGCU_SIM_AUTOCAST(AutocastPrivateUse1, PrivateUse1)
MMGCU_SIM_AUTOCAST(AutocastXLA, XLA)

// ---------------------------------------------------------------------------- python
static SimPrivateUse1Hooks* g_hooks = nullptr;

static void install(int64_t cards) {
  set_card_count(cards);
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_pu1_allocator);
  c10::SetAllocator(c10::DeviceType::XLA, &g_xla_allocator);
  if (g_hooks == nullptr) {
    g_hooks = new SimPrivateUse1Hooks();
    at::RegisterPrivateUse1HooksInterface(g_hooks);
  }
}

}  // namespace mmgcu_sim

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &mmgcu_sim::install, "set the card count; register allocators and hooks");
  mmgcu_sim::define_common(m);
}
