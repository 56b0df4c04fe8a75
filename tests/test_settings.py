"""Model discovery and settings validation (the SM_LLAMA_CPP_* mapping: test_llama_args.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from semif_proxy.model.files import ModelNotFoundError, discover_model, model_sha256
from semif_proxy.settings import UBATCH_CPU, UBATCH_GPU, SettingsError, load_settings


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def test_discovery_prefers_top_level_sorted(tmp_path: Path) -> None:
    _touch(tmp_path / "sub" / "a.gguf")
    _touch(tmp_path / "z.gguf")
    _touch(tmp_path / "b.gguf")
    assert discover_model(tmp_path) == tmp_path / "b.gguf"


def test_discovery_one_level_down_and_first_shard(tmp_path: Path) -> None:
    _touch(tmp_path / "m" / "big-00002-of-00003.gguf")
    _touch(tmp_path / "m" / "big-00001-of-00003.gguf")
    (tmp_path / "README.txt").write_text("x")
    assert discover_model(tmp_path) == tmp_path / "m" / "big-00001-of-00003.gguf"


def test_discovery_does_not_go_two_levels_down(tmp_path: Path) -> None:
    _touch(tmp_path / "a" / "b" / "deep.gguf")
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(ModelNotFoundError, match=r"notes\.md"):
        discover_model(tmp_path)


def test_missing_model_dir_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="SM_LLAMA_CPP_MODEL_DIR"):
        load_settings({"SM_LLAMA_CPP_MODEL_DIR": str(tmp_path / "nope")})


def test_model_by_name_in_model_dir(tmp_path: Path) -> None:
    model = _touch(tmp_path / "x.gguf")
    settings = load_settings(
        {"SM_LLAMA_CPP_MODEL_DIR": str(tmp_path), "SM_LLAMA_CPP_MODEL": "x.gguf"}
    )
    assert settings.model_path == model


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("SM_LLAMA_CPP_PORT", "eighty"),
        ("SM_LLAMA_CPP_PORT", "70000"),
        ("SEMIF_DECISIONS", "maybe"),
        ("SEMIF_TEMPERATURE", "hot"),
        ("SEMIF_TEMPERATURE", "-1"),
        ("SEMIF_MAX_QUEUE", "-5"),
        ("SEMIF_CTX_SIZE", "12"),
        ("SEMIF_LOG_LEVEL", "LOUD"),
        ("SEMIF_CPU_SHARING", "fair"),
        ("SEMIF_CPU_SHARING", "slice"),  # removed: dynamic or the gate serve its case
        ("SEMIF_UBATCH_SIZE", "-1"),
        ("SEMIF_UBATCH_SIZE", "big"),
    ],
)
def test_bad_values_name_the_variable(tmp_path: Path, var: str, value: str) -> None:
    model = _touch(tmp_path / "m.gguf")
    with pytest.raises(SettingsError, match=var):
        load_settings({var: value}, model=str(model))


def test_engine_settings_fall_back_to_sm_variables(tmp_path: Path) -> None:
    model = _touch(tmp_path / "m.gguf")
    env = {
        "SM_LLAMA_CPP_N_GPU_LAYERS": "12",
        "SM_LLAMA_CPP_CTX_SIZE": "2048",
        "SM_LLAMA_CPP_THREADS": "3",
    }
    s = load_settings(env, model=str(model))
    assert (s.n_gpu_layers, s.n_ctx, s.n_threads) == (12, 2048, 3)
    s = load_settings(
        {**env, "SEMIF_N_GPU_LAYERS": "0", "SEMIF_CTX_SIZE": "1024"}, model=str(model)
    )
    assert (s.n_gpu_layers, s.n_ctx) == (0, 1024)
    assert "--n-gpu-layers" in s.llama_server_args


def test_engine_ubatch_is_small_on_the_cpu_big_with_a_gpu(tmp_path: Path) -> None:
    model = str(_touch(tmp_path / "m.gguf"))
    assert load_settings({}, model=model).engine_ubatch == UBATCH_CPU == 256
    assert load_settings({"SEMIF_N_GPU_LAYERS": "-1"}, model=model).engine_ubatch == UBATCH_GPU
    assert load_settings({"SEMIF_UBATCH_SIZE": "300"}, model=model).engine_ubatch == 300
    # Never more than the logical batch: a llama_decode call holds at most n_batch tokens.
    capped = {"SEMIF_UBATCH_SIZE": "512", "SEMIF_BATCH_SIZE": "64"}
    assert load_settings(capped, model=model).engine_ubatch == 64


def test_temperature_forms(tmp_path: Path) -> None:
    model = _touch(tmp_path / "m.gguf")
    assert (
        load_settings({"SEMIF_TEMPERATURE": "1.5"}, model=str(model)).temperature.for_type("noul")
        == 1.5
    )
    t = load_settings(
        {"SEMIF_TEMPERATURE": '{"temperature": {"default": 2, "choice": 0.5}, "ece": 0.1}'},
        model=str(model),
    ).temperature
    assert (t.for_type("choice"), t.for_type("score")) == (0.5, 2.0)


def test_readout_default_forms(tmp_path: Path) -> None:
    model = str(_touch(tmp_path / "m.gguf"))
    unset = load_settings({}, model=model).readout
    assert [unset.for_type(k) for k in ("decision", "noul", "choice", "score")] == ["letters"] * 4
    one = load_settings({"SEMIF_READOUT": "Continuation"}, model=model).readout
    assert one.for_type("choice") == one.for_type("decision") == "continuation"
    typed = load_settings(
        {"SEMIF_READOUT": '{"noul": "direct", "score": "direct", "default": "deliberate"}'},
        model=model,
    ).readout
    assert [typed.for_type(k) for k in ("decision", "noul", "choice", "score")] == [
        "deliberate",
        "direct",
        "deliberate",
        "direct",
    ]
    assert typed.describe() == "deliberate, noul=direct, score=direct"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("sideways", "'sideways' is not a readout"),
        # direct reads yes/no and levels only: a default that refused every choice is none.
        ("direct", "default: direct reads yes/no and score questions only"),
        ('{"choice": "direct"}', "choice: direct reads"),
        ('{"colour": "letters"}', "'colour' is not a question type"),
        ('{"noul": 3}', "noul: expected a name"),
        ('["letters"]', "not a readout"),
        ("{nope", "not JSON"),
    ],
)
def test_bad_readout_defaults_name_the_variable(tmp_path: Path, value: str, says: str) -> None:
    model = str(_touch(tmp_path / "m.gguf"))
    with pytest.raises(SettingsError, match="SEMIF_READOUT") as caught:
        load_settings({"SEMIF_READOUT": value}, model=model)
    assert says in str(caught.value)


def test_secrets_are_masked(tmp_path: Path) -> None:
    model = _touch(tmp_path / "m.gguf")
    s = load_settings({"SEMIF_API_KEY": "hunter2"}, model=str(model))
    assert s.public_dict()["api_key"] == "***" and "hunter2" not in repr(s)


def test_sha256_is_cached_beside_the_model(tmp_path: Path) -> None:
    model = _touch(tmp_path / "m.gguf")
    first = model_sha256(model)
    assert (tmp_path / "m.gguf.sha256.json").exists()
    assert model_sha256(model) == first
    model.write_bytes(b"GGUF2")
    assert model_sha256(model) != first


def test_the_engine_context_comes_from_the_model_when_unset(tmp_path: Path, model_path: Path):
    """SEMIF_CTX_SIZE unset: the model's training context (its GGUF header), at most the cap;
    set: the value as given; a file with no readable header: the fallback (the engine's load
    then says what is wrong)."""
    from gguf import GGUFReader  # an independent reader of the header

    from semif_proxy.settings import AUTO_CTX_MAX, FALLBACK_CTX
    from tests.helpers.tiny_model import write_tiny_model

    reader = GGUFReader(str(model_path))
    field = reader.fields[f"{reader.fields['general.architecture'].contents()}.context_length"]
    trained = int(field.contents())
    assert load_settings({}, model=str(model_path)).n_ctx == min(trained, AUTO_CTX_MAX)
    small = write_tiny_model(tmp_path / "small.gguf", n_ctx=1024)
    assert load_settings({}, model=str(small)).n_ctx == 1024
    big = write_tiny_model(tmp_path / "big.gguf", n_ctx=1 << 17)
    assert load_settings({}, model=str(big)).n_ctx == AUTO_CTX_MAX
    assert load_settings({"SEMIF_CTX_SIZE": "2048"}, model=str(big)).n_ctx == 2048
    assert load_settings({"SM_LLAMA_CPP_CTX_SIZE": "3072"}, model=str(big)).n_ctx == 3072
    junk = _touch(tmp_path / "junk.gguf")
    assert load_settings({}, model=str(junk)).n_ctx == FALLBACK_CTX


CRITERIA = {f"route_{i}": f"Tickets about order problem number {i}" for i in range(255)}
LARGEST_CHOICE = {
    "model": "jev-latest",
    "state": "The customer says the parcel never arrived and wants a refund.",
    "questions": {"q": {"type": "choice", "criteria": CRITERIA}},
}


def test_the_largest_choice_the_api_accepts_fits_the_default_context(
    model_path: Path, decision_engine
):
    """255 options (System One's most) with one-line descriptions: on SmolLM2 a prompt of
    about 7,000 tokens, which the old fixed 4,096-token context refused (413) and the limits of
    the context sized from the model (the default settings) hold. Answering it takes minutes
    on 2 cores: test-slow does that below."""
    from semif_proxy.api.services import SERVICES

    defaults = load_settings({"SEMIF_CHAT": "off"}, model=str(model_path))
    planned = SERVICES["systemone"].plan(LARGEST_CHOICE, defaults, decision_engine.sha256)
    question = planned.asked[0].questions[0]
    # Rendered and tokenized as the engine does it (neither depends on the context size).
    tokens = len(decision_engine.tokenize_prompt(decision_engine._render(question).text))
    assert 4096 < tokens <= defaults.prompt_token_limit == defaults.n_ctx == 8192
    assert tokens <= defaults.request_token_limit


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_largest_choice_is_answered_on_smollm2(model_path: Path):
    """The same request answered whole on the defaults (about 100 s on 2 cores)."""
    from semif_proxy.api.services import SERVICES
    from semif_proxy.engine.worker import DecisionEngine

    settings = load_settings({"SEMIF_CHAT": "off"}, model=str(model_path), n_threads=2)
    engine = DecisionEngine.load(settings)
    try:
        service = SERVICES["systemone"]
        answered = service.answer(engine, service.plan(LARGEST_CHOICE, settings, engine.sha256))
    finally:
        engine.close()
    assert answered.input_tokens > 4096
    probabilities = answered.body["answers"]["q"]["probabilities"]
    assert list(probabilities) == list(CRITERIA)
    assert sum(probabilities.values()) == pytest.approx(1.0)
