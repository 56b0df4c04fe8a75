// Python bindings. Every call that can run a forward pass or load weights releases the GIL;
// queued llama.cpp log lines are forwarded to Python logging once the GIL is held again.
#include <dlfcn.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "engine.h"
#include "ggml-backend.h"
#include "logging.h"

namespace py = pybind11;
using semif::Engine;
using semif::EngineConfig;
using semif::LlamaError;
using Tokens = std::vector<llama_token>;

#define SEMIF_STR2(x) #x
#define SEMIF_STR(x) SEMIF_STR2(x)

namespace {

void flush_logs() {
    auto lines = semif::take_log_lines();
    if (lines.empty()) return;
    py::object logger = py::module_::import("logging").attr("getLogger")("semif_proxy.llama");
    for (const auto& line : lines) logger.attr("log")(line.level, "%s", line.text);
}

// Runs fn without the GIL, then forwards logs, also when fn throws.
template <typename Fn>
auto unlocked(Fn&& fn) -> decltype(fn()) {
    struct Flush {
        ~Flush() {
            try {
                flush_logs();
            } catch (...) {  // logging must never turn a result into a crash
            }
        }
    } flush_on_exit;
    py::gil_scoped_release release;
    return fn();
}

py::dict stats_dict(const semif::ScoreStats& s) {
    py::dict d;
    d["prefix_tokens"] = s.prefix_tokens;
    d["prefix_reused"] = s.prefix_reused;
    d["suffix_tokens"] = s.suffix_tokens;
    d["decode_calls"] = s.decode_calls;
    d["padding_tokens"] = s.padding_tokens;
    d["prefill_seconds"] = s.prefill_seconds;
    d["suffix_seconds"] = s.suffix_seconds;
    return d;
}

// The folder of the libllama this process runs: where a GGML_BACKEND_DL build (the AWS
// llama.cpp images) keeps its loadable backends (libggml-cpu-*.so, libggml-cuda.so).
std::string libllama_dir() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&llama_backend_init), &info) == 0 || !info.dli_fname) {
        return "";
    }
    std::string path(info.dli_fname);
    const auto slash = path.find_last_of('/');
    return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

bool has_cpu_device() {
    return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU) != nullptr;
}

// Backends linked into ggml register themselves; a GGML_BACKEND_DL build registers none until
// they are loaded, and ggml's own search (the executable's folder, the working directory)
// finds nothing for /usr/bin/python3 started in /. Loads from `dir`, or from libllama's folder
// when no CPU device is registered yet; returns the folder searched ("" when none was needed).
std::string load_backends(const std::string& dir) {
    std::string where = dir;
    if (where.empty()) {
        if (has_cpu_device()) return "";
        where = libllama_dir();
    }
    if (!where.empty()) ggml_backend_load_all_from_path(where.c_str());
    return where;
}

py::list devices() {
    py::list out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(dev);
        py::dict d;
        d["name"] = ggml_backend_dev_name(dev);
        d["description"] = ggml_backend_dev_description(dev);
        d["type"] = type == GGML_BACKEND_DEVICE_TYPE_CPU    ? "cpu"
                    : type == GGML_BACKEND_DEVICE_TYPE_GPU  ? "gpu"
                    : type == GGML_BACKEND_DEVICE_TYPE_IGPU ? "igpu"
                                                            : "accel";
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        d["memory_free"] = free;
        d["memory_total"] = total;
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        d["backend"] = reg ? ggml_backend_reg_name(reg) : "";
        out.append(d);
    }
    return out;
}

semif::ScoreMode parse_mode(const std::string& mode) {
    if (mode == "copy") return semif::ScoreMode::kCopy;
    if (mode == "restore") return semif::ScoreMode::kRestore;
    throw LlamaError(semif::kBadArgument, "mode must be 'copy' or 'restore', not '" + mode + "'");
}

}  // namespace

PYBIND11_MODULE(_engine, m) {
    m.doc() = "Decision scoring over libllama (llama.cpp build " SEMIF_STR(SEMIF_LLAMA_BUILD_NUMBER) ")";
    semif::install_log_callback();
    m.attr("BACKEND_DIR") = load_backends("");
    llama_backend_init();

    static py::handle error_type = py::exception<LlamaError>(m, "LlamaError", PyExc_RuntimeError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const LlamaError& e) {
            py::object exc = error_type(e.what());
            exc.attr("code") = e.code();
            PyErr_SetObject(error_type.ptr(), exc.ptr());
        }
    });
    m.attr("ERR_LOAD_FAILED") = static_cast<int>(semif::kLoadFailed);
    m.attr("ERR_CONTEXT_OVERFLOW") = static_cast<int>(semif::kContextOverflow);
    m.attr("ERR_BAD_ARGUMENT") = static_cast<int>(semif::kBadArgument);
    m.attr("ERR_STATE_FAILED") = static_cast<int>(semif::kStateFailed);
    m.attr("ERR_ABORTED") = static_cast<int>(semif::kAborted);
    m.attr("LLAMA_BUILD_NUMBER") = SEMIF_LLAMA_BUILD_NUMBER;
    m.attr("LLAMA_BUILD_COMMIT") = SEMIF_LLAMA_BUILD_COMMIT;

    m.def("system_info", [] { return std::string(llama_print_system_info()); });
    m.def("supports_gpu_offload", [] { return llama_supports_gpu_offload(); });
    m.def("load_backends", [](const std::string& dir) {
              auto where = load_backends(dir);
              flush_logs();
              return where;
          }, py::arg("dir"),
          "Load ggml's loadable backends from a folder (GGML_BACKEND_DL builds).");
    m.def("devices", &devices, "The ggml devices registered in this process.");

    py::class_<Engine>(m, "Engine")
        .def(py::init([](const std::string& model_path, int32_t n_ctx, int32_t n_threads,
                         int32_t n_gpu_layers, int32_t n_seq, int32_t n_batch, int32_t flash_attn,
                         int32_t n_ubatch, bool repack) {
                 EngineConfig cfg{model_path, n_ctx,   n_threads,  n_gpu_layers,
                                  n_seq,      n_batch, flash_attn, n_ubatch, repack};
                 return unlocked([&] { return new Engine(cfg); });
             }),
             py::arg("model_path"), py::arg("n_ctx") = 4096, py::arg("n_threads") = 0,
             py::arg("n_gpu_layers") = 0, py::arg("n_seq") = 8, py::arg("n_batch") = 2048,
             py::arg("flash_attn") = 0, py::arg("n_ubatch") = 512, py::arg("repack") = true)
        .def_property_readonly("n_vocab", &Engine::n_vocab)
        .def_property_readonly("n_ctx", &Engine::n_ctx)
        .def_property_readonly("n_threads", &Engine::n_threads)
        .def_property_readonly("n_ubatch", &Engine::n_ubatch)
        .def_property_readonly("cell_align", &Engine::cell_align)
        .def_property_readonly("n_gpu_layers", [](const Engine& e) { return e.config().n_gpu_layers; })
        .def_property_readonly("model_path", [](const Engine& e) { return e.config().model_path; })
        .def_property_readonly("bos", &Engine::bos)
        .def_property_readonly("eos", &Engine::eos)
        .def_property_readonly("add_bos", &Engine::add_bos)
        .def_property_readonly("chat_template", [](const Engine& e) -> py::object {
            std::string t = e.chat_template();
            if (t.empty()) return py::none();
            return py::str(t);
        })
        .def_property_readonly("metadata", &Engine::metadata)
        .def_property_readonly("tokens_evaluated", &Engine::tokens_evaluated)
        .def("special_tokens", &Engine::special_tokens)
        .def("tokenize", &Engine::tokenize, py::arg("text"), py::arg("add_special") = false,
             py::arg("parse_special") = true)
        .def("detokenize", &Engine::detokenize, py::arg("tokens"), py::arg("special") = true)
        .def("token_piece", [](const Engine& e, llama_token t, bool special) {
                 return py::bytes(e.token_piece(t, special));
             }, py::arg("token"), py::arg("special") = true)
        .def("score",
             [](Engine& e, const Tokens& prefix, const std::vector<Tokens>& suffixes,
                const Tokens& ids, const std::string& mode, const std::vector<int32_t>& outputs) {
                 const auto parsed = parse_mode(mode);
                 auto r =
                     unlocked([&] { return e.score(prefix, suffixes, ids, parsed, outputs); });
                 py::array_t<float> logits({r.n_rows, r.n_ids});
                 std::copy(r.logits.begin(), r.logits.end(), logits.mutable_data());
                 py::array_t<double> lse(r.n_rows);
                 std::copy(r.logsumexp.begin(), r.logsumexp.end(), lse.mutable_data());
                 return py::make_tuple(logits, lse, stats_dict(r.stats));
             },
             py::arg("prefix"), py::arg("suffixes"), py::arg("ids"), py::arg("mode") = "copy",
             py::arg("outputs") = std::vector<int32_t>{},
             "Logits of `ids` at the last position of prefix + each suffix (or at its last "
             "outputs[i] positions: rows in order, suffix after suffix), the full-vocabulary "
             "logsumexp there, and timing stats. In restore mode the prefix may be empty when "
             "no suffix is: each suffix is then evaluated in one piece.")
        .def("score_tree",
             [](Engine& e, const Tokens& prefix, const Tokens& suffix, const Tokens& tokens,
                const std::vector<int32_t>& parent, const std::vector<Tokens>& ids,
                const Tokens& root_ids) {
                 semif::TokenTree tree{tokens, parent, ids, root_ids};
                 auto r = unlocked([&] { return e.score_tree(prefix, suffix, tree); });
                 py::array_t<float> root(static_cast<py::ssize_t>(r.root_logits.size()));
                 std::copy(r.root_logits.begin(), r.root_logits.end(), root.mutable_data());
                 py::list nodes;
                 for (const auto& row : r.node_logits) {
                     py::array_t<float> a(static_cast<py::ssize_t>(row.size()));
                     std::copy(row.begin(), row.end(), a.mutable_data());
                     nodes.append(a);
                 }
                 py::array_t<double> lse(static_cast<py::ssize_t>(r.node_logsumexp.size()));
                 std::copy(r.node_logsumexp.begin(), r.node_logsumexp.end(), lse.mutable_data());
                 return py::make_tuple(root, r.root_logsumexp, nodes, lse, stats_dict(r.stats));
             },
             py::arg("prefix"), py::arg("suffix"), py::arg("tokens"), py::arg("parent"),
             py::arg("ids"), py::arg("root_ids"),
             "Logits of root_ids at the last position of prefix + suffix (evaluated as score() "
             "does in restore mode) and of ids[i] at each tree node i, with the "
             "full-vocabulary logsumexp at each.")
        .def("generate",
             [](Engine& e, const Tokens& prompt, int32_t max_tokens, const Tokens& stop_ids,
                size_t held) {
                 auto r = unlocked([&] { return e.generate(prompt, max_tokens, stop_ids, held); });
                 return py::make_tuple(r.tokens, r.stop, stats_dict(r.stats));
             },
             py::arg("prompt"), py::arg("max_tokens"), py::arg("stop_ids") = Tokens{},
             py::arg("held") = 0,
             "Greedy tokens after the prompt (argmax over the vocabulary), at most max_tokens, "
             "ended by an end-of-generation token or a stop id; the token that ended them (-1: "
             "the budget) and timing stats. Sequence 0 holds the prompt afterwards, or with "
             "held > 0 (a multiple of cell_align, shorter than the prompt) its first held "
             "tokens: the prefix that prompts sharing it reuse.")
        .def("get_prefix_state", [](Engine& e) {
                 // Written straight into a new bytes object: one copy, made without the GIL.
                 const size_t size = unlocked([&] { return e.prefix_state_size(); });
                 py::bytes out = py::reinterpret_steal<py::bytes>(
                     PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size)));
                 if (!out) throw py::error_already_set();
                 char* dst = PyBytes_AS_STRING(out.ptr());
                 const size_t written = unlocked([&] {
                     return e.copy_prefix_state(reinterpret_cast<uint8_t*>(dst), size);
                 });
                 if (written != size) return py::bytes(dst, written);  // not seen; a copy then
                 return out;
             })
        .def("get_prefix_logits", [](const Engine& e) {
                 const auto& v = e.prefix_logits();
                 py::array_t<float> out(static_cast<py::ssize_t>(v.size()));
                 std::copy(v.begin(), v.end(), out.mutable_data());
                 return out;
             }, "Full-vocabulary logits at the last position of the prefix in sequence 0; empty when "
             "that prefix was evaluated together with its first question (score in restore "
             "mode, score_tree's suffix).")
        .def("set_prefix_state",
             [](Engine& e, const py::bytes& data, const Tokens& tokens,
                const py::array_t<float, py::array::c_style | py::array::forcecast>& logits) {
                 // Read in place: `data` is immutable and held by the caller for the call.
                 char* ptr = nullptr;
                 Py_ssize_t size = 0;
                 if (PyBytes_AsStringAndSize(data.ptr(), &ptr, &size) != 0) {
                     throw py::error_already_set();
                 }
                 std::vector<float> row(logits.data(), logits.data() + logits.size());
                 unlocked([&] {
                     e.set_prefix_state(reinterpret_cast<const uint8_t*>(ptr),
                                        static_cast<size_t>(size), tokens, row);
                 });
             },
             py::arg("data"), py::arg("tokens"), py::arg("logits"),
             "Put a saved prefix (state bytes, its tokens, its last-position logits or an empty "
             "array) back into sequence 0.")
        .def_property_readonly("prefix_tokens", &Engine::prefix_tokens)
        .def("reset", [](Engine& e) { unlocked([&] { e.reset(); }); })
        .def("abort", &Engine::request_abort,
             "Stop the work in progress (any thread; never waits on the job).")
        .def("clear_abort", &Engine::clear_abort, "Let the next job run.")
        .def("set_threads", &Engine::set_threads, py::arg("n"),
             "Threads for the next llama_decode call, 0 for the configured count (any thread); "
             "a lower count preempts the call in progress, which runs again on it.")
        .def_property_readonly("preempts", &Engine::preempts,
                               "llama_decode calls preempted by a lower thread count, run again.")
        .def_property_readonly("threads_now", &Engine::threads_now,
                               "Threads of the llama_decode call in progress; 0 when none.");

    py::module_::import("atexit").attr("register")(py::cpp_function([] {
        semif::uninstall_log_callback();
    }));
}
