#include "logging.h"

#include <mutex>

#include "ggml.h"
#include "llama.h"

namespace semif {
namespace {

constexpr size_t kMaxQueuedLines = 4096;  // bounded: a chatty backend must not grow memory

std::mutex g_mutex;
std::vector<LogLine> g_lines;
std::string g_partial;
int g_partial_level = 20;
std::string g_last_error;

int to_python_level(ggml_log_level level, int previous) {
    switch (level) {
        case GGML_LOG_LEVEL_DEBUG: return 10;
        case GGML_LOG_LEVEL_INFO: return 20;
        case GGML_LOG_LEVEL_WARN: return 30;
        case GGML_LOG_LEVEL_ERROR: return 40;
        case GGML_LOG_LEVEL_CONT: return previous;
        default: return 20;
    }
}

void push_line(int level, std::string text) {
    if (text.empty()) return;
    if (level >= 40) g_last_error = text;
    if (g_lines.size() < kMaxQueuedLines) g_lines.push_back({level, std::move(text)});
}

void on_log(ggml_log_level level, const char* text, void* /*user_data*/) {
    if (text == nullptr) return;
    std::lock_guard<std::mutex> lock(g_mutex);
    int py_level = to_python_level(level, g_partial_level);
    if (level != GGML_LOG_LEVEL_CONT && !g_partial.empty()) {
        push_line(g_partial_level, std::move(g_partial));
        g_partial.clear();
    }
    g_partial_level = py_level;
    // llama.cpp emits fragments; only whole lines become log records.
    for (const char* p = text; *p != '\0'; ++p) {
        if (*p == '\n') {
            push_line(py_level, std::move(g_partial));
            g_partial.clear();
        } else {
            g_partial.push_back(*p);
        }
    }
}

void on_log_silent(ggml_log_level, const char*, void*) {}

}  // namespace

void install_log_callback() {
    llama_log_set(on_log, nullptr);
}

void uninstall_log_callback() {
    llama_log_set(on_log_silent, nullptr);
}

std::vector<LogLine> take_log_lines() {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::vector<LogLine> out;
    out.swap(g_lines);
    return out;
}

std::string take_last_error() {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::string out;
    out.swap(g_last_error);
    return out;
}

}  // namespace semif
