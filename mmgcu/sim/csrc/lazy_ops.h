// How each op on a simulated XLA card enters the lazy graph (see lazy_graph.h): lowered
// into the pending IR, or run on the CPU after a cut, as torch_xla's aten_xla_type.cpp
// decides per op and per call.
//
// Which ops are lowered comes from torch_xla's op lists (xla_native_functions.yaml, given
// by mmgcu.sim.xla_ops at install); the calls that fall back although the op is listed are
// the conditions in aten_xla_type.cpp, for two profiles:
//   - t20 (the default): torch_xla 1.10, the generation torch_gcu 1.x forks. Its TPU-only
//     lowerings (upsample_bilinear2d and upsample_nearest2d, forward and backward: "Only the
//     XLA TPU backend for now implements the CustomCall required by our XLA lowering") are
//     ASSUMED lowered on a T20: the check names TPU's custom call, and torch_gcu compiles
//     for Enflame's own backend, whose source is not public;
//   - xla-cpu: torch_xla 2.9 on a CPU device (PJRT_DEVICE=CPU), what the conformance suite
//     runs for real: there those two backward passes fall back.
#pragma once

#include "lazy_graph.h"

#include <functional>

namespace mmgcu_sim {
namespace graph {

#if TORCH_VERSION_MAJOR >= 2
inline const c10::AliasInfo* alias_info(const c10::Argument& a) { return a.alias_info(); }
#else  // torch 1.10: Argument::alias_info() is an optional, not a pointer
inline const c10::AliasInfo* alias_info(const c10::Argument& a) {
  const auto& info = a.alias_info();
  return info.has_value() ? &*info : nullptr;
}
#endif

inline bool is_written(const c10::Argument& a) {
  const auto* info = alias_info(a);
  return info != nullptr && info->isWrite();
}

// A Scalar argument (Scalar or Scalar?): 0 and +-1 are constants, other values data.
inline bool is_scalar_argument(const c10::Argument& a) {
  auto type = a.type();
  if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
  return type->kind() == c10::TypeKind::NumberType;
}

// Ops that draw random numbers on the card: they take a seed from its chain (lazy_graph.h).
inline bool draws_random(const std::string& base, const c10::FunctionSchema& schema) {
  static const std::unordered_set<std::string> ops = {
      "native_dropout", "dropout", "feature_dropout", "alpha_dropout", "rrelu_with_noise",
      "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like"};
  if (ops.count(base) > 0) return true;
  for (const auto& a : schema.arguments()) {
    auto type = a.type();
    if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
    if (type->kind() == c10::TypeKind::GeneratorType) return true;
  }
  return false;
}

// In-place ops whose result does not depend on the value they overwrite.
inline bool overwrites(const std::string& base) {
  static const std::unordered_set<std::string> ops = {
      "zero",    "fill",   "copy",   "uniform",   "normal",     "random",
      "bernoulli", "exponential", "geometric", "cauchy", "log_normal"};
  return ops.count(base) > 0;
}

// ---------------------------------------------------------------------------- profiles
enum Profile { kT20 = 0, kXlaCpu = 1 };

struct Config {
  int profile = kT20;
};
inline Config& config() {
  static Config c;
  return c;
}

inline void for_each_tensor(const c10::IValue& v, const std::function<void(const at::Tensor&)>& fn) {
  if (v.isTensor()) {
    fn(v.toTensor());
  } else if (v.isTensorList()) {
    for (const auto& t : v.toTensorVector()) fn(t);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) {
      if (e.isTensor()) fn(e.toTensor());
    }
  }
}

inline const at::Tensor* tensor_at(const std::vector<c10::IValue>& g, size_t i) {
  return i < g.size() && g[i].isTensor() ? &g[i].toTensor() : nullptr;
}

inline std::vector<int64_t> ints_at(const std::vector<c10::IValue>& g, size_t i) {
  if (i < g.size() && g[i].isIntList()) return g[i].toIntVector();
  return {};
}

inline bool bool_at(const std::vector<c10::IValue>& g, size_t i) {
  return i < g.size() && g[i].isBool() && g[i].toBool();
}

inline double number_at(const std::vector<c10::IValue>& g, size_t i, double otherwise) {
  if (i < g.size() && (g[i].isDouble() || g[i].isInt() || g[i].isBool())) {
    return g[i].toScalar().toDouble();
  }
  return otherwise;
}

// torch_xla's IsSupportedAdaptivePool (pooling.cpp): each spatial side divisible by the
// output's.
inline bool adaptive_pool_supported(at::IntArrayRef input, at::IntArrayRef output) {
  const size_t n = output.size();
  if (n == 0 || input.size() < n) return true;
  for (size_t d = 0; d < n; ++d) {
    const auto out = output[d];
    if (out == 0 || input[input.size() - n + d] % out != 0) return false;
  }
  return true;
}

inline bool any_not_one(const std::vector<int64_t>& values) {
  return std::any_of(values.begin(), values.end(), [](int64_t v) { return v != 1; });
}

inline bool is_long(const at::Tensor* self, const std::vector<c10::IValue>& g, size_t dtype_at) {
  if (dtype_at < g.size() && g[dtype_at].isInt()) {
    return static_cast<at::ScalarType>(g[dtype_at].toInt()) == at::kLong;
  }
  return self != nullptr && self->scalar_type() == at::kLong;
}

inline bool has_generator(const std::vector<c10::IValue>& g) {
  return std::any_of(g.begin(), g.end(), [](const c10::IValue& v) { return v.isGenerator(); });
}

// Whether this call of a listed op falls back (aten_xla_type.cpp's call_fallback_fn paths).
inline bool conditional_fallback(const std::string& base, const std::vector<c10::IValue>& g) {
  const bool t20 = config().profile == kT20;
  const auto* self = tensor_at(g, 0);
  if (base == "_adaptive_avg_pool2d" || base == "_adaptive_avg_pool3d" ||
      base == "adaptive_max_pool2d") {
    return self && !adaptive_pool_supported(self->sizes(), ints_at(g, 1));
  }
  if (base == "_adaptive_avg_pool2d_backward" || base == "_adaptive_avg_pool3d_backward" ||
      base == "adaptive_max_pool2d_backward") {
    const auto* input = tensor_at(g, 1);
    if (!self || !input) return false;
    const size_t n = base.find("3d") != std::string::npos ? 3 : 2;
    const auto sizes = self->sizes();
    if (sizes.size() < n) return false;
    return !adaptive_pool_supported(input->sizes(), sizes.slice(sizes.size() - n));
  }
  if (base == "avg_pool2d" || base == "avg_pool3d") {  // 1.10 only; 2.9 lowers the forward
    return t20 && ((bool_at(g, 4) && bool_at(g, 5)) || (g.size() > 6 && !g[6].isNone()));
  }
  if (base == "avg_pool2d_backward" || base == "avg_pool3d_backward") {
    return (bool_at(g, 5) && bool_at(g, 6)) || (g.size() > 7 && !g[7].isNone());
  }
  if (base == "max_pool2d_with_indices" || base == "max_pool3d_with_indices") {
    return any_not_one(ints_at(g, 4));
  }
  if (base == "max_pool2d_with_indices_backward" || base == "max_pool3d_with_indices_backward") {
    return any_not_one(ints_at(g, 5));
  }
  if (base == "addmm") {
    const bool scaled = number_at(g, 3, 1.0) != 1.0 || number_at(g, 4, 1.0) != 1.0;
    return scaled || (t20 && self && !self->is_floating_point());
  }
  if (t20 && (base == "mm" || base == "bmm" || base == "mv" || base == "dot" || base == "baddbmm")) {
    return self && !self->is_floating_point();
  }
  if (base == "bernoulli" || base == "normal" || base == "uniform" || base == "random" ||
      base == "exponential" || base == "multinomial" || base == "rrelu_with_noise") {
    return has_generator(g);
  }
  if (base == "cumprod" || (t20 && base == "cumsum")) return is_long(self, g, 2);
  if (base == "norm") return g.size() > 1 && !g[1].isNone() && number_at(g, 1, 2.0) == 0.0;
  if (t20 && base == "pow") {
    if (g.size() > 0 && !g[0].isTensor()) return !g[0].toScalar().isFloatingPoint();
    return self && !self->is_floating_point();
  }
  if (base == "scatter") {
    for (const auto& v : g) {
      if (v.isString() && v.toStringRef() != "add") return true;
    }
    return false;
  }
  if (!t20 && (base == "upsample_bilinear2d_backward" || base == "upsample_nearest2d_backward")) {
    return true;  // torch_xla on a CPU device: TPU (and Neuron) only
  }
  return false;
}

// Boolean or byte tensors among an index op's indices: torch_xla turns each into indices
// with nonzero, which falls back.
inline std::vector<at::Tensor> mask_indices(const std::string& base,
                                            const std::vector<c10::IValue>& g) {
  std::vector<at::Tensor> masks;
  if (base != "index" && base != "index_put" && base != "_index_put_impl") return masks;
  if (g.size() < 2) return masks;
  for_each_tensor(g[1], [&](const at::Tensor& t) {
    if (t.defined() && (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte)) {
      masks.push_back(t);
    }
  });
  return masks;
}

inline int kind_of(const std::string& base, const std::vector<c10::IValue>& g) {
  // Data-dependent output shapes: falls back unless XLA_EXPERIMENTAL names them.
  if (base == "nonzero" || base == "masked_select") return kFallsBack;
  bool listed;
  {
    std::lock_guard<std::mutex> lock(S().mu);
    listed = !S().configured || S().lowered.count(base) > 0;
  }
  if (!listed || conditional_fallback(base, g)) return kFallsBack;
  if (!mask_indices(base, g).empty()) return kMaskIndex;
  return kLowered;
}

// ---------------------------------------------------------------------------- one op
struct OpRun {
  bool lazy = false;      // an op on an XLA card
  bool fallback = false;  // it ran on the CPU after a cut
  bool zero_index = false;  // an index whose empty result is a constant (torch_xla 2.9)
  uint64_t node = 0;
  std::vector<const CardBlock*> inputs;  // its card inputs' storages: results in them are views
};

inline std::string base_name(const std::string& name) {
  std::string base = name.rfind("aten::", 0) == 0 ? name.substr(6) : name;
  if (!base.empty() && base.back() == '_') base.pop_back();
  return base;
}

// An op that runs on the CPU (torch_xla's fallback, which .item() is too): its inputs' graph
// runs, and they keep their IR.
inline void note_fallback(const std::string& what, const std::vector<at::Tensor>& inputs,
                          int cause = kFallback) {
  cut_for(inputs, cause, what, false);
  count_fallback(what);
}

// Before the op runs: a fallback's cut, or the hash of the node it adds to the graph.
inline OpRun before_op(const c10::OperatorHandle& op, const std::vector<c10::IValue>& given,
                       c10::Device card) {
  OpRun run;
  if (card.type() != c10::DeviceType::XLA || !S().enabled) return run;
  run.lazy = true;
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const std::string name = schema.name();
  const std::string base = base_name(name);
  const int kind = kind_of(base, given);
  std::vector<at::Tensor> inputs;
  for (const auto& v : given) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (on_xla(t)) inputs.push_back(t);
    });
  }
  if (kind == kFallsBack) {
    run.fallback = true;
    note_fallback(name, inputs);
  } else if (kind == kMaskIndex) {
    for (const auto& mask : mask_indices(base, given)) note_fallback("aten::nonzero", {mask});
  }
  std::lock_guard<std::mutex> lock(S().mu);
  for (const auto& t : inputs) run.inputs.push_back(block_of(t));
  if (run.fallback) return run;
  // torch_xla >= 2.4 (pytorch/xla#7113, ops/index_ops.cpp IndexByTensors): indexing by an
  // index with no element returns full(shape, 0), a constant of the graph that reads none
  // of the inputs; torch_xla 1.10 gathers as for any index.
  run.zero_index = base == "index" && config().profile == kXlaCpu;
  Node n(name + "." + schema.overload_name());
  const bool overwrite = overwrites(base);
  for (size_t i = 0; i < args.size() && i < given.size(); ++i) {
    const bool written = is_written(args[i]);
    // an out= argument, or what a fill overwrites, is not read: only its shape counts
    const bool read = !(written && (args[i].kwarg_only() || overwrite));
    n.ivalue_locked(given[i], is_scalar_argument(args[i]), read);
  }
  if (draws_random(base, schema)) n.add(next_seed_locked(card.index()));
  run.node = n.hash;
  return run;
}

// After it ran: what it wrote and made holds the node's outputs (a fallback's: data).
inline void after_op(const OpRun& run, const c10::OperatorHandle& op,
                     const std::vector<c10::IValue>& given, const torch::jit::Stack& stack) {
  if (!run.lazy) return;
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const auto& rets = schema.returns();
  std::lock_guard<std::mutex> lock(S().mu);
  auto assign = [&](const at::Tensor& t, uint64_t index) {
    if (!on_xla(t)) return;
    if (run.fallback) {
      const CardBlock* b = block_of(t);
      write_locked(t, b ? leaf(b) : kData, false);
    } else if (run.zero_index && t.numel() == 0) {
      write_locked(t, mix(kZeroFull, geometry(t)), true);
    } else {
      result_locked(t, run.node, index);
    }
  };
  for (size_t i = 0; i < args.size() && i < given.size(); ++i) {
    if (!is_written(args[i])) continue;
    uint64_t k = 0;
    for_each_tensor(given[i], [&](const at::Tensor& t) { assign(t, 0x10000 + i * 0x100 + k++); });
  }
  if (stack.size() < rets.size()) return;
  const size_t first = stack.size() - rets.size();
  for (size_t r = 0; r < rets.size(); ++r) {
    uint64_t k = 0;
    for_each_tensor(stack[first + r], [&](const at::Tensor& t) {
      const CardBlock* b = block_of(t);
      const bool known =
          std::find(run.inputs.begin(), run.inputs.end(), b) != run.inputs.end();
      if (!known) assign(t, r * 0x100 + k);
      k++;
    });
  }
}

// ---------------------------------------------------------------------------- kernels
// The node of a lowered op that one of the native kernels runs (convolution, the grad
// scaler's): its tensor operands' values and the attributes given.
struct KernelNode {
  Node node;
  bool lazy;
  explicit KernelNode(const char* op, const at::Tensor& on) : node(op), lazy(on_xla(on)) {}
  KernelNode& tensor(const at::Tensor& t) {
    if (lazy) {
      std::lock_guard<std::mutex> lock(S().mu);
      node.tensor_locked(t);
    }
    return *this;
  }
  KernelNode& ints(at::IntArrayRef values) {
    for (auto v : values) node.add(mix(0x1, static_cast<uint64_t>(v)));
    node.add(values.size());
    return *this;
  }
  KernelNode& number(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    node.add(bits);
    return *this;
  }
  // `t` holds output `index` of the node (written in place: the same).
  void output(const at::Tensor& t, uint64_t index) {
    if (!lazy || !t.defined()) return;
    std::lock_guard<std::mutex> lock(S().mu);
    result_locked(t, node.hash, index);
  }
};

// A new card tensor from a factory: torch_xla's empty is a pending constant.
inline void fresh(const at::Tensor& t) {
  if (!on_xla(t)) return;
  std::lock_guard<std::mutex> lock(S().mu);
  write_locked(t, mix(kEmpty, geometry(t)), true);
}

// A copy into `dst` from `src` (_copy_from): a read when it leaves the card, device data when
// it arrives from the host, the source's value within one card. A 0-dim host tensor holding
// 0 or +-1 arrives as a constant of the graph, pending like any IR (torch_xla's
// GetIrValueForTensor: a BatchNorm's num_batches_tracked is one until a step outputs it).
inline void copy(const at::Tensor& src, const at::Tensor& dst) {
  const bool from_xla = on_xla(src);
  const bool to_xla = on_xla(dst);
  if (from_xla && (!to_xla || src.device() != dst.device())) host_read(src, ".cpu()");
  if (!to_xla) return;
  std::lock_guard<std::mutex> lock(S().mu);
  if (from_xla && src.device() == dst.device()) {
    write_locked(dst, mix(hash_text("aten::copy_"), value_of_locked(src)),
                 is_pending_locked(src));
    return;
  }
  const CardBlock* b = block_of(dst);
  uint64_t value = b ? leaf(b) : kData;
  const bool constant = src.is_cpu() && src.dim() == 0 && is_special(src.item());
  if (constant) value = mix(scalar_value(src.item()), static_cast<uint64_t>(src.scalar_type()));
  write_locked(dst, value, constant);
}

// A storage that resize_ gave new memory: a new value of the old one.
inline void resized(const at::Tensor& t, uint64_t before) {
  if (!on_xla(t)) return;
  std::lock_guard<std::mutex> lock(S().mu);
  write_locked(t, mix(mix(hash_text("aten::resize_"), before), geometry(t)), true);
}

inline uint64_t storage_value(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(S().mu);
  const CardBlock* b = block_of(t);
  return b ? b->value : 0;
}

// A collective of the simulated ECCL (torch_gcu.distributed) on card tensors: an op of the
// graph, as torch_xla's all_reduce is (ASSUMED for ECCL: the 1.x source shows its Python
// layer only; torch_gcu's DDP reduces gradients through it inside the step).
inline void collective(const std::string& name, const std::vector<at::Tensor>& inputs,
                       const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(S().mu);
  Node n("eccl::" + name);
  for (const auto& t : inputs) {
    if (on_xla(t)) n.tensor_locked(t);
  }
  uint64_t k = 0;
  for (const auto& t : outputs) result_locked(t, n.hash, k++);
}

}  // namespace graph
}  // namespace mmgcu_sim
