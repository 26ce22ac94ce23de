"""The GPU image's Python requirements agree with each other and resolve (issue 20.3).

What is checked, and what is not:
  * offline: one sglang version everywhere (Dockerfile base tag, docker/requirements.txt, setup.py's
    gpu extra, the fake engine, the recorded signatures); the image's torch is the one sglang pins;
    every pin of docker/requirements.txt satisfies what sglang 0.5.23 declares (recorded from its
    wheel), what megatron-core 0.16.1 declares (its installed metadata: the TE range of its dev
    extra included), and equals the CPU lock where sglang does not pin the package itself.
  * online (skipped without PyPI): `pip install --dry-run --ignore-installed --no-deps --report` over
    docker/requirements.txt for CPython 3.12 manylinux x86_64, binaries only: every pin exists as a
    wheel for the image's platform (about 45 MB of wheels are fetched for their metadata, torch is
    not among them), and every requirement any of them declares on another pinned package (torch
    at the image's version included) is satisfied. Not checked: the full transitive resolution
    (it would download the CUDA wheels, GBs); the image build's `pip check` covers that.
"""

from __future__ import annotations

import ast
import json
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "docker" / "requirements.txt"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
RECORDED = json.loads((ROOT / "tests" / "data" / "sglang_signatures.json").read_text())
IMAGE_ENV = dict(default_environment(), sys_platform="linux", platform_machine="x86_64",
                 python_version="3.12", python_full_version="3.12.3", implementation_name="cpython")  # fmt: skip


# The image's glibc is 2.34+; pip matches --platform tags literally, so name the older manylinux ones too.
PLATFORMS = [arg for tag in ("manylinux_2_34", "manylinux_2_28", "manylinux_2_27", "manylinux_2_24",
                             "manylinux_2_17", "manylinux2014") for arg in ("--platform", f"{tag}_x86_64")]  # fmt: skip


def _pins(lines) -> dict[str, Requirement]:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            out[canonicalize_name(req.name)] = req
    return out


def _pinned_version(req: Requirement) -> Version:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req} is not an exact pin"
    return Version(spec.version)


def _setup_extras() -> dict[str, list[str]]:
    """setup.py's EXTRAS, read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    node = next(
        n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "EXTRAS"
    )
    return ast.literal_eval(node.value)


def _arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert match, f"docker/Dockerfile has no ARG {name}=..."
    return match.group(1)


def _applies(req: Requirement, extras: set[str] = frozenset()) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate(dict(IMAGE_ENV, extra=e)) for e in (extras or {""}))


def _check_against(declared: list[str], pins: dict[str, Version], who: str, extras=frozenset()) -> list[str]:
    problems = []
    for line in declared:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if (
            name in pins
            and _applies(req, set(extras))
            and not req.specifier.contains(pins[name], prereleases=True)
        ):
            problems.append(f"{who} requires {req}, the image pins {name}=={pins[name]}")
    return problems


def _image_pins() -> dict[str, Version]:
    pins = {name: _pinned_version(req) for name, req in _pins(REQUIREMENTS.read_text().splitlines()).items()}
    pins["torch"] = Version(_arg("TORCH_VERSION"))  # what the base image ships
    return pins


def test_one_sglang_version_everywhere_and_the_image_torch_is_sglangs():
    from tests.support.fake_sglang import SGLANG_VERSION

    gpu_extra = _pins(_setup_extras()["gpu"])
    image = _image_pins()
    assert _arg("SGLANG_VERSION") == str(image["sglang"]) == SGLANG_VERSION
    assert "FROM lmsysorg/sglang:v${SGLANG_VERSION}" in DOCKERFILE.read_text()
    assert SGLANG_VERSION in RECORDED
    for name, req in gpu_extra.items():  # setup.py's gpu extra == the image's pins
        assert _pinned_version(req) == image[name], name
    assert {"sglang", "megatron-core", "transformer-engine"} <= set(gpu_extra)
    torch_pin = next(
        Requirement(r) for r in RECORDED[SGLANG_VERSION]["requires_dist"] if r.startswith("torch==")
    )
    assert torch_pin.specifier.contains(image["torch"]), (torch_pin, image["torch"])


def test_image_pins_satisfy_sglang_and_megatron_core_declared_requirements():
    from tests.support.fake_sglang import SGLANG_VERSION

    image = _image_pins()
    problems = _check_against(RECORDED[SGLANG_VERSION]["requires_dist"], image, f"sglang {SGLANG_VERSION}")
    if metadata.version("megatron-core") != str(image["megatron-core"]):
        pytest.skip(f"installed megatron-core {metadata.version('megatron-core')} is not the image's")
    # megatron-core's dev extra names the Transformer Engine range it is tested with.
    problems += _check_against(metadata.requires("megatron-core"), image, "megatron-core", extras={"dev"})
    assert not problems, "\n".join(problems)
    te_in_dev = [r for r in metadata.requires("megatron-core") if r.startswith("transformer-engine")]
    assert te_in_dev, "megatron-core no longer declares a Transformer Engine range: re-read its metadata"


def test_image_pins_follow_the_cpu_lock_where_sglang_does_not_pin():
    from tests.support.fake_sglang import SGLANG_VERSION

    lock = {
        n: _pinned_version(r)
        for n, r in _pins((ROOT / "constraints" / "cpu.txt").read_text().splitlines()).items()
    }
    sglang_pins = {canonicalize_name(Requirement(r).name) for r in RECORDED[SGLANG_VERSION]["requires_dist"]}
    for name, version in _image_pins().items():
        if name in lock and name not in sglang_pins and name != "torch":
            assert version == lock[name], f"docker/requirements.txt {name}=={version}, lock {lock[name]}"


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.timeout(900)
def test_pip_resolves_the_image_requirements_for_the_image_platform(tmp_path):
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable")
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet",
           "--only-binary=:all:", *PLATFORMS, "--python-version", "3.12",
           "--implementation", "cp", "--target", str(tmp_path / "target"),  # pip wants it with --platform
           "--report", str(report), "-r", str(REQUIREMENTS)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr[-3000:]
    items = json.loads(report.read_text())["install"]
    image = _image_pins()
    resolved = {canonicalize_name(i["metadata"]["name"]): Version(i["metadata"]["version"]) for i in items}
    assert resolved == {n: v for n, v in image.items() if n != "torch"}
    problems = []
    for item in items:
        meta = item["metadata"]
        extras = set(Requirement(_req_line(meta["name"])).extras)  # e.g. transformer-engine[pytorch]
        problems += _check_against(
            meta.get("requires_dist", []), image, f"{meta['name']} {meta['version']}", extras
        )
    assert not problems, "\n".join(problems)


def _req_line(name: str) -> str:
    return str(_pins(REQUIREMENTS.read_text().splitlines())[canonicalize_name(name)])
