"""The options of task synthesis and their defaults (no imports, so the CLI reads them cheaply)."""

from __future__ import annotations

from dataclasses import dataclass


# Tasks a side may ask for: each is planned up front, and 99999999999 met the OOM killer
# (a catalogue gives far fewer distinct tasks anyway; the default is 200).
MAX_TASKS = 100_000


@dataclass(frozen=True)
class SynthConfig:
    n_train: int = 200
    n_heldout: int = 60
    seed: int = 0
    no_tool_share: float = 0.15  # requests no tool answers
    outside_share: float = 0.0  # requests for a tool the catalogue lacks: no call is right
    chain_share: float = 0.15  # two calls, the second taking the first one's result
    answer_share: float = 0.2  # the answer must state the tool's result
    optional_share: float = 0.5  # how often an optional parameter is given
    run_tools: bool = True  # run tools to learn their results (chains and answers need it)
    files: tuple[str, ...] = ()  # paths a path parameter draws (a fixture's); () = the pools
    tool_timeout: float = 10.0

    def shares(self) -> dict[str, float]:
        return {"none": self.no_tool_share, "outside": self.outside_share,
                "chain": self.chain_share,
                "answer": self.answer_share}
