"""No secret value reaches a file under the run directory, stdout or stderr.

Fake secret values are set in the environment, each leak path of issue 10 is provoked
for real (a server echoing the key in a 401 body, a password in backend.base_url, a YAML
syntax error on the line that holds a key, an unreachable server), and then every byte
under the run directory (cache.sqlite and its WAL included) and everything printed is
scanned for the values.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import yaml
from conftest import write_config
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.core.redact import redact, secret_values, strip_userinfo

KEY = "sk-fake-llm-key-0123456789abcdef"
URL_PASSWORD = "hunter2-url-password"


def leaks(values: list[str], *, run_dir: Path | None = None, texts: dict[str, str]) -> list:
    """(where, value) for every secret value found in a file or a captured text."""
    found = []
    if run_dir is not None:
        files = [f for f in run_dir.rglob("*") if f.is_file()]
        assert files, f"nothing under {run_dir}"
        for f in files:
            data = f.read_bytes()
            found += [(str(f), v) for v in values if v.encode() in data]
    for name, text in texts.items():
        found += [(name, v) for v in values if v in text]
    return found


def _errors_table(run_dir: Path) -> list[str]:
    con = sqlite3.connect(run_dir / "cache.sqlite")
    try:
        return [r[0] for r in con.execute("SELECT reason FROM errors")]
    finally:
        con.close()


@pytest.mark.parametrize("env_name", ["OPENAI_API_KEY", "PRB_LLM_CREDENTIAL"])
def test_key_echoed_in_a_401_body(tmp_path, capsys, monkeypatch, env_name):
    """A server that refuses the key and echoes it: the run stops at the first refusal
    with one line naming the variable, and neither it nor any file shows the key.

    PRB_LLM_CREDENTIAL does not look like a secret by its name: it is masked because the
    config names it in backend.api_key_env."""
    monkeypatch.setenv(env_name, KEY)
    with StandinServer() as server:
        body = f"Incorrect API key provided: {KEY}. You can find your API key at example.org."
        server.inject("401", 10_000, message=body)
        cfg = write_config(
            tmp_path, server, backend={"api_key_env": env_name, "abort_after_failures": 3}
        )
        rc = main(["run", str(cfg), "--no-progress"])
        refused = sum(r["status"] == 401 for r in server.requests)
    out = capsys.readouterr()
    assert rc == 1
    # stopped at once, not after abort_after_failures requests (max_concurrency are in flight)
    assert 1 <= refused <= 8
    (line,) = [ln for ln in out.err.splitlines() if ln.startswith("error:")]
    assert f"refused the API key in ${env_name} (HTTP 401" in line
    assert f"Incorrect API key provided: <${env_name}>" in line  # the echo path was taken
    assert f"set {env_name} to a key this server accepts" in line
    run_dir = tmp_path / "outputs" / "t"
    found = leaks([KEY], run_dir=run_dir, texts={"stdout": out.out, "stderr": out.err})
    assert found == []
    # and `prb status` on that run shows none either
    assert main(["status", str(run_dir)]) == 0
    assert leaks([KEY], texts={"status": capsys.readouterr().out}) == []


def test_key_echoed_in_a_400_body(tmp_path, capsys, monkeypatch):
    """A per-request failure whose body echoes the key: recorded in the errors table with
    the key masked."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with StandinServer() as server:
        body = f"Bad request for key {KEY}."
        server.inject("400", 10_000, message=body)
        cfg = write_config(tmp_path, server, backend={"abort_after_failures": 3})
        rc = main(["run", str(cfg), "--no-progress"])
        assert any(r["status"] == 400 for r in server.requests)
    out = capsys.readouterr()
    assert rc != 0
    run_dir = tmp_path / "outputs" / "t"
    reasons = _errors_table(run_dir)
    assert reasons and all("Bad request for key <$OPENAI_API_KEY>" in r for r in reasons)
    found = leaks([KEY], run_dir=run_dir, texts={"stdout": out.out, "stderr": out.err})
    assert found == []


def test_password_in_base_url(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with StandinServer() as server:
        url = server.base_url.replace("http://", f"http://alice:{URL_PASSWORD}@")
        cfg = write_config(tmp_path, server, backend={"base_url": url, "abort_after_failures": 3})
        assert main(["config", "show", str(cfg)]) == 0
        shown = capsys.readouterr()
        assert yaml.safe_load(shown.out)["backend"]["openai"]["base_url"] == server.base_url
        rc = main(["run", str(cfg), "--no-progress"])
    out = capsys.readouterr()
    run_dir = tmp_path / "outputs" / "t"
    assert (run_dir / "run.yaml").exists()
    texts = {"show": shown.out + shown.err, "stdout": out.out, "stderr": out.err}
    assert leaks([URL_PASSWORD, KEY], run_dir=run_dir, texts=texts) == []
    assert rc != 0 or "run directory" in out.out  # whichever way the requests went


def test_password_in_url_of_an_unreachable_server(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cfg = write_config(tmp_path, backend={"base_url": f"http://bob:{URL_PASSWORD}@127.0.0.1:9/v1"})
    assert main(["run", str(cfg), "--no-progress"]) == 1
    out = capsys.readouterr()
    assert "cannot reach" in out.err and "http://127.0.0.1:9/v1" in out.err
    run_dir = tmp_path / "outputs" / "t"
    files = {str(f): f.read_text(errors="replace") for f in run_dir.rglob("*") if f.is_file()}
    texts = {"stdout": out.out, "stderr": out.err, **files}
    assert leaks([URL_PASSWORD, KEY], texts=texts) == []


@pytest.mark.parametrize(
    "text",
    [
        f"backend:\n  api_key: {KEY}\n  model: [\n",  # unclosed bracket after the key
        f"backend: {{api_key: {KEY}, model: [}}\n",  # the error column sits on the key's line
        f"backend:\n  api_key: {KEY}: more\n",  # the error is on the key's own line
        f'backend:\n  api_key: "{KEY}\n',  # an unclosed quote around the key
    ],
)
def test_yaml_error_does_not_quote_the_key(tmp_path, capsys, monkeypatch, text):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    p = tmp_path / "c.yaml"
    p.write_text(text)
    assert main(["config", "show", str(p)]) == 1
    err = capsys.readouterr().err
    assert "not valid YAML" in err and str(p) in err
    assert leaks([KEY], texts={"stderr": err}) == []


def test_yaml_error_masks_a_key_no_variable_holds(tmp_path, capsys, monkeypatch):
    # the key is only in the file (which the rules forbid): its shape is still masked
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    p = tmp_path / "c.yaml"
    p.write_text(f"backend: {{base_url: http://x, api_key: {KEY}, model: [}}\n")
    assert main(["config", "show", str(p)]) == 1
    assert KEY not in capsys.readouterr().err


def test_config_named_variable_masked_in_a_yaml_error(tmp_path, capsys, monkeypatch):
    # MY_LLM_CRED does not look like a secret; the config names it, and even a file that
    # fails to parse has it registered before the error is written
    value = "opaque-credential-9f8e7d6c"
    monkeypatch.setenv("MY_LLM_CRED", value)
    p = tmp_path / "c.yaml"
    p.write_text(f"backend:\n  api_key_env: MY_LLM_CRED\n  model: {{x: {value}: y}}\n")
    assert main(["config", "show", str(p)]) == 1
    err = capsys.readouterr().err
    assert "not valid YAML" in err and value not in err


def test_set_override_with_bad_yaml_is_not_echoed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cfg = write_config(tmp_path)
    assert main(["config", "show", str(cfg), "--set", f"backend.model=[{KEY}"]) == 1
    err = capsys.readouterr().err
    assert "backend.model" in err and KEY not in err


def test_secret_in_a_config_key_is_refused_without_echo(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"backend": {"api_key": KEY}}))
    assert main(["config", "show", str(p)]) == 1
    err = capsys.readouterr().err
    assert "environment variable" in err and KEY not in err


# ---- the redaction rule itself ------------------------------------------------------------


def test_redact_rule(monkeypatch):
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-value-123456")
    monkeypatch.setenv("SHORT_KEY", "1234")  # too short to mask without garbling text
    monkeypatch.setenv("PLAIN_SETTING", "plain-value-123456")
    text = (
        'token tok-value-123456, json {"k": "tok-value-123456"}, url http://u:pw-secret@h/v1 '
        "code 1234, Authorization: Bearer abcdef123456789, plain-value-123456"
    )
    out = redact(text)
    assert "tok-value-123456" not in out and "<$SOME_SERVICE_TOKEN>" in out
    assert "pw-secret" not in out and "http://***@h/v1" in out
    assert "Bearer ***" in out and "abcdef123456789" not in out
    assert "code 1234" in out and "plain-value-123456" in out
    assert "SOME_SERVICE_TOKEN" in secret_values()


def test_strip_userinfo():
    assert strip_userinfo("http://user:pass@host:8000/v1") == "http://host:8000/v1"
    assert strip_userinfo("https://host/v1") == "https://host/v1"
    assert strip_userinfo("notaurl") == "notaurl"


def test_load_config_registers_named_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("PRB_ANNOTATION_CRED", "ls-credential-abcdef")
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"annotation": {"token_env": "PRB_ANNOTATION_CRED"}}))
    load_config(p)
    assert redact("token ls-credential-abcdef") == "token <$PRB_ANNOTATION_CRED>"


# ---- credentials in the query string, and the --debug traceback ----------------------------

QUERY_KEY = "query-key-0123456789abcdef"


@pytest.mark.parametrize("param", ["api-key", "key", "token", "access_token", "sig", "apiKey"])
def test_key_in_the_query_string(tmp_path, capsys, param):
    """Never in run.yaml, `prb config show` or any output; still sent to the server."""
    with StandinServer() as server:
        url = f"{server.base_url}?{param}={QUERY_KEY}&api-version=2024"
        cfg = write_config(tmp_path, server, backend={"base_url": url})
        assert main(["config", "show", str(cfg)]) == 0
        shown = capsys.readouterr()
        masked = f"{server.base_url}?{param}=***&api-version=2024"
        assert yaml.safe_load(shown.out)["backend"]["openai"]["base_url"] == masked
        assert main(["run", str(cfg), "--no-progress", "--until", "responses"]) == 0
        sent = [r["query"] for r in server.requests]
    out = capsys.readouterr()
    run_dir = tmp_path / "outputs" / "t"
    written = yaml.safe_load((run_dir / "run.yaml").read_text())
    assert written["backend"]["openai"]["base_url"] == masked
    texts = {"show": shown.out + shown.err, "stdout": out.out, "stderr": out.err}
    assert leaks([QUERY_KEY], run_dir=run_dir, texts=texts) == []
    # the key went with every request
    assert sent and all(q == {param: QUERY_KEY, "api-version": "2024"} for q in sent)


def test_key_in_the_query_string_of_an_unreachable_server(tmp_path, capsys):
    url = f"http://127.0.0.1:9/v1?api-key={QUERY_KEY}"
    cfg = write_config(tmp_path, backend={"base_url": url})
    for argv in (["run", str(cfg), "--no-progress"], ["--debug", "run", str(cfg), "--no-progress"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "cannot reach" in err and "http://127.0.0.1:9/v1?api-key=***" in err
        assert QUERY_KEY not in err


def test_debug_traceback_is_redacted(tmp_path, capsys, monkeypatch):
    """--debug prints the traceback through the same redaction as the error line: a key
    from the environment, a URL password and a query-string key in an exception's text."""
    import pipeline.cli.prb as cli
    from pipeline.core.errors import BackendError

    monkeypatch.setenv("OPENAI_API_KEY", KEY)

    def leaky(args):
        url = f"http://bob:{URL_PASSWORD}@h/v1?token={QUERY_KEY}"
        raise BackendError(f"server at {url} said: Incorrect API key provided: {KEY}")

    monkeypatch.setattr(cli, "cmd_config", leaky)
    assert main(["--debug", "config", "fields"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "BackendError" in err and "leaky" in err
    assert err.strip().splitlines()[-1].startswith("error:")
    assert leaks([KEY, URL_PASSWORD, QUERY_KEY], texts={"stderr": err}) == []
    assert "http://***@h/v1?token=***" in err and "<$OPENAI_API_KEY>" in err


def test_redact_masks_query_credentials():
    text = "GET https://h/v1/chat?x=1&api-key=abc123def&sig=a%2Fb&monkey=1 failed"
    assert redact(text) == "GET https://h/v1/chat?x=1&api-key=***&sig=***&monkey=*** failed"
    assert redact("?page=2&limit=10") == "?page=2&limit=10"
