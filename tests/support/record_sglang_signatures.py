"""Record the SGLang API this project calls, from a real sglang wheel, into tests/data/sglang_signatures.json.

    pip download --no-deps sglang==0.5.23 -d /tmp/sgl && unzip -q /tmp/sgl/sglang-0.5.23-*.whl -d /tmp/sgl/0.5.23
    python tests/support/record_sglang_signatures.py /tmp/sgl/0.5.23 [/tmp/sgl/0.5.15.post1 ...]

Reads the sources with `ast` (nothing is imported, so no GPU and no sglang install is needed) and
keeps only what the project touches: the wheel's requirements (docker pins are checked against
them), the Engine methods rollout/sglang_engine.py calls (parameter
names, annotations, defaults), the ServerArgs fields it passes to Engine(...), the keys of
SamplingParams, and the memory tags. tests/unit/test_sglang_contract.py compares the fake engine and
the backend's calls against this file, so a version bump that changes the API breaks a test.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ENGINE_METHODS = (
    "__init__",
    "generate",
    "update_weights_from_tensor",
    "init_weights_update_group",
    "update_weights_from_distributed",
    "destroy_weights_update_group",
    "begin_weight_update",
    "end_weight_update",
    "release_memory_occupation",
    "resume_memory_occupation",
    "flush_cache",
    "get_weights_by_name",
    "shutdown",
)
SERVER_ARGS = (
    "model_path",
    "tp_size",
    "mem_fraction_static",
    "enable_memory_saver",
    "skip_tokenizer_init",
    "random_seed",
    "dtype",
    "load_format",
    "base_gpu_id",
    "enable_deterministic_inference",
    "attention_backend",
    "disable_cuda_graph",
    "log_level",
)
OUT = Path(__file__).resolve().parents[1] / "data" / "sglang_signatures.json"


def _version(root: Path) -> str:
    for info in root.glob("sglang-*.dist-info/METADATA"):
        for line in info.read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    raise FileNotFoundError(f"{root}: no sglang-*.dist-info/METADATA (unzip the wheel there)")


def _requires(root: Path) -> list[str]:
    """The wheel's Requires-Dist lines outside extras: what `pip install sglang==X` pins."""
    meta = next(root.glob("sglang-*.dist-info/METADATA")).read_text().splitlines()
    return [
        line.split(":", 1)[1].strip()
        for line in meta
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]


def _class(path: Path, name: str) -> ast.ClassDef:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"{path}: no class {name}")


def _params(fn: ast.FunctionDef) -> list[dict]:
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = []
    for arg, default in zip(positional, defaults):
        if arg.arg == "self":
            continue
        out.append(_param(arg, default, "positional_or_keyword"))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        out.append(_param(arg, default, "keyword_only"))
    if args.kwarg is not None:
        out.append({"name": args.kwarg.arg, "kind": "var_keyword"})
    return out


def _param(arg: ast.arg, default, kind: str) -> dict:
    entry = {
        "name": arg.arg,
        "kind": kind,
        "annotation": ast.unparse(arg.annotation) if arg.annotation else None,
    }
    entry["required"] = default is None and kind != "var_keyword"
    if default is not None:
        entry["default"] = ast.unparse(default)
    return entry


def _fields(files: list[Path], wanted: tuple[str, ...]) -> dict[str, str]:
    """name -> type of `name: A[type, ...] = default` class fields (ServerArgs declares them so)."""
    found = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                name, ann = node.target.id, node.annotation
                if name in wanted and name not in found:
                    if isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple):
                        ann = ann.slice.elts[0]
                    found[name] = ast.unparse(ann)
    return found


def record(root: Path) -> dict:
    srt = root / "sglang" / "srt"
    engine_path = srt / "entrypoints" / "engine.py"
    engine = _class(engine_path, "Engine")
    methods = {
        fn.name: _params(fn)
        for fn in engine.body
        if isinstance(fn, ast.FunctionDef) and fn.name in ENGINE_METHODS
    }
    arg_files = [srt / "server_args.py", *sorted((srt / "arg_groups" / "fields").glob("*.py"))]
    server_args = _fields([p for p in arg_files if p.exists()], SERVER_ARGS)
    sampling = _class(srt / "sampling" / "sampling_params.py", "SamplingParams")
    sampling_keys = {}
    for node in sampling.body:  # public API fields come first; internal ones are marked so
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            sampling_keys[node.target.id] = ast.unparse(node.annotation)
        elif isinstance(node, ast.FunctionDef) and node.name == "__init__":
            sampling_keys = {p["name"]: p["annotation"] for p in _params(node) if p["kind"] != "var_keyword"}
            break
    constants = ast.parse((srt / "constants.py").read_text())
    tags = next(
        [ast.literal_eval(e) if isinstance(e, ast.Constant) else e.id for e in n.value.elts]
        for n in constants.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "GPU_MEMORY_ALL_TYPES"
    )
    names = {"GPU_MEMORY_TYPE_KV_CACHE": "kv_cache", "GPU_MEMORY_TYPE_WEIGHTS": "weights",
             "GPU_MEMORY_TYPE_CUDA_GRAPH": "cuda_graph"}  # fmt: skip
    return {
        "source": {
            "engine": "python/sglang/srt/entrypoints/engine.py",
            "server_args": "python/sglang/srt/server_args.py + srt/arg_groups/fields/*.py",
            "sampling_params": "python/sglang/srt/sampling/sampling_params.py",
            "constants": "python/sglang/srt/constants.py",
        },
        "engine_methods": methods,
        "server_args": server_args,
        "sampling_params": sampling_keys,
        "memory_tags": [names.get(t, t) for t in tags],
        "requires_dist": _requires(root),
    }


def main(roots: list[str]) -> None:
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    for root in map(Path, roots):
        data[_version(root)] = record(root)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")
    print(f"wrote {OUT}: {sorted(data)}")


if __name__ == "__main__":
    main(sys.argv[1:])
