// The simulated torch_gcu's native part for torch 1.10 (torch_gcu 1.x, the T20's own stack).
//
// Cards are XLA devices (xla:N), as torch_gcu 1.x makes them; PrivateUse1 ("gcu") belongs to
// torch_gcu 2.x, which needs torch 2. What both torch generations share is in gcu_sim.h; this
// file adds what torch 1.10 needs differently:
//   - factories, views and resize with 1.10's signatures (no SymInt, no empty_strided_generic);
//   - convolution backward without at::convolution_backward (it arrives in torch 1.11);
//   - the grad scaler's two kernels, which torch 1.10 has only for CUDA.
// There is no autocast registration: torch 1.10 has no AutocastXLA key and sends XLA tensors
// through the CUDA autocast key, whose policies libtorch registers itself.
#include "gcu_sim.h"

#include <torch/csrc/autograd/autograd.h>

namespace mmgcu_sim {

constexpr auto kXLA = c10::DeviceType::XLA;

C10_REGISTER_GUARD_IMPL(XLA, SimGuardImpl<c10::DeviceType::XLA>);

static SimAllocator<c10::DeviceType::XLA> g_xla_allocator;

// ---------------------------------------------------------------------------- kernels
static at::Tensor empty_memory_format(at::IntArrayRef size, c10::optional<at::ScalarType> dtype,
                                      c10::optional<at::Layout> layout,
                                      c10::optional<at::Device> device,
                                      c10::optional<bool> pin,
                                      c10::optional<at::MemoryFormat> memory_format) {
  const auto dev = checked_device<kXLA>(device);
  const c10::DeviceGuard guard(dev);
  auto t = at::detail::empty_generic(size, &g_xla_allocator, c10::DispatchKey::XLA,
                                     c10::dtype_or_default(dtype), dev, memory_format);
  graph::fresh(t);
  return t;
}

static at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride,
                                c10::optional<at::ScalarType> dtype,
                                c10::optional<at::Layout> layout,
                                c10::optional<at::Device> device, c10::optional<bool> pin) {
  // torch 1.10 has no empty_strided_generic: make an empty tensor, then give it the geometry
  // (which allocates its storage through the card's allocator).
  const auto dev = checked_device<kXLA>(device);
  const c10::DeviceGuard guard(dev);
  auto t = at::detail::empty_generic({0}, &g_xla_allocator, c10::DispatchKey::XLA,
                                     c10::dtype_or_default(dtype), dev, c10::nullopt);
  at::native::resize_impl_cpu_(t.unsafeGetTensorImpl(), size, stride);
  graph::fresh(t);
  return t;
}

static at::Tensor as_strided(const at::Tensor& self, at::IntArrayRef size,
                             at::IntArrayRef stride, c10::optional<int64_t> storage_offset) {
  return at::cpu::as_strided(self, size, stride, storage_offset);
}

static const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size,
                                 c10::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  const void* before = self.storage().data_ptr().get_context();
  const uint64_t value = graph::storage_value(self);
  const auto& out = at::native::resize_(self, size, memory_format);
  if (self.storage().data_ptr().get_context() != before) graph::resized(self, value);
  return out;
}

static at::Tensor _reshape_alias(const at::Tensor& self, at::IntArrayRef size,
                                 at::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

static at::Tensor view(const at::Tensor& self, at::IntArrayRef size) {
  return xla_view(self, size);  // the cards are XLA devices (see gcu_sim.h)
}

static at::Tensor& set_source_Storage_storage_offset_(at::Tensor& self, at::Storage storage,
                                                      int64_t offset, at::IntArrayRef size,
                                                      at::IntArrayRef stride) {
  return at::native::set_storage_cpu_(self, storage, offset, size, stride);
}

// Convolution: PyTorch routes backends it does not know to these two "overrideable" ops;
// here they run the CPU kernels on host memory, half inputs in float32 (see gcu_sim.h).
static at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                           const c10::optional<at::Tensor>& bias,
                                           at::IntArrayRef stride, at::IntArrayRef padding,
                                           at::IntArrayRef dilation, bool transposed,
                                           at::IntArrayRef output_padding, int64_t groups) {
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
  node.tensor(input).tensor(weight).tensor(b).ints(stride).ints(padding).ints(dilation);
  node.ints(output_padding).number(transposed).number(groups);
  auto out =
      at::convolution(x, w, hb, stride, padding, dilation, transposed, output_padding, groups);
  out = onto_card(out, input.device(), half);
  node.output(out, 0);
  return out;
}

// A backend kernel runs below autograd: its thread has the autograd keys excluded. The
// convolution backward below differentiates a host convolution with autograd, so it lifts
// that exclusion (and enables grad mode) while it runs, and restores both after.
class AutogradOnHost {
 public:
  AutogradOnHost() : saved_(c10::impl::tls_local_dispatch_key_set()), grad_mode_(true) {
    auto lifted = saved_;
    lifted.excluded_ = saved_.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView;
    c10::impl::_force_tls_local_dispatch_key_set(lifted);
  }
  ~AutogradOnHost() { c10::impl::_force_tls_local_dispatch_key_set(saved_); }
  AutogradOnHost(const AutogradOnHost&) = delete;
  AutogradOnHost& operator=(const AutogradOnHost&) = delete;

 private:
  c10::impl::LocalDispatchKeySet saved_;
  at::AutoGradMode grad_mode_;
};

static std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  expect_same_device(input, weight);
  expect_same_device(input, grad_output);
  const auto half = shared_half_type({grad_output, input, weight});
  auto gy = host_alias(grad_output);
  auto x = host_alias(input).detach();
  auto w = host_alias(weight).detach();
  if (half) {
    gy = as_float32(gy);
    x = as_float32(x);
    w = as_float32(w);
  }
  at::Tensor gi, gw, gb;
  {
    AutogradOnHost autograd;
    x.requires_grad_(output_mask[0]);
    w.requires_grad_(output_mask[1]);
    at::Tensor b;
    if (output_mask[2]) b = at::zeros({grad_output.size(1)}, w.options()).requires_grad_(true);
    auto out = at::convolution(x, w, b, stride, padding, dilation, transposed, output_padding,
                               groups);
    std::vector<at::Tensor> wrt;
    if (output_mask[0]) wrt.push_back(x);
    if (output_mask[1]) wrt.push_back(w);
    if (output_mask[2]) wrt.push_back(b);
    auto grads = torch::autograd::grad({out}, wrt, {gy});
    size_t k = 0;
    if (output_mask[0]) gi = grads[k++];
    if (output_mask[1]) gw = grads[k++];
    if (output_mask[2]) gb = grads[k++];
  }
  const auto card = input.device();
  graph::KernelNode node("aten::convolution_backward_overrideable", input);
  node.tensor(grad_output).tensor(input).tensor(weight).ints(stride).ints(padding);
  node.ints(dilation).ints(output_padding).number(transposed).number(groups);
  node.ints(std::vector<int64_t>{output_mask[0], output_mask[1], output_mask[2]});
  auto result = std::make_tuple(onto_card(gi, card, half), onto_card(gw, card, half),
                                onto_card(gb, card, half));
  node.output(std::get<0>(result), 0);
  node.output(std::get<1>(result), 1);
  node.output(std::get<2>(result), 2);
  return result;
}

// ---------------------------------------------------------------------------- grad scaler
// torch 1.10 has the grad scaler's kernels for CUDA only (torch.cuda.amp.GradScaler calls
// them, and so does a GradScaler for the card). These follow torch 1.10's CUDA kernels, with
// their checks, on the card's host memory: they run on the card, so they count no host read.

// Unscale every gradient in place (grad * inv_scale) and set found_inf to 1.0 if any element
// of any of them is inf or NaN.
static void amp_foreach_non_finite_check_and_unscale_(at::TensorList scaled_grads,
                                                      at::Tensor& found_inf,
                                                      const at::Tensor& inv_scale) {
  expect_same_device(found_inf, inv_scale);
  TORCH_CHECK(inv_scale.numel() == 1, "inv_scale must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(inv_scale.scalar_type() == at::ScalarType::Float,
              "inv_scale must be a float tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::ScalarType::Float,
              "found_inf must be a float tensor.");
  graph::KernelNode node("aten::_amp_foreach_non_finite_check_and_unscale_", found_inf);
  for (const auto& grad : scaled_grads) node.tensor(grad);
  node.tensor(found_inf).tensor(inv_scale);
  const float inv = *host_alias(inv_scale).data_ptr<float>();
  auto found = host_alias(found_inf);
  for (const auto& grad : scaled_grads) {
    expect_same_device(found_inf, grad);
    TORCH_CHECK(grad.layout() == at::kStrided, "one of scaled_grads was not a strided tensor.");
    auto host = host_alias(grad);
    // CUDA computes in float for every grad dtype, then rounds: so does this (in place when
    // the grad is float32 already).
    auto value = host.to(at::kFloat);
    if (!at::isfinite(value).all().item<bool>()) found.fill_(1.0);
    if (inv != 1.f) {
      value.mul_(inv);
      if (!value.is_same(host)) host.copy_(value);
    }
  }
  uint64_t k = 0;
  for (const auto& grad : scaled_grads) node.output(grad, k++);
  node.output(found_inf, k);
}

// After a step: if it found inf/NaN, scale *= backoff_factor and the tracker restarts;
// otherwise the tracker counts the step, and after growth_interval clean steps in a row,
// scale *= growth_factor and the tracker restarts.
static at::Tensor& amp_update_scale_(at::Tensor& current_scale, at::Tensor& growth_tracker,
                                     const at::Tensor& found_inf, double growth_factor,
                                     double backoff_factor, int64_t growth_interval) {
  expect_same_device(current_scale, growth_tracker);
  expect_same_device(current_scale, found_inf);
  TORCH_CHECK(current_scale.numel() == 1, "current_scale must be a 1-element tensor.");
  TORCH_CHECK(growth_tracker.numel() == 1, "growth_tracker must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(current_scale.scalar_type() == at::ScalarType::Float,
              "current_scale must be a float tensor.");
  TORCH_CHECK(growth_tracker.scalar_type() == at::ScalarType::Int,
              "growth_tracker must be an int tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::ScalarType::Float,
              "found_inf must be a float tensor.");
  graph::KernelNode node("aten::_amp_update_scale_", current_scale);
  node.tensor(current_scale).tensor(growth_tracker).tensor(found_inf);
  node.number(growth_factor).number(backoff_factor).number(growth_interval);
  node.output(current_scale, 0);
  node.output(growth_tracker, 1);
  float* scale = host_alias(current_scale).data_ptr<float>();
  int* tracker = host_alias(growth_tracker).data_ptr<int>();
  const float found = *host_alias(found_inf).data_ptr<float>();
  if (found) {
    *scale = static_cast<float>(*scale * backoff_factor);
    *tracker = 0;
  } else {
    const int successful = *tracker + 1;
    if (successful == static_cast<int>(growth_interval)) {
      *scale = static_cast<float>(*scale * growth_factor);
      *tracker = 0;
    } else {
      *tracker = successful;
    }
  }
  return current_scale;
}

TORCH_LIBRARY_IMPL(aten, XLA, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("resize_", resize_);
  m.impl("_reshape_alias", _reshape_alias);
  m.impl("view", view);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Tensor", set_source_Tensor_);
  m.impl("set_.source_Storage", set_source_Storage_);
  m.impl("set_.source_Storage_storage_offset", set_source_Storage_storage_offset_);
  m.impl("convolution_overrideable", convolution_overrideable);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
  m.impl("_amp_foreach_non_finite_check_and_unscale_",
         amp_foreach_non_finite_check_and_unscale_);
  m.impl("_amp_update_scale_", amp_update_scale_);
}

TORCH_LIBRARY_IMPL(aten, XLA, m) { register_whole_ops(m); }

TORCH_LIBRARY_IMPL(_, XLA, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&card_fallback>());
}

// ---------------------------------------------------------------------------- python
static void install(int64_t cards) {
  set_card_count(cards);
  c10::SetAllocator(kXLA, &g_xla_allocator);
}

}  // namespace mmgcu_sim

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &mmgcu_sim::install, "set the card count; register the card allocator");
  mmgcu_sim::define_common(m);
}
