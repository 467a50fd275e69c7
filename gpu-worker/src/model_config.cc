// The model repository file (TOML, through toml++) and the checks shared with --model.
// The only translation unit that includes toml++.
#include "ferry/worker/model_config.h"

#include <toml++/toml.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "padding.h"

namespace ferry::worker {
namespace {

// Reads the fields of one table, remembering where it is for messages and which keys it used.
class TableReader {
 public:
  TableReader(const toml::table& table, std::string source, std::string path)
      : table_(table), source_(std::move(source)), path_(std::move(path)) {}

  Status Error(const toml::node* node, const std::string& key, const std::string& what) const {
    const toml::source_region& at = node ? node->source() : table_.source();
    return Status::InvalidArgument(source_ + ":" + std::to_string(at.begin.line) + ": " + path_ +
                                   (key.empty() ? "" : "." + key) + ": " + what);
  }
  const toml::node* Get(const std::string& key) {
    used_.insert(key);
    return table_.get(key);
  }
  Status String(const std::string& key, std::string* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (!n->is_string()) return Error(n, key, "must be a string");
    *out = n->as_string()->get();
    return Status::Ok();
  }
  Status Int(const std::string& key, int64_t* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (!n->is_integer()) return Error(n, key, "must be an integer");
    *out = n->as_integer()->get();
    return Status::Ok();
  }
  Status Index(const std::string& key, size_t* out) {
    int64_t v = static_cast<int64_t>(*out);
    FERRY_RETURN_IF_ERROR(Int(key, &v));
    if (v < 0 || v >= 64) return Error(Get(key), key, "must be 0..63");
    *out = static_cast<size_t>(v);
    return Status::Ok();
  }
  Status Double(const std::string& key, double* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (n->is_integer())
      *out = static_cast<double>(n->as_integer()->get());
    else if (n->is_floating_point())
      *out = n->as_floating_point()->get();
    else
      return Error(n, key, "must be a number");
    return Status::Ok();
  }
  Status Bool(const std::string& key, bool* out) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (!n->is_boolean()) return Error(n, key, "must be true or false");
    *out = n->as_boolean()->get();
    return Status::Ok();
  }
  Status DType(const std::string& key, ferry::DType* out) {
    std::string name;
    FERRY_RETURN_IF_ERROR(String(key, &name));
    if (name.empty()) return Status::Ok();
    if (!ParseDType(name, out)) return Error(Get(key), key, "unknown dtype \"" + name + "\"");
    return Status::Ok();
  }
  // An array whose elements `each` reads.
  Status Array(const std::string& key,
               const std::function<Status(const toml::node&, size_t)>& each) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (!n->is_array()) return Error(n, key, "must be an array");
    const toml::array& a = *n->as_array();
    for (size_t i = 0; i < a.size(); ++i) FERRY_RETURN_IF_ERROR(each(a[i], i));
    return Status::Ok();
  }
  Status Ints(const std::string& key, std::vector<int64_t>* out) {
    if (!Get(key)) return Status::Ok();  // keeps the default
    out->clear();
    return Array(key, [&](const toml::node& e, size_t) {
      if (!e.is_integer()) return Error(&e, key, "must be an array of integers");
      out->push_back(e.as_integer()->get());
      return Status::Ok();
    });
  }
  Status Doubles(const std::string& key, std::vector<double>* out) {
    if (!Get(key)) return Status::Ok();
    out->clear();
    return Array(key, [&](const toml::node& e, size_t) {
      if (e.is_integer())
        out->push_back(static_cast<double>(e.as_integer()->get()));
      else if (e.is_floating_point())
        out->push_back(e.as_floating_point()->get());
      else
        return Error(&e, key, "must be an array of numbers");
      return Status::Ok();
    });
  }
  // A table (or an array of tables) given as a sub-reader.
  Status Tables(const std::string& key, bool allow_single,
                const std::function<Status(TableReader&)>& each) {
    const toml::node* n = Get(key);
    if (!n) return Status::Ok();
    if (allow_single && n->is_table()) {
      TableReader sub(*n->as_table(), source_, path_ + "." + key);
      FERRY_RETURN_IF_ERROR(each(sub));
      return sub.NoUnknownKeys();
    }
    if (!n->is_array()) return Error(n, key, allow_single ? "must be a table" : "must be an array");
    const toml::array& a = *n->as_array();
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_table()) return Error(&a[i], key, "must be an array of tables");
      TableReader sub(*a[i].as_table(), source_, path_ + "." + key + "[" + std::to_string(i) + "]");
      FERRY_RETURN_IF_ERROR(each(sub));
      FERRY_RETURN_IF_ERROR(sub.NoUnknownKeys());
    }
    return Status::Ok();
  }
  Status NoUnknownKeys() const {
    for (auto&& [k, v] : table_) {
      std::string key(k.str());
      if (!used_.count(key)) return Error(&v, key, "unknown key");
    }
    return Status::Ok();
  }

 private:
  const toml::table& table_;
  std::string source_;
  std::string path_;
  std::set<std::string> used_;
};

Status ReadSpec(TableReader& r, TensorSpec* spec) {
  std::string dtype = "float32";
  FERRY_RETURN_IF_ERROR(r.String("dtype", &dtype));
  if (!ParseDType(dtype, &spec->dtype))
    return r.Error(r.Get("dtype"), "dtype", "unknown dtype \"" + dtype + "\"");
  if (!r.Get("shape")) return r.Error(nullptr, "shape", "missing");
  return r.Ints("shape", &spec->shape);
}

Status ValidateInputSpec(const protocol::InputSpec& spec);

Status ReadInputSpec(TableReader& r, protocol::InputSpec* spec) {
  FERRY_RETURN_IF_ERROR(r.String("name", &spec->name));
  std::string dtype;
  FERRY_RETURN_IF_ERROR(r.String("dtype", &dtype));
  if (dtype.empty()) return r.Error(nullptr, "dtype", "missing");
  if (!ParseDType(dtype, &spec->dtype))
    return r.Error(r.Get("dtype"), "dtype", "unknown dtype \"" + dtype + "\"");
  if (!r.Get("shape")) return r.Error(nullptr, "shape", "missing");
  FERRY_RETURN_IF_ERROR(r.Ints("shape", &spec->shape));
  Status s = ValidateInputSpec(*spec);
  if (!s.ok()) return r.Error(r.Get("shape"), "", s.message());
  return Status::Ok();
}

Status ReadModel(TableReader& r, ModelConfig* m) {
  FERRY_RETURN_IF_ERROR(r.String("path", &m->path));
  if (m->path.empty()) return r.Error(nullptr, "path", "missing (the TorchScript file)");
  FERRY_RETURN_IF_ERROR(r.String("device", &m->device));
  FERRY_RETURN_IF_ERROR(r.Int("max_batch", &m->max_batch));
  // (0 means "not given: --max-batch" inside; written in the file it is a mistake.)
  if (r.Get("max_batch") != nullptr && (m->max_batch < 1 || m->max_batch > 65536))
    return r.Error(r.Get("max_batch"), "max_batch", "must be 1..65536");
  FERRY_RETURN_IF_ERROR(r.String("method", &m->method));
  FERRY_RETURN_IF_ERROR(r.Bool("half", &m->half));
  FERRY_RETURN_IF_ERROR(r.Bool("pinned", &m->pinned));
  FERRY_RETURN_IF_ERROR(r.Bool("copy_inputs", &m->copy_inputs));
  std::string load = "eager";
  FERRY_RETURN_IF_ERROR(r.String("load", &load));
  if (load == "eager")
    m->load = LoadPolicy::kEager;
  else if (load == "lazy")
    m->load = LoadPolicy::kLazy;
  else
    return r.Error(r.Get("load"), "load", "must be \"eager\" or \"lazy\"");

  if (r.Get("inputs")) {
    m->inputs.emplace();
    FERRY_RETURN_IF_ERROR(r.Tables("inputs", false, [&](TableReader& t) {
      protocol::InputSpec spec;
      FERRY_RETURN_IF_ERROR(ReadInputSpec(t, &spec));
      m->inputs->push_back(std::move(spec));
      return Status::Ok();
    }));
  }
  FERRY_RETURN_IF_ERROR(r.Tables("convert", false, [&](TableReader& c) {
    InputConversion conv;
    FERRY_RETURN_IF_ERROR(c.Index("input", &conv.input));
    FERRY_RETURN_IF_ERROR(c.DType("to", &conv.to));
    FERRY_RETURN_IF_ERROR(c.Double("scale", &conv.scale));
    FERRY_RETURN_IF_ERROR(c.Doubles("mean", &conv.mean));
    FERRY_RETURN_IF_ERROR(c.Doubles("std", &conv.std));
    FERRY_RETURN_IF_ERROR(c.Int("channel_dim", &conv.channel_dim));
    m->convert.push_back(std::move(conv));
    return Status::Ok();
  }));
  FERRY_RETURN_IF_ERROR(r.Tables("padding", true, [&](TableReader& p) {
    PaddingPolicy& pad = m->padding;
    std::vector<int64_t> inputs = {0};
    FERRY_RETURN_IF_ERROR(p.Ints("inputs", &inputs));
    for (int64_t i : inputs) {
      if (i < 0 || i >= 64) return p.Error(p.Get("inputs"), "inputs", "indices must be 0..63");
      pad.inputs.push_back(static_cast<size_t>(i));
    }
    if (pad.inputs.empty()) return p.Error(p.Get("inputs"), "inputs", "must not be empty");
    FERRY_RETURN_IF_ERROR(p.Int("dim", &pad.dim));
    FERRY_RETURN_IF_ERROR(p.Double("value", &pad.value));
    FERRY_RETURN_IF_ERROR(p.Ints("buckets", &pad.buckets));
    FERRY_RETURN_IF_ERROR(p.Bool("lengths", &pad.pass_lengths));
    return p.Tables("trim", false, [&](TableReader& t) {
      TrimRule rule;
      FERRY_RETURN_IF_ERROR(t.Index("output", &rule.output));
      FERRY_RETURN_IF_ERROR(t.Int("dim", &rule.dim));
      FERRY_RETURN_IF_ERROR(t.Double("ratio", &rule.ratio));
      pad.trim.push_back(rule);
      return Status::Ok();
    });
  }));
  FERRY_RETURN_IF_ERROR(r.Tables("warmup", true, [&](TableReader& w) {
    FERRY_RETURN_IF_ERROR(w.Tables("inputs", false, [&](TableReader& s) {
      TensorSpec spec;
      FERRY_RETURN_IF_ERROR(ReadSpec(s, &spec));
      m->warmup.inputs.push_back(std::move(spec));
      return Status::Ok();
    }));
    FERRY_RETURN_IF_ERROR(w.Ints("batch_sizes", &m->warmup.batch_sizes));
    return w.Int("iterations", &m->warmup.iterations);
  }));
  FERRY_RETURN_IF_ERROR(r.NoUnknownKeys());
  Status s = ValidateModelConfig(*m);
  if (!s.ok()) return r.Error(nullptr, "", s.message());
  return Status::Ok();
}

// One declared input: rank, dims and name (the broker applies the same bounds to READY).
Status ValidateInputSpec(const protocol::InputSpec& spec) {
  if (spec.shape.size() > protocol::kMaxTensorDims)
    return Status::InvalidArgument("an input has at most " +
                                   std::to_string(protocol::kMaxTensorDims) + " dims");
  for (int64_t d : spec.shape)
    if (d < -1) return Status::InvalidArgument("input shapes hold sizes >= 0, or -1 for any size");
  if (spec.name.size() > 64)
    return Status::InvalidArgument("an input name has at most 64 characters");
  for (char c : spec.name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return Status::InvalidArgument("input names are made of [A-Za-z0-9._-]");
  }
  return Status::Ok();
}

bool IsFloating(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16 ||
         d == DType::kFloat64;
}

}  // namespace

const char* LoadPolicyName(LoadPolicy load) { return load == LoadPolicy::kLazy ? "lazy" : "eager"; }

Status ValidateModelConfig(const ModelConfig& m) {
  if (m.name.empty() || m.name.size() > 128)
    return Status::InvalidArgument("name must be 1-128 characters");
  if (m.path.empty()) return Status::InvalidArgument("path must not be empty");
  if (m.max_batch < 0 || m.max_batch > 65536)
    return Status::InvalidArgument("max_batch must be 1..65536");
  if (m.method.empty()) return Status::InvalidArgument("method must not be empty");
  std::set<size_t> converted;
  for (const auto& c : m.convert) {
    if (!converted.insert(c.input).second)
      return Status::InvalidArgument("input " + std::to_string(c.input) + " converted twice");
    const bool arithmetic = c.scale != 1.0 || !c.mean.empty() || !c.std.empty();
    if (arithmetic && !IsFloating(c.to))
      return Status::InvalidArgument("convert: scale/mean/std need a floating \"to\" dtype");
    if (c.mean.size() != c.std.size())
      return Status::InvalidArgument("convert: mean and std must have the same length");
    for (double s : c.std)
      if (s == 0.0) return Status::InvalidArgument("convert: std must not contain 0");
    if (!std::isfinite(c.scale)) return Status::InvalidArgument("convert: scale must be finite");
  }
  const PaddingPolicy& p = m.padding;
  for (size_t i = 1; i < p.buckets.size(); ++i)
    if (p.buckets[i] <= p.buckets[i - 1])
      return Status::InvalidArgument("padding.buckets must be strictly ascending");
  if (!p.buckets.empty() && p.buckets.front() <= 0)
    return Status::InvalidArgument("padding.buckets must be > 0");
  if (!p.enabled() && (p.pass_lengths || !p.trim.empty() || !p.buckets.empty()))
    return Status::InvalidArgument("padding needs \"inputs\"");
  for (const auto& t : p.trim)
    if (!(t.ratio > 0.0) || !std::isfinite(t.ratio))
      return Status::InvalidArgument("padding.trim.ratio must be > 0");
  for (const auto& s : m.warmup.inputs)
    for (int64_t d : s.shape)
      if (d < 0) return Status::InvalidArgument("warmup shapes must be >= 0");
  for (int64_t b : m.warmup.batch_sizes)
    if (b < 1 || b > 65536) return Status::InvalidArgument("warmup.batch_sizes must be 1..65536");
  if (m.warmup.iterations < 0 || m.warmup.iterations > 1000)
    return Status::InvalidArgument("warmup.iterations must be 0..1000");
  if (m.inputs) {
    const auto& in = *m.inputs;
    if (in.size() > protocol::kMaxInputsPerJob)
      return Status::InvalidArgument("at most " + std::to_string(protocol::kMaxInputsPerJob) +
                                     " inputs");
    for (const auto& spec : in) FERRY_RETURN_IF_ERROR(ValidateInputSpec(spec));
    for (const auto& c : m.convert)
      if (c.input >= in.size())
        return Status::InvalidArgument("convert names input " + std::to_string(c.input) +
                                       "; inputs declares " + std::to_string(in.size()));
    for (size_t k : p.inputs) {
      if (k >= in.size())
        return Status::InvalidArgument("padding names input " + std::to_string(k) +
                                       "; inputs declares " + std::to_string(in.size()));
      // Checked here, not at the first batch: there every job would fail model_error, each
      // batch first split down to single jobs; and a fraction would be cut to an integer.
      std::string range;
      if (!Padding::ValueFits(in[k].dtype, p.value, &range))
        return Status::InvalidArgument("padding.value " + std::to_string(p.value) +
                                       " does not fit input " + std::to_string(k) + " (" +
                                       DTypeName(in[k].dtype) + "): want " + range);
    }
    const auto& w = m.warmup.inputs;
    if (!w.empty() && w.size() != in.size())
      return Status::InvalidArgument("warmup feeds " + std::to_string(w.size()) +
                                     " inputs; inputs declares " + std::to_string(in.size()));
    for (size_t k = 0; k < w.size(); ++k) {
      if (w[k].dtype != in[k].dtype || w[k].shape.size() != in[k].shape.size())
        return Status::InvalidArgument("warmup input " + std::to_string(k) +
                                       " differs from inputs[" + std::to_string(k) +
                                       "] in dtype or rank");
    }
  }
  return Status::Ok();
}

Status ParseModelRepositoryText(std::string_view text, const std::string& source,
                                std::vector<ModelConfig>* out) {
  out->clear();
  toml::table root;
#if TOML_EXCEPTIONS
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    return Status::InvalidArgument(source + ":" + std::to_string(e.source().begin.line) + ": " +
                                   std::string(e.description()));
  }
#else
  toml::parse_result parsed = toml::parse(text, source);
  if (!parsed) {
    return Status::InvalidArgument(source + ":" +
                                   std::to_string(parsed.error().source().begin.line) + ": " +
                                   std::string(parsed.error().description()));
  }
  root = std::move(parsed).table();
#endif
  TableReader top(root, source, "(top level)");
  const toml::node* models = top.Get("models");
  FERRY_RETURN_IF_ERROR(top.NoUnknownKeys());
  if (!models || !models->is_table() || models->as_table()->empty())
    return top.Error(models, "models", "the file needs at least one [models.NAME] table");
  for (auto&& [key, node] : *models->as_table()) {
    ModelConfig m;
    m.name = std::string(key.str());
    if (!node.is_table())
      return TableReader(root, source, "models").Error(&node, m.name, "must be a table");
    TableReader r(*node.as_table(), source, "models." + m.name);
    FERRY_RETURN_IF_ERROR(ReadModel(r, &m));
    out->push_back(std::move(m));
  }
  return Status::Ok();
}

Status ParseModelRepository(const std::string& path, std::vector<ModelConfig>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument("cannot read model repository " + path);
  std::stringstream text;
  text << in.rdbuf();
  return ParseModelRepositoryText(text.str(), path, out);
}

Status ParseByteSize(std::string_view text, int64_t* out) {
  std::string s(text);
  const Status bad =
      Status::InvalidArgument("bad byte size \"" + s + "\" (e.g. 2G, 512M, 1048576)");
  if (s.empty()) return bad;
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(s, &end);
  } catch (const std::exception&) {
    return bad;
  }
  std::string unit = s.substr(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && (unit.substr(1) == "B" || unit.substr(1) == "IB")) unit.resize(1);
  if (unit == "B") unit.clear();
  static const std::map<std::string, double> kUnits = {{"", 1.0},
                                                       {"K", 1024.0},
                                                       {"M", 1024.0 * 1024},
                                                       {"G", 1024.0 * 1024 * 1024},
                                                       {"T", 1024.0 * 1024 * 1024 * 1024}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end() || !(value >= 0) || !std::isfinite(value)) return bad;
  const double bytes = value * it->second;
  if (bytes > 9.0e18) return bad;
  *out = static_cast<int64_t>(bytes);
  return Status::Ok();
}

}  // namespace ferry::worker
