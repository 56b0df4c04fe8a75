"""Prompt rendering and the letter checks: pure functions, no model."""

from __future__ import annotations

import json

from semif_proxy.engine.prompt import (
    CHATML_TEMPLATE,
    PROMPT_VERSION,
    SYSTEM_TEXT,
    ChatTemplate,
    check_letters,
    render_decision,
    user_payload,
)


def test_user_turn_shows_letters_not_ids() -> None:
    payload = user_payload({"ticket": 7}, "Which queue?", ["Billing", "Access"])
    assert list(payload) == ["evidence", "criterion", "options"]
    assert payload["options"] == [
        {"letter": "A", "description": "Billing"},
        {"letter": "B", "description": "Access"},
    ]


def test_chatml_fallback_renders_system_user_and_generation_prompt() -> None:
    template = ChatTemplate(None)
    assert template.is_fallback and template.source == CHATML_TEMPLATE
    rendered = render_decision(template, "s", "q?", ["x", "y"])
    assert rendered.text.startswith(f"<|im_start|>system\n{SYSTEM_TEXT}<|im_end|>\n")
    assert rendered.text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert PROMPT_VERSION == "semif-letter-v1"


def test_json_state_is_kept_as_json_and_prefix_ends_after_it() -> None:
    state = {"order": {"id": 17, "items": ["lamp"]}, "note": "ünïcode"}
    rendered = render_decision(ChatTemplate(None), state, "Refund?", ["yes", "no"])
    assert (
        '{"evidence": {"order": {"id": 17, "items": ["lamp"]}, "note": "ünïcode"}' in rendered.text
    )
    assert rendered.text.startswith(rendered.state_prefix)
    assert rendered.state_prefix.endswith(json.dumps(state, ensure_ascii=False))
    other = render_decision(ChatTemplate(None), state, "Other question", ["a", "b", "c"])
    assert other.state_prefix == rendered.state_prefix


def test_template_bos_is_stripped_when_the_model_adds_it() -> None:
    template = ChatTemplate("{{ bos_token }}" + CHATML_TEMPLATE, bos_token="<s>", strip_bos=True)
    assert not render_decision(template, "s", "q", ["a", "b"]).text.startswith("<s>")
    keep = ChatTemplate("{{ bos_token }}" + CHATML_TEMPLATE, bos_token="<s>", strip_bos=False)
    assert render_decision(keep, "s", "q", ["a", "b"]).text.startswith("<s>")


def test_letter_check_with_a_clean_tokenizer() -> None:
    def chars(text: str) -> list[int]:
        return [ord(c) for c in text]

    check = check_letters(chars, chars, chr, "prompt\n")
    assert check.ok and check.token_ids[:3] == (65, 66, 67) and len(check.token_ids) == 26


def test_letter_check_reports_merges_across_the_answer_boundary() -> None:
    def merging(text: str) -> list[int]:
        out: list[int] = []
        for c in text:
            if out and out[-1] == ord("\n") and c.isupper():
                out[-1] = 1000 + ord(c)  # "\nA" becomes one token
            else:
                out.append(ord(c))
        return out

    check = check_letters(merging, merging, chr, "prompt\n")
    assert not check.ok
    assert any("does not tokenize as prompt tokens" in p for p in check.problems)


def test_special_token_policy_walks_every_string_in_document_order() -> None:
    import pytest

    from semif_proxy.engine.injection import SpecialTokenPolicy, walk_strings
    from semif_proxy.errors import InvalidRequest

    value = {"a": ["x", {"<k>": "y"}], "b": "z"}
    assert list(walk_strings(value, "s")) == [
        ("s", "a"),
        ("s.a[0]", "x"),
        ("s.a[1]", "<k>"),
        ("s.a[1].<k>", "y"),
        ("s", "b"),
        ("s.b", "z"),
    ]
    deep: object = "<|im_end|>"
    for _ in range(10_000):  # far deeper than Python's recursion limit
        deep = [deep]
    policy = SpecialTokenPolicy(["<|im_start|>", "<|im_end|>", " "])  # blank texts are ignored
    with pytest.raises(InvalidRequest) as err:
        policy.check(deep, "d.state")
    assert err.value.field == "d.state" + "[0]" * 10_000 and "'<|im_end|>'" in err.value.message
    policy.check({"ok": ["plain text", "with spaces"]}, "d.state")  # nothing special: no error
    SpecialTokenPolicy([]).check("<|im_start|>", "x")  # a vocabulary without specials
