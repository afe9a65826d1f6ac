// The part of the simulated torch_gcu's native code that both torch generations share.
//
// Simulated cards are a real PyTorch device type whose memory is host memory: tensors on them
// are plain torch.Tensor objects with a real device, so everything that inspects a tensor sees
// what it would see on hardware. Two translation units include this header, one per torch
// generation, and add what differs:
//   - gcu_sim.cpp          torch >= 2 (torch_gcu 2.x): PrivateUse1 renamed "gcu", and XLA;
//   - gcu_sim_torch110.cpp torch 1.10 (torch_gcu 1.x, the T20's stack): XLA only.
// This header holds what does not depend on the generation:
//   - a device guard per device type (the current card is thread-local, streams trivial);
//   - an allocator per device type that counts the bytes live on each card, and the peak;
//   - host aliases (a CPU tensor over a card tensor's memory, no copy);
//   - the host-read counters (every value the host reads back from a card);
//   - the copy and scalar-read kernels, which are the same on both generations;
//   - a boxed fallback for every op without a card kernel: PyTorch's same-device check, then
//     the CPU kernel on the cards' host memory, so a CPU tensor or another card's tensor fails
//     as on hardware, in-place and out= results land on the card and views share its memory,
//     and a new result's host memory becomes the card's (counted there, not copied);
//   - half precision computed in float32 for convolution and the matmul family;
//   - a backward-pass callback whose Python error reaches the caller;
//   - the Python functions both generations expose.
// Where the two generations' APIs differ, a short #if below says how.
#pragma once

#include <torch/extension.h>
#include <torch/version.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/InferSize.h>
#include <ATen/TensorUtils.h>
#include <ATen/native/Resize.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/library.h>

#if TORCH_VERSION_MAJOR >= 2
#define MMGCU_SIM_TORCH2 1
#include <ATen/EmptyTensor.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <c10/core/impl/alloc_cpu.h>
#else
#define MMGCU_SIM_TORCH2 0
#include <ATen/CPUFunctions.h>  // at::cpu::as_strided
#include <ATen/NativeFunctions.h>
#include <ATen/Utils.h>  // at::detail::empty_generic
#endif

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "lazy_ops.h"

namespace mmgcu_sim {

static std::atomic<int> g_card_count{1};
// One current card per thread, like the CUDA runtime.
static thread_local c10::DeviceIndex t_current = 0;

inline bool is_card_type(c10::DeviceType type) {
#if MMGCU_SIM_TORCH2
  return type == c10::DeviceType::XLA || type == c10::DeviceType::PrivateUse1;
#else  // torch 1.10 has no PrivateUse1 device type
  return type == c10::DeviceType::XLA;
#endif
}

inline bool is_card(const at::Tensor& t) { return t.defined() && is_card_type(t.device().type()); }

// ---------------------------------------------------------------------------- guard
// torch 1.10 declares the stream accessors noexcept; torch 2 does not.
#if MMGCU_SIM_TORCH2
#define MMGCU_SIM_STREAM_NOEXCEPT
#else
#define MMGCU_SIM_STREAM_NOEXCEPT noexcept
#endif

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
  c10::Stream getStream(c10::Device d) const MMGCU_SIM_STREAM_NOEXCEPT override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const MMGCU_SIM_STREAM_NOEXCEPT override {
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
#if MMGCU_SIM_TORCH2  // torch 1.10's interface has no synchronizeDevice
  void synchronizeDevice(const c10::DeviceIndex) const override {}
#endif
};

// ---------------------------------------------------------------------------- memory
struct CardMemory {
  int64_t allocated = 0;
  int64_t peak = 0;
};
static CardMemory g_memory[kMaxCards];
static std::mutex g_memory_mutex;

// `bytes` more (or, negative, fewer) live on `card`, and its peak.
static void count_on_card(int card, int64_t bytes) {
  std::lock_guard<std::mutex> lock(g_memory_mutex);
  auto& m = g_memory[card];
  m.allocated += bytes;
  if (m.allocated > m.peak) m.peak = m.allocated;
}

// An allocation on a card: its block (bytes, card, lazy value) and its host memory.
struct Allocation : CardBlock {
  void* ptr = nullptr;
};

static void release(void* ctx) {
  auto* a = static_cast<Allocation*>(ctx);
  graph::forget(a);
  count_on_card(a->card, -static_cast<int64_t>(a->bytes));
  c10::free_cpu(a->ptr);
  delete a;
}

// Card memory is host memory, counted per card. The card is the current one: every kernel
// that allocates sets a DeviceGuard to its target card first.
template <c10::DeviceType T>
struct SimAllocator final : public c10::Allocator {
#if MMGCU_SIM_TORCH2
  c10::DataPtr allocate(size_t bytes) override { return allocate_on_current(bytes); }
  // torch 2 copies between allocations of one allocator through it (e.g. when cloning
  // storages); card memory is host memory.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
#else  // torch 1.10: allocate is const and there is no copy_data
  c10::DataPtr allocate(size_t bytes) const override { return allocate_on_current(bytes); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  static c10::DataPtr allocate_on_current(size_t bytes) {
    const int card = t_current;
    void* ptr = bytes ? c10::alloc_cpu(bytes) : nullptr;
    count_on_card(card, static_cast<int64_t>(bytes));
    auto* block = new Allocation();
    block->ptr = ptr;
    graph::init_block(block, card, bytes);
    return {ptr, block, &release, c10::Device(T, card)};
  }
};

inline void set_card_count(int64_t cards) {
  TORCH_CHECK(cards >= 1 && cards <= kMaxCards, "simulate 1..", kMaxCards, " cards");
  g_card_count.store(static_cast<int>(cards));
}

// The card a factory targets, refused like a driver refuses a card that is not there.
template <c10::DeviceType T>
c10::Device checked_device(const c10::optional<c10::Device>& device) {
  auto dev = device.has_value() ? *device : c10::Device(T, t_current);
  TORCH_CHECK(dev.type() == T, "simulated card kernel got device ", dev);
  if (!dev.has_index()) dev = c10::Device(T, t_current);
  TORCH_CHECK(dev.index() < g_card_count.load(), "GCU device ordinal ", int(dev.index()),
              " is invalid: ", g_card_count.load(),
              " card(s) are visible (simulated; see TOPS_VISIBLE_DEVICES)");
  return dev;
}

// ---------------------------------------------------------------------------- generators
// A CPU generator per card, for code that asks the card for its default generator.
static std::vector<at::Generator> g_generators;
static std::mutex g_generator_mutex;

static const at::Generator& default_generator(c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(g_generator_mutex);
  auto i = index < 0 ? t_current : index;
  while (static_cast<c10::DeviceIndex>(g_generators.size()) <= i) {
    g_generators.push_back(
        at::make_generator<at::CPUGeneratorImpl>(c10::detail::getNonDeterministicRandom()));
  }
  return g_generators[i];
}

// ---------------------------------------------------------------------------- host memory
// A CPU tensor over the same host memory (no copy); valid while `t` is alive. This is how the
// simulator itself reaches card memory (kernels, collectives): it is not a host read.
static at::Tensor host_alias(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

static at::Tensor host_or_undefined(const at::Tensor& t) {
  return t.defined() ? host_alias(t) : t;
}

// The host memory of a CPU result that a card tensor took over, kept alive while the card
// tensor lives, and the bytes it counts on that card.
struct Adopted : CardBlock {
  c10::Storage host;
};

static void release_adopted(void* ctx) {
  auto* a = static_cast<Adopted*>(ctx);
  graph::forget(a);
  count_on_card(a->card, -static_cast<int64_t>(a->bytes));
  delete a;  // the last reference to the host storage: its own deleter frees the memory
}

// Storages with these deleters carry a CardBlock (lazy_graph.h).
static const bool g_blocks_known = [] {
  graph::block_deleters() = {&release, &release_adopted};
  return true;
}();

// A card tensor over the memory of `t`, a CPU result nothing else references: no copy. Card
// memory is host memory, so the CPU kernel's output is the card's once it is counted there;
// copying it (a second buffer, written in full, page by page) cost about a third of a
// simulated step. Made as the card's factories make a tensor, then given that memory.
static at::Tensor adopt_onto_card(const at::Tensor& t, c10::Device card) {
  const c10::Storage& host = t.storage();
  const size_t bytes = host.nbytes();
  void* data = host.unsafeGetStorageImpl()->data_ptr().get();
  count_on_card(card.index(), static_cast<int64_t>(bytes));
  auto* block = new Adopted();
  block->host = host;
  graph::init_block(block, card.index(), bytes);
  c10::DataPtr memory(data, block, &release_adopted, card);
  const c10::DeviceGuard guard(card);
  auto out = at::empty({0}, t.options().device(card));
  auto* impl = out.unsafeGetTensorImpl();
  auto* storage = impl->storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(std::move(memory));
  storage->set_nbytes(bytes);
  impl->set_sizes_and_strides(t.sizes(), t.strides());
  impl->set_storage_offset(t.storage_offset());
  return out;
}

// Whether `t` alone holds memory of its own from the CPU allocator: a host alias of a card
// tensor (which does not own its memory) or a view of another tensor is not.
static bool owns_its_memory(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  return storage.use_count() == 1 && storage.nbytes() > 0 &&
         storage.unsafeGetStorageImpl()->data_ptr().get_deleter() ==
             c10::GetCPUAllocator()->raw_deleter();
}

// A new CPU result, onto the card (counted there); with `dtype`, converted to it on the way.
// A result that does not own its memory alone is copied instead.
static at::Tensor onto_card(const at::Tensor& t, c10::Device card,
                            c10::optional<at::ScalarType> dtype = c10::nullopt) {
  if (!t.defined() || !t.is_cpu()) return t;
  const bool convert = dtype.has_value() && t.is_floating_point() && *dtype != t.scalar_type();
  if (!convert && owns_its_memory(t)) return adopt_onto_card(t, card);
  const c10::DeviceGuard guard(card);
  auto options = t.options().device(card);
  if (dtype.has_value() && t.is_floating_point()) options = options.dtype(*dtype);
  auto out = at::empty_strided(t.sizes(), t.strides(), options);
  at::Tensor host = host_alias(out);
  host.copy_(t);
  return out;
}

// ---------------------------------------------------------------------------- host reads
// Every value the host reads back from a card: on hardware each one waits for the card to
// finish its queued work, so a training loop should do few. Per process, all threads.
static std::atomic<int64_t> g_scalar_reads{0};    // .item(), float(), bool(), int()
static std::atomic<int64_t> g_copies_to_host{0};  // .cpu(), .to('cpu'), .tolist(), .numpy()

// Every card is host memory: a copy between any two of cpu/card is a host copy.
static void host_copy(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  at::Tensor dst_host = dst.is_cpu() ? dst : host_alias(dst);
  const at::Tensor src_host = src.is_cpu() ? src : host_alias(src);
  at::native::copy_(dst_host, src_host, non_blocking);
}

static void count_copy(const at::Tensor& src, const at::Tensor& dst) {
  if (is_card(src) && dst.is_cpu()) g_copies_to_host.fetch_add(1, std::memory_order_relaxed);
}

static at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  count_copy(self, dst);
  host_copy(self, dst, non_blocking);
  graph::copy(self, dst);
  return dst;
}

static at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  count_copy(self, dst);
  {
    const c10::DeviceGuard guard(dst.device());
    at::native::resize_(dst, self.sizes(), c10::nullopt);
  }
  host_copy(self, dst, false);
  graph::copy(self, dst);
  return dst;
}

// torch_xla counts a scalar read among its CPU fallbacks (aten::_local_scalar_dense).
static at::Scalar local_scalar_dense(const at::Tensor& self) {
  g_scalar_reads.fetch_add(1, std::memory_order_relaxed);
  if (graph::on_xla(self)) {
    graph::note_fallback("aten::_local_scalar_dense", {self}, graph::kHostRead);
  }
  return at::native::_local_scalar_dense_cpu(host_alias(self));
}

static at::Tensor& set_source_Tensor_(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

static at::Tensor& set_source_Storage_(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, source);
}

// ---------------------------------------------------------------------------- devices
// Throws PyTorch's own error for tensors on two devices.
static void different_devices(c10::Device a, c10::Device b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least "
                     "two devices, ", a, " and ", b, "!");
}

static void expect_same_device(const at::Tensor& a, const at::Tensor& b) {
  if (b.defined() && a.device() != b.device()) different_devices(a.device(), b.device());
}

// Ops that legally take CPU index tensors with card tensors (as CUDA's do).
static bool takes_cpu_indices(const c10::OperatorName& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"};
  return ops.count(name.name) > 0;
}

// PyTorch's same-device rule, with its own wording: 0-dim CPU tensors are scalars and mix.
// Returns the card the op runs on.
static c10::optional<c10::Device> check_same_device(const c10::OperatorHandle& op,
                                                    torch::jit::Stack* stack) {
  const auto n = op.schema().arguments().size();
  c10::optional<c10::Device> card;
  c10::optional<c10::Device> cpu;
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
      different_devices(*card, t.device());
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
    different_devices(*cpu, *card);
  }
  return card;
}

// ---------------------------------------------------------------------------- XLA views
// torch_gcu 1.x's cards are XLA devices, whose tensors have no storage strides an op could
// refuse (torch_xla/csrc/tensor_impl.cpp: XLATensorImpl::is_contiguous_custom is true, the
// strides are computed from the shape): torch_xla's view is a reshape of the lazy value that
// aliases its base, so a view
// of a transposed or permuted tensor succeeds there, where a strided device refuses it ("view
// size is not compatible with input tensor's size and stride", e.g. in torch 1.10's
// math_native_layer_norm on a patch embedding's transposed output). On a simulated XLA card
// such a view is taken of a contiguous copy. Limit: an in-place write through that view
// does not reach its base (on XLA it does); a view its strides can express is a true alias.
static at::Tensor xla_view(const at::Tensor& self, at::IntArrayRef size) {
  const auto shape = at::infer_size(size, self.numel());
  if (at::detail::computeStride(self.sizes(), self.strides(), at::IntArrayRef(shape))) {
    return at::native::view(self, size);
  }
  return at::native::view(self.contiguous(), size);
}

// ---------------------------------------------------------------------------- half as float32
// PyTorch's CPU kernels for float16/bfloat16 convolution and matrix products are many times
// slower than float32 (and torch 1.10's CPU has none for some), so a rehearsal with --amp would
// look broken. The simulator computes these ops in float32 on the host and rounds the results to
// the inputs' half type. Results keep the dtype the model would see on a card, so this proves
// that half precision flows through the model as on hardware (autocast casts, half activations,
// float32 master weights, the grad scaler); it proves nothing about half-precision numerics,
// which here are float32's rounded once.

static bool is_half_type(at::ScalarType type) {
  return type == at::kHalf || type == at::kBFloat16;
}

// The half type that every floating tensor among `ts` has, if they all have the same one.
static c10::optional<at::ScalarType> shared_half_type(const std::vector<at::Tensor>& ts) {
  c10::optional<at::ScalarType> half;
  for (const auto& t : ts) {
    if (!t.defined() || !t.is_floating_point()) continue;
    const auto type = t.scalar_type();
    if (!is_half_type(type)) return c10::nullopt;
    if (half && *half != type) return c10::nullopt;
    half = type;
  }
  return half;
}

// A float32 copy of a half host tensor (other tensors as they are).
static at::Tensor as_float32(const at::Tensor& t) {
  return t.defined() && t.is_floating_point() ? t.to(at::kFloat) : t;
}

// Matrix products, and those torch.matmul and F.linear decompose into on both generations
// (mv/addmv/dot for vectors), out of place and in their out= form: torch 1.10 sends a card's
// mm to mm.out (its structured kernel allocates the result, then calls the out= form), which
// on the CPU's half type is a naive loop (a ConvNeXt step under --amp: 90 s). In-place forms
// take the normal path.
static bool computed_in_float32(const c10::FunctionSchema& schema) {
  static const std::unordered_set<std::string> ops = {
      "aten::mm",  "aten::addmm", "aten::bmm", "aten::baddbmm",
      "aten::mv",  "aten::addmv", "aten::dot"};
  const auto& overload = schema.overload_name();
  return (overload.empty() || overload == "out") && ops.count(schema.name()) > 0;
}

// ---------------------------------------------------------------------------- fallback
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
    for (const c10::IValue e : list) {
      out.push_back(e.isTensor() ? c10::IValue(fn(e.toTensor())) : e);
    }
    return out;
  }
  return v;
}

static bool same_alias(const c10::AliasInfo* a, const c10::AliasInfo* b) {
  return a != nullptr && b != nullptr && a->beforeSets() == b->beforeSets();
}

// The half type shared by the floating tensor arguments of an op, if any. Mixed inputs
// (half with float32) have none: they take the normal path, which refuses them as PyTorch does.
static c10::optional<at::ScalarType> half_arguments(const std::vector<c10::IValue>& given) {
  std::vector<at::Tensor> inputs;
  for (const auto& g : given) {
    if (g.isTensor()) inputs.push_back(g.toTensor());
  }
  return shared_half_type(inputs);
}

// What the kernel wrote into a host stand-in of `target` (an out= or in-place argument of a
// card op): resized like the kernel resized it, then copied onto the card's memory.
static void write_back(at::Tensor target, const at::Tensor& host, c10::Device card) {
  if (target.sizes() != host.sizes()) {
    const c10::DeviceGuard guard(card);
    at::native::resize_(target, host.sizes(), c10::nullopt);
  }
  (is_card(target) ? host_alias(target) : target).copy_(host);
}

// A CPU kernel that has no half version (torch 1.10's CPU lacks many: relu_ on float16 fails
// with '"clamp_min_cpu" not implemented for 'Half''), where a card has one.
static bool no_half_kernel(const c10::Error& e) {
  const std::string& what = e.msg();
  return what.find("not implemented for 'Half'") != std::string::npos ||
         what.find("not implemented for 'BFloat16'") != std::string::npos;
}

// Ops a card runs with half inputs and float32 parameters, as torch's CUDA kernels do (batch
// norm keeps its weights and statistics in float32 under autocast), and torch 1.10's CPU
// refuses ('"batch_norm" not implemented for 'Half''). The torch_gcu 1.x source lists no
// device kernels; this is CUDA's behaviour, taken as the card's. Other mixed calls are
// refused as PyTorch refuses them.
static bool mixes_half_and_float32(const c10::FunctionSchema& schema) {
  const auto& name = schema.name();
  return name == "aten::native_batch_norm" || name == "aten::native_batch_norm_backward" ||
         name.rfind("aten::_native_batch_norm_legit", 0) == 0;
}

// Whether any floating tensor argument has a half type.
static bool any_half_argument(const std::vector<c10::IValue>& given) {
  for (const auto& g : given) {
    if (!g.isTensor() || !g.toTensor().defined()) continue;
    if (is_half_type(g.toTensor().scalar_type())) return true;
  }
  return false;
}

// The dtype of the first floating tensor argument shaped like `t`, if any.
static c10::optional<at::ScalarType> dtype_of_same_shape(const at::Tensor& t,
                                                         const std::vector<c10::IValue>& given) {
  for (const auto& g : given) {
    if (!g.isTensor()) continue;
    const auto& a = g.toTensor();
    if (a.defined() && a.is_floating_point() && a.sizes() == t.sizes()) return a.scalar_type();
  }
  return c10::nullopt;
}

// An op run on host copies of its arguments (`given`, as the caller passed them; `copy` makes
// each from a host tensor). In-place and out= results are written into the card tensors they
// name; other results go onto the card, floating ones rounded to `rounded(result)` if set.
static void run_on_copies(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                          const std::vector<c10::IValue>& given, c10::Device card,
                          const std::function<at::Tensor(const at::Tensor&)>& copy,
                          const std::function<c10::optional<at::ScalarType>(const at::Tensor&)>&
                              rounded) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  // The copies outlive the call: an out= kernel returns references to its arguments, which
  // the boxed call has dropped from the stack by then.
  std::vector<c10::IValue> copies;
  for (size_t i = 0; i < given.size(); ++i) {
    const auto& g = given[i];
    const auto* alias = graph::alias_info(args[i]);
    const bool written = alias != nullptr && alias->isWrite();
    if (g.isDevice() && g.toDevice().type() == card.type()) {
      stack->push_back(c10::IValue(c10::Device(c10::DeviceType::CPU)));
    } else {
      // Written arguments always get a copy: the kernel may resize them (out=), and a
      // host alias cannot be resized; the results are copied back below.
      stack->push_back(map_tensors(g, [&copy, written](const at::Tensor& t) {
        const auto host = is_card(t) ? host_alias(t) : t;
        auto made = copy(host);
        return written && made.is_same(host) ? host.clone() : made;
      }));
    }
    copies.push_back(stack->back());
  }
  {
    const c10::DeviceGuard guard(card);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  const auto& rets = schema.returns();
  const size_t rfirst = stack->size() - rets.size();
  for (size_t r = 0; r < rets.size(); ++r) {
    auto& v = (*stack)[rfirst + r];
    const auto* ralias = graph::alias_info(rets[r]);
    c10::optional<size_t> target;
    for (size_t i = 0; ralias && ralias->isWrite() && i < args.size(); ++i) {
      if (same_alias(ralias, graph::alias_info(args[i])) && given[i].isTensor()) target = i;
    }
    if (target && v.isTensor()) {
      write_back(given[*target].toTensor(), v.toTensor(), card);
      v = given[*target];
    } else {
      v = map_tensors(v, [&](const at::Tensor& t) { return onto_card(t, card, rounded(t)); });
    }
  }
}

// An op on half arguments (a matrix product, or an op the CPU has no half kernel for) run on
// float32 copies of its arguments. In-place and out= results are rounded into the card
// tensors they name; other floating results are rounded to `half` on the card, or, where the
// arguments mix a half type with float32 (`half` empty: batch norm's float32 weights and
// statistics), to the dtype of the first argument of the same shape (the output like the
// input, the statistics float32).
static void run_in_float32(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           const std::vector<c10::IValue>& given, c10::Device card,
                           c10::optional<at::ScalarType> half) {
  run_on_copies(op, stack, given, card, as_float32, [&](const at::Tensor& t) {
    return half ? half : dtype_of_same_shape(t, given);
  });
}

// CPU kernels of torch 1.10 that compute a wrong result from a strided argument, where a T20
// sees none (an XLA tensor has no strides: torch_xla 1.10, tensor_impl.cpp:118-142) and
// torch_xla 1.10 lowers the op (xla_native_functions.yaml): gelu_backward with a transposed
// grad and a contiguous input returns memory it never wrote (DPT's readout projection: NaN
// after one step); torch 2.x's kernel is right.
static bool miscomputes_strided(const std::string& base) {
#if MMGCU_SIM_TORCH2
  (void)base;
  return false;
#else
  return base == "gelu_backward";
#endif
}

// Ops a card runs on contiguous host copies of its strided arguments (a transposed view):
// - a random op: a card draws its numbers in the tensor's logical order. An XLA tensor has
//   no strides, so the T20's random ops fill the logical shape; torch 1.10's CPU kernels do
//   the same, torch 2.x's fill a strided tensor in memory order (dropout on a transposed
//   tensor draws another mask). The S60's generator is not public: ASSUMED the same order,
//   so both generations' cards draw the same numbers from the same seed;
// - a torch 1.10 kernel that miscomputes strided arguments (above).
static bool runs_on_contiguous_copies(const c10::FunctionSchema& schema,
                                      const std::vector<c10::IValue>& given) {
  bool strided = false;
  for (const auto& g : given) {
    if (g.isTensor() && is_card(g.toTensor()) && !g.toTensor().is_contiguous()) strided = true;
  }
  if (!strided) return false;
  const auto base = graph::base_name(schema.name());
  return graph::draws_random(base, schema) || miscomputes_strided(base);
}

static at::Tensor contiguous_copy(const at::Tensor& t) {
  return t.defined() ? t.contiguous() : t;
}

// torch_gcu 1.x's torch.distributed has only gloo, which refuses a card tensor: torch 1.10
// says "ProcessGroupGloo::allreduce: unsupported device type xla" (mmdet's reduce_mean in
// Mask2Former's loss). torch 2 dispatches its c10d ops by the tensors' device, so an XLA
// card tensor would reach this fallback, and gloo's CPU kernel would run on the card's host
// memory where a T20 fails; refused here with torch 1.10's words. (The simulated ECCL hands
// gloo host aliases, CPU tensors, and never comes here.)
static void refuse_collective_on_xla(const c10::FunctionSchema& schema, c10::Device card) {
  const auto& name = schema.name();
  if (card.type() != c10::DeviceType::XLA || name.rfind("c10d::", 0) != 0) return;
  auto collective = name.substr(6);
  if (!collective.empty() && collective.back() == '_') collective.pop_back();
  TORCH_CHECK(false, "ProcessGroupGloo::", collective, ": unsupported device type xla");
}

// The CPU kernel of an op, run on the cards' host memory itself (no copy), so in-place
// updates land on the card as they would on hardware. `given` are the op's arguments, which
// the stack holds.
static void run_on_card(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        const std::vector<c10::IValue>& given, c10::optional<c10::Device> card) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t first = stack->size() - args.size();
  if (runs_on_contiguous_copies(schema, given)) {
    stack->erase(stack->begin() + first, stack->end());
    run_on_copies(op, stack, given, *card, contiguous_copy,
                  [](const at::Tensor&) { return c10::nullopt; });
    return;
  }
  const auto half = computed_in_float32(schema) ? half_arguments(given) : c10::nullopt;
  if (half) {  // a matrix product on a half type: in float32, rounded to it
    stack->erase(stack->begin() + first, stack->end());
    run_in_float32(op, stack, given, *card, half);
    return;
  }
  // out= arguments: the kernel writes through a host alias of the card's memory, which it
  // may restride but not grow. One it must grow ("... is not resizable") gets a host copy,
  // written back below.
  std::vector<std::pair<size_t, at::Tensor>> outs;
  auto push_arguments = [&](bool copy_outs) {
    outs.clear();
    for (size_t i = 0; i < args.size(); ++i) {
      auto v = given[i];
      const auto* alias = graph::alias_info(args[i]);
      if (v.isTensor() && is_card(v.toTensor()) && args[i].kwarg_only() && alias &&
          alias->isWrite()) {
        auto host = host_alias(v.toTensor());
        if (copy_outs) host = host.clone();
        outs.emplace_back(i, host);
        v = host;
      } else if (v.isDevice() && v.toDevice().type() == card->type()) {
        v = c10::IValue(c10::Device(c10::DeviceType::CPU));
      } else {
        v = map_tensors(v, [](const at::Tensor& t) { return is_card(t) ? host_alias(t) : t; });
      }
      stack->push_back(std::move(v));
    }
  };
  auto call = [&](bool copy_outs) {
    if (stack->size() > first) stack->erase(stack->begin() + first, stack->end());
    push_arguments(copy_outs);
    const c10::DeviceGuard guard(*card);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  };
  try {
    try {
      call(false);
    } catch (const c10::Error& e) {
      if (outs.empty() || e.msg().find("not resizable") == std::string::npos) throw;
      call(true);
    }
  } catch (const c10::Error& e) {
    const auto shared = half_arguments(given);
    const bool mixed = !shared && mixes_half_and_float32(schema) && any_half_argument(given);
    if (!no_half_kernel(e) || !(shared || mixed)) throw;
    if (stack->size() > first) stack->erase(stack->begin() + first, stack->end());
    run_in_float32(op, stack, given, *card, shared);
    return;
  }
  for (const auto& out : outs) {
    const auto& target = given[out.first].toTensor();
    const auto& host = out.second;
    if (host.data_ptr() != target.data_ptr()) {
      write_back(target, host, *card);  // a host copy
    } else if (host.sizes() != target.sizes() || host.strides() != target.strides()) {
      // Written in place, restrided within its memory: the card tensor takes that geometry.
      target.unsafeGetTensorImpl()->set_sizes_and_strides(host.sizes(), host.strides());
    }
  }
  const auto& rets = schema.returns();
  const size_t rfirst = stack->size() - rets.size();
  for (size_t r = 0; r < rets.size(); ++r) {
    auto& v = (*stack)[rfirst + r];
    const auto* ralias = graph::alias_info(rets[r]);
    c10::optional<size_t> source;
    for (size_t i = 0; ralias && i < args.size(); ++i) {
      if (same_alias(ralias, graph::alias_info(args[i])) && given[i].isTensor()) source = i;
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

// Every op without a card kernel: PyTorch's device check, the op's place in an XLA card's
// lazy graph (lazy_ops.h), then its CPU kernel on the card's memory.
static void card_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto card = check_same_device(op, stack);
  TORCH_CHECK(card.has_value(), op.schema().name(), ": no simulated card among the arguments");
  refuse_collective_on_xla(op.schema(), *card);
  const size_t n = op.schema().arguments().size();
  const std::vector<c10::IValue> given(stack->end() - n, stack->end());
  const auto run = graph::before_op(op, given, *card);
  run_on_card(op, stack, given, card);
  graph::after_op(run, op, given, *stack);
}

// ---------------------------------------------------------------------------- whole ops
// Ops torch_xla lowers whole (1.10 and 2.9 alike) that torch also gives a composite kernel,
// whose composite reaches the card as ops torch_xla does not lower: repeat (and tile, which
// calls it) as unfold, mv as addmv_. torch_xla registers a kernel of its own for each op it
// lowers (xla_native_functions.yaml), which the dispatcher takes before a composite one, so an
// XLA card sees these whole: on torch_xla 2.9 neither falls back (tests/conformance,
// composite_ops). cummax stays composite: 2.9 lowers it, but the T20's 1.10 does not, and its
// composite's _cummax_helper falls back there as it does here.
inline void register_whole_ops(torch::Library& m) {
  for (const char* name : {"repeat", "mv"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&card_fallback>());
  }
}

// ---------------------------------------------------------------------------- backward
// Runs `fn` when the running backward pass ends, like Variable._execution_engine.queue_callback,
// for the simulated torch_gcu 1.x DDP's gradient reduction. Backward on a card runs on the
// card's autograd thread, and torch 1.10 rethrows a queued callback's Python error on the
// calling thread without saving it first, so the collective's error is lost ("SystemError:
// <built-in method run_backward ...> returned NULL without setting an error"). A card's
// reducer is C++ (torch_gcu 1.x's Reducer), whose errors cross threads whole: saving the
// Python error before it leaves this thread does the same (torch 2 saves it itself).
static void queue_backward_callback(pybind11::function fn) {
  std::shared_ptr<PyObject> callback(fn.release().ptr(), [](PyObject* f) {
    pybind11::gil_scoped_acquire gil;
    Py_DECREF(f);
  });
  torch::autograd::Engine::get_default_engine().queue_callback([callback]() {
    pybind11::gil_scoped_acquire gil;
    PyObject* result = PyObject_CallFunctionObjArgs(callback.get(), nullptr);
    if (result == nullptr) {
      python_error error;
      error.persist();
      throw error;
    }
    Py_DECREF(result);
  });
}

// ---------------------------------------------------------------------------- python
static int check_card(int64_t card) {
  TORCH_CHECK(card >= 0 && card < kMaxCards, "no card ", card);
  return static_cast<int>(card);
}

// The lazy graph's functions (mmgcu.sim.graph wraps them). Those that take the graph's lock
// release the GIL first: a card op on another thread may wait for the lock, and a cut asks
// Python for its caller.
inline void define_graph(pybind11::module& m) {
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def(
      "graph_configure",
      [](const std::string& profile, const std::vector<std::string>& lowered, int64_t cache) {
        TORCH_CHECK(profile == "t20" || profile == "xla-cpu" || profile == "off",
                    "graph profile ", profile);
        std::lock_guard<std::mutex> lock(graph::S().mu);
        auto& s = graph::S();
        s.enabled = profile != "off";
        graph::config().profile = profile == "t20" ? graph::kT20 : graph::kXlaCpu;
        s.lowered = std::unordered_set<std::string>(lowered.begin(), lowered.end());
        s.capacity = static_cast<size_t>(cache);
        s.configured = true;
      },
      "the ops torch_xla lowers (base names), the profile of its conditional fallbacks and "
      "the compile cache's size");
  m.def("graph_set_caller", [](pybind11::object fn) {
    graph::S().caller_fn = fn.release().ptr();  // kept for the life of the process
  });
  m.def("graph_sync", &graph::sync_tensors, release(),
        "run a graph whose outputs are these tensors (torch_gcu's unlazy, optimizer_step)");
  m.def("graph_sync_live", &graph::sync_live, release(),
        "run a graph of every live pending value of a card (sync_lived_tensor, mark_step)");
  m.def("graph_restart_seed", &graph::restart_seed, release(),
        "a new seed or a step marker: the card's seed chain starts again");
  m.def("graph_collective", &graph::collective, release(),
        "an ECCL collective: an op of the graph that reads `inputs` and writes `outputs`");
  m.def(
      "graph_pending",
      [](int64_t card) {
        std::lock_guard<std::mutex> lock(graph::S().mu);
        int64_t n = 0;
        for (auto* b = graph::S().pending[check_card(card)]; b; b = b->next) n++;
        return n;
      },
      release(), "how many card storages hold a value not yet run");
  m.def(
      "graph_counters",
      [] {
        std::lock_guard<std::mutex> lock(graph::S().mu);
        const auto& s = graph::S();
        std::map<std::string, int64_t> out(s.fallbacks.begin(), s.fallbacks.end());
        for (int c = 0; c < 3; ++c) out[std::string("runs.") + graph::kCauseNames[c]] = s.runs[c];
        out["UncachedCompile"] = s.uncached;
        out["CachedCompile"] = s.cached;
        out["events"] = static_cast<int64_t>(s.events.size()) + s.dropped_events;
        return out;
      },
      release(), "graph runs by cause, compiles, and the aten:: ops that fell back");
  m.def(
      "graph_events",
      [](int64_t start) {
        std::lock_guard<std::mutex> lock(graph::S().mu);
        const auto& s = graph::S();
        std::vector<std::tuple<std::string, std::string, std::string, bool, int64_t>> out;
        const auto from = static_cast<size_t>(std::max<int64_t>(0, start - s.dropped_events));
        for (size_t i = from; i < s.events.size(); ++i) {
          const auto& e = s.events[i];
          out.emplace_back(graph::kCauseNames[e.cause], e.what, e.caller, e.compiled, e.outputs);
        }
        return out;
      },
      release(), "the graph runs from index `start`: (cause, what, caller, compiled, outputs)");
  m.def(
      "graph_clear_cache",
      [] {
        std::lock_guard<std::mutex> lock(graph::S().mu);
        graph::S().cache.clear();
        graph::S().lru.clear();
      },
      release(), "forget every compiled graph (torch_gcu.clear_graph_caches)");
}

// The functions mmgcu.sim uses on both generations; each translation unit adds `install`.
inline void define_common(pybind11::module& m) {
  m.def("card_count", [] { return g_card_count.load(); });
  m.def("current_device", [] { return static_cast<int64_t>(t_current); });
  m.def("set_device", [](int64_t i) { t_current = static_cast<c10::DeviceIndex>(i); });
  m.def("memory_allocated", [](int64_t card) {
    std::lock_guard<std::mutex> lock(g_memory_mutex);
    return g_memory[check_card(card)].allocated;
  });
  m.def("max_memory_allocated", [](int64_t card) {
    std::lock_guard<std::mutex> lock(g_memory_mutex);
    return g_memory[check_card(card)].peak;
  });
  m.def("reset_peak", [](int64_t card) {
    std::lock_guard<std::mutex> lock(g_memory_mutex);
    auto& mem = g_memory[check_card(card)];
    mem.peak = mem.allocated;
  });
  m.def("manual_seed", [](int64_t card, uint64_t seed) {
    auto gen = default_generator(static_cast<c10::DeviceIndex>(card));
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  });
  m.def("queue_backward_callback", &queue_backward_callback,
        "run a function when the running backward pass ends; its exception reaches backward()'s caller");
  m.def("host_alias", &host_alias,
        "a CPU tensor over a card tensor's host memory (no copy; not a host read)");
  m.def(
      "host_reads",
      [] {
        pybind11::dict reads;
        reads["scalar_reads"] = g_scalar_reads.load();
        reads["copies_to_host"] = g_copies_to_host.load();
        return reads;
      },
      "values read back from the cards by the host in this process: scalar reads "
      "(.item(), float(), bool()) and copies to CPU tensors (.cpu(), .tolist(), .numpy())");
  define_graph(m);
  m.def(
      "reset_host_reads",
      [] {
        g_scalar_reads.store(0);
        g_copies_to_host.store(0);
      },
      "set the host-read counters to zero");
}

}  // namespace mmgcu_sim
