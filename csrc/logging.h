#pragma once
// llama.cpp/ggml log routing. The C callback never touches Python (it can fire on ggml worker
// threads while another thread waits on them with the GIL held); it only queues complete lines.
// `flush_logs` (module.cpp) forwards the queue to Python's `logging`; it runs with the GIL held
// after every binding that releases the GIL, and after `load_backends`.
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

}  // namespace semif
