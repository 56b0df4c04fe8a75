"""The routing example: a support ticket and three queues. The README shows it, the benchmarks
measure it (bench `order`) and the tests check engine parity on it."""

from __future__ import annotations

ROUTING_STATE = (
    "Customer email: I requested a password reset three times but the email never "
    "arrives. I cannot log in to my account."
)
ROUTING_QUESTION = "Which support queue should handle this ticket?"
# (option id, description), in the order the README lists them.
ROUTING_OPTIONS = [
    ("billing", "Billing, invoices, refunds and payment problems"),
    ("account_access", "Login, password reset and account access problems"),
    ("shipping", "Delivery, tracking and shipping problems"),
]
