// s2t_inprocess: a Triton backend that runs a model's Python inside the server process.
//
// Why: the python backend runs each model in a stub process, and every request and every response crosses to it
// on its own (shared-memory messages, semaphores, a request and a response object on each side), with thread
// hand-offs on both sides of the boundary. At one record per request that costs more CPU than the decode, the
// score and the decision together. Here a dynamic batch's raw inputs go to the model's Python in one call on the
// instance's own thread (backends/runtime/inprocess.py), and its raw outputs come back to be split per request.
//
// The trade: the model's code shares the server's process. A Python exception answers the batch's requests with an
// error and the server keeps serving (as in a stub); a crash in native code it calls ends the server, which
// `s2t serve` restarts like any server that died, and faulthandler leaves every Python thread's stack in the log
// first. One interpreter serves every model of this backend, one execution at a time (the GIL).
//
// Each request's inputs are checked on their own before the batch's Python call: a BYTES buffer that does not
// parse is that request's error, never its batch-mates'. What Triton counts follows the python backend: a request
// answered with its own error (INVALID_ARG) counts as answered, only the model's failures as failed. The backend's
// own metrics on Triton's /metrics page count both kinds (s2t_request_errors_total) and show the execution in
// progress on each instance (s2t_execute_started_seconds), so that an outside watchdog can see one that never
// returns.
//
// The interpreter is the one `--backend-config=s2t_inprocess,python=PATH` names (a virtual environment's python,
// whose packages it then imports); its library is linked in and made global, so that the extension modules it
// imports (numpy, onnxruntime) find its symbols.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <signal.h>

#include <atomic>
#include <chrono>
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

// The backend's metrics, made once for all its models. Labels stay bounded: models, versions and instances are the
// repository's, kinds are two.
constexpr char kRequestErrors[] = "s2t_request_errors_total";
constexpr char kExecuteStarted[] = "s2t_execute_started_seconds";
TRITONSERVER_MetricFamily* request_errors = nullptr;    // {model, version, kind="caller"|"model"}
TRITONSERVER_MetricFamily* execute_started = nullptr;   // {model, version, instance}

// A metric of `family` with these labels; nullptr (logged) where there is none (metrics off).
TRITONSERVER_Metric* NewMetric(TRITONSERVER_MetricFamily* family,
                               const std::vector<std::pair<const char*, std::string>>& labels) {
  if (family == nullptr) return nullptr;
  std::vector<const TRITONSERVER_Parameter*> parameters;
  for (const auto& [key, value] : labels) {
    parameters.push_back(TRITONSERVER_ParameterNew(key, TRITONSERVER_PARAMETER_STRING, value.c_str()));
  }
  TRITONSERVER_Metric* metric = nullptr;
  if (auto* err = TRITONSERVER_MetricNew(&metric, family, parameters.data(), parameters.size())) {
    Log(TRITONSERVER_LOG_WARN, __LINE__, "s2t_inprocess: no metric: " + s2t::TakeMessage(err));
    metric = nullptr;
  }
  for (const auto* parameter : parameters) {
    TRITONSERVER_ParameterDelete(const_cast<TRITONSERVER_Parameter*>(parameter));
  }
  return metric;
}

void DeleteMetric(TRITONSERVER_Metric* metric) {
  if (metric != nullptr) {
    if (auto* err = TRITONSERVER_MetricDelete(metric)) TRITONSERVER_ErrorDelete(err);
  }
}

// Metric updates fail only on a kind mismatch (a counter set): nothing to do about it here but not leak the error.
void SetMetric(TRITONSERVER_Metric* metric, double value) {
  if (metric != nullptr) {
    if (auto* err = TRITONSERVER_MetricSet(metric, value)) TRITONSERVER_ErrorDelete(err);
  }
}

void AddToMetric(TRITONSERVER_Metric* metric, double value) {
  if (metric != nullptr && value > 0) {
    if (auto* err = TRITONSERVER_MetricIncrement(metric, value)) TRITONSERVER_ErrorDelete(err);
  }
}

void NewFamily(TRITONSERVER_MetricFamily** family, TRITONSERVER_MetricKind kind, const char* name,
               const char* description) {
  if (*family != nullptr) return;
  if (auto* err = TRITONSERVER_MetricFamilyNew(family, kind, name, description)) {
    Log(TRITONSERVER_LOG_WARN, __LINE__, std::string("s2t_inprocess: no ") + name + ": " + s2t::TakeMessage(err));
    *family = nullptr;
  }
}

void DeleteFamily(TRITONSERVER_MetricFamily** family) {
  if (*family != nullptr) {
    if (auto* err = TRITONSERVER_MetricFamilyDelete(*family)) TRITONSERVER_ErrorDelete(err);
    *family = nullptr;
  }
}

// What became of a request: Triton counts a request answered with its own error as answered.
enum class Outcome { kAnswered, kCallerError, kModelError };

Outcome OutcomeOf(TRITONSERVER_Error_Code code) {
  return code == TRITONSERVER_ERROR_INVALID_ARG ? Outcome::kCallerError : Outcome::kModelError;
}

struct Model {
  std::string name;
  std::string version;
  PyObject* handler = nullptr;      // s2t.backends.runtime.inprocess.Handler
  std::vector<std::string> inputs;  // the inputs it reads, in its order (Handler.inputs)
  TRITONSERVER_Metric* caller_errors = nullptr;
  TRITONSERVER_Metric* model_errors = nullptr;

  ~Model() {
    DeleteMetric(caller_errors);
    DeleteMetric(model_errors);
  }
};

struct Instance {
  // The wall-clock start of the execution in progress (epoch seconds), 0 between executions.
  TRITONSERVER_Metric* execute_started = nullptr;

  ~Instance() { DeleteMetric(execute_started); }
};

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

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

// faulthandler's SIGSEGV handler as it installed it when the interpreter started, and whether it has been put back
// on top of the server's own crash handlers since.
void (*python_crash_handler)(int) = nullptr;
std::atomic<bool> crash_handlers_chained{false};

// Triton installs its SIGSEGV and SIGABRT handlers (a native stack trace, then the default action) once its models
// are loaded, over faulthandler's, which then never runs. Put back on top (GIL held), faulthandler writes the Python
// stacks and hands the signal on to Triton's handler. Until Triton has installed its own (a model's warm-up runs
// before), this only looks.
void ChainCrashHandlers() {
  struct sigaction segv, abrt;
  if (sigaction(SIGSEGV, nullptr, &segv) != 0 || sigaction(SIGABRT, nullptr, &abrt) != 0) return;
  if (segv.sa_handler == python_crash_handler) return;
  PyObject* module = PyImport_ImportModule("faulthandler");
  // disable() puts back what faulthandler found at start-up (the defaults), over Triton's handlers: restored here
  // before enable() takes them as the handlers it hands on to.
  PyObject* disabled = module != nullptr ? PyObject_CallMethod(module, "disable", nullptr) : nullptr;
  sigaction(SIGSEGV, &segv, nullptr);
  sigaction(SIGABRT, &abrt, nullptr);
  PyObject* enabled = disabled != nullptr ? PyObject_CallMethod(module, "enable", nullptr) : nullptr;
  if (enabled == nullptr) Log(TRITONSERVER_LOG_ERROR, __LINE__, "s2t_inprocess: faulthandler: " + TakePythonError());
  Py_XDECREF(enabled);
  Py_XDECREF(disabled);
  Py_XDECREF(module);
  crash_handlers_chained = true;
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

// One request's inputs in the model's order, or that request's own error (INVALID_ARG, naming the input) when one is
// missing or does not parse; *rows its batch dimension, (*elements)[k] the element count of a BYTES input.
TRITONSERVER_Error* RequestInputs(const Model& model, TRITONBACKEND_Request* request, std::vector<InputView>* inputs,
                                  int64_t* rows, std::vector<size_t>* elements) {
  std::vector<InputView> read;
  if (auto* err = s2t::ReadInputs(request, &read)) return err;
  inputs->reserve(model.inputs.size());
  elements->assign(model.inputs.size(), 0);
  for (size_t k = 0; k < model.inputs.size(); ++k) {
    const std::string& name = model.inputs[k];
    size_t at = 0;
    while (at < read.size() && read[at].name != name) ++at;
    std::string problem;
    if (at == read.size()) {
      problem = "missing";
    } else if (read[at].shape.empty()) {
      problem = "no batch dimension";
    } else if (k > 0 && read[at].shape[0] != *rows) {
      problem = std::to_string(read[at].shape[0]) + " rows where " + model.inputs[0] + " has " + std::to_string(*rows);
    } else if (read[at].datatype == TRITONSERVER_TYPE_BYTES) {
      auto [data, size] = read[at].Contiguous();
      problem = s2t::BytesProblem(data, size, read[at].shape, &(*elements)[k]);
    }
    if (!problem.empty()) {
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, (name + ": " + problem).c_str());
    }
    if (k == 0) *rows = read[at].shape[0];
    inputs->push_back(std::move(read[at]));
  }
  return nullptr;
}

// Input k of every request joined over the batch: BYTES as a list of bytes objects (made here rather than parsed
// again in Python), any other type as its raw bytes.
PyObject* JoinedInput(std::vector<std::vector<InputView>>* inputs, size_t k, size_t elements) {
  if (inputs->front()[k].datatype == TRITONSERVER_TYPE_BYTES) {
    PyObject* list = PyList_New(static_cast<Py_ssize_t>(elements));
    Py_ssize_t at = 0;
    bool ok = list != nullptr;
    for (auto& request : *inputs) {
      if (!ok) break;
      auto [data, size] = request[k].Contiguous();
      // Each request's buffer parsed when it was read (RequestInputs): the walk cannot fail here.
      s2t::WalkBytes(data, size, [&](const char* element, uint32_t length) {
        PyObject* item = ok ? PyBytes_FromStringAndSize(element, length) : nullptr;
        if (item == nullptr) {
          ok = false;
          return;
        }
        PyList_SET_ITEM(list, at++, item);
      });
    }
    if (!ok || at != static_cast<Py_ssize_t>(elements)) Py_CLEAR(list);  // unset items are NULL: cleared safely
    return list;
  }
  size_t size = 0;
  for (const auto& request : *inputs) {
    for (const auto& buffer : request[k].buffers) size += buffer.second;
  }
  PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
  if (raw == nullptr) return nullptr;
  char* at = PyBytes_AS_STRING(raw);
  for (const auto& request : *inputs) {
    for (const auto& buffer : request[k].buffers) {
      if (buffer.second != 0) std::memcpy(at, buffer.first, buffer.second);
      at += buffer.second;
    }
  }
  return raw;
}

// The Python call for one batch: every request's rows joined per input, each request's row count.
PyObject* CallExecute(const Model& model, std::vector<std::vector<InputView>>* inputs,
                      const std::vector<int64_t>& rows, const std::vector<size_t>& elements) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  PyObject* joined = PyDict_New();
  for (size_t k = 0; joined != nullptr && k < model.inputs.size(); ++k) {
    const InputView& layout = inputs->front()[k];
    PyObject* data = JoinedInput(inputs, k, elements[k]);
    PyObject* shape = data != nullptr ? PyList_New(static_cast<Py_ssize_t>(layout.shape.size())) : nullptr;
    if (shape == nullptr) {
      Py_XDECREF(data);
      Py_CLEAR(joined);
      break;
    }
    for (size_t d = 0; d < layout.shape.size(); ++d) {
      PyList_SET_ITEM(shape, d, PyLong_FromLongLong(d == 0 ? total : layout.shape[d]));
    }
    PyObject* entry = Py_BuildValue("(iNN)", static_cast<int>(layout.datatype), shape, data);
    if (entry == nullptr || PyDict_SetItemString(joined, layout.name.c_str(), entry) != 0) Py_CLEAR(joined);
    Py_XDECREF(entry);
  }
  if (joined == nullptr) return nullptr;
  PyObject* counts = PyList_New(static_cast<Py_ssize_t>(rows.size()));
  for (size_t i = 0; i < rows.size(); ++i) PyList_SET_ITEM(counts, i, PyLong_FromLongLong(rows[i]));
  return PyObject_CallMethod(model.handler, "execute", "NN", joined, counts);
}

// Answers every request from the handler's (outputs, errors), each request's outcome in *outcomes; false (nothing
// answered) when the result is not of that form.
bool AnswerAll(const Model& model, PyObject* result, const std::vector<TRITONBACKEND_Request*>& requests,
               const std::vector<int64_t>& rows, std::vector<Outcome>* outcomes) {
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
      (*outcomes)[i] = OutcomeOf(static_cast<TRITONSERVER_Error_Code>(code));
    } else if (auto* err = Answer(requests[i], views, first, rows[i])) {
      Log(TRITONSERVER_LOG_ERROR, __LINE__, model.name + ": cannot answer a request: " + TRITONSERVER_ErrorMessage(err));
      AnswerError(requests[i], err);
      (*outcomes)[i] = Outcome::kModelError;
    } else {
      (*outcomes)[i] = Outcome::kAnswered;
    }
    first += rows[i];
  }
  return true;
}

}  // namespace

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  NewFamily(&request_errors, TRITONSERVER_METRIC_KIND_COUNTER, kRequestErrors,
            "Requests the in-process backend answered with an error: kind caller (the request's own, INVALID_ARG: "
            "Triton counts it as a success) or model (the model failed: Triton counts it as a BACKEND failure)");
  NewFamily(&execute_started, TRITONSERVER_METRIC_KIND_GAUGE, kExecuteStarted,
            "Wall-clock start (Unix seconds) of the execution in progress on a model instance of the in-process "
            "backend, 0 between executions: an execution that never returns keeps its start");
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
  // A crash in a model's Python or in native code it calls (a signal) leaves every Python thread's stack in the
  // server's log (standard error); faulthandler then hands the signal on to Triton's own handler.
  py_config.faulthandler = 1;
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
  struct sigaction segv;
  if (sigaction(SIGSEGV, nullptr, &segv) == 0) python_crash_handler = segv.sa_handler;
  PyEval_SaveThread();  // the GIL is taken per call, from whichever thread Triton calls on
  Log(TRITONSERVER_LOG_INFO, __LINE__, "s2t_inprocess: Python " + std::string(Py_GetVersion()).substr(0, 6) +
                                           (python.empty() ? std::string() : " from " + python));
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_Finalize(TRITONBACKEND_Backend*) {
  DeleteFamily(&request_errors);
  DeleteFamily(&execute_started);
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
  model->version = std::to_string(version);
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
    PyObject* module = PyImport_ImportModule("s2t.backends.runtime.inprocess");
    if (module != nullptr) {
      model->handler = PyObject_CallMethod(module, "load", "s#ssK", config.data(), static_cast<Py_ssize_t>(config.size()),
                                           model->name.c_str(), location, static_cast<unsigned long long>(version));
      Py_DECREF(module);
    }
    PyObject* inputs = model->handler != nullptr ? PyObject_GetAttrString(model->handler, "inputs") : nullptr;
    PyObject* names = inputs != nullptr ? PySequence_Fast(inputs, "Handler.inputs is no sequence") : nullptr;
    for (Py_ssize_t i = 0; names != nullptr && i < PySequence_Fast_GET_SIZE(names); ++i) {
      const char* input = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(names, i));
      if (input == nullptr) break;
      model->inputs.emplace_back(input);
    }
    Py_XDECREF(names);
    Py_XDECREF(inputs);
    if (PyErr_Occurred() || model->handler == nullptr || model->inputs.empty()) {
      std::string why = PyErr_Occurred() ? TakePythonError() : "the model reads no inputs";
      Py_CLEAR(model->handler);
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, (model->name + ": " + why).c_str());
    }
  }
  model->caller_errors = NewMetric(request_errors, {{"model", model->name}, {"version", model->version},
                                                    {"kind", "caller"}});
  model->model_errors = NewMetric(request_errors, {{"model", model->name}, {"version", model->version},
                                                   {"kind", "model"}});
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

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* triton_instance) {
  TRITONBACKEND_Model* triton_model = nullptr;
  void* state = nullptr;
  const char* name = nullptr;
  if (auto* err = TRITONBACKEND_ModelInstanceModel(triton_instance, &triton_model)) return err;
  if (auto* err = TRITONBACKEND_ModelState(triton_model, &state)) return err;
  if (auto* err = TRITONBACKEND_ModelInstanceName(triton_instance, &name)) return err;
  const Model& model = *static_cast<Model*>(state);
  auto instance = std::make_unique<Instance>();
  instance->execute_started = NewMetric(execute_started, {{"model", model.name}, {"version", model.version},
                                                          {"instance", name}});
  return TRITONBACKEND_ModelInstanceSetState(triton_instance, instance.release());
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* triton_instance) {
  void* state = nullptr;
  if (auto* err = TRITONBACKEND_ModelInstanceState(triton_instance, &state)) return err;
  delete static_cast<Instance*>(state);
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* triton_instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  const uint64_t exec_start = NowNs();
  TRITONBACKEND_Model* triton_model = nullptr;
  void* model_state = nullptr;
  void* instance_state = nullptr;
  if (auto* err = TRITONBACKEND_ModelInstanceModel(triton_instance, &triton_model)) return err;
  if (auto* err = TRITONBACKEND_ModelState(triton_model, &model_state)) return err;
  if (auto* err = TRITONBACKEND_ModelInstanceState(triton_instance, &instance_state)) return err;
  const Model& model = *static_cast<Model*>(model_state);
  TRITONSERVER_Metric* started = static_cast<Instance*>(instance_state)->execute_started;
  // Set before the GIL is taken: an execution stuck waiting for it is stuck too.
  SetMetric(started, WallSeconds());

  // The requests whose inputs read and parse, each with its row count; any other is answered with its own error.
  std::vector<TRITONBACKEND_Request*> batch;
  std::vector<std::vector<InputView>> inputs;
  std::vector<int64_t> rows;
  std::vector<size_t> elements(model.inputs.size(), 0);
  std::vector<std::pair<TRITONBACKEND_Request*, Outcome>> done;
  for (uint32_t i = 0; i < count; ++i) {
    std::vector<InputView> read;
    std::vector<size_t> read_elements;
    int64_t read_rows = 0;
    if (TRITONSERVER_Error* err = RequestInputs(model, requests[i], &read, &read_rows, &read_elements)) {
      done.emplace_back(requests[i], OutcomeOf(TRITONSERVER_ErrorCode(err)));
      AnswerError(requests[i], err);
      continue;
    }
    for (size_t k = 0; k < elements.size(); ++k) elements[k] += read_elements[k];
    rows.push_back(read_rows);
    inputs.push_back(std::move(read));
    batch.push_back(requests[i]);
  }

  uint64_t compute_start = NowNs(), compute_end = compute_start;
  uint64_t rows_answered = 0;
  if (!batch.empty()) {
    std::vector<Outcome> outcomes(batch.size(), Outcome::kModelError);
    Gil gil;
    if (!crash_handlers_chained.load(std::memory_order_relaxed)) ChainCrashHandlers();
    compute_start = NowNs();
    PyObject* result = CallExecute(model, &inputs, rows, elements);
    compute_end = NowNs();
    if (result == nullptr || !AnswerAll(model, result, batch, rows, &outcomes)) {
      if (PyErr_Occurred()) Log(TRITONSERVER_LOG_ERROR, __LINE__, model.name + ": " + TakePythonError());
      for (size_t i = 0; i < batch.size(); ++i) {
        AnswerError(batch[i], TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                                    (model.name + ": internal error").c_str()));
        outcomes[i] = Outcome::kModelError;
      }
    }
    Py_XDECREF(result);
    for (size_t i = 0; i < batch.size(); ++i) {
      done.emplace_back(batch[i], outcomes[i]);
      rows_answered += static_cast<uint64_t>(rows[i]);
    }
  }
  const uint64_t exec_end = NowNs();
  double caller_errors = 0, model_errors = 0;
  for (auto& [request, outcome] : done) {
    caller_errors += outcome == Outcome::kCallerError;
    model_errors += outcome == Outcome::kModelError;
    TRITONBACKEND_ModelInstanceReportStatistics(triton_instance, request, outcome != Outcome::kModelError, exec_start,
                                                compute_start, compute_end, exec_end);
    TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  if (rows_answered > 0) {
    TRITONBACKEND_ModelInstanceReportBatchStatistics(triton_instance, rows_answered, exec_start, compute_start,
                                                     compute_end, exec_end);
  }
  AddToMetric(model.caller_errors, caller_errors);
  AddToMetric(model.model_errors, model_errors);
  SetMetric(started, 0);
  return nullptr;
}

}  // extern "C"
