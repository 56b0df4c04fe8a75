"""The tiny model's vocabulary: GPT-2's byte-to-unicode map, English words with their BPE merges
(so evidence texts tokenize into real words, as on a real model) and filler pair tokens."""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable-character table, which llama.cpp's BPE expects."""
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


# The fast weights: one pool of unit normals (a length that no row width divides, so rows are
# not repeats of each other), sliced from a random offset for each tensor.
def pair_tokens(count: int, taken: Sequence[str] = ()) -> list[str]:
    """`count` two-byte tokens (in the byte-to-unicode alphabet, so every one detokenizes):
    filler that brings a vocabulary to a real model's size. Without merges the tokenizer never
    produces them, so text still tokenizes one byte a token."""
    table = byte_to_unicode()
    seen = set(taken)
    out: list[str] = []
    for a in range(256):
        for b in range(256):
            if len(out) == count:
                return out
            token = table[a] + table[b]
            if token not in seen:
                out.append(token)
    if len(out) < count:
        raise ValueError(f"at most {len(out)} two-byte filler tokens, asked for {count}")
    return out


# Words that `words=WORDS` makes single tokens (alone and after a space), so that English text
# and the decision prompt tokenize at about a real model's rate (~4-5 characters a token)
# instead of one byte a token: the decision prompt's own words, JSON's punctuation, and
# common English (bench/gpu.py builds its evidence texts from them).
_WORD_TEXT = """
    You are a careful decision function Apply the criterion to evidence and choose one listed
    option that fits best Answer with only letter of nothing else letters options description
    state question which should handle this ticket customer email order support queue billing
    account access shipping delivery payment refund invoice password reset login problem
    problems tracking team urgent late charged twice again still never arrives cannot log in
    the a an of to in on for with from by at as is was were be been has have had it its this
    that these those there their they we you he she not no yes or but if then than so very
    more most less all any some each every other new old first last next day days week month
    time year today before after during while since until about over under into out up down
    again also only just even well good bad high low long short small large same different
    please thanks hello customer service product price cost store shop web card bank warehouse
    carrier package parcel box address city street number date hour minute call phone message
    reply sent send received receive open closed help issue request report update change cancel
    return exchange damaged missing wrong right correct item items quantity total amount due
    paid pay charge credit debit balance plan subscription renew renewal trial free premium
    error failed failure works working broken slow fast crash bug app website page button
    system user assistant three times requested invoices refunds questions answers case cases
"""
WORDS = (*_WORD_TEXT.split(), '{"', '":', '",', '"}', '"},', "}]", '."')


def word_merges(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """Tokens and BPE merges, learned the way BPE is trained (the most frequent adjacent pair
    first, until none is left), that make each word one token: alone, after a space,
    capitalised, and capitalised after a space. Applied in rank order, as llama.cpp applies
    them, they give every such word back as one token."""
    table = byte_to_unicode()
    forms = dict.fromkeys(
        f for w in words for f in (w, " " + w, w[:1].upper() + w[1:], " " + w[:1].upper() + w[1:])
    )
    encoded = ("".join(table[b] for b in form.encode("utf-8")) for form in forms)
    pieces = [list(text) for text in encoded if len(text) > 1]
    tokens: list[str] = []
    merges: list[str] = []
    known = {table[b] for b in range(256)}
    while pieces:
        counts: dict[tuple[str, str], int] = {}
        for seq in pieces:
            for pair in itertools.pairwise(seq):
                counts[pair] = counts.get(pair, 0) + 1
        left, right = max(counts, key=lambda p: (counts[p], p))
        joined = left + right
        merges.append(f"{left} {right}")
        if joined not in known:
            known.add(joined)
            tokens.append(joined)
        merged = []
        for seq in pieces:
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == left and seq[i + 1] == right:
                    out.append(joined)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            if len(out) > 1:
                merged.append(out)
        pieces = merged
    return tokens, merges
