"""Every default that no Settings field shows: limits, the engine's per-device batch, the
automatic context, and the supervision and sharing constants no variable sets. The fields'
own defaults are in schema.py; the native engine gets each of its values from these two places
(its own C++ defaults serve direct callers such as tests)."""

DEFAULT_MAX_BODY_BYTES = 6 << 20
# The engine's default tokens per llama_decode call (SEMIF_UBATCH_SIZE), by device.
UBATCH_CPU = 256
UBATCH_GPU = 512
# The engine's context when SEMIF_CTX_SIZE is unset: the model's training context, at most
# this. 8,192 tokens hold a 255-option System One choice with one-line descriptions (about
# 4,000 prompt tokens, its label tree and the alignment cells of its branches; tested), at a KV
# cache of 8,192 x the model's bytes per token (SmolLM2-135M: 189 MB; Qwen2.5-1.5B: 235 MB).
AUTO_CTX_MAX = 8192
# A model whose header does not say its training context gets this.
FALLBACK_CTX = 4096
MIN_CTX = 64
# Defaults no variable sets, kept with the rest:
# - failed probes in a row before llama-server counts as unhealthy (one missed probe is not a
#   stall: on a busy 2-core machine a /health call can miss its timeout while it generates);
LLAMA_UNHEALTHY_AFTER = 2
# - the restart backoff of an exited llama-server, first and longest (seconds);
LLAMA_BACKOFF_INITIAL_S = 0.5
LLAMA_BACKOFF_MAX_S = 30.0
# - CPU sharing dynamic: how long chats wait for the second llama-server's chats to end before
#   they join them (cpu/dynamic.py);
CPU_DRAIN_GRACE_S = 5.0
# - JSON Lines lines per engine job: a job holds the engine (and the CPU) until it ends, so a
#   large group of one state is cut into jobs that other requests can run between.
JSON_LINES_PER_JOB = 16
# - how a decision or a System One question is read when it does not say (issue #35), as the
#   rule of docs/readouts.md ("Defaults from the evidence", which holds the numbers) reads the
#   committed benchmark rows; tests/test_bench_readouts.py holds these values to them. The
#   readout: letters, until another meets the rule there (beats them with an interval above
#   zero within the rule's cost). A continuation's normalisation: pmi (divided by the option's
#   probability after a content-free state), unless the rule chooses another (it chooses one
#   only where it beats each other with an interval above zero). No label-free bias
#   correction for every type: one would need the rule met for each type alone (over all
#   types together, one type's cost is averaged with a cheaper type's). The API's `readout`,
#   `normalization` and `bias_correction`;
DEFAULT_READOUT = "letters"
DEFAULT_NORMALIZATION = "pmi"
DEFAULT_BIAS_CORRECTION = "none"
# - the server's bias correction by question type, where the rule is met for that type: yes/no
#   questions (noul) read with the answers after a content-free state divided out; choices and
#   scores stay uncorrected while the rule is not met for them.
DEFAULT_BIAS_CORRECTION_BY_TYPE = {"noul": "contextual"}
# - content-free answers (PMI, contextual bias correction) kept per engine, by option set.
CONTENT_FREE_CACHE_ENTRIES = 1024
# - the deliberate readout (issue #35): tokens a question lets the model write before its
#   answer is read when it does not say (`deliberation_tokens`), and the most any may ask for
#   (SEMIF_MAX_DELIBERATION_TOKENS; every generated token is one forward pass).
DEFAULT_DELIBERATION_TOKENS = 64
DEFAULT_MAX_DELIBERATION_TOKENS = 256
# - SEMIF_REPACK=auto (engine/layout.py): each layout of the weights loaded and timed in a
#   throw-away child on the machine it runs on: a prompt of this many tokens prefilled (the
#   decisions' work) and this many tokens generated (chat's), each timed this many times, the
#   best kept; a child that has not finished within the timeout has failed.
LAYOUT_PROBE_PREFILL_TOKENS = 128
LAYOUT_PROBE_GENERATE_TOKENS = 8
LAYOUT_PROBE_REPEATS = 2
LAYOUT_PROBE_TIMEOUT_S = 180.0
# - the repacked layout is chosen only where it is at least this much faster (prefill, or
#   generation when chat is on): below it the unrepacked layout, whose one mmap'ed copy of the
#   weights every process shares, wins. Repeated runs of one layout on these 2-core VMs spread
#   by about 7 %, so a smaller measured gain may be noise.
LAYOUT_GAIN_MIN = 1.10
# - where memory is tight (every process's repacked copy would take over half the memory left
#   at start-up), only a gain of at least this much buys the copies.
LAYOUT_GAIN_LARGE = 1.5
# - a repacked layout that holds less than this share of the model file of its own repacked
#   nothing: the model has no tensor type with a repacked layout on this CPU ...
LAYOUT_REPACKED_SHARE_MIN = 0.05
# - ... and at least this much of its own (below: rounding in the allocator, not a copy);
LAYOUT_REPACKED_BYTES_MIN = 16 << 20
# - memory is tight for the repacked copies where they would take over this share of the
#   memory left at start-up;
LAYOUT_TIGHT_SHARE = 0.5
# - the probe's context (its prompt and generated tokens fit) and its untimed first compute,
#   which allocates the compute buffers.
LAYOUT_PROBE_CTX = 512
LAYOUT_PROBE_WARMUP_TOKENS = 16
