"""A hash of the package's files, so that a result JSON can be matched to the commit it was measured on.

A GPU machine may get a copy of the working tree without ``.git``, so a result cannot name its
commit by itself: the caller names the commit (``TFG_COMMIT``), and the result also records this hash
of every file under ``thunder_fusion_guard/`` (sorted paths and contents; ``__pycache__`` and
``*.pyc`` skipped). Anyone can then check that a result's package is a commit's package:

    python3 benchmarks/package_hash.py            # the working tree's hash
    python3 benchmarks/package_hash.py HEAD       # a commit's (read with git archive)
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "thunder_fusion_guard"
ROOT = Path(__file__).resolve().parents[1]


def _skipped(relative: str) -> bool:
    parts = relative.split("/")
    return "__pycache__" in parts or relative.endswith((".pyc", ".pyo"))


def hash_files(files: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over ``(path, content)`` pairs sorted by path; paths relative to the package folder, with ``/``."""
    digest = hashlib.sha256()
    for path, content in sorted(files):
        if _skipped(path):
            continue
        digest.update(path.encode() + b"\0" + str(len(content)).encode() + b"\0")
        digest.update(content)
    return digest.hexdigest()


def package_sha256(root: str | Path = ROOT) -> str:
    """The hash of ``<root>/thunder_fusion_guard`` as it is on disk."""
    base = Path(root) / PACKAGE
    if not base.is_dir():
        raise FileNotFoundError(f"no {PACKAGE}/ under {root}")
    files = [
        (p.relative_to(base).as_posix(), p.read_bytes())
        for p in base.rglob("*")
        if p.is_file() and not _skipped(p.relative_to(base).as_posix())
    ]
    return hash_files(files)


def commit_package_sha256(commit: str, repo: str | Path = ROOT) -> str:
    """The hash of ``thunder_fusion_guard/`` as committed in ``commit`` (``git archive``; needs the git repository)."""
    tar = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit, PACKAGE],
        check=True,
        capture_output=True,
    ).stdout
    files = []
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        for member in archive.getmembers():
            if member.isfile():
                relative = member.name.removeprefix(PACKAGE + "/")
                files.append((relative, archive.extractfile(member).read()))
    return hash_files(files)


def resolve_commit(given: str | None, root: str | Path = ROOT) -> tuple[str | None, str]:
    """The commit (``--commit``, else ``TFG_COMMIT``, else ``git rev-parse HEAD`` where there is a .git) and
    where it came from."""
    if given:
        return given, "--commit"
    if os.environ.get("TFG_COMMIT"):
        return os.environ["TFG_COMMIT"], "TFG_COMMIT"
    if (Path(root) / ".git").exists():
        try:
            head = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
            return head, "git rev-parse HEAD (working tree may differ: see package_sha256)"
        except (OSError, subprocess.CalledProcessError):
            pass
    return None, "not given: set TFG_COMMIT=$(git rev-parse HEAD) on the machine that has the checkout"


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0] in ("-h", "--help")):
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    print(commit_package_sha256(argv[0]) if argv else package_sha256())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
