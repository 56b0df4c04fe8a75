#pragma once
// Owning handles for the llama.cpp objects the engine holds, so that every early exit
// (including a C++ exception on its way to Python) frees them in the right order.
#include <memory>

#include "llama.h"

namespace semif {

struct ModelDeleter {
    void operator()(llama_model* m) const { llama_model_free(m); }
};
struct ContextDeleter {
    void operator()(llama_context* c) const { llama_free(c); }
};
using ModelPtr = std::unique_ptr<llama_model, ModelDeleter>;
using ContextPtr = std::unique_ptr<llama_context, ContextDeleter>;

class Batch {
public:
    Batch(int32_t capacity, int32_t n_seq_max) : batch_(llama_batch_init(capacity, 0, n_seq_max)),
                                                 capacity_(capacity) {}
    ~Batch() { llama_batch_free(batch_); }
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

    void clear() { batch_.n_tokens = 0; }
    bool full() const { return batch_.n_tokens >= capacity_; }
    int32_t size() const { return batch_.n_tokens; }
    int32_t capacity() const { return capacity_; }

    // Returns the index of the added token inside the batch (what llama_get_logits_ith takes).
    int32_t add(llama_token token, llama_pos pos, llama_seq_id seq, bool logits) {
        const int32_t i = batch_.n_tokens++;
        batch_.token[i] = token;
        batch_.pos[i] = pos;
        batch_.n_seq_id[i] = 1;
        batch_.seq_id[i][0] = seq;
        batch_.logits[i] = logits ? 1 : 0;
        return i;
    }

    // A token shared by several sequences: its KV cell is visible to each of them.
    int32_t add_shared(llama_token token, llama_pos pos, const std::vector<llama_seq_id>& seqs,
                       bool logits) {
        const int32_t i = batch_.n_tokens++;
        batch_.token[i] = token;
        batch_.pos[i] = pos;
        batch_.n_seq_id[i] = static_cast<int32_t>(seqs.size());
        for (size_t s = 0; s < seqs.size(); ++s) batch_.seq_id[i][s] = seqs[s];
        batch_.logits[i] = logits ? 1 : 0;
        return i;
    }

    const llama_batch& get() const { return batch_; }

private:
    llama_batch batch_;
    int32_t capacity_;
};

}  // namespace semif
