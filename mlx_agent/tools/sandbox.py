"""Confine tool processes with the OS sandbox: bubblewrap on Linux, Seatbelt on macOS.

One frozen :class:`Policy` says what a tool process may do: read the whole filesystem, write
only its writable roots (the tool's working directory and ``--root``) and a private
temporary directory, use the network or not, and see only a reduced environment whose
``HOME`` is private and empty. :func:`bwrap_argv` and :func:`seatbelt_profile` render that
one object for each backend. Under bubblewrap the process also gets new PID, IPC, UTS and
(unless the network is allowed) network namespaces, no capabilities, no new privileges, a
new session, and dies with its parent, so nothing it starts outlives it; ``/run`` (where
daemons keep their sockets: Docker, D-Bus) is hidden; ``/proc/sys`` and
``/proc/sysrq-trigger`` are read-only (a runtime running as root is root inside too, and
root may write global sysctls without any capability); the git repositories in the
writable roots are read-only (git runs their config and hooks later, outside any sandbox;
:mod:`.leftovers` finds them, and undoes new ones after the call), and so is this runtime's
own code where it lies inside them (:func:`own_code`: a virtual environment in the project).
bwrap is started with the reduced environment, so its own init process shows nothing more in
``/proc/1/environ``.

:class:`Sandbox` is what callers hold (a backend and its options); :func:`resolve` turns
``--sandbox auto|bwrap|seatbelt|none`` into one, probing a backend once per process.

Not promised: reads are not confined (a tool can read your files and print them to the
model); Unix sockets outside ``/run`` and ``/tmp`` stay reachable; a hard link already in a
writable root writes through to its other names; Seatbelt has no PID namespace, so there
only the executor's process-group kill bounds a tool's children. Python ``_handler`` tools
run in-process and are never sandboxed.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

BACKENDS = ("auto", "bwrap", "seatbelt", "none")
SANDBOX_EXEC = "/usr/bin/sandbox-exec"
_BWRAP_HOME = "/tmp/home"  # inside bwrap's private /tmp
_PROBE_TIMEOUT = 10.0


class SandboxUnavailable(RuntimeError):
    """An explicitly requested sandbox cannot run here; the message says why and what to do."""


@dataclass(frozen=True)
class Policy:
    """What one tool process may do, whichever backend enforces it."""

    cwd: str
    writable: tuple[str, ...]  # absolute, symlinks resolved
    network: bool
    env: tuple[tuple[str, str], ...]  # the reduced environment, before HOME and TMPDIR
    home: str  # private and empty
    tmp: str  # private temporary directory
    # read-only again over the private /tmp and /run: where this Python lives, when it does
    # (a virtual environment in /tmp), so run_tests and the like can still start it
    runtime: tuple[str, ...] = ()
    # git repositories inside the writable roots (:mod:`.leftovers`): read-only for the call
    repositories: tuple[str, ...] = ()
    # the working directory when it is not writable: bound read-only, so a private /tmp
    # does not hide it
    visible: tuple[str, ...] = ()
    # this runtime's own code inside the writable roots (:func:`own_code`): read-only
    own_code: tuple[str, ...] = ()

    def environ(self) -> dict[str, str]:
        return {**dict(self.env), "HOME": self.home, "TMPDIR": self.tmp}


def bwrap_argv(policy: Policy, argv: Sequence[str]) -> list[str]:
    """``argv`` under bubblewrap with ``policy``; start it with ``policy.environ()``."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            # a runtime running as root is root inside too, and root writes global sysctls
            # without any capability: kernel.core_pattern runs a program on the host
            "--ro-bind", "/proc/sys", "/proc/sys",
            "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger",
            "--tmpfs", "/tmp", "--dir", policy.home, "--tmpfs", "/run"]
    if policy.network:
        # --share-net undoes --unshare-all's network namespace; DNS may live under /run
        args += ["--share-net", "--ro-bind-try", "/run/systemd/resolve", "/run/systemd/resolve"]
    for path in (*policy.runtime, *policy.visible):
        args += ["--ro-bind", path, path]
    for root in policy.writable:
        args += ["--bind", root, root]
    for path in policy.own_code:  # a .pth file planted there would run at the next start
        args += ["--ro-bind", path, path]
    for repo in policy.repositories:
        # read-only: its config and hooks run later, unconfined, when the user runs git
        # (core.fsmonitor, hooks/pre-commit); new ones are removed after the call
        args += ["--ro-bind-try", repo, repo]
    return [*args, "--chdir", policy.cwd, "--", *argv]


@functools.cache
def own_code() -> tuple[str, ...]:
    """Where this runtime's code lives: the interpreter's prefixes (a virtual environment)
    and this package's folders, symlinks resolved. A tool that could write there (a virtual
    environment inside ``--root``, as ``make`` makes one in a project) could plant a ``.pth``
    file or a module that runs, unconfined, the next time the runtime starts."""
    import importlib.util

    import mlx_agent

    paths = {sys.prefix, sys.base_prefix, os.path.dirname(mlx_agent.__file__)}
    for name in ("mlx_agent.cli", "mlx_agent.kernels"):  # their own folders when editable
        try:  # found, not imported: the answer must not depend on what was imported first
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            paths.update(spec.submodule_search_locations)
    return tuple(sorted({os.path.realpath(p) for p in paths}))


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _hidden_runtime() -> tuple[str, ...]:
    """This interpreter's directories that a private /tmp or /run would hide."""
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix,
                                           os.path.dirname(sys.executable))}
    hidden = sorted(p for p in paths if p.startswith(("/tmp/", "/run/")))
    return tuple(p for p in hidden if not any(p.startswith(q + "/") for q in hidden))


_SEATBELT_BASE = """\
(version 1)
(deny default)
(allow process-exec process-fork)
(allow signal process-info* (target same-sandbox))
(allow file-read*)
(allow sysctl-read)
(allow user-preference-read)
(allow ipc-posix-sem)
(allow pseudo-tty)
(allow file-read* file-write* file-ioctl
  (literal "/dev/null") (literal "/dev/zero") (literal "/dev/tty") (literal "/dev/ptmx")
  (regex #"^/dev/ttys[0-9]+$") (subpath "/dev/fd"))
(allow mach-lookup
  (global-name "com.apple.system.opendirectoryd.libinfo")
  (global-name "com.apple.system.logger")
  (global-name "com.apple.logd")
  (global-name "com.apple.diagnosticd")
  (global-name "com.apple.cfprefsd.daemon")
  (global-name "com.apple.cfprefsd.agent")
  (global-name "com.apple.system.notification_center")
  (global-name "com.apple.bsd.dirhelper")
  (global-name "com.apple.trustd.agent"))
"""

_SEATBELT_NETWORK = """\
(allow network-outbound network-inbound system-socket)
(allow mach-lookup
  (global-name "com.apple.SystemConfiguration.DNSConfiguration")
  (global-name "com.apple.SystemConfiguration.configd")
  (global-name "com.apple.networkd")
  (global-name "com.apple.SecurityServer")
  (global-name "com.apple.ocspd")
  (global-name "com.apple.system.opendirectoryd.membership"))
"""


def _seatbelt_paths(policy: Policy) -> dict[str, str]:
    """The -D parameters the profile refers to: paths never appear in its text."""
    paths = {f"WRITABLE_{i}": root for i, root in enumerate(policy.writable)}
    return {**paths, "SANDBOX_TMP": policy.tmp, "SANDBOX_HOME": policy.home,
            **{f"OWN_CODE_{i}": path for i, path in enumerate(policy.own_code)}}


def seatbelt_profile(policy: Policy) -> str:
    """The Seatbelt (SBPL) profile for ``policy``; paths come in as ``-D`` parameters. The
    runtime's own code is denied after the writable roots are allowed (the later rule wins)."""
    names = _seatbelt_paths(policy)
    writable = "".join(f'\n  (subpath (param "{name}"))' for name in names
                       if not name.startswith("OWN_CODE_"))
    text = _SEATBELT_BASE + f"(allow file-write*{writable})\n"
    own = "".join(f'\n  (subpath (param "{name}"))' for name in names
                  if name.startswith("OWN_CODE_"))
    if own:
        text += f"(deny file-write*{own})\n"
    return text + _SEATBELT_NETWORK if policy.network else text


def seatbelt_argv(policy: Policy, argv: Sequence[str]) -> list[str]:
    """``argv`` under ``sandbox-exec`` with ``policy``; start it with ``policy.environ()``."""
    params = [f"-D{name}={path}" for name, path in _seatbelt_paths(policy).items()]
    return [SANDBOX_EXEC, "-p", seatbelt_profile(policy), *params, "--", *argv]


@dataclass(frozen=True)
class Sandbox:
    """How tool processes are confined: a backend (bwrap, seatbelt or none) and its options.

    Each call is confined to its own working directory plus ``writable`` (such as --root);
    with ``write_cwd`` off, to ``writable`` alone (the agent without --root: the directory
    it was started in is read-only to tools).
    """

    backend: str = "none"
    network: bool = False
    writable: tuple[str, ...] = ()
    write_cwd: bool = True  # False: a call's working directory is writable only if listed

    def __post_init__(self):
        if self.backend not in BACKENDS[1:]:
            raise ValueError(f"unknown sandbox backend {self.backend!r}")

    def describe(self) -> str:
        if self.backend == "none":
            return "no sandbox"
        return f"{self.backend} sandbox" + (", network allowed" if self.network else "")

    def roots(self, cwd: str) -> tuple[str, ...]:
        """The directories a call in ``cwd`` may write: ``writable``, and ``cwd`` unless
        ``write_cwd`` is off."""
        dirs = (cwd, *self.writable) if self.write_cwd else self.writable
        return tuple(dict.fromkeys(os.path.realpath(p) for p in dirs))

    def policy(self, cwd: str, env: Mapping[str, str], home: str, tmp: str,
               repositories: Sequence[str] = ()) -> Policy:
        cwd, writable = os.path.realpath(cwd), self.roots(cwd)
        return Policy(cwd=cwd, writable=writable, network=self.network,
                      env=tuple(sorted(env.items())), home=home, tmp=tmp,
                      runtime=_hidden_runtime(), repositories=tuple(sorted(repositories)),
                      visible=() if cwd in writable else (cwd,),
                      own_code=tuple(p for p in own_code() if _inside(p, writable)))

    @contextmanager
    def command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str],
                repositories: Sequence[str] = ()) -> Iterator[tuple[list[str], dict[str, str]]]:
        """The argv and environment that run ``argv`` confined, valid inside the block;
        ``repositories`` (found by :func:`.leftovers.scan`) are bound read-only."""
        if self.backend == "none":
            yield list(argv), dict(env)
        elif self.backend == "bwrap":
            policy = self.policy(cwd, env, home=_BWRAP_HOME, tmp="/tmp",
                                 repositories=repositories)
            yield bwrap_argv(policy, argv), policy.environ()
        else:  # Seatbelt has no private mounts: a scratch directory per call instead
            with tempfile.TemporaryDirectory(prefix="mlx-agent-sandbox-") as scratch:
                scratch = os.path.realpath(scratch)
                home, tmp = os.path.join(scratch, "home"), os.path.join(scratch, "tmp")
                os.mkdir(home)
                os.mkdir(tmp)
                policy = self.policy(cwd, env, home=home, tmp=tmp)
                yield seatbelt_argv(policy, argv), policy.environ()


NO_SANDBOX = Sandbox()


@functools.cache
def unavailable(backend: str) -> str | None:
    """Why ``backend`` cannot confine a process here (probed once), or None when it can."""
    if backend == "bwrap":
        if not sys.platform.startswith("linux"):
            return "bubblewrap needs Linux"
        if shutil.which("bwrap") is None:
            return "bwrap is not installed (Debian/Ubuntu: apt install bubblewrap)"
    elif backend == "seatbelt":
        if sys.platform != "darwin":
            return "Seatbelt (sandbox-exec) needs macOS"
        if not os.path.exists(SANDBOX_EXEC):
            return f"{SANDBOX_EXEC} is missing"
    else:
        raise ValueError(f"cannot probe sandbox backend {backend!r}")
    from .executor import run_process  # it imports this module

    env, cwd = {"PATH": os.environ.get("PATH", os.defpath)}, tempfile.gettempdir()
    try:
        with Sandbox(backend).command(["/bin/sh", "-c", "exit 0"], cwd, env) as (argv, env):
            r = run_process(argv, tool="sandbox probe", timeout=_PROBE_TIMEOUT, cwd=cwd,
                            env=env)
    except OSError as e:
        return f"{backend} could not start a test process ({e})"
    why = r.stderr.strip().splitlines()
    if r.timed_out:
        return (f"{backend}'s test process did not end within {_PROBE_TIMEOUT:g} s"
                + (f" ({why[0]})" if why else ""))
    if r.stderr.startswith("error: could not start"):  # run_process's own words, which
        return r.stderr.removeprefix("error: ").strip()  # name the backend's program
    if r.exit_code != 0:
        return f"{backend} does not work here: {why[0] if why else f'exit {r.exit_code}'}"
    return None


def resolve(choice: str, *, network: bool = False, writable: Sequence[str] = (),
            write_cwd: bool = True, warn=None) -> Sandbox:
    """The sandbox for ``--sandbox CHOICE``.

    ``auto`` is bwrap on Linux and Seatbelt on macOS when they work, else none, with one
    line to ``warn``. An explicit backend that cannot run raises :class:`SandboxUnavailable`.
    """
    if choice not in BACKENDS:
        raise ValueError(f"--sandbox must be one of {', '.join(BACKENDS)}, not {choice!r}")
    options = dict(network=network, writable=tuple(os.fspath(p) for p in writable),
                   write_cwd=write_cwd)
    if choice == "none":  # asked for: the agent's start-up line says "no sandbox"
        return Sandbox("none", **options)
    if choice == "auto":
        backend = "seatbelt" if sys.platform == "darwin" else "bwrap"
        why = unavailable(backend)
        if why is None:
            return Sandbox(backend, **options)
        if warn:
            warn(f"tools run without a sandbox: {why}")
        return Sandbox("none", **options)
    why = unavailable(choice)
    if why is not None:
        raise SandboxUnavailable(f"--sandbox {choice}: {why}; or use --sandbox none "
                                 "to run tools unconfined")
    return Sandbox(choice, **options)
