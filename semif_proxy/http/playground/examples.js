// One-click examples: realistic decisions a newcomer can run as they are.
export const EXAMPLES = [
  {
    name: "Support-ticket routing",
    shape: "decisions",
    state: "Customer email: I requested a password reset three times but the email never arrives. I can't log in to pay my invoice.",
    question: "Which support queue should handle this ticket?",
    options: [
      ["billing", "Billing, invoices, refunds and payment problems"],
      ["account_access", "Login, password reset and account access problems"],
      ["shipping", "Delivery, tracking and shipping problems"],
    ],
    extras: ["Which queue is the second best fit?"],
  },
  {
    name: "Refund policy check",
    shape: "systemone",
    type: "noul",
    state: JSON.stringify({
      order: { id: "A-1042", delivered: "2026-11-02", amount_eur: 89.0 },
      request: { date: "2026-11-20", reason: "changed my mind", item_opened: false },
      policy: "Unopened items can be returned for a full refund within 30 days of delivery.",
    }, null, 2),
    question: "Does this request qualify for a full refund under the policy?",
    options: [["true", "qualifies"], ["false", "does not qualify"]],
    extras: [],
  },
  {
    name: "Agent next action",
    shape: "decisions",
    state: JSON.stringify({
      goal: "Book a table for 4 at an Italian restaurant tonight at 19:30",
      done: ["searched restaurants", "found Trattoria Roma with availability"],
      last_tool_result: "Trattoria Roma: table for 4 available at 19:30, needs a phone number",
    }, null, 2),
    question: "What should the agent do next?",
    options: [
      ["ask_user", "Ask the user for the missing information"],
      ["book", "Call the booking tool now"],
      ["search_again", "Search for other restaurants"],
      ["finish", "Report success to the user"],
    ],
    extras: [],
  },
  {
    name: "Incident severity score",
    shape: "systemone",
    type: "score",
    state: "Alert: checkout service error rate 38% for the last 12 minutes in eu-west-1; payments failing for most customers; on-call not yet acknowledged.",
    question: "How severe is this incident?",
    options: [
      ["0", "Low: cosmetic, no customer impact"],
      ["1", "Medium: degraded for some customers"],
      ["2", "High: a core flow is failing for many customers"],
      ["3", "Critical: outage with revenue loss right now"],
    ],
    extras: [],
  },
];
