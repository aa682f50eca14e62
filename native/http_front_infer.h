// The HTTP front's inference (native/http_front.cc): a KServe v2 JSON request read and checked against the model's
// configuration, and Triton's answer written as Triton 2.51's own HTTP front end writes it (src/http_server.cc:
// FinalizeResponse, WriteDataToJson, EVBufferAddErrorJson), with RapidJSON's writer, which Triton's JSON also uses:
// the same key order, the same number formatting, the same escapes.
#pragma once

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "triton_c_api.h"

// The rest of Triton's C API the front calls (server 2.51), declared as Triton documents them.
extern "C" {
TRITONSERVER_Error* TRITONSERVER_ServerModelConfig(TRITONSERVER_Server* server, const char* model_name,
                                                   const int64_t model_version, const uint32_t config_version,
                                                   TRITONSERVER_Message** model_config);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetPriorityUInt64(TRITONSERVER_InferenceRequest* request,
                                                                   uint64_t priority);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(TRITONSERVER_InferenceRequest* request,
                                                                        uint64_t timeout_us);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetStringParameter(TRITONSERVER_InferenceRequest* request,
                                                                    const char* key, const char* value);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetIntParameter(TRITONSERVER_InferenceRequest* request,
                                                                 const char* key, const int64_t value);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetDoubleParameter(TRITONSERVER_InferenceRequest* request,
                                                                    const char* key, const double value);
uint32_t TRITONSERVER_DataTypeByteSize(TRITONSERVER_DataType datatype);
}

namespace http_front {

// What the front knows of a model from its configuration: enough to refuse what cannot be valid.
struct TensorShape {
  std::string datatype;  // as the KServe protocol spells it: FP32, BYTES, ...
  std::vector<int64_t> dims;  // -1: any size
  bool ragged = false;  // allow_ragged_batch: any shape
};

struct ModelShape {
  int64_t max_batch_size = 0;
  std::unordered_map<std::string, TensorShape> inputs, outputs;
};

inline bool JsonInt(const rapidjson::Value& value, int64_t* out) {
  if (value.IsInt64()) {
    *out = value.GetInt64();
    return true;
  }
  if (value.IsString()) {  // protobuf's JSON writes 64-bit integers as strings
    char* end = nullptr;
    *out = strtoll(value.GetString(), &end, 10);
    return end != value.GetString() && *end == '\0';
  }
  return false;
}

// The configuration's TYPE_FP32 as the protocol's FP32 (TYPE_STRING: BYTES).
inline std::string ProtocolDatatype(const char* config_type) {
  std::string type = strncmp(config_type, "TYPE_", 5) == 0 ? config_type + 5 : config_type;
  return type == "STRING" ? "BYTES" : type;
}

// False when the configuration cannot be read (the request is then relayed, unchecked, to Triton).
inline bool ReadModelShape(const char* json, size_t size, ModelShape* shape) {
  rapidjson::Document config;
  config.Parse(json, size);
  if (config.HasParseError() || !config.IsObject()) return false;
  auto member = config.FindMember("max_batch_size");
  if (member != config.MemberEnd() && !JsonInt(member->value, &shape->max_batch_size)) return false;
  for (auto [key, tensors] : {std::make_pair("input", &shape->inputs), std::make_pair("output", &shape->outputs)}) {
    member = config.FindMember(key);
    if (member == config.MemberEnd()) continue;
    if (!member->value.IsArray()) return false;
    for (const auto& tensor : member->value.GetArray()) {
      if (!tensor.IsObject() || !tensor.HasMember("name") || !tensor["name"].IsString()) return false;
      TensorShape t;
      auto type = tensor.FindMember("data_type");
      if (type != tensor.MemberEnd() && type->value.IsString()) t.datatype = ProtocolDatatype(type->value.GetString());
      auto dims = tensor.FindMember("dims");
      if (dims != tensor.MemberEnd() && dims->value.IsArray())
        for (const auto& d : dims->value.GetArray()) {
          int64_t dim;
          if (!JsonInt(d, &dim)) return false;
          t.dims.push_back(dim);
        }
      auto ragged = tensor.FindMember("allow_ragged_batch");
      t.ragged = ragged != tensor.MemberEnd() && ragged->value.IsBool() && ragged->value.GetBool();
      (*tensors)[tensor["name"].GetString()] = t;
    }
  }
  return true;
}

// Why a body is not JSON, with where: Triton's own reader takes NaN and Infinity (and would then size a tensor from a
// shape no check here has seen), and answers what it cannot parse with 500.
inline std::string NotJson(const rapidjson::Document& doc) {
  return std::string("body: not JSON (") + rapidjson::GetParseError_En(doc.GetParseError()) + " at byte " +
         std::to_string(doc.GetErrorOffset()) + ")";
}

inline bool IsBool(const rapidjson::Value& value) { return value.IsBool(); }
inline bool IsWhole(const rapidjson::Value& value) { return value.IsUint64(); }
inline bool IsSequenceId(const rapidjson::Value& value) { return value.IsUint64() || value.IsString(); }
inline bool IsScalar(const rapidjson::Value& value) { return value.IsString() || value.IsNumber() || value.IsBool(); }

// Why a request parameter's value is not of the type the protocol gives it, naming it; empty when it is. Triton reads
// these with TritonJson, whose type errors it answers 500.
inline std::string BadParameter(const std::string& field, const std::string& key, const rapidjson::Value& value) {
  struct Typed {
    const char* key;
    bool (*ok)(const rapidjson::Value&);
    const char* want;
  };
  static const Typed kTyped[] = {{"priority", IsWhole, "a whole number from 0"},
                                 {"timeout", IsWhole, "a whole number from 0 (microseconds)"},
                                 {"sequence_id", IsSequenceId, "a whole number from 0 or a string"},
                                 {"sequence_start", IsBool, "true or false"},
                                 {"sequence_end", IsBool, "true or false"},
                                 {"binary_data_output", IsBool, "true or false"}};
  for (const auto& typed : kTyped)
    if (key == typed.key) return typed.ok(value) ? "" : field + "." + key + ": must be " + typed.want;
  return IsScalar(value) ? "" : field + "." + key + ": must be a string, a number, true or false";
}

// The values in a tensor's "data" (nested arrays, nested no deeper than the front's depth limit, checked before).
inline uint64_t CountJsonValues(const rapidjson::Value& data) {
  if (!data.IsArray()) return 1;
  uint64_t count = 0;
  for (const auto& element : data.GetArray()) count += CountJsonValues(element);
  return count;
}

// The most dimensions an input may have: no configuration here comes near it, and a shape is copied per request.
constexpr size_t kMaxRank = 16;

// Why an input's shape cannot be valid whatever the model (`field`: "inputs[i]"), empty when it may be. Triton sizes a
// tensor given as JSON data from its shape before it counts the values (a shape of 2^40 rows: std::bad_alloc), and it
// does so before it looks at anything else of the request (shared memory included), so every request gets this.
inline std::string BadShape(const std::string& field, const rapidjson::Value& dims, const rapidjson::Value* data) {
  if (dims.Size() > kMaxRank)
    return field + ".shape: " + std::to_string(dims.Size()) + " dimensions, more than the " +
           std::to_string(kMaxRank) + " any input takes";
  uint64_t elements = 1;
  for (const auto& d : dims.GetArray()) {
    if (!d.IsUint64() || d.GetUint64() > static_cast<uint64_t>(INT64_MAX))
      return field + ".shape: every dimension must be a whole number from 0";
    if (__builtin_mul_overflow(elements, d.GetUint64(), &elements)) elements = UINT64_MAX;
  }
  if (data == nullptr) return "";
  uint64_t values = CountJsonValues(*data);
  if (elements == values) return "";
  return field + ".data: " + std::to_string(values) + " values, and its shape holds " +
         (elements == UINT64_MAX ? std::string("more than 2^64") : std::to_string(elements));
}

// Why a request is not what the KServe v2 protocol says one is (a field of the wrong type, a required field missing),
// naming the field; empty when it is. `tritons`: it uses what only Triton's front end reads (shared memory, no
// inputs at all), and goes there once these checks pass.
inline std::string Malformed(const rapidjson::Document& doc, bool* tritons) {
  *tritons = false;
  if (!doc.IsObject()) return "body: must be a JSON object";
  auto id = doc.FindMember("id");
  if (id != doc.MemberEnd() && !id->value.IsString()) return "id: must be a string";
  auto parameters = doc.FindMember("parameters");
  if (parameters != doc.MemberEnd()) {
    if (!parameters->value.IsObject()) return "parameters: must be an object";
    for (const auto& p : parameters->value.GetObject()) {
      std::string bad = BadParameter("parameters", p.name.GetString(), p.value);
      if (!bad.empty()) return bad;
    }
  }
  auto inputs = doc.FindMember("inputs");
  if (inputs == doc.MemberEnd()) return "inputs: required";
  if (!inputs->value.IsArray()) return "inputs: must be an array";
  if (inputs->value.Empty()) *tritons = true;
  for (rapidjson::SizeType i = 0; i < inputs->value.Size(); ++i) {
    const auto& input = inputs->value[i];
    std::string field = "inputs[" + std::to_string(i) + "]";
    if (!input.IsObject()) return field + ": must be an object";
    auto name = input.FindMember("name");
    if (name == input.MemberEnd() || !name->value.IsString()) return field + ".name: must be a string";
    auto datatype = input.FindMember("datatype");
    if (datatype == input.MemberEnd() || !datatype->value.IsString()) return field + ".datatype: must be a string";
    auto shape = input.FindMember("shape");
    if (shape == input.MemberEnd() || !shape->value.IsArray()) return field + ".shape: must be an array";
    auto data = input.FindMember("data");
    if (data != input.MemberEnd() && !data->value.IsArray()) return field + ".data: must be an array";
    std::string bad = BadShape(field, shape->value, nullptr);
    if (!bad.empty()) return bad;
    bool binary = false;
    auto params = input.FindMember("parameters");
    if (params != input.MemberEnd()) {
      if (!params->value.IsObject()) return field + ".parameters: must be an object";
      if (params->value.HasMember("shared_memory_region")) {
        *tritons = true;
        continue;
      }
      auto size = params->value.FindMember("binary_data_size");
      if (size != params->value.MemberEnd()) {
        if (!size->value.IsUint64()) return field + ".parameters.binary_data_size: must be a whole number from 0";
        binary = true;
      }
    }
    if (binary && data != input.MemberEnd())
      return field + ": both data and parameters.binary_data_size given; an input has one";
    if (!binary && data == input.MemberEnd()) return field + ".data: required (or parameters.binary_data_size)";
  }
  auto outputs = doc.FindMember("outputs");
  if (outputs == doc.MemberEnd()) return "";
  if (!outputs->value.IsArray()) return "outputs: must be an array";
  for (rapidjson::SizeType i = 0; i < outputs->value.Size(); ++i) {
    const auto& output = outputs->value[i];
    std::string field = "outputs[" + std::to_string(i) + "]";
    if (!output.IsObject()) return field + ": must be an object";
    auto name = output.FindMember("name");
    if (name == output.MemberEnd() || !name->value.IsString()) return field + ".name: must be a string";
    auto params = output.FindMember("parameters");
    if (params == output.MemberEnd()) continue;
    if (!params->value.IsObject()) return field + ".parameters: must be an object";
    auto binary = params->value.FindMember("binary_data");
    if (binary != params->value.MemberEnd() && !binary->value.IsBool())
      return field + ".parameters.binary_data: must be true or false";
    auto classification = params->value.FindMember("classification");
    if (classification != params->value.MemberEnd() && !classification->value.IsUint64())
      return field + ".parameters.classification: must be a whole number from 0";
    if (params->value.HasMember("shared_memory_region")) *tritons = true;
  }
  return "";
}

// Why a request (Malformed's checks passed) that goes to Triton's front end unread cannot be valid because an input's
// data does not fill its shape; empty when none is so.
inline std::string UnfilledShape(const rapidjson::Document& doc) {
  const auto& inputs = doc["inputs"];
  for (rapidjson::SizeType i = 0; i < inputs.Size(); ++i) {
    auto data = inputs[i].FindMember("data");
    if (data == inputs[i].MemberEnd()) continue;
    std::string bad = BadShape("inputs[" + std::to_string(i) + "]", inputs[i]["shape"], &data->value);
    if (!bad.empty()) return bad;
  }
  return "";
}

// Bytes of request bodies held in memory, raw and inflated, by every request in flight together: past the budget a
// request is refused at once rather than held.
class BodyMemory {
 public:
  explicit BodyMemory(long max) : max_(max) {}
  bool Take(long bytes) {
    long held = held_.load(std::memory_order_relaxed);
    do {
      if (bytes > max_ - held) return false;
    } while (!held_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
    return true;
  }
  void Give(long bytes) { held_.fetch_sub(bytes, std::memory_order_relaxed); }
  long held() const { return held_.load(std::memory_order_relaxed); }
  long max() const { return max_; }

 private:
  const long max_;
  std::atomic<long> held_{0};
};

// How an output is returned: in the JSON, or as binary data after it.
enum class OutputKind { kJson, kBinary };

// NaN and the infinities written as Triton's writer writes them (NaN, Infinity, -Infinity): RapidJSON's default writes
// nothing for them, leaving "data":[] or [0.38,,0.41].
using Writer = rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>, rapidjson::CrtAllocator,
                                 rapidjson::kWriteNanAndInfFlag>;

inline std::string ErrorJson(const char* message) {
  rapidjson::StringBuffer buffer;
  Writer writer(buffer);
  writer.StartObject();
  writer.Key("error");
  writer.String(message);
  writer.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

// Triton's HTTP status for a Triton error (http_server.cc HttpCodeFromError).
inline int HttpCode(TRITONSERVER_Error* error) {
  switch (TRITONSERVER_ErrorCode(error)) {
    case TRITONSERVER_ERROR_INTERNAL: return 500;
    case TRITONSERVER_ERROR_NOT_FOUND: return 404;
    case TRITONSERVER_ERROR_UNAVAILABLE: return 503;
    case TRITONSERVER_ERROR_UNSUPPORTED: return 501;
    default: return 400;
  }
}

inline TRITONSERVER_Error* ShapeMismatch(const char* name) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                               (std::string("output tensor shape does not match size of output for '") + name + "'")
                                   .c_str());
}

// One output's data as JSON (http_server.cc WriteDataToJson).
inline TRITONSERVER_Error* WriteData(Writer& writer, const char* name, TRITONSERVER_DataType datatype,
                                     const void* base, size_t byte_size, size_t count) {
  auto fixed = [&](size_t element) { return byte_size == element * count; };
  switch (datatype) {
    case TRITONSERVER_TYPE_BOOL:
      if (!fixed(1)) return ShapeMismatch(name);
      for (size_t e = 0; e < count; ++e) writer.Bool(static_cast<const uint8_t*>(base)[e] != 0);
      return nullptr;
#define S2T_WRITE(TYPE, CTYPE, CALL)                                                     \
  case TYPE:                                                                             \
    if (!fixed(sizeof(CTYPE))) return ShapeMismatch(name);                               \
    for (size_t e = 0; e < count; ++e) writer.CALL(static_cast<const CTYPE*>(base)[e]); \
    return nullptr;
      S2T_WRITE(TRITONSERVER_TYPE_UINT8, uint8_t, Uint64)
      S2T_WRITE(TRITONSERVER_TYPE_UINT16, uint16_t, Uint64)
      S2T_WRITE(TRITONSERVER_TYPE_UINT32, uint32_t, Uint64)
      S2T_WRITE(TRITONSERVER_TYPE_UINT64, uint64_t, Uint64)
      S2T_WRITE(TRITONSERVER_TYPE_INT8, int8_t, Int64)
      S2T_WRITE(TRITONSERVER_TYPE_INT16, int16_t, Int64)
      S2T_WRITE(TRITONSERVER_TYPE_INT32, int32_t, Int64)
      S2T_WRITE(TRITONSERVER_TYPE_INT64, int64_t, Int64)
      S2T_WRITE(TRITONSERVER_TYPE_FP32, float, Double)
      S2T_WRITE(TRITONSERVER_TYPE_FP64, double, Double)
#undef S2T_WRITE
    case TRITONSERVER_TYPE_FP16:
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                   "sending FP16 data via JSON is not supported. Please use the binary data format "
                                   "for output");
    case TRITONSERVER_TYPE_BF16:
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                   "sending BF16 data via JSON is not supported. Please use the binary data format "
                                   "for output");
    case TRITONSERVER_TYPE_BYTES: {
      const char* bytes = static_cast<const char*>(base);
      size_t offset = 0;
      for (size_t e = 0; e < count; ++e) {
        if (offset + sizeof(uint32_t) > byte_size) return ShapeMismatch(name);
        uint32_t length;
        memcpy(&length, bytes + offset, sizeof length);
        offset += sizeof(uint32_t);
        if (offset + length > byte_size) return ShapeMismatch(name);
        writer.String(bytes + offset, length);
        offset += length;
      }
      return nullptr;
    }
    default:
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "Invalid data type for output tensor");
  }
}

// The answer's body (JSON, then each binary output's bytes in order) and the JSON's length, from a response without
// an error; `kind_of` says how each output goes.
template <typename KindOf>
TRITONSERVER_Error* WriteResponse(TRITONSERVER_InferenceResponse* response, KindOf kind_of, std::string* body,
                                  size_t* json_size, bool* has_binary) {
  rapidjson::StringBuffer buffer;
  Writer writer(buffer);
  writer.StartObject();
  const char* id = "";
  TRITONSERVER_Error* error = TRITONSERVER_InferenceResponseId(response, &id);
  if (error != nullptr) return error;
  if (id[0] != '\0') {
    writer.Key("id");
    writer.String(id);
  }
  const char* model_name;
  int64_t model_version;
  if ((error = TRITONSERVER_InferenceResponseModel(response, &model_name, &model_version)) != nullptr) return error;
  writer.Key("model_name");
  writer.String(model_name);
  writer.Key("model_version");
  writer.String(std::to_string(model_version).c_str());
  uint32_t count = 0;
  if ((error = TRITONSERVER_InferenceResponseParameterCount(response, &count)) != nullptr) return error;
  if (count > 0) {
    writer.Key("parameters");
    writer.StartObject();
    for (uint32_t i = 0; i < count; ++i) {
      const char* name;
      TRITONSERVER_ParameterType type;
      const void* value;
      if ((error = TRITONSERVER_InferenceResponseParameter(response, i, &name, &type, &value)) != nullptr)
        return error;
      writer.Key(name);
      switch (type) {
        case TRITONSERVER_PARAMETER_BOOL: writer.Bool(*static_cast<const bool*>(value)); break;
        case TRITONSERVER_PARAMETER_INT: writer.Int64(*static_cast<const int64_t*>(value)); break;
        case TRITONSERVER_PARAMETER_STRING: writer.String(static_cast<const char*>(value)); break;
        case TRITONSERVER_PARAMETER_DOUBLE: writer.Double(*static_cast<const double*>(value)); break;
        default:
          return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                       "Response parameter of type 'TRITONSERVER_PARAMETER_BYTES' is not currently "
                                       "supported");
      }
    }
    writer.EndObject();
  }
  if ((error = TRITONSERVER_InferenceResponseOutputCount(response, &count)) != nullptr) return error;
  std::vector<std::pair<const void*, size_t>> binary;
  writer.Key("outputs");
  writer.StartArray();
  for (uint32_t i = 0; i < count; ++i) {
    const char* name;
    TRITONSERVER_DataType datatype;
    const int64_t* shape;
    uint64_t dims;
    const void* base;
    size_t byte_size;
    TRITONSERVER_MemoryType memory_type;
    int64_t memory_type_id;
    void* userp;
    if ((error = TRITONSERVER_InferenceResponseOutput(response, i, &name, &datatype, &shape, &dims, &base, &byte_size,
                                                      &memory_type, &memory_type_id, &userp)) != nullptr)
      return error;
    writer.StartObject();
    writer.Key("name");
    writer.String(name);
    writer.Key("datatype");
    writer.String(TRITONSERVER_DataTypeString(datatype));
    writer.Key("shape");
    writer.StartArray();
    size_t elements = 1;
    for (uint64_t d = 0; d < dims; ++d) {
      writer.Uint64(static_cast<uint64_t>(shape[d]));
      elements *= shape[d];
    }
    writer.EndArray();
    if (kind_of(name) == OutputKind::kBinary) {
      writer.Key("parameters");
      writer.StartObject();
      writer.Key("binary_data_size");
      writer.Uint64(byte_size);
      writer.EndObject();
      if (byte_size > 0) binary.emplace_back(base, byte_size);
    } else {
      writer.Key("data");
      writer.StartArray();
      if ((error = WriteData(writer, name, datatype, base, byte_size, elements)) != nullptr) return error;
      writer.EndArray();
    }
    writer.EndObject();
  }
  writer.EndArray();
  writer.EndObject();
  *json_size = buffer.GetSize();
  size_t total = buffer.GetSize();
  for (auto& b : binary) total += b.second;
  body->reserve(total);
  body->assign(buffer.GetString(), buffer.GetSize());
  for (auto& b : binary) body->append(static_cast<const char*>(b.first), b.second);
  *has_binary = !binary.empty();
  return nullptr;
}

}  // namespace http_front
