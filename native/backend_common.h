// Helpers the native backends here share: reading a request's inputs, answering a request from rows of a
// batch-wide output, errors and the log.
#pragma once

#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "triton_c_api.h"

namespace s2t {

inline uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Named after the backend in Triton's log (`s2t_inprocess:LINE]`), whichever of its files logs.
inline void Log(TRITONSERVER_LogLevel level, int line, const std::string& message) {
  const char* file = "s2t_inprocess";
  TRITONSERVER_LogMessage(level, file, line, message.c_str());
}

inline std::string TakeMessage(TRITONSERVER_Error* error) {
  std::string message = TRITONSERVER_ErrorMessage(error);
  TRITONSERVER_ErrorDelete(error);
  return message;
}

// The string value after `opening` in a JSON text as Triton serializes it (compact, keys in a fixed form); the
// values read this way are names and paths, which hold no quote or backslash.
inline bool JsonString(const std::string& json, const std::string& opening, std::string* value) {
  size_t start = json.find(opening);
  if (start == std::string::npos) return false;
  start += opening.size();
  size_t end = json.find('"', start);
  if (end == std::string::npos) return false;
  *value = json.substr(start, end - start);
  return !value->empty();
}

// One input of a request, as received.
struct InputView {
  std::string name;
  TRITONSERVER_DataType datatype;
  std::vector<int64_t> shape;
  std::vector<std::pair<const void*, uint64_t>> buffers;
  std::string joined;  // the buffers in one piece, made only for a BYTES input that came in several

  // The input's bytes in one piece (a BYTES element may straddle two buffers).
  std::pair<const char*, size_t> Contiguous() {
    if (buffers.size() == 1) return {static_cast<const char*>(buffers[0].first), buffers[0].second};
    if (joined.empty()) {
      for (const auto& buffer : buffers) joined.append(static_cast<const char*>(buffer.first), buffer.second);
    }
    return {joined.data(), joined.size()};
  }
};

inline TRITONSERVER_Error* ReadInputs(TRITONBACKEND_Request* request, std::vector<InputView>* inputs) {
  uint32_t count = 0;
  if (auto* err = TRITONBACKEND_RequestInputCount(request, &count)) return err;
  inputs->resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    TRITONBACKEND_Input* input = nullptr;
    if (auto* err = TRITONBACKEND_RequestInputByIndex(request, i, &input)) return err;
    const char* name = nullptr;
    const int64_t* shape = nullptr;
    uint32_t dims = 0, buffer_count = 0;
    uint64_t byte_size = 0;
    InputView& view = (*inputs)[i];
    if (auto* err = TRITONBACKEND_InputProperties(input, &name, &view.datatype, &shape, &dims, &byte_size,
                                                  &buffer_count)) {
      return err;
    }
    view.name = name;
    view.shape.assign(shape, shape + dims);
    for (uint32_t b = 0; b < buffer_count; ++b) {
      const void* base = nullptr;
      uint64_t size = 0;
      TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
      int64_t memory_type_id = 0;
      if (auto* err = TRITONBACKEND_InputBuffer(input, b, &base, &size, &memory_type, &memory_type_id)) return err;
      if (memory_type == TRITONSERVER_MEMORY_GPU) {
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "inputs in GPU memory are not supported");
      }
      view.buffers.emplace_back(base, size);
    }
  }
  return nullptr;
}

// Walks a BYTES tensor's raw encoding (per element a 4-byte length, then that many bytes), calling
// each(data, length) per element; returns why it does not parse, or "" when it does. A caller that must not act on
// a part of a buffer that fails walks it once with a no-op first.
template <typename Each>
std::string WalkBytes(const char* data, size_t size, Each&& each) {
  size_t offset = 0;
  for (uint64_t index = 0; offset < size; ++index) {
    if (size - offset < 4) {
      return "the " + std::to_string(size) + "-byte buffer ends inside element " + std::to_string(index) +
             "'s 4-byte length";
    }
    uint32_t length = 0;
    std::memcpy(&length, data + offset, 4);
    offset += 4;
    if (length > size - offset) {
      return "element " + std::to_string(index) + "'s length " + std::to_string(length) +
             " runs past the end of the " + std::to_string(size) + "-byte buffer";
    }
    each(data + offset, length);
    offset += length;
  }
  return std::string();
}

inline std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) text += (d == 0 ? "" : ", ") + std::to_string(shape[d]);
  return text + "]";
}

// Why a request's BYTES input is not the elements its shape holds (its count in *elements when it is): a caller
// can send any bytes with HTTP's binary-data extension, and Triton hands them over as they came.
inline std::string BytesProblem(const char* data, size_t size, const std::vector<int64_t>& shape, size_t* elements) {
  size_t count = 0;
  std::string problem = WalkBytes(data, size, [&count](const char*, uint32_t) { ++count; });
  if (!problem.empty()) return problem;
  uint64_t expected = 1;
  for (int64_t d : shape) expected = d < 0 ? 0 : expected * static_cast<uint64_t>(d);
  if (count != expected) {
    return std::to_string(count) + " elements where its shape " + ShapeText(shape) + " has " +
           std::to_string(expected);
  }
  *elements = count;
  return std::string();
}


// One batch-wide output, with where each row starts (rows of BYTES elements vary in length).
struct OutputView {
  TRITONSERVER_DataType datatype;
  std::vector<int64_t> shape;
  const char* base;
  size_t byte_size;
  std::vector<size_t> row_offsets;  // size rows + 1
};

inline bool IndexRows(OutputView* output, int64_t total_rows) {
  output->row_offsets.assign(1, 0);
  if (total_rows <= 0 || output->shape.empty() || output->shape[0] != total_rows) return false;
  int64_t per_row = 1;
  for (size_t d = 1; d < output->shape.size(); ++d) per_row *= output->shape[d];
  if (output->datatype != TRITONSERVER_TYPE_BYTES) {
    if (output->byte_size % total_rows != 0) return false;
    size_t row_bytes = output->byte_size / total_rows;
    for (int64_t r = 1; r <= total_rows; ++r) output->row_offsets.push_back(r * row_bytes);
    return true;
  }
  size_t offset = 0;
  for (int64_t r = 0; r < total_rows; ++r) {
    for (int64_t e = 0; e < per_row; ++e) {
      uint32_t length = 0;
      if (offset + 4 > output->byte_size) return false;
      std::memcpy(&length, output->base + offset, 4);
      offset += 4 + length;
      if (offset > output->byte_size) return false;
    }
    output->row_offsets.push_back(offset);
  }
  return offset == output->byte_size;
}


// The batch-wide outputs in the order the model made them (a response lists them in that order).
using Outputs = std::vector<std::pair<std::string, OutputView>>;

// Answers a request with rows [first, first + rows) of the batch-wide outputs it asked for.
inline TRITONSERVER_Error* Answer(TRITONBACKEND_Request* request, const Outputs& outputs, int64_t first,
                                  int64_t rows) {
  uint32_t count = 0;
  if (auto* err = TRITONBACKEND_RequestOutputCount(request, &count)) return err;
  std::set<std::string> requested;
  for (uint32_t i = 0; i < count; ++i) {
    const char* name = nullptr;
    if (auto* err = TRITONBACKEND_RequestOutputName(request, i, &name)) return err;
    requested.insert(name);
  }
  TRITONBACKEND_Response* response = nullptr;
  if (auto* err = TRITONBACKEND_ResponseNew(&response, request)) return err;
  TRITONSERVER_Error* failure = nullptr;
  for (const auto& [name, output] : outputs) {
    if (requested.count(name) == 0) continue;
    std::vector<int64_t> shape = output.shape;
    shape[0] = rows;
    size_t start = output.row_offsets[first], end = output.row_offsets[first + rows];
    TRITONBACKEND_Output* out = nullptr;
    failure = TRITONBACKEND_ResponseOutput(response, &out, name.c_str(), output.datatype, shape.data(),
                                           static_cast<uint32_t>(shape.size()));
    if (failure != nullptr) break;
    void* buffer = nullptr;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_type_id = 0;
    failure = TRITONBACKEND_OutputBuffer(out, &buffer, end - start, &memory_type, &memory_type_id);
    if (failure != nullptr) break;
    if (end > start) std::memcpy(buffer, output.base + start, end - start);
  }
  if (failure != nullptr) {
    TRITONBACKEND_ResponseDelete(response);
    return failure;
  }
  return TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, nullptr);
}

inline void AnswerError(TRITONBACKEND_Request* request, TRITONSERVER_Error* error) {
  TRITONBACKEND_Response* response = nullptr;
  if (auto* err = TRITONBACKEND_ResponseNew(&response, request)) {
    Log(TRITONSERVER_LOG_ERROR, __LINE__, "cannot answer a request: " + TakeMessage(err));
    TRITONSERVER_ErrorDelete(error);
    return;
  }
  if (auto* err = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error)) {
    Log(TRITONSERVER_LOG_ERROR, __LINE__, "cannot send an answer: " + TakeMessage(err));
  }
  TRITONSERVER_ErrorDelete(error);
}


}  // namespace s2t
