#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "logging.h"

namespace semif {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string with_reason(std::string message) {
    const std::string reason = take_last_error();
    if (!reason.empty()) message += " (llama.cpp: " + reason + ")";
    return message;
}

void check_gguf_file(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
        throw LlamaError(kLoadFailed, "model file not found: " + path);
    }
    std::ifstream in(path, std::ios::binary);
    char magic[4] = {0, 0, 0, 0};
    in.read(magic, 4);
    if (!in || std::string(magic, 4) != "GGUF") {
        throw LlamaError(kLoadFailed, "not a GGUF file (bad magic): " + path);
    }
}

}  // namespace

size_t attention_cell_align() {
    // Measured on the CPU kernels: softmax sums 8-float chunks (16 with AVX-512); the value
    // product runs through llamafile's tinyBLAS in 8-lane steps when it is built in, else
    // through ggml's f16 dot product in 32-element steps (64 with AVX-512). Aligning to 4
    // instead of 8 made 38 of 54 prefix/suffix shapes differ; 8 made none differ.
    const std::string info = llama_print_system_info();
    if (info.find("AVX512 = 1") != std::string::npos) return 64;
    return info.find("LLAMAFILE = 1") != std::string::npos ? 8 : 32;
}

Engine::Engine(const EngineConfig& config) : config_(config) {
    if (config.n_ctx < 8) throw LlamaError(kBadArgument, "n_ctx must be at least 8");
    if (config.n_seq < 3) throw LlamaError(kBadArgument, "n_seq must be at least 3");
    if (config.n_batch < 1) throw LlamaError(kBadArgument, "n_batch must be at least 1");
    if (config.n_ubatch < 1) throw LlamaError(kBadArgument, "n_ubatch must be at least 1");
    check_gguf_file(config.model_path);
    take_last_error();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = config.n_gpu_layers;
    mparams.use_extra_bufts = config.repack;
    model_.reset(llama_model_load_from_file(config.model_path.c_str(), mparams));
    if (!model_) {
        throw LlamaError(kLoadFailed, with_reason("failed to load model " + config.model_path));
    }
    vocab_ = llama_model_get_vocab(model_.get());
    n_vocab_ = llama_vocab_n_tokens(vocab_);

    n_threads_ = config.n_threads > 0
                     ? config.n_threads
                     : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = static_cast<uint32_t>(config.n_ctx);
    cparams.n_batch = static_cast<uint32_t>(std::min(config.n_batch, config.n_ctx));
    cparams.n_ubatch = std::min<uint32_t>(cparams.n_batch, static_cast<uint32_t>(config.n_ubatch));
    cparams.n_seq_max = static_cast<uint32_t>(config.n_seq);
    cparams.n_threads = n_threads_;
    cparams.n_threads_batch = n_threads_;
    // Branches share the prefix's KV cells instead of each holding a copy.
    cparams.kv_unified = true;
    cparams.no_perf = true;
    cparams.flash_attn_type = static_cast<llama_flash_attn_type>(config.flash_attn);
    ctx_.reset(llama_init_from_model(model_.get(), cparams));
    if (!ctx_) {
        throw LlamaError(kContextFailed,
                         with_reason("failed to create a context with n_ctx=" +
                                     std::to_string(config.n_ctx)));
    }
    // Checked by the CPU backend between graph nodes: a long prefill nobody waits for any more
    // stops within milliseconds instead of running to its end.
    llama_set_abort_callback(ctx_.get(), &Engine::abort_requested, this);
    n_ctx_ = static_cast<int32_t>(llama_n_ctx(ctx_.get()));
    n_batch_ = static_cast<int32_t>(llama_n_batch(ctx_.get()));
    n_ubatch_ = static_cast<int32_t>(llama_n_ubatch(ctx_.get()));
    threads_applied_ = n_threads_;
    n_seq_ = static_cast<int32_t>(llama_n_seq_max(ctx_.get()));
    cell_align_ = attention_cell_align();
    // A preempted ubatch is taken back and evaluated again (decode_or_throw): exact only where
    // every cell it wrote can be removed again and nothing else moved. A sliding-window cache
    // drops cells that leave the window as the ubatch goes in, and a recurrent state cannot be
    // cut back; those models finish the ubatch in progress instead (a chat waits for it).
    preemptible_ = llama_model_n_swa(model_.get()) == 0 &&
                   !llama_model_is_recurrent(model_.get()) &&
                   !llama_model_is_hybrid(model_.get());
}

llama_token Engine::bos() const { return llama_vocab_bos(vocab_); }
llama_token Engine::eos() const { return llama_vocab_eos(vocab_); }
bool Engine::add_bos() const { return llama_vocab_get_add_bos(vocab_); }

std::string Engine::chat_template() const {
    const char* tmpl = llama_model_chat_template(model_.get(), nullptr);
    return tmpl ? std::string(tmpl) : std::string();
}

std::map<std::string, std::string> Engine::metadata() const {
    std::map<std::string, std::string> out;
    const int32_t count = llama_model_meta_count(model_.get());
    std::vector<char> key(512), value(4096);
    for (int32_t i = 0; i < count; ++i) {
        // Size-then-fill: a negative or oversized return means the buffer was too small.
        int32_t nk = llama_model_meta_key_by_index(model_.get(), i, key.data(), key.size());
        if (nk < 0) continue;
        if (static_cast<size_t>(nk) >= key.size()) {
            key.resize(nk + 1);
            llama_model_meta_key_by_index(model_.get(), i, key.data(), key.size());
        }
        int32_t nv = llama_model_meta_val_str_by_index(model_.get(), i, value.data(), value.size());
        if (nv < 0) continue;
        if (static_cast<size_t>(nv) >= value.size()) {
            value.resize(nv + 1);
            nv = llama_model_meta_val_str_by_index(model_.get(), i, value.data(), value.size());
        }
        out.emplace(std::string(key.data()), std::string(value.data(), nv));
    }
    return out;
}

std::vector<llama_token> Engine::special_tokens() const {
    std::vector<llama_token> out;
    for (llama_token t = 0; t < n_vocab_; ++t) {
        const auto attr = llama_vocab_get_attr(vocab_, t);
        if (attr & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED)) out.push_back(t);
    }
    return out;
}

std::vector<llama_token> Engine::tokenize(const std::string& text, bool add_special,
                                          bool parse_special) const {
    const int32_t len = static_cast<int32_t>(text.size());
    std::vector<llama_token> tokens(text.size() + 2);
    int32_t n = llama_tokenize(vocab_, text.data(), len, tokens.data(),
                               static_cast<int32_t>(tokens.size()), add_special, parse_special);
    if (n == INT32_MIN) throw LlamaError(kTokenizeFailed, "tokenization overflow");
    if (n < 0) {
        tokens.resize(-n);
        n = llama_tokenize(vocab_, text.data(), len, tokens.data(),
                           static_cast<int32_t>(tokens.size()), add_special, parse_special);
        if (n < 0) throw LlamaError(kTokenizeFailed, "tokenization failed");
    }
    tokens.resize(n);
    return tokens;
}

std::string Engine::token_piece(llama_token token, bool special) const {
    check_token_ids({token}, "token");
    std::vector<char> buf(64);
    int32_t n = llama_token_to_piece(vocab_, token, buf.data(), buf.size(), 0, special);
    if (n < 0) {
        buf.resize(-n);
        n = llama_token_to_piece(vocab_, token, buf.data(), buf.size(), 0, special);
    }
    return std::string(buf.data(), std::max(0, n));
}

std::string Engine::detokenize(const std::vector<llama_token>& tokens, bool special) const {
    check_token_ids(tokens, "tokens");
    std::vector<char> buf(tokens.size() * 8 + 16);
    int32_t n = llama_detokenize(vocab_, tokens.data(), static_cast<int32_t>(tokens.size()),
                                 buf.data(), static_cast<int32_t>(buf.size()), false, special);
    if (n < 0) {
        buf.resize(-n);
        n = llama_detokenize(vocab_, tokens.data(), static_cast<int32_t>(tokens.size()),
                             buf.data(), static_cast<int32_t>(buf.size()), false, special);
    }
    return std::string(buf.data(), std::max(0, n));
}

void Engine::check_token_ids(const std::vector<llama_token>& tokens, const char* what) const {
    for (llama_token t : tokens) {
        if (t < 0 || t >= n_vocab_) {
            throw LlamaError(kBadArgument, std::string(what) + ": token id " + std::to_string(t) +
                                               " outside the vocabulary [0, " +
                                               std::to_string(n_vocab_) + ")");
        }
    }
}

void Engine::check_fits(size_t prefix, size_t suffix, size_t n_branches) const {
    // A branch may need up to cell_align_ - 1 filler cells before it (see decode_branches).
    const size_t filler = n_branches * (cell_align_ - 1);
    if (prefix + suffix + filler > static_cast<size_t>(n_ctx_)) {
        throw LlamaError(kContextOverflow,
                         "prompt needs " + std::to_string(prefix + suffix) + " tokens (+" +
                             std::to_string(filler) +
                             " alignment cells) but the context holds " + std::to_string(n_ctx_));
    }
}

bool Engine::abort_requested(void* self) {
    auto* engine = static_cast<Engine*>(self);
    return engine->abort_.load(std::memory_order_relaxed) || engine->preempted();
}

bool Engine::preempted() const {
    // Asked for fewer threads than the ubatch in progress runs on: another process needs the
    // cores now, not when the ubatch ends. decode_or_throw evaluates it again on the new count.
    if (!preemptible_) return false;
    const int32_t wanted = threads_wanted_.load(std::memory_order_seq_cst);
    return wanted > 0 && wanted < threads_now_.load(std::memory_order_seq_cst);
}

void Engine::request_abort() { abort_.store(true, std::memory_order_relaxed); }

void Engine::check_abort() {
    if (!abort_.load(std::memory_order_relaxed)) return;
    forget_all();
    throw LlamaError(kAborted, "aborted: the request was cancelled");
}

void Engine::take_back(const Batch& batch) {
    // llama_decode removes a failed ubatch's cells by each token's first sequence only; a label
    // tree's token shared by several sequences would keep its cell for the others, and the
    // batch sent again would be refused (a position that repeats). So every sequence of every
    // token loses its cells from its lowest position in the batch on: the batch holds each
    // sequence's newest positions (prefix cells, copied to the branches, sit below them).
    const llama_batch& b = batch.get();
    std::vector<llama_pos> from(static_cast<size_t>(n_seq_), -1);
    for (int32_t i = 0; i < b.n_tokens; ++i) {
        for (int32_t k = 0; k < b.n_seq_id[i]; ++k) {
            llama_pos& p = from[static_cast<size_t>(b.seq_id[i][k])];
            if (p < 0 || b.pos[i] < p) p = b.pos[i];
        }
    }
    llama_memory_t mem = llama_get_memory(ctx_.get());
    bool ok = true;
    for (llama_seq_id s = 0; s < n_seq_; ++s) {
        const llama_pos p = from[static_cast<size_t>(s)];
        if (p < 0) continue;
        ok = llama_memory_seq_rm(mem, s, p, -1) && ok;
        // What the sequence held before the batch, exactly: nothing at or past its first token.
        ok = ok && llama_memory_seq_pos_max(mem, s) < p;
    }
    if (!ok) {
        forget_all();
        throw LlamaError(kStateFailed, "could not take back a preempted batch");
    }
}

void Engine::decode_or_throw(const Batch& batch, const char* what) {
    int32_t rc = 0;
    do {
        check_abort();
        // Published as "every core" before the wanted count is read (both seq_cst, as in
        // set_threads): a caller that lowers the count and then reads threads_now either sees
        // this call at its full count or has its lower count applied to it; never a 0 between.
        threads_now_.store(std::max(n_threads_, threads_applied_), std::memory_order_seq_cst);
        const int32_t wanted = threads_wanted_.load(std::memory_order_seq_cst);
        const int32_t threads = wanted > 0 ? wanted : n_threads_;
        if (threads != threads_applied_) {
            // On the job's own thread, between calls: the context reads it when the next graph
            // is computed.
            llama_set_n_threads(ctx_.get(), threads, threads);
            threads_applied_ = threads;
        }
        threads_now_.store(threads, std::memory_order_seq_cst);
        const LogMark mark = log_mark();
        rc = llama_decode(ctx_.get(), batch.get());
        threads_now_.store(0, std::memory_order_release);
        if (rc == 2) {  // llama_decode's code for "aborted by the callback"
            // Stopped on purpose, by an abort (a client that hung up, a deadline) or a
            // preemption: llama.cpp's "failed to compute" / "failed to decode" error lines for
            // this ubatch would alarm whoever reads the log, and nothing failed.
            drop_log_lines_since(mark);
            check_abort();
            // Not aborted: preempted (fewer threads wanted). Its cells are removed again, so
            // the same batch goes to the same free cells on the new count and gives the same
            // numbers (tested bit for bit); the work lost is what the ubatch had done so far.
            preempts_.fetch_add(1, std::memory_order_relaxed);
            take_back(batch);
        }
    } while (rc == 2);
    if (rc != 0) {
        // The memory may hold part of the batch now; forget everything rather than guess.
        forget_all();
        throw LlamaError(rc, with_reason(std::string("llama_decode failed while evaluating ") +
                                         what + " (code " + std::to_string(rc) + ")"));
    }
    tokens_evaluated_ += static_cast<uint64_t>(batch.size());
}

bool Engine::ensure_prefix(const std::vector<llama_token>& prefix, ScoreStats& stats,
                           bool need_logits, const std::vector<llama_token>* question,
                           const RowSink& on_question, size_t question_rows) {
    auto start = Clock::now();
    llama_memory_t mem = llama_get_memory(ctx_.get());
    drop_branches();
    stats.prefix_tokens = static_cast<int32_t>(prefix.size());
    // Only an exact match is reused (with its own logits when they are read). Re-evaluating
    // part of a prefix would compute those rows in a different batch shape, and results must
    // not depend on what the engine happened to hold before.
    const bool has_logits = prefix_logits_.size() == static_cast<size_t>(n_vocab_);
    if (!seq0_.empty() && seq0_ == prefix && (has_logits || !need_logits)) {
        stats.prefix_reused = static_cast<int32_t>(prefix.size());
        stats.prefill_seconds += seconds_since(start);
        return false;
    }
    llama_memory_seq_rm(mem, 0, -1, -1);
    seq0_.clear();
    prefix_logits_.clear();

    // A question that sits right after the prefix's cells (no alignment filler) goes on
    // sequence 0 in the same stream of ubatches: the prompt then costs the llama_decode calls of
    // its one-piece evaluation (one for a 200-token decision instead of two; each call streams
    // the weights and syncs the threads once), and its numbers are the one-piece evaluation's,
    // which the split path gives too. Only the question's rows are outputs: another output row
    // changes the last layer's matrix products (one row against two moved logits by 1e-6 on an
    // F16 model). So the prefix's own logits are not computed then, and a later call that reads
    // them evaluates the prefix again.
    const bool fused = question != nullptr && !question->empty() && !need_logits &&
                       prefix.size() % cell_align_ == 0;
    const size_t total = prefix.size() + (fused ? question->size() : 0);
    if (total == 0) throw LlamaError(kBadArgument, "nothing to evaluate");
    // Outputs: the prefix's last position, or the question's last `rows` positions.
    const size_t rows = fused ? std::max<size_t>(1, std::min(question_rows, question->size())) : 1;
    const size_t first_out = total - rows;
    // One ubatch per llama_decode call: the calls are split exactly where llama_decode would
    // split one big batch (a single sequence goes in order), and a thread-count change
    // (set_threads) applies at the next ubatch instead of after the whole prefix.
    Batch batch(std::min(n_batch_, n_ubatch_), 1);
    std::vector<std::pair<size_t, int32_t>> wants;  // (position, batch index) in this ubatch
    bool question_started = false;
    double prefix_seconds = 0.0;
    try {
        for (size_t i = 0; i < total; ++i) {
            const bool in_prefix = i < prefix.size();
            const llama_token token = in_prefix ? prefix[i] : (*question)[i - prefix.size()];
            const int32_t index = batch.add(token, static_cast<llama_pos>(i), 0, i >= first_out);
            if (i >= first_out) wants.emplace_back(i, index);
            if (!batch.full() && i + 1 != total) continue;
            // A call shared by the prefix's end and the question counts as the question's.
            if (!in_prefix && !question_started) {
                question_started = true;
                prefix_seconds = seconds_since(start);
            }
            decode_or_throw(batch, in_prefix ? "the prefix" : "the prefix and a question");
            ++stats.decode_calls;
            // Read before the next decode overwrites the output buffer.
            for (const auto& [pos, idx] : wants) {
                const float* row = llama_get_logits_ith(ctx_.get(), idx);
                if (row == nullptr) {
                    throw LlamaError(kStateFailed, fused ? "missing logits for a suffix"
                                                         : "no logits after the prefix");
                }
                if (fused) {
                    on_question(pos - prefix.size(), row);
                } else {
                    prefix_logits_.assign(row, row + n_vocab_);
                }
            }
            wants.clear();
            batch.clear();
        }
    } catch (...) {
        forget_all();  // a question's cells may be in sequence 0: claim nothing
        throw;
    }
    stats.prefix_reused = 0;
    seq0_ = prefix;
    if (!fused) {
        stats.prefill_seconds += seconds_since(start);
        return false;
    }
    // The question's cells stay on sequence 0 after the prefix's: the caller removes them.
    stats.prefill_seconds += prefix_seconds;
    stats.suffix_seconds += seconds_since(start) - prefix_seconds;
    stats.suffix_tokens += static_cast<int32_t>(question->size());
    return true;
}

void Engine::forget_all() {
    llama_memory_clear(llama_get_memory(ctx_.get()), true);
    seq0_.clear();
    prefix_logits_.clear();
}

void Engine::drop_suffix(size_t prefix_len) {
    if (!llama_memory_seq_rm(llama_get_memory(ctx_.get()), 0, static_cast<llama_pos>(prefix_len), -1)) {
        // Never leave sequence 0 claiming a prefix it no longer holds alone.
        forget_all();
        throw LlamaError(kStateFailed, "could not remove a suffix from sequence 0");
    }
}

void Engine::drop_branches() {
    llama_memory_t mem = llama_get_memory(ctx_.get());
    for (llama_seq_id s = 1; s < n_seq_; ++s) llama_memory_seq_rm(mem, s, -1, -1);
}

void Engine::decode_branches(const std::vector<Branch>& branches, size_t prefix_len,
                             const LogitsSink& sink, ScoreStats& stats) {
    auto start = Clock::now();
    llama_memory_t mem = llama_get_memory(ctx_.get());
    // One ubatch per call, as for the prefix: the KV cache is unified, so llama_decode would
    // split a bigger batch in order into these same ubatches (same cells, same numbers), and
    // a thread-count change applies at the next ubatch.
    Batch batch(std::min(n_batch_, n_ubatch_), 1);
    struct Want { size_t branch; size_t token; int32_t index; };
    std::vector<Want> wants;

    auto flush = [&]() {
        if (batch.size() == 0) return;
        decode_or_throw(batch, "option suffixes");
        ++stats.decode_calls;
        for (const Want& w : wants) {
            const float* row = llama_get_logits_ith(ctx_.get(), w.index);
            if (row == nullptr) {
                forget_all();  // the suffixes' cells are still in the memory
                throw LlamaError(kStateFailed, "missing logits for a suffix");
            }
            sink(w.branch, w.token, row);
        }
        wants.clear();
        batch.clear();
    };

    // Every branch's KV cells start on a multiple of cell_align_, right after the prefix's
    // cells [0, prefix_len). The CPU attention kernels sum the softmax in 8/16-cell float chunks
    // and the value product in 32/64-lane steps; a suffix that started mid-chunk would share a
    // chunk with prefix cells in one layout and not in another, and the last bits of the sums
    // would differ (activation quantisation then amplifies that to ~0.1 in the logits). Aligned,
    // a question gets bit-identical logits alone, in a shared request, after a prefix reuse or a
    // cache restore. Filler tokens go to a sequence nobody attends to and are removed afterwards.
    const llama_seq_id pad_seq = n_seq_ - 1;
    size_t cells = prefix_len;
    llama_pos pad_pos = 0;
    // One suffix on sequence 0 after an aligned prefix (restore mode, the CPU path; an
    // unaligned one is off the one-piece layout anyway) is cut into ubatches where its
    // one-piece evaluation's stream is cut: at multiples of the ubatch size from position 0.
    // The rows of a last ubatch of a few tokens come out otherwise than the same rows in a
    // long one (Qwen2.5 Q4_K_M, 2026-12-05: a prompt 1-7 tokens past the ubatch moved logits
    // by up to 0.33 after a held prefix; measured, not explained); cut where the one-piece
    // stream is, that last ubatch holds the same tokens either way. The first ubatch starts at
    // an aligned cell, so it holds at least cell_align tokens. Not covered: a question of
    // fewer than 8 tokens in all (see docs/method.md, "Shared state and exactness").
    const size_t step = static_cast<size_t>(std::min(n_batch_, n_ubatch_));
    // With a ubatch size off the cell grid (SEMIF_UBATCH_SIZE accepts any) a first piece could
    // be shorter than a cell block: there the suffix goes in as before.
    const bool mirrored = branches.size() == 1 && branches[0].seq == 0 &&
                          prefix_len % cell_align_ == 0 && step % cell_align_ == 0;
    for (size_t b = 0; b < branches.size(); ++b) {
        const Branch& br = branches[b];
        const size_t pad = (cell_align_ - cells % cell_align_) % cell_align_;
        for (size_t i = 0; i < pad; ++i) {
            batch.add(0, pad_pos++, pad_seq, false);
            if (batch.full()) flush();
        }
        cells += pad;
        stats.padding_tokens += static_cast<int32_t>(pad);
        if (br.seq != 0) llama_memory_seq_cp(mem, 0, br.seq, -1, -1);
        const auto& toks = *br.tokens;
        for (size_t t = 0; t < toks.size(); ++t) {
            if (mirrored && batch.size() > 0 && (prefix_len + t) % step == 0) flush();
            const bool want = t + br.n_out >= toks.size();
            const int32_t idx =
                batch.add(toks[t], static_cast<llama_pos>(prefix_len + t), br.seq, want);
            if (want) wants.push_back({b, t, idx});
            if (batch.full()) flush();
        }
        cells += toks.size();
        stats.suffix_tokens += static_cast<int32_t>(toks.size());
    }
    flush();
    drop_branches();
    stats.suffix_seconds += seconds_since(start);
}

void Engine::read_row(const float* row, const std::vector<llama_token>& ids, float* out,
                      double* lse) const {
    for (size_t j = 0; j < ids.size(); ++j) out[j] = row[ids[j]];
    float max_v = row[0];
    for (int32_t k = 1; k < n_vocab_; ++k) max_v = std::max(max_v, row[k]);
    double sum = 0.0;
    for (int32_t k = 0; k < n_vocab_; ++k) sum += std::exp(static_cast<double>(row[k]) - max_v);
    *lse = static_cast<double>(max_v) + std::log(sum);
}

ScoreResult Engine::score(const std::vector<llama_token>& prefix,
                          const std::vector<std::vector<llama_token>>& suffixes,
                          const std::vector<llama_token>& ids, ScoreMode mode,
                          const std::vector<int32_t>& outputs) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ids.empty()) throw LlamaError(kBadArgument, "ids must not be empty");
    if (!outputs.empty() && outputs.size() != suffixes.size()) {
        throw LlamaError(kBadArgument, "outputs must hold one count per suffix");
    }
    check_token_ids(prefix, "prefix");
    check_token_ids(ids, "ids");
    size_t longest = 0;
    bool any_empty = false;
    std::vector<size_t> n_out(suffixes.size(), 1);
    std::vector<size_t> offset(suffixes.size(), 0);
    size_t n_rows = 0;
    for (size_t i = 0; i < suffixes.size(); ++i) {
        const auto& s = suffixes[i];
        check_token_ids(s, "suffix");
        longest = std::max(longest, s.size());
        any_empty = any_empty || s.empty();
        if (!outputs.empty()) {
            // An empty suffix reads the prefix's last row: one row.
            const size_t most = std::max<size_t>(1, s.size());
            if (outputs[i] < 1 || static_cast<size_t>(outputs[i]) > most) {
                throw LlamaError(kBadArgument, "outputs[" + std::to_string(i) +
                                                   "] must be between 1 and the suffix's length");
            }
            n_out[i] = static_cast<size_t>(outputs[i]);
        }
        offset[i] = n_rows;
        n_rows += n_out[i];
    }
    if (prefix.empty() && (mode != ScoreMode::kRestore || any_empty || suffixes.empty())) {
        throw LlamaError(kBadArgument, "prefix must hold at least one token");
    }
    check_fits(prefix.size(), longest, longest > 0 ? 1 : 0);

    ScoreResult result;
    result.n_rows = static_cast<int32_t>(n_rows);
    result.n_ids = static_cast<int32_t>(ids.size());
    result.logits.assign(n_rows * ids.size(), 0.0f);
    result.logsumexp.assign(n_rows, 0.0);
    // Suffix i's token t: its row among the suffix's last n_out[i] positions.
    auto sink = [&](size_t i, size_t t, const float* row) {
        const size_t len = std::max<size_t>(1, suffixes[i].size());
        const size_t r = offset[i] + (t + n_out[i] - len);
        read_row(row, ids, &result.logits[r * ids.size()], &result.logsumexp[r]);
    };
    std::vector<size_t> pending;
    for (size_t i = 0; i < suffixes.size(); ++i) {
        if (!suffixes[i].empty()) pending.push_back(i);
    }
    // Restored branches decode on sequence 0 right after the prefix, so the first of them can
    // share the prefix's ubatches (ensure_prefix); copied branches need the prefix held first.
    size_t done = 0;
    if (mode == ScoreMode::kRestore && !pending.empty()) {
        const size_t first = pending.front();
        auto one = [&](size_t t, const float* row) { sink(first, t, row); };
        // The prefix's logits are read only for an empty suffix.
        const bool need_logits = pending.size() < suffixes.size();
        if (ensure_prefix(prefix, result.stats, need_logits, &suffixes[first], one,
                          n_out[first])) {
            drop_suffix(prefix.size());
            done = 1;
        }
    } else {
        // Copied branches need only the prefix's cells; its logits only for an empty suffix
        // (a prefix held from a label tree's fused root has none).
        ensure_prefix(prefix, result.stats, pending.size() < suffixes.size());
    }
    for (size_t i = 0; i < suffixes.size(); ++i) {
        if (suffixes[i].empty()) sink(i, 0, prefix_logits_.data());
    }
    if (mode == ScoreMode::kRestore) {
        for (size_t k = done; k < pending.size(); ++k) {
            const size_t i = pending[k];
            auto one = [&](size_t, size_t t, const float* row) { sink(i, t, row); };
            // The suffix goes onto sequence 0 itself, right after the prefix's cells; removing
            // its cells afterwards leaves the prefix as it was (its cells are never written)
            // and frees the same cells for the next question, which then sits exactly where
            // the first did. No copy of the state is made.
            decode_branches({Branch{0, &suffixes[i], n_out[i]}}, prefix.size(), one,
                            result.stats);
            drop_suffix(prefix.size());
        }
        return result;
    }
    // Group as many suffixes per decode as there are branch sequences and free KV cells.
    const size_t free_cells = static_cast<size_t>(n_ctx_) - prefix.size();
    size_t next = 0;
    while (next < pending.size()) {
        std::vector<Branch> group;
        std::vector<size_t> rows;
        size_t cells = 0;
        while (next < pending.size() && group.size() < static_cast<size_t>(n_seq_ - 2)) {
            const auto& s = suffixes[pending[next]];
            if (!group.empty() && cells + s.size() + cell_align_ > free_cells) break;
            group.push_back(
                Branch{static_cast<llama_seq_id>(group.size() + 1), &s, n_out[pending[next]]});
            rows.push_back(pending[next]);
            cells += s.size() + cell_align_;
            ++next;
        }
        auto grouped = [&](size_t b, size_t t, const float* row) { sink(rows[b], t, row); };
        decode_branches(group, prefix.size(), grouped, result.stats);
    }
    return result;
}

size_t Engine::prefix_state_size() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (seq0_.empty()) throw LlamaError(kStateFailed, "no prefix has been evaluated");
    drop_branches();
    return llama_state_seq_get_size(ctx_.get(), 0);
}

size_t Engine::copy_prefix_state(uint8_t* dst, size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (seq0_.empty()) throw LlamaError(kStateFailed, "no prefix has been evaluated");
    drop_branches();
    const size_t written = llama_state_seq_get_data(ctx_.get(), dst, capacity, 0);
    if (written == 0 || written > capacity) {
        throw LlamaError(kStateFailed, "llama_state_seq_get_data wrote " + std::to_string(written) +
                                           " of " + std::to_string(capacity) + " bytes");
    }
    return written;
}

void Engine::restore_prefix_unlocked(const uint8_t* data, size_t size) {
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), 0, -1, -1);
    const size_t read = llama_state_seq_set_data(ctx_.get(), data, size, 0);
    if (read == 0) {
        seq0_.clear();
        throw LlamaError(kStateFailed, with_reason("llama_state_seq_set_data rejected " +
                                                   std::to_string(size) + " bytes"));
    }
}

void Engine::set_prefix_state(const uint8_t* data, size_t size,
                              const std::vector<llama_token>& tokens,
                              const std::vector<float>& logits) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_token_ids(tokens, "tokens");
    if (tokens.empty() || tokens.size() > static_cast<size_t>(n_ctx_)) {
        throw LlamaError(kBadArgument, "tokens must describe a prefix that fits the context");
    }
    if (!logits.empty() && logits.size() != static_cast<size_t>(n_vocab_)) {
        throw LlamaError(kBadArgument, "logits must be empty or hold n_vocab values (" +
                                           std::to_string(n_vocab_) + "), got " +
                                           std::to_string(logits.size()));
    }
    drop_branches();
    seq0_.clear();
    restore_prefix_unlocked(data, size);
    const llama_pos last = llama_memory_seq_pos_max(llama_get_memory(ctx_.get()), 0);
    if (last + 1 != static_cast<llama_pos>(tokens.size())) {
        llama_memory_seq_rm(llama_get_memory(ctx_.get()), 0, -1, -1);
        throw LlamaError(kStateFailed, "restored state holds " + std::to_string(last + 1) +
                                           " positions, tokens say " +
                                           std::to_string(tokens.size()));
    }
    seq0_ = tokens;
    prefix_logits_ = logits;
}

TreeResult Engine::score_tree(const std::vector<llama_token>& prefix,
                              const std::vector<llama_token>& suffix, const TokenTree& tree) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (prefix.empty()) throw LlamaError(kBadArgument, "prefix must hold at least one token");
    const size_t n = tree.tokens.size();
    if (tree.parent.size() != n || tree.ids.size() != n) {
        throw LlamaError(kBadArgument, "tree: tokens, parent and ids must have one entry per node");
    }
    if (tree.root_ids.empty()) throw LlamaError(kBadArgument, "tree: root_ids must not be empty");
    check_token_ids(prefix, "prefix");
    check_token_ids(suffix, "suffix");
    check_token_ids(tree.tokens, "tree token");
    check_token_ids(tree.root_ids, "root id");
    std::vector<int32_t> depth(n, 1);
    std::vector<bool> has_child(n, false);
    for (size_t i = 0; i < n; ++i) {
        const int32_t p = tree.parent[i];
        // Parents before children: the batch order then keeps every sequence's positions rising.
        if (p < -1 || p >= static_cast<int32_t>(i)) {
            throw LlamaError(kBadArgument, "tree: node " + std::to_string(i) +
                                               " needs a parent among the nodes before it");
        }
        check_token_ids(tree.ids[i], "node id");
        if (p >= 0) {
            depth[i] = depth[p] + 1;
            has_child[p] = true;
        }
    }
    std::vector<size_t> leaves;
    for (size_t i = 0; i < n; ++i) {
        if (!has_child[i]) leaves.push_back(i);
    }
    // The suffix may need alignment filler before it; every tree node takes one cell (a node
    // decoded again in a later group takes a cell that the group before has freed).
    check_fits(prefix.size(), suffix.size() + n, suffix.empty() ? 0 : 1);

    TreeResult result;
    result.root_logits.assign(tree.root_ids.size(), 0.0f);
    result.node_logits.resize(n);
    result.node_logsumexp.assign(n, 0.0);
    auto root = [&](const float* row) {
        read_row(row, tree.root_ids, result.root_logits.data(), &result.root_logsumexp);
    };
    // The root (the suffix's last token) may share the prefix's ubatches, as in score().
    const bool rooted = !suffix.empty() && ensure_prefix(
        prefix, result.stats, false, &suffix, [&](size_t, const float* row) { root(row); });
    if (suffix.empty()) ensure_prefix(prefix, result.stats);
    llama_memory_t mem = llama_get_memory(ctx_.get());
    const llama_pos base = static_cast<llama_pos>(prefix.size() + suffix.size());
    // Whatever happens below, sequence 0 goes back to the prefix and the branches are emptied.
    struct Cleanup {
        Engine* engine;
        llama_memory_t mem;
        llama_pos keep;
        ~Cleanup() {
            engine->drop_branches();
            if (!llama_memory_seq_rm(mem, 0, keep, -1)) {
                // Never leave sequence 0 claiming a prefix it no longer holds alone.
                engine->forget_all();
            }
        }
    } cleanup{this, mem, static_cast<llama_pos>(prefix.size())};

    if (suffix.empty()) {
        root(prefix_logits_.data());
    } else if (!rooted) {
        decode_branches({Branch{0, &suffix, 1}}, prefix.size(),
                        [&](size_t, size_t, const float* row) { root(row); }, result.stats);
    }
    if (n == 0) return result;

    // Each leaf gets a branch sequence holding the prompt; the leaves are taken in groups of as
    // many sequences as there are (a node shared by two groups is decoded in each). The filler
    // sequence is free here: tree nodes need no alignment (only the first label token, read at
    // the suffix's end, is held to the one-piece numbers).
    auto start = Clock::now();
    const size_t per_group = static_cast<size_t>(std::max(1, n_seq_ - 1));
    std::vector<bool> done(n, false);
    Batch batch(std::min(n_batch_, n_ubatch_), n_seq_);  // one ubatch per call (see above)
    for (size_t first = 0; first < leaves.size(); first += per_group) {
        const size_t last = std::min(leaves.size(), first + per_group);
        std::vector<std::vector<llama_seq_id>> seqs(n);
        for (size_t k = first; k < last; ++k) {
            const auto seq = static_cast<llama_seq_id>(k - first + 1);
            llama_memory_seq_cp(mem, 0, seq, -1, -1);
            for (int32_t node = static_cast<int32_t>(leaves[k]); node >= 0;
                 node = tree.parent[node]) {
                seqs[node].push_back(seq);
            }
        }
        std::vector<std::pair<size_t, int32_t>> wants;  // node, index in the batch
        auto flush = [&]() {
            if (batch.size() == 0) return;
            decode_or_throw(batch, "option labels");
            ++result.stats.decode_calls;
            for (const auto& [node, index] : wants) {
                const float* row = llama_get_logits_ith(ctx_.get(), index);
                if (row == nullptr) throw LlamaError(kStateFailed, "missing logits for a label");
                if (done[node]) continue;
                result.node_logits[node].assign(tree.ids[node].size(), 0.0f);
                read_row(row, tree.ids[node], result.node_logits[node].data(),
                         &result.node_logsumexp[node]);
                done[node] = true;
            }
            wants.clear();
            batch.clear();
        };
        for (size_t i = 0; i < n; ++i) {
            if (seqs[i].empty()) continue;
            std::sort(seqs[i].begin(), seqs[i].end());
            const int32_t index =
                batch.add_shared(tree.tokens[i], base + depth[i] - 1, seqs[i], true);
            wants.emplace_back(i, index);
            result.stats.suffix_tokens += 1;
            if (batch.full()) flush();
        }
        flush();
        drop_branches();
    }
    result.stats.suffix_seconds += seconds_since(start);
    return result;
}

GenerateResult Engine::generate(const std::vector<llama_token>& prompt, int32_t max_tokens,
                                const std::vector<llama_token>& stop_ids, size_t held) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (prompt.empty()) throw LlamaError(kBadArgument, "prompt must hold at least one token");
    if (max_tokens < 0) throw LlamaError(kBadArgument, "max_tokens must not be negative");
    if (held >= prompt.size() && held != 0) {
        throw LlamaError(kBadArgument, "held must be shorter than the prompt");
    }
    // Off the cell grid the rest would not sit where its one-piece evaluation puts it.
    if (held % cell_align_ != 0) {
        throw LlamaError(kBadArgument,
                         "held must be a multiple of the cell alignment (" +
                             std::to_string(cell_align_) + ")");
    }
    check_token_ids(prompt, "prompt");
    check_token_ids(stop_ids, "stop ids");
    // The last generated token is never decoded (nothing reads what follows it).
    check_fits(prompt.size(), static_cast<size_t>(std::max(0, max_tokens - 1)), 0);

    GenerateResult result;
    const size_t keep = held == 0 ? prompt.size() : held;
    const std::vector<llama_token> prefix(prompt.begin(), prompt.begin() + keep);
    const std::vector<llama_token> rest(prompt.begin() + keep, prompt.end());
    llama_memory_t mem = llama_get_memory(ctx_.get());
    // On every way out the rest's and the generated tokens' cells are removed: sequence 0
    // holds the prefix again (with its logits where they were computed). An abort or a failed
    // decode has already forgotten everything (check_abort, decode_or_throw): the next call
    // starts clean.
    struct Cleanup {
        Engine* engine;
        llama_memory_t mem;
        llama_pos keep;
        ~Cleanup() {
            if (!llama_memory_seq_rm(mem, 0, keep, -1)) engine->forget_all();
        }
    } cleanup{this, mem, static_cast<llama_pos>(keep)};

    // The prompt's last row chooses the first generated token: the prefix's own logits, or the
    // rest's last row, copied out before the next decode overwrites it.
    std::vector<float> last;
    const float* row = nullptr;
    if (rest.empty()) {
        ensure_prefix(prefix, result.stats);
        row = prefix_logits_.data();
    } else {
        auto take = [&](size_t t, const float* r) {
            if (t + 1 == rest.size()) last.assign(r, r + n_vocab_);
        };
        // Cold, the rest goes in the prefix's own stream of ubatches (one-piece); held, it is
        // decoded right after the prefix's cells on sequence 0, as a restored branch.
        if (!ensure_prefix(prefix, result.stats, false, &rest, take, 1)) {
            auto sink = [&](size_t, size_t t, const float* r) { take(t, r); };
            // decode_branches removes only the branch sequences: the rest stays on sequence 0.
            decode_branches({Branch{0, &rest, 1}}, prefix.size(), sink, result.stats);
        }
        if (last.size() != static_cast<size_t>(n_vocab_)) {
            throw LlamaError(kStateFailed, "no logits after the prompt");
        }
        row = last.data();
    }

    auto start = Clock::now();
    auto argmax = [&](const float* r) {
        return static_cast<llama_token>(std::max_element(r, r + n_vocab_) - r);
    };
    // A generated token's row is only valid until the next decode, and is read (argmax) before.
    Batch batch(1, 1);
    for (int32_t k = 0; k < max_tokens; ++k) {
        const llama_token next = argmax(row);
        if (llama_vocab_is_eog(vocab_, next) ||
            std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) {
            result.stop = next;
            break;
        }
        result.tokens.push_back(next);
        if (k + 1 == max_tokens) break;  // the budget is spent: no row after it is read
        batch.clear();
        batch.add(next, static_cast<llama_pos>(prompt.size() + k), 0, true);
        decode_or_throw(batch, "a generated token");
        ++result.stats.decode_calls;
        ++result.stats.suffix_tokens;
        row = llama_get_logits_ith(ctx_.get(), 0);
        if (row == nullptr) throw LlamaError(kStateFailed, "no logits after a generated token");
    }
    result.stats.suffix_seconds += seconds_since(start);
    return result;
}

void Engine::reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    forget_all();
}

}  // namespace semif
