"""Request traces from domains the inference cache was never developed on, built from real data
that Debian ships: the text of the installed man pages and the package dependency graph.

They exist to test defaults on traffic nobody tuned them to (the cache's design and parameters
were chosen on MovieLens and the synthetic traces only). Requests have a variable number of
keys; every key lives in one table (``table 0 << 48 | id``, ids dense in order of first
appearance), so a trace is a ``(keys uint64[K], offsets int64[N + 1])`` pair as
``embstore.cache.evaluate`` takes it.

- :func:`man_pages` — each line of running text of the section-1 man pages, in file-name
  order, is a request for its distinct words (a reader's working set moves from page to page;
  common words recur everywhere, rare ones within one page).
- :func:`debian_packages` — each stanza of ``apt-cache dumpavail``, in its order, is a
  request for the package and every package its ``Depends``/``Pre-Depends`` name (a resolver's
  walk: a few libraries in almost every request, families of packages next to each other).
"""

from __future__ import annotations

import gzip
import pathlib
import re
import subprocess

import numpy as np

MAN_DIR = pathlib.Path("/usr/share/man/man1")
_WORD = re.compile(r"[a-z][a-z0-9_+-]{1,31}")
_ESCAPE = re.compile(r"\\f[A-Z0-9]|\\f\(..|\\f\[[^]]*\]|\\\(..|\\[-&|^~e]|\\\*.|\\.")


def _pack(requests: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct tokens per request -> dense table-0 keys and request offsets."""
    ids: dict[str, int] = {}
    keys: list[int] = []
    offsets = [0]
    for req in requests:
        seen = dict.fromkeys(req)  # distinct, in order
        for tok in seen:
            keys.append(ids.setdefault(tok, len(ids)))
        offsets.append(len(keys))
    return np.asarray(keys, dtype=np.uint64), np.asarray(offsets, dtype=np.int64)


def man_pages(
    max_requests: int = 200_000, max_keys: int = 32, directory: pathlib.Path = MAN_DIR
) -> tuple[np.ndarray, np.ndarray]:
    """Lines of the man pages' running text (troff requests and escapes dropped) with at least
    two words, each a request for its first ``max_keys`` distinct lowercase words."""
    files = sorted(directory.glob("*.gz")) if directory.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no man pages in {directory} (apt-get install manpages man-db)")
    requests: list[list[str]] = []
    for file in files:
        try:
            text = gzip.decompress(file.read_bytes()).decode("utf-8", errors="replace")
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        for line in text.splitlines():
            if line.startswith((".", "'")):
                continue
            words = _WORD.findall(_ESCAPE.sub(" ", line).lower())
            if len(words) >= 2:
                requests.append(list(dict.fromkeys(words))[:max_keys])
                if len(requests) >= max_requests:
                    return _pack(requests)
    return _pack(requests)


def debian_packages(max_requests: int = 200_000) -> tuple[np.ndarray, np.ndarray]:
    """``apt-cache dumpavail``'s stanzas in order: the package and the names it depends on."""
    out = subprocess.run(
        ["apt-cache", "dumpavail"], capture_output=True, text=True, check=True
    ).stdout
    requests: list[list[str]] = []
    for stanza in out.split("\n\n"):
        name = None
        deps: list[str] = []
        for line in stanza.splitlines():
            if line.startswith("Package: "):
                name = line[9:].strip()
            elif line.startswith(("Depends: ", "Pre-Depends: ")):
                for alt in line.split(":", 1)[1].split(","):
                    for dep in alt.split("|"):
                        dep = dep.strip().split(" ", 1)[0].split(":", 1)[0]
                        if dep:
                            deps.append(dep)
        if name is not None:
            requests.append([name, *deps])
            if len(requests) >= max_requests:
                break
    if not requests:
        raise FileNotFoundError("apt-cache dumpavail listed no packages (apt-get update)")
    return _pack(requests)
