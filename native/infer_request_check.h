// Checks the gRPC front makes of a ModelInferRequest (a ModelInfer call, and each message of a ModelStreamInfer
// stream) before Triton sees it. Pure: bytes, a parsed message and a description of the model in, a refusal naming
// the field and the reason (or nothing) out; no gRPC, no Triton, no allocation that grows with the input before the
// counts are bounded. Three steps, in the order the front takes them:
//
//   std::string CountRefusal(const char* data, size_t size, const Limits&)          the wire bytes, before parsing
//   std::string RequestRefusal(const inference::ModelInferRequest&, const Limits&)  the parsed message, any model
//   std::string ModelRefusal(const inference::ModelInferRequest&, const ModelDescription&)   against the model
//
// An empty string: nothing refused. CountRefusal reads tags and lengths only, so that a message of a million inputs
// or of 16 M packed dims is refused at the cost of one pass over its tags, before protobuf builds it: it never decides
// what a message means, and bytes it cannot read are left to protobuf (the one parser), which refuses them.
//
// What is refused, and why here rather than by Triton: Triton 2.51 refuses most of these itself, but a stream's
// refused request goes through its stream handler's error path, and a classification of a BYTES output ends the
// process with SIGFPE; counts and sizes bound the work the front and Triton do for one message.
//
// Request parameters: Triton's own (sequence_id, sequence_start, sequence_end, priority, timeout,
// triton_enable_empty_final_response) must have the type Triton reads; other keys starting `triton_` are refused, as
// Triton refuses them; of the other keys only those a served model reads (Limits::custom_parameters: risk_router
// reads `route`) are passed on, as the HTTP front does: any other is refused naming it, since no model would read it
// and its sender expects it to do something. A custom one must hold an int64, bool, string or double (what Triton
// can pass on), and its key and string are bounded. Output parameters reach no model: only Triton's (classification, binary_data,
// shared_memory_region, shared_memory_offset, shared_memory_byte_size) are taken.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grpc_service.pb.h"
#include "model_config.pb.h"

namespace infer_check {

struct Limits {
  size_t max_tensors = 256;                // inputs, requested outputs, raw contents: each
  size_t max_parameters = 64;              // of the request, and of each input and output
  size_t max_rank = 32;                    // dims of one shape
  size_t max_contents_entries = 1 << 20;   // fields in one message's typed contents (each a protobuf object)
  size_t max_key_bytes = 256;              // a parameter's key
  size_t max_string_parameter_bytes = 64 << 10;
  // Request parameters of no protocol that the served models read: the only custom ones passed on.
  std::vector<std::string> custom_parameters;
};

// A model's tensors as its configuration (Triton's ModelConfig) declares them.
struct TensorSpec {
  std::string name;
  std::string datatype;  // as the protocol spells it: FP32, BYTES...
  std::vector<int64_t> dims;  // without the batch dimension; -1: any size
  bool ragged = false;  // allow_ragged_batch: the request's shape is not checked against dims
};

struct ModelDescription {
  std::string name;
  int64_t max_batch_size = 0;  // > 0: every input's shape starts with the batch dimension
  std::vector<TensorSpec> inputs, outputs;
};

namespace detail {

// Tags and lengths of protobuf's wire format. Reads more than protobuf accepts (varints of up to ten bytes
// anywhere): a message this cannot read, protobuf cannot either.
class Wire {
 public:
  Wire(const char* data, size_t size)
      : p_(reinterpret_cast<const uint8_t*>(data)), end_(p_ + size) {}
  bool Done() const { return p_ == end_; }
  bool Varint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 70 && p_ < end_; shift += 7) {
      uint8_t byte = *p_++;
      if (shift < 64) result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) {
        *value = result;
        return true;
      }
    }
    return false;
  }
  // The field's number and wire type; its value is left to Skip or Bytes.
  bool Tag(uint64_t* field, uint32_t* type) {
    uint64_t tag;
    if (!Varint(&tag)) return false;
    *field = tag >> 3;
    *type = static_cast<uint32_t>(tag & 7);
    return true;
  }
  bool Bytes(std::string_view* out) {
    uint64_t size;
    if (!Varint(&size) || size > static_cast<uint64_t>(end_ - p_)) return false;
    *out = std::string_view(reinterpret_cast<const char*>(p_), size);
    p_ += size;
    return true;
  }
  // A field's value of wire type `type` (not a group's end); false where it cannot be read.
  bool Skip(uint32_t type, int depth = 0) {
    uint64_t ignored;
    std::string_view bytes;
    switch (type) {
      case 0: return Varint(&ignored);
      case 1: return Advance(8);
      case 2: return Bytes(&bytes);
      case 5: return Advance(4);
      case 3: {  // a group: fields up to its end tag
        if (depth > 64) return false;
        uint64_t field;
        uint32_t inner;
        while (Tag(&field, &inner)) {
          if (inner == 4) return true;
          if (!Skip(inner, depth + 1)) return false;
        }
        return false;
      }
      default: return false;
    }
  }

 private:
  bool Advance(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) return false;
    p_ += n;
    return true;
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

// Varints in a packed field: one per byte without its high bit.
inline size_t PackedCount(std::string_view packed) {
  size_t count = 0;
  for (char c : packed) count += (static_cast<uint8_t>(c) & 0x80) == 0;
  return count;
}

inline std::string TooMany(const std::string& field, size_t count, size_t limit) {
  return field + ": " + std::to_string(count) + " given, at most " + std::to_string(limit) + " taken";
}

inline std::string Quoted(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 64)) out += (static_cast<uint8_t>(c) >= 0x20 && c != 0x7f) ? c : '?';
  return out + (s.size() > 64 ? "...'" : "'");
}

inline bool KnownDatatype(const std::string& datatype) {
  static const char* const kDatatypes[] = {"BOOL",  "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                           "INT32", "INT64", "FP16",   "FP32",   "FP64",   "BYTES", "BF16"};
  for (const char* known : kDatatypes)
    if (datatype == known) return true;
  return false;
}

inline const char* ChoiceName(const inference::InferParameter& value) {
  switch (value.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam: return "bool_param";
    case inference::InferParameter::kInt64Param: return "int64_param";
    case inference::InferParameter::kStringParam: return "string_param";
    case inference::InferParameter::kDoubleParam: return "double_param";
    case inference::InferParameter::kUint64Param: return "uint64_param";
    default: return "no value";
  }
}

inline std::string WrongType(const std::string& field, const inference::InferParameter& value, const char* wanted) {
  return field + ": expected " + wanted + ", got " + ChoiceName(value);
}

inline std::string RequestParameterRefusal(const std::string& key, const inference::InferParameter& value,
                                           const Limits& limits) {
  using P = inference::InferParameter;
  // Built only for a refusal: an accepted parameter (every risk_router request's `route`) costs no string.
  const auto field = [&key] { return "parameters[" + Quoted(key) + "]"; };
  const auto choice = value.parameter_choice_case();
  if (key.empty() || key.size() > limits.max_key_bytes)
    return field() + ": a key of 1 to " + std::to_string(limits.max_key_bytes) + " bytes is taken";
  if (key == "sequence_id")
    return choice == P::kInt64Param || choice == P::kStringParam ? ""
                                                                 : WrongType(field(), value, "int64_param or string_param");
  if (key == "sequence_start" || key == "sequence_end" || key == "triton_enable_empty_final_response")
    return choice == P::kBoolParam ? "" : WrongType(field(), value, "bool_param");
  if (key == "priority") {
    if (choice == P::kInt64Param) return value.int64_param() < 0 ? field() + ": expected a value >= 0" : "";
    return choice == P::kUint64Param ? "" : WrongType(field(), value, "int64_param or uint64_param");
  }
  if (key == "timeout") {
    if (choice != P::kInt64Param) return WrongType(field(), value, "int64_param");
    return value.int64_param() < 0 ? field() + ": expected microseconds >= 0" : "";
  }
  if (key.rfind("triton_", 0) == 0)
    return field() + ": keys starting with 'triton_' are Triton's own, and it takes only "
                   "'triton_enable_empty_final_response'";
  if (std::find(limits.custom_parameters.begin(), limits.custom_parameters.end(), key) ==
      limits.custom_parameters.end()) {
    std::string names;
    for (const std::string& name : limits.custom_parameters) names += (names.empty() ? "" : ", ") + name;
    return field() + ": not a parameter of the protocol nor one the served models read (" +
           (names.empty() ? std::string("none") : names) + ")";
  }
  if (choice == P::kStringParam && value.string_param().size() > limits.max_string_parameter_bytes)
    return field() + ": a string of at most " + std::to_string(limits.max_string_parameter_bytes) + " bytes is taken";
  if (choice == P::kInt64Param || choice == P::kBoolParam || choice == P::kStringParam || choice == P::kDoubleParam)
    return "";
  return WrongType(field(), value, "int64_param, bool_param, string_param or double_param");
}

inline std::string OutputParameterRefusal(const std::string& field, const std::string& key,
                                          const inference::InferParameter& value) {
  using P = inference::InferParameter;
  const auto choice = value.parameter_choice_case();
  if (key == "classification") {
    if (choice != P::kInt64Param) return WrongType(field, value, "int64_param");
    return value.int64_param() <= 0 ? field + ": expected a count of classes > 0" : "";
  }
  if (key == "binary_data") return choice == P::kBoolParam ? "" : WrongType(field, value, "bool_param");
  if (key == "shared_memory_region") return choice == P::kStringParam ? "" : WrongType(field, value, "string_param");
  if (key == "shared_memory_offset" || key == "shared_memory_byte_size") {
    if (choice != P::kInt64Param) return WrongType(field, value, "int64_param");
    return value.int64_param() < 0 ? field + ": expected a value >= 0" : "";
  }
  return field + ": not a parameter of a requested output (classification, binary_data, shared_memory_region, "
                 "shared_memory_offset, shared_memory_byte_size)";
}

inline std::string DimsString(const int64_t* dims, size_t count) {
  std::string out = "[";
  for (size_t i = 0; i < count; ++i) out += (i ? "," : "") + std::to_string(dims[i]);
  return out + "]";
}

}  // namespace detail

// Counts of what a message holds, from its tags: refused past `limits` before it is parsed.
inline std::string CountRefusal(const char* data, size_t size, const Limits& limits) {
  using detail::Wire;
  Wire message(data, size);
  size_t inputs = 0, outputs = 0, raw = 0, parameters = 0;
  uint64_t field;
  uint32_t type;
  std::string_view part;
  while (!message.Done()) {
    if (!message.Tag(&field, &type)) return "";  // protobuf's to refuse
    if (type != 2 || field < 4 || field > 7) {
      if (!message.Skip(type)) return "";
      continue;
    }
    if (!message.Bytes(&part)) return "";
    if (field == 4 && ++parameters > limits.max_parameters)
      return detail::TooMany("parameters", parameters, limits.max_parameters) + " (more follow)";
    if (field == 7 && ++raw > limits.max_tensors)
      return detail::TooMany("raw_input_contents", raw, limits.max_tensors) + " (more follow)";
    if (field == 6 && ++outputs > limits.max_tensors)
      return detail::TooMany("outputs", outputs, limits.max_tensors) + " (more follow)";
    if (field == 5 && ++inputs > limits.max_tensors)
      return detail::TooMany("inputs", inputs, limits.max_tensors) + " (more follow)";
    if (field != 5 && field != 6) continue;
    // An input {name 1, datatype 2, shape 3, parameters 4, contents 5}, an output {name 1, parameters 2}.
    const std::string tensor = (field == 5 ? "inputs[" + std::to_string(inputs - 1)
                                           : "outputs[" + std::to_string(outputs - 1)) + "]";
    const uint64_t parameters_field = field == 5 ? 4 : 2;
    Wire inner(part.data(), part.size());
    size_t dims = 0, tensor_parameters = 0, entries = 0;
    std::string_view value;
    while (!inner.Done()) {
      uint64_t f;
      uint32_t t;
      if (!inner.Tag(&f, &t)) return "";
      if (field == 5 && f == 3) {
        uint64_t dim;
        if (t == 0 && !inner.Varint(&dim)) return "";
        if (t == 2 && !inner.Bytes(&value)) return "";
        if (t != 0 && t != 2 && !inner.Skip(t)) return "";
        dims += t == 0 ? 1 : t == 2 ? detail::PackedCount(value) : 0;
        if (dims > limits.max_rank) return detail::TooMany(tensor + ".shape", dims, limits.max_rank) + " (more follow)";
        continue;
      }
      if (f == parameters_field && t == 2 && ++tensor_parameters > limits.max_parameters)
        return detail::TooMany(tensor + ".parameters", tensor_parameters, limits.max_parameters) + " (more follow)";
      if (field == 5 && f == 5 && t == 2) {
        if (!inner.Bytes(&value)) return "";
        Wire contents(value.data(), value.size());
        while (!contents.Done()) {
          uint64_t cf;
          uint32_t ct;
          if (!contents.Tag(&cf, &ct) || !contents.Skip(ct)) return "";
          if (++entries > limits.max_contents_entries)
            return detail::TooMany(tensor + ".contents", entries, limits.max_contents_entries) +
                   " fields (more follow)";
        }
        continue;
      }
      if (!inner.Skip(t)) return "";
    }
  }
  return "";
}

// What holds for any model: parameters known and typed, datatypes Triton has, shapes of a sane rank whose element
// count fits in 64 bits with room for the largest element.
inline std::string RequestRefusal(const inference::ModelInferRequest& request, const Limits& limits) {
  using detail::Quoted;
  if (static_cast<size_t>(request.inputs_size()) > limits.max_tensors)
    return detail::TooMany("inputs", request.inputs_size(), limits.max_tensors);
  if (static_cast<size_t>(request.outputs_size()) > limits.max_tensors)
    return detail::TooMany("outputs", request.outputs_size(), limits.max_tensors);
  if (static_cast<size_t>(request.raw_input_contents_size()) > limits.max_tensors)
    return detail::TooMany("raw_input_contents", request.raw_input_contents_size(), limits.max_tensors);
  if (request.parameters_size() > static_cast<int>(limits.max_parameters))
    return detail::TooMany("parameters", request.parameters_size(), limits.max_parameters);
  for (const auto& [key, value] : request.parameters()) {
    std::string refusal = detail::RequestParameterRefusal(key, value, limits);
    if (!refusal.empty()) return refusal;
  }
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    const std::string field = "inputs[" + std::to_string(i) + "]";
    if (input.name().empty()) return field + ".name: empty";
    if (!detail::KnownDatatype(input.datatype()))
      return field + ".datatype: " + Quoted(input.datatype()) + " is not a datatype Triton has";
    if (static_cast<size_t>(input.shape_size()) > limits.max_rank)
      return detail::TooMany(field + ".shape", input.shape_size(), limits.max_rank);
    if (input.parameters_size() > static_cast<int>(limits.max_parameters))
      return detail::TooMany(field + ".parameters", input.parameters_size(), limits.max_parameters);
    // The element count times 16 (the largest element, with room) fits in an int64.
    const uint64_t max_elements = static_cast<uint64_t>(INT64_MAX) / 16;
    uint64_t elements = 1;
    for (int d = 0; d < input.shape_size(); ++d) {
      const int64_t dim = input.shape(d);
      if (dim < 0)
        return field + ".shape: " + detail::DimsString(input.shape().data(), input.shape_size()) +
               " has a negative dimension";
      if (dim != 0 && elements > max_elements / static_cast<uint64_t>(dim))
        return field + ".shape: " + detail::DimsString(input.shape().data(), input.shape_size()) +
               " holds more elements than any request can";
      elements *= static_cast<uint64_t>(dim);
    }
  }
  for (int i = 0; i < request.outputs_size(); ++i) {
    const auto& output = request.outputs(i);
    const std::string field = "outputs[" + std::to_string(i) + "]";
    if (output.name().empty()) return field + ".name: empty";
    if (output.parameters_size() > static_cast<int>(limits.max_parameters))
      return detail::TooMany(field + ".parameters", output.parameters_size(), limits.max_parameters);
    for (const auto& [key, value] : output.parameters()) {
      std::string refusal = detail::OutputParameterRefusal(field + ".parameters[" + Quoted(key) + "]", key, value);
      if (!refusal.empty()) return refusal;
    }
  }
  return "";
}

// Against the model the request names: no more inputs and outputs than it has, every requested output one of its
// own (refused in Triton's words), classification only of a numeric output, each input it declares (not ragged) of
// its rank, within its fixed dims and its largest batch. An input the model does not have is left to Triton, which
// refuses it in its own words.
inline std::string ModelRefusal(const inference::ModelInferRequest& request, const ModelDescription& model) {
  if (request.inputs_size() > static_cast<int>(model.inputs.size()))
    return "inputs: " + std::to_string(request.inputs_size()) + " given, model '" + model.name + "' has " +
           std::to_string(model.inputs.size());
  if (request.outputs_size() > static_cast<int>(model.outputs.size()))
    return "outputs: " + std::to_string(request.outputs_size()) + " requested, model '" + model.name + "' has " +
           std::to_string(model.outputs.size());
  for (int i = 0; i < request.outputs_size(); ++i) {
    const auto& output = request.outputs(i);
    const TensorSpec* spec = nullptr;
    for (const TensorSpec& s : model.outputs)
      if (s.name == output.name()) spec = &s;
    if (spec == nullptr) return "unexpected inference output '" + output.name() + "' for model '" + model.name + "'";
    if (output.parameters().count("classification") && spec->datatype == "BYTES")
      return "outputs[" + std::to_string(i) + "].parameters['classification']: output '" + spec->name +
             "' of model '" + model.name + "' is BYTES, and only a numeric output can be classified";
  }
  const size_t batch_dims = model.max_batch_size > 0 ? 1 : 0;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    const TensorSpec* spec = nullptr;
    for (const TensorSpec& s : model.inputs)
      if (s.name == input.name()) spec = &s;
    if (spec == nullptr || spec->ragged) continue;
    const auto& shape = input.shape();
    const std::string expected = (batch_dims ? "[-1" + std::string(spec->dims.empty() ? "" : ",") : "[") +
                                 detail::DimsString(spec->dims.data(), spec->dims.size()).substr(1);
    bool fits = static_cast<size_t>(shape.size()) == batch_dims + spec->dims.size();
    for (size_t d = 0; fits && d < spec->dims.size(); ++d)
      fits = spec->dims[d] < 0 || spec->dims[d] == shape[static_cast<int>(batch_dims + d)];
    if (!fits)
      return "inputs[" + std::to_string(i) + "].shape: " + detail::DimsString(shape.data(), shape.size()) +
             " does not fit input '" + spec->name + "' of model '" + model.name + "', which takes " + expected;
    if (batch_dims && shape[0] > model.max_batch_size)
      return "inputs[" + std::to_string(i) + "].shape: a batch of " + std::to_string(shape[0]) + ", model '" +
             model.name + "' takes at most " + std::to_string(model.max_batch_size);
  }
  return "";
}

// The description of a model from its configuration as Triton holds it.
inline ModelDescription Describe(const inference::ModelConfig& config) {
  auto datatype = [](inference::DataType type) {
    std::string name = inference::DataType_Name(type);  // TYPE_FP32
    if (name == "TYPE_STRING") return std::string("BYTES");
    return name.rfind("TYPE_", 0) == 0 ? name.substr(5) : name;
  };
  ModelDescription model;
  model.name = config.name();
  model.max_batch_size = config.max_batch_size();
  for (const auto& input : config.input())
    model.inputs.push_back(TensorSpec{input.name(), datatype(input.data_type()),
                                      std::vector<int64_t>(input.dims().begin(), input.dims().end()),
                                      input.allow_ragged_batch()});
  for (const auto& output : config.output())
    model.outputs.push_back(TensorSpec{output.name(), datatype(output.data_type()),
                                       std::vector<int64_t>(output.dims().begin(), output.dims().end()), false});
  return model;
}

}  // namespace infer_check
