// ModelInferRequest read and ModelInferResponse written (inference.GRPCInferenceService, Triton's grpc_service.proto)
// by hand, for the gRPC front answering ModelInfer in tritonserver's process: a reading that takes only what it can
// pass to Triton's C API exactly as Triton's own front end would, and refuses the rest (which is then relayed).
#pragma once

#include <grpc/slice.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "triton_c_api.h"

namespace wire {

// A protobuf message read field by field: varints and length-delimited fields only (all a ModelInferRequest has).
class Reader {
 public:
  Reader(const char* data, size_t size) : p_(reinterpret_cast<const uint8_t*>(data)), end_(p_ + size) {}
  explicit Reader(std::string_view s) : Reader(s.data(), s.size()) {}
  bool Done() const { return p_ == end_; }
  bool Varint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64 && p_ < end_; shift += 7) {
      uint8_t byte = *p_++;
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) {
        *value = result;
        return true;
      }
    }
    return false;
  }
  bool Tag(uint32_t* field, uint32_t* type) {
    uint64_t tag;
    if (!Varint(&tag) || tag > UINT32_MAX) return false;
    *field = static_cast<uint32_t>(tag >> 3);
    *type = static_cast<uint32_t>(tag & 7);
    return *field != 0;
  }
  bool Bytes(std::string_view* out) {
    uint64_t size;
    if (!Varint(&size) || size > static_cast<uint64_t>(end_ - p_)) return false;
    *out = std::string_view(reinterpret_cast<const char*>(p_), size);
    p_ += size;
    return true;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

constexpr uint32_t kVarint = 0, kFixed64 = 1, kBytes = 2;

// proto3 strings are UTF-8: Triton's parser refuses a request whose string fields are not, so this reading does too.
inline bool Utf8(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t extra;
    uint32_t code;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      extra = 1;
      code = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      extra = 2;
      code = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      extra = 3;
      code = c & 0x07;
    } else {
      return false;
    }
    if (n - i - 1 < extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      code = (code << 6) | (d & 0x3f);
    }
    // overlong forms, surrogates and code points past U+10FFFF
    if ((extra == 2 && code < 0x800) || (extra == 3 && (code < 0x10000 || code > 0x10ffff)) ||
        (code >= 0xd800 && code <= 0xdfff))
      return false;
    i += extra + 1;
  }
  return true;
}

struct Input {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
};

struct Request {
  std::string model_name;
  int64_t model_version = -1;
  std::string id;
  std::vector<Input> inputs;
  std::vector<std::string> outputs;
  std::vector<std::string_view> raw;
};

inline bool Shape(Reader& r, uint32_t type, std::vector<int64_t>* shape) {
  uint64_t dim;
  if (type == kVarint) {
    if (!r.Varint(&dim)) return false;
    shape->push_back(static_cast<int64_t>(dim));
    return true;
  }
  std::string_view packed;
  if (type != kBytes || !r.Bytes(&packed)) return false;
  Reader p(packed);
  while (!p.Done()) {
    if (!p.Varint(&dim)) return false;
    shape->push_back(static_cast<int64_t>(dim));
  }
  return true;
}

inline bool ParseInput(std::string_view data, Input* input) {
  Reader r(data);
  uint32_t field, type;
  std::string_view s;
  while (!r.Done()) {
    if (!r.Tag(&field, &type)) return false;
    if (field == 3) {
      if (!Shape(r, type, &input->shape)) return false;
      continue;
    }
    // Parameters (shared memory) and typed contents are left to Triton's own front end.
    if (type != kBytes || !r.Bytes(&s) || !Utf8(s)) return false;
    if (field == 1) input->name.assign(s);
    else if (field == 2) input->datatype.assign(s);
    else return false;
  }
  return true;
}

inline bool ParseOutput(std::string_view data, std::string* name) {
  Reader r(data);
  uint32_t field, type;
  std::string_view s;
  while (!r.Done()) {
    if (!r.Tag(&field, &type) || type != kBytes || !r.Bytes(&s) || !Utf8(s)) return false;
    if (field == 1) name->assign(s);
    else return false;  // parameters: classification, shared memory
  }
  return true;
}

// The one request parameter taken here: Triton reads `triton_enable_empty_final_response` (a bool) only for decoupled
// models' streams, which never come this way. Any other parameter is Triton's to apply or refuse.
inline bool ParseParameter(std::string_view entry) {
  Reader r(entry);
  uint32_t field, type;
  std::string_view key, value;
  bool has_value = false;
  while (!r.Done()) {
    if (!r.Tag(&field, &type) || type != kBytes) return false;
    if (field == 1) {
      if (!r.Bytes(&key) || !Utf8(key)) return false;
    } else if (field == 2) {
      if (!r.Bytes(&value)) return false;
      has_value = true;
    } else {
      return false;
    }
  }
  if (key != "triton_enable_empty_final_response" || !has_value) return false;
  Reader v(value);
  uint64_t flag;
  return v.Tag(&field, &type) && field == 1 && type == kVarint && v.Varint(&flag) && v.Done();
}

inline bool ParseVersion(std::string_view s, int64_t* version) {
  if (s.empty()) {
    *version = -1;
    return true;
  }
  if (s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *version = v;
  return true;
}

// False for anything but a request Triton's front end would read the same way (request parameters, typed contents,
// shared memory, unknown fields, a malformed message): those go to Triton's own front end.
inline bool ParseRequest(const char* data, size_t size, Request* request) {
  Reader r(data, size);
  uint32_t field, type;
  std::string_view s;
  while (!r.Done()) {
    if (!r.Tag(&field, &type) || type != kBytes || !r.Bytes(&s)) return false;
    switch (field) {
      case 1: if (!Utf8(s)) return false; request->model_name.assign(s); break;
      case 2: if (!ParseVersion(s, &request->model_version)) return false; break;
      case 3: if (!Utf8(s)) return false; request->id.assign(s); break;
      case 4: if (!ParseParameter(s)) return false; break;
      case 5: request->inputs.emplace_back(); if (!ParseInput(s, &request->inputs.back())) return false; break;
      case 6: request->outputs.emplace_back(); if (!ParseOutput(s, &request->outputs.back())) return false; break;
      case 7: request->raw.push_back(s); break;
      default: return false;
    }
  }
  return !request->model_name.empty() && request->raw.size() == request->inputs.size();
}

// ---- the answer

inline size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}
inline size_t FieldSize(size_t payload) { return 1 + VarintSize(payload) + payload; }

class Writer {
 public:
  explicit Writer(uint8_t* p) : p_(p) {}
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      *p_++ = static_cast<uint8_t>(v | 0x80);
      v >>= 7;
    }
    *p_++ = static_cast<uint8_t>(v);
  }
  void Field(uint32_t field, const void* data, size_t size) {
    Varint((field << 3) | kBytes);
    Varint(size);
    memcpy(p_, data, size);
    p_ += size;
  }
  void Fixed64(uint32_t field, uint64_t v) {
    Varint((field << 3) | kFixed64);
    memcpy(p_, &v, 8);
    p_ += 8;
  }
  void Head(uint32_t field, size_t size) {
    Varint((field << 3) | kBytes);
    Varint(size);
  }
  uint8_t* at() const { return p_; }

 private:
  uint8_t* p_;
};

struct Output {
  const char* name;
  const char* datatype;
  const int64_t* shape;
  uint64_t dims;
  const void* base;
  size_t size;
  size_t shape_size = 0;   // packed dims
  size_t tensor_size = 0;  // the InferOutputTensor message
};

// A response parameter as the C API gives it: `value` points to a bool, an int64_t or a double, or is the string.
struct Parameter {
  const char* name;
  TRITONSERVER_ParameterType type;
  const void* value;
  size_t value_size = 0;  // the InferParameter message
  size_t entry_size = 0;  // the map entry {key = 1, value = 2}
};

// False for a type an InferParameter cannot hold (BYTES).
inline bool SizeParameter(Parameter& p) {
  switch (p.type) {
    case TRITONSERVER_PARAMETER_BOOL: p.value_size = 2; break;
    case TRITONSERVER_PARAMETER_INT:
      p.value_size = 1 + VarintSize(static_cast<uint64_t>(*static_cast<const int64_t*>(p.value)));
      break;
    case TRITONSERVER_PARAMETER_STRING: p.value_size = FieldSize(strlen(static_cast<const char*>(p.value))); break;
    case TRITONSERVER_PARAMETER_DOUBLE: p.value_size = 9; break;
    default: return false;
  }
  p.entry_size = FieldSize(strlen(p.name)) + FieldSize(p.value_size);
  return true;
}

inline void WriteParameter(Writer& w, const Parameter& p) {
  w.Head(4, p.entry_size);
  w.Field(1, p.name, strlen(p.name));
  w.Head(2, p.value_size);
  switch (p.type) {
    case TRITONSERVER_PARAMETER_BOOL:
      w.Varint((1 << 3) | kVarint);
      w.Varint(*static_cast<const bool*>(p.value) ? 1 : 0);
      break;
    case TRITONSERVER_PARAMETER_INT:
      w.Varint((2 << 3) | kVarint);
      w.Varint(static_cast<uint64_t>(*static_cast<const int64_t*>(p.value)));
      break;
    case TRITONSERVER_PARAMETER_STRING:
      w.Field(3, p.value, strlen(static_cast<const char*>(p.value)));
      break;
    default: {
      uint64_t bits;
      memcpy(&bits, p.value, 8);
      w.Fixed64(4, bits);
    }
  }
}

// ModelInferResponse {model_name = 1, model_version = 2, id = 3, parameters = 4, outputs = 5,
// raw_output_contents = 6} as one slice. `parameters` sized by SizeParameter.
inline grpc_slice Response(const char* model_name, int64_t model_version, const char* id,
                           const std::vector<Parameter>& parameters, std::vector<Output>& outputs) {
  std::string version = std::to_string(model_version);
  size_t name_len = strlen(model_name), id_len = strlen(id);
  size_t total = FieldSize(name_len) + FieldSize(version.size()) + (id_len ? FieldSize(id_len) : 0);
  for (const Parameter& p : parameters) total += FieldSize(p.entry_size);
  for (Output& o : outputs) {
    for (uint64_t d = 0; d < o.dims; ++d) o.shape_size += VarintSize(static_cast<uint64_t>(o.shape[d]));
    o.tensor_size = FieldSize(strlen(o.name)) + FieldSize(strlen(o.datatype)) + (o.dims ? FieldSize(o.shape_size) : 0);
    total += FieldSize(o.tensor_size) + FieldSize(o.size);
  }
  grpc_slice slice = grpc_slice_malloc(total);
  Writer w(GRPC_SLICE_START_PTR(slice));
  w.Field(1, model_name, name_len);
  w.Field(2, version.data(), version.size());
  if (id_len) w.Field(3, id, id_len);
  for (const Parameter& p : parameters) WriteParameter(w, p);
  for (const Output& o : outputs) {
    w.Head(5, o.tensor_size);
    w.Field(1, o.name, strlen(o.name));
    w.Field(2, o.datatype, strlen(o.datatype));
    if (o.dims) {
      w.Head(3, o.shape_size);
      for (uint64_t d = 0; d < o.dims; ++d) w.Varint(static_cast<uint64_t>(o.shape[d]));
    }
  }
  for (const Output& o : outputs) w.Field(6, o.base, o.size);
  return slice;
}

}  // namespace wire
