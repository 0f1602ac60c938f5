"""Token-exact ``.atraj`` trajectories: the original's version-1 fields, read and written here.

A trajectory is one rollout: ``version`` (1), ``id``, ``steps``, ``summary`` (a string map) and
optionally ``task``, ``checkpoint_path``, ``model_fingerprint``; we add ``sampling`` and
``turn_stats``. A step has ``role`` (system/user/assistant/tool), ``content``, and optionally
``input_ids`` (exactly the ids fed to the model for this step), ``output_ids`` (exactly the ids
sampled), ``tool_call`` {name, arguments_json}, ``tool_result`` {name, stdout, stderr,
exit_code, duration_sec}, ``reward`` and ``timestamp``. Readers of the original ignore our extra
field ``prefix_len``: where in the token sequence a step's ``input_ids`` start. It equals the
length of everything before when the cache was reused whole, and is shorter when a re-rendered
conversation (hermes) made the engine drop cached tokens, so that replaying
``seq = seq[:prefix_len] + input_ids + output_ids`` step by step gives exactly the ids in the KV
cache; a file whose ``prefix_len`` falls outside the sequence so far is not a valid one.

Files are written atomically (temporary file, rename) after every step, so a crash loses at
most the step in flight. A file over :data:`MAX_BYTES` is refused unread. Nothing here runs a
model.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Annotated, Iterator, Literal

import msgspec

from .errors import UserFacingError
from .fileio import PinnedFolder, read_regular, write_bytes

VERSION = 1
SUFFIX = ".atraj"
# A step's ids are written as JSON numbers, about 6 bytes a token: 256 MiB holds some 40
# million, over 300 whole re-renders of a 128k-token context; an agent's default limits write
# far less, and the file is rewritten whole after every step, so one this size is already
# seconds a step. A larger file is refused before it is read (3 GB took 3.1 GB and 11 s).
MAX_BYTES = 256 << 20


class ToolCallRecord(msgspec.Struct, omit_defaults=True):
    name: str
    arguments_json: str


class ToolResultRecord(msgspec.Struct, omit_defaults=True):
    name: str
    stdout: str
    stderr: str
    exit_code: int
    duration_sec: float | None = None  # optional in the original's files; ours always have it
    timed_out: bool = False


TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]  # a file's ids go to int32 arrays


class Step(msgspec.Struct, omit_defaults=True):
    role: Literal["system", "user", "assistant", "tool"]  # another would go into rows as is
    content: str
    input_ids: list[TokenId] | None = None
    output_ids: list[TokenId] | None = None
    prefix_len: int | None = None
    tool_call: ToolCallRecord | None = None
    tool_result: ToolResultRecord | None = None
    reward: float | None = None
    timestamp: float | None = None


# Not omit_defaults: the original's reader requires steps and summary, even empty, and reads
# null as absent for the optional fields.
class Trajectory(msgspec.Struct):
    id: str
    steps: list[Step] = msgspec.field(default_factory=list)
    summary: dict[str, str] = msgspec.field(default_factory=dict)
    # written as 1 (the original's reader expects it); None only when a file lacked it
    version: int | None = None
    task: str | None = None
    checkpoint_path: str | None = None
    model_fingerprint: str | None = None
    sampling: dict | None = None
    turn_stats: list[dict] | None = None

    def replay(self) -> tuple[list[int], list[int]]:
        """The ids in the model's KV cache at the end of the rollout, and a mask that is 1
        on the ones the model sampled, replayed from the steps."""
        seq: list[int] = []
        mask: list[int] = []
        for step in self.steps:
            if step.input_ids is not None:
                if step.prefix_len is not None:  # in place: a copy each step was quadratic
                    del seq[step.prefix_len:], mask[step.prefix_len:]
                seq += step.input_ids
                mask += [0] * len(step.input_ids)
            if step.output_ids is not None:
                seq += step.output_ids
                mask += [1] * len(step.output_ids)
        return seq, mask

    def token_sequence(self) -> list[int]:
        return self.replay()[0]

    @property
    def token_exact(self) -> bool:
        """Whether the ids replay to what the model was fed: its first fed step says where
        its ids start (``prefix_len``), as every recording of ours does. The original's
        recorder wrote neither that nor the chat framing around a user's ids, and no ids for
        tool results: its files replay into a sequence its model never saw."""
        first = next((s for s in self.steps if s.input_ids is not None), None)
        return first is not None and first.prefix_len is not None


class _Versioned(msgspec.Struct):
    version: int | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Trajectory)
_version_decoder = msgspec.json.Decoder(_Versioned)


class TrajectoryError(UserFacingError, ValueError):
    """A file that is not a readable ``.atraj``."""


class TrajectoryWriteError(UserFacingError):
    """A trajectory the filesystem would not take (a full disk); the message names it."""


def write(path: str | os.PathLike, traj: Trajectory, durable: bool = True) -> None:
    """Write ``traj`` atomically, ``"version": 1`` included; raises
    :class:`TrajectoryWriteError`, with nothing written, when the filesystem refuses."""
    try:
        write_bytes(path, _encoder.encode(msgspec.structs.replace(traj, version=VERSION)),
                    durable=durable)
    except OSError as e:  # it reached the CLI as a standard output that failed
        raise TrajectoryWriteError(f"cannot write the trajectory {path}: "
                                   f"{e.strerror or e}") from None


def read(path: str | os.PathLike) -> Trajectory:
    try:
        data = read_regular(path, max_bytes=MAX_BYTES)
        # the version first: another version's fields are not this one's to misread
        version = _version_decoder.decode(data).version
        if version not in (None, VERSION):
            raise TrajectoryError(f"{path}: .atraj version {version} is not supported (only 1)")
        traj = _decoder.decode(data)
    except OSError as e:
        raise TrajectoryError(f"cannot read {path}: {e.strerror}") from None
    except msgspec.DecodeError as e:
        raise TrajectoryError(f"{path} is not a valid .atraj file: {e}") from None
    except RecursionError:
        raise TrajectoryError(f"{path} is not a valid .atraj file: JSON nested too deeply "
                              "to read") from None
    _check_prefixes(path, traj)
    _check_calls(path, traj)
    return traj


def _check_calls(path, traj: Trajectory) -> None:
    """Each recorded call's ``arguments_json`` must be a JSON object, as the agent writes
    it: anything else was copied into training rows as the call's arguments."""
    for i, step in enumerate(traj.steps):
        if step.tool_call is None:
            continue
        try:
            ok = isinstance(json.loads(step.tool_call.arguments_json), dict)
        except (ValueError, RecursionError):
            ok = False
        if not ok:
            raise TrajectoryError(f"{path} is not a valid .atraj file: step {i}'s tool call "
                                  "arguments are not a JSON object")


def _check_prefixes(path, traj: Trajectory) -> None:
    """Each ``prefix_len`` :meth:`Trajectory.replay` uses (a step's with ``input_ids``) must
    fall within the sequence replayed so far: a negative one or one past it replayed silently
    into ids that were never in the model's cache. The length arithmetic is replay's."""
    length = 0
    for i, step in enumerate(traj.steps):
        if step.input_ids is not None:
            if step.prefix_len is not None:
                if not 0 <= step.prefix_len <= length:
                    raise TrajectoryError(f"{path} is not a valid .atraj file: step {i}'s "
                                          f"prefix_len {step.prefix_len} is outside 0..{length}")
                length = step.prefix_len
            length += len(step.input_ids)
        length += len(step.output_ids or ())


def iter_dir(directory: str | os.PathLike) -> Iterator[tuple[Path, Trajectory]]:
    """Every readable ``.atraj`` in ``directory``, in name order."""
    for p in sorted(Path(directory).glob(f"*{SUFFIX}")):
        yield p, read(p)


def set_reward(path: str | os.PathLike, reward: float) -> Trajectory:
    """Set the rollout's reward (on its last step and in the summary), atomically."""
    traj = read(path)
    if traj.steps:
        traj.steps[-1].reward = reward
    traj.summary["reward"] = repr(float(reward))
    write(path, traj)
    return traj


class Recorder:
    """Builds one trajectory step by step and rewrites its file after every step."""

    def __init__(self, directory: str | os.PathLike | PinnedFolder, *, task: str | None = None,
                 model_fingerprint: str | None = None, sampling: dict | None = None,
                 checkpoint_path: str | None = None):
        # tools may reach it: pinned (by the caller, before any ran)
        self.folder = directory if isinstance(directory, PinnedFolder) else \
            PinnedFolder(directory, "the trajectory folder")
        self.dir = self.folder.path
        self.traj = Trajectory(id=str(uuid.uuid4()), task=task,
                               model_fingerprint=model_fingerprint, sampling=sampling,
                               checkpoint_path=checkpoint_path, turn_stats=[])
        self.path = self.dir / f"{self.traj.id}{SUFFIX}"

    def add(self, step: Step) -> None:
        step.timestamp = round(time.time(), 3)
        self.traj.steps.append(step)
        self.folder.check()
        write(self.path, self.traj, durable=False)  # atomic; synced at the end of the turn

    def finish_turn(self, stats: dict) -> None:
        self.traj.turn_stats.append(stats)
        self.traj.summary.update({"turns": str(len(self.traj.turn_stats)),
                                  "stop": str(stats.get("stop", ""))})
        self.folder.check()
        write(self.path, self.traj)
