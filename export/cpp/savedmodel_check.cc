// savedmodel_check: loads a SavedModel the way TF Serving does and runs every signature.
//
// TF Serving's servables are `tensorflow::SavedModelBundle`s made by `tensorflow::LoadSavedModel` (tag
// "serve"), then called with `Session::Run` on the tensor names of a SignatureDef. This program does the
// same with the libraries of the tensorflow pip wheel, so an export that works here works in the model
// server's loader (and one that only loads in Python, e.g. tensorflow/serving#2226, fails here).
//
// Usage:
//   savedmodel_check --export_dir DIR [--op_library LIB.so]... [--request FILE] [--output_dir DIR]
//                    [--sentence TEXT]... [--tag serve]
//
//   --op_library  loads a custom-op library first (TF_LoadLibrary, as tf.load_op_library does), e.g.
//                 tensorflow_text/python/ops/_unicode_script_tokenizer.so for a unicode_script export.
//   --request     runs the requests of FILE (format below); outputs go to OUTPUT_DIR/<label>/<key>.npy.
//   --sentence    feeds the sentences as the single rank-1 string input of every signature that has one
//                 (`default`, `serving_default`) and prints a summary of each output.
//
// After loading, every signature is warmed up with a synthetic input (unknown dims = 1, strings "a",
// numbers 1): a missing op or kernel fails only at the first Run, so it must fail here.
//
// Request file: blocks of
//   run <label> <signature key>
//   input <key> <dtype: string|int32|int64|float32|bool> <rank> <dim>...
//   <values: numbers separated by whitespace; a string is "<byte count>:<bytes>" followed by a newline>
//   ... more input lines ...
//   end
// Exit status: 0 when everything loaded and ran, 1 otherwise (the message says which step failed).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tensorflow/c/c_api.h"
#include "tensorflow/cc/saved_model/loader.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.pb.h"
#include "tensorflow/core/protobuf/meta_graph.pb.h"
#include "tensorflow/core/public/session.h"

namespace {

using tensorflow::DataType;
using tensorflow::Tensor;
using tensorflow::TensorShape;

constexpr char kServeTag[] = "serve";  // tag_constants.h is not in the wheel

struct Options {
  std::string export_dir;
  std::vector<std::string> op_libraries;
  std::string request;
  std::string output_dir;
  std::vector<std::string> sentences;
  std::string tag = kServeTag;
};

struct Run {
  std::string label;
  std::string signature;
  std::vector<std::pair<std::string, Tensor>> inputs;  // by signature input key
};

[[noreturn]] void Fail(const std::string& message) {
  std::cerr << "savedmodel_check: error: " << message << std::endl;
  std::exit(1);
}

void Usage() {
  std::cerr << "usage: savedmodel_check --export_dir DIR [--op_library LIB.so]... [--request FILE] "
               "[--output_dir DIR] [--sentence TEXT]... [--tag serve]\n";
}

Options ParseArgs(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      Usage();
      std::exit(0);
    }
    if (i + 1 >= argc) {
      Usage();
      Fail("flag " + flag + " needs a value");
    }
    std::string value = argv[++i];
    if (flag == "--export_dir") {
      options.export_dir = value;
    } else if (flag == "--op_library") {
      options.op_libraries.push_back(value);
    } else if (flag == "--request") {
      options.request = value;
    } else if (flag == "--output_dir") {
      options.output_dir = value;
    } else if (flag == "--sentence") {
      options.sentences.push_back(value);
    } else if (flag == "--tag") {
      options.tag = value;
    } else {
      Usage();
      Fail("unknown flag " + flag);
    }
  }
  if (options.export_dir.empty()) {
    Usage();
    Fail("--export_dir is required");
  }
  if (!options.request.empty() && options.output_dir.empty()) Fail("--request needs --output_dir");
  return options;
}

DataType ParseDtype(const std::string& name) {
  if (name == "string") return tensorflow::DT_STRING;
  if (name == "int32") return tensorflow::DT_INT32;
  if (name == "int64") return tensorflow::DT_INT64;
  if (name == "float32") return tensorflow::DT_FLOAT;
  if (name == "bool") return tensorflow::DT_BOOL;
  Fail("unsupported dtype '" + name + "' in request (string, int32, int64, float32, bool)");
}

std::string ReadString(std::istream& in) {
  int64_t size = -1;
  in >> size;
  if (!in || size < 0 || in.get() != ':') Fail("malformed string value in request: expected '<count>:<bytes>'");
  std::string value(static_cast<size_t>(size), '\0');
  in.read(value.data(), size);
  if (!in) Fail("request ended inside a string value");
  return value;
}

template <typename T>
void ReadNumbers(std::istream& in, Tensor* tensor) {
  auto flat = tensor->flat<T>();
  for (int64_t k = 0; k < flat.size(); ++k) {
    double value;
    if (!(in >> value)) Fail("request ended or is malformed inside a numeric tensor");
    flat(k) = static_cast<T>(value);
  }
}

Tensor ReadTensor(std::istream& in, const std::string& header) {
  std::istringstream words(header);
  std::string keyword, key, dtype_name;
  int rank = -1;
  words >> keyword >> key >> dtype_name >> rank;
  if (!words || rank < 0) Fail("malformed input line in request: '" + header + "'");
  TensorShape shape;
  for (int d = 0; d < rank; ++d) {
    int64_t dim = -1;
    if (!(words >> dim) || dim < 0) Fail("malformed shape in request line: '" + header + "'");
    shape.AddDim(dim);
  }
  DataType dtype = ParseDtype(dtype_name);
  Tensor tensor(dtype, shape);
  switch (dtype) {
    case tensorflow::DT_STRING: {
      auto flat = tensor.flat<tensorflow::tstring>();
      for (int64_t k = 0; k < flat.size(); ++k) flat(k) = ReadString(in);
      break;
    }
    case tensorflow::DT_INT32: ReadNumbers<int32_t>(in, &tensor); break;
    case tensorflow::DT_INT64: ReadNumbers<int64_t>(in, &tensor); break;
    case tensorflow::DT_FLOAT: ReadNumbers<float>(in, &tensor); break;
    case tensorflow::DT_BOOL: ReadNumbers<bool>(in, &tensor); break;
    default: Fail("unsupported dtype");
  }
  return tensor;
}

std::vector<Run> ReadRequests(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail("cannot open request file " + path);
  std::vector<Run> runs;
  std::string line;
  Run* current = nullptr;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream words(line);
    std::string keyword;
    words >> keyword;
    if (keyword == "run") {
      runs.emplace_back();
      current = &runs.back();
      words >> current->label >> current->signature;
      if (current->signature.empty()) Fail("malformed run line in request: '" + line + "'");
    } else if (keyword == "input") {
      if (current == nullptr) Fail("input line before any run line in request");
      std::string key;
      words >> key;
      current->inputs.emplace_back(key, ReadTensor(in, line));
    } else if (keyword == "end") {
      current = nullptr;
    } else {
      Fail("unknown line in request: '" + line + "'");
    }
  }
  return runs;
}

// .npy writer (format version 1.0), C order.
void WriteNpy(const std::string& path, const Tensor& tensor) {
  std::string descr;
  switch (tensor.dtype()) {
    case tensorflow::DT_FLOAT: descr = "<f4"; break;
    case tensorflow::DT_DOUBLE: descr = "<f8"; break;
    case tensorflow::DT_INT32: descr = "<i4"; break;
    case tensorflow::DT_INT64: descr = "<i8"; break;
    case tensorflow::DT_BOOL: descr = "|b1"; break;
    default:
      std::cerr << "  (not written: dtype " << tensorflow::DataTypeString(tensor.dtype()) << ")\n";
      return;
  }
  std::string shape = "(";
  for (int d = 0; d < tensor.dims(); ++d) shape += std::to_string(tensor.dim_size(d)) + ",";
  shape += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::ofstream out(path, std::ios::binary);
  if (!out) Fail("cannot write " + path);
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t header_len = static_cast<uint16_t>(header.size());
  out.put(static_cast<char>(header_len & 0xff));
  out.put(static_cast<char>(header_len >> 8));
  out << header;
  auto data = tensor.tensor_data();
  out.write(data.data(), data.size());
  if (!out) Fail("cannot write " + path);
}

std::string ShapeString(const Tensor& t) { return t.shape().DebugString(); }

void PrintSummary(const std::string& key, const Tensor& t) {
  std::cout << "  " << key << " " << tensorflow::DataTypeString(t.dtype()) << " " << ShapeString(t);
  if (t.dtype() == tensorflow::DT_FLOAT && t.NumElements() > 0) {
    auto flat = t.flat<float>();
    double sum = 0;
    for (int64_t k = 0; k < flat.size(); ++k) sum += flat(k);
    std::cout << " sum=" << sum << " first=" << flat(0);
  } else if (t.dtype() == tensorflow::DT_INT32 && t.NumElements() > 0) {
    auto flat = t.flat<int32_t>();
    std::cout << " values=";
    for (int64_t k = 0; k < flat.size() && k < 16; ++k) std::cout << (k ? "," : "") << flat(k);
  }
  std::cout << "\n";
}

// Runs a signature: inputs by signature key -> outputs by signature key (sorted).
std::map<std::string, Tensor> RunSignature(tensorflow::Session* session, const std::string& name,
                                           const tensorflow::SignatureDef& signature,
                                           const std::vector<std::pair<std::string, Tensor>>& inputs) {
  std::vector<std::pair<std::string, Tensor>> feeds;
  for (const auto& [key, tensor] : inputs) {
    auto found = signature.inputs().find(key);
    if (found == signature.inputs().end()) Fail("signature '" + name + "' has no input '" + key + "'");
    feeds.emplace_back(found->second.name(), tensor);
  }
  std::vector<std::string> keys, fetches;
  for (const auto& [key, info] : signature.outputs()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  for (const auto& key : keys) fetches.push_back(signature.outputs().at(key).name());
  std::vector<Tensor> outputs;
  absl::Status status = session->Run(feeds, fetches, {}, &outputs);
  if (!status.ok()) Fail("Session::Run of signature '" + name + "' failed: " + status.ToString());
  std::map<std::string, Tensor> result;
  for (size_t k = 0; k < keys.size(); ++k) result[keys[k]] = outputs[k];
  return result;
}

Tensor SyntheticInput(const tensorflow::TensorInfo& info) {
  TensorShape shape;
  if (!info.tensor_shape().unknown_rank()) {
    for (const auto& dim : info.tensor_shape().dim()) shape.AddDim(dim.size() < 0 ? 1 : dim.size());
  }
  Tensor tensor(info.dtype(), shape);
  switch (info.dtype()) {
    case tensorflow::DT_STRING: tensor.flat<tensorflow::tstring>().setConstant("a"); break;
    case tensorflow::DT_INT32: tensor.flat<int32_t>().setConstant(1); break;
    case tensorflow::DT_INT64: tensor.flat<int64_t>().setConstant(1); break;
    case tensorflow::DT_FLOAT: tensor.flat<float>().setConstant(1.0f); break;
    case tensorflow::DT_BOOL: tensor.flat<bool>().setConstant(true); break;
    default: Fail("cannot warm up an input of dtype " + tensorflow::DataTypeString(info.dtype()));
  }
  return tensor;
}

bool IsServingSignature(const std::string& key) { return key.rfind("__", 0) != 0; }  // skips __saved_model_init_op

}  // namespace

int main(int argc, char** argv) {
  Options options = ParseArgs(argc, argv);

  for (const auto& library : options.op_libraries) {
    TF_Status* status = TF_NewStatus();
    TF_Library* handle = TF_LoadLibrary(library.c_str(), status);
    if (TF_GetCode(status) != TF_OK) Fail("cannot load op library " + library + ": " + TF_Message(status));
    TF_DeleteStatus(status);
    (void)handle;  // kept loaded for the life of the process
    std::cout << "loaded op library " << library << "\n";
  }

  tensorflow::SessionOptions session_options;
  tensorflow::RunOptions run_options;
  tensorflow::SavedModelBundle bundle;
  absl::Status status = tensorflow::LoadSavedModel(session_options, run_options, options.export_dir,
                                                   {options.tag}, &bundle);
  if (!status.ok()) Fail("LoadSavedModel(" + options.export_dir + ") failed: " + status.ToString());
  std::cout << "loaded " << options.export_dir << " (tag " << options.tag << ")\n";

  const auto& signatures = bundle.GetSignatures();
  std::vector<std::string> names;
  for (const auto& [key, def] : signatures) {
    if (IsServingSignature(key)) names.push_back(key);
  }
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    const auto& def = signatures.at(name);
    std::cout << "signature " << name << " (" << def.method_name() << ")\n";
    std::vector<std::string> keys;
    for (const auto& [key, info] : def.inputs()) keys.push_back(key);
    std::sort(keys.begin(), keys.end());
    for (const auto& key : keys) {
      const auto& info = def.inputs().at(key);
      std::cout << "  input " << key << " " << tensorflow::DataTypeString(info.dtype()) << " "
                << tensorflow::PartialTensorShape(info.tensor_shape()).DebugString() << " <- " << info.name() << "\n";
    }
    keys.clear();
    for (const auto& [key, info] : def.outputs()) keys.push_back(key);
    std::sort(keys.begin(), keys.end());
    for (const auto& key : keys) {
      const auto& info = def.outputs().at(key);
      std::cout << "  output " << key << " " << tensorflow::DataTypeString(info.dtype()) << " "
                << tensorflow::PartialTensorShape(info.tensor_shape()).DebugString() << " <- " << info.name() << "\n";
    }
  }
  if (names.empty()) Fail("the SavedModel has no signatures");

  // Warm-up: every signature runs once before any request (as TF Serving's warmup does).
  for (const auto& name : names) {
    const auto& def = signatures.at(name);
    std::vector<std::pair<std::string, Tensor>> inputs;
    for (const auto& [key, info] : def.inputs()) inputs.emplace_back(key, SyntheticInput(info));
    auto outputs = RunSignature(bundle.GetSession(), name, def, inputs);
    std::cout << "warmup " << name << ": ok (" << outputs.size() << " outputs)\n";
  }

  if (!options.sentences.empty()) {
    Tensor sentences(tensorflow::DT_STRING, TensorShape({static_cast<int64_t>(options.sentences.size())}));
    for (size_t k = 0; k < options.sentences.size(); ++k) sentences.flat<tensorflow::tstring>()(k) = options.sentences[k];
    for (const auto& name : names) {
      const auto& def = signatures.at(name);
      if (def.inputs().size() != 1) continue;
      const auto& [key, info] = *def.inputs().begin();
      if (info.dtype() != tensorflow::DT_STRING || info.tensor_shape().dim_size() != 1) continue;
      std::cout << "run " << name << " on " << options.sentences.size() << " sentence(s)\n";
      for (const auto& [out_key, tensor] : RunSignature(bundle.GetSession(), name, def, {{key, sentences}})) {
        PrintSummary(out_key, tensor);
      }
    }
  }

  if (!options.request.empty()) {
    mkdir(options.output_dir.c_str(), 0755);
    for (const auto& run : ReadRequests(options.request)) {
      auto found = signatures.find(run.signature);
      if (found == signatures.end()) Fail("request '" + run.label + "': no signature '" + run.signature + "'");
      auto outputs = RunSignature(bundle.GetSession(), run.signature, found->second, run.inputs);
      std::string dir = options.output_dir + "/" + run.label;
      mkdir(dir.c_str(), 0755);
      std::cout << "run " << run.label << " (" << run.signature << ")\n";
      for (const auto& [key, tensor] : outputs) {
        PrintSummary(key, tensor);
        WriteNpy(dir + "/" + key + ".npy", tensor);
      }
    }
  }
  std::cout << "ok\n";
  return 0;
}
