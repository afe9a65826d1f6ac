// The lazy graph of a simulated XLA card (torch_gcu 1.x, the T20): which values are still
// pending, when a pending graph runs, and which graphs are compiled first.
//
// torch_gcu 1.x is built on XLA (its _GCUC module has torch_xla's _sync_multi,
// _sync_live_tensors and metrics_report), so a card tensor is lazy: an op records IR, and a
// graph of that IR runs only when something needs its values. The 1.x source shows the
// Python layer only; where it is silent this follows torch_xla's documented semantics
// (docs/source/perf/recompilation.md, docs/source/learn/troubleshoot.md) and its code at
// v1.10.0 (torch_xla/csrc/tensor.cpp, ir.cpp, aten_xla_type.cpp), checked against a real
// XLA runtime by the conformance suite (tests/conformance):
//   - a value is either device data or the IR that computes it. Each op's IR node is hashed
//     over the op, its attributes, its operands' hashes and their shapes and dtypes; device
//     data is hashed by its shape alone, and so is a Python scalar, except 0 and +-1, which
//     are folded in as constants (torch_xla's IsSpecialScalar, XLA_NO_SPECIAL_SCALARS);
//   - a graph runs (a "cut") when the host reads a pending value (.item(), .cpu()), when
//     an op without a lowering needs its inputs on the CPU (torch_xla's CPU fallback,
//     counted as aten::<op>: nonzero, masked_select, boolean-mask indexing, ...), and at
//     the step (torch_gcu's optimizer_step / unlazy / sync_lived_tensor, torch_xla's
//     mark_step). Its outputs are the values asked for (a read, a fallback's inputs, the
//     step's list) or every live pending value (sync_lived_tensor). A copy to the host and
//     the step make them device data (XLATensor::ApplyPendingGraph, SyncTensorsGraph); a
//     fallback's inputs and a scalar read (.item() is a fallback too) keep their IR
//     (GetTensors computes the values without assigning them), so the next fallback on the
//     same value runs its graph again. Other pending values that used the outputs' IR keep
//     it (they recompute it);
//   - every random op (dropout, bernoulli, normal, rand, ...) takes the card's seed from an
//     IR chain, seed' = seed * k + b, that only a step marker or a new seed restarts
//     (torch_xla's DeviceContextArena::GetRngSeed, MarkStep, SetRngSeed): a graph synced
//     without either grows by that chain every step, and compiles anew;
//   - the graph's hash is that of its outputs' IR; a hash not seen before is compiled
//     (UncachedCompile), a known one is taken from the cache (CachedCompile), an LRU of
//     1024 graphs (XLA_COMPILATION_CACHE_SIZE; torch_gcu's dtuTryGetCacheExe caches by hash).
// Values are tracked per card storage (a CardBlock: the context of the card's allocation):
// a write through a view updates its storage, as torch_xla's view updates reach their base.
// The values themselves are computed eagerly by the CPU kernels; this only counts.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace mmgcu_sim {

constexpr int kMaxCards = 64;

// What the simulator knows of one card storage: its bytes on which card, and (on an XLA
// card) its value in the lazy graph.
struct CardBlock {
  int card = 0;
  size_t bytes = 0;
  uint64_t value = 0;    // hash of the device data or of the IR that computes it
  bool pending = false;  // IR not yet run
  uint64_t seq = 0;      // creation order: torch_xla syncs live tensors in that order
  CardBlock* prev = nullptr;  // the card's list of pending blocks
  CardBlock* next = nullptr;
};

namespace graph {

inline uint64_t mix(uint64_t h, uint64_t v) {
  uint64_t x = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t hash_text(const std::string& s) { return mix(0x7e57, std::hash<std::string>{}(s)); }

constexpr uint64_t kData = 0xda7a;
constexpr uint64_t kEmpty = 0xe4e4;
constexpr uint64_t kConst = 0xc0c0;
constexpr uint64_t kScalarData = 0x5ca1;
constexpr uint64_t kGraph = 0x96a9;
constexpr uint64_t kUpdate = 0x0bda;
constexpr uint64_t kZeroFull = 0x0f00;

// Why a graph ran.
enum Cause { kStep = 0, kHostRead = 1, kFallback = 2 };
static const char* const kCauseNames[] = {"step", "host_read", "fallback"};

// How an op runs on the card: lowered into the graph, or on the CPU after a cut (torch_xla's
// fallback), or lowered after a nonzero on its boolean-mask index (torch_xla's index and
// index_put_ expand byte and bool indices with nonzero, which falls back).
enum Kind { kLowered = 0, kFallsBack = 1, kMaskIndex = 2 };

struct Event {
  int cause;
  std::string what;    // the op or read that made the cut
  std::string caller;  // file:line of the Python code that called it
  bool compiled;       // a graph not seen before
  int64_t outputs;
};

struct State {
  std::mutex mu;
  CardBlock* pending[kMaxCards] = {};
  uint64_t next_seq = 1;
  // the compile cache: graph hashes, most recently used first
  std::list<uint64_t> lru;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> cache;
  size_t capacity = 1024;
  int64_t runs[3] = {0, 0, 0};
  int64_t uncached = 0;
  int64_t cached = 0;
  std::map<std::string, int64_t> fallbacks;  // "aten::<op>" -> count
  std::vector<Event> events;
  size_t max_events = 100000;
  int64_t dropped_events = 0;
  // each card's seed chain: 0 when no random op took a seed since the last restart
  uint64_t rng[kMaxCards] = {};
  // base op names torch_xla lowers, and the profile of conditional fallbacks
  std::unordered_set<std::string> lowered;
  bool configured = false;
  bool enabled = true;
  bool tpu_only_falls_back = false;  // torch_xla on a CPU device: the TPU-only lowerings fall back
  std::unordered_map<const void*, int> kinds;  // by schema, for ops whose kind is fixed
  PyObject* caller_fn = nullptr;
};

// Never destroyed: storages are released during interpreter exit too.
inline State& S() {
  static State* s = new State();
  return *s;
}

// ---------------------------------------------------------------------------- blocks
inline void init_block(CardBlock* b, int card, size_t bytes) {
  b->card = card;
  b->bytes = bytes;
  b->value = mix(kData, bytes);
  b->pending = false;
  std::lock_guard<std::mutex> lock(S().mu);
  b->seq = S().next_seq++;
}

inline void link_locked(CardBlock* b) {
  if (b->pending) return;
  auto& head = S().pending[b->card];
  b->pending = true;
  b->prev = nullptr;
  b->next = head;
  if (head) head->prev = b;
  head = b;
}

inline void unlink_locked(CardBlock* b) {
  if (!b->pending) return;
  auto& head = S().pending[b->card];
  if (b->prev) b->prev->next = b->next;
  if (b->next) b->next->prev = b->prev;
  if (head == b) head = b->next;
  b->prev = b->next = nullptr;
  b->pending = false;
}

// A block that is freed leaves the card's live values.
inline void forget(CardBlock* b) {
  std::lock_guard<std::mutex> lock(S().mu);
  unlink_locked(b);
}

// The deleters of card allocations (set by the allocator's header): a storage whose DataPtr
// has one of them carries a CardBlock as its context.
inline std::vector<c10::DeleterFnPtr>& block_deleters() {
  static std::vector<c10::DeleterFnPtr> d;
  return d;
}

inline CardBlock* block_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const auto& ptr = t.storage().data_ptr();
  const auto deleter = ptr.get_deleter();
  for (auto d : block_deleters()) {
    if (d == deleter) return static_cast<CardBlock*>(ptr.get_context());
  }
  return nullptr;
}

// Whether `t` is on an XLA card whose graph is kept (MMGCU_SIM_XLA=off: none is, to measure
// what keeping it costs).
inline bool on_xla(const at::Tensor& t) {
  return S().enabled && t.defined() && t.device().type() == c10::DeviceType::XLA;
}

// ---------------------------------------------------------------------------- values
inline uint64_t geometry(const at::Tensor& t) {
  uint64_t h = mix(0x6e0, static_cast<uint64_t>(t.scalar_type()));
  for (auto s : t.sizes()) h = mix(h, static_cast<uint64_t>(s));
  h = mix(h, 0x5757);
  for (auto s : t.strides()) h = mix(h, static_cast<uint64_t>(s));
  return mix(h, static_cast<uint64_t>(t.storage_offset()));
}

// torch_xla's IsSpecialScalar: 0 and +-1 (integral or floating) are constants of the graph.
inline bool is_special(const c10::Scalar& s) {
  if (!s.isFloatingPoint() && !s.isIntegral(false)) return false;
  const double d = s.toDouble();
  return d == 0.0 || std::fabs(d) == 1.0;
}

// A Python scalar (or a 0-dim CPU tensor) in an op: a special one is a constant of the graph,
// any other value is uploaded as data, so a new value does not compile a new graph.
inline uint64_t scalar_value(const c10::Scalar& s) {
  const uint64_t type = s.isFloatingPoint() ? 1 : s.isBoolean() ? 3 : s.isIntegral(false) ? 2 : 4;
  if (!is_special(s)) return mix(kScalarData, type);
  const double d = s.toDouble();
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return mix(mix(kConst, type), bits);
}

// The value of an op's tensor operand: its storage's value seen through its geometry; a CPU
// tensor is uploaded as data (a 0-dim one as a scalar).
inline uint64_t value_of_locked(const at::Tensor& t) {
  if (!t.defined()) return 0x0d0d;
  if (t.is_cpu()) {
    if (t.dim() == 0) return mix(scalar_value(t.item()), static_cast<uint64_t>(t.scalar_type()));
    return mix(mix(kData, 0xc9), geometry(t));
  }
  const CardBlock* b = block_of(t);
  return mix(b ? b->value : mix(kData, t.storage().nbytes()), geometry(t));
}

inline bool is_pending_locked(const at::Tensor& t) {
  const CardBlock* b = on_xla(t) ? block_of(t) : nullptr;
  return b != nullptr && b->pending;
}

// `t` now holds `value`: its whole storage, or through a view, an update of it.
inline void write_locked(const at::Tensor& t, uint64_t value, bool pending) {
  CardBlock* b = block_of(t);
  if (b == nullptr) return;
  const bool whole = t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
                     static_cast<size_t>(t.numel()) * t.element_size() == b->bytes;
  if (whole) {
    b->value = value;
  } else {
    b->value = mix(mix(mix(kUpdate, b->value), geometry(t)), value);
    pending = true;
  }
  if (pending) {
    link_locked(b);
  } else {
    unlink_locked(b);
  }
}

inline uint64_t leaf(const CardBlock* b) { return mix(kData, b->bytes); }

// ---------------------------------------------------------------------------- cuts
inline void cache_locked(uint64_t g, bool* compiled) {
  auto& s = S();
  auto found = s.cache.find(g);
  if (found != s.cache.end()) {
    s.lru.splice(s.lru.begin(), s.lru, found->second);
    s.cached++;
    *compiled = false;
    return;
  }
  s.lru.push_front(g);
  s.cache[g] = s.lru.begin();
  if (s.cache.size() > s.capacity) {
    s.cache.erase(s.lru.back());
    s.lru.pop_back();
  }
  s.uncached++;
  *compiled = true;
}

// Runs the graph whose outputs are the pending ones of `blocks` (in their order); with
// `materialize` they become device data. Nothing pending: no graph (torch_xla runs none).
inline void cut_locked(const std::vector<CardBlock*>& blocks, int cause, const std::string& what,
                       const std::string& caller, bool materialize = true) {
  auto& s = S();
  uint64_t g = kGraph;
  std::vector<CardBlock*> outputs;
  for (auto* b : blocks) {
    if (b == nullptr || !b->pending) continue;
    if (std::find(outputs.begin(), outputs.end(), b) != outputs.end()) continue;
    outputs.push_back(b);
    g = mix(g, b->value);
  }
  if (outputs.empty()) return;
  bool compiled = false;
  cache_locked(g, &compiled);
  s.runs[cause]++;
  for (auto* b : outputs) {
    if (!materialize) break;
    b->value = leaf(b);
    unlink_locked(b);
  }
  if (s.events.size() < s.max_events) {
    s.events.push_back(Event{cause, what, caller, compiled, static_cast<int64_t>(outputs.size())});
  } else {
    s.dropped_events++;
  }
}

// file:line of the Python code running now (outside torch), from mmgcu.sim.graph's hook.
// Called without the graph's lock (it takes the GIL).
inline std::string python_caller() {
  auto& s = S();
  if (s.caller_fn == nullptr || !Py_IsInitialized()) return "";
  pybind11::gil_scoped_acquire gil;
  try {
    auto fn = pybind11::reinterpret_borrow<pybind11::object>(s.caller_fn);
    return pybind11::cast<std::string>(fn());
  } catch (const std::exception&) {
    return "";
  }
}

template <typename Tensors>
std::vector<CardBlock*> pending_blocks_locked(const Tensors& tensors) {
  std::vector<CardBlock*> blocks;
  for (const auto& t : tensors) {
    if (is_pending_locked(t)) blocks.push_back(block_of(t));
  }
  return blocks;
}

// A cut for `tensors` made by `what`, with the Python caller when a graph runs.
inline void cut_for(const std::vector<at::Tensor>& tensors, int cause, const std::string& what,
                    bool materialize) {
  {
    std::lock_guard<std::mutex> lock(S().mu);
    if (pending_blocks_locked(tensors).empty()) return;
  }
  const std::string caller = python_caller();
  std::lock_guard<std::mutex> lock(S().mu);
  cut_locked(pending_blocks_locked(tensors), cause, what, caller, materialize);
}

// The host copies `t` (.cpu(), .numpy(), printing): its pending graph runs first, and `t`
// holds device data from then on.
inline void host_read(const at::Tensor& t, const char* what) {
  if (on_xla(t)) cut_for({t}, kHostRead, what, true);
}

inline void count_fallback(const std::string& name) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().fallbacks[name]++;
}

// torch_gcu's unlazy / optimizer_step(model=...): a graph whose outputs are `tensors`.
inline void sync_tensors(const std::vector<at::Tensor>& tensors) {
  const std::string caller = python_caller();
  std::lock_guard<std::mutex> lock(S().mu);
  cut_locked(pending_blocks_locked(tensors), kStep, "step", caller);
}

// torch_gcu's sync_lived_tensor (torch_xla's mark_step): every live pending value of the card.
inline void sync_live(int card) {
  const std::string caller = python_caller();
  std::lock_guard<std::mutex> lock(S().mu);
  std::vector<CardBlock*> blocks;
  for (auto* b = S().pending[card]; b != nullptr; b = b->next) blocks.push_back(b);
  std::sort(blocks.begin(), blocks.end(),
            [](const CardBlock* a, const CardBlock* b) { return a->seq < b->seq; });
  cut_locked(blocks, kStep, "step", caller);
}

// ---------------------------------------------------------------------------- seeds
constexpr uint64_t kSeed = 0x5eed;

// The seed a random op on `card` takes: the next link of the card's chain.
inline uint64_t next_seed_locked(int card) {
  auto& chain = S().rng[card];
  chain = mix(chain == 0 ? mix(kScalarData, 2) : chain, kSeed);
  return chain;
}

// A new seed (torch_gcu.manual_seed_all) or a step marker: the chain starts again.
inline void restart_seed(int card) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().rng[card] = 0;
}

// ---------------------------------------------------------------------------- op nodes
// A node's hash, built from the op and its arguments as the graph sees them.
struct Node {
  uint64_t hash;
  explicit Node(const std::string& op) : hash(hash_text(op)) {}
  void add(uint64_t v) { hash = mix(hash, v); }
  void tensor_locked(const at::Tensor& t) { add(value_of_locked(t)); }
  void shape_only(const at::Tensor& t) { add(t.defined() ? geometry(t) : 0x0d0d); }
  void ivalue_locked(const c10::IValue& v, bool scalar, bool value_read);
};

inline void Node::ivalue_locked(const c10::IValue& v, bool scalar, bool value_read) {
  if (v.isTensor()) {
    value_read ? tensor_locked(v.toTensor()) : shape_only(v.toTensor());
  } else if (v.isNone()) {
    add(0x404e);
  } else if (scalar && (v.isDouble() || v.isInt() || v.isBool())) {
    add(scalar_value(v.toScalar()));
  } else if (v.isInt()) {
    add(mix(0x1, static_cast<uint64_t>(v.toInt())));
  } else if (v.isDouble()) {
    const double d = v.toDouble();
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    add(mix(0x2, bits));
  } else if (v.isBool()) {
    add(mix(0x3, v.toBool()));
  } else if (v.isString()) {
    add(hash_text(v.toStringRef()));
  } else if (v.isDevice()) {
    add(mix(0x5, static_cast<uint64_t>(v.toDevice().type())));
  } else if (v.isList()) {
    const auto list = v.toListRef();
    add(mix(0x6, list.size()));
    for (const auto& e : list) ivalue_locked(e, scalar, value_read);
  } else if (v.isTuple()) {
    for (const auto& e : v.toTuple()->elements()) ivalue_locked(e, scalar, value_read);
  } else {
    add(hash_text(v.tagKind()));
  }
}

// A new result of a lowered op: pending, its value output `index` of `node`.
inline void result_locked(const at::Tensor& t, uint64_t node, uint64_t index) {
  if (on_xla(t)) write_locked(t, mix(node, index), true);
}

}  // namespace graph
}  // namespace mmgcu_sim
