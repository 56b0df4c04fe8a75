"""`options`: decision latency against the number of options (2 to 255), and letters against
numbers as labels, measured side by side.

Latency: one decision per size, each with a fresh state (no prefix reuse: the whole prompt is
evaluated), on a server with the default settings; past 26 options the labels are numbers and
each option is a label sequence (label_tree.py). Labels: the same questions (a city, which
country?) asked of a default server (letters up to 26) and of one with SEMIF_LABELS=numbers, at
8 and 26 options, with the right answer at every position in turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import common

SIZES = (2, 8, 26, 64, 128, 255)
LABEL_SIZES = (8, 26)
CAPITALS = [
    ("Paris", "France"), ("Berlin", "Germany"), ("Madrid", "Spain"), ("Rome", "Italy"),
    ("Lisbon", "Portugal"), ("Vienna", "Austria"), ("Warsaw", "Poland"), ("Prague", "Czechia"),
    ("Budapest", "Hungary"), ("Athens", "Greece"), ("Dublin", "Ireland"), ("Oslo", "Norway"),
    ("Stockholm", "Sweden"), ("Helsinki", "Finland"), ("Copenhagen", "Denmark"),
    ("Amsterdam", "Netherlands"), ("Brussels", "Belgium"), ("Bern", "Switzerland"),
    ("Tokyo", "Japan"), ("Beijing", "China"), ("Seoul", "South Korea"), ("Delhi", "India"),
    ("Bangkok", "Thailand"), ("Hanoi", "Vietnam"), ("Jakarta", "Indonesia"),
    ("Manila", "Philippines"),
    ("Cairo", "Egypt"), ("Nairobi", "Kenya"), ("Lagos", "Nigeria"), ("Accra", "Ghana"),
    ("Ottawa", "Canada"), ("Lima", "Peru"), ("Santiago", "Chile"), ("Bogota", "Colombia"),
    ("Caracas", "Venezuela"), ("Havana", "Cuba"), ("Canberra", "Australia"),
    ("Wellington", "New Zealand"), ("Moscow", "Russia"), ("Kyiv", "Ukraine"), ("Ankara", "Turkey"),
    ("Tehran", "Iran"), ("Baghdad", "Iraq"), ("Riyadh", "Saudi Arabia"), ("Doha", "Qatar"),
    ("Kabul", "Afghanistan"), ("Islamabad", "Pakistan"), ("Dhaka", "Bangladesh"),
    ("Kathmandu", "Nepal"), ("Colombo", "Sri Lanka"), ("Rabat", "Morocco"), ("Tunis", "Tunisia"),
    ("Algiers", "Algeria"), ("Dakar", "Senegal"), ("Kampala", "Uganda"), ("Lusaka", "Zambia"),
    ("Harare", "Zimbabwe"), ("Mexico City", "Mexico"), ("Brasilia", "Brazil"),
    ("Buenos Aires", "Argentina"), ("Montevideo", "Uruguay"), ("Quito", "Ecuador"),
    ("Reykjavik", "Iceland"), ("Tallinn", "Estonia"),
]  # fmt: skip
QUESTION = "Which country is the traveller in?"


def catalogue(n: int) -> list[dict[str, str]]:
    countries = [c for _, c in CAPITALS]
    names = countries[:n] + [f"Territory {i}" for i in range(max(0, n - len(countries)))]
    return [{"id": f"c{i}", "description": name} for i, name in enumerate(names)]


def latency(url: str, repeats: int) -> dict[str, Any]:
    rows = {}
    for n in SIZES:
        times, forwards, tokens, suffix = [], [], 0, 0
        for r in range(repeats):
            decision = {
                "id": f"n{n}-{r}",
                "state": f"Trip log {n}-{r}: the traveller has just landed in Lisbon.",
                "question": QUESTION,
                "options": catalogue(n),
            }
            reply = common.post(url + "/v1/decisions", {"decision": decision})
            if reply.status != 200:
                raise RuntimeError(f"{n} options: HTTP {reply.status}: {reply.body}")
            result = reply.body["result"]
            times.append(reply.seconds)
            forwards.append(result["timing"]["forward_seconds"])
            tokens = result["input_tokens"]
            suffix = result["readout"]
        p50 = common.pct(times, 0.5)
        rows[str(n)] = {
            "prompt_tokens": tokens,
            "readout": suffix,
            "seconds": common.summary(times),
            "forward_seconds_p50": common.pct(forwards, 0.5),
            "ms_per_option_p50": 1000.0 * p50 / n,
            "ms_per_prompt_token_p50": 1000.0 * p50 / max(tokens, 1),
        }
        common.progress(SIZES.index(n) + 1, len(SIZES), "options latency")
    return rows


def label_accuracy(url: str, n: int) -> dict[str, Any]:
    """Each of the first n cities asked with its country at position i (i = 0..n-1)."""
    correct, first, times = 0, 0, []
    options = catalogue(n)
    for i in range(n):
        city = CAPITALS[i][0]
        decision = {
            "id": f"city-{i}",
            "state": f"The traveller has just landed in {city}.",
            "question": QUESTION,
            "options": options,
        }
        reply = common.post(url + "/v1/decisions", {"decision": decision})
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {reply.body}")
        probs = reply.body["result"]["probabilities"]
        top = max(range(n), key=probs.__getitem__)
        correct += top == i
        first += top == 0
        times.append(reply.seconds)
    return {
        "items": n,
        "accuracy": correct / n,
        "first_listed_share": first / n,
        "seconds_p50": common.pct(times, 0.5),
        "prompt_version": reply.body["result"]["prompt_version"],
    }


def run(model: Path, repeats: int = 3, sizes: bool = True) -> dict[str, Any]:
    """sizes=False (the `labels` suite): letters against numbers only, for a model too slow to
    take 255-option prompts in a reasonable run."""
    out: dict[str, Any] = {"sizes": list(SIZES) if sizes else [], "labels": {}}
    server = common.start_server(model)
    try:
        if sizes:
            out["latency"] = latency(server.url, repeats)
        out["labels"]["auto"] = {str(n): label_accuracy(server.url, n) for n in LABEL_SIZES}
        out["server_cpu"] = common.get_json(server.url + "/health").get("cpu")
    finally:
        server.stop()
    server = common.start_server(model, {"SEMIF_LABELS": "numbers"})
    try:
        out["labels"]["numbers"] = {str(n): label_accuracy(server.url, n) for n in LABEL_SIZES}
    finally:
        server.stop()
    if sizes:
        base = out["latency"]["2"]["seconds"]["p50"]
        out["p50_over_2_options"] = {
            n: r["seconds"]["p50"] / base for n, r in out["latency"].items()
        }
    return out


def headline(r: dict[str, Any]) -> str:
    labels = "; ".join(
        f"{scheme} at {n}: accuracy {a['accuracy']:.0%}, first-listed "
        f"{a['first_listed_share']:.0%}, p50 {a['seconds_p50']:.2f} s"
        for scheme, by_n in r["labels"].items()
        for n, a in by_n.items()
    )
    if "latency" not in r:
        return labels
    lat = ", ".join(
        f"{n}: {row['seconds']['p50']:.2f} s ({row['prompt_tokens']} tokens)"
        for n, row in r["latency"].items()
    )
    return f"decision p50 by options {lat}; {labels}"
