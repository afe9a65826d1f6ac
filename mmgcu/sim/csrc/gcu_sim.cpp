// The native part of the simulated torch_gcu: what PyTorch needs in C++ to treat
// PrivateUse1 ("gcu", torch_gcu 2.x) and XLA (torch_gcu 1.x) as real devices.
//
// It registers only a device guard per device type (current card, default stream,
// no-op events) and the PrivateUse1 hooks autograd asks for. Tensors and kernels
// live in Python (mmgcu/sim/tensor.py); this file holds no data.
#include <torch/extension.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/detail/XLAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace mmgcu_sim {

static std::atomic<int> g_card_count{1};
// One current card per thread, like the CUDA runtime.
static thread_local c10::DeviceIndex t_current = 0;

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

// Autograd and the RNG ask these; a CPU generator per card keeps seeding real.
static std::vector<at::Generator>& generators() {
  static std::vector<at::Generator> gens;
  return gens;
}
static std::mutex g_gen_mutex;

static const at::Generator& default_generator(c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(g_gen_mutex);
  auto& gens = generators();
  auto i = index < 0 ? t_current : index;
  while (static_cast<c10::DeviceIndex>(gens.size()) <= i) {
    gens.push_back(at::make_generator<at::CPUGeneratorImpl>(
        c10::detail::getNonDeterministicRandom()));
  }
  return gens[i];
}

struct SimPrivateUse1Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
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
  const at::Generator& getDefaultGenerator(
      c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override {
    return at::make_generator<at::CPUGeneratorImpl>(
        c10::detail::getNonDeterministicRandom());
  }
  void init() const override {}
};

static SimPrivateUse1Hooks* g_hooks = nullptr;

void install(int64_t cards) {
  g_card_count.store(static_cast<int>(cards));
  if (g_hooks == nullptr) {
    g_hooks = new SimPrivateUse1Hooks();
    at::RegisterPrivateUse1HooksInterface(g_hooks);
  }
}

int64_t card_count() { return g_card_count.load(); }
int64_t current_device() { return t_current; }
void set_device(int64_t index) { t_current = static_cast<c10::DeviceIndex>(index); }

void manual_seed(int64_t index, uint64_t seed) {
  auto gen = default_generator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

}  // namespace mmgcu_sim

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &mmgcu_sim::install, "register the hooks and set the card count");
  m.def("card_count", &mmgcu_sim::card_count);
  m.def("current_device", &mmgcu_sim::current_device);
  m.def("set_device", &mmgcu_sim::set_device);
  m.def("manual_seed", &mmgcu_sim::manual_seed);
}
