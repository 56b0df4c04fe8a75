"""`python -m bench --model M.gguf prior`: the position prior (PriDe) against one pass and
`permutations: n` on JevBench, out of fold.

1. A server with the rows log on (SEMIF_ROWS_LOG) asks every task with `permutations` = its
   option count (every cyclic rotation, averaged), and in one pass, the two side by side.
2. The tasks are split in two halves, A and B (alternating within each question type and option
   count; identical prompts stay in one half). `semif-proxy calibrate --rows` fits a prior on
   the rows log's lines of each half: nothing but the rotated logits, no labels.
3. A server with the prior of A (SEMIF_CALIBRATION) asks each of B's tasks in one pass twice:
   with the prior, and with `position_prior: false` (plain one pass); one with B's prior does
   the same for A's. Each task is scored by a prior that never saw it, and the two one-pass
   requests of a task run next to each other, under the same load on the machine.

Every server runs with the prefix cache off, and no request follows one on the same state where
the tasks allow it (`cold_order`; the others are counted in `warm_requests`): each request is
cold (its state evaluated afresh), so the paths pay the same prefill. Each latency ratio is of
requests that ran side by side: permutations n / one pass on the first server, one pass + prior
/ one pass on the calibrated ones.
Accuracy, first-listed rate (the answer is the option listed first), ECE and latency of each
path; the share of the `permutations: n` accuracy gain that the prior recovers, and its
latency against one pass (the goal: >= 70 % at <= 1.1x).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import get_json, post, progress, start_server, summary
from bench.suites import tasks
from semif_proxy.calibration.position_prior import from_json
from semif_proxy.calibration.temperature import ece
from semif_proxy.cli import main as cli_main
from semif_proxy.engine.examples import ROUTING_OPTIONS, ROUTING_STATE
from semif_proxy.eval.jevbench import Task
from semif_proxy.readout import softmax

# Asked once on each new server before the measured requests (a state no task has).
WARM_UP = {
    "id": "warm-up",
    "state": ROUTING_STATE,
    "question": "Which queue should handle it?",
    "options": [{"id": i, "description": d} for i, d in ROUTING_OPTIONS],
    "position_prior": False,
}
GOAL_SHARE = 0.7
GOAL_LATENCY = 1.1
# Cold requests: no prefix cache; decisions only (no llama-server: nothing here chats).
# No bias correction: the yes/no default (contextual) divides the prior out too, and this
# suite measures the prior.
SERVER_ENV = {"SEMIF_CHAT": "off", "SEMIF_PREFIX_CACHE_MB": "0", "SEMIF_BIAS_CORRECTION": "none"}


def option_ids(task: Task) -> list[str]:
    q = task.row["question"]
    if q["type"] == "noul":
        return ["yes", "no"]
    if q["type"] == "choice":
        return list(q["criteria"])
    return [str(i) for i in range(len(q["criteria"]))]


def ask(url: str, task: Task, permutations: int, prior: bool = True) -> dict[str, Any]:
    """One System One call: the probabilities in the request's option order, the option
    logits of each order asked (presented order), the prompt's sha256, the seconds."""
    body = {**task.request(), "permutations": permutations}
    if not prior:
        body["position_prior"] = False
    reply = post(url + "/v1/systemone", body)
    if reply.status != 200:
        return {"status": reply.status, "error": str(reply.body)[:300]}
    answer = reply.body["answers"]["q"]
    if answer["type"] == "noul":
        probs = [answer["noul"], 1.0 - answer["noul"]]
    else:
        probs = list(answer["probabilities"].values())
    diag = reply.body["semif"]["questions"]["q"]
    return {
        "status": 200,
        "seconds": reply.seconds,
        "probabilities": probs,
        "option_logits": diag["option_logits"],
        "orders": diag["rotations"],
        "prompt_sha256": diag["prompt_sha256"][0],
        "position_prior": diag.get("position_prior"),
        "forward_seconds": reply.body["semif"]["timing"]["forward_seconds"],
        "prefix_reused_tokens": reply.body["semif"]["timing"]["prefix_reused_tokens"],
    }


def state_key(task: Task) -> str:
    return json.dumps(task.row["state"], sort_keys=True)


def cold_order(keys: list[str]) -> list[int]:
    """The indices in their order, except that each next one is the first still waiting whose
    state differs from the one just asked: a request right after one on the same state would
    find its prefix evaluated already (the engine holds the last prefix) and not be cold."""
    waiting = list(range(len(keys)))
    order: list[int] = []
    while waiting:
        last = keys[order[-1]] if order else None
        pick = next((i for i in waiting if keys[i] != last), waiting[0])
        waiting.remove(pick)
        order.append(pick)
    return order


def paired_sweep(
    url: str, chosen: list[Task], label: str, permuted: bool = False
) -> tuple[list[dict], list[dict]]:
    """Each task in one pass without the prior, and then either with it or with
    `permutations` = its option count: the two one right after the other where the states
    allow (so that both run under the same load on the machine), cold; which of the two goes
    first alternates from task to task. A first request on another state pays the new
    process's page faults before any measured one."""
    post(url + "/v1/decisions", {"decision": WARM_UP})
    asks = [
        (k, second) for k in range(len(chosen)) for second in ((False, True), (True, False))[k % 2]
    ]
    out: dict[tuple[int, bool], dict] = {}
    keys = [state_key(chosen[k]) for k, _ in asks]
    last = None
    for done, a in enumerate(cold_order(keys), 1):
        k, second = asks[a]
        if not second:
            reply = ask(url, chosen[k], 1, prior=False)
        elif permuted:
            reply = ask(url, chosen[k], len(option_ids(chosen[k])))
        else:
            reply = ask(url, chosen[k], 1)
        out[(k, second)] = reply | {"warm": keys[a] == last}
        last = keys[a]
        progress(done, len(asks), label)
    return [out[(k, False)] for k in range(len(chosen))], [
        out[(k, True)] for k in range(len(chosen))
    ]


def halves(chosen: list[Task], shas: list[str]) -> list[int]:
    """0 (A) or 1 (B) per task: alternating within each (type, option count), by prompt."""
    seen: dict[str, int] = {}
    counts: Counter[tuple[str, int]] = Counter()
    folds = []
    for task, sha in zip(chosen, shas):
        if sha not in seen:
            key = (task.kind, len(option_ids(task)))
            seen[sha] = counts[key] % 2
            counts[key] += 1
        folds.append(seen[sha])
    return folds


def scores(probs: list[np.ndarray], labels: list[int]) -> dict[str, float]:
    picks = [int(np.argmax(p)) for p in probs]
    correct = [p == y for p, y in zip(picks, labels)]
    return {
        "accuracy": float(np.mean(correct)),
        "first_listed": float(np.mean([p == 0 for p in picks])),
        "ece": ece([float(np.max(p)) for p in probs], correct),
        "correct": int(sum(correct)),
    }


def fit_fold(rows_file: Path, shas: set[str], folder: Path, name: str) -> tuple[Path, dict]:
    """The rows log's lines of one half, fitted by `semif-proxy calibrate --rows`."""
    lines = [
        line
        for line in rows_file.read_text(encoding="utf-8").splitlines()
        if json.loads(line)["prompt_sha256"] in shas
    ]
    part = folder / f"rows-{name}.jsonl"
    part.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = folder / f"calibration-{name}.json"
    if cli_main(["calibrate", "--rows", str(part), "--output", str(out)]) != 0:
        # Too few questions at every option count (a small --limit): no prior at all.
        out.write_text(json.dumps({"position_prior": {}, "position_prior_fit": None}))
    return out, json.loads(out.read_text())


def run(model: Path, limit: int | None, only: str | None) -> dict[str, Any]:
    chosen = tasks(limit, only)
    labels = [option_ids(t).index(t.expected) for t in chosen]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="semif-prior-") as tmp:
        folder = Path(tmp)
        rows_file = folder / "rows.jsonl"
        server = start_server(model, {**SERVER_ENV, "SEMIF_ROWS_LOG": str(rows_file)})
        try:
            plain_first, permuted = paired_sweep(server.url, chosen, "permuted", permuted=True)
            health = get_json(server.url + "/health")
        finally:
            server.stop()  # the rows log is drained as the process exits
        failed = [
            t.id
            for t, a, b in zip(chosen, plain_first, permuted)
            if a["status"] != 200 or b["status"] != 200
        ]
        keep = [i for i, t in enumerate(chosen) if t.id not in failed]
        folds = halves([chosen[i] for i in keep], [permuted[i]["prompt_sha256"] for i in keep])
        fold_of = dict(zip(keep, folds))
        calibrations, priors = {}, {}
        for fold, name in ((0, "A"), (1, "B")):
            shas = {permuted[i]["prompt_sha256"] for i in keep if fold_of[i] == fold}
            calibrations[name], priors[name] = fit_fold(rows_file, shas, folder, name)
        # Each half answered with the prior of the other (and without any).
        plain: dict[int, dict] = {}
        with_prior: dict[int, dict] = {}
        for fold, prior_of in ((1, "A"), (0, "B")):
            env = {**SERVER_ENV, "SEMIF_CALIBRATION": str(calibrations[prior_of])}
            server = start_server(model, env)
            try:
                half = [i for i in keep if fold_of[i] == fold]
                off, on = paired_sweep(server.url, [chosen[i] for i in half], f"half {'AB'[fold]}")
                plain.update(zip(half, off))
                with_prior.update(zip(half, on))
            finally:
                server.stop()
    paths = {"one_pass_first_server": plain_first, "one_pass": plain, "permutations_n": permuted}
    return summarise(chosen, labels, keep, fold_of, paths, with_prior, priors) | {
        "tasks_asked": len(chosen),
        "failed": failed,
        "server_env": SERVER_ENV,
        "server_cpu": health.get("cpu"),
        "load_average_before_after": [load_before, os.getloadavg()],
    }


def summarise(
    chosen: list[Task],
    labels: list[int],
    keep: list[int],
    fold_of: dict[int, int],
    answered: dict[str, Any],
    with_prior: dict[int, dict],
    priors: dict[str, dict],
) -> dict[str, Any]:
    """`answered`: one pass and permutations n on the first server (paired), one pass on the
    calibrated ones (paired with `with_prior`)."""
    plain, permuted, plain_first = (
        answered[k] for k in ("one_pass", "permutations_n", "one_pass_first_server")
    )
    tables = {name: from_json(p["position_prior"]) for name, p in priors.items()}
    # The prior each task was answered with: the other half's.
    prior_for = {i: tables["B" if fold_of[i] == 0 else "A"] for i in keep}
    ok = [i for i in keep if with_prior[i]["status"] == 200 and plain[i]["status"] == 200]
    y = [labels[i] for i in ok]
    paths = {
        "one_pass": [np.asarray(plain[i]["probabilities"]) for i in ok],
        "one_pass_prior": [np.asarray(with_prior[i]["probabilities"]) for i in ok],
        "permutations_n": [np.asarray(permuted[i]["probabilities"]) for i in ok],
    }
    # Latency of cold requests only (a request right after one on its own state is warm).
    seconds = {
        name: [r[i]["seconds"] for i in ok if not r[i]["warm"]]
        for name, r in (
            ("one_pass", plain),
            ("one_pass_prior", with_prior),
            ("permutations_n", permuted),
        )
    }
    by_path = {
        name: {**scores(probs, y), "latency_seconds": summary(seconds[name])}
        for name, probs in paths.items()
    }
    # The served probabilities are softmax(logits - log prior) of the one-pass logits.
    served_gap = 0.0
    applied = 0
    said_applied = sum(with_prior[i]["position_prior"] == "applied" for i in ok)
    # The engine is exact: rotation 0 of the permuted run is the one pass, bit for bit.
    rotation0_gap = max(
        float(
            np.abs(np.subtract(permuted[i]["option_logits"][0], plain[i]["option_logits"][0])).max()
        )
        for i in ok
    )
    for i in ok:
        task = chosen[i]
        log_prior = prior_for[i].log_prior(task.kind, len(option_ids(task)))
        logits = np.asarray(with_prior[i]["option_logits"][0])
        if log_prior is not None:
            applied += 1
            logits = logits - np.asarray(log_prior)
        served_gap = max(
            served_gap, float(np.abs(softmax(logits) - with_prior[i]["probabilities"]).max())
        )
    # Every rotation of the permuted run as a one-pass answer of its own (n x the samples), so
    # that where the benchmark happens to list the right option does not count: raw, with the
    # out-of-fold prior, and the permutations-n answer (the same in every order) as it would
    # be listed there. Positions are presented positions.
    rot_raw, rot_prior, rot_perm, rot_y = [], [], [], []
    for i in ok:
        task = chosen[i]
        log_prior = prior_for[i].log_prior(task.kind, len(option_ids(task)))
        mean = np.asarray(permuted[i]["probabilities"])
        for order, logits in zip(permuted[i]["orders"], permuted[i]["option_logits"]):
            logits = np.asarray(logits)
            rot_raw.append(softmax(logits))
            rot_prior.append(softmax(logits if log_prior is None else logits - log_prior))
            rot_perm.append(mean[order])
            rot_y.append(order.index(labels[i]))
    over_rotations = {
        "one_pass": scores(rot_raw, rot_y),
        "one_pass_prior": scores(rot_prior, rot_y),
        "permutations_n": scores(rot_perm, rot_y),
        "runs": len(rot_y),
    }

    def recovered(acc: dict[str, Any]) -> tuple[float, float | None]:
        one, pri, per = (
            acc[k]["accuracy"] for k in ("one_pass", "one_pass_prior", "permutations_n")
        )
        return per - one, ((pri - one) / (per - one) if per > one else None)

    gain, share = recovered(by_path)
    gain_rotations, share_rotations = recovered(over_rotations)
    latency_ratio = (
        by_path["one_pass_prior"]["latency_seconds"]["p50"]
        / by_path["one_pass"]["latency_seconds"]["p50"]
    )
    # permutations n against one pass on the first server, where the two ran side by side.
    perm_pairs = [i for i in ok if not (permuted[i]["warm"] or plain_first[i]["warm"])]
    first_p50 = summary([plain_first[i]["seconds"] for i in perm_pairs])["p50"]
    permutations_ratio = summary([permuted[i]["seconds"] for i in perm_pairs])["p50"] / first_p50
    permutations_per_task = float(
        np.median([permuted[i]["seconds"] / plain_first[i]["seconds"] for i in perm_pairs])
    )
    same_one_pass = max(
        float(np.abs(np.subtract(plain_first[i]["probabilities"], plain[i]["probabilities"])).max())
        for i in ok
    )
    per_task_ratio = float(
        np.median(
            [
                with_prior[i]["seconds"] / plain[i]["seconds"]
                for i in ok
                if not (with_prior[i]["warm"] or plain[i]["warm"])
            ]
        )
    )
    by_type = {}
    for kind in sorted({chosen[i].kind for i in ok}):
        idx = [k for k, i in enumerate(ok) if chosen[i].kind == kind]
        by_type[kind] = {
            "tasks": len(idx),
            **{
                name: scores([probs[k] for k in idx], [y[k] for k in idx])["accuracy"]
                for name, probs in paths.items()
            },
        }
    return {
        "tasks": len(ok),
        "halves": [sum(fold_of[i] == f for i in ok) for f in (0, 1)],
        "prior_applied": applied,
        "warm_requests": sum(r[i]["warm"] for r in (plain, with_prior, permuted) for i in ok),
        "prior_applied_said_by_the_answers": said_applied,
        "rotation0_vs_one_pass_max_gap": rotation0_gap,
        "by_path": by_path,
        "over_every_rotation": over_rotations,
        "by_type": by_type,
        "first_listed_if_position_blind": float(
            np.mean([1.0 / len(option_ids(chosen[i])) for i in ok])
        ),
        "permutations_gain": gain,
        "recovered_share": share,
        "permutations_gain_over_every_rotation": gain_rotations,
        "recovered_share_over_every_rotation": share_rotations,
        "latency_ratio_p50": latency_ratio,
        "latency_ratio_per_task_median": per_task_ratio,
        "permutations_latency_ratio_p50": permutations_ratio,
        "permutations_latency_ratio_per_task_median": permutations_per_task,
        "one_pass_on_the_first_server_latency_seconds": summary(
            [plain_first[i]["seconds"] for i in perm_pairs]
        ),
        "one_pass_both_servers_max_gap": same_one_pass,
        "goal": {"recovered_share": GOAL_SHARE, "latency_ratio": GOAL_LATENCY},
        "goal_met": share is not None and share >= GOAL_SHARE and latency_ratio <= GOAL_LATENCY,
        "goal_met_over_every_rotation": share_rotations is not None
        and share_rotations >= GOAL_SHARE
        and latency_ratio <= GOAL_LATENCY,
        "served_vs_offline_max_gap": served_gap,
        "priors": {name: p["position_prior"] for name, p in priors.items()},
        "prior_fits": {name: p["position_prior_fit"] for name, p in priors.items()},
        "rows": [
            {
                "id": chosen[i].id,
                "file": chosen[i].file,
                "type": chosen[i].kind,
                "half": "AB"[fold_of[i]],
                "label": labels[i],
                "one_pass": plain[i]["probabilities"],
                "one_pass_prior": with_prior[i]["probabilities"],
                "permutations_n": permuted[i]["probabilities"],
                "seconds": [plain[i]["seconds"], with_prior[i]["seconds"], permuted[i]["seconds"]],
                "forward_seconds": [
                    plain[i]["forward_seconds"],
                    with_prior[i]["forward_seconds"],
                    permuted[i]["forward_seconds"],
                ],
                "prefix_reused_tokens": [
                    plain[i]["prefix_reused_tokens"],
                    with_prior[i]["prefix_reused_tokens"],
                    permuted[i]["prefix_reused_tokens"],
                ],
                "rotation_logits": permuted[i]["option_logits"],
                "orders": permuted[i]["orders"],
            }
            for i in ok
        ],
    }


def headline(r: dict[str, Any]) -> str:
    def share(value: float | None) -> str:
        return f"{value:.0%}" if value is not None else "n/a (no gain)"

    def accuracies(p: dict[str, Any]) -> str:
        return (
            f"one pass {p['one_pass']['accuracy']:.1%}, + prior "
            f"{p['one_pass_prior']['accuracy']:.1%}, permutations n "
            f"{p['permutations_n']['accuracy']:.1%}"
        )

    p, rot = r["by_path"], r["over_every_rotation"]
    return (
        f"{r['tasks']} tasks out of fold, in the request's order: {accuracies(p)}; first-listed "
        f"{p['one_pass']['first_listed']:.0%} / {p['one_pass_prior']['first_listed']:.0%} / "
        f"{p['permutations_n']['first_listed']:.0%}; recovered {share(r['recovered_share'])} "
        f"of the gain. Over every rotation ({rot['runs']} runs): {accuracies(rot)}, recovered "
        f"{share(r['recovered_share_over_every_rotation'])}. Latency p50 "
        f"{r['latency_ratio_p50']:.2f}x one pass (permutations "
        f"{r['permutations_latency_ratio_p50']:.2f}x); goal {'met' if r['goal_met'] else 'NOT met'}"
    )
