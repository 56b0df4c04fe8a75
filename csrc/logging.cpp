#include "logging.h"

#include <mutex>
#include <thread>

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
uint64_t g_last_error_seq = 0;
std::thread::id g_last_error_thread;
uint64_t g_next_seq = 0;  // the number the next queued line gets
struct Origin {
    uint64_t seq;
    std::thread::id thread;
};
std::vector<Origin> g_origins;  // the queued lines' numbers and threads, beside g_lines

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
    const uint64_t seq = g_next_seq++;
    if (level >= 40) {
        g_last_error = text;
        g_last_error_seq = seq;
        g_last_error_thread = std::this_thread::get_id();
    }
    if (g_lines.size() < kMaxQueuedLines) {
        g_lines.push_back({level, std::move(text)});
        g_origins.push_back({seq, std::this_thread::get_id()});
    }
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
    g_origins.clear();
    return out;
}

LogMark log_mark() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return {g_next_seq, g_last_error};
}

void drop_log_lines_since(const LogMark& mark) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto self = std::this_thread::get_id();
    size_t kept = 0;
    for (size_t i = 0; i < g_lines.size(); ++i) {
        if (g_origins[i].seq >= mark.seq && g_origins[i].thread == self) continue;
        if (kept != i) {
            g_lines[kept] = std::move(g_lines[i]);
            g_origins[kept] = g_origins[i];
        }
        ++kept;
    }
    g_lines.resize(kept);
    g_origins.resize(kept);
    if (g_last_error_seq >= mark.seq && g_last_error_thread == self) {
        g_last_error = mark.last_error;
    }
}

std::string take_last_error() {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::string out;
    out.swap(g_last_error);
    return out;
}

}  // namespace semif
