"""What the GPU check is made of, tested without a GPU: the generated stand-in model (written
fast, read back by the gguf package, loaded and scored by the real extension), the GGUF header
reader, the start-up memory check (fake device lists, real GGUF headers, real settings), the
test-suite adjustments, the link-time CUDA pieces and the benchmark's arithmetic."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest

from semif_proxy.engine import native
from semif_proxy.model import gpu_memory, tiny_gguf
from semif_proxy.model.gguf import GGUFError, SkippedArray, read_gguf
from semif_proxy.settings import SettingsError, load_settings
from tests.conftest import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parent.parent
GiB = 1 << 30
GPU = {"type": "gpu", "name": "CUDA0", "description": "NVIDIA H200"}
CPU = {"type": "cpu", "name": "CPU", "memory_free": 64 * GiB, "memory_total": 64 * GiB}


def gpu_with(free_gib: float, total_gib: float = 80.0) -> dict:
    return {**GPU, "memory_free": int(free_gib * GiB), "memory_total": int(total_gib * GiB)}


def run_module(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20M-parameter generated model, through the same command the GPU check runs."""
    out = tmp_path_factory.mktemp("random") / "m20.gguf"
    done = run_module(
        "semif_proxy.model.tiny_gguf",
        "--params",
        "20M",
        "--n-embd",
        "256",
        "--n-head",
        "4",
        "--n-head-kv",
        "2",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    return out


# -- the generated model ---------------------------------------------------------------------------


def test_lazy_tensors_write_the_same_bytes_as_arrays(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    arrays = {"a": rng.standard_normal((3, 70)).astype(np.float16), "b": np.ones(5, np.float32)}
    lazy = {
        "a": tiny_gguf.LazyTensor(
            (3, 70),
            np.dtype(np.float16),
            lambda: [arrays["a"].ravel()[:100], arrays["a"].ravel()[100:]],
        ),
        "b": arrays["b"],
    }
    eager = tiny_gguf.write_gguf(tmp_path / "eager.gguf", {"k": 1}, arrays)
    streamed = tiny_gguf.write_gguf(tmp_path / "lazy.gguf", {"k": 1}, lazy)
    assert eager.read_bytes() == streamed.read_bytes()
    short = {"a": tiny_gguf.LazyTensor((3, 70), np.dtype(np.float16), lambda: [np.zeros(5)])}
    with pytest.raises(ValueError, match="expected 420"):
        tiny_gguf.write_gguf(tmp_path / "short.gguf", {}, short)


def test_plan_for_params_lands_near_the_target() -> None:
    for target, n_embd in ((20e6, 256), (300e6, 1024), (1e9, 1024), (1e9, 2048)):
        plan = tiny_gguf.plan_for_params(int(target), n_embd=n_embd)
        assert abs(tiny_gguf.llama_params(**plan) - target) / target < 0.05, plan
    assert tiny_gguf.parse_count("300M") == 300_000_000
    assert tiny_gguf.parse_count("1.5B") == 1_500_000_000
    assert tiny_gguf.parse_count("20k") == 20_000


def test_generated_model_reads_back_with_the_gguf_package(random_model: Path) -> None:
    reader = gguf.GGUFReader(str(random_model))
    fields = {k: f.contents() for k, f in reader.fields.items()}
    assert fields["general.architecture"] == "llama"
    assert len(fields["tokenizer.ggml.tokens"]) == 32000
    assert fields["llama.attention.head_count_kv"] == 2
    # The parameter count is what llama_params says (counted here from the tensors themselves).
    counted = sum(int(t.n_elements) for t in reader.tensors)
    plan = {
        k: fields[f"llama.{key}"]
        for k, key in (
            ("n_embd", "embedding_length"),
            ("n_layer", "block_count"),
            ("n_head", "attention.head_count"),
            ("n_head_kv", "attention.head_count_kv"),
            ("n_ff", "feed_forward_length"),
        )
    }
    assert counted == tiny_gguf.llama_params(n_vocab=32000, **plan)
    weights = [t for t in reader.tensors if t.name.endswith("attn_q.weight")]
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F16 for t in weights)
    # 1/sqrt(fan-in) scaled: a 256-wide layer's weights have a standard deviation of ~1/16.
    values = np.asarray(weights[0].data, dtype=np.float32)
    assert 0.055 < values.std() < 0.070
    assert np.isfinite(values).all()


def test_the_extension_loads_and_scores_the_generated_model(random_model: Path) -> None:
    engine = native.Engine(str(random_model), n_ctx=1024, n_threads=2, n_seq=4)
    assert engine.n_vocab == 32000 and "<|im_start|>" in (engine.chat_template or "")
    # Words tokenize as a real model's do: one token each, not a byte a token.
    sentence = "Customer email: the password reset never arrives and I cannot log in."
    assert len(engine.tokenize(sentence)) <= 16
    # A decision-shaped ChatML prompt (~150 tokens, as SmolLM2 reads the README's example).
    user = json.dumps(
        {
            "evidence": "Customer email: I requested a password reset but it never arrives.",
            "criterion": "Which support queue should handle this ticket?",
            "options": [
                {"letter": "A", "description": "Billing, invoices and refunds"},
                {"letter": "B", "description": "Login and password reset problems"},
                {"letter": "C", "description": "Delivery and tracking problems"},
            ],
        }
    )
    prompt = (
        "<|im_start|>system\nYou are a careful decision function. Answer with only the letter "
        f"of that option, nothing else.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    tokens = engine.tokenize(prompt, add_special=True, parse_special=True)
    assert 60 < len(tokens) < 160
    letters = [engine.tokenize(x, add_special=False, parse_special=False) for x in "ABC"]
    assert all(len(t) == 1 for t in letters)
    ids = [t[0] for t in letters]
    logits, lse, _ = engine.score(tokens, [[]], ids)
    assert logits.shape == (1, 3) and np.isfinite(logits).all() and np.isfinite(lse).all()
    assert (logits[0] <= lse[0]).all()  # a letter's logit is below the vocabulary's logsumexp
    # The same prompt split into a held prefix and a branch gives the same numbers (CPU: exact).
    cut = len(tokens) // 2 // engine.cell_align * engine.cell_align
    branched, _, _ = engine.score(tokens[:cut], [tokens[cut:]], ids, "restore")
    np.testing.assert_array_equal(branched, logits)


def test_every_listed_word_is_one_token(random_model: Path) -> None:
    engine = native.Engine(str(random_model), n_ctx=256, n_threads=1, n_seq=3)
    for word in tiny_gguf.WORDS:
        if not word.isalpha():  # punctuation: the pre-tokenizer splits it off a space
            assert len(engine.tokenize(word, add_special=False, parse_special=False)) == 1
            continue
        for form in (word, " " + word, " " + word[:1].upper() + word[1:]):
            assert len(engine.tokenize(form, add_special=False, parse_special=False)) == 1, form
    # Letters stay single tokens, so the engine's letter check holds.
    for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZ":
        assert len(engine.tokenize(letter, add_special=False, parse_special=False)) == 1


@pytest.mark.slow
def test_a_300m_parameter_model_is_written_in_seconds(tmp_path: Path) -> None:
    out = tmp_path / "m300.gguf"
    started = time.monotonic()
    done = run_module("semif_proxy.model.tiny_gguf", "--params", "300M", "--out", str(out))
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert 285e6 < summary["params"] < 315e6
    assert out.stat().st_size == pytest.approx(2 * summary["params"], rel=0.01)  # F16
    assert took < 60, took  # measured: ~4 s on 2 shared cores
    engine = native.Engine(str(out), n_ctx=512, n_threads=2, n_seq=3)
    ids = [engine.tokenize(x, add_special=False)[0] for x in "AB"]
    logits, lse, _ = engine.score(
        engine.tokenize("Which one? Answer:", add_special=True), [[]], ids
    )
    assert np.isfinite(logits).all() and np.isfinite(lse).all()


# -- the GGUF header reader ----------------------------------------------------------------------


def reference(path: Path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: t for t in reader.tensors}
    return meta, tensors


@pytest.mark.parametrize("which", ["generated", "smollm2"])
def test_header_reader_agrees_with_the_gguf_package(which: str, random_model: Path) -> None:
    path = random_model if which == "generated" else DEFAULT_MODEL
    if not path.is_file():
        pytest.skip(f"{path} not fetched (make model)")
    info = read_gguf(path)
    meta, tensors = reference(path)
    assert set(info.metadata) == set(meta)
    for key, value in info.metadata.items():
        if isinstance(value, SkippedArray):
            assert value.count == len(meta[key]), key
        elif isinstance(value, float):
            assert value == pytest.approx(meta[key]), key
        else:
            assert value == meta[key], key
    assert [t.name for t in info.tensors] == list(tensors)
    for t in info.tensors:
        ref = tensors[t.name]
        assert list(t.shape) == [int(d) for d in ref.shape] and t.type == int(ref.tensor_type)
        assert ref.n_bytes <= t.nbytes < ref.n_bytes + 32  # up to the next tensor (padding)


def test_header_reader_errors(tmp_path: Path, random_model: Path) -> None:
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        read_gguf(tmp_path / "text.gguf")
    (tmp_path / "cut.gguf").write_bytes(random_model.read_bytes()[:3000])
    with pytest.raises(GGUFError, match="cut short"):
        read_gguf(tmp_path / "cut.gguf")


# -- the memory check ----------------------------------------------------------------------------

# Qwen3-4B Q4_K_M as its GGUF header describes it: 36 layers, 32 query heads, 8 KV heads of 128
# dims (key_length 128, not 2560/32), a 151,936-token vocabulary, 40,960 tokens of context.
QWEN3_4B = gpu_memory.ModelShape(
    name="Qwen3-4B Q4_K_M",
    file_bytes=2_497_280_256,
    n_layer=36,
    n_embd=2560,
    n_head=32,
    n_head_kv=8,
    head_dim_k=128,
    head_dim_v=128,
    n_vocab=151_936,
    n_ctx_train=40_960,
)


def test_kv_cache_and_weights_of_one_process() -> None:
    full = gpu_memory.need(QWEN3_4B, gpu_memory.Process("engine", -1, 4096))
    # 4096 cells x 36 layers x 8 heads x (128 + 128) dims x 2 bytes, worked out by hand:
    assert full.kv == 603_979_776
    assert full.weights == QWEN3_4B.file_bytes and full.layers_on_gpu == 37
    # 999 means all (llama.cpp caps it at n_layer + 1); half the layers, about half of each.
    assert gpu_memory.need(QWEN3_4B, gpu_memory.Process("e", 999, 4096)).total == full.total
    half = gpu_memory.need(QWEN3_4B, gpu_memory.Process("e", 18, 4096))
    assert half.weights == QWEN3_4B.file_bytes * 18 // 37
    assert half.kv == 603_979_776 * 17 // 36  # 17 repeating layers: the output layer is first
    none = gpu_memory.need(QWEN3_4B, gpu_memory.Process("e", 0, 4096))
    assert none.weights == none.kv == none.compute == 0
    # q8_0 cache: 34 bytes per 32 values instead of 64.
    q8 = gpu_memory.need(QWEN3_4B, gpu_memory.Process("e", -1, 4096, kv_bytes=34 / 32))
    assert q8.kv == 603_979_776 * 34 // 64
    # Flash attention drops the n_ubatch x n_ctx x n_head score matrix from the compute buffer.
    fa = gpu_memory.need(QWEN3_4B, gpu_memory.Process("e", -1, 4096, flash_attn=True))
    assert full.compute - fa.compute == 4 * 512 * 4096 * 32


def test_two_processes_hold_the_weights_twice() -> None:
    engine = gpu_memory.Process("the decision engine", -1, 4096)
    server = gpu_memory.Process("llama-server", -1, 4096)
    both = gpu_memory.check(QWEN3_4B, [engine, server], [gpu_with(80)])
    assert both.fits and sum(n.weights for n in both.needs) == 2 * QWEN3_4B.file_bytes
    one = gpu_memory.check(QWEN3_4B, [engine], [gpu_with(80)])
    assert both.required - one.required == one.required - one.margin


def test_a_card_too_small_fails_with_the_settings_to_change() -> None:
    engine = gpu_memory.Process(
        "the decision engine", -1, 4096, layers_setting="SEMIF_N_GPU_LAYERS=999"
    )
    server = gpu_memory.server_process([], QWEN3_4B)  # llama-server's defaults: all of it
    verdict = gpu_memory.check(QWEN3_4B, [engine, server], [CPU, gpu_with(10, 24)])
    assert not verdict.fits
    message = verdict.message()
    for name in (
        "SEMIF_DECISIONS=off",
        "SEMIF_CHAT=off",
        "SM_LLAMA_CPP_N_GPU_LAYERS",
        "SEMIF_N_GPU_LAYERS",
        "SM_LLAMA_CPP_CTX_SIZE",
        "SEMIF_CTX_SIZE",
    ):
        assert name in message, name
    assert "context unset: the model's 40960" in message and "NVIDIA H200" in message
    # Chat on a smaller context fits the same card.
    small = gpu_memory.server_process(["--ctx-size", "4096"], QWEN3_4B)
    assert gpu_memory.check(QWEN3_4B, [engine, small], [gpu_with(10, 24)]).fits


def test_no_gpu_or_nothing_offloaded_always_fits() -> None:
    everything = [gpu_memory.Process("e", -1, 1 << 20)]
    assert gpu_memory.check(QWEN3_4B, everything, [CPU]).fits
    nothing = [gpu_memory.Process("e", 0, 4096), gpu_memory.Process("s", 0, 4096)]
    assert gpu_memory.check(QWEN3_4B, nothing, [gpu_with(0.1)]).fits


def test_llama_server_arguments_are_read_as_llama_server_reads_them() -> None:
    p = gpu_memory.server_process(
        ["-c", "8192", "-ngl", "20", "--flash-attn", "on", "-ub", "256", "-ctk", "q8_0"],
        QWEN3_4B,
    )
    assert (p.n_ctx, p.n_gpu_layers, p.flash_attn, p.n_ubatch) == (8192, 20, True, 256)
    assert p.kv_bytes == pytest.approx((34 / 32 + 2) / 2)
    d = gpu_memory.server_process(["--ctx-size", "0", "--n-gpu-layers", "auto"], QWEN3_4B)
    assert d.n_ctx == 40_960 and d.n_gpu_layers == -1 and not d.flash_attn


def test_shape_from_a_real_gguf_header(random_model: Path) -> None:
    shape = gpu_memory.ModelShape.from_file(random_model)
    reader = gguf.GGUFReader(str(random_model))
    field = reader.fields["llama.block_count"].contents()
    assert shape.n_layer == field and shape.n_head_kv == 2 and shape.n_head == 4
    assert shape.head_dim_k == shape.head_dim_v == 64 and shape.n_vocab == 32000
    assert shape.file_bytes == random_model.stat().st_size
    if DEFAULT_MODEL.is_file():
        smol = gpu_memory.ModelShape.from_file(DEFAULT_MODEL)
        assert (smol.n_layer, smol.n_head_kv, smol.n_vocab) == (30, 3, 49152)


def test_startup_check_on_real_settings(random_model: Path) -> None:
    settings = load_settings(
        {"SM_LLAMA_CPP_CTX_SIZE": "8192"}, model=str(random_model), n_gpu_layers=999
    )
    assert settings.chat and settings.decisions
    assert gpu_memory.check_settings(settings, [CPU, gpu_with(40)]) is settings
    assert gpu_memory.check_settings(settings, [CPU]) is settings  # no GPU: nothing to check
    with pytest.raises(SettingsError) as err:  # what the CLI reports as a configuration error
        gpu_memory.check_settings(settings, [CPU, gpu_with(0.5, 1)])
    assert isinstance(err.value, gpu_memory.GpuMemoryError)
    assert "SEMIF_N_GPU_LAYERS=999" in str(err.value)
    assert "SM_LLAMA_CPP_CTX_SIZE=8192" in str(err.value)
    # Decisions only: the engine alone, much less.
    alone = load_settings({}, model=str(random_model), n_gpu_layers=999, chat=False)
    processes = gpu_memory.processes_for(alone, gpu_memory.ModelShape.from_file(random_model))
    assert [p.name for p in processes] == ["the decision engine"]
    # With this extension's own device list (a CPU build here): passes.
    assert gpu_memory.check_settings(alone) is alone


def test_startup_check_stops_serve_with_a_configuration_error(random_model: Path, capsys) -> None:
    settings = load_settings({}, model=str(random_model), n_gpu_layers=999, chat=False)
    gpu_memory.startup_check(settings, [gpu_with(40)])
    gpu_memory.startup_check(settings)  # this extension's devices
    with pytest.raises(SystemExit) as exit_:
        gpu_memory.startup_check(settings, [gpu_with(0.2, 1)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("semif-proxy: configuration error: GPU memory:")
    assert "SEMIF_DECISIONS=off" in err


def test_memory_command_line(random_model: Path) -> None:
    done = run_module(
        "semif_proxy.model.gpu_memory", "--model", str(random_model), "--free-gib", "0.5"
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert not out["verdict"]["fits"] and "SEMIF_CHAT=off" in out["message"]
    done = run_module(
        "semif_proxy.model.gpu_memory",
        "--model",
        str(random_model),
        "--choices",
        "--free-gib",
        "80",
    )
    assert all(c["fits"] for c in json.loads(done.stdout)["choices"].values())


# -- the suite's adjustments on the GPU host -------------------------------------------------------


class FakeItem:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.markers: list[pytest.MarkDecorator] = []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker)


def test_gpu_run_marks_only_the_listed_tests(monkeypatch, capsys) -> None:
    from tests.helpers import gpu_run

    items = [
        FakeItem("tests/test_server.py::test_ping_and_health"),
        FakeItem("tests/test_sagemaker.py::test_deadline_stops_the_work_and_says_why"),
        FakeItem("tests/test_native.py::test_decode_releases_the_gil"),
        FakeItem("tests/test_server.py::test_single_decision[/v1/decisions]"),
    ]
    monkeypatch.delenv("SEMIF_TEST_GENERATED_MODEL", raising=False)
    monkeypatch.delenv("SEMIF_TEST_FIRST", raising=False)
    monkeypatch.setenv("SEMIF_TEST_GPU_LAYERS", "0")
    gpu_run.adjust(items)
    assert not any(i.markers for i in items)  # a CPU run is untouched
    monkeypatch.setenv("SEMIF_TEST_GENERATED_MODEL", "1")
    monkeypatch.setenv("SEMIF_TEST_GPU_LAYERS", "999")
    gpu_run.adjust(items)
    names = [[m.name for m in i.markers] for i in items]
    assert names == [["skip"], ["xfail"], ["xfail"], []]
    assert "SmolLM2's sha256" in items[0].markers[0].kwargs["reason"]
    assert items[1].markers[0].kwargs["strict"] is False
    assert "test_model_metadata is listed but was not collected" in capsys.readouterr().err


def test_gpu_run_puts_the_named_files_first(monkeypatch) -> None:
    from tests.helpers import gpu_run

    ids = ["tests/a.py::t1", "tests/b.py::t1", "tests/c.py::t1", "tests/b.py::t2", "tests/a.py::t2"]
    items = [FakeItem(i) for i in ids]
    monkeypatch.setenv("SEMIF_TEST_FIRST", "tests/c.py\ntests/b.py")
    gpu_run.reorder(items)
    assert [i.nodeid for i in items] == [
        "tests/c.py::t1",
        "tests/b.py::t1",
        "tests/b.py::t2",
        "tests/a.py::t1",
        "tests/a.py::t2",
    ]


# -- link-time CUDA pieces -------------------------------------------------------------------------


@pytest.mark.skipif(
    not Path("/usr/local/cuda/include/cuda.h").is_file() or not shutil.which("cc"),
    reason="no CUDA toolkit headers here",
)
def test_driver_stub_exports_what_ggml_cuda_calls(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import cuda_link_deps
    finally:
        sys.path.pop(0)
    stub = cuda_link_deps.driver_stub(cuda_link_deps.toolkit_root(), tmp_path)
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(stub)], capture_output=True, text=True, check=True
    ).stdout
    for name in (
        "cuDeviceGet",
        "cuMemCreate",
        "cuMemMap",
        "cuMemAddressReserve",
        "cuMemSetAccess",
        "cuGetErrorString",
    ):
        assert f" T {name}" in symbols, name
    soname = subprocess.run(["readelf", "-d", str(stub)], capture_output=True, text=True).stdout
    assert "[libcuda.so.1]" in soname
    assert os.readlink(tmp_path / "lib" / "libcuda.so.1") == "libcuda.so"


def test_gpu_check_script_parses_and_documents_itself() -> None:
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts/gpu_check.sh")]).returncode == 0
    shown = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_check.sh"), "--help"], capture_output=True, text=True
    )
    assert shown.returncode == 0 and "--dry-run" in shown.stdout


# -- the GPU run's summary ------------------------------------------------------------------


def test_bench_summary_renders(tmp_path: Path, capsys) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_env
    finally:
        sys.path.pop(0)
    stats = {"n": 3, "p50": 0.01, "p95": 0.02, "max": 0.02, "mean": 0.01}
    (tmp_path / "bench_gpu.json").write_text(
        json.dumps(
            {
                "latency": {
                    "200": {
                        "input_tokens": {**stats, "p50": 201},
                        "client_seconds": stats,
                        "forward_seconds": stats,
                    }
                },
                "agreement": {"error": "RuntimeError('x')"},
            }
        )
    )
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1" time="2.5">'
        '<testcase classname="tests.test_a" name="test_b"><failure/></testcase>'
        "</testsuite></testsuites>"
    )
    args = SimpleNamespace(out=tmp_path)
    assert gpu_env.summary(args.out, "bench", "42") == 0
    text = capsys.readouterr().out
    assert "Failed steps: bench" in text and "FAILED tests.test_a::test_b" in text
    assert "| 200 | 201 | 10.0 | 20.0 | 10.0 |" in text
    assert "bench agreement failed: RuntimeError('x')" in text


def _gpu_env():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_env
    finally:
        sys.path.pop(0)
    return gpu_env


def test_serial_junit_joins_the_parallel_one(tmp_path: Path, capsys) -> None:
    gpu_env = _gpu_env()
    parallel, serial = tmp_path / "junit.xml", tmp_path / "serial.xml"
    parallel.write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1" time="10">'
        '<testcase classname="tests.test_a" name="test_b"><failure/></testcase>'
        "</testsuite></testsuites>"
    )
    serial.write_text(
        '<testsuite tests="2" failures="0" errors="1" skipped="0" time="5">'
        '<testcase classname="tests.test_c" name="test_d"><error/></testcase></testsuite>'
    )
    assert gpu_env.merge_junit(parallel, serial) == 0
    got = gpu_env._junit(parallel)
    assert {k: got[k] for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": 6, "failures": 1, "errors": 1, "skipped": 1,
    }  # fmt: skip
    assert got["time"] == 15.0
    assert got["failed"] == ["tests.test_a::test_b", "tests.test_c::test_d"]
    # A serial part killed before it wrote its file leaves the parallel one as it was.
    assert gpu_env.merge_junit(parallel, tmp_path / "never-written.xml") == 0
    assert gpu_env._junit(parallel)["tests"] == 6
    # The parallel part missing: the serial one alone.
    alone = tmp_path / "alone.xml"
    assert gpu_env.merge_junit(alone, serial) == 0
    assert gpu_env._junit(alone)["tests"] == 2


def test_summary_shows_jevbench_and_both_models(tmp_path: Path, capsys) -> None:
    gpu_env = _gpu_env()
    stats = {"n": 48, "p50": 0.0123, "p95": 0.0456, "max": 0.05, "mean": 0.02}
    agreement = {
        "prompts": 13, "max_abs_dp": 1.5e-4, "max_abs_dlogit": 2e-3, "argmax_agreement": 1.0,
        "jevbench": {"tasks": 48, "max_abs_dp": 3e-4, "argmax_flips": ["easy-x"]},
    }  # fmt: skip
    (tmp_path / "bench_gpu.json").write_text(
        json.dumps(
            {
                "jevbench": {"tasks": 48, "client_seconds": stats},
                "agreement": {**agreement, "model": "model.gguf"},
                "quantized": {**agreement, "model": "model-q4_k_m.gguf"},
            }
        )
    )
    assert gpu_env.summary(tmp_path, "", "1") == 0
    text = capsys.readouterr().out
    assert "JevBench, 48 tasks through /v1/systemone: p50 12.3 ms, p95 45.6 ms." in text
    assert "GPU vs CPU, model-q4_k_m.gguf, 13 prompts: max |dp| 1.50e-04" in text
    assert "JevBench, 48 tasks: max |dp| 3.00e-04, argmax flips 1 ['easy-x']." in text


def test_a_checks_files_become_one_results_file(tmp_path: Path) -> None:
    """What the device returns, read back: the device, the suite's counts, each distinct
    self-check refusal and each exceeded tolerance, and every bench section said why missing."""
    gpu_env = _gpu_env()
    out = tmp_path / "out"
    out.mkdir()
    (out / "nvidia-smi.txt").write_text(
        "table\nname, memory.total [MiB], memory.used [MiB], driver_version, compute_cap\n"
        "NVIDIA H200, 143771 MiB, 0 MiB, 580.159.04, 9.0\n"
    )
    model = {"path": "/w/model.gguf", "name": "semif-random-296M", "params": 296268800}
    exact = {"model": "model-q4_k_m.gguf", "gpu_layers": 999, "check": {"passed": True}}
    (out / "gpu_check.log").write_text(
        "[  1s] Linux x86_64; 16 cores; deadline 290s\n[  1s] commit: f00dcafe\n"
        "  cpu: CPU Intel Xeon 125.8/125.8 GiB\n"
        f"{json.dumps({**model, 'dtype': 'f16'})}\n{json.dumps(exact)}\n"
        "[200s] tests (exit 124, timed out)\n[273s] done in 273 s; failed: tests bench\n"
    )
    refusal = "differ from its one-piece evaluation by up to {} (allowed 0.001; llama.cpp"
    (out / "pytest.log").write_text(
        "\n".join(
            [
                *(refusal.format(x) for x in ("0.0178", "0.00635", "0.0178")),
                "E   Max absolute difference among violations: 0.0213",
            ]
        )
    )
    (out / "junit.xml").write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="1" skipped="1" time="9" '
        'timestamp="2026-12-04T17:15:54"><testcase classname="t" name="a"><failure/></testcase>'
        "</testsuite></testsuites>"
    )
    results = tmp_path / "gpu-h200.json"
    assert gpu_env.record(out, results, "abc1234") == 0
    got = json.loads(results.read_text())
    assert got["gpu"] == [["NVIDIA H200", "143771", "580.159.04"]]
    # The commit the check's own log stamps wins over the one given.
    assert got["machine"] == {
        "date": "2026-12-04T17:15Z", "cores": 16, "cpu": "Intel Xeon", "commit": "f00dcafe",
    }  # fmt: skip
    check = got["check"]
    assert check["model"] == {**model, "dtype": "f16"}
    assert check["exactness"] == [exact]
    assert check["self_check_refusals"] == [
        {"max_abs_difference": 0.00635, "tolerance": 0.001},
        {"max_abs_difference": 0.0178, "tolerance": 0.001},
    ]
    assert check["tolerance_exceeded"] == [0.0213]
    assert check["timed_out"] is True and check["serial_run"] is False
    assert check["failed_steps"] == "tests bench"
    assert check["tests"]["tests"] == 5 and check["tests"]["failed"] == ["t::a"]
    for key in ("latency", "quantized", "memory"):
        assert got[key]["error"].startswith("not measured: bench/gpu.py wrote no figure for it")
    assert "the engine refused decisions" in got["latency"]["error"]


def test_summary_shows_a_dash_where_nothing_was_compared(tmp_path: Path, capsys) -> None:
    gpu_env = _gpu_env()
    none = {"max_abs_dp": None, "max_abs_dlogit": None, "argmax_agreement": None}
    (tmp_path / "bench_gpu.json").write_text(
        json.dumps({"quantized": {"model": "q.gguf", "prompts": 0, **none}})
    )
    assert gpu_env.summary(tmp_path, "", "1") == 0
    assert (
        "GPU vs CPU, q.gguf, 0 prompts: max |dp| -, max |dlogit| -, argmax agreement -."
        in capsys.readouterr().out
    )


def test_a_dry_runs_files_record_no_gpu(tmp_path: Path) -> None:
    gpu_env = _gpu_env()
    (tmp_path / "nvidia-smi.txt").write_text("no NVIDIA GPU visible (nvidia-smi finds none)\n")
    (tmp_path / "gpu_check.log").write_text("[ 35s] done in 35 s; failed: nothing\n")
    results = tmp_path / "gpu-dry.json"
    assert gpu_env.record(tmp_path, results, None) == 0
    got = json.loads(results.read_text())
    assert got["gpu"] == [] and got["check"]["compute_capability"] is None
    assert got["check"]["self_check_refusals"] == [] and got["check"]["failed_steps"] == "nothing"
