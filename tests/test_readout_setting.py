"""SEMIF_READOUT: the readout of a question that names none, per question type, on the served
app (the real engine and SmolLM2): what it reads equals the same readout asked for by name, a
request's own readout wins, and the server says its default in /health."""

from __future__ import annotations

from pathlib import Path

import pytest

STATE = "Customer: I was charged twice for my March invoice and cannot log in to see it."
QUEUES = [
    {"id": "billing", "description": "payments, invoices and refunds"},
    {"id": "login", "description": "passwords and access to the account"},
]
SETTING = '{"default": "continuation", "noul": "direct", "score": "direct"}'


def decision(**fields: object) -> dict:
    return {"decision": {"id": "d", "state": STATE, "question": "Which queue?",
                         "options": QUEUES, **fields}}  # fmt: skip


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """A file where the model goes: settings check its path, nothing here loads it."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    return model


def system_one(**questions: dict) -> dict:
    return {"model": "jev-latest", "state": STATE, "questions": questions}


def test_questions_without_a_readout_get_the_servers(model_path: Path, start_app) -> None:
    server = start_app(model_path, {"SEMIF_READOUT": SETTING})
    health = server.call("GET", "/health").json()
    assert health["default_readout"] == {
        "default": "continuation",
        "noul": "direct",
        "score": "direct",
    }

    unnamed = server.call("POST", "/v1/decisions", decision(), timeout=120)
    named = server.call("POST", "/v1/decisions", decision(readout="continuation"), timeout=120)
    assert unnamed.status == named.status == 200, (unnamed.body, named.body)
    a, b = unnamed.json()["result"], named.json()["result"]
    assert a["readout"] == "continuation-logprobs" and a["normalization"] == "pmi"
    assert a["option_logits"] == b["option_logits"]  # the same reading, bit for bit
    # Normalisation belongs to continuation: sent without a readout under this default, it is
    # the default's and accepted.
    summed = server.call("POST", "/v1/decisions", decision(normalization="sum"), timeout=120)
    assert summed.status == 200 and summed.json()["result"]["normalization"] == "sum"
    own = server.call("POST", "/v1/decisions", decision(readout="letters"), timeout=120)
    assert own.json()["result"]["readout"] == "letter-logits"  # the request's own wins

    body = system_one(
        refund={"type": "noul", "instructions": "Is a refund owed?"},
        urgency={"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]},
        queue={"type": "choice", "criteria": {"billing": None, "login": None}},
        plain={"type": "noul", "instructions": "Is it about billing?", "readout": "letters"},
    )
    reply = server.call("POST", "/v1/systemone", body, timeout=120)
    assert reply.status == 200, reply.body
    answers = reply.json()["answers"]
    assert answers["refund"]["readout"] == "direct-yes-no"
    assert answers["urgency"]["readout"] == "direct-levels"
    assert answers["queue"]["readout"] == "continuation-logprobs"
    assert answers["plain"]["readout"] == "letter-logits"


def test_a_direct_default_answers_the_scores_it_cannot_read_with_letters(
    model_path: Path, start_app
) -> None:
    """Twelve levels are no single digits: a direct the request asks for is refused (422 at
    its readout), the server's direct default reads that score by letters instead."""
    server = start_app(model_path, {"SEMIF_READOUT": '{"score": "direct"}'})
    levels = [f"level {i}" for i in range(12)]
    wide = {"type": "score", "instructions": "How bad?", "criteria": levels}
    reply = server.call("POST", "/v1/systemone", system_one(q=wide), timeout=120)
    assert reply.status == 200, reply.body
    assert reply.json()["answers"]["q"]["readout"] == "letter-logits"
    asked = server.call("POST", "/v1/systemone", system_one(q={**wide, "readout": "direct"}))
    assert asked.status == 422
    assert asked.json()["detail"][0]["loc"] == ["body", "questions", "q", "readout"]


def test_under_the_default_setting_normalization_alone_is_refused(
    model_path: Path, start_app
) -> None:
    server = start_app(model_path)
    reply = server.call("POST", "/v1/decisions", decision(normalization="sum"))
    assert reply.status == 400
    assert reply.json()["error"]["field"] == "decision.normalization"
    assert server.call("GET", "/health").json()["default_readout"] == {"default": "letters"}


@pytest.mark.parametrize("value", ["direct", "sideways", '{"choice": "direct"}'])
def test_a_bad_setting_stops_the_server_naming_it(value: str, stand_in: Path) -> None:
    import subprocess
    import sys

    model = stand_in
    run = subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", "serve", "--model", str(model)],
        env={"PATH": "/usr/bin:/bin", "SEMIF_READOUT": value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "SEMIF_READOUT" in run.stderr and "Traceback" not in run.stderr


def test_a_default_reads_by_letters_what_it_cannot_read(model_path: Path, start_app) -> None:
    """A question the default readout would refuse is read by letters under it (a default
    answers every question); the same readout asked for by name is refused, naming the field."""
    server = start_app(
        model_path, {"SEMIF_READOUT": "deliberate", "SEMIF_MAX_DELIBERATION_TOKENS": "4"}
    )
    many = [{"id": f"q{i}", "description": f"queue number {i}"} for i in range(30)]
    wide = server.call("POST", "/v1/decisions", decision(options=many), timeout=120)
    assert wide.status == 200, wide.body
    assert wide.json()["result"]["readout"] == "label-sequence-logprobs"  # numbers past 26
    named = server.call("POST", "/v1/decisions", decision(options=many, readout="deliberate"))
    assert named.status == 400 and named.json()["error"]["field"] == "decision.readout"

    corrected = decision(bias_correction="contextual")
    reply = server.call("POST", "/v1/decisions", corrected, timeout=120)
    assert reply.status == 200, reply.body
    assert reply.json()["result"]["readout"] == "deliberate-letter-logits"
    assert reply.json()["result"]["bias_correction"] == "contextual"
    plain = server.call("POST", "/v1/decisions", decision(), timeout=120)
    assert plain.json()["result"]["readout"] == "deliberate-letter-logits"

    # Over the budget's limit: refused even where no model call is made (one option).
    one = decision(options=QUEUES[:1], readout="deliberate", deliberation_tokens=5)
    over = server.call("POST", "/v1/decisions", one)
    assert over.status == 400
    assert over.json()["error"]["field"] == "decision.deliberation_tokens"
    assert "SEMIF_MAX_DELIBERATION_TOKENS" in over.json()["error"]["message"]
    q = {"type": "choice", "criteria": {"billing": None}, "readout": "deliberate",
         "deliberation_tokens": 5}  # fmt: skip
    s1 = server.call("POST", "/v1/systemone", system_one(q=q))
    assert s1.status == 422
    assert s1.json()["detail"][0]["loc"] == ["body", "questions", "q", "deliberation_tokens"]


def test_a_continuation_default_reads_empty_descriptions_by_letters(
    model_path: Path, start_app
) -> None:
    server = start_app(model_path, {"SEMIF_READOUT": "continuation"})
    blank = [{"id": "billing", "description": ""}, {"id": "login", "description": "access"}]
    reply = server.call("POST", "/v1/decisions", decision(options=blank), timeout=120)
    assert reply.status == 200, reply.body
    assert reply.json()["result"]["readout"] == "letter-logits"
    named = server.call("POST", "/v1/decisions", decision(options=blank, readout="continuation"))
    assert named.status == 400


def test_a_server_bias_correction_applies_where_none_is_asked(model_path: Path, start_app) -> None:
    """SEMIF_BIAS_CORRECTION=contextual: a question that names none is corrected exactly as one
    that asks for it by name; `none` asked by the request wins; deliberate stays uncorrected."""
    server = start_app(
        model_path,
        {"SEMIF_BIAS_CORRECTION": "contextual", "SEMIF_MAX_DELIBERATION_TOKENS": "4"},
    )
    health = server.call("GET", "/health").json()
    assert health["default_bias_correction"] == {"default": "contextual"}
    unnamed = server.call("POST", "/v1/decisions", decision(), timeout=120).json()["result"]
    named = server.call(
        "POST", "/v1/decisions", decision(bias_correction="contextual"), timeout=120
    ).json()["result"]
    assert unnamed["bias_correction"] == "contextual"
    assert unnamed["probabilities"] == named["probabilities"]
    assert unnamed["content_free_logits"] == named["content_free_logits"]
    plain = server.call("POST", "/v1/decisions", decision(bias_correction="none"), timeout=120)
    assert "bias_correction" not in plain.json()["result"]
    assert plain.json()["result"]["probabilities"] != unnamed["probabilities"]
    thought = server.call("POST", "/v1/decisions", decision(readout="deliberate"), timeout=120)
    assert thought.status == 200, thought.body
    assert "bias_correction" not in thought.json()["result"]

    body = system_one(refund={"type": "noul", "instructions": "Is a refund owed?"})
    reply = server.call("POST", "/v1/systemone", body, timeout=120)
    assert reply.json()["answers"]["refund"]["bias_correction"] == "contextual"


def test_yes_no_questions_are_corrected_by_default(model_path: Path, start_app) -> None:
    """The defaults from the evidence (docs/readouts.md): a yes/no question that names no
    correction is read exactly as one that asks for `contextual`; choices, scores and decisions
    are not corrected; SEMIF_BIAS_CORRECTION=none turns it off for every type."""
    questions = {
        "refund": {"type": "noul", "instructions": "Is a refund owed?"},
        "queue": {"type": "choice", "criteria": {"billing": None, "login": None}},
    }
    named = {"refund": {**questions["refund"], "bias_correction": "contextual"}}
    plain = {"refund": {**questions["refund"], "bias_correction": "none"}}
    server = start_app(model_path)
    health = server.call("GET", "/health").json()
    assert health["default_bias_correction"] == {"default": "none", "noul": "contextual"}
    answers = server.call("POST", "/v1/systemone", system_one(**questions), timeout=120).json()
    by_name = server.call("POST", "/v1/systemone", system_one(**named), timeout=120).json()
    uncorrected = server.call("POST", "/v1/systemone", system_one(**plain), timeout=120).json()
    refund = answers["answers"]["refund"]
    assert refund["bias_correction"] == "contextual"
    assert refund["noul"] == by_name["answers"]["refund"]["noul"]
    assert refund["noul"] != uncorrected["answers"]["refund"]["noul"]
    assert "bias_correction" not in answers["answers"]["queue"]
    result = server.call("POST", "/v1/decisions", decision(), timeout=120).json()["result"]
    assert "bias_correction" not in result

    off = start_app(model_path, {"SEMIF_BIAS_CORRECTION": "none"})
    assert off.call("GET", "/health").json()["default_bias_correction"] == {"default": "none"}
    again = off.call("POST", "/v1/systemone", system_one(**questions), timeout=120).json()
    assert "bias_correction" not in again["answers"]["refund"]
    assert again["answers"]["refund"]["noul"] == uncorrected["answers"]["refund"]["noul"]


@pytest.mark.parametrize(
    ("value", "noul", "choice"),
    [
        (None, "contextual", "none"),
        ("none", "none", "none"),
        ("contextual", "contextual", "contextual"),
        ('{"default": "none"}', "none", "none"),
        ('{"choice": "contextual"}', "contextual", "contextual"),
        ('{"noul": "none", "default": "contextual"}', "none", "contextual"),
    ],
)
def test_one_name_or_a_json_default_replaces_the_yes_no_default(
    value: str | None, noul: str, choice: str
) -> None:
    from semif_proxy.settings.readouts import BiasCorrections, parse_bias_corrections

    got = BiasCorrections() if value is None else parse_bias_corrections(value)
    assert (got.for_type("noul"), got.for_type("choice")) == (noul, choice)


def test_a_bad_bias_correction_setting_names_the_variable(stand_in: Path) -> None:
    from semif_proxy.settings import SettingsError, load_settings

    model = stand_in
    for value in ("batchy", '{"noul": "sideways"}'):
        with pytest.raises(SettingsError, match="SEMIF_BIAS_CORRECTION") as caught:
            load_settings({"SEMIF_BIAS_CORRECTION": value}, model=str(model))
        assert "is not a bias correction" in str(caught.value)
    for value in ("batch", '{"noul": "batch"}'):  # per request only: a default has no batch
        with pytest.raises(SettingsError, match="asked per request"):
            load_settings({"SEMIF_BIAS_CORRECTION": value}, model=str(model))
    typed = load_settings({"SEMIF_BIAS_CORRECTION": '{"noul": "contextual"}'}, model=str(model))
    assert typed.bias_correction.for_type("noul") == "contextual"
    assert typed.bias_correction.for_type("choice") == "none"


# The best configuration on JevBench found so far, as a server's defaults (docs/readouts.md):
# choices read by continuation with PMI, yes/no and scores by letters, contextually corrected.
PER_TYPE = {
    "SEMIF_READOUT": '{"choice": "continuation"}',
    "SEMIF_NORMALIZATION": "pmi",
    "SEMIF_BIAS_CORRECTION": '{"noul": "contextual", "score": "contextual"}',
}


def test_a_server_normalization_applies_to_continuations_that_name_none(
    model_path: Path, start_app
) -> None:
    """SEMIF_NORMALIZATION: a question read by continuation that names no normalisation is
    read exactly as one that names the server's; a request's own wins; questions read by
    another readout are untouched (and still refuse a normalisation of their own)."""
    questions = {
        "refund": {"type": "noul", "instructions": "Is a refund owed?"},
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]},
        "queue": {"type": "choice", "criteria": {"billing": None, "login": None}},
    }
    named = {
        "refund": {**questions["refund"], "bias_correction": "contextual"},
        "urgency": {**questions["urgency"], "bias_correction": "contextual"},
        "queue": {**questions["queue"], "readout": "continuation", "normalization": "pmi"},
    }
    server = start_app(model_path, PER_TYPE)
    health = server.call("GET", "/health").json()
    assert health["default_normalization"] == {"default": "pmi"}
    assert health["default_readout"] == {"default": "letters", "choice": "continuation"}
    unnamed = server.call("POST", "/v1/systemone", system_one(**questions), timeout=120)
    by_name = server.call("POST", "/v1/systemone", system_one(**named), timeout=120)
    assert unnamed.status == by_name.status == 200, (unnamed.body, by_name.body)
    got, want = unnamed.json()["answers"], by_name.json()["answers"]
    assert got["queue"]["readout"] == "continuation-logprobs"
    assert got["queue"]["normalization"] == "pmi"
    # The same reading, bit for bit (the probabilities, not only the option they pick).
    assert got["queue"]["probabilities"] == want["queue"]["probabilities"]
    for qid, kind in (("refund", "noul"), ("urgency", "score")):
        assert got[qid]["readout"] == "letter-logits" and "normalization" not in got[qid]
        assert got[qid]["bias_correction"] == "contextual"
        assert got[qid][kind] == want[qid][kind]

    own = {"queue": {**questions["queue"], "normalization": "sum"}}
    summed = server.call("POST", "/v1/systemone", system_one(**own), timeout=120).json()
    assert summed["answers"]["queue"]["normalization"] == "sum"
    assert summed["answers"]["queue"]["probabilities"] != got["queue"]["probabilities"]
    # A decision is read by letters here: the server's normalisation does not touch it, and
    # one of its own is refused there as before, naming the field ...
    letters = server.call("POST", "/v1/decisions", decision(), timeout=120).json()["result"]
    assert letters["readout"] == "letter-logits" and "normalization" not in letters
    refused = server.call("POST", "/v1/decisions", decision(normalization="mean"), timeout=120)
    assert refused.status == 400 and "decision.normalization" in refused.body.decode()
    # ... and asked by continuation without one, it gets the server's.
    cont = server.call("POST", "/v1/decisions", decision(readout="continuation"), timeout=120)
    assert cont.status == 200 and cont.json()["result"]["normalization"] == "pmi"


@pytest.mark.parametrize(
    ("value", "choice", "noul"),
    [
        (None, "pmi", "pmi"),
        ("MEAN", "mean", "mean"),
        ('{"choice": "sum"}', "sum", "pmi"),
        ('{"default": "sum", "noul": "mean"}', "sum", "mean"),
    ],
)
def test_normalization_setting_by_type(value: str | None, choice: str, noul: str) -> None:
    from semif_proxy.settings.readouts import Normalizations, parse_normalizations

    got = Normalizations() if value is None else parse_normalizations(value)
    assert (got.for_type("choice"), got.for_type("noul")) == (choice, noul)


def test_a_normalization_by_type_reaches_only_that_type(stand_in: Path) -> None:
    """SEMIF_NORMALIZATION={"choice": "sum"}: System One choices read by continuation get sum,
    its yes/no questions and plain decisions read by continuation keep the default pmi (each
    looked up by its own type; planned only, nothing asked)."""
    from semif_proxy.api import services
    from semif_proxy.settings import load_settings

    model = stand_in
    env = {"SEMIF_NORMALIZATION": '{"choice": "sum"}', "SEMIF_READOUT": "continuation"}
    settings = load_settings(env, model=str(model))
    planned = services.SERVICES["decisions"].plan(decision(), settings, "0" * 64)
    assert planned.decisions[0].normalization == "pmi"
    body = system_one(
        queue={"type": "choice", "criteria": {"billing": "payments", "login": "access"}},
        refund={"type": "noul", "instructions": "Is a refund owed?"},
    )
    specs = {s.qid: s for s in services.SERVICES["systemone"].plan(body, settings, "0" * 64).specs}
    assert (specs["queue"].readout, specs["queue"].normalization) == ("continuation", "sum")
    assert (specs["refund"].readout, specs["refund"].normalization) == ("continuation", "pmi")


def test_a_bad_normalization_setting_names_the_variable(stand_in: Path) -> None:
    from semif_proxy.settings import SettingsError, load_settings

    model = stand_in
    for value in ("average", '{"choice": "max"}', '{"kind": "pmi"}', "{"):
        with pytest.raises(SettingsError, match="SEMIF_NORMALIZATION"):
            load_settings({"SEMIF_NORMALIZATION": value}, model=str(model))
