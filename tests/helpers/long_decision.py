"""A decision on a long state (two engine ubatches at the default size), for runs beside a
chat: long enough that a chat arrives while it is on the cores."""

from __future__ import annotations

LONG_STATE = "The parcel was marked delivered but never reached the customer's door. " * 60


def long_decision(name: str) -> dict:
    return {
        "decision": {
            "id": name,
            "state": LONG_STATE,
            "question": "Which team handles it?",
            "options": [
                {"id": "shipping", "description": "Delivery and lost parcels"},
                {"id": "billing", "description": "Payments and refunds"},
            ],
        }
    }
