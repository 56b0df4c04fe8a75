"""The compiled engine on the real SmolLM2 model and on generated tiny models."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from semif_proxy.engine import native
from tests.conftest import GPU_LAYERS
from tests.helpers.one_piece import continuation_logprobs

PROMPT = "<|im_start|>user\nIs the sky blue? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n"


def letter_ids(engine: native.Engine) -> list[int]:
    return [engine.tokenize(c, parse_special=False)[0] for c in "ABCD"]


def test_build_is_the_pinned_llama_cpp() -> None:
    info = native.build_info()
    assert info["llama_cpp_build"] == 11312
    assert info["llama_cpp_commit"] == "0c1e570"
    assert "CPU" in str(info["system_info"])


def test_the_extension_exports_its_module_init_alone() -> None:
    """Any other exported symbol (a std:: or pybind11 template instance, a static libstdc++)
    can interpose on libllama's own when libllama was built by another compiler; on the GPU
    host that crashed the tokenizer's std::regex inside llama_model_load_from_file."""
    from semif_proxy import _engine
    from tests.helpers.elf import exported_symbols

    assert exported_symbols(_engine.__file__) == {"PyInit__engine"}


def test_bundled_llama_server_is_the_same_build() -> None:
    server = native.llama_server_path()
    assert server is not None and server.is_file()
    out = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=30)
    assert "build 11312" in out.stdout + out.stderr


def test_model_metadata(engine: native.Engine, model_path: Path) -> None:
    assert engine.n_vocab == 49152
    assert engine.n_ctx == 4096
    assert "<|im_start|>" in (engine.chat_template or "")
    assert engine.metadata["general.architecture"] == "llama"
    assert engine.model_path == str(model_path)
    specials = {engine.token_piece(t) for t in engine.special_tokens()}
    assert b"<|im_start|>" in specials and b"<|im_end|>" in specials


def test_tokenize_round_trip_and_special_parsing(engine: native.Engine) -> None:
    text = "Route this ticket: password reset email never arrives."
    tokens = engine.tokenize(text, parse_special=False)
    assert engine.detokenize(tokens) == text
    assert len(engine.tokenize("<|im_start|>", parse_special=True)) == 1
    assert len(engine.tokenize("<|im_start|>", parse_special=False)) > 1


LONG = PROMPT.replace(
    "Is the sky blue?", "Is the sky blue? " + "The sun is up and there are no clouds. " * 12
)


def test_same_logits_fresh_copied_and_restored(engine: native.Engine) -> None:
    full = engine.tokenize(LONG, add_special=True)
    # A prefix that ends on an aligned cell: branches then sit right after it, exactly where
    # the suffix sits when the whole prompt is evaluated in one go.
    cut = engine.cell_align
    prefix, suffix = full[:cut], full[cut:]
    ids = letter_ids(engine)
    engine.reset()
    fresh, fresh_lse, _ = engine.score(prefix + suffix, [[]], ids)
    engine.reset()
    copied, copied_lse, stats = engine.score(prefix, [suffix, suffix[:3]], ids, "copy")
    assert stats["decode_calls"] == 2  # one prefill, one batch for both branches
    restored, restored_lse, _ = engine.score(prefix, [suffix, suffix[:3]], ids, "restore")
    # Bit-identical on the CPU (flash attention off, branch cells aligned); GPU kernels may
    # differ in the last bits, hence the tolerance there.
    tol = 0 if GPU_LAYERS == 0 else 1e-3
    np.testing.assert_allclose(copied[0], fresh[0], atol=tol, rtol=0)
    np.testing.assert_allclose(restored[0], fresh[0], atol=tol, rtol=0)
    np.testing.assert_allclose(restored[1], copied[1], atol=tol, rtol=0)
    assert abs(copied_lse[0] - fresh_lse[0]) <= tol + 1e-9
    assert abs(restored_lse[0] - fresh_lse[0]) <= tol + 1e-9


@pytest.mark.parametrize(("model", "n_ubatch"), [("smollm2", 512), ("smollm2", 37), ("tiny", 64)])
def test_a_fresh_prefix_shares_its_calls_with_the_first_restored_question(
    request: pytest.FixtureRequest, model: str, n_ubatch: int
) -> None:
    """Restored branches (the CPU's mode): the first question goes into the prefix's ubatches,
    so a decision costs the llama_decode calls of its one-piece prompt, and every number stays
    what the prefix held first gives: the questions' logits and the prefix's saved state. (The
    tiny model is F16: there a second output row in that call moved the question's logits.)"""
    path = request.getfixturevalue("model_path" if model == "smollm2" else "tiny_model")
    engine = native.Engine(
        str(path), n_ctx=2048, n_threads=2, n_gpu_layers=GPU_LAYERS, n_ubatch=n_ubatch
    )
    full = engine.tokenize(LONG * 3, add_special=True)
    # Aligned: the first question needs no filler cells.
    cut = (len(full) * 2 // 3) // engine.cell_align * engine.cell_align
    assert 0 < cut < len(full) - 3
    prefix, first, second = full[:cut], full[cut:], full[cut : cut + 3]
    ids = letter_ids(engine)

    def calls(start: int, n: int) -> int:
        """llama_decode calls for n tokens from position `start`: a question is cut where its
        one-piece stream is, at multiples of n_ubatch (Engine::decode_branches), where the
        ubatch size is on the cell grid."""
        if n_ubatch % engine.cell_align:
            return -(-n // n_ubatch)
        return (start + n - 1) // n_ubatch - start // n_ubatch + 1

    fused, fused_lse, stats = engine.score(prefix, [first, second], ids, "restore")
    assert stats["prefix_reused"] == 0 and stats["padding_tokens"] == 0
    assert stats["decode_calls"] == -(-len(full) // n_ubatch) + calls(cut, len(second))
    assert stats["suffix_tokens"] == len(first) + len(second)
    assert stats["suffix_seconds"] > 0
    fused_state = engine.get_prefix_state()
    assert engine.get_prefix_logits().size == 0  # not computed: see Engine::ensure_prefix

    held, held_lse, stats = engine.score(prefix, [first, second], ids, "restore")
    assert stats["prefix_reused"] == len(prefix)
    assert stats["decode_calls"] == calls(cut, len(first)) + calls(cut, len(second))
    # The prefix's own logits are read: it is evaluated again, alone.
    _, _, stats = engine.score(prefix, [[], first], ids, "restore")
    assert stats["prefix_reused"] == 0
    assert stats["decode_calls"] == -(-len(prefix) // n_ubatch) + calls(cut, len(first))
    alone_state = engine.get_prefix_state()
    engine.reset()
    whole, whole_lse, stats = engine.score(full, [[]], ids)
    assert stats["decode_calls"] == -(-len(full) // n_ubatch)
    tol = 0 if GPU_LAYERS == 0 else 1e-3
    np.testing.assert_allclose(fused, held, atol=tol, rtol=0)
    np.testing.assert_allclose(fused_lse, held_lse, atol=tol, rtol=0)
    np.testing.assert_allclose(fused[0], whole[0], atol=tol, rtol=0)
    assert abs(fused_lse[0] - whole_lse[0]) <= tol + 1e-9
    if GPU_LAYERS == 0:
        assert fused_state == alone_state  # the prefix's cells, byte for byte

    # A label tree's root (its suffix's last token) shares the prefix's calls too; the prefix
    # is then held without its logits, which copied branches do not read: reused.
    engine.reset()
    root, root_lse, _, _, stats = engine.score_tree(
        prefix, first, second, [-1, 0, 1], [ids, ids, ids], ids
    )
    assert stats["decode_calls"] == -(-len(full) // n_ubatch) + 1  # and one for the 3 nodes
    np.testing.assert_allclose(root, whole[0], atol=tol, rtol=0)
    assert abs(root_lse - whole_lse[0]) <= tol + 1e-9
    copied, _, stats = engine.score(prefix, [first, second], ids, "copy")
    assert stats["prefix_reused"] == len(prefix)
    # Two output rows in that call: equal to the last bits only where the layout matches.
    np.testing.assert_allclose(copied[0], whole[0], atol=1e-4, rtol=0)

    # A prefix off the cell grid: its first question needs filler, so it is decoded apart.
    engine.reset()
    _, _, stats = engine.score(full[: cut - 1], [full[cut - 1 :]], ids, "restore")
    assert stats["padding_tokens"] > 0
    assert stats["decode_calls"] == -(-(cut - 1) // n_ubatch) + -(
        -(len(full) - cut + 1 + stats["padding_tokens"]) // n_ubatch
    )


@pytest.mark.parametrize("cut", [1, 31, 45, 62, 100])
def test_branch_logits_do_not_depend_on_neighbours(engine: native.Engine, cut: int) -> None:
    """Any prefix length: a suffix scored alone, next to others, twice in one batch, after a
    prefix reuse and after a state restore gets the same bits (measured before the fix: up to
    0.22 apart, from softmax chunks that mixed prefix and branch cells)."""
    full = engine.tokenize(LONG, add_special=True)
    prefix, suffix = full[:cut], full[cut:]
    other = engine.tokenize(" Unrelated words come first here.")
    ids = letter_ids(engine)
    tol = 0 if GPU_LAYERS == 0 else 1e-3
    engine.reset()
    alone, _, _ = engine.score(prefix, [suffix], ids)
    mixed, _, stats = engine.score(prefix, [other, suffix, suffix, other[:2], suffix[:5]], ids)
    assert stats["prefix_reused"] == len(prefix)
    restored, _, _ = engine.score(prefix, [other, suffix], ids, "restore")
    state, logits = engine.get_prefix_state(), engine.get_prefix_logits()
    engine.reset()
    engine.score(full[:7], [suffix[:9]], ids)  # leave other cells behind first
    engine.set_prefix_state(state, prefix, logits)
    after_restore, _, _ = engine.score(prefix, [suffix], ids)
    for row in (mixed[1], mixed[2], restored[1], after_restore[0]):
        np.testing.assert_allclose(row, alone[0], atol=tol, rtol=0)


def test_ubatch_size_changes_the_calls_not_the_numbers(model_path: Path) -> None:
    """The engine's ubatch (SEMIF_UBATCH_SIZE) splits a prefill and the suffixes into more
    llama_decode calls and leaves every logit as it is (the default differs by device)."""
    results = {}
    for n_ubatch in (512, 128, 37):
        engine = native.Engine(
            str(model_path), n_ctx=2048, n_threads=2, n_gpu_layers=GPU_LAYERS, n_ubatch=n_ubatch
        )
        assert engine.n_ubatch == n_ubatch
        prefix = engine.tokenize(LONG * 5, add_special=True)
        suffixes = [engine.tokenize(" A"), engine.tokenize(" The answer is")]
        results[n_ubatch] = engine.score(prefix, suffixes, letter_ids(engine))
        del engine
    stats = results[512][2]
    assert stats["prefix_tokens"] > 512
    # One call per ubatch of the prefix, and of the suffixes with their alignment padding.
    branch_tokens = stats["suffix_tokens"] + stats["padding_tokens"]
    for n, (_, _, got) in results.items():
        assert got["decode_calls"] == -(-stats["prefix_tokens"] // n) + -(-branch_tokens // n)
    tol = 0 if GPU_LAYERS == 0 else 1e-3
    for n in (128, 37):
        np.testing.assert_allclose(results[n][0], results[512][0], atol=tol, rtol=0)
        np.testing.assert_allclose(results[n][1], results[512][1], atol=tol, rtol=0)


def test_many_suffixes_are_grouped_by_free_sequences(engine: native.Engine) -> None:
    prefix = engine.tokenize(PROMPT, add_special=True)
    suffixes = [engine.tokenize(f" option {i}") for i in range(20)]
    logits, lse, stats = engine.score(prefix, suffixes, letter_ids(engine))
    assert logits.shape == (20, 4) and lse.shape == (20,)
    # 6 branch sequences (n_seq=8, one kept for padding): 20 suffixes need 4 suffix decodes.
    assert stats["decode_calls"] <= 1 + 4
    assert stats["padding_tokens"] > 0
    alone, _, _ = engine.score(prefix, [suffixes[13]], letter_ids(engine))
    np.testing.assert_array_equal(alone[0], logits[13])


def test_prefix_state_save_and_restore(engine: native.Engine) -> None:
    prefix = engine.tokenize(PROMPT, add_special=True)
    ids = letter_ids(engine)
    before, _, _ = engine.score(prefix, [[]], ids)
    state = engine.get_prefix_state()
    logits = engine.get_prefix_logits()
    assert logits.shape == (engine.n_vocab,)
    engine.reset()
    engine.set_prefix_state(state, prefix, logits)
    after, _, stats = engine.score(prefix, [[]], ids)
    assert stats["prefix_reused"] == len(prefix) and stats["decode_calls"] == 0
    np.testing.assert_array_equal(after, before)
    suffix = engine.tokenize(" B")
    restored, _, _ = engine.score(prefix, [suffix], ids)
    engine.reset()
    fresh, _, _ = engine.score(prefix, [suffix], ids)
    np.testing.assert_array_equal(restored, fresh)  # bit-identical, not merely close
    with pytest.raises(native.LlamaError) as err:
        engine.set_prefix_state(state, prefix[:-2], logits)
    assert err.value.code == native.ERR_STATE_FAILED
    with pytest.raises(native.LlamaError, match="n_vocab"):
        engine.set_prefix_state(state, prefix, logits[:10])


# About 30 model calls on a few hundred tokens: seconds alone, more beside other work.
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("model", "n_ubatch"), [("smollm2", 37), ("tiny", 64)])
def test_rows_at_a_suffix_s_last_positions(
    request: pytest.FixtureRequest, model: str, n_ubatch: int
) -> None:
    """score(..., outputs=[n]) reads the rows at a suffix's last n positions (a continuation's
    tokens): after a held or fused prefix, restored or copied, they equal the prompt evaluated
    whole with those rows read (an empty prefix in restore mode: one stream of ubatches),
    bit for bit on the CPU; each row is its position's (against that position evaluated as
    the last one, which differs only in the last bits); bad counts are refused."""
    path = request.getfixturevalue("model_path" if model == "smollm2" else "tiny_model")
    engine = native.Engine(
        str(path), n_ctx=2048, n_threads=2, n_gpu_layers=GPU_LAYERS, n_ubatch=n_ubatch
    )
    full = engine.tokenize(LONG * 2, add_special=True)
    n = 9
    # The rows straddle a ubatch boundary of the whole prompt's evaluation (a multiple of
    # n_ubatch), which the held prefix's branch does not start on: there the one-piece
    # evaluation's last layer holds 5 and 4 of the rows in two calls, the branch's all 9 in one.
    end = 4 * n_ubatch + 4
    assert len(full) >= end
    full = full[:end]
    cut = (end - 20) // engine.cell_align * engine.cell_align
    assert cut > 0 and cut % n_ubatch != 0 and end - cut > n and end - n < end - 4
    prefix, first, second = full[:cut], full[cut:], full[cut : cut + 5]
    ids = sorted(set(full))
    whole, whole_lse, stats = engine.score([], [full], ids, "restore", [n])
    assert whole.shape == (n, len(ids)) and stats["decode_calls"] == -(-len(full) // n_ubatch)
    short, short_lse, _ = engine.score([], [full[: cut + 5]], ids, "restore", [2])
    tol = 0 if GPU_LAYERS == 0 else 1e-3
    engine.reset()
    for held in (False, True):  # the first suffix fused with the prefix's ubatches, then held
        rows, lse, stats = engine.score(prefix, [first, second], ids, "restore", [n, 2])
        assert stats["prefix_reused"] == (len(prefix) if held else 0)
        assert rows.shape == (n + 2, len(ids))
        np.testing.assert_allclose(rows[:n], whole, atol=tol, rtol=0)
        np.testing.assert_allclose(lse[:n], whole_lse, atol=tol, rtol=0)
        np.testing.assert_allclose(rows[n:], short, atol=tol, rtol=0)
        np.testing.assert_allclose(lse[n:], short_lse, atol=tol, rtol=0)
    copied, copied_lse, _ = engine.score(prefix, [second, first], ids, "copy", [2, n])
    np.testing.assert_allclose(copied_lse[2:], whole_lse, atol=tol, rtol=0)
    np.testing.assert_allclose(copied[2:], whole, atol=tol, rtol=0)
    np.testing.assert_allclose(copied[:2], short, atol=tol, rtol=0)
    # Each row is its own position's: of the prompt's ends read alone (one output row, in
    # other calls, so not to the bit), the nearest to row k is the one ending there.
    first_end = len(full) - n - 1
    reader = native.Engine(str(path), n_ctx=2048, n_threads=2, n_gpu_layers=GPU_LAYERS)
    alone = []
    for stop in range(first_end, len(full) + 1):
        reader.reset()
        alone.append(reader.score(full[:stop], [[]], ids)[0][0])
    del reader
    for k in range(n):
        distance = [float(np.abs(whole[k] - a).max()) for a in alone]
        assert first_end + int(np.argmin(distance)) == len(full) - n + k + 1, (k, distance)
    # One row per suffix, as without outputs; an empty suffix reads the prefix's row.
    rows, _, _ = engine.score(prefix, [[], first], ids, "restore", [1, 1])
    plain, _, _ = engine.score(prefix, [[], first], ids, "restore")
    np.testing.assert_array_equal(rows, plain)
    bad = [
        (prefix, [first], [0], "between 1 and"),
        (prefix, [first], [len(first) + 1], "between 1 and"),
        (prefix, [[]], [2], "between 1 and"),
        (prefix, [first, second], [1], "one count per suffix"),
        ([], [[], first], [], "prefix must hold"),
    ]
    for p, suffixes, outputs, words in bad:
        with pytest.raises(native.LlamaError, match=words) as err:
            engine.score(p, suffixes, ids, "restore", outputs)
        assert err.value.code == native.ERR_BAD_ARGUMENT
    with pytest.raises(native.LlamaError, match="prefix must hold"):
        engine.score([], [first], ids, "copy", [n])
    # Still exact after the refusals.
    again, _, _ = engine.score(prefix, [first], ids, "restore", [n])
    np.testing.assert_allclose(again, whole, atol=tol, rtol=0)


def test_logits_match_llama_server(engine: native.Engine, llama_server_url: str) -> None:
    import json
    import urllib.request

    body = json.dumps(
        {
            "prompt": PROMPT,
            "n_predict": 1,
            "n_probs": 10,
            "temperature": 0,
            "cache_prompt": False,
            "post_sampling_probs": False,
        }
    ).encode()
    req = urllib.request.Request(
        f"{llama_server_url}/completion", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        data = json.load(resp)
    top = data["completion_probabilities"][0]["top_logprobs"]
    ids = [int(t["id"]) for t in top]
    prompt_tokens = engine.tokenize(PROMPT, add_special=True)
    logits, lse, _ = engine.score(prompt_tokens, [[]], ids)
    ours = logits[0].astype(np.float64) - lse[0]
    theirs = np.array([t["logprob"] for t in top])
    np.testing.assert_allclose(ours, theirs, atol=2e-3)


def test_decode_releases_the_gil(engine: native.Engine) -> None:
    """While a decode runs on another thread, this thread keeps running Python. Were the GIL
    held, this thread would stand still for the whole call: its longest pause would be as long
    as the call. Counted in this thread's own progress, not in a fixed number of ticks."""
    prefix = engine.tokenize(PROMPT * 20, add_special=True)
    span: dict[str, float] = {}
    done = threading.Event()

    def work() -> None:
        engine.reset()
        span["start"] = time.monotonic()
        engine.score(prefix, [[]], letter_ids(engine))
        span["end"] = time.monotonic()
        done.set()

    thread = threading.Thread(target=work)
    beats = []
    thread.start()
    while not done.is_set():
        beats.append(time.monotonic())
        time.sleep(0.001)
    thread.join()
    inside = [t for t in beats if span["start"] <= t <= span["end"]]
    gaps = np.diff([span["start"], *inside, span["end"]])
    assert len(inside) >= 2 and gaps.max() < 0.5 * (span["end"] - span["start"]), (
        len(inside),
        gaps.max(),
        span["end"] - span["start"],
    )


def test_llama_logs_reach_python_logging(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="semif_proxy.llama"):
        native.Engine(str(tiny_model), n_ctx=256, n_threads=1)
    assert any(r.name == "semif_proxy.llama" for r in caplog.records)


def test_tiny_model_loads_and_scores(tiny_model: Path) -> None:
    tiny = native.Engine(str(tiny_model), n_ctx=256, n_threads=1, n_seq=4)
    assert tiny.chat_template and "<|im_start|>" in tiny.chat_template
    ids = tiny.tokenize("A", parse_special=False)
    assert len(ids) == 1 and tiny.token_piece(ids[0]) == b"A"
    logits, lse, _ = tiny.score(tiny.tokenize("hello", add_special=True), [[]], ids)
    assert np.isfinite(logits).all() and np.isfinite(lse).all()


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(native.LlamaError, match="not found") as err:
        native.Engine(str(tmp_path / "nope.gguf"))
    assert err.value.code == native.ERR_LOAD_FAILED


def test_non_gguf_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_text("this is not a model")
    with pytest.raises(native.LlamaError, match="not a GGUF"):
        native.Engine(str(path))


def test_corrupt_gguf_is_a_clear_error(tmp_path: Path, tiny_model: Path) -> None:
    data = tiny_model.read_bytes()
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(native.LlamaError, match="failed to load") as err:
        native.Engine(str(path))
    assert err.value.code == native.ERR_LOAD_FAILED


def test_prompt_longer_than_context(tiny_model: Path) -> None:
    tiny = native.Engine(str(tiny_model), n_ctx=64, n_threads=1)
    long_prompt = tiny.tokenize("x" * (tiny.n_ctx + 10))
    with pytest.raises(native.LlamaError, match=f"context holds {tiny.n_ctx}") as err:
        tiny.score(long_prompt, [[]], [1])
    assert err.value.code == native.ERR_CONTEXT_OVERFLOW
    # The engine stays usable after the refusal.
    logits, _, _ = tiny.score(tiny.tokenize("short"), [[]], [1])
    assert logits.shape == (1, 1)


def test_bad_token_ids_are_rejected(engine: native.Engine) -> None:
    with pytest.raises(native.LlamaError, match="outside the vocabulary") as err:
        engine.score([1, 2, 3], [[]], [engine.n_vocab])
    assert err.value.code == native.ERR_BAD_ARGUMENT
    with pytest.raises(native.LlamaError, match="mode must be"):
        engine.score([1, 2, 3], [[]], [1], "sideways")


def test_label_tree_in_small_groups_and_small_batches(tiny_model: Path) -> None:
    """score_tree with 3 sequences (2 leaves per group: shared nodes decoded again) and batches
    of 8 tokens (a group split across decode calls) against each label decoded on its own
    (one-piece evaluations); a malformed tree is refused and leaves the engine exact."""
    engine = native.Engine(str(tiny_model), n_ctx=512, n_threads=2, n_seq=3, n_batch=8)
    prompt = engine.tokenize("<|im_start|>assistant\nThe answer is ", add_special=True)
    prefix, suffix = prompt[:8], prompt[8:]
    end = 2
    # Labels 1, 12, 123, 23, 4, 15, 45 ("1" is 49): by hand, the nodes 1, 12, 2, 4 (the proper
    # prefixes of the scored sequences 1|end, 12|end, 123, 23, 4|end, 15, 45); its leaves
    # 12, 2 and 4 need three sequences, two groups here.
    tokens, parent = [49, 50, 50, 52], [-1, 0, -1, -1]
    ids = [[end, 50, 53], [end, 51], [51], [end, 53]]
    root_ids = [49, 50, 52]
    root, root_lse, nodes, node_lse, stats = engine.score_tree(
        prefix, suffix, tokens, parent, ids, root_ids
    )
    assert stats["suffix_tokens"] == len(suffix) + 4
    sequences = [[49, end], [49, 50, end], [49, 50, 51], [50, 51], [52, end], [49, 53], [52, 53]]
    direct = continuation_logprobs(engine, prompt, sequences)

    def lp(row: np.ndarray, lse: float, token: int, want: list[int]) -> float:
        return float(row[want.index(token)]) - lse

    first = {t: lp(root, root_lse, t, root_ids) for t in root_ids}
    ours = [
        first[49] + lp(nodes[0], node_lse[0], end, ids[0]),
        first[49] + lp(nodes[0], node_lse[0], 50, ids[0]) + lp(nodes[1], node_lse[1], end, ids[1]),
        first[49] + lp(nodes[0], node_lse[0], 50, ids[0]) + lp(nodes[1], node_lse[1], 51, ids[1]),
        first[50] + lp(nodes[2], node_lse[2], 51, ids[2]),
        first[52] + lp(nodes[3], node_lse[3], end, ids[3]),
        first[49] + lp(nodes[0], node_lse[0], 53, ids[0]),
        first[52] + lp(nodes[3], node_lse[3], 53, ids[3]),
    ]
    np.testing.assert_allclose(ours, direct, atol=1e-3)
    with pytest.raises(native.LlamaError, match="parent among the nodes before it"):
        engine.score_tree(prefix, suffix, [49, 50], [1, -1], [[50], [51]], root_ids)
    engine.reset()
    whole, _, _ = engine.score(prompt, [[]], root_ids)
    engine.reset()
    split, _, _ = engine.score(prefix, [suffix], root_ids, "restore")
    np.testing.assert_array_equal(split[0], whole[0])
    np.testing.assert_array_equal(root, whole[0])  # the first label tokens: one-piece numbers
