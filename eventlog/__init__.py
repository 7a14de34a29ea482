"""convplane's replicated, quorum-acknowledged, fenced conversation event log."""
