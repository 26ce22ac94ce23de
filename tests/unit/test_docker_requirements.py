"""The GPU image's Python requirements agree with each other and resolve, and its build's pip lines run.

What is checked, and what is not:
  * offline, every `pip install` of docker/Dockerfile's RUN lines, with its own flags (-c, -r, -e
    included), through pip's resolver in --dry-run against a local index of stub wheels that stands
    in for the image: each pin of docker/requirements.txt, torch at the base image's version, what
    sglang pins, and the CPU lock's versions for the rest. The project is installed from a copy of
    the build context the Dockerfile's COPY lines make. pip's own refusals (a constraint with extras,
    a requirement no pin satisfies) fail the test as they fail the build. The one flag added is
    --no-build-isolation on the line that builds vepo_mcore (its build backend would otherwise come
    from PyPI); it changes nothing pip checks about the requirements.
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
import shlex
import shutil
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
    from harness.fake_sglang import SGLANG_VERSION

    gpu_extra = _pins(_setup_extras()["gpu"])
    image = _image_pins()
    assert _arg("SGLANG_VERSION") == str(image["sglang"]) == SGLANG_VERSION
    assert "FROM lmsysorg/sglang:v${SGLANG_VERSION}-${CUDA_TAG}" in DOCKERFILE.read_text()
    assert SGLANG_VERSION in RECORDED
    for name, req in gpu_extra.items():  # setup.py's gpu extra == the image's pins
        assert _pinned_version(req) == image[name], name
    assert {"sglang", "megatron-core", "transformer-engine"} <= set(gpu_extra)
    torch_pin = next(
        Requirement(r) for r in RECORDED[SGLANG_VERSION]["requires_dist"] if r.startswith("torch==")
    )
    assert torch_pin.specifier.contains(image["torch"]), (torch_pin, image["torch"])


def test_image_pins_satisfy_sglang_and_megatron_core_declared_requirements():
    from harness.fake_sglang import SGLANG_VERSION

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
    from harness.fake_sglang import SGLANG_VERSION

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


# ---------------------------------------------------------------- the Dockerfile's pip lines, offline


def _instructions() -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of every Dockerfile instruction, continuation lines joined."""
    joined, out = "", []
    for line in DOCKERFILE.read_text().splitlines():
        if not joined and (not line.strip() or line.lstrip().startswith("#")):
            continue
        joined += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            keyword, _, rest = joined.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
            joined = ""
    return out


def _substitute_args(text: str) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: _arg(m.group(1)), text)


def _pip_installs() -> list[list[str]]:
    """The arguments after `pip install` of every command of every RUN line, in order."""
    installs = []
    for keyword, rest in _instructions():
        if keyword != "RUN":
            continue
        lexer = shlex.shlex(_substitute_args(rest), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        commands, words = [], []
        for token in lexer:  # quotes respected: a `;` inside python -c "..." splits nothing
            if token in ("&&", ";", "||"):
                commands.append(words)
                words = []
            else:
                words.append(token)
        for command in [*commands, words]:
            if command[:2] == ["pip", "install"]:
                installs.append(command[2:])
            elif command[1:4] == ["-m", "pip", "install"]:
                installs.append(command[4:])
    return installs


def test_base_image_tag_names_its_cuda_lane_and_matches_transformer_engine():
    """SGLang publishes one image per CUDA lane of a release (v<version>-cu130, ...); the base names
    one, and its CUDA major is the one Transformer Engine's core_cu<major> wheels are built for."""
    (base,) = [rest for keyword, rest in _instructions() if keyword == "FROM"]
    tag = _substitute_args(base)
    match = re.fullmatch(r"lmsysorg/sglang:v([\w.]+)-cu(\d\d)(\d)", tag)
    assert match, f"base image {tag!r} names no CUDA lane (v<version>-cu<major><minor>)"
    te = _pins(REQUIREMENTS.read_text().splitlines())["transformer-engine"]
    assert f"core_cu{match.group(2)}" in te.extras, (tag, str(te))


def _stub_wheel(index: Path, name: str, version: str, extras: set[str]) -> None:
    """A wheel with metadata only (no files, no requirements): enough for pip's resolver."""
    import zipfile

    dist = f"{canonicalize_name(name).replace('-', '_')}-{version}"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Provides-Extra: {extra}\n" for extra in sorted(extras))
    wheel = "Wheel-Version: 1.0\nGenerator: stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(index / f"{dist}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{dist}.dist-info/METADATA", metadata)
        archive.writestr(f"{dist}.dist-info/WHEEL", wheel)
        archive.writestr(f"{dist}.dist-info/RECORD", "")


def _image_index(index: Path) -> dict[str, Version]:
    """Stub wheels for what the image has or pip would find: the image's pins, sglang's own exact
    pins, the CPU lock's versions for everything else setup.py asks for. Returns name -> version."""
    from harness.fake_sglang import SGLANG_VERSION

    versions = {
        n: _pinned_version(r)
        for n, r in _pins((ROOT / "constraints" / "cpu.txt").read_text().splitlines()).items()
    }
    for line in RECORDED[SGLANG_VERSION]["requires_dist"]:
        req = Requirement(line)
        spec = list(req.specifier)
        if req.marker is None and len(spec) == 1 and spec[0].operator == "==":
            versions[canonicalize_name(req.name)] = Version(spec[0].version)
    versions.update(_image_pins())
    extras: dict[str, set[str]] = {}
    for req in _pins(REQUIREMENTS.read_text().splitlines()).values():
        extras.setdefault(canonicalize_name(req.name), set()).update(req.extras)
    index.mkdir()
    for name, version in versions.items():
        _stub_wheel(index, name, str(version), extras.get(name, set()))
    return versions


def _build_context(workdir: Path) -> None:
    """WORKDIR as the Dockerfile's COPY lines fill it (folders linked, files copied)."""
    workdir.mkdir()
    for keyword, rest in _instructions():
        if keyword != "COPY":
            continue
        *sources, target = shlex.split(rest)
        for source in sources:
            src = ROOT / source
            dst = workdir / target / src.name if target.endswith("/") else workdir / target
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                dst.symlink_to(src, target_is_directory=True)
            else:
                shutil.copy(src, dst)


def test_every_dockerfile_pip_install_resolves_offline(tmp_path):
    installs = _pip_installs()
    assert len(installs) >= 2, installs
    versions = _image_index(tmp_path / "index")
    workdir = tmp_path / "workspace"
    _build_context(workdir)
    for n, args in enumerate(installs):
        builds_project = any(a.startswith(".") for a in args)
        report = tmp_path / f"report{n}.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--no-index", "--find-links", str(tmp_path / "index"), "--report", str(report),
               *(["--no-build-isolation"] if builds_project and "--no-build-isolation" not in args else []),
               *args]  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        done = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, f"pip install {shlex.join(args)}:\n{done.stderr[-3000:]}"
        resolved = {
            canonicalize_name(i["metadata"]["name"]): Version(i["metadata"]["version"])
            for i in json.loads(report.read_text())["install"]
        }
        for name, version in _image_pins().items():  # nothing the line installs moves a pin
            if name in resolved:
                assert resolved[name] == version, (args, name, resolved[name], version)
        assert set(resolved) - {"vepo-mcore"} <= set(versions)


def test_dockerignore_keeps_local_state_out_and_every_copied_path_in():
    import fnmatch

    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for local in (".venv", "runs", "data", ".git", "checkpoints"):
        assert local in patterns, f".dockerignore does not exclude {local}/"
    for keyword, rest in _instructions():
        if keyword == "COPY":
            for source in shlex.split(rest)[:-1]:
                hits = [p for p in patterns if fnmatch.fnmatch(source, p)]
                assert not hits, f"COPY {source} is excluded by .dockerignore {hits}"
