"""Write a tiny random-weight llama-architecture GGUF for tests that need a model instantly.

Byte-level BPE vocabulary (all 256 bytes, so any text tokenizes), ChatML special tokens and a
ChatML chat template. ``letter_merges=True`` adds merges that glue a space to the capital
letters (and a template whose answer follows a space), which breaks the "answer letter is its own
token after the prompt" property;
``boundary_merge=True`` glues a quote to a comma, which breaks the state-prefix split.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte <-> printable-character table, which llama.cpp's BPE expects.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tiny_model(
    path: Path,
    *,
    seed: int = 0,
    letter_merges: bool = False,
    boundary_merge: bool = False,
    chat_template: str | None = CHATML_TEMPLATE,
    n_embd: int = 64,
    n_layer: int = 2,
    n_ctx: int = 4096,
) -> Path:
    rng = np.random.default_rng(seed)
    table = _byte_to_unicode()
    tokens = [table[b] for b in range(256)]
    merges = [f"{table[ord('a')]} {table[ord('b')]}"]
    if letter_merges:
        # " A" as one token, and a template whose answer position follows a space: the letter
        # then merges with the prompt's last character.
        space = table[ord(" ")]
        for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZ":
            merges.append(f"{space} {letter}")
            tokens.append(space + letter)
        chat_template = (chat_template or CHATML_TEMPLATE).replace(
            "'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\nAnswer: '"
        )
    if boundary_merge:
        # '",' as one token: a string state's closing quote then merges with the next comma,
        # so the state's tokens are no longer a prefix of the whole prompt's tokens.
        merges.append(f"{table[ord(chr(34))]} {table[ord(',')]}")
        tokens.append(table[34] + table[ord(",")])
    tokens.append("ab")
    tokens += SPECIALS
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    types += [gguf.TokenType.CONTROL] * len(SPECIALS)
    n_vocab = len(tokens)
    n_head = 4
    n_ff = n_embd * 2

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("semif-tiny-test")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, n_embd))
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
