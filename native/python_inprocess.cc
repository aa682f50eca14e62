// s2t_inprocess: a Triton backend that runs a model's Python inside the server process.
//
// Why: the python backend runs each model in a stub process, and every request and every response crosses to it
// on its own (shared-memory messages, semaphores, a request and a response object on each side), with thread
// hand-offs on both sides of the boundary. At one record per request that costs more CPU than the decode, the
// score and the decision together. Here a dynamic batch's raw inputs go to the model's Python in one call on the
// instance's own thread (backends/inprocess.py), and its raw outputs come back to be split per request.
//
// The trade: the model's code shares the server's process. A Python exception answers the batch's requests with an
// error and the server keeps serving (as in a stub); a crash in native code it calls ends the server, which
// `s2t serve` restarts like any server that died. One interpreter serves every model of this backend, one
// execution at a time (the GIL).
//
// The interpreter is the one `--backend-config=s2t_inprocess,python=PATH` names (a virtual environment's python,
// whose packages it then imports); its library is linked in and made global, so that the extension modules it
// imports (numpy, onnxruntime) find its symbols.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

#include <memory>
#include <string>
#include <vector>

#include "backend_common.h"
#include "triton_c_api.h"

#ifndef S2T_LIBPYTHON
#error "S2T_LIBPYTHON: the soname of the libpython this backend is built against"
#endif

namespace {

using s2t::Answer;
using s2t::AnswerError;
using s2t::InputView;
using s2t::Log;
using s2t::NowNs;
using s2t::OutputView;

struct Model {
  std::string name;
  PyObject* handler = nullptr;  // backends.inprocess.Handler
};

// The Python exception pending, as "Type: message", cleared.
std::string TakePythonError() {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  std::string text = "unknown Python error";
  if (value != nullptr) {
    PyObject* shown = PyObject_Str(value);
    const char* utf8 = shown != nullptr ? PyUnicode_AsUTF8(shown) : nullptr;
    if (utf8 != nullptr) {
      text = std::string(reinterpret_cast<PyTypeObject*>(type)->tp_name) + ": " + utf8;
    }
    Py_XDECREF(shown);
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return text;
}

class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }

 private:
  PyGILState_STATE state_;
};

// Attribute `name` of `object` as a long; false (a Python error set) when it has none or it is no integer.
bool IntAttribute(PyObject* object, const char* name, long* value) {
  PyObject* attribute = PyObject_GetAttrString(object, name);
  if (attribute == nullptr) return false;
  *value = PyLong_AsLong(attribute);
  Py_DECREF(attribute);
  return !(*value == -1 && PyErr_Occurred());
}

// The elements of a BYTES tensor's raw encoding as a list of bytes; nullptr (a ValueError set) when it does not
// parse.
PyObject* ElementsOf(PyObject* raw) {
  const char* data = PyBytes_AS_STRING(raw);
  const size_t size = static_cast<size_t>(PyBytes_GET_SIZE(raw));
  PyObject* elements = PyList_New(0);
  size_t offset = 0;
  while (elements != nullptr && offset < size) {
    uint32_t length = 0;
    if (offset + 4 > size || (std::memcpy(&length, data + offset, 4), offset + 4 + length > size)) {
      PyErr_SetString(PyExc_ValueError, "a BYTES input does not parse as length-prefixed elements");
      Py_CLEAR(elements);
      break;
    }
    PyObject* element = PyBytes_FromStringAndSize(data + offset + 4, length);
    if (element == nullptr || PyList_Append(elements, element) != 0) Py_CLEAR(elements);
    Py_XDECREF(element);
    offset += 4 + length;
  }
  return elements;
}

// The Python call for one batch: every request's rows joined per input, each request's row count.
PyObject* CallExecute(const Model& model, const std::vector<std::vector<InputView>>& inputs,
                      const std::vector<int64_t>& rows) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  PyObject* joined = PyDict_New();
  const std::vector<InputView>& layout = inputs.front();
  for (size_t k = 0; joined != nullptr && k < layout.size(); ++k) {
    size_t size = 0;
    for (const auto& request : inputs) {
      for (const auto& buffer : request[k].buffers) size += buffer.second;
    }
    PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
    if (raw == nullptr) {
      Py_CLEAR(joined);
      break;
    }
    char* at = PyBytes_AS_STRING(raw);
    for (const auto& request : inputs) {
      for (const auto& buffer : request[k].buffers) {
        if (buffer.second != 0) std::memcpy(at, buffer.first, buffer.second);
        at += buffer.second;
      }
    }
    PyObject* shape = PyList_New(static_cast<Py_ssize_t>(layout[k].shape.size()));
    for (size_t d = 0; d < layout[k].shape.size(); ++d) {
      PyList_SET_ITEM(shape, d, PyLong_FromLongLong(d == 0 ? total : layout[k].shape[d]));
    }
    if (layout[k].datatype == TRITONSERVER_TYPE_BYTES) {
      // BYTES as its elements (each a 4-byte length, then the bytes): a list of bytes objects, made here
      // rather than parsed again in Python.
      PyObject* elements = ElementsOf(raw);
      Py_DECREF(raw);
      raw = elements;
    }
    if (raw == nullptr) {
      Py_DECREF(shape);
      Py_CLEAR(joined);
      break;
    }
    PyObject* entry = Py_BuildValue("(iNN)", static_cast<int>(layout[k].datatype), shape, raw);
    if (entry == nullptr || PyDict_SetItemString(joined, layout[k].name.c_str(), entry) != 0) Py_CLEAR(joined);
    Py_XDECREF(entry);
  }
  if (joined == nullptr) return nullptr;
  PyObject* counts = PyList_New(static_cast<Py_ssize_t>(rows.size()));
  for (size_t i = 0; i < rows.size(); ++i) PyList_SET_ITEM(counts, i, PyLong_FromLongLong(rows[i]));
  return PyObject_CallMethod(model.handler, "execute", "NN", joined, counts);
}

// Answers every request from the handler's (outputs, errors); false when the result is not of that form.
bool AnswerAll(const Model& model, PyObject* result, const std::vector<TRITONBACKEND_Request*>& requests,
               const std::vector<int64_t>& rows, std::vector<bool>* succeeded) {
  PyObject* outputs = nullptr;
  PyObject* errors = nullptr;
  if (!PyArg_ParseTuple(result, "OO", &outputs, &errors) || !PyList_Check(outputs) || !PyList_Check(errors) ||
      PyList_GET_SIZE(errors) != static_cast<Py_ssize_t>(requests.size())) {
    return false;
  }
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  s2t::Outputs views;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outputs); ++i) {
    PyObject* output = PyList_GET_ITEM(outputs, i);
    PyObject* name = PyObject_GetAttrString(output, "name");
    PyObject* shape = PyObject_GetAttrString(output, "shape");
    PyObject* raw = PyObject_GetAttrString(output, "raw");
    long datatype = 0;
    bool ok = name != nullptr && shape != nullptr && raw != nullptr && PyBytes_Check(raw) &&
              PyTuple_Check(shape) && IntAttribute(output, "datatype", &datatype);
    OutputView view;
    const char* name_utf8 = ok ? PyUnicode_AsUTF8(name) : nullptr;
    if (name_utf8 != nullptr) {
      view.datatype = static_cast<TRITONSERVER_DataType>(datatype);
      view.shape.push_back(total);
      for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); ++d) {
        view.shape.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d)));
      }
      // The bytes stay alive with `result`, which the caller holds until every request is answered.
      view.base = PyBytes_AS_STRING(raw);
      view.byte_size = static_cast<size_t>(PyBytes_GET_SIZE(raw));
      ok = s2t::IndexRows(&view, total);
      if (ok) views.emplace_back(name_utf8, std::move(view));
    }
    Py_XDECREF(name);
    Py_XDECREF(shape);
    Py_XDECREF(raw);
    if (!ok || name_utf8 == nullptr) {
      if (PyErr_Occurred()) Log(TRITONSERVER_LOG_ERROR, __LINE__, model.name + ": " + TakePythonError());
      Log(TRITONSERVER_LOG_ERROR, __LINE__, model.name + ": an output does not match the batch's rows");
      return false;
    }
  }
  int64_t first = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    PyObject* error = PyList_GET_ITEM(errors, i);
    if (error != Py_None) {
      int code = TRITONSERVER_ERROR_INTERNAL;
      const char* message = nullptr;
      if (!PyArg_ParseTuple(error, "is", &code, &message)) {
        Log(TRITONSERVER_LOG_ERROR, __LINE__, model.name + ": " + TakePythonError());
        code = TRITONSERVER_ERROR_INTERNAL;
        message = nullptr;
      }
      std::string text = message != nullptr ? message : model.name + ": internal error";
      AnswerError(requests[i], TRITONSERVER_ErrorNew(static_cast<TRITONSERVER_Error_Code>(code), text.c_str()));
    } else if (auto* err = Answer(requests[i], views, first, rows[i])) {
      Log(TRITONSERVER_LOG_ERROR, __LINE__, model.name + ": cannot answer a request: " + TRITONSERVER_ErrorMessage(err));
      AnswerError(requests[i], err);
    } else {
      (*succeeded)[i] = true;
    }
    first += rows[i];
  }
  return true;
}

}  // namespace

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  // The interpreter's symbols global: Python extension modules are built to find them in the process.
  if (dlopen(S2T_LIBPYTHON, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL) == nullptr) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                 (std::string("s2t_inprocess: cannot load ") + S2T_LIBPYTHON + ": " + dlerror()).c_str());
  }
  if (Py_IsInitialized()) return nullptr;
  TRITONSERVER_Message* message = nullptr;  // Triton's own: not deleted here
  if (auto* err = TRITONBACKEND_BackendConfig(backend, &message)) return err;
  const char* json = nullptr;
  size_t size = 0;
  if (auto* err = TRITONSERVER_MessageSerializeToJson(message, &json, &size)) return err;
  std::string config(json, size);
  std::string python;
  s2t::JsonString(config, "\"python\":\"", &python);

  PyConfig py_config;
  PyConfig_InitPythonConfig(&py_config);
  py_config.install_signal_handlers = 0;  // the server's signals stay the server's
  py_config.parse_argv = 0;
  PyStatus status = PyStatus_Ok();
  if (!python.empty()) {
    // Its virtual environment (pyvenv.cfg beside it) gives the prefix and the packages.
    status = PyConfig_SetBytesString(&py_config, &py_config.program_name, python.c_str());
  }
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&py_config);
  PyConfig_Clear(&py_config);
  if (PyStatus_Exception(status)) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                 (std::string("s2t_inprocess: cannot start Python: ") +
                                  (status.err_msg != nullptr ? status.err_msg : "unknown error")).c_str());
  }
  PyEval_SaveThread();  // the GIL is taken per call, from whichever thread Triton calls on
  Log(TRITONSERVER_LOG_INFO, __LINE__, "s2t_inprocess: Python " + std::string(Py_GetVersion()).substr(0, 6) +
                                           (python.empty() ? std::string() : " from " + python));
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* triton_model) {
  auto model = std::make_unique<Model>();
  const char* name = nullptr;
  uint64_t version = 0;
  TRITONBACKEND_ArtifactType artifact_type;
  const char* location = nullptr;
  if (auto* err = TRITONBACKEND_ModelName(triton_model, &name)) return err;
  model->name = name;
  if (auto* err = TRITONBACKEND_ModelVersion(triton_model, &version)) return err;
  if (auto* err = TRITONBACKEND_ModelRepository(triton_model, &artifact_type, &location)) return err;
  TRITONSERVER_Message* message = nullptr;
  if (auto* err = TRITONBACKEND_ModelConfig(triton_model, 1, &message)) return err;
  const char* json = nullptr;
  size_t size = 0;
  TRITONSERVER_Error* err = TRITONSERVER_MessageSerializeToJson(message, &json, &size);
  std::string config = err == nullptr ? std::string(json, size) : std::string();
  TRITONSERVER_MessageDelete(message);
  if (err != nullptr) return err;
  {
    Gil gil;
    PyObject* module = PyImport_ImportModule("backends.inprocess");
    if (module != nullptr) {
      model->handler = PyObject_CallMethod(module, "load", "s#ssK", config.data(), static_cast<Py_ssize_t>(config.size()),
                                           model->name.c_str(), location, static_cast<unsigned long long>(version));
      Py_DECREF(module);
    }
    if (model->handler == nullptr) {
      std::string why = TakePythonError();
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, (model->name + ": " + why).c_str());
    }
  }
  return TRITONBACKEND_ModelSetState(triton_model, model.release());
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* triton_model) {
  void* state = nullptr;
  if (auto* err = TRITONBACKEND_ModelState(triton_model, &state)) return err;
  auto* model = static_cast<Model*>(state);
  if (model != nullptr && model->handler != nullptr) {
    Gil gil;
    Py_DECREF(model->handler);
  }
  delete model;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  const uint64_t exec_start = NowNs();
  TRITONBACKEND_Model* triton_model = nullptr;
  void* state = nullptr;
  if (auto* err = TRITONBACKEND_ModelInstanceModel(instance, &triton_model)) return err;
  if (auto* err = TRITONBACKEND_ModelState(triton_model, &state)) return err;
  const Model& model = *static_cast<Model*>(state);

  // The requests whose inputs read, each with its row count; the batcher gives them all the config's layout.
  std::vector<TRITONBACKEND_Request*> batch;
  std::vector<std::vector<InputView>> inputs;
  std::vector<int64_t> rows;
  std::vector<std::pair<TRITONBACKEND_Request*, bool>> done;
  for (uint32_t i = 0; i < count; ++i) {
    std::vector<InputView> read;
    TRITONSERVER_Error* err = s2t::ReadInputs(requests[i], &read);
    if (err == nullptr && (read.empty() || read.front().shape.empty() ||
                           (!inputs.empty() && read.size() != inputs.front().size()))) {
      err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, (model.name + ": inputs without a batch "
                                                                                "dimension").c_str());
    }
    if (err != nullptr) {
      AnswerError(requests[i], err);
      done.emplace_back(requests[i], false);
      continue;
    }
    rows.push_back(read.front().shape[0]);
    inputs.push_back(std::move(read));
    batch.push_back(requests[i]);
  }

  uint64_t compute_start = NowNs(), compute_end = compute_start;
  uint64_t rows_answered = 0;
  if (!batch.empty()) {
    std::vector<bool> succeeded(batch.size(), false);
    Gil gil;
    compute_start = NowNs();
    PyObject* result = CallExecute(model, inputs, rows);
    compute_end = NowNs();
    if (result == nullptr || !AnswerAll(model, result, batch, rows, &succeeded)) {
      if (PyErr_Occurred()) Log(TRITONSERVER_LOG_ERROR, __LINE__, model.name + ": " + TakePythonError());
      for (size_t i = 0; i < batch.size(); ++i) {
        if (!succeeded[i]) {
          AnswerError(batch[i], TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                                      (model.name + ": internal error").c_str()));
        }
      }
    }
    Py_XDECREF(result);
    for (size_t i = 0; i < batch.size(); ++i) {
      done.emplace_back(batch[i], succeeded[i]);
      rows_answered += static_cast<uint64_t>(rows[i]);
    }
  }
  const uint64_t exec_end = NowNs();
  for (auto& [request, success] : done) {
    TRITONBACKEND_ModelInstanceReportStatistics(instance, request, success, exec_start, compute_start, compute_end,
                                                exec_end);
    TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  if (rows_answered > 0) {
    TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, rows_answered, exec_start, compute_start, compute_end,
                                                     exec_end);
  }
  return nullptr;
}

}  // extern "C"
