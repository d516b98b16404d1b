"""``polyturn serve``: trained agents behind an OpenAI-compatible HTTP API (docs/serving.md).

Layers: :mod:`.engine` batches every live session's turn through the rollout
decoder; :mod:`.sessions` keeps conversations, tool state and idle timeouts;
:mod:`.routing` splits traffic between checkpoint versions (A/B, ramp,
rollback); :mod:`.recording` writes finished sessions as episode records;
:mod:`.app` wires them into a FastAPI app.
"""
