"""HLO text: one parser of StableHLO and optimized HLO, and what is read from it."""
