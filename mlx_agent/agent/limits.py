"""The agent loop's default limits, importable without the runtime (``--help`` shows them)."""

MAX_STEPS = 8  # assistant steps (tool rounds) per user turn
MAX_TOKENS = 256  # tokens per assistant step
RETRY_AFTER_ERROR = 1  # steps per turn made to call again after a call failed
