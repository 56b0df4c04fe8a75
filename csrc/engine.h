#pragma once
// The decision engine: one llama.cpp model + context, used by one thread at a time (a mutex
// serialises callers; the Python layer runs it in a single worker thread anyway).
//
// Sequence 0 holds the most recently evaluated prefix (usually with its last-position logits),
// so the same prefix asked again is reused, not re-evaluated. score() decodes each suffix after
// it in one of two modes (ScoreMode):
// - kRestore ("restore", the CPU path): one suffix at a time on sequence 0 itself, right after
//   the prefix's cells; llama_memory_seq_rm then removes the suffix's cells, so the next suffix
//   sits exactly where the previous one did, where a one-piece evaluation of its prompt puts it.
//   A prefix not held yet is decoded together with its first suffix (ensure_prefix): that is
//   the one-piece evaluation itself, one stream of ubatches; the prefix's logits are then not
//   computed.
// - kCopy ("copy", with GPU offload): the prefix is shared with branch sequences 1..n_seq-2
//   (cheap with a unified KV cache: cells are shared) and the suffixes are decoded side by side,
//   each starting on an aligned cell, in as few llama_decode calls as the context allows.
// Sequence n_seq-1 only holds the filler cells that keep branch starts aligned (see
// decode_branches); nothing attends to them and they are removed after every call.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "raii.h"

namespace semif {

// Codes below zero are ours; zero or positive ones are llama_decode's own return codes.
enum ErrorCode : int {
    kLoadFailed = -100,
    kContextFailed = -101,
    kContextOverflow = -102,
    kBadArgument = -103,
    kStateFailed = -104,
    kTokenizeFailed = -105,
    kAborted = -106,
};

class LlamaError : public std::runtime_error {
public:
    LlamaError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
    int code() const { return code_; }

private:
    int code_;
};

struct EngineConfig {
    std::string model_path;
    int32_t n_ctx = 4096;
    int32_t n_threads = 0;  // 0: llama.cpp's default
    int32_t n_gpu_layers = 0;
    int32_t n_seq = 8;      // 0: the prefix; 1..n_seq-2: parallel branches; n_seq-1: filler
    int32_t n_batch = 2048;
    // llama_flash_attn_type; off by default: the CPU flash-attention kernels change their
    // accumulation with the batch shape, which would make results depend on batching.
    int32_t flash_attn = 0;
    // Tokens per llama_decode call (capped by n_batch). On the CPU a small one bounds the work
    // a preemption throws away (set_threads), and a chat's wait where there is none. CPU
    // results do not depend on it (tested).
    int32_t n_ubatch = 512;
    // Weight repacking (llama_model_params.use_extra_bufts, llama-server's --repack): the CPU
    // backend copies the weights it has interleaved kernels for into a private buffer of this
    // process; off, they stay in the mmap'ed file, one copy shared by every process.
    bool repack = true;
};

// How score() places the suffixes (see the comment at the top of this file).
enum class ScoreMode { kCopy, kRestore };

struct ScoreStats {
    int32_t prefix_tokens = 0;
    int32_t prefix_reused = 0;     // prefix found already evaluated in sequence 0 (all or none)
    int32_t suffix_tokens = 0;
    int32_t padding_tokens = 0;  // filler that keeps branch cells aligned (see decode_branches)
    int32_t decode_calls = 0;
    double prefill_seconds = 0.0;
    double suffix_seconds = 0.0;  // with a call shared by the prefix's end and a suffix
};

struct ScoreResult {
    int32_t n_rows = 0;
    int32_t n_ids = 0;
    std::vector<float> logits;  // n_rows x n_ids, row-major
    std::vector<double> logsumexp;  // per row, over the full vocabulary
    ScoreStats stats;
};

// A tree of label tokens scored after prefix + suffix (see Engine::score_tree). Node i is one
// token; parent[i] is an earlier node or -1 (the node follows the suffix directly). ids[i] are
// the tokens whose logits are read at node i's position, root_ids those read at the suffix's
// last position.
struct TokenTree {
    std::vector<llama_token> tokens;
    std::vector<int32_t> parent;
    std::vector<std::vector<llama_token>> ids;
    std::vector<llama_token> root_ids;
};

struct TreeResult {
    std::vector<float> root_logits;  // root_ids' logits at the suffix's last position
    double root_logsumexp = 0.0;
    std::vector<std::vector<float>> node_logits;  // per node, ids[i]'s logits
    std::vector<double> node_logsumexp;
    ScoreStats stats;
};

// Engine::generate: the greedy tokens and why they ended.
struct GenerateResult {
    std::vector<llama_token> tokens;  // generated, the token that stopped them excluded
    llama_token stop = -1;  // the end-of-generation or stop token that ended them; -1: budget
    ScoreStats stats;  // prefill: the held prefix; suffix: the prompt's rest and the generation
};

// Branch suffixes start on KV cells that are multiples of this (see decode_branches): the
// widest summation block of the CPU attention kernels in this build (8, 32 or 64).
size_t attention_cell_align();

class Engine {
public:
    explicit Engine(const EngineConfig& config);

    int32_t n_vocab() const { return n_vocab_; }
    int32_t n_ctx() const { return n_ctx_; }
    int32_t n_threads() const { return n_threads_; }
    int32_t n_ubatch() const { return n_ubatch_; }
    int32_t cell_align() const { return static_cast<int32_t>(cell_align_); }
    const EngineConfig& config() const { return config_; }
    llama_token bos() const;
    llama_token eos() const;
    bool add_bos() const;
    std::string chat_template() const;  // empty when the GGUF has none
    std::map<std::string, std::string> metadata() const;
    std::vector<llama_token> special_tokens() const;  // control + user-defined
    uint64_t tokens_evaluated() const { return tokens_evaluated_; }

    std::vector<llama_token> tokenize(const std::string& text, bool add_special,
                                      bool parse_special) const;
    std::string detokenize(const std::vector<llama_token>& tokens, bool special) const;
    std::string token_piece(llama_token token, bool special) const;

    // Logits of `ids` after prefix + each suffix: at its last position, or at its last
    // outputs[i] positions (rows in order, suffix after suffix; empty `outputs`: one each).
    // In restore mode the prefix may be empty when no suffix is: each suffix is then a
    // one-piece evaluation of its own.
    ScoreResult score(const std::vector<llama_token>& prefix,
                      const std::vector<std::vector<llama_token>>& suffixes,
                      const std::vector<llama_token>& ids, ScoreMode mode,
                      const std::vector<int32_t>& outputs = {});
    // prefix + suffix evaluated as score() does in restore mode (the suffix on sequence 0, so
    // the root row equals a one-piece evaluation of the prompt), then every node of the tree
    // in shared batches: a node's token belongs to the branch sequence of each tree leaf below
    // it, so it attends to the prompt and its own ancestors only.
    TreeResult score_tree(const std::vector<llama_token>& prefix,
                          const std::vector<llama_token>& suffix, const TokenTree& tree);

    // Greedy generation after the prompt (the deliberate readout): one token per llama_decode,
    // each the argmax over the whole vocabulary, until an end-of-generation token, a stop id or
    // max_tokens tokens. held = 0: the prompt is evaluated on sequence 0 with its last-position
    // logits (reused when sequence 0 holds exactly it) and stays held afterwards, with its
    // logits. 0 < held < prompt.size() (a multiple of cell_align): only the prompt's first
    // `held` tokens are the prefix, evaluated (or reused) as score() evaluates a prefix in
    // restore mode, the rest decoded after it as a restored branch; those tokens stay held
    // afterwards, so prompts that share them (a question's option orders) evaluate them once.
    // Either way the prompt's last row is its one-piece evaluation's (the aligned split, see
    // decode_branches) and the generated tokens' cells are removed again.
    // Honours the abort flag like score() (between tokens and inside each decode).
    GenerateResult generate(const std::vector<llama_token>& prompt, int32_t max_tokens,
                            const std::vector<llama_token>& stop_ids, size_t held = 0);

    // The state of sequence 0 (the current prefix): its size, then the bytes into a buffer the
    // caller owns (Python allocates it once, as the bytes object it keeps).
    size_t prefix_state_size();
    size_t copy_prefix_state(uint8_t* dst, size_t capacity);
    std::vector<llama_token> prefix_tokens() const { return seq0_; }
    const std::vector<float>& prefix_logits() const { return prefix_logits_; }
    void set_prefix_state(const uint8_t* data, size_t size, const std::vector<llama_token>& tokens,
                          const std::vector<float>& logits);
    void reset();

    // Stop the work in progress at the next graph node or decode (any thread, no lock): the
    // call in progress throws kAborted and the engine holds no prefix afterwards. The flag
    // stays set until clear_abort(), so a caller that owns the engine decides when the next
    // job may start.
    void request_abort();
    void clear_abort() { abort_.store(false, std::memory_order_relaxed); }

    // Sharing the cores with a llama-server that runs at the same time (any thread): the
    // thread count for the next llama_decode call (0: the configured n_threads). Every
    // llama_decode call holds one ubatch (prefix, option suffixes, labels). A lower count
    // preempts the ubatch in progress at its next graph node, which is taken back and
    // evaluated again on the new count (so the cores are free within milliseconds; not on
    // sliding-window or recurrent models, see the constructor); a higher one applies from the
    // next ubatch. Results do not depend on it (each output element is computed whole by one
    // thread; tested).
    void set_threads(int32_t n) { threads_wanted_.store(n, std::memory_order_seq_cst); }
    // How many ubatches were preempted by a lower thread count and evaluated again.
    uint64_t preempts() const { return preempts_.load(std::memory_order_relaxed); }
    // The thread count of the llama_decode call in progress; 0 when none runs.
    int32_t threads_now() const { return threads_now_.load(std::memory_order_seq_cst); }

private:
    struct Branch {
        llama_seq_id seq;
        const std::vector<llama_token>* tokens;
        size_t n_out;  // rows read: at the last n_out positions (1: the last one only)
    };
    using LogitsSink = std::function<void(size_t branch, size_t token_index, const float* row)>;

    static bool abort_requested(void* self);
    bool preempted() const;
    void take_back(const Batch& batch);
    void check_abort();
    void check_token_ids(const std::vector<llama_token>& tokens, const char* what) const;
    void check_fits(size_t prefix, size_t suffix, size_t n_branches) const;
    // (token index in the question, its row)
    using RowSink = std::function<void(size_t token_index, const float* row)>;
    // The prefix in sequence 0, evaluated unless held (`need_logits`: with its own logits).
    // With a question, may evaluate it in the prefix's ubatches (see there): then returns true,
    // the rows at the question's last `question_rows` positions went to on_question and its
    // cells follow the prefix's in sequence 0.
    bool ensure_prefix(const std::vector<llama_token>& prefix, ScoreStats& stats,
                       bool need_logits = true, const std::vector<llama_token>* question = nullptr,
                       const RowSink& on_question = nullptr, size_t question_rows = 1);
    void decode_or_throw(const Batch& batch, const char* what);
    void decode_branches(const std::vector<Branch>& branches, size_t prefix_len,
                         const LogitsSink& sink, ScoreStats& stats);
    void drop_branches();
    void drop_suffix(size_t prefix_len);
    void forget_all();
    void restore_prefix_unlocked(const uint8_t* data, size_t size);
    void read_row(const float* row, const std::vector<llama_token>& ids, float* out,
                  double* lse) const;

    EngineConfig config_;
    ModelPtr model_;
    ContextPtr ctx_;
    const llama_vocab* vocab_ = nullptr;
    int32_t n_vocab_ = 0;
    int32_t n_ctx_ = 0;
    int32_t n_seq_ = 0;
    int32_t n_batch_ = 0;
    int32_t n_threads_ = 0;
    size_t cell_align_ = 64;
    std::vector<llama_token> seq0_;    // tokens currently held by sequence 0
    // Full-vocabulary logits at the prefix's last position; empty when the prefix was evaluated
    // together with a question (ensure_prefix).
    std::vector<float> prefix_logits_;
    uint64_t tokens_evaluated_ = 0;
    std::atomic<bool> abort_{false};
    std::atomic<uint64_t> preempts_{0};
    std::atomic<int32_t> threads_wanted_{0};
    std::atomic<int32_t> threads_now_{0};
    int32_t threads_applied_ = 0;  // what the context was last set to (job thread only)
    int32_t n_ubatch_ = 0;
    bool preemptible_ = false;  // see the constructor
    std::mutex mutex_;
};

}  // namespace semif
