// The native part of the simulated torch_gcu: simulated cards as a real PyTorch backend.
//
// Cards are PrivateUse1 (renamed "gcu", torch_gcu 2.x) or XLA (torch_gcu 1.x) devices whose
// memory is host memory. Tensors on them are plain torch.Tensor objects with a real device,
// so everything that inspects a tensor sees what it would see on hardware. This file holds:
//   - a device guard per device type (current card is thread-local, streams/events trivial);
//   - the PrivateUse1 hooks autograd asks for;
//   - an allocator per device type that counts the bytes live on each card, and the peak;
//   - kernels for factories, copies, views and resize, which must share or allocate storage;
//   - a boxed fallback for every other op: PyTorch's same-device check, then the CPU kernel
//     (at::native::cpu_fallback), so a CPU tensor or another card's tensor fails as on hardware.
#include <torch/extension.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <atomic>
#include <functional>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace mmgcu_sim {

constexpr int kMaxCards = 64;
static std::atomic<int> g_card_count{1};
// One current card per thread, like the CUDA runtime.
static thread_local c10::DeviceIndex t_current = 0;

// ---------------------------------------------------------------------------- guard
template <c10::DeviceType T>
struct SimGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return T; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old(T, t_current);
    if (d.index() >= 0) t_current = d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(T, t_current); }
  void setDevice(c10::Device d) const override {
    if (d.index() >= 0) t_current = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) t_current = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_card_count.load());
  }
  // Host memory is synchronous: events and streams are always complete.
  void record(void**, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, SimGuardImpl<c10::DeviceType::PrivateUse1>);
C10_REGISTER_GUARD_IMPL(XLA, SimGuardImpl<c10::DeviceType::XLA>);

// ---------------------------------------------------------------------------- memory
struct CardMemory {
  int64_t allocated = 0;
  int64_t peak = 0;
};
static CardMemory g_memory[kMaxCards];
static std::mutex g_memory_mutex;

struct Allocation {
  void* ptr;
  size_t bytes;
  int card;
};

static void release(void* ctx) {
  auto* a = static_cast<Allocation*>(ctx);
  {
    std::lock_guard<std::mutex> lock(g_memory_mutex);
    g_memory[a->card].allocated -= static_cast<int64_t>(a->bytes);
  }
  c10::free_cpu(a->ptr);
  delete a;
}

// Card memory is host memory, counted per card. The card is the current one: every kernel
// that allocates sets a DeviceGuard to its target card first.
template <c10::DeviceType T>
struct SimAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    int card = t_current;
    void* ptr = bytes ? c10::alloc_cpu(bytes) : nullptr;
    {
      std::lock_guard<std::mutex> lock(g_memory_mutex);
      auto& m = g_memory[card];
      m.allocated += static_cast<int64_t>(bytes);
      if (m.allocated > m.peak) m.peak = m.allocated;
    }
    return {ptr, new Allocation{ptr, bytes, card}, &release, c10::Device(T, card)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

static SimAllocator<c10::DeviceType::PrivateUse1> g_pu1_allocator;
static SimAllocator<c10::DeviceType::XLA> g_xla_allocator;

// ---------------------------------------------------------------------------- hooks
static std::vector<at::Generator> g_generators;
static std::mutex g_generator_mutex;

static const at::Generator& default_generator(c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(g_generator_mutex);
  auto i = index < 0 ? t_current : index;
  while (static_cast<c10::DeviceIndex>(g_generators.size()) <= i) {
    g_generators.push_back(at::make_generator<at::CPUGeneratorImpl>(
        c10::detail::getNonDeterministicRandom()));
  }
  return g_generators[i];
}

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
    return at::make_generator<at::CPUGeneratorImpl>(
        c10::detail::getNonDeterministicRandom());
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, t_current);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

// ---------------------------------------------------------------------------- kernels
// The card a factory targets, refused like a driver refuses a card that is not there.
template <c10::DeviceType T>
c10::Device checked_device(std::optional<c10::Device> device) {
  auto dev = c10::device_or_default(device);
  TORCH_CHECK(dev.type() == T, "simulated card kernel got device ", dev);
  if (!dev.has_index()) dev = c10::Device(T, t_current);
  TORCH_CHECK(dev.index() < g_card_count.load(), "GCU device ordinal ", int(dev.index()),
              " is invalid: ", g_card_count.load(),
              " card(s) are visible (simulated; see TOPS_VISIBLE_DEVICES)");
  return dev;
}

template <c10::DeviceType T>
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device, std::optional<bool> pin,
                               std::optional<c10::MemoryFormat> memory_format) {
  const auto dev = checked_device<T>(device);
  const c10::DeviceGuard guard(dev);
  constexpr auto key = T == c10::DeviceType::XLA ? c10::DispatchKey::XLA
                                                 : c10::DispatchKey::PrivateUse1;
  return at::detail::empty_generic(size, at::GetAllocator(T), c10::DispatchKeySet(key),
                                   c10::dtype_or_default(dtype), memory_format);
}

template <c10::DeviceType T>
at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin) {
  const auto dev = checked_device<T>(device);
  const c10::DeviceGuard guard(dev);
  constexpr auto key = T == c10::DeviceType::XLA ? c10::DispatchKey::XLA
                                                 : c10::DispatchKey::PrivateUse1;
  return at::detail::empty_strided_generic(size, stride, at::GetAllocator(T),
                                           c10::DispatchKeySet(key),
                                           c10::dtype_or_default(dtype));
}

// A CPU tensor over the same host memory (no copy); valid while `t` is alive.
static at::Tensor host_alias(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

static at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                             c10::SymIntArrayRef stride,
                             std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, storage_offset);
}

static const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                                 std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

static at::Tensor _reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                                 c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

static at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

static at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  // Every card is host memory: a copy between any two of cpu/card is a host copy.
  at::Tensor dst_host = dst.is_cpu() ? dst : host_alias(dst);
  const at::Tensor self_host = self.is_cpu() ? self : host_alias(self);
  at::native::copy_(dst_host, self_host, non_blocking);
  return dst;
}

static at::Tensor _copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  {
    const c10::DeviceGuard guard(dst.device());
    at::native::resize_(dst, self.sizes(), std::nullopt);
  }
  return copy_from(self, dst, false);
}

static at::Scalar _local_scalar_dense(const at::Tensor& self) {
  return at::native::_local_scalar_dense_cpu(host_alias(self));
}

static at::Tensor& set_source_Tensor_(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

static at::Tensor& set_source_Storage_(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, source);
}

static at::Tensor& set_source_Storage_storage_offset_(at::Tensor& self, at::Storage storage,
                                                      c10::SymInt offset,
                                                      c10::SymIntArrayRef size,
                                                      c10::SymIntArrayRef stride) {
  return at::cpu::set__symint(self, storage, offset, size, stride);
}

// Ops that legally take CPU index tensors with card tensors (as CUDA's do).
static bool takes_cpu_indices(const c10::OperatorName& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"};
  return ops.count(name.name) > 0;
}

static bool is_card(const at::Tensor& t) {
  return t.defined() && (t.device().type() == c10::DeviceType::PrivateUse1 ||
                         t.device().type() == c10::DeviceType::XLA);
}

// PyTorch's same-device rule, with its own wording: 0-dim CPU tensors are scalars and mix.
// Returns the card the op runs on.
static std::optional<c10::Device> check_same_device(const c10::OperatorHandle& op,
                                                    torch::jit::Stack* stack) {
  const auto n = op.schema().arguments().size();
  std::optional<c10::Device> card;
  std::optional<c10::Device> cpu;
  auto visit = [&](const c10::IValue& v) {
    if (v.isDevice() && v.toDevice().type() != c10::DeviceType::CPU && !card) {
      card = v.toDevice();
      return;
    }
    if (!v.isTensor()) return;
    const auto& t = v.toTensor();
    if (!t.defined()) return;
    if (t.is_cpu()) {
      if (t.dim() > 0) cpu = t.device();
      return;
    }
    if (!card) {
      card = t.device();
    } else if (*card != t.device()) {
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least "
                         "two devices, ", *card, " and ", t.device(), "!");
    }
  };
  for (const auto& v : torch::jit::last(*stack, n)) {
    if (v.isList()) {
      for (const auto& e : v.toListRef()) visit(e);
    } else {
      visit(v);
    }
  }
  if (cpu && card && !takes_cpu_indices(op.schema().operator_name())) {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least "
                       "two devices, ", *cpu, " and ", *card, "!");
  }
  return card;
}

// A new CPU result, copied onto the card (through the allocator, so it is counted).
static at::Tensor onto_card(const at::Tensor& t, c10::Device card) {
  if (!t.defined() || !t.is_cpu()) return t;
  const c10::DeviceGuard guard(card);
  auto out = at::empty_strided(t.sizes(), t.strides(), t.options().device(card));
  at::Tensor host = host_alias(out);
  host.copy_(t);
  return out;
}

static c10::IValue map_tensors(const c10::IValue& v,
                               const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    auto list = v.toTensorVector();
    for (auto& t : list) t = fn(t);
    return c10::IValue(list);
  }
  if (v.isList()) {
    auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue e : list) out.push_back(e.isTensor() ? c10::IValue(fn(e.toTensor())) : e);
    return out;
  }
  return v;
}

static const c10::AliasInfo* alias_of(const c10::Argument& a) { return a.alias_info(); }

static bool same_alias(const c10::AliasInfo* a, const c10::AliasInfo* b) {
  return a != nullptr && b != nullptr && a->beforeSets() == b->beforeSets();
}

// Every op without a card kernel: check devices, then run the CPU kernel on the cards' host
// memory itself (no copy), so in-place updates land on the card as they would on hardware.
static void card_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto card = check_same_device(op, stack);
  TORCH_CHECK(card.has_value(), op.schema().name(), ": no simulated card among the arguments");
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t first = stack->size() - args.size();
  std::vector<c10::IValue> given(stack->begin() + first, stack->end());
  // out= arguments may be resized by the kernel: they get a host copy, written back below.
  std::vector<std::pair<size_t, at::Tensor>> outs;
  for (size_t i = 0; i < args.size(); ++i) {
    auto& v = (*stack)[first + i];
    const auto* alias = alias_of(args[i]);
    if (v.isTensor() && is_card(v.toTensor()) && args[i].kwarg_only() && alias &&
        alias->isWrite()) {
      auto host = host_alias(v.toTensor()).clone();
      outs.emplace_back(i, host);
      v = host;
    } else if (v.isDevice() && v.toDevice().type() == card->type()) {
      v = c10::IValue(c10::Device(c10::DeviceType::CPU));
    } else {
      v = map_tensors(v, [](const at::Tensor& t) { return is_card(t) ? host_alias(t) : t; });
    }
  }
  {
    const c10::DeviceGuard guard(*card);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  for (const auto& [i, host] : outs) {
    auto target = given[i].toTensor();
    if (target.sizes() != host.sizes()) {
      const c10::DeviceGuard guard(*card);
      at::native::resize_(target, host.sizes(), std::nullopt);
    }
    at::Tensor dst = host_alias(target);
    dst.copy_(host);
  }
  const auto& rets = schema.returns();
  const size_t rfirst = stack->size() - rets.size();
  for (size_t r = 0; r < rets.size(); ++r) {
    auto& v = (*stack)[rfirst + r];
    const auto* ralias = alias_of(rets[r]);
    std::optional<size_t> source;
    for (size_t i = 0; ralias && i < args.size(); ++i) {
      if (same_alias(ralias, alias_of(args[i])) && given[i].isTensor()) source = i;
    }
    if (source && ralias->isWrite()) {
      v = given[*source];  // in-place and out=: the card tensor itself
    } else if (source && v.isTensor() && is_card(given[*source].toTensor())) {
      // A view of a card tensor: the same storage, seen through the view's geometry.
      const auto& base = given[*source].toTensor();
      const auto& view_t = v.toTensor();
      const auto bytes = static_cast<const char*>(view_t.data_ptr()) -
                         static_cast<const char*>(base.data_ptr());
      if (view_t.dtype() == base.dtype() && bytes % base.itemsize() == 0) {
        v = at::cpu::as_strided(base, view_t.sizes(), view_t.strides(),
                                base.storage_offset() + bytes / base.itemsize());
      } else {
        v = onto_card(view_t, *card);
      }
    } else {
      v = map_tensors(v, [&](const at::Tensor& t) { return onto_card(t, *card); });
    }
  }
}

// Convolution: PyTorch routes backends it does not know to these two "overrideable" ops,
// which every out-of-tree backend implements; here they run the CPU kernels on host memory.
static void expect_same_device(const at::Tensor& a, const at::Tensor& b) {
  if (b.defined() && a.device() != b.device()) {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least "
                       "two devices, ", a.device(), " and ", b.device(), "!");
  }
}

static at::Tensor host_or_undefined(const at::Tensor& t) {
  return t.defined() ? host_alias(t) : t;
}

static at::Tensor convolution_overrideable(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
    bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups) {
  expect_same_device(input, weight);
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  expect_same_device(input, b);
  auto out = at::convolution_symint(host_alias(input), host_alias(weight),
                                    host_or_undefined(b), stride, padding, dilation,
                                    transposed, output_padding, groups);
  return onto_card(out, input.device());
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
    bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups,
    std::array<bool, 3> output_mask) {
  expect_same_device(input, weight);
  expect_same_device(input, grad_output);
  std::vector<c10::SymInt> bias_sizes{grad_output.sym_size(1)};
  auto [gi, gw, gb] = at::convolution_backward_symint(
      host_alias(grad_output), host_alias(input), host_alias(weight),
      output_mask[2] ? std::optional<c10::SymIntArrayRef>(bias_sizes) : std::nullopt, stride,
      padding, dilation, transposed, output_padding, groups, output_mask);
  const auto card = input.device();
  return {onto_card(gi, card), onto_card(gw, card), onto_card(gb, card)};
}

#define MMGCU_SIM_KERNELS(KEY, TYPE)                                                     \
  TORCH_LIBRARY_IMPL(aten, KEY, m) {                                                     \
    m.impl("empty.memory_format", empty_memory_format<c10::DeviceType::TYPE>);           \
    m.impl("empty_strided", empty_strided<c10::DeviceType::TYPE>);                       \
    m.impl("as_strided", as_strided);                                                    \
    m.impl("resize_", resize_);                                                          \
    m.impl("_reshape_alias", _reshape_alias);                                            \
    m.impl("view", view);                                                                \
    m.impl("_copy_from", copy_from);                                                    \
    m.impl("_copy_from_and_resize", _copy_from_and_resize);                              \
    m.impl("_local_scalar_dense", _local_scalar_dense);                                  \
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
#define MMGCU_SIM_LOW_PrivateUse1(...) KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, lower_precision_fp)
#define MMGCU_SIM_FP32_PrivateUse1(...) KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, fp32)
#define MMGCU_SIM_FP32_OPT_PrivateUse1(...) KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, fp32_set_opt_dtype)
#define MMGCU_SIM_PROMOTE_PrivateUse1(...) KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, promote)
#define MMGCU_SIM_LOW_XLA(...) KERNEL(c10::DeviceType::XLA, __VA_ARGS__, lower_precision_fp)
#define MMGCU_SIM_FP32_XLA(...) KERNEL(c10::DeviceType::XLA, __VA_ARGS__, fp32)
#define MMGCU_SIM_FP32_OPT_XLA(...) KERNEL(c10::DeviceType::XLA, __VA_ARGS__, fp32_set_opt_dtype)
#define MMGCU_SIM_PROMOTE_XLA(...) KERNEL(c10::DeviceType::XLA, __VA_ARGS__, promote)

MMGCU_SIM_AUTOCAST(AutocastPrivateUse1, PrivateUse1)
MMGCU_SIM_AUTOCAST(AutocastXLA, XLA)

// ---------------------------------------------------------------------------- python
static SimPrivateUse1Hooks* g_hooks = nullptr;

void install(int64_t cards) {
  TORCH_CHECK(cards >= 1 && cards <= kMaxCards, "simulate 1..", kMaxCards, " cards");
  g_card_count.store(static_cast<int>(cards));
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_pu1_allocator);
  c10::SetAllocator(c10::DeviceType::XLA, &g_xla_allocator);
  if (g_hooks == nullptr) {
    g_hooks = new SimPrivateUse1Hooks();
    at::RegisterPrivateUse1HooksInterface(g_hooks);
  }
}

static int check_card(int64_t card) {
  TORCH_CHECK(card >= 0 && card < kMaxCards, "no card ", card);
  return static_cast<int>(card);
}

int64_t memory_allocated(int64_t card) {
  std::lock_guard<std::mutex> lock(g_memory_mutex);
  return g_memory[check_card(card)].allocated;
}

int64_t max_memory_allocated(int64_t card) {
  std::lock_guard<std::mutex> lock(g_memory_mutex);
  return g_memory[check_card(card)].peak;
}

void reset_peak(int64_t card) {
  std::lock_guard<std::mutex> lock(g_memory_mutex);
  auto& m = g_memory[check_card(card)];
  m.peak = m.allocated;
}

void manual_seed(int64_t card, uint64_t seed) {
  auto gen = default_generator(static_cast<c10::DeviceIndex>(card));
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

}  // namespace mmgcu_sim

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &mmgcu_sim::install, "set the card count; register allocators and hooks");
  m.def("card_count", [] { return mmgcu_sim::g_card_count.load(); });
  m.def("current_device", [] { return static_cast<int64_t>(mmgcu_sim::t_current); });
  m.def("set_device", [](int64_t i) { mmgcu_sim::t_current = static_cast<c10::DeviceIndex>(i); });
  m.def("memory_allocated", &mmgcu_sim::memory_allocated);
  m.def("max_memory_allocated", &mmgcu_sim::max_memory_allocated);
  m.def("reset_peak", &mmgcu_sim::reset_peak);
  m.def("manual_seed", &mmgcu_sim::manual_seed);
  m.def("host_alias", &mmgcu_sim::host_alias,
        "a CPU tensor over a card tensor's host memory (no copy)");
}
