"""A local Label Studio server for verification rounds (``prb annotate serve``).

Label Studio pins old versions of libraries this project uses, so the server runs from its
own virtualenv (``annotation.server_venv``, created with ``label-studio==1.23.2`` when
missing); the project itself only talks to it over HTTP with ``label-studio-sdk``.

The server listens on 127.0.0.1 only, keeps its SQLite database and media in
``annotation.data_dir`` (``LABEL_STUDIO_BASE_DATA_DIR``; nothing goes to the home folder),
and gets a preset admin user and legacy API token on its first start. Traps this module
works around, found in label-studio 1.23.2's ``server.py`` and settings:

- ``label-studio --version`` starts a server: the installed version is read from package
  metadata instead.
- A busy port silently moves to the next free one: the port is checked first, and
  ``--debug`` (which in 1.23 only switches that search off) makes a busy port fail.
  Once up, the server must accept our token as our user, so a stranger is never mistaken
  for ours.
- The preset token (``LABEL_STUDIO_USER_TOKEN``) is applied only when the user is first
  created, and only works as an API token when legacy tokens are enabled
  (``LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN``) when the organisation is created.
- Settings are read from ``LABEL_STUDIO_X``, ``HEARTEX_X`` *and plain* ``X`` (``HOST``,
  ``PORT``, ``USERNAME``...), so the child gets a small clean environment, not ours.
- The open-source build reports errors to Sentry and checks PyPI for updates by default:
  both are switched off.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.annotate.errors import LabelStudioError
from pipeline.core.io import read_json, write_json_atomic

LABEL_STUDIO_VERSION = "1.23.2"
DEFAULT_USERNAME = "admin@prb.local"
CREDENTIALS_FILE = "prb-credentials.json"
LOG_FILE = "prb-server.log"
# Environment passed through to the server; everything else is left out on purpose.
_PASS_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SSL_CERT_FILE")


def venv_python(venv: Path) -> Path:
    return Path(venv) / "bin" / "python"


def installed_version(venv: str | Path) -> str | None:
    """label-studio's version in ``venv`` from package metadata (never runs the CLI)."""
    py = venv_python(Path(venv))
    if not py.exists():
        return None
    code = "import importlib.metadata as m; print(m.version('label-studio'))"
    try:
        res = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return res.stdout.strip() or None


# How often a first install says how far it got (at most 30 s between two lines).
PROGRESS_EVERY_S = 20.0
# Where a named Label Studio venv can come from besides annotation.server_venv: the tests'
# and CI's variable, so one install serves the suite, the benchmarks and `prb annotate serve`
VENV_ENV = "PRB_LABEL_STUDIO_VENV"
# What the first install took, measured (README.md, annotation/README.md): shown up front
MEASURED_INSTALL = (
    "measured at 1 min 21 s on 2 cores at load 3-4 with a fast link to PyPI; a busy machine "
    "or a slow link takes far longer: 24 min was seen at load 10-20"
)


def server_venv(annotation: Any) -> Path:
    """The Label Studio venv ``prb annotate serve`` uses: ``annotation.server_venv`` when the
    config sets it, else ``$PRB_LABEL_STUDIO_VENV`` when set, else the default."""
    env = os.environ.get(VENV_ENV)
    if env and "server_venv" not in annotation.model_fields_set:
        return Path(env).expanduser()
    return Path(annotation.server_venv)


def install_log(venv: Path) -> Path:
    """The first install's full pip output, beside the venv (kept after a failure)."""
    return venv.with_name(venv.name + "-install.log")


def _install_commands(venv: Path) -> list[list[str]]:
    return [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(venv_python(venv)),
            "-m",
            "pip",
            "install",
            "--progress-bar",
            "off",
            f"label-studio=={LABEL_STUDIO_VERSION}",
        ],
    ]


def _minutes(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def install_progress(log_text: str) -> str:
    """How far a pip install got, from its output: packages collected (the latest named),
    then the install of them all, then done."""
    collected = [ln.split()[1] for ln in log_text.splitlines() if ln.startswith("Collecting ")]
    for line in reversed(log_text.splitlines()):
        if line.startswith("Successfully installed"):
            return f"installed {len(line.split()) - 2} packages"
        if line.startswith("Installing collected packages:"):
            n = len(line.split(":", 1)[1].split(","))
            return f"installing the {n} packages collected (pip says nothing until all are in)"
    if not collected:
        return "creating the venv and starting pip"
    return f"collected {len(collected)} packages so far (the latest: {collected[-1]})"


def ensure_server_venv(
    venv: str | Path,
    *,
    create: bool = True,
    echo: Callable[[str], None] = print,
    every_s: float = PROGRESS_EVERY_S,
) -> Path:
    """The server's virtualenv, created with label-studio when missing. A first install
    takes minutes: it says so up front, with where its full log goes, and then how far it
    got every ``every_s`` seconds."""
    venv = Path(venv).expanduser().absolute()
    version = installed_version(venv)
    if version and (venv / "bin" / "label-studio").exists():
        if version != LABEL_STUDIO_VERSION:
            echo(f"note: {venv} has label-studio {version}; tested with {LABEL_STUDIO_VERSION}")
        return venv
    if not create:
        raise LabelStudioError(
            f"no label-studio in {venv}; create it with: python3 -m venv {venv} && "
            f"{venv}/bin/pip install label-studio=={LABEL_STUDIO_VERSION}"
        )
    log = install_log(venv)
    echo(
        f"installing label-studio=={LABEL_STUDIO_VERSION} into {venv}, once ({MEASURED_INSTALL}"
        f"); progress below, the full log: tail -f {log}. To use a Label Studio venv you "
        f"already have instead: --set annotation.server_venv=PATH (or {VENV_ENV}=PATH)"
    )
    start = time.monotonic()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as fh:
        for cmd in _install_commands(venv):
            fh.write(f"$ {' '.join(cmd)}\n")
            fh.flush()
            proc = subprocess.Popen(
                cmd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PIP_NO_INPUT": "1"},
            )
            try:
                while True:
                    try:
                        proc.wait(timeout=every_s)
                        break
                    except subprocess.TimeoutExpired:
                        done = install_progress(log.read_text(encoding="utf-8", errors="replace"))
                        echo(f"  {_minutes(time.monotonic() - start)}: {done}")
            except BaseException:
                proc.terminate()
                proc.wait()
                raise
            if proc.returncode != 0:
                text = log.read_text(encoding="utf-8", errors="replace")
                tail = "\n".join(text.strip().splitlines()[-15:])
                raise LabelStudioError(
                    f"`{' '.join(cmd)}` failed ({proc.returncode}); the full log is {log}:\n{tail}"
                )
    done = install_progress(log.read_text(encoding="utf-8", errors="replace"))
    echo(f"  {_minutes(time.monotonic() - start)}: {done}; Label Studio is installed")
    return venv


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on host:port (bound the way the server will bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Django's server sets SO_REUSEADDR too, so a socket in TIME_WAIT is not "busy"
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Linux: the server gets SIGTERM if the process that started it dies without stopping
    # it (a killed test run, a crashed CLI), so no stray server is left behind.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _http(url: str, token: str | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Token {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class LabelStudioServer:
    """A Label Studio server on 127.0.0.1, started from its own virtualenv.

    ``with LabelStudioServer(venv, data_dir, port=..., token=..., password=...) as s:``
    starts it, waits until it answers and accepts ``token`` as ``username``, and stops it
    on exit. ``url`` and ``token`` are what an SDK client needs.
    """

    def __init__(
        self,
        venv: str | Path,
        data_dir: str | Path,
        *,
        port: int,
        token: str,
        password: str,
        username: str = DEFAULT_USERNAME,
        host: str = "127.0.0.1",
        startup_timeout: float = 300.0,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        if len(token) <= 5:  # label-studio ignores shorter preset tokens without an error
            raise LabelStudioError("the preset API token must be longer than 5 characters")
        self.venv = Path(venv).expanduser().absolute()
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.port = int(port)
        self.host = host
        self.token = token
        self.username = username
        self._password = password
        self.startup_timeout = startup_timeout
        self._echo = echo  # says how long a (first) start has taken, every PROGRESS_EVERY_S
        self.log_path = self.data_dir / LOG_FILE
        self._proc: subprocess.Popen | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:  # never shows the token or password
        return f"LabelStudioServer(url={self.url!r}, data_dir={str(self.data_dir)!r})"

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        home = self.data_dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        env.update(
            HOME=str(home),  # anything a library caches "in ~" stays in the data dir
            LABEL_STUDIO_BASE_DATA_DIR=str(self.data_dir),
            LABEL_STUDIO_USERNAME=self.username,
            LABEL_STUDIO_PASSWORD=self._password,
            LABEL_STUDIO_USER_TOKEN=self.token,
            LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN="true",
            LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK="true",
            LABEL_STUDIO_LATEST_VERSION_CHECK="false",
            LABEL_STUDIO_COLLECT_ANALYTICS="false",
            LABEL_STUDIO_SENTRY_DSN="",
            LABEL_STUDIO_FRONTEND_SENTRY_DSN="",
            PYTHONUNBUFFERED="1",
        )
        return env

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])

    def _fail(self, message: str) -> LabelStudioError:
        tail = self.log_tail()
        self.stop()
        return LabelStudioError(f"{message}\n--- last lines of {self.log_path} ---\n{tail}")

    def start(self) -> LabelStudioServer:
        if self.running:
            return self
        exe = self.venv / "bin" / "label-studio"
        if not exe.exists():
            raise LabelStudioError(
                f"{exe} not found; see `prb annotate serve` or ensure_server_venv"
            )
        if not port_is_free(self.port, self.host):
            raise LabelStudioError(
                f"port {self.port} on {self.host} is already in use; stop what listens there "
                "or choose another port (annotation.port)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        cmd = [
            str(exe),
            "start",
            "--no-browser",
            "--internal-host",
            self.host,
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--log-level",
            "WARNING",
            "--debug",  # in 1.23 this only disables the silent move to the next free port
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            cmd,
            env=self._env(),
            cwd=self.data_dir,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so stop() ends all of it
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        started = time.monotonic()
        deadline = started + self.startup_timeout
        said = started
        while True:
            if self._echo is not None and time.monotonic() - said >= PROGRESS_EVERY_S:
                said = time.monotonic()
                self._echo(
                    f"  still starting ({_minutes(said - started)}; a first start sets up its "
                    f"database, about 3 min): tail -f {self.log_path}"
                )
            if self._proc is not None and self._proc.poll() is not None:
                raise self._fail(
                    f"Label Studio exited with code {self._proc.returncode} while starting "
                    f"on {self.url}"
                )
            try:
                status, _ = _http(self.url + "/health", timeout=2.0)
                if status == 200:
                    break
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise self._fail(
                    f"Label Studio did not answer {self.url}/health within "
                    f"{self.startup_timeout:.0f} s"
                )
            time.sleep(0.5)
        # The port answers; make sure it is our server: our user, with our token.
        status, body = _http(self.url + "/api/current-user/whoami", token=self.token)
        email = None
        with contextlib.suppress(ValueError, AttributeError):
            email = json.loads(body).get("email")
        if status != 200 or email != self.username or not self.running:
            raise self._fail(
                f"the server on {self.url} did not accept the preset token as {self.username} "
                f"(HTTP {status}); if {self.data_dir} was created with another token, use that "
                "one or a fresh data dir (preset tokens apply only on the first start)"
            )

    def stop(self, timeout: float = 20.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            # signal only the process group we created, never anything by name
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LabelStudioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- prb annotate serve --------------------------------------------------------------------


def local_credentials(data_dir: str | Path, token_env: str) -> dict[str, str]:
    """The local server's admin login and token, made once and kept beside its database.

    The first start takes the token from ``$token_env`` and the password from
    ``$LABEL_STUDIO_PASSWORD`` when set, else random ones. They are stored in the server's
    own data dir (mode 600, next to the SQLite file that holds the same token), never in a
    run directory, and never printed.
    """
    path = Path(data_dir) / CREDENTIALS_FILE
    if path.exists():
        return read_json(path)
    creds = {
        "username": os.environ.get("LABEL_STUDIO_USERNAME") or DEFAULT_USERNAME,
        "password": os.environ.get("LABEL_STUDIO_PASSWORD") or secrets.token_urlsafe(16),
        "token": os.environ.get(token_env) or secrets.token_hex(20),
    }
    Path(data_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    write_json_atomic(path, creds)  # a mkstemp file: created with mode 600
    os.chmod(path, 0o600)
    return creds


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve(config: Any, *, port: int | None = None, echo: Callable[[str], None] = print) -> int:
    """Run the local server in the foreground until Ctrl-C (``prb annotate serve``)."""
    a = config.annotation
    venv = ensure_server_venv(server_venv(a), echo=echo)
    data_dir = Path(a.data_dir).expanduser().absolute()
    creds = local_credentials(data_dir, a.token_env)
    env_token = os.environ.get(a.token_env)
    server = LabelStudioServer(
        venv,
        data_dir,
        port=port or a.port,
        token=creds["token"],
        password=creds["password"],
        username=creds["username"],
        echo=echo,
    )
    echo(f"starting Label Studio {installed_version(venv)} on {server.url} (data: {data_dir})")
    with server:
        cred_file = data_dir / CREDENTIALS_FILE
        echo(f"Label Studio is running at {server.url}")
        echo(f"  log in as {creds['username']}; password and API token: {cred_file} (mode 600)")
        echo("  for `prb annotate export/import` in another shell:")
        read_token = 'import json,sys; print(json.load(open(sys.argv[1]))["token"])'
        echo(f"    export {a.token_env}=\"$(python3 -c '{read_token}' {cred_file})\"")
        if env_token and env_token != creds["token"]:
            echo(f"  note: ${a.token_env} is set but is not this server's token")
        echo("press Ctrl-C to stop")
        # `kill <pid>` stops it as cleanly as Ctrl-C does (default SIGTERM skips cleanup)
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            while server.running:
                time.sleep(1.0)
        except KeyboardInterrupt:
            echo("stopping Label Studio")
            return 0
        finally:
            signal.signal(signal.SIGTERM, previous)
        echo("Label Studio stopped by itself; last log lines:\n" + server.log_tail())
        return 1
