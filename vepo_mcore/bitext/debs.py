"""Debian packages as data: fetch them with the system's package client, read their files in Python.

    debs = fetch_debs(["firefox-esr-l10n-th", "unicode-cldr-core"], Path("~/.cache/vepo_mcore/debs"))
    for path, data in deb_members(debs["firefox-esr-l10n-th"].path, suffixes=(".xpi",)): ...

Packages are fetched with `apt-get download` (no installation, no root needed) into a cache
folder and read from the .deb archive directly (ar + tar), so no package is installed and the
cache can be copied to a machine without a package client. A .deb already in the cache is used
as it is.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

AR_MAGIC = b"!<arch>\n"


@dataclass(frozen=True)
class Deb:
    """One fetched package."""

    package: str
    version: str
    path: Path


def _cached(package: str, cache: Path) -> Path | None:
    found = sorted(cache.glob(f"{package}_*.deb"))
    return found[-1] if found else None


def _deb(package: str, path: Path) -> Deb:
    # apt names the file PACKAGE_VERSION_ARCH.deb with the version's ':' written as %3a
    return Deb(package, unquote(path.name.split("_")[1]), path)


def fetch_debs(packages: list[str], cache: Path) -> dict[str, Deb]:
    """package -> Deb, downloading the ones not in `cache` with `apt-get download`."""
    cache.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if _cached(p, cache) is None]
    if missing:
        if shutil.which("apt-get") is None:
            raise FileNotFoundError(
                f"apt-get not found: the parallel text comes from Debian packages ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''}); run on Debian/Ubuntu, or copy their .deb files "
                f"into {cache}"
            )
        result = subprocess.run(["apt-get", "download", *missing], cwd=cache, capture_output=True, text=True)
        failed = [p for p in missing if _cached(p, cache) is None]
        if result.returncode or failed:
            reason = " ".join(line for line in result.stderr.splitlines() if line.startswith("E:"))
            if "Unable to locate" in reason or "no candidate" in reason:
                reason += " (is the package index current? `apt-get update`)"
            raise ValueError(
                f"apt-get download of {len(missing)} package(s) into {cache} failed (exit {result.returncode}):"
                f" {reason or result.stderr.strip()[-300:] or 'not fetched: ' + ', '.join(failed)}"
            )
    return {p: _deb(p, _cached(p, cache)) for p in packages}


def _ar_members(data: bytes, name: str) -> Iterator[tuple[str, bytes]]:
    if not data.startswith(AR_MAGIC):
        raise ValueError(f"{name}: not a .deb (ar) archive")
    at = len(AR_MAGIC)
    while at + 60 <= len(data):
        header = data[at : at + 60]
        member, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode())
        yield member, data[at + 60 : at + 60 + size]
        at += 60 + size + (size % 2)


def deb_members(path: Path, suffixes: tuple[str, ...] = ()) -> Iterator[tuple[str, bytes]]:
    """(path inside the package, bytes) of every regular file of the package's data archive whose
    name ends with one of `suffixes` (all files without)."""
    for member, payload in _ar_members(path.read_bytes(), str(path)):
        if not member.startswith("data.tar"):
            continue
        if member.endswith(".zst"):
            raise ValueError(f"{path}: {member} is zstd-compressed, which Python's tarfile cannot read")
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as tar:
            for info in tar:
                if info.isfile() and (not suffixes or info.name.endswith(suffixes)):
                    yield info.name.lstrip("./"), tar.extractfile(info).read()
        return
    raise ValueError(f"{path}: no data.tar member (not a binary Debian package)")
