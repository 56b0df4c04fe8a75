"""`semif-proxy eval`: the same labelled rows asked of the model in-process, of a server over HTTP
and of a second server with other settings (each the app served in this process, real engine
and SmolLM2); metrics recomputed by hand from the per-row results; the SageMaker target against
a stub of InvokeEndpoint that answers what the server's /invocations answers."""

from __future__ import annotations

import importlib.util
import io
import json
from collections import Counter
from pathlib import Path

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from semif_proxy import cli
from semif_proxy.eval import report as eval_report
from semif_proxy.eval.open_target import open_target
from semif_proxy.eval.runner import CONFUSION_LABELS, OTHER, evaluate, read_rows
from semif_proxy.eval.sagemaker_target import SageMakerTarget
from semif_proxy.eval.targets import Answer, Failure
from semif_proxy.eval.url_target import UrlTarget
from tests.helpers.app_server import AppServer

KEY = "eval-test-key"
DECISION_ROW = {
    "decision": {
        "id": "route-card",
        "state": "My card was charged twice for the same order and I want one charge back.",
        "question": "Which team should handle this ticket?",
        "options": [
            {"id": "billing", "description": "payments, charges and refunds"},
            {"id": "shipping", "description": "deliveries and parcels"},
            {"id": "account", "description": "logins and passwords"},
        ],
    },
    "expected": "billing",
}


def _choice(i: int, state: str, criteria: dict[str, str], expected: str) -> dict:
    question = {"type": "choice", "instructions": "Which intent?", "criteria": criteria}
    return {
        "id": f"choice-{i}",
        "labels": list(criteria),
        "question": question,
        "state": state,
        "expected": expected,
    }


def _noul(i: int, state: str, instructions: str, expected: str) -> dict:
    criteria = {"true": "The text says so", "false": "The text says it is not so"}
    question = {"type": "noul", "instructions": instructions, "criteria": criteria}
    return {
        "id": f"noul-{i}",
        "labels": ["no", "yes"],
        "question": question,
        "state": state,
        "expected": expected,
    }


def _score(i: int, state: str, expected: int) -> dict:
    levels = ["calm", "a little upset", "upset", "furious"]
    question = {"type": "score", "instructions": "How upset is the customer?", "criteria": levels}
    return {
        "id": f"score-{i}",
        "labels": ["0", "1", "2", "3"],
        "question": question,
        "state": state,
        "expected": expected,
    }


INTENTS = {
    "track_order": "Wants to know where an order is",
    "cancel_order": "Wants to cancel an order",
    "billing_question": "Asks about a charge or invoice",
}


def jevbench_rows() -> list[dict]:
    """Rows in the JevBench format (written here, so the test needs no task files): three
    choice, two noul and two score rows, every question type, 2 to 5 options."""
    return [
        _choice(0, "Where is my parcel? It was due on Monday.", INTENTS, "track_order"),
        _choice(1, "Please cancel order 4471, I changed my mind.", INTENTS, "cancel_order"),
        _choice(
            2,
            "Why was my card charged twice for one order?",
            {
                **INTENTS,
                "change_address": "Wants a new delivery address",
                "report_damage": "Received a broken item",
            },
            "billing_question",
        ),
        _noul(0, "Order 1182. Status: shipped on 3 September.", "Has the order shipped?", "yes"),
        _noul(1, "Order 2290. Status: awaiting payment.", "Has the order shipped?", "no"),
        _score(0, "Thanks, all good, no rush at all.", 0),
        _score(1, "THIS IS THE THIRD TIME I WRITE. I WANT MY MONEY BACK NOW!", 3),
    ]


BAD_ROWS = [
    # no expected label
    {"id": "bad-missing", "state": "x", "question": {"type": "noul"}},
    # a label the question does not have
    {
        "id": "bad-label",
        "state": "x",
        "question": {"type": "choice", "criteria": {"a": "first", "b": "second"}},
        "expected": "c",
    },
    {**DECISION_ROW, "expected": "legal"},
]


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def base_server(model_path: Path):
    """The model with the defaults (one option order), served by the app in this process."""
    server = AppServer(model_path, {"SEMIF_CHAT": "off"}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rotating_server(model_path: Path):
    """The same model asked in every option order (SEMIF_PERMUTATIONS=5), behind a key."""
    env = {"SEMIF_CHAT": "off", "SEMIF_PERMUTATIONS": "5", "SEMIF_API_KEY": KEY}
    server = AppServer(model_path, env).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def run(model_path: Path, base_server, rotating_server, tmp_path_factory):
    """One `semif-proxy eval` over 8 good rows and 3 bad ones, three targets at once."""
    tmp = tmp_path_factory.mktemp("eval")
    rows = write_rows(tmp / "rows.jsonl", [*jevbench_rows(), DECISION_ROW, *BAD_ROWS])
    out, html = tmp / "results.json", tmp / "report.html"
    targets = [str(model_path), base_server.url, rotating_server.url]
    with pytest.MonkeyPatch.context() as mp:
        # One engine thread, as the servers run: two cores are shared with them.
        mp.setenv("SEMIF_THREADS", "1")
        argv = ["eval", str(rows), "--out", str(out), "--html", str(html), "--api-key", KEY]
        for t in targets:
            argv += ["--target", t]
        code = cli.main(argv)
    return {
        "code": code,
        "results": json.loads(out.read_text()),
        "html": html.read_text(),
        "targets": targets,
    }


def argmax(probs: dict[str, float]) -> str:
    return max(probs, key=probs.__getitem__)


def test_every_good_row_is_answered_by_every_target(run):
    results = run["results"]
    assert results["rows"] == 8
    assert [t["name"] for t in results["targets"]] == run["targets"]
    assert [t["kind"] for t in results["targets"]] == ["local", "url", "url"]
    for t in results["targets"]:
        assert t["metrics"]["answered"] == 8, t
        assert t["metrics"]["errors"] == 0
    for r in results["results"]:
        for a in r["answers"].values():
            assert abs(sum(a["probabilities"].values()) - 1.0) < 1e-4
            assert a["input_tokens"] > 0 and a["seconds"] > 0


def test_metric_functions_at_reference_points():
    """Each metric on a hand-made case whose value is worked out by hand here."""
    from semif_proxy.calibration.temperature import ece
    from semif_proxy.eval.metrics import balanced_accuracy, reliability

    # Recall per expected label: a 2/3, b 0 -> 1/3 (plain accuracy would say 1/2).
    assert balanced_accuracy(["a", "a", "a", "b"], [True, True, False, False]) == pytest.approx(
        1 / 3
    )
    # Always the majority label of three: 1/3 whatever the share of the majority.
    assert balanced_accuracy(["a"] * 8 + ["b", "c"], [True] * 8 + [False] * 2) == pytest.approx(
        1 / 3
    )
    # Bins [0.9, 1.0]: 0.95 right and 0.95 wrong (gap 0.45, weight 1/2); [0.5, 0.6): 0.55 right
    # (gap 0.45, weight 1/4); [0.1, 0.2): 0.15 right (gap 0.85, weight 1/4) -> 0.55.
    conf, hit = [0.95, 0.95, 0.55, 0.15], [True, False, True, True]
    assert ece(conf, hit) == pytest.approx(0.55)
    points = reliability([*conf, 1.0], [*hit, True])
    assert [b["rows"] for b in points] == [0, 1, 0, 0, 0, 1, 0, 0, 0, 3]  # 1.0 in the last bin
    assert points[9]["accuracy"] == pytest.approx(2 / 3)
    assert points[9]["confidence"] == pytest.approx((0.95 + 0.95 + 1.0) / 3)
    assert ece([0.7] * 10, [True] * 7 + [False] * 3) == pytest.approx(0.0)  # calibrated


def test_run_metrics_count_every_answered_row(run):
    results = run["results"]
    for t in results["targets"]:
        name, m = t["name"], t["metrics"]
        answers = [(r["expected"], r["answers"][name]) for r in results["results"]]
        correct = [argmax(a["probabilities"]) == e for e, a in answers]
        assert [a["correct"] for _, a in answers] == correct
        assert m["correct"] == sum(correct)
        assert m["accuracy"] == pytest.approx(sum(correct) / 8)
        assert 0.0 <= m["balanced_accuracy"] <= 1.0 and 0.0 <= m["ece"] <= 1.0
        assert sum(b["rows"] for b in m["reliability"]) == m["answered"] == 8
        # The confusion table counts every answered row once, on its (expected, answered) cell.
        labels, matrix = m["confusion"]["labels"], m["confusion"]["matrix"]
        assert len(labels) <= CONFUSION_LABELS + 1

        shown = {label: i for i, label in enumerate(labels)}
        pairs = Counter(
            (
                shown.get(e, shown.get(OTHER)),
                shown.get(argmax(a["probabilities"]), shown.get(OTHER)),
            )
            for e, a in answers
        )
        for (i, j), n in pairs.items():
            assert matrix[i][j] == n
        assert sum(map(sum, matrix)) == 8
        lat = m["latency_seconds"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["max"]
        assert lat["max"] == pytest.approx(max(a["seconds"] for _, a in answers))
        assert m["input_tokens"]["total"] == sum(a["input_tokens"] for _, a in answers)


def test_in_process_and_url_give_the_same_probabilities(run):
    local, url, _ = run["targets"]
    for r in run["results"]["results"]:
        a, b = r["answers"][local], r["answers"][url]
        assert a["probabilities"].keys() == b["probabilities"].keys()
        for label, p in a["probabilities"].items():
            assert abs(p - b["probabilities"][label]) < 1e-3, (r["id"], label)
        assert a["input_tokens"] == b["input_tokens"]


def test_disagreements_are_exactly_the_rows_where_argmax_differs(run):
    results = run["results"]
    names = run["targets"]
    expected = {
        r["id"]
        for r in results["results"]
        if len({argmax(r["answers"][n]["probabilities"]) for n in names}) > 1
    }
    # One option order against the mean of all five: the position bias of a 135M model moves
    # some argmaxes, or the check below would prove nothing.
    assert expected, "the two settings agreed on every row"
    listed = {d["id"]: d for d in results["disagreements"]}
    assert set(listed) == expected
    by_id = {r["id"]: r for r in results["results"]}
    for row_id, d in listed.items():
        assert d["expected"] == by_id[row_id]["expected"]
        for n in names:
            probs = by_id[row_id]["answers"][n]["probabilities"]
            assert d["answers"][n]["predicted"] == argmax(probs)
            assert d["answers"][n]["probability"] == pytest.approx(max(probs.values()))


def test_bad_rows_are_reported_not_fatal(run):
    results = run["results"]
    assert run["code"] == 1  # results written, but some rows could not be asked
    bad = {b["line"]: b for b in results["bad_rows"]}
    assert sorted(bad) == [9, 10, 11]
    assert bad[9]["id"] == "bad-missing" and bad[9]["error"].startswith("expected: missing")
    assert bad[10]["id"] == "bad-label" and "'c' is not one of" in bad[10]["error"]
    assert bad[11]["id"] == "route-card" and "'legal'" in bad[11]["error"]
    assert {r["line"] for r in results["results"]} == set(range(1, 9))


def test_html_report_has_the_targets_and_tables(run):
    page = run["html"]
    for name in run["targets"]:
        assert name in page
    assert page.count("<table>") >= 1 + 2 * 3 + 1  # summary, per target 2, disagreements
    assert "route-card" in page and "bad-label" in page
    has_plot = 'src="data:image/png;base64,' in page
    assert has_plot == (importlib.util.find_spec("matplotlib") is not None)


def test_report_renders_without_any_answer():
    results = {
        "rows_file": "<x>.jsonl",
        "rows": 0,
        "bad_rows": [{"line": 1, "id": None, "error": "not JSON"}],
        "targets": [],
        "disagreements": [],
        "results": [],
    }
    page = eval_report.render(results)
    assert "&lt;x&gt;.jsonl" in page and "not JSON" in page


def test_clean_run_exits_0(base_server, tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [jevbench_rows()[0], DECISION_ROW])
    out = tmp_path / "r.json"
    assert cli.main(["eval", str(rows), "--target", base_server.url, "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["rows"] == 2 and results["targets"][0]["metrics"]["answered"] == 2
    assert results["disagreements"] == []


def test_a_refused_answer_is_that_rows_error(rotating_server, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SEMIF_API_KEY", raising=False)  # --api-key's default
    rows = write_rows(tmp_path / "rows.jsonl", [DECISION_ROW])
    out = tmp_path / "r.json"
    # No --api-key: the server answers 401, recorded on the row; the run still writes its file.
    assert cli.main(["eval", str(rows), "--target", rotating_server.url, "--out", str(out)]) == 1
    answer = json.loads(out.read_text())["results"][0]["answers"][rotating_server.url]
    assert answer["status"] == 401 and answer["body"]["error"]["type"] == "unauthorized"
    assert "answered 0/1" in capsys.readouterr().err


def test_unusable_input_exits_2(tmp_path, capsys):
    rows = write_rows(tmp_path / "rows.jsonl", [DECISION_ROW])
    out = str(tmp_path / "r.json")
    assert cli.main(["eval", str(tmp_path / "none.jsonl"), "--target", "x.gguf"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli.main(["eval", str(rows), "--target", str(tmp_path / "no.gguf"), "--out", out]) == 2
    assert "no such model file" in capsys.readouterr().err
    (tmp_path / "bad.gguf").write_bytes(b"not a model at all")
    assert cli.main(["eval", str(rows), "--target", str(tmp_path / "bad.gguf"), "--out", out]) == 2
    assert "does not load" in capsys.readouterr().err
    twice = ["--target", "http://127.0.0.1:9", "--target", "http://127.0.0.1:9"]
    assert cli.main(["eval", str(rows), *twice, "--out", out]) == 2
    assert "named twice" in capsys.readouterr().err
    # Only bad rows: nothing is asked (this target would refuse the connection), the file says why.
    only_bad = write_rows(tmp_path / "bad.jsonl", BAD_ROWS)
    assert cli.main(["eval", str(only_bad), "--target", "http://127.0.0.1:9", "--out", out]) == 2
    assert "no valid rows" in capsys.readouterr().err
    assert len(json.loads(Path(out).read_text())["bad_rows"]) == 3
    with pytest.raises(SystemExit) as exc:
        cli.main(["eval", str(rows)])  # --target is required
    assert exc.value.code == 2


def test_target_spellings(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    sm = open_target("sagemaker:my-endpoint")
    assert isinstance(sm, SageMakerTarget) and sm.endpoint == "my-endpoint"
    assert sm.client.meta.region_name == "eu-west-1"
    url = open_target("https://example.invalid/", api_key="k")
    assert isinstance(url, UrlTarget) and url.api_key == "k"


def test_sagemaker_target_sends_the_body_to_invoke_endpoint(base_server, tmp_path):
    rows_file = write_rows(tmp_path / "rows.jsonl", [jevbench_rows()[3], DECISION_ROW])
    rows, bad = read_rows(rows_file)
    assert not bad
    client = boto3.client(
        "sagemaker-runtime",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    stub = Stubber(client)
    for row in rows:
        # What the container's /invocations answers to this very body.
        body = json.dumps(row.body).encode()
        real = base_server.call("POST", "/invocations", raw=body)
        assert real.status == 200
        stub.add_response(
            "invoke_endpoint",
            {
                "Body": StreamingBody(io.BytesIO(real.body), len(real.body)),
                "ContentType": "application/json",
            },
            {"EndpointName": "my-endpoint", "ContentType": "application/json", "Body": body},
        )
    stub.add_client_error(
        "invoke_endpoint",
        service_error_code="ModelError",
        service_message="Received client error (422) from primary",
        http_status_code=424,
        response_meta={"HTTPStatusCode": 424},
    )
    target = SageMakerTarget("sagemaker:my-endpoint", "my-endpoint", client)
    url = UrlTarget(base_server.url, base_server.url)
    with stub:
        try:
            results = evaluate(rows_file, [target, url], progress=False)
        finally:
            url.close()  # its kept-alive connection
        failed = target.ask(rows[0].route, rows[0].body)
        stub.assert_no_pending_responses()
    for r in results["results"]:
        a, b = r["answers"][target.name], r["answers"][url.name]
        assert a["probabilities"] == b["probabilities"]
        assert a["input_tokens"] == b["input_tokens"]
    assert results["targets"][0]["kind"] == "sagemaker"
    assert results["disagreements"] == []
    assert isinstance(failed, Failure) and failed.status == 424 and "ModelError" in failed.message


def test_local_target_failure_is_an_answer_not_a_crash(tmp_path):
    """A row the services refuse (here: a model name the server does not serve) comes back as
    the target's failure with the API's own error body."""
    from semif_proxy.eval.local_target import LocalTarget

    class Refusing:
        sha256 = "0" * 64

    class S:
        strict = False
        model_path = tmp_path / "m.gguf"
        max_questions = 16

    target = LocalTarget("m.gguf", tmp_path / "m.gguf", Refusing(), S())
    out = target.ask("systemone", {"model": "other", "state": "x", "questions": {}})
    assert isinstance(out, Failure) and out.status == 422
    assert not isinstance(out, Answer)


def test_each_answer_is_in_the_rows_file_as_the_results_give_it(run):
    """Every (row, target) answer was appended to <out>.rows.jsonl, once, as the results list it."""
    results = run["results"]
    rows_file = Path(results["run"]["rows_log"])
    records = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert len(records) == results["rows"] * len(run["targets"])
    by_key = {(r["line"], r["target"]): r for r in records}
    assert len(by_key) == len(records)
    for r in results["results"]:
        for name, answer in r["answers"].items():
            assert by_key[(r["line"], name)]["answer"] == answer
            assert answer["tries"] == 1
