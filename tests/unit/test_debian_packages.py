"""tools/debian_packages.sh is the one place that runs apt-get: recipes that `make -j` runs side by side must not
run two apt-gets at once (the second fails at once on dpkg's lock). The script runs here against stand-ins for
apt-get, dpkg-query and sudo, first on PATH, which record every call and fail when two calls are inside at once."""
from __future__ import annotations

import ast
import fcntl
import io
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "debian_packages.sh"

# Shell words that change the system's packages, or read apt's lists (which apt-get locks too).
SHELL_PACKAGE_COMMAND = re.compile(
    r"(?<![\w./-])(?:apt-get|aptitude)(?![\w.-])"
    r"|(?<![\w./-])apt\s+(?:-\S+\s+)*(?:install|reinstall|remove|purge|autoremove|update|upgrade|full-upgrade"
    r"|dist-upgrade|download|source|build-dep|satisfy)\b"
    r"|(?<![\w./-])dpkg\s+(?:-\S+\s+)*?(?:-i|--install|-r|--remove|-P|--purge|--unpack|--configure|-a"
    r"|--set-selections)(?![\w-])")
# A Python string that is such a command, or its first word in an argument list.
PYTHON_PACKAGE_COMMAND = re.compile(r"^\s*(?:sudo\s+)?(?:apt-get|aptitude|apt|dpkg)(?:\s|$)")

# Run inside an image build, on the image's own dpkg, never beside the host's recipes.
IN_IMAGE_BUILD = re.compile(r"(^|/)Dockerfile[^/]*$")


def _without_shell_comments(text: str) -> str:
    return "\n".join(re.sub(r"(^|\s)#.*", r"\1", line) for line in text.splitlines())


def _is_shell(path: Path, text: str) -> bool:
    name = path.name
    return (name == "Makefile" or name.endswith((".mk", ".sh", ".bash"))
            or bool(re.match(r"#!\s*\S*(?:/|env\s+)(?:ba|da|z)?sh\b", text)))


def package_commands(path: Path, text: str) -> list[str]:
    """`path:line: text` for each line of a shell script, Makefile or Python file that runs apt, apt-get or dpkg
    to install or remove packages; comments do not count."""
    found = []
    if path.suffix == ".py":
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        except (tokenize.TokenError, SyntaxError):
            return []
        for token in tokens:
            if token.type != tokenize.STRING:
                continue
            try:
                value = ast.literal_eval(token.string)
            except (ValueError, SyntaxError):  # an f-string: its text up to the first field is what is run
                value = token.string.lstrip("rbufRBUF").strip("'\"")
            if isinstance(value, str) and PYTHON_PACKAGE_COMMAND.match(value):
                found.append(f"{path}:{token.start[0]}: {token.line.strip()}")
    elif _is_shell(path, text):
        for number, line in enumerate(_without_shell_comments(text).splitlines(), 1):
            if SHELL_PACKAGE_COMMAND.search(line):
                found.append(f"{path}:{number}: {line.strip()}")
    return found


def _repository_files() -> list[Path]:
    """Tracked files and new ones git does not ignore: a script not yet committed is scanned too."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode()
    return sorted({Path(name) for name in listed.split("\0") if name})


def test_no_script_makefile_or_python_module_runs_apt_outside_tools_debian_packages_sh():
    own = {SCRIPT.relative_to(ROOT), Path(__file__).resolve().relative_to(ROOT)}
    scanned, offenders = 0, []
    for path in _repository_files():
        full = ROOT / path
        if path in own or IN_IMAGE_BUILD.search(str(path)) or not full.is_file():
            continue
        try:
            text = full.read_text()
        except UnicodeDecodeError:
            continue
        scanned += 1
        offenders += package_commands(path, text)
    assert scanned > 50
    assert not offenders, ("apt-get, apt or dpkg run outside tools/debian_packages.sh, where `make -j` could run "
                           "two at once: call `tools/debian_packages.sh install PACKAGE...` instead\n"
                           + "\n".join(offenders))


@pytest.mark.parametrize("path, text", [
    ("Makefile", "system:\n\t$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y curl\n"),
    ("native/build.sh", "#!/usr/bin/env bash\nsudo apt install -y g++\n"),
    ("tools/setup", "#!/bin/sh\n[ -x /usr/bin/wrk ] || dpkg --force-depends -i wrk.deb\n"),
    ("s2t/x.py", "import subprocess\nsubprocess.run(['apt-get', 'install', '-y', 'wrk'])\n"),
    ("s2t/x.py", "import os\nos.system('sudo apt-get install -y wrk')\n"),
])
def test_the_scan_finds_apt_runs(path, text):
    assert package_commands(Path(path), text)


@pytest.mark.parametrize("path, text", [
    ("Makefile", "# installed with apt-get where missing\nsystem:\n\t@tools/debian_packages.sh install curl\n"),
    ("native/build.sh", "#!/usr/bin/env bash\ndpkg -s libgrpc++-dev >/dev/null || missing+=(libgrpc++-dev)\n"
                        "dpkg-deb -x prometheus_1.deb x\nrm -rf /var/lib/apt/lists/*\n"),
    ("s2t/x.py", '"""Needs wrk (Debian: apt-get install wrk)."""\n'),
    ("docs/setup.md", "sudo apt-get install wrk\n"),
])
def test_the_scan_passes_over_comments_queries_and_prose(path, text):
    assert not package_commands(Path(path), text)


FAKE_APT_GET = r"""#!/bin/sh
# apt-get's stand-in: each call's start and end, and "overlap" when another call is inside.
state=$FAKE_APT_STATE
run=${FAKE_APT_RUN:-?}
echo "start $run $(date +%s.%N) frontend=${DEBIAN_FRONTEND:-} $*" >>"$state/calls"
mkdir "$state/inside" 2>/dev/null || { echo "overlap $run $*" >>"$state/calls"; exit 100; }
sleep "${FAKE_APT_SECONDS:-0.3}"
verb=
for arg; do
  case $arg in
    -*|*=*) ;;
    *) if [ -z "$verb" ]; then verb=$arg; elif [ "$verb" = install ]; then touch "$state/installed/$arg"; fi ;;
  esac
done
if [ "$verb" = install ] && [ -n "${FAKE_APT_DAEMON:-}" ]; then
  # As a maintainer script starting a service without an init system: a child that outlives apt-get.
  sleep 60 >/dev/null 2>&1 </dev/null &
  echo $! >"$state/daemon.pid"
fi
rmdir "$state/inside"
echo "end $run $(date +%s.%N)" >>"$state/calls"
"""

FAKE_DPKG_QUERY = r"""#!/bin/sh
# dpkg-query's stand-in: what the fake apt-get installed is installed.
for package; do :; done
if [ -e "$FAKE_APT_STATE/installed/$package" ]; then printf installed; else exit 1; fi
"""

# sudo's stand-in keeps, as sudo's env_reset does, little of the caller's environment (here: what the stand-ins
# read).
FAKE_SUDO = r"""#!/bin/sh
echo "sudo $*" >>"$FAKE_APT_STATE/calls"
exec env -i PATH="$PATH" FAKE_APT_STATE="$FAKE_APT_STATE" FAKE_APT_RUN="${FAKE_APT_RUN:-}" "$@"
"""


class FakeApt:
    def __init__(self, folder: Path):
        self.folder = folder
        self.bin = folder / "bin"
        self.state = folder / "state"
        self.lock = folder / "apt.lock"
        (self.state / "installed").mkdir(parents=True)
        self.bin.mkdir()
        for name, text in (("apt-get", FAKE_APT_GET), ("dpkg-query", FAKE_DPKG_QUERY), ("sudo", FAKE_SUDO)):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        (self.state / "calls").touch()

    def env(self, run: str, **extra: str) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", "FAKE_APT_STATE": str(self.state),
                "FAKE_APT_RUN": run, "S2T_APT_LOCK": str(self.lock), **extra}

    def start(self, run: str, *packages: str, user: list[str] | None = None, **extra: str) -> subprocess.Popen:
        return subprocess.Popen([*(user or []), str(SCRIPT), "install", *packages], env=self.env(run, **extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def calls(self) -> list[list[str]]:
        return [line.split() for line in (self.state / "calls").read_text().splitlines()]

    def spans(self) -> dict[str, tuple[float, float]]:
        """Each run's first apt-get start and last apt-get end."""
        spans: dict[str, tuple[float, float]] = {}
        for call in self.calls():
            if call[0] in ("start", "end"):
                first, last = spans.get(call[1], (float(call[2]), float(call[2])))
                spans[call[1]] = (min(first, float(call[2])), max(last, float(call[2])))
        return spans


def _finish(process: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


@pytest.fixture
def fake_apt(tmp_path):
    return FakeApt(tmp_path)


def test_two_installs_at_once_run_apt_get_one_after_the_other(fake_apt):
    # Long enough that both have started while the first holds the lock, even on a busy machine.
    runs = {run: fake_apt.start(run, f"pkg-{run}", FAKE_APT_SECONDS="1") for run in ("a", "b")}
    results = {run: _finish(process) for run, process in runs.items()}
    calls = fake_apt.calls()
    assert all(code == 0 for code, _, _ in results.values()), (results, calls)
    assert not [call for call in calls if call[0] == "overlap"], calls
    # Each run read the lists and installed its own package (the other's package did not satisfy it).
    assert sorted(p.name for p in (fake_apt.state / "installed").iterdir()) == ["pkg-a", "pkg-b"]
    assert sorted((call[1], call[-1]) for call in calls if call[0] == "start") == [
        ("a", "pkg-a"), ("a", "update"), ("b", "pkg-b"), ("b", "update")]
    (first, first_span), (_, second_span) = sorted(fake_apt.spans().items(), key=lambda item: item[1])
    assert first_span[1] <= second_span[0], f"{first}'s apt-get calls overlap the other run's: {calls}"
    # They did contend: one of them found the lock held and said what it waits for.
    waited = [run for run, (_, _, err) in results.items() if "waiting for" in err]
    assert len(waited) == 1 and str(fake_apt.lock) in results[waited[0]][2], results


def test_the_stand_ins_see_two_installs_overlap_when_they_do_not_share_a_lock(fake_apt):
    """The check above can fail: with a lock each, the same two runs are caught inside apt-get together."""
    runs = [fake_apt.start(run, f"pkg-{run}", FAKE_APT_SECONDS="1", S2T_APT_LOCK=str(fake_apt.folder / run))
            for run in ("a", "b")]
    for process in runs:
        _finish(process)
    assert [call for call in fake_apt.calls() if call[0] == "overlap"], fake_apt.calls()


def test_an_install_finds_what_another_installed_while_it_waited(fake_apt):
    runs = [fake_apt.start(run, "wrk", FAKE_APT_SECONDS="1") for run in ("a", "b")]
    assert [_finish(process)[0] for process in runs] == [0, 0]
    # One apt-get update and one install: the second run checked after the first had finished.
    assert [call[-1] for call in fake_apt.calls() if call[0] == "start"] == ["update", "wrk"]


def test_a_lock_held_past_the_wait_fails_with_the_lock_and_its_holder_named(fake_apt):
    with open(fake_apt.lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        code, out, err = _finish(fake_apt.start("a", "wrk", S2T_APT_LOCK_SECONDS="1"), timeout=30)
        waited = time.monotonic() - started
    assert code == 1, (out, err)
    assert f"gave up after waiting 1 s for {fake_apt.lock}, still held by process {os.getpid()}" in err, err
    assert "S2T_APT_LOCK_SECONDS" in err
    assert 1 <= waited < 10
    assert fake_apt.calls() == []


@pytest.mark.parametrize("seconds", ["ten", "1.5", "-1"])
def test_a_wait_that_is_not_whole_seconds_is_refused_naming_the_variable(fake_apt, seconds):
    code, _, err = _finish(fake_apt.start("a", "wrk", S2T_APT_LOCK_SECONDS=seconds))
    assert code == 2 and f"S2T_APT_LOCK_SECONDS must be a whole number of seconds, got '{seconds}'" in err
    assert fake_apt.calls() == []


def test_a_service_that_apt_get_leaves_running_does_not_keep_the_lock(fake_apt):
    code, _, err = _finish(fake_apt.start("a", "docker.io", FAKE_APT_DAEMON="1"))
    daemon = int((fake_apt.state / "daemon.pid").read_text())
    try:
        assert code == 0, err
        code, _, err = _finish(fake_apt.start("b", "wrk", S2T_APT_LOCK_SECONDS="2"))
        assert code == 0 and "waiting for" not in err, err
    finally:
        os.kill(daemon, 9)


@pytest.fixture
def other_user_fake_apt():
    """The stand-ins where a user other than root can run them (pytest's own temporary folders are root's alone)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("runs the script as another user: needs root and setpriv")
    folder = Path(tempfile.mkdtemp(prefix="s2t-apt-"))
    try:
        fake = FakeApt(folder)
        for path in (folder, *folder.rglob("*")):
            path.chmod(path.stat().st_mode | stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO)
        yield fake
    finally:
        shutil.rmtree(folder)


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_a_user_installs_through_sudo_with_the_frontend_kept_noninteractive(other_user_fake_apt):
    code, _, err = _finish(other_user_fake_apt.start("a", "wrk", user=NOBODY))
    assert code == 0, err
    calls = other_user_fake_apt.calls()
    assert [call[:3] for call in calls if call[0] == "sudo"] == [["sudo", "env", "DEBIAN_FRONTEND=noninteractive"]] * 2
    assert {call[3] for call in calls if call[0] == "start"} == {"frontend=noninteractive"}, calls


def test_a_lock_file_root_created_serves_other_users_too(other_user_fake_apt):
    fake = other_user_fake_apt
    code, _, err = _finish(fake.start("root", "curl"))
    assert code == 0, err
    os.chmod(fake.lock, 0o644)  # as root's usual umask leaves a file it creates
    code, _, err = _finish(fake.start("user", "wrk", user=NOBODY))
    assert code == 0, err
    assert (fake.state / "installed" / "wrk").exists()
