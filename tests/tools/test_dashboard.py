"""benchmarks/publish.sh: the asv dashboard renders a graph with no network.

A tiny asv project (one parametrised ``track_`` benchmark, two commits, run
with ``asv run --python=same --quick``) is published with publish.sh, served
on 127.0.0.1 and opened in headless Chromium whose resolver maps every host
but loopback to nothing, so a CDN file cannot load. The same results
published by plain ``asv publish`` are the control: that page must fail
there, or the check proves nothing.

Skips when Chromium is missing (Debian: ``apt-get install chromium``; .ci/run
installs it) or when the npm tarballs are neither cached nor fetchable.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ASV = pathlib.Path(sys.executable).with_name("asv")
NPM_CACHE = pathlib.Path(os.environ.get("NBJIT_NPM_CACHE", ROOT / "benchmarks" / ".asv" / "npm"))
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
BENCHMARK = "bench_tiny.Tiny.track_value"
VALUES = {1: "1.5", 3: "4.5"}  # n -> what track_value returns, drawn as y tick labels

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                       "(Debian: apt-get install chromium; .ci/run installs it)"),
    pytest.mark.skipif(not ASV.exists(), reason=f"asv is not installed beside {sys.executable}"),
]


def _npm_ready() -> bool:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import offline_dashboard
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    cached = all((NPM_CACHE / f"{p}-{v}.tgz").exists()
                 for p, v in offline_dashboard.PACKAGES.items())
    return cached or shutil.which("npm") is not None


def _run(args: list, cwd: pathlib.Path, env: dict) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A git repo with one benchmark and asv results for two of its commits."""
    if not _npm_ready():
        pytest.skip(f"the npm tarballs are not in {NPM_CACHE} and npm is not installed")
    root = tmp_path_factory.mktemp("dashboard")
    proj = root / "proj"
    (proj / "benchmarks").mkdir(parents=True)
    (proj / "asv.conf.json").write_text(
        '{"version": 1, "project": "tiny", "repo": ".", "branches": ["main"], "dvcs": "git",\n'
        ' "environment_type": "virtualenv", "benchmark_dir": "benchmarks",\n'
        ' "results_dir": ".asv/results", "html_dir": ".asv/html"}\n')
    (proj / "benchmarks" / "__init__.py").write_text("")
    (proj / "benchmarks" / "bench_tiny.py").write_text(
        "class Tiny:\n    params = [[1, 2, 3]]\n    param_names = ['n']\n\n"
        "    def track_value(self, n):\n        return 1.5 * n\n")
    # HOME: asv keeps its machine file in ~/.asv-machine.json; keep this one out of the user's.
    env = dict(os.environ, HOME=str(root), ASV=str(ASV), NBJIT_NPM_CACHE=str(NPM_CACHE),
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    _run(["git", "init", "-q", "-b", "main"], proj, env)
    _run(["git", "add", "-A"], proj, env)
    _run([ASV, "machine", "--yes", "--machine", "tinybox"], proj, env)
    for message in ("one", "two"):
        _run(["git", "commit", "-q", "--allow-empty", "-m", message], proj, env)
        commit = _run(["git", "rev-parse", "HEAD"], proj, env).strip()
        _run([ASV, "run", "--python=same", "--quick", "--machine", "tinybox",
              "--set-commit-hash", commit], proj, env)
    return proj, env


@contextlib.contextmanager
def _serve(directory: pathlib.Path):
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # pytest would show every request
        pass


def _chromium(url: str, profile: pathlib.Path, *extra: str) -> str:
    """Chromium's output for ``url`` after 10 s of virtual time, with no host but loopback."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--no-first-run",
         f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
         "--virtual-time-budget=10000", "--window-size=1200,800", *extra, url],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _graph_page(base: str) -> str:
    return f"{base}/index.html#{BENCHMARK}"


def test_plain_asv_publish_fails_offline(project, tmp_path):
    """The control: asv's own page needs its CDNs, and the check sees that."""
    proj, env = project
    _run([ASV, "publish", "--html-dir", tmp_path / "html"], proj, env)
    with _serve(tmp_path / "html") as base:
        dom = _chromium(_graph_page(base), tmp_path / "profile", "--dump-dom")
    assert "failed to load" in dom
    assert 'class="flot-base"' not in dom


def test_published_dashboard_renders_a_graph_offline(project, tmp_path):
    proj, env = project
    out = _run(["bash", ROOT / "benchmarks" / "publish.sh"], proj, env)
    html = proj / ".asv" / "html"
    assert "now load" in out
    page = (html / "index.html").read_text()
    assert "integrity=" not in page
    assert not re.search(r'<(script|link)[^>]+(src|href)="https?://', page)
    with _serve(html) as base:
        dom = _chromium(_graph_page(base), tmp_path / "profile", "--dump-dom")
        shot = tmp_path / "shot.png"
        _chromium(_graph_page(base), tmp_path / "profile", f"--screenshot={shot}")
    assert "failed to load" not in dom
    assert 'class="flot-base"' in dom  # flot drew its canvas
    # ... from the results: one legend entry per parameter, y ticks spanning the values.
    legend = re.search(r'<div class="legend">.*?</table>', dom, re.S)
    assert legend is not None
    assert all(f"n-{n}" in legend.group(0) for n in (1, 2, 3))
    ticks = re.findall(r'flot-tick-label tickLabel"[^>]*>([^<]*)<', dom)
    assert set(VALUES.values()) <= set(ticks), ticks
    _assert_not_blank(shot)


def _assert_not_blank(png: pathlib.Path) -> None:
    image = pytest.importorskip("matplotlib.image").imread(png)
    rgb = image[..., :3]
    coloured = (rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.25  # series lines, not gray UI
    assert coloured.sum() > 1000, coloured.sum()
