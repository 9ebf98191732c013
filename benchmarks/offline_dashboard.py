"""Make the page `asv publish` wrote open without internet (used by publish.sh).

asv's index.html loads jQuery, flot (+ time, selection, categories),
flot-orderbars, stupidtable, blueimp-md5 and bootstrap from CDNs. This fetches
each, at a pinned version, from the npm registry (`npm pack`, kept in a cache
directory), copies the files the page needs into ``<html_dir>/vendor/`` and
points the page's tags at them.

The tags' subresource-integrity attributes are dropped: they hash the CDN's
minified builds, npm's files differ byte for byte, and a browser refuses a
script whose hash does not match (asv then shows its "failed to load" page).
The pinned versions below take their place.

    python offline_dashboard.py HTML_DIR [--npm-cache DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile

# npm package -> version. stupidtable: asv's CDN URL says 1.0.1, which npm
# lacks; 1.1.3 is its npm release (same plugin, same API).
PACKAGES = {
    "jquery": "3.3.1",
    "flot": "0.8.3",
    "flot-orderbars": "1.0.0",
    "stupid-table-plugin": "1.1.3",
    "blueimp-md5": "2.19.0",
    "bootstrap": "3.1.1",
}

# The CDN URLs in asv 0.6's index.html -> (package, file in its npm tarball).
# A URL not listed here (a newer asv) stops the script rather than leaving
# the page half online.
CDN_FILES = {
    "https://code.jquery.com/jquery-3.3.1.min.js": ("jquery", "dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js":
        ("flot", "jquery.flot.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js":
        ("flot", "jquery.flot.time.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js":
        ("flot", "jquery.flot.selection.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js":
        ("flot", "jquery.flot.categories.js"),
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js":
        ("flot-orderbars", "js/jquery.flot.orderBars.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js":
        ("stupid-table-plugin", "stupidtable.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js":
        ("blueimp-md5", "js/md5.min.js"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js":
        ("bootstrap", "dist/js/bootstrap.min.js"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css":
        ("bootstrap", "dist/css/bootstrap.min.css"),
}

# Copied beside the files above: bootstrap's CSS loads its icon font from
# ../fonts/.
EXTRA_DIRS = {"bootstrap": ["dist/fonts"]}

_TAG = re.compile(r"<(script|link)\b[^>]*>")
_URL = re.compile(r'\b(src|href)="(https?://[^"]+)"')
_DROPPED = re.compile(r'\s+(integrity|crossorigin|referrerpolicy)="[^"]*"')


def npm_tarball(package: str, cache: pathlib.Path) -> pathlib.Path:
    """``<cache>/<package>-<version>.tgz``, fetched with ``npm pack`` if absent."""
    version = PACKAGES[package]
    tarball = cache / f"{package}-{version}.tgz"
    if not tarball.exists():
        cache.mkdir(parents=True, exist_ok=True)
        if shutil.which("npm") is None:
            sys.exit(f"offline_dashboard: {tarball} is not cached and npm is not installed "
                     "(apt-get install npm, or copy the tarball there)")
        subprocess.run(["npm", "pack", "--silent", f"{package}@{version}"], cwd=cache,
                       check=True, stdout=subprocess.DEVNULL)
    return tarball


def vendor(html_dir: pathlib.Path, cache: pathlib.Path) -> dict[str, str]:
    """Copies the files into ``html_dir/vendor``; returns CDN URL -> local path."""
    local: dict[str, str] = {}
    wanted: dict[str, list[str]] = {}
    for package, member in CDN_FILES.values():
        wanted.setdefault(package, []).append(member)
    for package, members in wanted.items():
        root = pathlib.PurePosixPath("vendor", f"{package}-{PACKAGES[package]}")
        dirs = EXTRA_DIRS.get(package, [])
        with tarfile.open(npm_tarball(package, cache)) as tar:
            for info in tar.getmembers():
                inside = info.name.removeprefix("package/")
                if info.isfile() and (inside in members or
                                      any(inside.startswith(d + "/") for d in dirs)):
                    target = html_dir / root / inside
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(info).read())
    for url, (package, member) in CDN_FILES.items():
        local[url] = f"vendor/{package}-{PACKAGES[package]}/{member}"
    return local


def rewrite(page: str, local: dict[str, str]) -> str:
    """The page with every CDN script/link pointed at ``local`` and its SRI dropped."""
    def one_tag(match: re.Match) -> str:
        tag = match.group(0)
        url = _URL.search(tag)
        if url is None:
            return tag
        if url.group(2) not in local:
            raise SystemExit(f"offline_dashboard: the page loads {url.group(2)}, which this "
                             "script does not vendor (a newer asv?); add it to CDN_FILES")
        tag = tag.replace(url.group(0), f'{url.group(1)}="{local[url.group(2)]}"')
        return _DROPPED.sub("", tag)
    return _TAG.sub(one_tag, page)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("html_dir", type=pathlib.Path)
    parser.add_argument("--npm-cache", type=pathlib.Path, default=pathlib.Path(".asv/npm"),
                        help="where the npm tarballs are kept (default: .asv/npm)")
    args = parser.parse_args(argv)
    local = vendor(args.html_dir, args.npm_cache)
    changed = 0
    for page_path in sorted(args.html_dir.glob("*.html")):
        page = page_path.read_text()
        offline = rewrite(page, local)
        page_path.write_text(offline)
        changed += "vendor/" in offline
    if changed == 0:
        sys.exit(f"offline_dashboard: no page under {args.html_dir} loads a CDN file; "
                 "is it asv's published directory?")
    print(f"offline_dashboard: {changed} page(s) now load "
          f"{', '.join(f'{p} {v}' for p, v in PACKAGES.items())} from vendor/")


if __name__ == "__main__":
    main()
