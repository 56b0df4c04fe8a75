#pragma once
// llama.cpp/ggml log routing. The C callback never touches Python (it can fire on ggml worker
// threads while another thread waits on them with the GIL held); it only queues complete lines.
// `flush_logs` (module.cpp) forwards the queue to Python's `logging`; it runs with the GIL held
// after every binding that releases the GIL, and after `load_backends`.
#include <cstdint>
#include <string>
#include <vector>

namespace semif {

struct LogLine {
    int level;  // Python logging level (10 debug .. 40 error)
    std::string text;
};

void install_log_callback();
void uninstall_log_callback();
std::vector<LogLine> take_log_lines();
// Last error-level line seen, cleared by each call; lets exceptions say *why* a load failed.
std::string take_last_error();
// Lines are numbered as they are queued. A preempted or aborted llama_decode call (engine.cpp)
// logs its "failed to compute" errors like a real failure; they are expected there, so the
// engine drops the lines its own thread queued since its mark (those not yet forwarded), and
// puts the last error back as it was at the mark.
struct LogMark {
    uint64_t seq;
    std::string last_error;
};
LogMark log_mark();
void drop_log_lines_since(const LogMark& mark);

}  // namespace semif
